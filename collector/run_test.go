package collector_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

func batchesEqual(a, b []storage.Batch) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Rows != b[i].Rows || len(a[i].Fields) != len(b[i].Fields) {
			return false
		}
		for k, v := range a[i].Fields {
			if !bytes.Equal(v, b[i].Fields[k]) {
				return false
			}
		}
	}
	return true
}

// A run is a function of its seed: same seed, same bytes (whatever the
// number of workers stepping the copies); another seed, other bytes.
func TestDeterministicForSeed(t *testing.T) {
	for _, tc := range []struct {
		env     string
		opts    *envs.Options
		policy  func() collector.Policy
		workers []int
	}{
		{"cartpole", nil, func() collector.Policy { return collector.NewLinearQ(4, 2, 0.5) }, []int{1}},
		{"pendulum", nil, nil, []int{1}},
		{"catch", &envs.Options{FrameStack: 4}, func() collector.Policy { return collector.NewMLPQ(4*84*84, 8, 3, 0.2, 1) }, []int{1, 2, 3}},
	} {
		collect := func(seed uint64, workers int) []storage.Batch {
			o := envs.Options{Workers: workers}
			if tc.opts != nil {
				o.FrameStack = tc.opts.FrameStack
			}
			var p collector.Policy
			if tc.policy != nil {
				p = tc.policy()
			}
			rec := &recorder{}
			if _, err := collector.Run(context.Background(), collector.Config{
				Env: newEnv(t, tc.env, 3, &o), Policy: p, Writer: rec, Seed: seed, FramesPerBatch: 30, TotalFrames: 150,
				CompactObs: true, MaxFramesPerTraj: 17,
			}); err != nil {
				t.Fatal(err)
			}
			return rec.batches
		}
		a := collect(7, 1)
		for _, w := range tc.workers {
			if !batchesEqual(a, collect(7, w)) {
				t.Errorf("%s: seed 7 gave different data (workers %d)", tc.env, w)
			}
		}
		if batchesEqual(a, collect(8, 1)) {
			t.Errorf("%s: seeds 7 and 8 gave the same data", tc.env)
		}
	}
}

