package ratelimit

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var errStop = errors.New("stopped")

// now is a deadline that allows no wait.
func now() time.Time { return time.Now() }

func acquire(l *Limiter, side Side, n int64) error {
	_, err := l.Acquire(context.Background(), side, n, now(), nil, errStop)
	return err
}

func TestProblems(t *testing.T) {
	cases := []struct {
		name     string
		p        Params
		capacity int64    // 0: 1e6
		want     []string // "key: substring"
	}{
		{"ratio", Params{SamplesPerInsert: 8, MinSize: 1000, ErrorBuffer: 4000}, 0, nil},
		{"min size only", Params{MinSize: 10}, 0, nil},
		{"fractional ratio", Params{SamplesPerInsert: 0.25, MinSize: 1, ErrorBuffer: 1}, 0, nil},
		{"window exactly 2*spi", Params{SamplesPerInsert: 8, MinSize: 1, ErrorBuffer: 8}, 0, nil},
		{"negative ratio", Params{SamplesPerInsert: -1, MinSize: 1, ErrorBuffer: 10}, 0, []string{"samples_per_insert: must be a finite number > 0"}},
		{"NaN ratio", Params{SamplesPerInsert: math.NaN(), MinSize: 1, ErrorBuffer: 10}, 0, []string{"samples_per_insert: must be a finite number > 0"}},
		{"infinite ratio", Params{SamplesPerInsert: math.Inf(1), MinSize: 1, ErrorBuffer: 10}, 0, []string{"samples_per_insert: must be a finite number > 0"}},
		{"min size 0", Params{MinSize: 0}, 0, []string{"min_size: must be at least 1"}},
		{"min size above capacity", Params{MinSize: 101}, 100, []string{"min_size: 101 is more than the capacity (100)"}},
		{"error buffer without ratio", Params{MinSize: 1, ErrorBuffer: 3}, 0, []string{"error_buffer: applies only with samples_per_insert"}},
		{"no error buffer", Params{SamplesPerInsert: 2, MinSize: 1}, 0, []string{"error_buffer: must be a finite number > 0"}},
		{"NaN error buffer", Params{SamplesPerInsert: 2, MinSize: 1, ErrorBuffer: math.NaN()}, 0, []string{"error_buffer: must be a finite number > 0"}},
		{"window too small", Params{SamplesPerInsert: 8, MinSize: 1, ErrorBuffer: 7.5}, 0, []string{"error_buffer: the window max_diff - min_diff = 2*error_buffer = 15 is smaller than 2*max(1, samples_per_insert) = 16; raise error_buffer to at least 8"}},
		{"window too small below 1", Params{SamplesPerInsert: 0.5, MinSize: 1, ErrorBuffer: 0.5}, 0, []string{"error_buffer: the window max_diff - min_diff = 2*error_buffer = 1 is smaller than 2*max(1, samples_per_insert) = 2"}},
		{"everything", Params{SamplesPerInsert: -3, MinSize: -1, ErrorBuffer: -1}, 0, []string{"samples_per_insert:", "min_size:", "error_buffer:"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.capacity == 0 {
				c.capacity = 1e6
			}
			got := c.p.Problems(c.capacity)
			if len(got) != len(c.want) {
				t.Fatalf("problems %v, want %d: %v", got, len(c.want), c.want)
			}
			for i, w := range c.want {
				if s := got[i].Key + ": " + got[i].Msg; !strings.Contains(s, w) {
					t.Errorf("problem %d is %q, want it to contain %q", i, s, w)
				}
			}
		})
	}
}

// op is one step of a rules scenario: a request (no wait) with the answer
// expected, or a new size.
type op struct {
	side    Side
	n       int64
	size    int64 // > 0: SetSize instead of a request
	want    string
	inserts int64
	samples int64
}

const (
	ok       = "ok"
	blocked  = "rate limited"
	tooLarge = "can never be admitted"
)

