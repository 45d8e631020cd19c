package rbd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkExtendWhileSampling extends a full 10^5-row CartPole memory
// buffer with 256-row batches while 0 or 1 goroutines sample 256-row
// uniform batches from it as fast as they can, and reports the writer's
// rows/s and the 50th and 99th percentile of one extend's time. Small
// samples copy their rows while they hold the index, so writers wait for
// those copies: this is where that wait would show.
//
// go test . -run '^$' -bench BenchmarkExtendWhileSampling -benchtime 20000x -count 3
func BenchmarkExtendWhileSampling(b *testing.B) {
	dir := b.TempDir()
	cache := newSbenchCache(b)
	cfg := sbenchConfig{rows: 1e5, kind: "memory"}
	for _, samplers := range []int{0, 1} {
		b.Run(fmt.Sprintf("samplers=%d", samplers), func(b *testing.B) {
			buf := cache.get(b, dir, cfg)
			w := newSbenchWriter(cfg)
			var stop atomic.Bool
			var sampled atomic.Int64
			var wg sync.WaitGroup
			for range samplers {
				wg.Go(func() {
					req := &SampleRequest{BatchSize: sbenchBatch}
					for !stop.Load() {
						batch, err := buf.Sample(context.Background(), req, nil)
						if err != nil {
							b.Error(err)
							return
						}
						batch.Release()
						sampled.Add(1)
					}
				})
			}
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				batch := w.batch(sbenchBatch)
				start := time.Now()
				if _, err := buf.Extend("bench", batch); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			stop.Store(true)
			wg.Wait()
			sec := b.Elapsed().Seconds()
			slices.Sort(lat)
			b.ReportMetric(float64(b.N)*sbenchBatch/sec, "rows/s")
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(float64(sampled.Load())/sec, "samples/s")
		})
	}
}
