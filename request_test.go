package rbd

// Sample request parsing and validation: every request no data can ever
// satisfy is an ErrBadRequest whose *RequestError names the field at fault,
// at once, even on an empty buffer; a request the current data cannot
// satisfy yet is ErrNotReady after at most timeout_ms, and a write during
// the wait wakes it.

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rbdb/rbd/storage"
)

// rqField checks that err is a bad request naming field.
func rqField(t *testing.T, what string, err error, field string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want a bad request naming %q", what, field)
		return
	}
	if !errors.Is(err, ErrBadRequest) {
		t.Errorf("%s: %v is not ErrBadRequest", what, err)
		return
	}
	var re *RequestError
	if !errors.As(err, &re) {
		t.Errorf("%s: %v is not a *RequestError", what, err)
		return
	}
	if re.Field != field {
		t.Errorf("%s: error names field %q, want %q (%v)", what, re.Field, field, err)
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: message %q does not name %q", what, err.Error(), field)
	}
}

func TestRequestParseErrorFields(t *testing.T) {
	for _, tc := range []struct {
		name, body, field string
	}{
		{"unknown key", `{"batch_size": 4, "bogus": 1}`, "bogus"},
		{"misspelt key", `{"batchsize": 4}`, "batchsize"},
		{"unknown nested key", `{"batch_size": 4, "n_step": {"n": 2, "gamma": 0.9, "lambda": 1}}`, "n_step.lambda"},
		{"string for int", `{"batch_size": "4"}`, "batch_size"},
		{"float for int", `{"batch_size": 4.5}`, "batch_size"},
		{"string for bool", `{"strict_length": "yes"}`, "strict_length"},
		{"string for keys", `{"keys": "observation"}`, "keys"},
		{"number in keys", `{"keys": ["observation", 3]}`, "keys"},
		{"nested wrong type", `{"n_step": {"n": "3", "gamma": 0.9}}`, "n_step.n"},
		{"object for sampler", `{"sampler": {"kind": "uniform"}}`, "sampler"},
		{"array body", `[1, 2]`, "body"},
		{"not json", `batch_size=4`, "body"},
		{"seed 2^64", `{"seed": 18446744073709551616}`, "seed"},
		{"seed below -2^63", `{"seed": -9223372036854775809}`, "seed"},
		{"seed fraction", `{"seed": 1.5}`, "seed"},
		{"seed string", `{"seed": "7"}`, "seed"},
		{"seed bool", `{"seed": true}`, "seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSampleRequest([]byte(tc.body))
			rqField(t, tc.body, err, tc.field)
		})
	}
}

func TestRequestParseValuesAndSeeds(t *testing.T) {
	full := `{"batch_size": 256, "sampler": "slice", "seed": 7, "keys": ["observation", "next.reward"],
	 "next_state": true, "n_step": {"n": 3, "gamma": 0.99}, "num_slices": 8, "slice_len": 32,
	 "strict_length": false, "beta": 0.6, "consumer": "learner-0", "include_incomplete": true,
	 "drop_last": true, "fill": "nan", "timeout_ms": 25}`
	got, err := ParseSampleRequest([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	want := &SampleRequest{BatchSize: 256, Sampler: "slice", Seed: seed(7), Keys: []string{"observation", "next.reward"},
		NextState: ptr(true), NStep: &NStep{N: 3, Gamma: 0.99}, NumSlices: 8, SliceLen: 32, StrictLength: ptr(false),
		Beta: ptr(0.6), Consumer: "learner-0", IncludeIncomplete: true, DropLast: true, Fill: "nan", TimeoutMS: 25}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed %+v\nwant   %+v", got, want)
	}
	for _, tc := range []struct {
		body string
		seed *uint64
	}{
		{`{"batch_size": 1}`, nil},
		{`{"seed": null}`, nil},
		{`{"seed": 0}`, seed(0)},
		{`{"seed": 18446744073709551615}`, seed(math.MaxUint64)},
		{`{"seed": -1}`, seed(math.MaxUint64)}, // modulo 2^64
		{`{"seed": -9223372036854775808}`, seed(1 << 63)},
		{`{"seed": 9223372036854775808}`, seed(1 << 63)},
		{` { "seed" : 12 } `, seed(12)},
	} {
		got, err := ParseSampleRequest([]byte(tc.body))
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if (got.Seed == nil) != (tc.seed == nil) || (got.Seed != nil && *got.Seed != *tc.seed) {
			t.Errorf("%s: seed %v, want %v", tc.body, got.Seed, tc.seed)
		}
	}
}

// rqIntObsSpec is a compact spec whose observation is int64.
func rqIntObsSpec() storage.Spec {
	return storage.Spec{
		Capacity: 50, Storage: storage.KindMemory, CompactObs: true, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Int64, Shape: []int{2}},
			{Name: "next.reward", DType: storage.Float32},
			{Name: "next.done", DType: storage.Bool},
		},
	}
}