func TestAdmissionRules(t *testing.T) {
	// spi 2, min_size 10, error_buffer 6: window [14, 26], 12 wide.
	ratio := Params{SamplesPerInsert: 2, MinSize: 10, ErrorBuffer: 6}
	cases := []struct {
		name string
		p    Params
		ops  []op
	}{
		{"fill then ratio", ratio, []op{
			// One request may move diff by at most error_buffer = 6: 6 sampled
			// rows, 3 inserted ones.
			{side: Samples, n: 1, want: blocked},                            // size 0 < min_size
			{side: Inserts, n: 4, want: tooLarge},                           // 2*4 > 6, while filling too
			{side: Inserts, n: 3, want: ok, inserts: 3},                     // filling: 3 <= 10
			{side: Inserts, n: 3, want: ok, inserts: 6},                     //
			{side: Inserts, n: 3, want: ok, inserts: 9},                     //
			{side: Inserts, n: 1, want: ok, inserts: 10},                    // filling: 10 <= 10, diff 20
			{side: Samples, n: 1, want: blocked, inserts: 10},               // the rows are not published yet
			{size: 10, inserts: 10},                                         // now they are
			{side: Inserts, n: 3, want: ok, inserts: 13},                    // 20 + 6 = 26
			{side: Inserts, n: 1, want: blocked, inserts: 13},               // 26 + 2 > 26
			{side: Samples, n: 6, want: ok, inserts: 13, samples: 6},        // 20
			{side: Samples, n: 6, want: ok, inserts: 13, samples: 12},       // 14
			{side: Samples, n: 1, want: blocked, inserts: 13, samples: 12},  // 14 - 1 < 14
			{side: Samples, n: 7, want: tooLarge, inserts: 13, samples: 12}, // 7 > 6, whatever the state
			{side: Inserts, n: 4, want: tooLarge, inserts: 13, samples: 12}, // 2*4 > 6
			{side: Inserts, n: 3, want: ok, inserts: 16, samples: 12},       // 20
			{side: Inserts, n: 3, want: ok, inserts: 19, samples: 12},       // 26
			{side: Samples, n: 6, want: ok, inserts: 19, samples: 18},       // 20
			{side: Samples, n: 6, want: ok, inserts: 19, samples: 24},       // back to 14
			{side: Inserts, n: 1, want: ok, inserts: 20, samples: 24},       // 16
			{side: Samples, n: 2, want: ok, inserts: 20, samples: 26},       // 14
			{side: Samples, n: 1, want: blocked, inserts: 20, samples: 26},  // 13 < 14
			{size: 5, inserts: 20, samples: 26},                             // the ring lost rows (delete, reopen)
			{side: Inserts, n: 1, want: ok, inserts: 21, samples: 26},       // inserts do not look at size
			{side: Samples, n: 1, want: blocked, inserts: 21, samples: 26},  // size 5 < 10
			{size: 10, inserts: 21, samples: 26},                            //
			{side: Samples, n: 2, want: ok, inserts: 21, samples: 28},       // 16 - 2 = 14
		}},
		{"min size only", Params{MinSize: 3}, []op{
			{side: Samples, n: 1, want: blocked},
			{side: Inserts, n: 1000, want: ok, inserts: 1000}, // no ratio: inserts always pass, never too large
			{size: 2, inserts: 1000},
			{side: Samples, n: 1, want: blocked, inserts: 1000},
			{size: 3, inserts: 1000},
			{side: Samples, n: 1 << 40, want: ok, inserts: 1000, samples: 1 << 40},
			{side: Samples, n: 1, want: ok, inserts: 1000, samples: 1<<40 + 1},
		}},
		{"fractional ratio", Params{SamplesPerInsert: 0.5, MinSize: 4, ErrorBuffer: 1}, []op{
			// window [1, 3]; an insert moves diff by 0.5; a request at most 1.
			{side: Inserts, n: 2, want: ok, inserts: 2},
			{side: Inserts, n: 2, want: ok, inserts: 4}, // diff 2
			{size: 4, inserts: 4},
			{side: Inserts, n: 2, want: ok, inserts: 6},                  // 3
			{side: Inserts, n: 1, want: blocked, inserts: 6},             // 3.5 > 3
			{side: Samples, n: 1, want: ok, inserts: 6, samples: 1},      // 2
			{side: Samples, n: 1, want: ok, inserts: 6, samples: 2},      // 1
			{side: Samples, n: 1, want: blocked, inserts: 6, samples: 2}, // 0 < 1
			{side: Samples, n: 2, want: tooLarge, inserts: 6, samples: 2},
			{side: Inserts, n: 2, want: ok, inserts: 8, samples: 2}, // 0.5*2 = 1 <= error_buffer
			{side: Inserts, n: 3, want: tooLarge, inserts: 8, samples: 2},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if probs := c.p.Problems(1 << 50); len(probs) > 0 {
				t.Fatalf("params: %v", probs)
			}
			l := New(&c.p, 0)
			for i, o := range c.ops {
				if o.size > 0 {
					l.SetSize(o.size)
				} else {
					err := acquire(l, o.side, o.n)
					switch {
					case o.want == ok && err != nil:
						t.Fatalf("op %d (%s %d): %v", i, o.side, o.n, err)
					case o.want == blocked && !errors.Is(err, ErrRateLimited):
						t.Fatalf("op %d (%s %d): %v, want rate limited", i, o.side, o.n, err)
					case o.want == tooLarge && !errors.Is(err, ErrNeverAdmitted):
						t.Fatalf("op %d (%s %d): %v, want never admitted", i, o.side, o.n, err)
					}
					if err != nil && !strings.Contains(err.Error(), o.want) {
						t.Fatalf("op %d: error %q does not say %q", i, err, o.want)
					}
				}
				st, _ := l.State()
				if st.Inserts != o.inserts || st.Samples != o.samples {
					t.Fatalf("op %d: inserts %d samples %d, want %d %d", i, st.Inserts, st.Samples, o.inserts, o.samples)
				}
				if want := c.p.spi()*float64(o.inserts) - float64(o.samples); st.Diff != want {
					t.Fatalf("op %d: diff %v, want %v", i, st.Diff, want)
				}
			}
		})
	}
}