// Cancelling the context stops the run after the batch under way is
// written: its last step is cut (truncated, final observation sent), no
// trajectory is left open, and Run returns nil.
func TestCancelStopsAfterCurrentBatch(t *testing.T) {
	db := openDB(t)
	env := newEnv(t, "cartpole", 4, nil)
	buf := newBuffer(t, db, "c", env.Spec(), collector.SpecOptions{CompactObs: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var before int
	st, err := collector.Run(ctx, collector.Config{
		Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer}, FramesPerBatch: 64, TotalFrames: -1, CompactObs: true,
		BeforeBatch: func(_ context.Context, st collector.Stats) error {
			before++
			if st.Batches == 3 {
				cancel() // while batch 3 is about to be collected
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Batches != 4 || st.Frames != 4*64 || buf.WriteCount() != 4*64 || before != 4 {
		t.Fatalf("stats %+v, write count %d, %d batches begun: want exactly the 4th batch completed", st, buf.WriteCount(), before)
	}
	info, _ := buf.Info()
	if info.OpenTrajectories != 0 {
		t.Fatalf("%d open trajectories", info.OpenTrajectories)
	}
	r := readRows(t, buf)
	for i := len(r.meta) - 4; i < len(r.meta); i++ {
		if m := r.meta[i]; !m.Done || !m.HasTail {
			t.Fatalf("last tick row %d: done %v, has final observation %v", i, m.Done, m.HasTail)
		}
	}
}

// An endless run stopped from another goroutine returns promptly and
// leaves no goroutine behind (goleak checks at the end), with parallel
// workers stepping a pixel env and a rate limit sleeping between batches.
func TestCancelEndlessRun(t *testing.T) {
	for _, rate := range []float64{0, 2000} {
		env := newEnv(t, "catch", 4, &envs.Options{FrameStack: 4, Workers: 2})
		ctx, cancel := context.WithCancel(context.Background())
		var batches atomic.Int64
		done := make(chan error, 1)
		go func() {
			_, err := collector.Run(ctx, collector.Config{Env: env, Writer: &recorder{}, FramesPerBatch: 32, MaxRate: rate,
				AfterBatch: func(*collector.BatchInfo) error { batches.Add(1); return nil }})
			done <- err
		}()
		for batches.Load() < 3 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("run did not stop")
		}
	}
}

// A write still running when the context ends gets StopGrace, then is
// cancelled: the run stops with an error, it does not hang.
func TestCancelWithStuckWriter(t *testing.T) {
	env := newScriptEnv(3)
	ctx, cancel := context.WithCancel(context.Background())
	w := &blockingWriter{entered: make(chan struct{})}
	go func() {
		<-w.entered
		cancel()
	}()
	start := time.Now()
	_, err := collector.Run(ctx, collector.Config{Env: env, Writer: w, FramesPerBatch: 3, StopGrace: 50 * time.Millisecond})
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

type blockingWriter struct {
	entered chan struct{}
	once    atomic.Bool
}

func (w *blockingWriter) Extend(ctx context.Context, _ string, _ *storage.Batch) (storage.ExtendResult, error) {
	if w.once.CompareAndSwap(false, true) {
		close(w.entered)
	}
	<-ctx.Done()
	return storage.ExtendResult{}, context.Cause(ctx)
}
func (w *blockingWriter) CloseStream(context.Context, string) error { return nil }

// A writer error stops the run with that error; the rows before it stay,
// and the stream's open trajectories are closed.
func TestWriterFailureStopsRun(t *testing.T) {
	db := openDB(t)
	env := newEnv(t, "cartpole", 2, nil)
	buf := newBuffer(t, db, "c", env.Spec(), collector.SpecOptions{})
	rec := &recorder{next: collector.BufferWriter{Buffer: buf.Buffer}, failAt: 3}
	st, err := collector.Run(context.Background(), collector.Config{Env: env, Writer: rec, Stream: "s", FramesPerBatch: 20, TotalFrames: -1})
	if !errors.Is(err, errWriterBroke) {
		t.Fatalf("err = %v", err)
	}
	if st.Batches != 2 || buf.WriteCount() != 40 {
		t.Fatalf("stats %+v, write count %d", st, buf.WriteCount())
	}
	if len(rec.closed) != 2 || rec.closed[1] != "s" {
		t.Fatalf("streams closed: %v (want once at the start, once at the end)", rec.closed)
	}
	if info, _ := buf.Info(); info.OpenTrajectories != 0 {
		t.Fatalf("%d open trajectories after the failure", info.OpenTrajectories)
	}
}

// Env, policy and hook errors stop the run with the error, writing
// nothing of the batch under way.
func TestErrorsStopRun(t *testing.T) {
	errHook := errors.New("hook says no")
	errPolicy := errors.New("policy broke")
	cases := []struct {
		name string
		cfg  func(c *collector.Config)
		want error
	}{
		{"env", func(c *collector.Config) { c.Env.(*scriptEnv).failStep = 5 }, errEnvBroke},
		{"policy", func(c *collector.Config) {
			c.Policy = &countingPolicy{inner: collector.RandomPolicy{Spec: c.Env.Spec()}, err: errPolicy}
		}, errPolicy},
		{"before hook", func(c *collector.Config) {
			c.BeforeBatch = func(_ context.Context, st collector.Stats) error {
				if st.Batches == 1 {
					return errHook
				}
				return nil
			}
		}, errHook},
		{"after hook", func(c *collector.Config) {
			c.AfterBatch = func(b *collector.BatchInfo) error {
				if b.Stats.Batches == 2 {
					return errHook
				}
				return nil
			}
		}, errHook},
	}
	for _, tc := range cases {
		rec := &recorder{}
		cfg := collector.Config{Env: newScriptEnv(2, 3), Writer: rec, FramesPerBatch: 4, TotalFrames: -1}
		tc.cfg(&cfg)
		_, err := collector.Run(context.Background(), cfg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
	}
	// A bad config is an error before anything runs.
	if _, err := collector.Run(context.Background(), collector.Config{Writer: &recorder{}}); err == nil {
		t.Error("no env accepted")
	}
	if _, err := collector.Run(context.Background(), collector.Config{Env: newScriptEnv(1), Writer: &recorder{}, MaxFramesPerTraj: -1}); err == nil {
		t.Error("negative max_frames_per_traj accepted")
	}
}

// init_random_frames: the policy is not asked until that many frames are
// written (whole batches).
func TestInitRandomFrames(t *testing.T) {
	env := newEnv(t, "cartpole", 2, nil)
	p := &countingPolicy{inner: collector.NewLinearQ(4, 2, 0)}
	if _, err := collector.Run(context.Background(), collector.Config{Env: env, Policy: p, Writer: &recorder{},
		FramesPerBatch: 10, TotalFrames: 100, InitRandomFrames: 25}); err != nil {
		t.Fatal(err)
	}
	// 3 batches (30 frames) random, 7 batches of 5 ticks from the policy.
	if p.calls != 7*5 {
		t.Fatalf("policy called %d times, want 35", p.calls)
	}
}

// Weights replaced while the run goes (here from the BeforeBatch hook,
// as a learner's weight sync would) apply from the next step on; the
// -race run checks the handover.
func TestWeightSyncWhileRunning(t *testing.T) {
	env := newEnv(t, "cartpole", 4, nil)
	p := collector.NewLinearQ(4, 2, 0)
	// A concurrent setter too, to exercise the handover under -race.
	stop := make(chan struct{})
	setterDone := make(chan struct{})
	go func() {
		defer close(setterDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = p.SetWeights(map[string][]float32{"w": make([]float32, 8), "b": {0, 0}}, map[string][]int{"w": {4, 2}, "b": {2}})
			runtime.Gosched()
		}
	}()
	var actions [][]byte
	_, err := collector.Run(context.Background(), collector.Config{Env: env, Policy: p, Writer: &recorder{},
		FramesPerBatch: 40, TotalFrames: 400,
		BeforeBatch: func(_ context.Context, st collector.Stats) error {
			if st.Batches == 5 {
				close(stop)
				<-setterDone
				return p.SetWeights(map[string][]float32{"w": make([]float32, 8), "b": {0, 1}}, map[string][]int{"w": {4, 2}, "b": {2}})
			}
			return nil
		},
		AfterBatch: func(b *collector.BatchInfo) error {
			actions = append(actions, append([]byte(nil), b.Batch.Fields["action"]...))
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range actions {
		want := byte(0) // zero weights: ties go to action 0
		if i >= 5 {
			want = 1 // b = [0, 1] prefers action 1
		}
		for r := 0; r < len(a); r += 8 {
			if a[r] != want {
				t.Fatalf("batch %d row %d: action %d, want %d", i, r/8, a[r], want)
			}
		}
	}
	w, b := p.Weights()
	if len(w) != 8 || b[1] != 1 {
		t.Fatalf("weights %v %v", w, b)
	}
}

// The staging buffers are reused: allocations per batch do not grow with
// the batch, and are a handful, not one per step.
func TestNoPerStepAllocations(t *testing.T) {
	allocsPerBatch := func(envName string, fpb int, compact bool, opts *envs.Options) float64 {
		env := newEnv(t, envName, 4, opts)
		var policy collector.Policy
		if env.Spec().Discrete() && !env.Spec().Pixels {
			policy = collector.NewLinearQ(env.Spec().ObsElems(), env.Spec().NumActions, 0.1)
		}
		cfg := collector.Config{Env: env, Policy: policy, Writer: nopWriter{}, FramesPerBatch: fpb, TotalFrames: int64(fpb) * 50, CompactObs: compact, MaxFramesPerTraj: 7}
		// Warm up (staging, pools), then measure a second run's steady
		// state by difference.
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		if _, err := collector.Run(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&ms1)
		small := ms1.Mallocs - ms0.Mallocs
		cfg.TotalFrames *= 3
		runtime.ReadMemStats(&ms0)
		if _, err := collector.Run(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&ms1)
		large := ms1.Mallocs - ms0.Mallocs
		return float64(int64(large)-int64(small)) / 100 // per extra batch
	}
	for _, tc := range []struct {
		env     string
		compact bool
		opts    *envs.Options
		fpb     int
	}{{"cartpole", false, nil, 64}, {"cartpole", true, nil, 64}, {"pendulum", true, nil, 64}, {"catch", true, &envs.Options{FrameStack: 4, Workers: 2}, 8}} {
		a := allocsPerBatch(tc.env, tc.fpb, tc.compact, tc.opts)
		b := allocsPerBatch(tc.env, 8*tc.fpb, tc.compact, tc.opts)
		t.Logf("%s compact=%v: %.1f allocations per batch of %d frames, %.1f per batch of %d", tc.env, tc.compact, a, tc.fpb, b, 8*tc.fpb)
		if a > 12 || b > 12 {
			t.Errorf("%s compact=%v: %.1f / %.1f allocations per batch", tc.env, tc.compact, a, b)
		}
	}
}

type nopWriter struct{}

func (nopWriter) Extend(_ context.Context, _ string, b *storage.Batch) (storage.ExtendResult, error) {
	return storage.ExtendResult{Rows: b.Rows}, nil
}
func (nopWriter) CloseStream(context.Context, string) error { return nil }

// The episode statistics: CartPole pays 1 per step, so the mean return of
// the last 100 episodes is their mean length; a random policy's episodes
// last about 22 steps, and MaxFramesPerTraj bounds them.
func TestEpisodeStats(t *testing.T) {
	for _, tc := range []struct {
		maxFrames int
		lo, hi    float64
	}{
		{0, 12, 40},
		{8, 1, 8},
	} {
		st, err := collector.Run(context.Background(), collector.Config{
			Env: newEnv(t, "cartpole", 4, nil), Policy: collector.NewLinearQ(4, 2, 1), Writer: &recorder{},
			Seed: 3, FramesPerBatch: 100, TotalFrames: 4000, MaxFramesPerTraj: tc.maxFrames,
		})
		if err != nil {
			t.Fatal(err)
		}
		if st.Episodes < 100 || st.MeanLength != st.MeanReturn || st.MeanLength < tc.lo || st.MeanLength > tc.hi {
			t.Errorf("max frames %d: %d episodes, mean length %v, mean return %v; want at least 100 episodes, length = return in [%v, %v]",
				tc.maxFrames, st.Episodes, st.MeanLength, st.MeanReturn, tc.lo, tc.hi)
		}
	}
}
