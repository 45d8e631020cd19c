package ratelimit

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquire is the limiter's cost on the hot path: one extend of 256
// rows and 8 samples of 256 rows admitted at once (spi 8, a window wide
// enough that nothing waits), what every extend and sample of a
// rate-limited buffer pays. Without params the limiter is off.
//
// go test ./ratelimit -run '^$' -bench BenchmarkAcquire -cpu 1,2
func BenchmarkAcquire(b *testing.B) {
	for _, tc := range []struct {
		name string
		p    *Params
	}{
		{"off", nil},
		{"spi=8", &Params{SamplesPerInsert: 8, MinSize: 1, ErrorBuffer: 1 << 20}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := New(tc.p, 1)
			ctx := context.Background()
			deadline := time.Now().Add(time.Hour)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Acquire(ctx, Inserts, 256, deadline, nil, errStop); err != nil {
						b.Error(err)
						return
					}
					for range 8 {
						if _, err := l.Acquire(ctx, Samples, 256, deadline, nil, errStop); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
			b.ReportMetric(float64(9*b.N)/b.Elapsed().Seconds(), "acquires/s")
		})
	}
}
