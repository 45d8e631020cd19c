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