func TestBlockedErrorSaysWhy(t *testing.T) {
	p := Params{SamplesPerInsert: 2, MinSize: 10, ErrorBuffer: 6}
	l := New(&p, 0)
	err := acquire(l, Samples, 4)
	var be *BlockedError
	if !errors.As(err, &be) || !strings.Contains(be.Reason, "holds 0 rows, fewer than min_size 10") {
		t.Fatalf("sample before min_size: %v", err)
	}
	if be.State.Blocked != "samples" || *be.State.MinDiff != 14 || *be.State.MaxDiff != 26 {
		t.Fatalf("state %+v", be.State)
	}
	l.Set(&p, 10) // diff at the centre, 20
	if err := acquire(l, Samples, 6); err != nil {
		t.Fatal(err)
	}
	err = acquire(l, Samples, 1)
	if !errors.As(err, &be) || !strings.Contains(be.Reason, "diff 14 - 1 rows < min_diff 14: learners are ahead") {
		t.Fatalf("sample past min_diff: %v", err)
	}
	l.Set(&p, 10)
	if err := acquire(l, Inserts, 3); err != nil {
		t.Fatal(err)
	}
	err = acquire(l, Inserts, 1)
	if !errors.As(err, &be) || !strings.Contains(be.Reason, "diff 26 + 2*1 rows > max_diff 26: actors are ahead") || be.State.Blocked != "extends" {
		t.Fatalf("extend past max_diff: %v (%+v)", err, be)
	}
	var tl *TooLargeError
	if err := acquire(l, Inserts, 100); !errors.As(err, &tl) || !strings.Contains(err.Error(), "send at most 3 rows per request") {
		t.Fatalf("extend of 100 rows: %v", err)
	}
	if err := acquire(l, Samples, 100); !errors.As(err, &tl) || !strings.Contains(err.Error(), "sample at most 6 rows per request") {
		t.Fatalf("sample of 100 rows: %v", err)
	}
	if st, _ := l.State(); st.RefusedExtends != 1 || st.RefusedSamples != 2 {
		t.Fatalf("refusals %+v: want 2 samples and 1 extend (a request too large is a client error, not a refusal)", st)
	}
}

// result of an Acquire run in the background.
type result struct {
	err    error
	at     time.Duration
	rank   int
	waited time.Duration // Grant.Waited
}

func background(l *Limiter, side Side, n int64, wait time.Duration, rank int, out chan<- result) {
	start := time.Now()
	go func() {
		g, err := l.Acquire(context.Background(), side, n, start.Add(wait), nil, errStop)
		out <- result{err: err, at: time.Since(start), rank: rank, waited: g.Waited()}
	}()
}

