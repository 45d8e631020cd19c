package client_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
)

// BenchmarkShardedSample compares one 256-row CartPole sample from one
// server holding every row with the same sample through client.Sharded
// from 3 local shards holding a third each (and, to separate the
// stats round from the draw, with the figures cached for the whole run).
// One connection; the shards run in this process, so on a 2-core machine
// their parallel draws share the cores with the client.
func BenchmarkShardedSample(b *testing.B) {
	const rows, batch = 30_000, 256
	fill := func(c *client.Client, n int, base int64) {
		ctx := context.Background()
		if _, _, err := c.CreateBuffer(ctx, "b", cartpole(int64(n))); err != nil {
			b.Fatal(err)
		}
		for k := 0; k < n; k += 1000 {
			toks := seqToks(base+int64(k), 1000)
			done := make([]bool, 1000)
			for i := range done {
				done[i] = i%20 == 19
			}
			if _, err := c.Extend(ctx, "b", "s", steps(toks, done, nil)); err != nil {
				b.Fatal(err)
			}
		}
	}
	one, _ := newServer(b, nil)
	fill(newClient(b, one.URL, nil), 3*rows, 0)
	var urls []string
	for i := range 3 {
		ts, _ := newServer(b, nil)
		fill(newClient(b, ts.URL, nil), rows, int64(i*rows))
		urls = append(urls, ts.URL)
	}
	for _, kind := range []string{"uniform", "prioritized"} {
		req := &client.SampleRequest{Sampler: kind, BatchSize: batch}
		b.Run(fmt.Sprintf("sampler=%s/side=one-server", kind), func(b *testing.B) {
			c := newClient(b, one.URL, nil)
			for b.Loop() {
				if _, err := c.Sample(context.Background(), "b", req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
		})
		b.Run(fmt.Sprintf("sampler=%s/side=one-server-return-prob", kind), func(b *testing.B) {
			c := newClient(b, one.URL, nil)
			r := *req
			r.ReturnProb = true
			for b.Loop() {
				if _, err := c.Sample(context.Background(), "b", &r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
		})
		for _, side := range []struct {
			name string
			ttl  float64
		}{{"3-shards", 1}, {"3-shards-stats-cached", 3600}} {
			b.Run(fmt.Sprintf("sampler=%s/side=%s", kind, side.name), func(b *testing.B) {
				s, err := client.NewSharded(urls, &client.ShardedOptions{StatsTTL: secs(side.ttl)})
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if _, err := s.Sample(context.Background(), "b", req); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
			})
		}
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// BenchmarkShardedExtend measures ingest of 256-row CartPole batches from
// 6 writer goroutines (one stream each) into one server, and through
// client.Sharded into 3 shards. Every server runs in this process on the
// same 2 cores: this shows what the client costs and how the work
// spreads, not what 3 machines would take in.
func BenchmarkShardedExtend(b *testing.B) {
	const writers, batch = 6, 256
	one, _ := newServer(b, nil)
	var urls []string
	for range 3 {
		ts, _ := newServer(b, nil)
		urls = append(urls, ts.URL)
	}
	s, err := client.NewSharded(urls, nil)
	if err != nil {
		b.Fatal(err)
	}
	single := newClient(b, one.URL, nil)
	ctx := context.Background()
	if _, _, err := single.CreateBuffer(ctx, "b", cartpole(1_000_000)); err != nil {
		b.Fatal(err)
	}
	if _, err := s.CreateBuffer(ctx, "b", cartpole(1_000_000)); err != nil {
		b.Fatal(err)
	}
	done := make([]bool, batch)
	for i := range done {
		done[i] = i%50 == 49
	}
	rows := steps(seqToks(0, batch), done, nil)
	for _, side := range []struct {
		name   string
		extend func(stream string) error
	}{
		{"one-server", func(st string) error { _, err := single.Extend(ctx, "b", st, rows); return err }},
		{"3-shards", func(st string) error { _, err := s.Extend(ctx, "b", st, rows); return err }},
	} {
		b.Run("side="+side.name, func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(writers / runtimeProcs())
			var id atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				st := fmt.Sprintf("w%d", id.Add(1))
				for pb.Next() {
					if err := side.extend(st); err != nil {
						b.Error(err)
						return
					}
					next.Add(1)
				}
			})
			b.ReportMetric(float64(next.Load()*batch)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

func runtimeProcs() int { return max(1, runtime.GOMAXPROCS(0)) }