// rqBuffers returns buffers of each kind the table needs, filled with a few
// trajectories (or empty).
func rqBuffers(t *testing.T, fill bool) map[string]*Buffer {
	db := openDB(t)
	bufs := map[string]*Buffer{
		"plain":   rtCreate(t, db, "plain", testSpec(storage.KindMemory, 50, false, false)),
		"compact": rtCreate(t, db, "compact", testSpec(storage.KindMemory, 50, true, false)),
		"prio":    rtCreate(t, db, "prio", rtPrioSpec(storage.KindMemory, 50, true, 0.6, 1e-6)),
		"intobs":  rtCreate(t, db, "intobs", rqIntObsSpec()),
	}
	if !fill {
		return bufs
	}
	g := newRTGen()
	var in []rtIn
	for i := 0; i < 4; i++ {
		in = append(in, g.episode("s", 0, 8, "term")...)
	}
	for _, k := range []string{"plain", "compact", "prio"} {
		if _, err := bufs[k].Extend("s", rtBatch(bufs[k].Spec().CompactObs, in, true)); err != nil {
			t.Fatal(err)
		}
	}
	n := len(in)
	obs := make([]byte, 0, 16*n)
	var rew, done, tail []byte
	for i, r := range in {
		obs = append(obs, make([]byte, 16)...)
		obs[16*i] = byte(i)
		rew = rtF32(rew, r.rew)
		done = append(done, u8(r.done()))
		if r.done() {
			tail = append(tail, make([]byte, 16)...)
		}
	}
	if _, err := bufs["intobs"].Extend("s", &storage.Batch{Rows: n, Fields: map[string][]byte{
		"observation": obs, "next.reward": rew, "next.done": done, "next.observation": tail}}); err != nil {
		t.Fatal(err)
	}
	return bufs
}

