package rbd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/storage"
)

// rowsBatch is n steps of env 0 that do not end the trajectory (plain,
// next observations included).
func rowsBatch(n int) *storage.Batch {
	steps := make([]step, n)
	nexts := make([]float32, n)
	for i := range steps {
		steps[i] = step{obs: float32(i), rew: 1}
		nexts[i] = float32(i + 1)
	}
	return stepsBatch(false, steps, nexts)
}

func limitedBuffer(t *testing.T, db *DB, kind storage.Kind, p ratelimit.Params) *Buffer {
	t.Helper()
	spec := testSpec(kind, 1000, false, false)
	spec.RateLimit = &p
	b, _, err := db.CreateBuffer("rl", spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func limiterState(t *testing.T, b *Buffer) ratelimit.State {
	t.Helper()
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.RateLimit == nil {
		t.Fatal("info has no rate_limit")
	}
	return *info.RateLimit
}

func wantCounters(t *testing.T, b *Buffer, inserts, samples int64) {
	t.Helper()
	st := limiterState(t, b)
	if st.Inserts != inserts || st.Samples != samples {
		t.Fatalf("limiter inserts %d samples %d, want %d %d (%+v)", st.Inserts, st.Samples, inserts, samples, st)
	}
}

// TestRateLimitedBuffer walks the design's rules through a real buffer:
// extends and samples of every kind of outcome, with exact counters.
func TestRateLimitedBuffer(t *testing.T) {
	for _, kind := range []storage.Kind{storage.KindMemory, storage.KindMemmap, storage.KindCompressed} {
		t.Run(string(kind), func(t *testing.T) {
			db := openDB(t)
			// spi 2, min_size 10, error_buffer 6: window [14, 26].
			b := limitedBuffer(t, db, kind, ratelimit.Params{SamplesPerInsert: 2, MinSize: 10, ErrorBuffer: 6})
			ctx := context.Background()
			sample := func(n int, timeout time.Duration) (*Batch, error) {
				return b.Sample(ctx, &SampleRequest{BatchSize: n, TimeoutMS: timeout.Milliseconds()}, nil)
			}

			if _, err := sample(4, 0); !errors.Is(err, ratelimit.ErrRateLimited) {
				t.Fatalf("sample of an empty buffer: %v", err)
			}
			// Filling (at most 3 rows a request: 2*4 > error_buffer 6).
			for _, n := range []int{3, 3, 3, 1} {
				if _, err := b.Extend("s", rowsBatch(n)); err != nil { // diff 20
					t.Fatal(err)
				}
			}
			batch, err := sample(6, 0) // 14
			if err != nil {
				t.Fatal(err)
			}
			batch.Release()
			wantCounters(t, b, 10, 6)

			// A sample blocked, then released by an extend.
			got := make(chan error, 1)
			go func() {
				batch, err := sample(4, time.Minute) // 14 - 4 < 14
				if err == nil {
					batch.Release()
				}
				got <- err
			}()
			waitState(t, b, func(s ratelimit.State) bool { return s.WaitingSamples == 1 })
			if _, err := b.Extend("s", rowsBatch(2)); err != nil { // 18: the sample goes, 14
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			wantCounters(t, b, 12, 10)

			// An extend refused at once writes nothing.
			for range 2 {
				if _, err := b.Extend("s", rowsBatch(3)); err != nil { // 20, 26
					t.Fatal(err)
				}
			}
			wc := b.WriteCount()
			if _, err := b.Extend("s", rowsBatch(1)); !errors.Is(err, ratelimit.ErrRateLimited) {
				t.Fatalf("extend past max_diff: %v", err)
			}
			if b.WriteCount() != wc {
				t.Fatal("a refused extend wrote rows")
			}
			wantCounters(t, b, 18, 10)

			// An extend that waits, released by a sample.
			go func() {
				_, err := b.ExtendContext(ctx, "s", rowsBatch(2), &storage.ExtendOptions{Timeout: time.Minute})
				got <- err
			}()
			waitState(t, b, func(s ratelimit.State) bool { return s.WaitingExtends == 1 && s.Blocked == "extends" })
			batch, err = sample(4, 0) // 22: the extend goes, 26
			if err != nil {
				t.Fatal(err)
			}
			batch.Release()
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			wantCounters(t, b, 20, 14)
			if b.WriteCount() != wc+2 {
				t.Fatalf("write count %d, want %d", b.WriteCount(), wc+2)
			}

			// Requests no state could admit are refused at once.
			if _, err := sample(7, time.Minute); !errors.Is(err, ratelimit.ErrNeverAdmitted) {
				t.Fatalf("sample of 7 rows: %v", err)
			}
			if _, err := b.Extend("s", rowsBatch(4)); !errors.Is(err, ratelimit.ErrNeverAdmitted) {
				t.Fatalf("extend of 4 rows: %v", err)
			}

		})
	}
}

// TestRateLimitRefunds: rows a sample did not return are given back.
func TestRateLimitRefunds(t *testing.T) {
	db := openDB(t)
	b := limitedBuffer(t, db, storage.KindMemory, ratelimit.Params{SamplesPerInsert: 1, MinSize: 1, ErrorBuffer: 1000})
	ctx := context.Background()
	if _, err := b.Extend("s", rowsBatch(26)); err != nil {
		t.Fatal(err)
	}
	// Admitted, then no trajectory is long enough: nothing counted.
	_, err := b.Sample(ctx, &SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: 900}, nil)
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("slice longer than any trajectory: %v", err)
	}
	wantCounters(t, b, 26, 0)
	// Padding counts: 2 slices of 30 from a 26-row trajectory.
	batch, err := b.Sample(ctx, &SampleRequest{Sampler: "slice", NumSlices: 2, SliceLen: 30, StrictLength: ptr(false)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch.Release()
	wantCounters(t, b, 26, 60)
	// An epoch of 26 rows in batches of 12: 12, 12, then a short 2.
	for i, want := range []int64{72, 84, 86} {
		batch, err := b.Sample(ctx, &SampleRequest{Sampler: "without_replacement", BatchSize: 12, Consumer: "c"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		batch.Release()
		if st := limiterState(t, b); st.Samples != want {
			t.Fatalf("batch %d: samples %d, want %d", i, st.Samples, want)
		}
	}
}

// TestRateLimitWaitsEnd: a cancelled wait counts nothing; deleting the
// buffer answers its waiters at once.
func TestRateLimitWaitsEnd(t *testing.T) {
	db := openDB(t)
	b := limitedBuffer(t, db, storage.KindMemmap, ratelimit.Params{SamplesPerInsert: 1, MinSize: 5, ErrorBuffer: 2})
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 2)
	go func() {
		_, err := b.Sample(ctx, &SampleRequest{BatchSize: 1, TimeoutMS: 60000}, nil)
		got <- err
	}()
	waitState(t, b, func(s ratelimit.State) bool { return s.WaitingSamples == 1 })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sample: %v", err)
	}
	wantCounters(t, b, 0, 0)

	for _, n := range []int{2, 2, 1, 2} {
		if _, err := b.Extend("s", rowsBatch(n)); err != nil { // filled (diff 5), then 7 = max_diff
			t.Fatal(err)
		}
	}
	// Window [3, 7]: at diff 7 an extend waits. (Both sides cannot wait at
	// once: a request moves diff by at most error_buffer, half the
	// window.) A second buffer, empty, holds a waiting sample.
	spec := testSpec(storage.KindMemory, 1000, false, false)
	spec.RateLimit = &ratelimit.Params{MinSize: 5}
	b2, _, err := db.CreateBuffer("rl2", spec)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() {
		_, err := b.ExtendContext(context.Background(), "s", rowsBatch(2), &storage.ExtendOptions{Timeout: time.Minute})
		got <- err
	}()
	go func() {
		_, err := b2.Sample(context.Background(), &SampleRequest{BatchSize: 4, TimeoutMS: 60000}, nil)
		got <- err
	}()
	waitState(t, b, func(s ratelimit.State) bool { return s.WaitingExtends == 1 })
	waitState(t, b2, func(s ratelimit.State) bool { return s.WaitingSamples == 1 })
	for _, name := range []string{"rl", "rl2"} {
		if err := db.Store().DeleteBuffer(name); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := <-got; !errors.Is(err, storage.ErrClosed) {
			t.Fatalf("waiter of a deleted buffer: %v", err)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("delete and its waiters took %v", took)
	}
}

// TestRateLimitAcrossRestarts: the limit is kept in the catalog, changes
// persist, and the counters restart at the window's centre.
func TestRateLimitAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := ratelimit.Params{SamplesPerInsert: 4, MinSize: 10, ErrorBuffer: 8}
	b := limitedBuffer(t, db, storage.KindMemmap, p)
	for range 6 {
		if _, err := b.Extend("s", rowsBatch(2)); err != nil { // filling, then 4*12 = 48 = max_diff
			t.Fatal(err)
		}
	}
	if _, err := b.Extend("s", rowsBatch(1)); !errors.Is(err, ratelimit.ErrRateLimited) {
		t.Fatalf("extend past max_diff: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	reopen := func() *Buffer {
		t.Helper()
		db, err = Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b, err := db.Buffer("rl")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b = reopen()
	st := limiterState(t, b)
	if st.Inserts != 10 || st.Samples != 0 || st.Diff != 40 || st.Blocked != "none" {
		t.Fatalf("after a restart: %+v, want diff at the centre 40", st)
	}
	if _, err := b.Extend("s", rowsBatch(1)); err != nil { // 44: the writer goes on at once
		t.Fatal(err)
	}

	// A change persists; invalid ones name the key and change nothing.
	err = b.SetRateLimit(&ratelimit.Params{SamplesPerInsert: 4, MinSize: 10, ErrorBuffer: 3})
	var se *storage.SpecError
	if !errors.As(err, &se) || se.Path != "rate_limit.error_buffer" || !errors.Is(err, storage.ErrInvalidSpec) {
		t.Fatalf("window too small: %v", err)
	}
	if err := b.SetRateLimit(&ratelimit.Params{MinSize: 3}); err != nil {
		t.Fatal(err)
	}
	if st := limiterState(t, b); st.SamplesPerInsert != nil || st.MinSize != 3 || st.Inserts != 3 {
		t.Fatalf("after the change: %+v", st)
	}
	db.Close()
	b = reopen()
	if rl := b.Spec().RateLimit; rl == nil || *rl != (ratelimit.Params{MinSize: 3}) {
		t.Fatalf("rate limit after a restart: %+v", rl)
	}
	if err := b.SetRateLimit(nil); err != nil {
		t.Fatal(err)
	}
	if _, on := b.RateLimit(); on {
		t.Fatal("limiter on after removing it")
	}
	db.Close()
	b = reopen()
	if rl := b.Spec().RateLimit; rl != nil {
		t.Fatalf("removed rate limit came back: %+v", rl)
	}
}

func waitState(t *testing.T, b *Buffer, cond func(ratelimit.State) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if st, on := b.RateLimit(); on && cond(st) {
			return
		}
	}
	st, _ := b.RateLimit()
	t.Fatalf("limiter never reached the state; last %+v", st)
}

// TestSampleWaitingForDataHoldsNoGrant: a sample that waits for data (here
// for rows of a newer policy) gives its admission back while it waits, so
// extends admitted meanwhile cannot push the counters past max_diff.
func TestSampleWaitingForDataHoldsNoGrant(t *testing.T) {
	db := openDB(t)
	b := limitedBuffer(t, db, storage.KindMemory, ratelimit.Params{SamplesPerInsert: 2, MinSize: 10, ErrorBuffer: 6})
	for _, n := range []int{3, 3, 3, 1} { // diff 20
		if _, err := b.Extend("s", rowsBatch(n)); err != nil {
			t.Fatal(err)
		}
	}
	v := int64(5)
	got := make(chan error, 1)
	waiting := make(chan struct{}, 64) // a few wake-ups at most; never blocks the sample
	b.onDataWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	go func() {
		batch, err := b.Sample(context.Background(), &SampleRequest{BatchSize: 6, TimeoutMS: 60_000, MinPolicyVersion: &v}, nil)
		if err == nil {
			batch.Release()
		}
		got <- err
	}()
	waitForDataWait := func() {
		t.Helper()
		select {
		case <-waiting:
		case err := <-got:
			t.Fatalf("the sample ended instead of waiting for data: %v", err)
		}
	}
	// While it waits for version-5 rows, the limiter counts no sample: an
	// extend of 3 rows (20 + 6 = 26) is admitted, and a second is not (had
	// the sample kept its 6 rows, diff would be 20 and it would go). The
	// first extend wakes the sample; it looks, finds no version-5 row, and
	// waits again.
	waitForDataWait()
	if _, err := b.Extend("s", rowsBatch(3)); err != nil {
		t.Fatal(err)
	}
	waitForDataWait()
	if _, err := b.Extend("s", rowsBatch(3)); !errors.Is(err, ratelimit.ErrRateLimited) {
		t.Fatalf("second extend while the sample waits for data: %v", err)
	}
	st := limiterState(t, b)
	if st.Inserts != 13 || st.Samples != 0 || st.Diff != *st.MaxDiff {
		t.Fatalf("while the sample waits: %+v, want 13 inserts, 0 samples, diff at max_diff", st)
	}
	// The rows it waits for arrive once the limit is lifted.
	if err := b.SetRateLimit(nil); err != nil {
		t.Fatal(err)
	}
	batch := rowsBatch(8)
	batch.PolicyVersion = []int64{5, 5, 5, 5, 5, 5, 5, 5}
	if _, err := b.Extend("s", batch); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("sample once version-5 rows exist: %v", err)
	}
}
