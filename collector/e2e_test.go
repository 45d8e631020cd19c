package collector_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/storage"
)

// reference is the full (non-compact) data of a run, by seq.
type reference struct {
	obs, next         [][4]float32
	rew               []float32
	term, trunc, done []bool
	env               []int64
	after             []int64 // the next row of the same trajectory, -1 after a done row or at the end
}

func buildReference(batches []storage.Batch) *reference {
	ref := &reference{}
	for _, b := range batches {
		for r := 0; r < b.Rows; r++ {
			var o, n [4]float32
			for k := 0; k < 4; k++ {
				o[k] = f32At(b.Fields["observation"], 4*r+k)
				n[k] = f32At(b.Fields["next.observation"], 4*r+k)
			}
			ref.obs = append(ref.obs, o)
			ref.next = append(ref.next, n)
			ref.rew = append(ref.rew, f32At(b.Fields["next.reward"], r))
			ref.term = append(ref.term, b.Fields["next.terminated"][r] == 1)
			ref.trunc = append(ref.trunc, b.Fields["next.truncated"][r] == 1)
			ref.done = append(ref.done, b.Fields["next.done"][r] == 1)
			ref.env = append(ref.env, b.Env[r])
		}
	}
	ref.after = make([]int64, len(ref.env))
	last := map[int64]int64{}
	for s := range ref.env {
		ref.after[s] = -1
		if p, ok := last[ref.env[s]]; ok && !ref.done[p] {
			ref.after[p] = int64(s)
		}
		last[ref.env[s]] = int64(s)
	}
	return ref
}

// A fixed value function for the estimators.
var vW = [4]float64{0.3, -0.2, 1.7, 0.45}

const vB = 0.25

func value(o [4]float32) float64 {
	v := vB
	for k, x := range o {
		v += vW[k] * float64(x)
	}
	return v
}

// slice is one sampled slice's inputs to the estimators.
type slice struct {
	obs, next          [][4]float32
	rew                []float32
	term, done, end, m []bool
}

// tdAndGAE computes TD(0) targets y_t = r_t + γ(1-terminated_t)V(s'_t) and
// GAE advantages A_t = δ_t + γλ(1-done_t)A_{t+1}, δ_t = y_t - V(s_t),
// bootstrapping at slice_end (A stops there) and zero on padding.
func tdAndGAE(s slice, gamma, lambda float64) (y, adv []float64) {
	L := len(s.m)
	y, adv = make([]float64, L), make([]float64, L)
	for j := L - 1; j >= 0; j-- {
		if !s.m[j] {
			continue
		}
		notTerm := 1.0
		if s.term[j] {
			notTerm = 0
		}
		y[j] = float64(s.rew[j]) + gamma*notTerm*value(s.next[j])
		delta := y[j] - value(s.obs[j])
		adv[j] = delta
		if !s.done[j] && !s.end[j] && j+1 < L && s.m[j+1] {
			adv[j] += gamma * lambda * adv[j+1]
		}
	}
	return y, adv
}

func tensor(t *testing.T, b *rbd.Batch, name string) []byte {
	t.Helper()
	ten, ok := b.Tensor(name)
	if !ok {
		t.Fatalf("sample has no %s", name)
	}
	return ten.Data
}

