package rbd

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// step is one row written by the tests: observation = [obs, obs+0.5],
// next.reward = rew; final is the next observation (sent on done rows).
type step struct {
	env        int64
	obs, rew   float32
	term, trnc bool
	final      float32
}

func testSpec(kind storage.Kind, capacity int64, compact, prio bool) storage.Spec {
	s := storage.Spec{
		Capacity: capacity, Storage: kind, CompactObs: compact, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Float32, Shape: []int{2}},
			{Name: "next.reward", DType: storage.Float32},
			{Name: "next.done", DType: storage.Bool},
			{Name: "next.terminated", DType: storage.Bool},
			{Name: "next.truncated", DType: storage.Bool},
		},
	}
	if !compact {
		s.Fields = append(s.Fields, storage.Field{Name: "next.observation", DType: storage.Float32, Shape: []int{2}})
	}
	if prio {
		s.Priority = &storage.PriorityOptions{Alpha: 1, Eps: 0}
	}
	return s
}

// stepsBatch encodes steps; nexts gives each row's true next observation
// (used for the non-compact reference and for final observations).
func stepsBatch(compact bool, steps []step, nexts []float32) *storage.Batch {
	n := len(steps)
	f32 := func(vals ...float32) []byte {
		var b []byte
		for _, v := range vals {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		return b
	}
	var obs, nobs, rew, done, term, trunc, tail []byte
	env := make([]int64, n)
	for i, s := range steps {
		obs = append(obs, f32(s.obs, s.obs+0.5)...)
		nobs = append(nobs, f32(nexts[i], nexts[i]+0.5)...)
		rew = append(rew, f32(s.rew)...)
		d := s.term || s.trnc
		done, term, trunc = append(done, u8(d)), append(term, u8(s.term)), append(trunc, u8(s.trnc))
		if d {
			tail = append(tail, f32(nexts[i], nexts[i]+0.5)...)
		}
		env[i] = s.env
	}
	fields := map[string][]byte{"observation": obs, "next.reward": rew, "next.done": done, "next.terminated": term, "next.truncated": trunc}
	if compact {
		fields["next.observation"] = tail
	} else {
		fields["next.observation"] = nobs
	}
	return &storage.Batch{Rows: n, Fields: fields, Env: env}
}

func u8(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// tensorValues decodes the named tensor of b, size bytes an element.
func tensorValues[T any](t *testing.T, b *Batch, name string, size int, decode func([]byte) T) []T {
	t.Helper()
	ts, ok := b.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %q", name)
	}
	out := make([]T, len(ts.Data)/size)
	for i := range out {
		out[i] = decode(ts.Data[size*i:])
	}
	return out
}

func f32s(t *testing.T, b *Batch, name string) []float32 {
	t.Helper()
	return tensorValues(t, b, name, 4, func(p []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p)) })
}

func f64s(t *testing.T, b *Batch, name string) []float64 {
	t.Helper()
	return tensorValues(t, b, name, 8, func(p []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(p)) })
}

func i64s(t *testing.T, b *Batch, name string) []int64 {
	t.Helper()
	return tensorValues(t, b, name, 8, func(p []byte) int64 { return int64(binary.LittleEndian.Uint64(p)) })
}

func bools(t *testing.T, b *Batch, name string) []bool {
	t.Helper()
	return tensorValues(t, b, name, 1, func(p []byte) bool { return p[0] != 0 })
}

