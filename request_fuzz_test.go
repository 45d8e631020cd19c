package rbd

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"reflect"
	"strings"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// reqFuzzSeeds are sample request bodies, valid and not.
var reqFuzzSeeds = []string{
	// The example of the HTTP contract.
	`{"batch_size": 256, "sampler": "uniform", "seed": 7, "keys": ["observation", "action"],
	  "next_state": true, "n_step": {"n": 3, "gamma": 0.99},
	  "num_slices": 8, "slice_len": 32, "strict_length": true,
	  "beta": 0.4, "consumer": "learner-0", "include_incomplete": false}`,
	`{}`, `{"batch_size": 1}`, `{"batch_size": 4, "seed": 0}`,
	`{"seed": -1}`, `{"seed": 18446744073709551615}`, `{"seed": -9223372036854775808}`,
	`{"seed": 18446744073709551616}`, `{"seed": 1.5}`, `{"seed": "7"}`, `{"seed": null}`, `{"seed": 1e3}`,
	`{"sampler": "slice", "num_slices": 2, "slice_len": 3, "strict_length": false}`,
	`{"sampler": "without_replacement", "batch_size": 3, "consumer": "c", "drop_last": true}`,
	`{"keys": []}`, `{"keys": null}`, `{"keys": ["a", "a"]}`, `{"keys": "a"}`,
	`{"n_step": {}}`, `{"n_step": null}`, `{"n_step": {"n": 1, "gamma": 1, "x": 0}}`,
	`{"beta": 0}`, `{"beta": -0.0}`, `{"beta": 1e308}`, `{"fill": "nan", "timeout_ms": 100}`,
	`{"include_incomplete": true, "next_state": false}`, `{"strict_length": null}`,
	`{"colour": 1}`, `{"batch_size": "4"}`, `{"batch_size": 4.5}`, `{"batch_size": 1e2}`,
	`{"batch_size": 9223372036854775808}`, `{"timeout_ms": -1}`,
	`[]`, `null`, `"x"`, `{`, ``, `{"batch_size": 1} {}`, `{"a":1,"a":2}`,
	`{"Batch_Size": 3}`, `{"SEED": 7, "batch_size": 1}`, `{"consumer": "\u00fc\ud800"}`,
}

// go test . -run '^$' -fuzz FuzzParseSampleRequest -fuzztime 60s
func FuzzParseSampleRequest(f *testing.F) {
	for _, s := range reqFuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseSampleRequest(body)
		if err != nil {
			// Every rejection is a 400 naming a field.
			re, ok := errors.AsType[*RequestError](err)
			// (A key "" is named by its empty name.)
			if !ok || !errors.Is(err, ErrBadRequest) || (re.Field == "" && !strings.HasPrefix(re.Msg, "unknown key")) || req != nil {
				t.Fatalf("ParseSampleRequest(%q) = %v, %v: want a *RequestError naming a field", body, req, err)
			}
			return
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("marshal %+v: %v", req, err)
		}
		req2, err := ParseSampleRequest(again)
		if err != nil {
			t.Fatalf("%q parsed, its re-marshalled form %s does not: %v", body, again, err)
		}
		if !reflect.DeepEqual(req, req2) {
			t.Fatalf("%q -> %s -> a different request:\n%s", body, again, reqFuzzDescribe(req, req2))
		}
	})
}

// reqFuzzJSON shows a parsed request, telling nil keys from empty ones.
func reqFuzzJSON(r *SampleRequest) string {
	if r == nil {
		return "<nil>"
	}
	b, _ := json.Marshal(r)
	return fmt.Sprintf("%s (keys %#v)", b, r.Keys)
}

func reqFuzzDescribe(a, b *SampleRequest) string {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	var sb strings.Builder
	sb.WriteString("first:  " + string(ja) + "\nsecond: " + string(jb))
	if (a.Keys == nil) != (b.Keys == nil) {
		sb.WriteString("\nkeys: nil vs empty")
	}
	return sb.String()
}

func TestParseSampleRequestValues(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	b := func(v bool) *bool { return &v }
	f := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		body string
		want SampleRequest
	}{
		{`{}`, SampleRequest{}},
		{`{"seed": 0, "batch_size": 2}`, SampleRequest{Seed: u(0), BatchSize: 2}},
		{`{"seed": -1}`, SampleRequest{Seed: u(1<<64 - 1)}},
		{`{"seed": 18446744073709551615}`, SampleRequest{Seed: u(1<<64 - 1)}},
		{`{"seed": -9223372036854775808}`, SampleRequest{Seed: u(1 << 63)}},
		{`{"seed": null, "keys": null, "n_step": null}`, SampleRequest{}},
		{`{"keys": ["observation", "next.observation"], "next_state": false, "strict_length": false, "beta": 0}`,
			SampleRequest{Keys: []string{"observation", "next.observation"}, NextState: b(false), StrictLength: b(false), Beta: f(0)}},
		{`{"n_step": {"n": 3, "gamma": 0.99}, "fill": "nan", "timeout_ms": 250, "consumer": "l0", "drop_last": true, "include_incomplete": true}`,
			SampleRequest{NStep: &NStep{N: 3, Gamma: 0.99}, Fill: "nan", TimeoutMS: 250, Consumer: "l0", DropLast: true, IncludeIncomplete: true}},
		{`{"sampler": "slice", "num_slices": 8, "slice_len": 32}`, SampleRequest{Sampler: "slice", NumSlices: 8, SliceLen: 32}},
	} {
		got, err := ParseSampleRequest([]byte(c.body))
		if err != nil || !reflect.DeepEqual(*got, c.want) {
			t.Errorf("ParseSampleRequest(%s) = %s, %v; want %s", c.body, reqFuzzJSON(got), err, reqFuzzJSON(&c.want))
		}
	}
}