// End to end: collector -> compact store -> slice sampler (padded slices,
// some ending at a done, some at slice_end) -> TD(0) and GAE in Go. The
// result equals, bit for bit, the same computation on the same slices cut
// from the full reference data, and is finite everywhere, with the ring
// unwrapped and wrapped.
func TestEndToEndTDAndGAE(t *testing.T) {
	const (
		numEnvs   = 4
		frames    = 3072
		numSlices = 32
		sliceLen  = 12
		gamma     = 0.97
		lambda    = 0.9
	)
	run := func(w collector.Writer, compact bool) {
		t.Helper()
		p := collector.NewLinearQ(4, 2, 0.75)
		if err := p.SetWeights(map[string][]float32{"w": {0, 0, 0, 0, -1, 1, -0.5, 0.5}, "b": {0, 0}}, map[string][]int{"w": {4, 2}, "b": {2}}); err != nil {
			t.Fatal(err)
		}
		env := newEnv(t, "cartpole", numEnvs, nil)
		if _, err := collector.Run(context.Background(), collector.Config{
			Env: env, Policy: p, Writer: w, Seed: 3, FramesPerBatch: 128, TotalFrames: frames,
			MaxFramesPerTraj: 50, CompactObs: compact,
		}); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{}
	run(rec, false)
	ref := buildReference(rec.batches)
	if len(ref.env) != frames {
		t.Fatalf("reference has %d rows", len(ref.env))
	}
	for _, capacity := range []int64{1 << 16, 1000} {
		db := openDB(t)
		buf := newBuffer(t, db, "c", newEnv(t, "cartpole", 1, nil).Spec(), collector.SpecOptions{Capacity: capacity, CompactObs: true})
		run(collector.BufferWriter{Buffer: buf.Buffer}, true)
		var atDone, atEnd, padded, checked int
		for seed := uint64(1); seed <= 12; seed++ {
			sd := seed
			b, err := buf.Sample(context.Background(), &rbd.SampleRequest{Sampler: "slice", NumSlices: numSlices, SliceLen: sliceLen,
				StrictLength: new(bool), Seed: &sd}, nil)
			if err != nil {
				t.Fatal(err)
			}
			seqs, obs, next := tensor(t, b, "seq"), tensor(t, b, "observation"), tensor(t, b, "next.observation")
			rew, term, done := tensor(t, b, "next.reward"), tensor(t, b, "next.terminated"), tensor(t, b, "next.done")
			end, mask, valid := tensor(t, b, "slice_end"), tensor(t, b, "mask"), tensor(t, b, "next.observation_valid")
			for i := 0; i < numSlices; i++ {
				var got, want slice
				for j := 0; j < sliceLen; j++ {
					p := i*sliceLen + j
					seq := int64(binary.LittleEndian.Uint64(seqs[8*p:]))
					real := mask[p] == 1
					if real != (seq >= 0) || real && valid[p] != 1 {
						t.Fatalf("slice %d pos %d: seq %d mask %d valid %d", i, j, seq, mask[p], valid[p])
					}
					var o, n [4]float32
					for k := 0; k < 4; k++ {
						o[k], n[k] = f32At(obs, 4*p+k), f32At(next, 4*p+k)
					}
					got.obs, got.next = append(got.obs, o), append(got.next, n)
					got.rew = append(got.rew, f32At(rew, p))
					got.term, got.done = append(got.term, term[p] == 1), append(got.done, done[p] == 1)
					got.end, got.m = append(got.end, end[p] == 1), append(got.m, real)
					if !real {
						want.obs, want.next = append(want.obs, [4]float32{}), append(want.next, [4]float32{})
						want.rew = append(want.rew, 0)
						want.term, want.done = append(want.term, false), append(want.done, false)
						want.end, want.m = append(want.end, false), append(want.m, false)
						continue
					}
					// The slice is a run of one trajectory in the reference:
					// consecutive rows of one env, a done only at its end.
					lastReal := j+1 == sliceLen || mask[p+1] == 0
					if !lastReal {
						if nxt := int64(binary.LittleEndian.Uint64(seqs[8*(p+1):])); ref.after[seq] != nxt {
							t.Fatalf("slice %d: seq %d is followed by %d, the reference by %d", i, seq, nxt, ref.after[seq])
						}
					}
					if ref.done[seq] && !lastReal {
						t.Fatalf("slice %d crosses the done at seq %d", i, seq)
					}
					want.obs, want.next = append(want.obs, ref.obs[seq]), append(want.next, ref.next[seq])
					want.rew = append(want.rew, ref.rew[seq])
					want.term, want.done = append(want.term, ref.term[seq]), append(want.done, ref.done[seq])
					want.end, want.m = append(want.end, lastReal), append(want.m, true)
					if lastReal {
						switch {
						case ref.done[seq]:
							atDone++
						default:
							atEnd++
						}
						if j+1 < sliceLen {
							padded++
						}
					}
				}
				yg, ag := tdAndGAE(got, gamma, lambda)
				yw, aw := tdAndGAE(want, gamma, lambda)
				for j := range yg {
					if math.Float64bits(yg[j]) != math.Float64bits(yw[j]) || math.Float64bits(ag[j]) != math.Float64bits(aw[j]) {
						t.Fatalf("capacity %d seed %d slice %d pos %d: TD %v GAE %v from the store, %v %v from the reference",
							capacity, seed, i, j, yg[j], ag[j], yw[j], aw[j])
					}
					if math.IsNaN(yg[j]) || math.IsInf(yg[j], 0) || math.IsNaN(ag[j]) || math.IsInf(ag[j], 0) {
						t.Fatalf("slice %d pos %d: not finite: %v %v", i, j, yg[j], ag[j])
					}
					checked++
				}
			}
		}
		if atDone == 0 || atEnd == 0 || padded == 0 {
			t.Fatalf("capacity %d: slices ending at a done %d, at slice_end %d, padded %d: want all kinds", capacity, atDone, atEnd, padded)
		}
		t.Logf("capacity %d: %d positions; slices ending at a done %d (padded %d), at slice_end %d", capacity, checked, atDone, padded, atEnd)
	}
}
