package sampler

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// benchCompactBuffer fills a compact_obs memory buffer of rows CartPole-
// shaped rows: 8 envs interleaved, episodes of 200 steps with staggered
// starts, each done row with its final observation.
func benchCompactBuffer(b *testing.B, rows int64) *storage.Buffer {
	b.Helper()
	s, err := storage.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	spec := storage.Spec{Capacity: rows, Storage: storage.KindMemory, CompactObs: true, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Float32, Shape: []int{4}},
			{Name: "next.done", DType: storage.Bool},
		}}
	buf, _, err := s.CreateBuffer("b", spec)
	if err != nil {
		b.Fatal(err)
	}
	const envs, episode, batch = 8, 200, 4096
	obs := make([]byte, 16*batch)
	for tick := int64(0); tick*envs < rows; tick += batch / envs {
		var done, final []byte
		env := make([]int64, 0, batch)
		for t := tick; t < tick+batch/envs; t++ {
			for e := range int64(envs) {
				d := byte(0)
				if (t+e*episode/envs)%episode == episode-1 {
					d = 1
					final = append(final, make([]byte, 16)...)
				}
				done = append(done, d)
				env = append(env, e)
			}
		}
		for i := range batch * 4 {
			binary.LittleEndian.PutUint32(obs[4*i:], math.Float32bits(float32(i)))
		}
		f := map[string][]byte{"observation": obs, "next.done": done}
		if len(final) > 0 {
			f["next.observation"] = final
		}
		if _, err := buf.Extend("s", &storage.Batch{Rows: batch, Fields: f, Env: env}); err != nil {
			b.Fatal(err)
		}
	}
	return buf
}

// BenchmarkDrawNextKnown draws uniform batches of 256 rows whose next
// observation is known from a full compact buffer, two ways in one run:
// "index" asks the index's next-known bit (Params.NextKnown, what sample
// requests use), "record" reads each candidate's row record and applies
// the same rule (transforms.NextOf), as samplers did before the bit. Only
// the draw is timed: no bytes are gathered.
//
//	go test ./sampler -run '^$' -bench BenchmarkDrawNextKnown -benchtime 2s -count 3
func BenchmarkDrawNextKnown(b *testing.B) {
	viaRecord := func(ix storage.Index, m storage.RowMeta) bool {
		if m.Done {
			return m.HasTail
		}
		return m.NextSeq >= 0
	}
	for _, rows := range []int64{1e5, 1e6} {
		buf := benchCompactBuffer(b, rows)
		for _, way := range []string{"index", "record"} {
			b.Run(fmt.Sprintf("rows=%d/via=%s", rows, way), func(b *testing.B) {
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