func TestParseSampleRequestErrors(t *testing.T) {
	for _, c := range []struct {
		body, field string
	}{
		{`[]`, "body"},
		{`"x"`, "body"},
		{`{`, "body"},
		{``, "body"},
		{`{"batch_size": 1} {}`, "body"},
		// A body that is not an object is not a request, even "null".
		{`null`, "body"},
		{`{"colour": 1}`, "colour"},
		{`{"batch_size": "4"}`, "batch_size"},
		{`{"batch_size": 4.5}`, "batch_size"},
		{`{"beta": "0.4"}`, "beta"},
		{`{"keys": "a"}`, "keys"},
		{`{"n_step": {"n": 1, "gamma": 1, "x": 0}}`, "n_step.x"},
		{`{"seed": 1.5}`, "seed"},
		{`{"seed": "7"}`, "seed"},
		{`{"seed": 18446744073709551616}`, "seed"},
		{`{"seed": -9223372036854775809}`, "seed"},
		{`{"seed": 1e3}`, "seed"},
		{`{"seed": true}`, "seed"},
		// Keys are exact: encoding/json's case-insensitive matching would
		// take "Seed" for seed (and then drop it) and "Batch_Size" for
		// batch_size.
		{`{"batch_size": 1, "Seed": 7}`, "Seed"},
		{`{"Batch_Size": 3}`, "Batch_Size"},
		{`{"BEta": 1}`, "BEta"},
	} {
		req, err := ParseSampleRequest([]byte(c.body))
		re, ok := errors.AsType[*RequestError](err)
		if !ok || re.Field != c.field || !errors.Is(err, ErrBadRequest) {
			t.Errorf("ParseSampleRequest(%s) = %s, %v; want a RequestError for field %q", c.body, reqFuzzJSON(req), err, c.field)
		}
	}
}

// TestSampleRequestMarshalRoundTrip: a request marshalled with
// encoding/json (as a Go client would send it) means the same thing when
// parsed. "keys": [] (no stored fields, only seq/traj_id/step) and an
// absent "keys" (every field) differ, so omitempty must not turn one into
// the other.
func TestSampleRequestMarshalRoundTrip(t *testing.T) {
	seven := uint64(7)
	no := false
	for _, req := range []SampleRequest{
		{BatchSize: 4, Keys: []string{}},
		{BatchSize: 4, Seed: &seven, StrictLength: &no, Sampler: "slice", NumSlices: 2},
		{NStep: &NStep{}},
	} {
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseSampleRequest(b)
		if err != nil || !reflect.DeepEqual(*got, req) {
			t.Errorf("%s marshals to %s, which parses to %s (%v)", reqFuzzJSON(&req), b, reqFuzzJSON(got), err)
		}
	}
}

// go test . -run '^$' -fuzz FuzzPlanSampleNumbers -fuzztime 60s
//
// Any numbers a client may send (batch_size, num_slices, slice_len, for
// every sampler) are either refused with a 400 naming a field or planned
// with a row count that is exactly their product, within the answer
// limits: nothing wraps around (2147483648 x 8589934592 once planned 0
// rows), nothing is allocated from them here.
func FuzzPlanSampleNumbers(f *testing.F) {
	for _, c := range [][3]int{
		{256, 0, 0}, {0, 4, 8}, {32, 4, 8}, {0, 4611686018427387905, 4}, {0, 2147483648, 8589934592},
		{-1, 2, 2}, {0, 1 << 22, 2}, {1 << 22, 0, 1}, {1<<63 - 1, 1<<63 - 1, 1<<63 - 1}, {7, 0, 3}, {8, 3, 0},
	} {
		for k := range 3 {
			f.Add(c[0], c[1], c[2], uint8(k), int64(1<<30))
		}
	}
	db, err := Open(f.TempDir(), nil)
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	buf, _, err := db.CreateBuffer("b", testSpec(storage.KindMemory, 1000, true, true))
	if err != nil {
		f.Fatal(err)
	}
	kinds := []string{"uniform", "slice", "prioritized_slice", "without_replacement", "slice_without_replacement", "prioritized"}
	f.Fuzz(func(t *testing.T, batch, slices, sliceLen int, kind uint8, maxBytes int64) {
		req := &SampleRequest{BatchSize: batch, NumSlices: slices, SliceLen: sliceLen, Sampler: kinds[int(kind)%len(kinds)]}
		p, err := buf.planSample(req, maxBytes)
		if err != nil {
			if re, ok := errors.AsType[*RequestError](err); !ok || re.Field == "" {
				t.Fatalf("plan %+v: %v; want a *RequestError naming a field", req, err)
			}
			return
		}
		want := int64(p.params.BatchSize)
		if p.slices {
			// The exact product, in 128 bits: an overflow shows as hi != 0.
			hi, lo := bits.Mul64(uint64(p.params.NumSlices), uint64(p.params.SliceLen))
			if hi != 0 || lo > maxSampleRows {
				t.Fatalf("plan %+v: %d x %d rows planned", req, p.params.NumSlices, p.params.SliceLen)
			}
			want = int64(lo)
			if p.params.NumSlices < 1 || p.params.SliceLen < 1 || (batch > 0 && int64(batch) != want) {
				t.Fatalf("plan %+v: slices %d x %d for batch_size %d", req, p.params.NumSlices, p.params.SliceLen, batch)
			}
		}
		if int64(p.rows) != want || p.rows < 1 || p.rows > maxSampleRows {
			t.Fatalf("plan %+v: %d rows, want %d in [1, %d]", req, p.rows, want, maxSampleRows)
		}
	})
}
