package collector_test

import (
	"context"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/server"
)

// TestCollectorWaitsForLearners: a collector writing into a rate-limited
// buffer (in process and over HTTP) stops at max_diff, says so through
// OnRateLimited, resumes as learners sample, and gives up the batch the
// limiter holds when the run is stopped.
func TestCollectorWaitsForLearners(t *testing.T) {
	for _, via := range []string{"in-process", "http"} {
		t.Run(via, func(t *testing.T) {
			db := openDB(t)
			env := newEnv(t, "cartpole", 4, nil)
			o := collector.SpecOptions{CompactObs: true}
			b := newBuffer(t, db, "rl", env.Spec(), o)
			// spi 1, min_size 256, error_buffer 1024: after the fill,
			// 1,024 more rows (4 batches of 256) before max_diff.
			if err := b.SetRateLimit(&ratelimit.Params{SamplesPerInsert: 1, MinSize: 256, ErrorBuffer: 1024}); err != nil {
				t.Fatal(err)
			}
			var w collector.Writer = collector.BufferWriter{Buffer: b.Buffer, Wait: 50 * time.Millisecond}
			if via == "http" {
				ts := httptest.NewServer(server.New(db, nil).Handler())
				defer ts.Close()
				c, err := client.New(ts.URL, nil)
				if err != nil {
					t.Fatal(err)
				}
				w = collector.NewHTTPWriter(c, "rl", b.Spec())
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var held atomic.Int64 // frames written when the limiter held the run
			done := make(chan collector.Stats, 1)
			go func() {
				st, err := collector.Run(ctx, collector.Config{
					Env: env, Writer: w, FramesPerBatch: 256, CompactObs: true, Seed: 1,
					OnRateLimited: func(st collector.Stats) { held.Store(st.Frames) },
				})
				if err != nil {
					t.Error(err)
				}
				done <- st
			}()
			waitUntil(t, func() bool { return held.Load() == 1280 })
			if b.WriteCount() != 1280 {
				t.Fatalf("write count %d while held back, want 1280", b.WriteCount())
			}
			// A learner samples 512 rows: room for two more batches.
			batch, err := b.Sample(ctx, &rbd.SampleRequest{BatchSize: 512, IncludeIncomplete: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			batch.Release()
			waitUntil(t, func() bool { return held.Load() == 1792 })
			cancel()
			st := <-done
			if st.Frames != 1792 || st.HeldBack != 256 || st.RateLimitWait <= 0 {
				t.Fatalf("stats after the stop: frames %d, held back %d, waited %v", st.Frames, st.HeldBack, st.RateLimitWait)
			}
			if info, _ := b.Info(); info.OpenTrajectories != 0 || info.WriteCount != 1792 {
				t.Fatalf("after the run: %d open trajectories, write count %d", info.OpenTrajectories, info.WriteCount)
			}
		})
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition never held")
}