func openDB(t *testing.T) *DB {
	t.Helper()
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func seed(v uint64) *uint64 { return &v }

// A trajectory of 6 rows, done at the end: every next observation is the
// following row's observation, the last one the final observation.
func TestNextStateSixRows(t *testing.T) {
	for _, kind := range []storage.Kind{storage.KindMemory, storage.KindMemmap} {
		db := openDB(t)
		buf, _, err := db.CreateBuffer("b", testSpec(kind, 100, true, false))
		if err != nil {
			t.Fatal(err)
		}
		steps := []step{{obs: 0}, {obs: 1}, {obs: 2}, {obs: 3}, {obs: 4}, {obs: 5, term: true}}
		nexts := []float32{1, 2, 3, 4, 5, 6}
		if _, err := buf.Extend("s", stepsBatch(true, steps, nexts)); err != nil {
			t.Fatal(err)
		}
		got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: 6, Seed: seed(1)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		no := f32s(t, got, "next.observation")
		for i := 0; i < 6; i++ {
			if no[2*i] != nexts[i] || no[2*i+1] != nexts[i]+0.5 {
				t.Fatalf("%s: next.observation[%d] = %v, want %v", kind, i, no[2*i:2*i+2], nexts[i])
			}
		}
		if v := bools(t, got, "next.observation_valid"); slices.Contains(v, false) {
			t.Fatalf("valid %v", v)
		}
		if se := bools(t, got, "slice_end"); !slices.Equal(se, []bool{false, false, false, false, false, true}) {
			t.Fatalf("slice_end %v", se)
		}
		if ts, _ := got.Tensor("observation"); !slices.Equal(ts.Shape, []int{1, 6, 2}) {
			t.Fatalf("shape %v", ts.Shape)
		}
	}
}

// Two trajectories back to back in one env: the last row of the first
// takes its final observation, not the first row of the second.
func TestNextStateBackToBack(t *testing.T) {
	db := openDB(t)
	buf, _, _ := db.CreateBuffer("b", testSpec(storage.KindMemory, 100, true, false))
	steps := []step{{obs: 0}, {obs: 1, trnc: true}, {obs: 10}, {obs: 11, term: true}}
	nexts := []float32{1, 2, 11, 12}
	if _, err := buf.Extend("s", stepsBatch(true, steps, nexts)); err != nil {
		t.Fatal(err)
	}
	got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "without_replacement", BatchSize: 4, Seed: seed(3)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	seqs, no := i64s(t, got, "seq"), f32s(t, got, "next.observation")
	for i, s := range seqs {
		if no[2*i] != nexts[s] {
			t.Fatalf("seq %d: next %v, want %v", s, no[2*i], nexts[s])
		}
	}
	if got.Metadata["epoch_end"] != "true" {
		t.Fatalf("metadata %v", got.Metadata)
	}
}

// Adjacent slices of one trajectory never leak into each other: each
// slice's last next observation is the row after the slice in the
// trajectory, flagged valid.
func TestAdjacentSlicesOfOneTrajectory(t *testing.T) {
	db := openDB(t)
	buf, _, _ := db.CreateBuffer("b", testSpec(storage.KindMemory, 100, true, false))
	var steps []step
	var nexts []float32
	for i := 0; i < 10; i++ {
		steps = append(steps, step{obs: float32(i), term: i == 9})
		nexts = append(nexts, float32(i+1))
	}
	buf.Extend("s", stepsBatch(true, steps, nexts))
	got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "slice", NumSlices: 16, SliceLen: 3, Seed: seed(5)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	obs, no := f32s(t, got, "observation"), f32s(t, got, "next.observation")
	for i := range 16 * 3 {
		if no[2*i] != obs[2*i]+1 {
			t.Fatalf("position %d: obs %v next %v", i, obs[2*i], no[2*i])
		}
	}
}

// A trajectory whose first rows were overwritten keeps its live suffix
// with the original steps, and samples never return overwritten rows.
func TestOverwrittenTrajectoryStart(t *testing.T) {
	db := openDB(t)
	buf, _, _ := db.CreateBuffer("b", testSpec(storage.KindMemory, 4, true, false))
	var steps []step
	var nexts []float32
	for i := 0; i < 6; i++ {
		steps = append(steps, step{obs: float32(i), term: i == 5})
		nexts = append(nexts, float32(i+1))
	}
	buf.Extend("s", stepsBatch(true, steps, nexts))
	got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "slice", NumSlices: 4, SliceLen: 4, Seed: seed(1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := i64s(t, got, "step"); !slices.Equal(st[:4], []int64{2, 3, 4, 5}) {
		t.Fatalf("steps %v", st)
	}
	if _, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: 5}, nil); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("slice longer than capacity: %v", err)
	}
}

