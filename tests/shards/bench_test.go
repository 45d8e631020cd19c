package shards

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/testbin"
)

// BenchmarkShardProcesses is what a user running shards on one machine
// sees: one `rbd serve` process holding 90,000 compact CartPole rows
// against three processes holding 30,000 each, sampled through
// client.Sharded (one client goroutine, 256-row batches, loopback).
// client's BenchmarkShardedSample runs the servers inside the benchmark's
// own process instead, where they share its scheduler and GC.
func BenchmarkShardProcesses(b *testing.B) {
	var urls []string
	start := func(i int) *client.Client {
		srv, err := testbin.StartServer(rbdBin, filepath.Join(b.TempDir(), "d"+strconv.Itoa(i)), 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(srv.Kill)
		c, err := client.New(srv.URL, nil)
		if err != nil {
			b.Fatal(err)
		}
		if i > 0 {
			urls = append(urls, srv.URL)
		}
		return c
	}
	fill := func(c *client.Client, n int) {
		ctx := context.Background()
		sp := spec()
		sp.Capacity, sp.Storage = int64(n), "memory"
		if _, _, err := c.CreateBuffer(ctx, "b", sp); err != nil {
			b.Fatal(err)
		}
		for k := 0; k < n; k += 1000 {
			if _, err := c.Extend(ctx, "b", "s", episodes(int64(k), 1000, 20)); err != nil {
				b.Fatal(err)
			}
		}
	}
	one := start(0)
	fill(one, 90_000)
	for i := 1; i <= 3; i++ {
		fill(start(i), 30_000)
	}
	s, err := client.NewSharded(urls, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, kind := range []string{"uniform", "prioritized"} {
		req := &client.SampleRequest{Sampler: kind, BatchSize: 256}
		for _, side := range []struct {
			name   string
			sample func() error
		}{
			{"one-server", func() error { _, err := one.Sample(context.Background(), "b", req); return err }},
			{"3-shards", func() error { _, err := s.Sample(context.Background(), "b", req); return err }},
		} {
			b.Run("sampler="+kind+"/side="+side.name, func(b *testing.B) {
				for b.Loop() {
					if err := side.sample(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
			})
		}
	}
}

// episodes is n rows of episodes of the given length, tokens from tok.
func episodes(tok int64, n, length int) []codec.Tensor {
	obs := make([]float32, 0, 4*n)
	act := make([]int64, n)
	done := make([]bool, n)
	var final []float32
	for i := range n {
		f := float32(tok + int64(i))
		obs = append(obs, f, f, f, f)
		act[i] = tok + int64(i)
		if done[i] = i%length == length-1; done[i] {
			final = append(final, f+1, f+1, f+1, f+1)
		}
	}
	return []codec.Tensor{
		client.NewTensor("observation", []int{n, 4}, obs),
		client.NewTensor("action", nil, act),
		client.NewTensor("next.reward", nil, make([]float32, n)),
		client.NewTensor("next.done", nil, done),
		client.NewTensor("next.terminated", nil, done),
		client.NewTensor("next.truncated", nil, make([]bool, n)),
		client.NewTensor("next.observation", []int{len(final) / 4, 4}, final),
	}
}
