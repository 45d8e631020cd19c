package perm

import "testing"

func TestScratch(t *testing.T) {
	var all []float64
	for _, n := range []uint64{17, 20, 33, 64, 65, 100, 257} {
		for base := uint64(0); base < 6; base++ {
			const seeds = 100000
			pos := make([]float64, n)
			first := make([]float64, n)
			for s := range uint64(seeds) {
				p := New(n, base<<40+s)
				for i := range n {
					if p.At(i) == 0 {
						pos[i]++
					}
				}
				first[p.At(0)]++
			}
			all = append(all, chiSquareP(t, pos, seeds), chiSquareP(t, first, seeds))
		}
	}
	c1, c5 := 0, 0
	for _, p := range all {
		if p < 0.01 {
			c1++
		}
		if p < 0.05 {
			c5++
		}
	}
	t.Logf("RESULT %d/%d below 0.01, %d below 0.05", c1, len(all), c5)
}