// n-step with a termination inside the window: rewards stop at the done
// row, gamma^k and steps_to_next_obs follow k, terminated is the window's.
func TestNStepDoneInsideWindow(t *testing.T) {
	for _, compact := range []bool{true, false} {
		db := openDB(t)
		buf, _, _ := db.CreateBuffer("b", testSpec(storage.KindMemory, 100, compact, false))
		steps := []step{{obs: 0, rew: 1}, {obs: 1, rew: 2}, {obs: 2, rew: 4, term: true}, {obs: 10, rew: 8}, {obs: 11, rew: 16}}
		nexts := []float32{1, 2, 3, 11, 12}
		buf.Extend("s", stepsBatch(compact, steps, nexts))
		got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "without_replacement", BatchSize: 5, Seed: seed(2),
			NStep: &NStep{N: 3, Gamma: 0.5}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seqs := i64s(t, got, "seq")
		rew, orig, gam := f32s(t, got, "next.reward"), f32s(t, got, "next.original_reward"), f32s(t, got, "gamma")
		k, term, no := i64s(t, got, "steps_to_next_obs"), bools(t, got, "next.terminated"), f32s(t, got, "next.observation")
		want := map[int64]struct {
			ret, gamma float32
			k          int64
			term       bool
			next       float32
		}{
			0: {1 + 0.5*2 + 0.25*4, 0.125, 3, true, 3},
			1: {2 + 0.5*4, 0.25, 2, true, 3},
			2: {4, 0.5, 1, true, 3},
			3: {8, 0.5, 1, false, 11}, // row 4's next is unknown in compact mode
		}
		if !compact {
			want[3] = struct {
				ret, gamma float32
				k          int64
				term       bool
				next       float32
			}{8 + 0.5*16, 0.25, 2, false, 12}
			want[4] = struct {
				ret, gamma float32
				k          int64
				term       bool
				next       float32
			}{16, 0.5, 1, false, 12}
		}
		if len(seqs) != len(want) {
			t.Fatalf("compact=%v: sampled %v, want %d rows", compact, seqs, len(want))
		}
		for i, s := range seqs {
			w := want[s]
			if rew[i] != w.ret || gam[i] != w.gamma || k[i] != w.k || term[i] != w.term || no[2*i] != w.next || orig[i] != steps[s].rew {
				t.Errorf("compact=%v seq %d: ret %v gamma %v k %d term %v next %v orig %v, want %+v", compact, s, rew[i], gam[i], k[i], term[i], no[2*i], orig[i], w)
			}
		}
	}
}

// Priorities [1, 4] with alpha 1, beta 1: P = [0.2, 0.8], weights [1, 0.25].
func TestPriorityWeights(t *testing.T) {
	db := openDB(t)
	buf, _, _ := db.CreateBuffer("b", testSpec(storage.KindMemory, 10, false, true))
	buf.Extend("s", stepsBatch(false, []step{{obs: 0}, {obs: 1}}, []float32{1, 2}))
	if u, st, err := buf.UpdatePriorities([]int64{0, 1, 99}, []float64{1, 4, 3}); err != nil || u != 2 || st != 1 {
		t.Fatalf("update: %d %d %v", u, st, err)
	}
	got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "prioritized", BatchSize: 20000, Seed: seed(9), Beta: ptr(1.0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	seqs, w := i64s(t, got, "seq"), f32s(t, got, "weight")
	count1 := 0
	for i, s := range seqs {
		want := map[int64]float32{0: 1, 1: 0.25}[s]
		if w[i] != want {
			t.Fatalf("seq %d weight %v, want %v", s, w[i], want)
		}
		if s == 1 {
			count1++
		}
	}
	if f := float64(count1) / 20000; math.Abs(f-0.8) > 0.015 {
		t.Fatalf("P(seq 1) = %.3f, want 0.8", f)
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, _, err := buf.UpdatePriorities([]int64{0}, []float64{bad}); !errors.Is(err, storage.ErrInvalidBatch) {
			t.Errorf("priority %v: %v", bad, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }
