package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
)

// TestRateLimit drives a buffer's rate limiter through the Go client: the
// spec round-trips, refusals are ErrRateLimited with the limiter's state,
// too-large requests are 400s, RetryRateLimited waits for the other side,
// and SetRateLimit changes and removes the limit.
func TestRateLimit(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	spec := cartpole(1000)
	// min_diff = 1*10 - 20 = -10, max_diff = 1*10 + 20 = 30.
	spec.RateLimit = &client.RateLimit{SamplesPerInsert: 1, MinSize: 10, ErrorBuffer: 20}
	info, _, err := c.CreateBuffer(ctx, "cp", spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Spec.RateLimit; got == nil || *got != *spec.RateLimit {
		t.Fatalf("spec rate_limit came back as %+v", got)
	}
	if info.RateLimit == nil || !eq(info.RateLimit.MinDiff, -10) || !eq(info.RateLimit.MaxDiff, 30) {
		t.Fatalf("info rate_limit %+v", info.RateLimit)
	}

	// An empty buffer is below min_size: the sample is refused with the state.
	_, err = c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1})
	var ae *client.APIError
	if !errors.Is(err, client.ErrRateLimited) || !errors.As(err, &ae) || ae.RateLimit == nil || ae.RateLimit.Size != 0 {
		t.Fatalf("sample below min_size: %v (state %+v)", err, ae)
	}

	ext := func(from, n int64, opts *client.ExtendOptions) error {
		done := make([]bool, n)
		_, err := c.ExtendWithOptions(ctx, "cp", "a", steps(seqToks(from, n), done, nil), opts)
		return err
	}
	// 10 rows fill to min_size, 20 more reach max_diff exactly.
	if err := ext(0, 10, nil); err != nil {
		t.Fatal(err)
	}
	if err := ext(10, 20, nil); err != nil {
		t.Fatal(err)
	}
	// One more row would pass max_diff: refused after its timeout.
	start := time.Now()
	err = ext(30, 1, &client.ExtendOptions{TimeoutMS: 50})
	if !errors.Is(err, client.ErrRateLimited) || !errors.As(err, &ae) || ae.RateLimit == nil || ae.RateLimit.Diff != 30 {
		t.Fatalf("extend past max_diff: %v", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("extend with timeout_ms 50 answered after %v", waited)
	}
	// 41 rows move diff by more than error_buffer (20): 400 at once.
	if err := ext(30, 41, &client.ExtendOptions{TimeoutMS: 5000}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("extend wider than the window: %v", err)
	}

	// With RetryRateLimited the extend waits until a learner samples.
	patient := newClient(t, ts.URL, &client.Options{RetryRateLimited: 20 * time.Second})
	done := make(chan error, 1)
	go func() {
		_, err := patient.Extend(ctx, "cp", "b", steps(seqToks(30, 5), make([]bool, 5), nil))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("extend admitted before any sample: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 8}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("retried extend: %v", err)
	}

	// Removing the limit admits everything and drops the live state.
	st, err := c.SetRateLimit(ctx, "cp", nil)
	if err != nil || st != nil {
		t.Fatalf("remove rate limit: %+v %v", st, err)
	}
	if err := ext(100, 50, nil); err != nil {
		t.Fatalf("extend without a limit: %v", err)
	}
	info, err = c.Info(ctx, "cp")
	if err != nil || info.RateLimit != nil || info.Spec.RateLimit != nil {
		t.Fatalf("info after removal: %+v %+v %v", info.RateLimit, info.Spec.RateLimit, err)
	}
	// A new limit restarts its counters from the buffer's size.
	st, err = c.SetRateLimit(ctx, "cp", &client.RateLimit{SamplesPerInsert: 2, MinSize: 5, ErrorBuffer: 10})
	if err != nil || st == nil || !eq(st.MinDiff, 0) || !eq(st.MaxDiff, 20) || st.Diff != 10 {
		t.Fatalf("set rate limit: %+v %v", st, err)
	}
	if _, err := c.SetRateLimit(ctx, "cp", &client.RateLimit{SamplesPerInsert: 2, MinSize: 5}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("rate limit without error_buffer: %v", err)
	}
	if _, err := c.SetRateLimit(ctx, "nope", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("rate limit of a missing buffer: %v", err)
	}
}

// eq reports whether an optional number of the limiter's state is set to v.
func eq(p *float64, v float64) bool { return p != nil && *p == v }
