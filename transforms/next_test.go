package transforms

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// TestNStepAppendSharesOneArray checks that windows appended to one shared
// array (NStepAppend, as a sample builds them) are those NStep builds one
// by one, for every live row of a compact buffer and a plain one whose
// ring has wrapped (trajectories of random lengths on interleaved envs,
// some cut by the ring), for n from 1 to 6, and that no later append
// changes a window cut earlier.
func TestNStepAppendSharesOneArray(t *testing.T) {
	for _, compact := range []bool{false, true} {
		for n := 1; n <= 6; n++ {
			b := nstepBuffer(t, compact)
			if err := b.ReadIndex(func(ix storage.Index) {
				lo, hi := ix.Window()
				var rows []storage.RowMeta
				for seq := lo; seq < hi; seq++ {
					if m, ok := ix.Row(seq); ok {
						rows = append(rows, m)
					}
				}
				buf := make([]storage.RowMeta, 0, n*len(rows)) // room for all: the array never moves
				var got []Window
				for _, m := range rows {
					var w Window
					var ok bool
					before := len(buf)
					w, buf, ok = NStepAppend(ix, m, n, compact, buf)
					want, wantOK := NStep(ix, m, n, compact)
					if ok != wantOK || !reflect.DeepEqual(w, want) {
						t.Fatalf("compact=%v n=%d row %d: NStepAppend = %+v, %v; NStep = %+v, %v", compact, n, m.Seq, w, ok, want, wantOK)
					}
					if !ok && len(buf) != before {
						t.Fatalf("compact=%v n=%d row %d: not ok but %d rows appended", compact, n, m.Seq, len(buf)-before)
					}
					got = append(got, w)
				}
				for i, m := range rows {
					if want, _ := NStep(ix, m, n, compact); !reflect.DeepEqual(got[i], want) {
						t.Fatalf("compact=%v n=%d row %d: window changed by later appends: %+v, want %+v", compact, n, m.Seq, got[i], want)
					}
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// nstepBuffer is a memory buffer of 300 slots after 500 rows: 5 envs
// interleaved at random, episodes of 1 to 40 rows, done rows with their
// final observation.
func nstepBuffer(t *testing.T, compact bool) *storage.Buffer {
	t.Helper()
	s, err := storage.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	spec := storage.Spec{Capacity: 300, Storage: storage.KindMemory, Fields: []storage.Field{
		{Name: "observation", DType: storage.Float32},
		{Name: "next.done", DType: storage.Bool},
		{Name: "next.terminated", DType: storage.Bool},
		{Name: "next.truncated", DType: storage.Bool},
	}}
	if compact {
		spec.CompactObs, spec.ObsKeys = true, []string{"observation"}
	} else {
		spec.Fields = append(spec.Fields, storage.Field{Name: "next.observation", DType: storage.Float32})
	}
	b, _, err := s.CreateBuffer("n", spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	left := make([]int, 5) // rows left in each env's episode
	const rows, batch = 500, 50
	for w := 0; w < rows; w += batch {
		obs, done, env := make([]byte, 4*batch), make([]byte, batch), make([]int64, batch)
		var final []byte
		for i := range batch {
			e := rng.IntN(len(left))
			if left[e] == 0 {
				left[e] = 1 + rng.IntN(40)
			}
			left[e]--
			binary.LittleEndian.PutUint32(obs[4*i:], math.Float32bits(float32(w+i)))
			env[i] = int64(e)
			if left[e] == 0 {
				done[i] = 1
				final = binary.LittleEndian.AppendUint32(final, math.Float32bits(-1))
			}
		}
		f := map[string][]byte{"observation": obs, "next.done": done, "next.terminated": done, "next.truncated": make([]byte, batch)}
		if compact {
			if len(final) > 0 {
				f["next.observation"] = final
			}
		} else {
			f["next.observation"] = obs
		}
		if _, err := b.Extend("s", &storage.Batch{Rows: batch, Fields: f, Env: env}); err != nil {
			t.Fatal(err)
		}
	}
	return b
}
