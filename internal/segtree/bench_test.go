package segtree

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

var benchSizes = []int{1e3, 1e5, 1e7}

func BenchmarkSumTreeSet(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			tr := NewSumTree(n)
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			ops := 0
			for b.Loop() {
				tr.Set(rng.IntN(n), rng.Float64())
				ops++
			}
			b.ReportMetric(float64(ops)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

func BenchmarkSumTreeFind(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			tr := NewSumTree(n)
			rng := rand.New(rand.NewPCG(2, uint64(n)))
			for i := range n {
				tr.Set(i, rng.Float64())
			}
			total := tr.Total()
			ops := 0
			for b.Loop() {
				tr.Find(rng.Float64() * total)
				ops++
			}
			b.ReportMetric(float64(ops)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

func BenchmarkMinTreeSet(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			tr := NewMinTree(n)
			rng := rand.New(rand.NewPCG(3, uint64(n)))
			ops := 0
			for b.Loop() {
				tr.Set(rng.IntN(n), rng.Float64())
				ops++
			}
			b.ReportMetric(float64(ops)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// BenchmarkSumTreeFindBatch finds 256 leaves at once (FindBatch) next to
// 256 calls of Find, on the same tree and masses: what a prioritised draw
// of a 256-row batch costs in the tree.
func BenchmarkSumTreeFindBatch(b *testing.B) {
	for _, n := range benchSizes {
		tr := NewSumTree(n)
		rng := rand.New(rand.NewPCG(2, uint64(n)))
		for i := range n {
			tr.Set(i, rng.Float64())
		}
		total := tr.Total()
		masses, scratch, out := make([]float64, 256), make([]float64, 256), make([]int, 256)
		for _, batch := range []bool{false, true} {
			b.Run(fmt.Sprintf("n=%d/batch=%v", n, batch), func(b *testing.B) {
				for b.Loop() {
					for j := range masses {
						masses[j] = rng.Float64() * total
					}
					if batch {
						copy(scratch, masses)
						tr.FindBatch(scratch, out)
					} else {
						for j, m := range masses {
							out[j] = tr.Find(m)
						}
					}
				}
				b.ReportMetric(256*float64(b.N)/b.Elapsed().Seconds(), "finds/s")
			})
		}
	}
}
