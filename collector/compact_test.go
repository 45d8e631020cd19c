package collector_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
)

// sampleAll draws every row of b once (one without-replacement epoch) and
// returns each tensor by seq.
func sampleAll(t *testing.T, b *rbd.Buffer) (map[string]map[int64][]byte, int) {
	t.Helper()
	n := int(b.WriteCount())
	seed := uint64(1)
	batch, err := b.Sample(context.Background(), &rbd.SampleRequest{BatchSize: n, Sampler: "without_replacement", Seed: &seed, Consumer: "all"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	seqT, _ := batch.Tensor("seq")
	rows := len(seqT.Data) / 8
	out := map[string]map[int64][]byte{}
	for _, ten := range batch.Tensors {
		per := len(ten.Data) / rows
		m := map[int64][]byte{}
		for i := 0; i < rows; i++ {
			m[int64(binary.LittleEndian.Uint64(seqT.Data[8*i:]))] = ten.Data[i*per : (i+1)*per]
		}
		out[ten.Name] = m
	}
	return out, rows
}

// The compact identity: a compact run and a non-compact run with the same
// seeds give, after rbd's next-state reconstruction, byte-identical
// next.observation for every row, the final rows of terminated and
// truncated trajectories (by the env, by max_frames_per_traj and by the
// collector at the end of the run) included.
func TestCompactIdentity(t *testing.T) {
	cases := []struct {
		env    string
		n      int
		frames int64
		opts   *envs.Options
		maxT   int
		policy func() collector.Policy
	}{
		{"cartpole", 4, 1600, nil, 40, func() collector.Policy {
			p := collector.NewLinearQ(4, 2, 0.75)
			if err := p.SetWeights(map[string][]float32{"w": {0, 0, 0, 0, -1, 1, -0.5, 0.5}, "b": {0, 0}},
				map[string][]int{"w": {4, 2}, "b": {2}}); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{"pendulum", 3, 960, nil, 0, nil},
		{"catch", 3, 240, &envs.Options{FrameStack: 4}, 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.env, func(t *testing.T) {
			db := openDB(t)
			bufs := map[bool]*rbd.Buffer{}
			for _, compact := range []bool{false, true} {
				env := newEnv(t, tc.env, tc.n, tc.opts)
				buf := newBuffer(t, db, map[bool]string{false: "full", true: "compact"}[compact], env.Spec(), collector.SpecOptions{CompactObs: compact})
				var p collector.Policy
				if tc.policy != nil {
					p = tc.policy()
				}
				_, err := collector.Run(context.Background(), collector.Config{
					Env: env, Policy: p, Writer: collector.BufferWriter{Buffer: buf.Buffer}, Seed: 11,
					FramesPerBatch: 48, TotalFrames: tc.frames, MaxFramesPerTraj: tc.maxT, CompactObs: compact,
				})
				if err != nil {
					t.Fatal(err)
				}
				bufs[compact] = buf
			}
			full, nFull := sampleAll(t, bufs[false])
			comp, nComp := sampleAll(t, bufs[true])
			if nFull != nComp || int64(nComp) != bufs[true].WriteCount() {
				t.Fatalf("sampled %d and %d rows of %d: every compact row must have a known next observation", nFull, nComp, bufs[true].WriteCount())
			}
			r := readRows(t, bufs[false])
			var terminated, truncated, cut int
			for i, m := range r.meta {
				s := m.Seq
				for _, k := range []string{"observation", "action", "next.reward", "next.done", "next.terminated", "next.truncated"} {
					if !bytes.Equal(full[k][s], comp[k][s]) {
						t.Fatalf("seq %d: %s differs between the runs", s, k)
					}
				}
				if !bytes.Equal(full["next.observation"][s], comp["next.observation"][s]) {
					t.Fatalf("seq %d (step %d, done %v terminated %v truncated %v): reconstructed next.observation differs from the stored one",
						s, m.Step, m.Done, m.Terminated, m.Truncated)
				}
				switch {
				case m.Terminated:
					terminated++
				case m.Truncated && i >= len(r.meta)-tc.n:
					cut++
				case m.Truncated:
					truncated++
				}
			}
			if tc.env != "pendulum" && terminated == 0 || tc.env != "catch" && truncated == 0 || cut == 0 && tc.env != "catch" {
				t.Fatalf("the data lacks a kind of trajectory end: %d terminated, %d truncated, %d cut at the end", terminated, truncated, cut)
			}
			t.Logf("%d rows: %d terminated, %d truncated, %d cut", nComp, terminated, truncated, cut)
		})
	}
}
