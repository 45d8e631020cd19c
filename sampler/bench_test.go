package sampler

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// newCompactBuffer makes a compact_obs memory buffer of CartPole-shaped
// rows: observation float32[4] and next.done.
func newCompactBuffer(tb testing.TB, capacity int64, prio bool) *storage.Buffer {
	tb.Helper()
	s, err := storage.Open(tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	spec := storage.Spec{Capacity: capacity, Storage: storage.KindMemory, CompactObs: true, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Float32, Shape: []int{4}},
			{Name: "next.done", DType: storage.Bool},
		}}
	if prio {
		spec.Priority = &storage.PriorityOptions{Alpha: 0.6, Eps: 1e-6}
	}
	buf, _, err := s.CreateBuffer("b", spec)
	if err != nil {
		tb.Fatal(err)
	}
	return buf
}

// extendCompact writes one batch: row i on env[i], done[i] with a final
// observation when done.
func extendCompact(tb testing.TB, buf *storage.Buffer, stream string, env []int64, done []byte) {
	tb.Helper()
	obs := make([]byte, 16*len(env))
	for i := range 4 * len(env) {
		binary.LittleEndian.PutUint32(obs[4*i:], math.Float32bits(float32(i)))
	}
	var final []byte
	for _, d := range done {
		if d == 1 {
			final = append(final, make([]byte, 16)...)
		}
	}
	f := map[string][]byte{"observation": obs, "next.done": done}
	if len(final) > 0 {
		f["next.observation"] = final
	}
	if _, err := buf.Extend(stream, &storage.Batch{Rows: len(env), Fields: f, Env: env}); err != nil {
		tb.Fatal(err)
	}
}

// fillCartPole writes rows steps of 8 envs interleaved, episodes of 200
// steps with staggered starts: every row but the newest of each open
// episode has a known next observation.
func fillCartPole(tb testing.TB, buf *storage.Buffer, rows int64) {
	const envs, episode, batch = 8, 200, 4096
	for tick := int64(0); tick*envs < rows; tick += batch / envs {
		env, done := make([]int64, 0, batch), make([]byte, 0, batch)
		for t := tick; t < tick+batch/envs; t++ {
			for e := range int64(envs) {
				d := byte(0)
				if (t+e*episode/envs)%episode == episode-1 {
					d = 1
				}
				env, done = append(env, e), append(done, d)
			}
		}
		extendCompact(tb, buf, "s", env, done)
	}
}

// fillSparse writes rows one-row trajectories, anonymous extends of 1000
// rows on 1000 envs: only every every-th row ends with done and a final
// observation, the others are cut, so their next observations are unknown
// (a writer that sends one row per request without a stream).
func fillSparse(tb testing.TB, buf *storage.Buffer, rows int64, every int) {
	for n := int64(0); n < rows; n += 1000 {
		env, done := make([]int64, 1000), make([]byte, 1000)
		for i := range env {
			env[i] = int64(i)
			if (n+int64(i))%int64(every) == 0 {
				done[i] = 1
			}
		}
		extendCompact(tb, buf, "", env, done)
	}
}

// BenchmarkDrawNextKnown draws uniform batches of 256 rows whose next
// observation is known from a full compact buffer, two ways in one run:
// "index" asks the index's next-known bits (Params.NextKnown, what sample
// requests use), "record" reads each candidate's row record and applies
// the same rule (transforms.NextOf), as samplers did before the bits. Only
// the draw is timed: no bytes are gathered. fill=cartpole has nearly every
// row eligible; fill=sparse one row in 1000 (docs/sampling.md, known
// problem 5), so every draw ends in the exact fallback.
//
//	go test ./sampler -run '^$' -bench BenchmarkDrawNextKnown -benchtime 2s -count 3
func BenchmarkDrawNextKnown(b *testing.B) {
	viaRecord := func(ix storage.Index, m storage.RowMeta) bool {
		if m.Done {
			return m.HasTail
		}
		return m.NextSeq >= 0
	}
	fills := []struct {
		name string
		fill func(testing.TB, *storage.Buffer, int64)
	}{
		{"cartpole", fillCartPole},
		{"sparse", func(tb testing.TB, buf *storage.Buffer, rows int64) { fillSparse(tb, buf, rows, 1000) }},
	}
	for _, f := range fills {
		for _, rows := range []int64{1e5, 1e6} {
			buf := newCompactBuffer(b, rows, false)
			f.fill(b, buf, rows)
			for _, way := range []string{"index", "record"} {
				b.Run(fmt.Sprintf("fill=%s/rows=%d/via=%s", f.name, rows, way), func(b *testing.B) {
					p := Params{Kind: Uniform, BatchSize: 256, NextKnown: true}
					if way == "record" {
						p = Params{Kind: Uniform, BatchSize: 256, Eligible: viaRecord}
					}
					st, rng := NewState(), rand.New(rand.NewPCG(1, 2))
					for b.Loop() {
						var err error
						if e := buf.ReadIndex(func(ix storage.Index) { _, err = st.Draw(ix, p, rng) }); e != nil {
							b.Fatal(e)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(b.N)*256/b.Elapsed().Seconds(), "rows/s")
				})
			}
		}
	}
}
