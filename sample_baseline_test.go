package rbd

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkSampleBaseline is the floor under BenchmarkSample, measured in
// the same run: its draws (256 uniform rows, or 8 slices of 32 steps from
// 8 interleaved envs, so a slice's rows are 8 seqs apart) copied out of a
// plain ring with one array per field, the layout of a numpy ring buffer
// (float32[4] observation and next observation, int64 action, float32
// reward, three bool flags: 47 bytes a row), by fixed-width copies and
// nothing else: no eligibility test, no metadata, no next-row lookup, no
// batch assembly; layout=rows copies the same rows, 47 bytes each, from one
// row-major array instead (one copy per row: the best case of any layout). At 10^3 and 10^5 rows the ring is in cache; at 10^7 it
// is 470 MB, so the rows come from DRAM. How much the baseline's time
// grows from 10^5 to 10^7 rows is what the memory system alone adds to a
// sample of that shape, which BenchmarkSample's growth is compared with
// (issue 11 asks slices to stay flat; docs/performance.md).
//
//	go test . -run '^$' -bench 'BenchmarkSample(Baseline)?$/sampler=(uniform|slice)/' -benchtime 2s
func BenchmarkSampleBaseline(b *testing.B) {
	for _, rows := range []int64{1e3, 1e5, 1e7} {
		// Filled on first use, shared by the draws of one size.
		var ring *plainRing
		var rowMajor []byte
		for _, c := range []struct{ kind, layout string }{
			{"uniform", "columns"}, {"uniform", "rows"}, {"slice", "columns"}, {"slice", "rows"},
		} {
			kind := c.kind
			b.Run(fmt.Sprintf("sampler=%s/rows=%s/layout=%s", kind, sbenchRowsLabel(rows), c.layout), func(b *testing.B) {
				if testing.Short() && rows > 1e5 {
					b.Skip("-short: 10^7 rows are 470 MB a layout")
				}
				var gather func(idx []int64)
				if c.layout == "columns" {
					if ring == nil {
						ring = newPlainRing(rows)
					}
					out := newPlainRing(sbenchBatch)
					gather = func(idx []int64) { ring.gather(idx, out) }
				} else {
					if rowMajor == nil {
						rowMajor = make([]byte, rows*plainRowBytes)
						for i := range rowMajor {
							rowMajor[i] = byte(i)
						}
					}
					out := make([]byte, sbenchBatch*plainRowBytes)
					gather = func(idx []int64) {
						for j, i := range idx {
							copy(out[j*plainRowBytes:(j+1)*plainRowBytes], rowMajor[i*plainRowBytes:])
						}
					}
				}
				idx := make([]int64, sbenchBatch)
				rng := rand.New(rand.NewPCG(1, 2))
				span := int64(sbenchEnvs * (sbenchSliceLen - 1)) // a slice's first to last row
				for b.Loop() {
					if kind == "uniform" {
						for i := range idx {
							idx[i] = rng.Int64N(rows)
						}
					} else {
						for s := range sbenchSlices {
							start := rng.Int64N(rows - span)
							for j := range sbenchSliceLen {
								idx[s*sbenchSliceLen+j] = start + int64(sbenchEnvs*j)
							}
						}
					}
					gather(idx)
				}
				sec := b.Elapsed().Seconds()
				b.ReportMetric(float64(b.N*sbenchBatch)/sec, "rows/s")
				b.ReportMetric(float64(b.N)/sec, "batches/s")
			})
		}
	}
}

// plainRowBytes is a CartPole row with its next observation, row-major.
const plainRowBytes = 47

// plainRing is a numpy-style replay ring: one array per field.
type plainRing struct {
	obs, nextObs    [][4]float32
	action          []int64
	reward          []float32
	done, term, trc []byte
}

func newPlainRing(rows int64) *plainRing {
	r := &plainRing{
		obs: make([][4]float32, rows), nextObs: make([][4]float32, rows),
		action: make([]int64, rows), reward: make([]float32, rows),
		done: make([]byte, rows), term: make([]byte, rows), trc: make([]byte, rows),
	}
	// Written, so that no page is the kernel's shared zero page.
	for i := range rows {
		f := float32(i)
		r.obs[i], r.nextObs[i] = [4]float32{f, f, f, f}, [4]float32{f + 1, f + 1, f + 1, f + 1}
		r.action[i], r.reward[i] = i&1, 1
		r.done[i], r.term[i], r.trc[i] = byte(i&1), byte(i&1), 0
	}
	return r
}

// gather copies the rows at idx into out's first len(idx) rows.
func (r *plainRing) gather(idx []int64, out *plainRing) {
	for j, i := range idx {
		out.obs[j] = r.obs[i]
	}
	for j, i := range idx {
		out.nextObs[j] = r.nextObs[i]
	}
	for j, i := range idx {
		out.action[j] = r.action[i]
	}
	for j, i := range idx {
		out.reward[j] = r.reward[i]
	}
	for j, i := range idx {
		out.done[j], out.term[j], out.trc[j] = r.done[i], r.term[i], r.trc[i]
	}
}