// The validation table: field "" means the request is valid.
var rqTable = []struct {
	name  string
	buf   string
	req   SampleRequest
	field string
}{
	{"valid uniform", "plain", SampleRequest{BatchSize: 4}, ""},
	{"unknown sampler", "plain", SampleRequest{Sampler: "random", BatchSize: 4}, "sampler"},
	{"prioritized without priority", "plain", SampleRequest{Sampler: "prioritized", BatchSize: 4}, "sampler"},
	{"prioritized_slice without priority", "compact", SampleRequest{Sampler: "prioritized_slice", NumSlices: 2, SliceLen: 2}, "sampler"},
	{"prioritized with priority", "prio", SampleRequest{Sampler: "prioritized", BatchSize: 4}, ""},
	{"slice: only num_slices", "plain", SampleRequest{Sampler: "slice", NumSlices: 4}, "num_slices"},
	{"slice: only batch_size", "plain", SampleRequest{Sampler: "slice", BatchSize: 8}, "num_slices"},
	{"slice: only slice_len", "plain", SampleRequest{Sampler: "slice", SliceLen: 4}, "num_slices"},
	{"slice: batch and slice_len", "plain", SampleRequest{Sampler: "slice", BatchSize: 8, SliceLen: 4}, ""},
	{"slice: batch and num_slices", "plain", SampleRequest{Sampler: "slice", BatchSize: 8, NumSlices: 4}, ""},
	{"slice: three consistent", "plain", SampleRequest{Sampler: "slice", BatchSize: 8, NumSlices: 2, SliceLen: 4}, ""},
	{"slice: three inconsistent", "plain", SampleRequest{Sampler: "slice", BatchSize: 10, NumSlices: 2, SliceLen: 4}, "batch_size"},
	{"slice: batch not divisible by slice_len", "plain", SampleRequest{Sampler: "slice", BatchSize: 10, SliceLen: 4}, "batch_size"},
	{"slice: batch not divisible by num_slices", "plain", SampleRequest{Sampler: "slice", BatchSize: 10, NumSlices: 4}, "batch_size"},
	{"slice_len > capacity", "plain", SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: 51}, "slice_len"},
	{"slice_len = capacity", "plain", SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: 50, StrictLength: ptr(false)}, ""},
	{"slice_without_replacement shape", "plain", SampleRequest{Sampler: "slice_without_replacement", BatchSize: 9, SliceLen: 2}, "batch_size"},
	{"negative batch_size", "plain", SampleRequest{BatchSize: -1}, "batch_size"},
	{"zero batch_size", "plain", SampleRequest{}, "batch_size"},
	{"negative num_slices", "plain", SampleRequest{Sampler: "slice", NumSlices: -2, SliceLen: 4}, "num_slices"},
	{"negative slice_len", "plain", SampleRequest{Sampler: "slice", NumSlices: 2, SliceLen: -4}, "slice_len"},
	{"negative beta", "prio", SampleRequest{Sampler: "prioritized", BatchSize: 4, Beta: ptr(-0.1)}, "beta"},
	{"infinite beta", "prio", SampleRequest{Sampler: "prioritized", BatchSize: 4, Beta: ptr(math.Inf(1))}, "beta"},
	{"negative timeout", "plain", SampleRequest{BatchSize: 4, TimeoutMS: -1}, "timeout_ms"},
	{"batch too large", "plain", SampleRequest{BatchSize: 1 << 23}, "batch_size"},
	{"num_slices on a transition sampler", "plain", SampleRequest{BatchSize: 4, NumSlices: 2}, "num_slices"},
	{"strict_length on a transition sampler", "plain", SampleRequest{BatchSize: 4, StrictLength: ptr(true)}, "strict_length"},
	{"bad fill", "compact", SampleRequest{BatchSize: 4, Fill: "nope"}, "fill"},
	{"fill nan on a float obs", "compact", SampleRequest{BatchSize: 4, Fill: "nan"}, ""},
	{"fill zero", "compact", SampleRequest{BatchSize: 4, Fill: "zero"}, ""},
	{"fill nan on an int obs", "intobs", SampleRequest{BatchSize: 4, Fill: "nan"}, "fill"},
	{"fill zero on an int obs", "intobs", SampleRequest{BatchSize: 4, Fill: "zero"}, ""},
	{"n_step n = 0", "plain", SampleRequest{BatchSize: 4, NStep: &NStep{N: 0, Gamma: 0.9}}, "n_step.n"},
	{"n_step n < 0", "plain", SampleRequest{BatchSize: 4, NStep: &NStep{N: -3, Gamma: 0.9}}, "n_step.n"},
	{"n_step gamma < 0", "plain", SampleRequest{BatchSize: 4, NStep: &NStep{N: 2, Gamma: -0.1}}, "n_step.gamma"},
	{"n_step gamma > 1", "plain", SampleRequest{BatchSize: 4, NStep: &NStep{N: 2, Gamma: 1.01}}, "n_step.gamma"},
	{"n_step gamma NaN", "plain", SampleRequest{BatchSize: 4, NStep: &NStep{N: 2, Gamma: math.NaN()}}, "n_step.gamma"},
	{"n_step gamma 1", "plain", SampleRequest{BatchSize: 4, NStep: &NStep{N: 1, Gamma: 1}}, ""},
	{"n_step compact without next_state", "compact", SampleRequest{BatchSize: 4, NextState: ptr(false), NStep: &NStep{N: 2, Gamma: 0.9}}, "n_step"},
	{"n_step compact with next_state", "compact", SampleRequest{BatchSize: 4, NStep: &NStep{N: 2, Gamma: 0.9}}, ""},
	{"unknown key", "plain", SampleRequest{BatchSize: 4, Keys: []string{"observation", "nope"}}, "keys[1]"},
	{"duplicate key", "plain", SampleRequest{BatchSize: 4, Keys: []string{"observation", "next.reward", "observation"}}, "keys[2]"},
	{"reserved name as key", "plain", SampleRequest{BatchSize: 4, Keys: []string{"seq"}}, "keys[0]"},
	{"next.observation without next_state", "compact", SampleRequest{BatchSize: 4, NextState: ptr(false), Keys: []string{"next.observation"}}, "keys[0]"},
	{"next.observation with next_state", "compact", SampleRequest{BatchSize: 4, Keys: []string{"next.observation"}}, ""},
	{"next.observation stored", "plain", SampleRequest{BatchSize: 4, Keys: []string{"next.observation"}}, ""},
	{"include_incomplete on slices", "compact", SampleRequest{Sampler: "slice", NumSlices: 2, SliceLen: 2, IncludeIncomplete: true}, "include_incomplete"},
	{"include_incomplete on a plain buffer", "plain", SampleRequest{BatchSize: 4, IncludeIncomplete: true}, "include_incomplete"},
	{"include_incomplete compact", "compact", SampleRequest{BatchSize: 4, IncludeIncomplete: true}, ""},
	{"consumer on uniform", "plain", SampleRequest{BatchSize: 4, Consumer: "a"}, "consumer"},
	{"consumer on slice", "plain", SampleRequest{Sampler: "slice", NumSlices: 2, SliceLen: 2, Consumer: "a"}, "consumer"},
	{"consumer on prioritized", "prio", SampleRequest{Sampler: "prioritized", BatchSize: 2, Consumer: "a"}, "consumer"},
	{"consumer on without_replacement", "plain", SampleRequest{Sampler: "without_replacement", BatchSize: 2, Consumer: "a"}, ""},
	{"consumer on slice_without_replacement", "plain", SampleRequest{Sampler: "slice_without_replacement", NumSlices: 2, SliceLen: 2, Consumer: "a"}, ""},
	{"drop_last on uniform", "plain", SampleRequest{BatchSize: 4, DropLast: true}, "drop_last"},
}