// waitFor polls the limiter until cond holds (a waiter is queued, ...).
func waitFor(t *testing.T, l *Limiter, cond func(State) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if st, _ := l.State(); cond(st) {
			return
		}
	}
	st, _ := l.State()
	t.Fatalf("condition never held; state %+v", st)
}

func TestWaitersAreReleasedByTheOtherSide(t *testing.T) {
	p := Params{SamplesPerInsert: 2, MinSize: 10, ErrorBuffer: 6}
	t.Run("sample released by an extend", func(t *testing.T) {
		l := New(&p, 10) // diff 20
		if err := acquire(l, Samples, 6); err != nil {
			t.Fatal(err)
		}
		out := make(chan result, 1)
		background(l, Samples, 4, time.Minute, 0, out) // 14 - 4 < 14
		waitFor(t, l, func(s State) bool { return s.WaitingSamples == 1 && s.Blocked == "samples" })
		g, err := l.Acquire(context.Background(), Inserts, 2, now(), nil, errStop) // 14 + 4 = 18
		if err != nil || g.Waited() != 0 {
			t.Fatalf("extend admitted at once: waited %v, %v", g.Waited(), err)
		}
		if r := <-out; r.err != nil || r.waited <= 0 || r.waited > r.at {
			t.Fatalf("released sample: waited %v of %v, %v", r.waited, r.at, r.err)
		}
		st, _ := l.State()
		if st.Inserts != 12 || st.Samples != 10 || st.Diff != 14 || st.WaitingSamples != 0 || st.SampleWaitSeconds <= 0 {
			t.Fatalf("state %+v", st)
		}
	})
	t.Run("extend released by a sample", func(t *testing.T) {
		l := New(&p, 10)
		if err := acquire(l, Inserts, 3); err != nil { // 26
			t.Fatal(err)
		}
		out := make(chan result, 1)
		background(l, Inserts, 2, time.Minute, 0, out)
		waitFor(t, l, func(s State) bool { return s.WaitingExtends == 1 && s.Blocked == "extends" })
		if err := acquire(l, Samples, 3); err != nil { // 23: room for one row, not two
			t.Fatal(err)
		}
		if st, _ := l.State(); st.WaitingExtends != 1 {
			t.Fatalf("extend of 2 admitted at diff 23: %+v", st)
		}
		if err := acquire(l, Samples, 1); err != nil { // 22 + 4 = 26
			t.Fatal(err)
		}
		if r := <-out; r.err != nil {
			t.Fatal(r.err)
		}
		if st, _ := l.State(); st.Inserts != 15 || st.Samples != 4 || st.Diff != 26 {
			t.Fatalf("state %+v", st)
		}
	})
}

func TestFirstComeFirstServed(t *testing.T) {
	p := Params{SamplesPerInsert: 1, MinSize: 1, ErrorBuffer: 10}
	l := New(&p, 1)                                 // diff 1, window [-9, 11]
	if err := acquire(l, Samples, 10); err != nil { // -9
		t.Fatal(err)
	}
	out := make(chan result, 3)
	for i, n := range []int64{3, 1, 2} {
		background(l, Samples, n, time.Minute, i, out)
		waitFor(t, l, func(s State) bool { return s.WaitingSamples == i+1 })
	}
	// A newcomer that could pass does not jump the queue.
	if err := acquire(l, Inserts, 1); err != nil { // -8: the head (3) cannot go, nor may the 1 behind it
		t.Fatal(err)
	}
	if err := acquire(l, Samples, 1); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("a newcomer passed waiters: %v", err)
	}
	if st, _ := l.State(); st.WaitingSamples != 3 || st.Samples != 10 {
		t.Fatalf("state %+v", st)
	}
	if err := acquire(l, Inserts, 2); err != nil { // -6: the head (3) goes, -9; the 1 cannot
		t.Fatal(err)
	}
	if r := <-out; r.rank != 0 || r.err != nil {
		t.Fatalf("first admitted: %+v", r)
	}
	if err := acquire(l, Inserts, 1); err != nil { // -8: the 1 goes (-9), the 2 cannot
		t.Fatal(err)
	}
	if r := <-out; r.rank != 1 || r.err != nil {
		t.Fatalf("second admitted: %+v", r)
	}
	if err := acquire(l, Inserts, 2); err != nil { // -7: the 2 goes
		t.Fatal(err)
	}
	if r := <-out; r.rank != 2 || r.err != nil {
		t.Fatalf("third admitted: %+v", r)
	}
	if st, _ := l.State(); st.Diff != -9 || st.Samples != 16 || st.Inserts != 7 {
		t.Fatalf("state %+v", st)
	}
}

func TestWaitsEndAndCountNothing(t *testing.T) {
	p := Params{SamplesPerInsert: 1, MinSize: 5, ErrorBuffer: 2}
	cases := []struct {
		name string
		end  func(l *Limiter, cancel context.CancelFunc, stop chan struct{})
		want error
	}{
		{"deadline", func(*Limiter, context.CancelFunc, chan struct{}) {}, ErrRateLimited},
		{"context", func(_ *Limiter, cancel context.CancelFunc, _ chan struct{}) { cancel() }, context.Canceled},
		{"stop", func(_ *Limiter, _ context.CancelFunc, stop chan struct{}) { close(stop) }, errStop},
		{"close", func(l *Limiter, _ context.CancelFunc, _ chan struct{}) { l.Close(errClosedForTest) }, errClosedForTest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := New(&p, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := make(chan struct{})
			wait := 150 * time.Millisecond
			if c.want != ErrRateLimited {
				wait = time.Minute
			}
			done := make(chan error, 2)
			start := time.Now()
			for range 2 {
				go func() {
					_, err := l.Acquire(ctx, Samples, 1, start.Add(wait), stop, errStop)
					done <- err
				}()
			}
			waitFor(t, l, func(s State) bool { return s.WaitingSamples == 2 })
			c.end(l, cancel, stop)
			for range 2 {
				if err := <-done; !errors.Is(err, c.want) {
					t.Fatalf("waiter ended with %v, want %v", err, c.want)
				}
			}
			if took := time.Since(start); took > wait+5*time.Second {
				t.Fatalf("waiters answered after %v (wait %v)", took, wait)
			}
			st, _ := l.State()
			if st.Samples != 0 || st.WaitingSamples != 0 {
				t.Fatalf("state after the waits ended: %+v", st)
			}
			if c.want == ErrRateLimited && (st.RefusedSamples != 2 || st.SampleWaitSeconds < 0.25) {
				t.Fatalf("refusals and wait time not counted: %+v", st)
			}
		})
	}
}

var errClosedForTest = errors.New("buffer deleted")

func TestClosedLimiterRefusesAtOnce(t *testing.T) {
	l := New(&Params{MinSize: 1}, 0)
	l.Close(errClosedForTest)
	if err := acquire(l, Inserts, 1); !errors.Is(err, errClosedForTest) {
		t.Fatal(err)
	}
	off := New(nil, 0)
	off.Close(errClosedForTest)
	if err := acquire(off, Samples, 1); !errors.Is(err, errClosedForTest) {
		t.Fatal(err)
	}
}

func TestSetJudgesWaitersAgain(t *testing.T) {
	p := Params{SamplesPerInsert: 4, MinSize: 10, ErrorBuffer: 16}
	l := New(&p, 10) // diff 40, window [24, 56]
	if err := acquire(l, Samples, 16); err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 3)
	background(l, Samples, 4, time.Minute, 0, out)  // 24 - 4 < 24
	background(l, Samples, 16, time.Minute, 1, out) // 16 <= error_buffer: it may wait
	waitFor(t, l, func(s State) bool { return s.WaitingSamples == 2 })

	// A smaller window makes the 16-row sample impossible: it fails at
	// once; the 4-row one, at the new centre (4*10 = 40 >= 32 + 4), goes.
	small := Params{SamplesPerInsert: 4, MinSize: 10, ErrorBuffer: 4}
	l.Set(&small, 10)
	got := map[int]error{}
	for range 2 {
		r := <-out
		got[r.rank] = r.err
	}
	if got[0] != nil || !errors.Is(got[1], ErrNeverAdmitted) {
		t.Fatalf("after a smaller window: %v", got)
	}
	if st, _ := l.State(); st.Inserts != 10 || st.Samples != 4 || st.Diff != 36 {
		t.Fatalf("state %+v", st)
	}

	// Turning the limiter off admits everyone.
	background(l, Samples, 4, time.Minute, 2, out)
	waitFor(t, l, func(s State) bool { return s.WaitingSamples == 1 })
	l.Set(nil, 10)
	if r := <-out; r.err != nil {
		t.Fatal(r.err)
	}
	if _, on := l.State(); on {
		t.Fatal("limiter on after Set(nil)")
	}
}

func TestCountersRestartAtTheCentre(t *testing.T) {
	p := Params{SamplesPerInsert: 8, MinSize: 1000, ErrorBuffer: 4000}
	cases := []struct {
		size     int64
		inserts  int64
		diff     float64
		blocked  string
		extend1  bool
		sample1  bool
		sample8k bool
	}{
		{size: 0, inserts: 0, diff: 0, blocked: "samples", extend1: true},
		{size: 400, inserts: 400, diff: 3200, blocked: "samples", extend1: true},
		{size: 1000, inserts: 1000, diff: 8000, blocked: "none", extend1: true, sample1: true, sample8k: true},
		{size: 50000, inserts: 1000, diff: 8000, blocked: "none", extend1: true, sample1: true, sample8k: true},
	}
	for _, c := range cases {
		l := New(&p, c.size)
		st, _ := l.State()
		if st.Inserts != c.inserts || st.Samples != 0 || st.Diff != c.diff || st.Blocked != c.blocked {
			t.Errorf("size %d: state %+v", c.size, st)
		}
		if ok := acquire(l, Inserts, 1) == nil; ok != c.extend1 {
			t.Errorf("size %d: extend of 1 admitted %v", c.size, ok)
		}
		l = New(&p, c.size)
		if ok := acquire(l, Samples, 1) == nil; ok != c.sample1 {
			t.Errorf("size %d: sample of 1 admitted %v", c.size, ok)
		}
		l = New(&p, c.size)
		// A whole error buffer of samples at once: exactly down to min_diff.
		if ok := acquire(l, Samples, 4000) == nil; ok != c.sample8k {
			t.Errorf("size %d: sample of 4000 admitted %v", c.size, ok)
		}
	}
}

func TestRefund(t *testing.T) {
	p := Params{SamplesPerInsert: 1, MinSize: 1, ErrorBuffer: 4}
	l := New(&p, 1)
	g, err := l.Acquire(context.Background(), Samples, 4, now(), nil, errStop)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 1)
	// Window [-3, 5]; diff 1 - 4 = -3.
	background(l, Samples, 2, time.Minute, 0, out) // -3 - 2 < -3
	waitFor(t, l, func(s State) bool { return s.WaitingSamples == 1 })
	g.Refund(1) // the sample returned 3 rows of 4: diff -2, still -4 < -3 for the waiter
	if st, _ := l.State(); st.Samples != 3 || st.WaitingSamples != 1 {
		t.Fatalf("after a partial refund: %+v", st)
	}
	g.Refund(1) // -1: the waiter goes, -3
	if r := <-out; r.err != nil {
		t.Fatal(r.err)
	}
	if st, _ := l.State(); st.Samples != 4 || st.Diff != -3 {
		t.Fatalf("after the refund: %+v", st)
	}
	g.Refund(100) // capped at the 4 rows granted
	if st, _ := l.State(); st.Samples != 0 {
		t.Fatalf("after refunding more than granted: %+v", st)
	}
	// A grant from before a restart refunds nothing.
	g2, _ := l.Acquire(context.Background(), Inserts, 1, now(), nil, errStop)
	l.Set(&p, 1)
	g2.Refund(1)
	if st, _ := l.State(); st.Inserts != 1 || st.Samples != 0 {
		t.Fatalf("a stale grant changed the counters: %+v", st)
	}
}