// Every row of the table through Buffer.Sample, on filled buffers (valid
// requests answer) and on empty ones (bad requests are still 400, not 503).
func TestSampleValidation(t *testing.T) {
	full, empty := rqBuffers(t, true), rqBuffers(t, false)
	for _, tc := range rqTable {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Seed = seed(1)
			_, err := rtTrySample(full[tc.buf], &req)
			if tc.field == "" {
				if err != nil {
					t.Errorf("valid request %+v: %v", tc.req, err)
				}
			} else {
				rqField(t, "filled buffer", err, tc.field)
			}
			if tc.field == "" {
				return
			}
			req = tc.req
			if req.TimeoutMS == 0 {
				req.TimeoutMS = 2000
			}
			start := time.Now()
			_, err = rtTrySample(empty[tc.buf], &req)
			{
				rqField(t, "empty buffer", err, tc.field)
				if d := time.Since(start); d > 500*time.Millisecond {
					t.Errorf("bad request on an empty buffer with timeout_ms %d answered after %v, want at once", req.TimeoutMS, d)
				}
			}
			// Valid requests on an empty buffer are not ready: see
			// TestSampleNotReady.
		})
	}
}

// The answer-size limit of the caller is a bad request naming batch_size.
func TestSampleMaxResponse(t *testing.T) {
	buf := rqBuffers(t, true)["plain"]
	_, err := buf.Sample(context.Background(), &SampleRequest{BatchSize: 100}, &SampleOptions{MaxResponseBytes: 1000})
	rqField(t, "max response", err, "batch_size")
	if _, err := buf.Sample(context.Background(), &SampleRequest{BatchSize: 2}, &SampleOptions{MaxResponseBytes: 1000}); err != nil {
		t.Errorf("small batch under the limit: %v", err)
	}
}

// The JSON path end to end: a parsed request is validated against the
// buffer with the same field names.
func TestParsedRequestValidation(t *testing.T) {
	bufs := rqBuffers(t, true)
	for _, tc := range []struct {
		buf, body, field string
	}{
		{"plain", `{"sampler": "slice", "batch_size": 10, "slice_len": 4}`, "batch_size"},
		{"plain", `{"sampler": "prioritized", "batch_size": 4}`, "sampler"},
		{"compact", `{"batch_size": 4, "next_state": false, "keys": ["observation", "next.observation"]}`, "keys[1]"},
		{"intobs", `{"batch_size": 4, "fill": "nan"}`, "fill"},
		{"compact", `{"sampler": "slice", "num_slices": 2, "slice_len": 3, "include_incomplete": true}`, "include_incomplete"},
		{"plain", `{"batch_size": 4, "n_step": {"n": 0, "gamma": 0.5}}`, "n_step.n"},
		{"plain", `{"batch_size": 4, "seed": 18446744073709551615}`, ""},
		{"plain", `{"batch_size": 4, "seed": -1}`, ""},
	} {
		req, err := ParseSampleRequest([]byte(tc.body))
		if err == nil {
			_, err = rtTrySample(bufs[tc.buf], req)
		}
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		rqField(t, tc.body, err, tc.field)
	}
}