// TestConcurrentAdmissionsStayInTheWindow runs 8 writers and 8 samplers
// with random sizes and deadlines: every admission must leave diff inside
// the window (inserts while filling may only stay below max_diff), and no
// call may answer long after its deadline.
func TestConcurrentAdmissionsStayInTheWindow(t *testing.T) {
	p := Params{SamplesPerInsert: 3, MinSize: 50, ErrorBuffer: 40}
	minDiff, maxDiff := p.Bounds()
	l := New(&p, 0)
	var violations atomic.Int64
	var first atomic.Value
	l.afterAdmit = func(side Side, n int64, st State) {
		// A refunded sample raises diff and a refunded insert lowers it, so
		// the bound each admission guarantees is its own side's.
		bad := (side == Inserts && st.Diff > maxDiff) || (side == Samples && (st.Diff < minDiff || st.Size < p.MinSize))
		if bad && violations.Add(1) == 1 {
			first.Store(st)
		}
	}
	var size atomic.Int64
	var admitted, refused, late [2]atomic.Int64
	dur := 2 * time.Second
	if testing.Short() {
		dur = 500 * time.Millisecond
	}
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for w := range 16 {
		side := Side(w % 2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Now().Before(end) {
				n := 1 + rng.Int64N(20) // samples: at most 40 rows
				if side == Inserts {
					n = 1 + rng.Int64N(13) // 3*13 <= 40
				}
				wait := time.Duration(rng.IntN(5000)) * time.Microsecond
				start := time.Now()
				ctx := context.Background()
				if rng.IntN(10) == 0 { // some callers give up early
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, wait/2)
					defer cancel()
				}
				g, err := l.Acquire(ctx, side, n, start.Add(wait), nil, errStop)
				if time.Since(start) > wait+time.Second {
					late[side].Add(1)
				}
				switch {
				case err == nil:
					admitted[side].Add(1)
					if rng.IntN(20) == 0 {
						g.Refund(n) // a request that failed after admission
					} else if side == Inserts {
						l.SetSize(min(size.Add(n), 500))
					}
				case errors.Is(err, ErrRateLimited), errors.Is(err, context.DeadlineExceeded):
					refused[side].Add(1)
				default:
					t.Errorf("%s of %d: %v", side, n, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if v := violations.Load(); v > 0 {
		t.Fatalf("%d admissions left the window; first: %+v", v, first.Load())
	}
	for side := range 2 {
		if late[side].Load() > 0 {
			t.Errorf("%d %s answered more than 1s past their deadline", late[side].Load(), Side(side))
		}
		if admitted[side].Load() == 0 || refused[side].Load() == 0 {
			t.Errorf("%s: %d admitted, %d refused: the run did not exercise both outcomes", Side(side), admitted[side].Load(), refused[side].Load())
		}
	}
	st, _ := l.State()
	if st.WaitingSamples != 0 || st.WaitingExtends != 0 {
		t.Fatalf("waiters left behind: %+v", st)
	}
	t.Logf("admitted %d/%d, refused %d/%d; final %+v", admitted[0].Load(), admitted[1].Load(), refused[0].Load(), refused[1].Load(), st)
}

// TestRefundStaysInTheWindow: a refund gives back only what keeps diff in
// the window, since other requests may have been admitted on the rows it
// gives back.
func TestRefundStaysInTheWindow(t *testing.T) {
	p := Params{SamplesPerInsert: 2, MinSize: 10, ErrorBuffer: 6} // window [14, 26]
	ctx := context.Background()
	get := func(l *Limiter, side Side, n int64) Grant {
		t.Helper()
		g, err := l.Acquire(ctx, side, n, now(), nil, errStop)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	check := func(l *Limiter, inserts, samples int64) {
		t.Helper()
		if st, _ := l.State(); st.Inserts != inserts || st.Samples != samples {
			t.Fatalf("inserts %d samples %d, want %d %d", st.Inserts, st.Samples, inserts, samples)
		}
	}
	// A sample admitted (20 -> 14), extends admitted on it (-> 26), then
	// the sample fails: a full refund would make diff 32.
	l := New(&p, 10)
	s := get(l, Samples, 6)
	get(l, Inserts, 3)
	get(l, Inserts, 3)
	s.Refund(6)
	check(l, 16, 6) // diff stays 26
	// Part of a refund fits: diff 24 takes back 2 of 6 sampled rows.
	l = New(&p, 10)
	s = get(l, Samples, 6)
	get(l, Inserts, 3)
	get(l, Inserts, 2)
	s.Refund(6)
	check(l, 15, 4) // 30 - 4 = 26
	// The mirror image: an extend refunded after samples used its rows.
	l = New(&p, 10)
	e := get(l, Inserts, 3) // 26
	get(l, Samples, 6)      // 20
	get(l, Samples, 6)      // 14
	e.Refund(3)
	check(l, 13, 12) // diff stays 14
	// While the buffer fills, diff is below the window: an extend's refund
	// is taken back whole.
	l = New(&p, 0)
	e = get(l, Inserts, 3)
	e.Refund(3)
	check(l, 0, 0)
}