// Seeds are taken modulo 2^64: -1 and 2^64-1 draw the same batch; 0 is a
// seed like any other; no seed draws at random.
func TestSampleSeeds(t *testing.T) {
	buf := rqBuffers(t, true)["plain"]
	draw := func(body string) []int64 {
		t.Helper()
		req, err := ParseSampleRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return i64s(t, rtSample(t, buf, *req), "seq")
	}
	a, b := draw(`{"batch_size": 32, "seed": -1}`), draw(`{"batch_size": 32, "seed": 18446744073709551615}`)
	if !slices.Equal(a, b) {
		t.Errorf("seed -1 and 2^64-1 differ:\n%v\n%v", a, b)
	}
	z1, z2 := draw(`{"batch_size": 32, "seed": 0}`), draw(`{"batch_size": 32, "seed": 0}`)
	if !slices.Equal(z1, z2) {
		t.Errorf("seed 0 is not reproducible")
	}
	if slices.Equal(z1, a) {
		t.Errorf("seed 0 and seed -1 draw the same batch")
	}
	r1, r2 := draw(`{"batch_size": 32}`), draw(`{"batch_size": 32}`)
	if slices.Equal(r1, r2) {
		t.Errorf("two unseeded draws of 32 rows out of 32 are identical: %v", r1)
	}
}

// An empty buffer answers ErrNotReady (not a bad request) at once with
// timeout_ms 0 and after about the timeout with timeout_ms 50; a write
// during a wait wakes the sampler, which answers long before its timeout;
// a cancelled context ends the wait.
func TestSampleNotReady(t *testing.T) {
	newEmpty := func(t *testing.T) *Buffer {
		return rtCreate(t, openDB(t), "e", testSpec(storage.KindMemory, 100, false, false))
	}
	t.Run("timeout 0", func(t *testing.T) {
		buf := newEmpty(t)
		start := time.Now()
		_, err := rtTrySample(buf, &SampleRequest{BatchSize: 4})
		if !errors.Is(err, ErrNotReady) || errors.Is(err, ErrBadRequest) {
			t.Fatalf("empty buffer, timeout 0: %v, want ErrNotReady", err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("timeout 0 answered after %v", d)
		}
	})
	t.Run("timeout 50ms", func(t *testing.T) {
		buf := newEmpty(t)
		start := time.Now()
		_, err := rtTrySample(buf, &SampleRequest{BatchSize: 4, TimeoutMS: 50})
		d := time.Since(start)
		if !errors.Is(err, ErrNotReady) || errors.Is(err, ErrBadRequest) {
			t.Fatalf("empty buffer, timeout 50ms: %v, want ErrNotReady", err)
		}
		if d < 45*time.Millisecond || d > 2*time.Second {
			t.Errorf("timeout_ms 50 answered after %v", d)
		}
	})
	t.Run("write wakes the wait", func(t *testing.T) {
		buf := newEmpty(t)
		g := newRTGen()
		werr := make(chan error, 1)
		go func() {
			time.Sleep(60 * time.Millisecond)
			_, err := buf.Extend("s", rtBatch(false, g.episode("s", 0, 5, "term"), false))
			werr <- err
		}()
		start := time.Now()
		got, err := rtTrySample(buf, &SampleRequest{BatchSize: 4, TimeoutMS: 10000, Seed: seed(1)})
		d := time.Since(start)
		if e := <-werr; e != nil {
			t.Fatal(e)
		}
		if err != nil {
			t.Fatalf("sample waiting for a write: %v", err)
		}
		if d < 40*time.Millisecond || d > 5*time.Second {
			t.Errorf("sample answered after %v (write at ~60ms, timeout 10s)", d)
		}
		if s := i64s(t, got, "seq"); len(s) != 4 || slices.ContainsFunc(s, func(v int64) bool { return v < 0 || v > 4 }) {
			t.Fatalf("seqs %v", s)
		}
	})
	t.Run("strict slice longer than every trajectory", func(t *testing.T) {
		buf := newEmpty(t)
		g := newRTGen()
		if _, err := buf.Extend("s", rtBatch(false, g.episode("s", 0, 5, "term"), false)); err != nil {
			t.Fatal(err)
		}
		_, err := rtTrySample(buf, &SampleRequest{Sampler: "slice", NumSlices: 2, SliceLen: 6})
		if !errors.Is(err, ErrNotReady) || errors.Is(err, ErrBadRequest) {
			t.Fatalf("strict slice of 6 over a 5-row trajectory: %v, want ErrNotReady", err)
		}
	})
	t.Run("context cancelled", func(t *testing.T) {
		buf := newEmpty(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = errors.New("Sample panicked")
				}
			}()
			_, err = buf.Sample(ctx, &SampleRequest{BatchSize: 4, TimeoutMS: 10000}, nil)
		}()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("cancelled wait: %v, want the context's error", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("cancelled wait answered after %v", d)
		}
	})
}
