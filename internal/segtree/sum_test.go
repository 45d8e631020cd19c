package segtree

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

func newSum(vals ...float64) *SumTree {
	t := NewSumTree(len(vals))
	for i, v := range vals {
		t.Set(i, v)
	}
	return t
}

func TestSumTreeFindExact(t *testing.T) {
	tests := []struct {
		name   string
		leaves []float64
		mass   float64
		want   int
	}{
		{"first interval", []float64{1, 4}, 0.5, 0},
		{"left edge of second", []float64{1, 4}, 1.0, 1},
		{"inside second", []float64{1, 4}, 4.9, 1},
		{"zero mass", []float64{1, 4}, 0, 0},
		{"single leaf", []float64{3}, 2.9, 0},
		{"leading zeros", []float64{0, 0, 2, 0}, 0, 2},
		{"leading zeros end", []float64{0, 0, 2, 0}, 1.999, 2},
		{"skip zero middle", []float64{1, 0, 1}, 1, 2},
		{"odd count last", []float64{1, 1, 1, 1, 1}, 4.5, 4},
		{"non power of two", []float64{1, 2, 3, 4, 5, 6, 7}, 10, 4},
		{"mass at total clamps left", []float64{1, 2, 0, 0}, 3, 1},
		{"mass past total", []float64{1, 2, 0, 0, 0}, 100, 1},
		{"negative mass", []float64{0, 0, 5}, -1, 2},
		{"NaN mass", []float64{0, 3, 0}, math.NaN(), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newSum(tc.leaves...)
			if got := tr.Find(tc.mass); got != tc.want {
				t.Fatalf("Find(%v) over %v = %d, want %d", tc.mass, tc.leaves, got, tc.want)
			}
		})
	}
}

// TestSumTreeFindPrefix checks the interval definition directly against a naive
// prefix scan at every interval edge and midpoint.
func TestSumTreeFindPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 5, 8, 13, 64, 100} {
		vals := make([]float64, n)
		for i := range vals {
			if rng.IntN(3) > 0 {
				vals[i] = float64(1 + rng.IntN(8)) // integers keep prefixes exact
			}
		}
		tr := newSum(vals...)
		prefix := 0.0
		for i, v := range vals {
			if v > 0 {
				for _, m := range []float64{prefix, prefix + v/2, prefix + v - 0.25} {
					if got := tr.Find(m); got != i {
						t.Fatalf("n=%d vals=%v Find(%v)=%d want %d", n, vals, m, got, i)
					}
				}
			}
			prefix += v
		}
	}
}

func TestSumTreeEmpty(t *testing.T) {
	for _, n := range []int{0, 1, 7} {
		tr := NewSumTree(n)
		if tr.Len() != n || tr.Total() != 0 {
			t.Fatalf("n=%d: Len=%d Total=%v", n, tr.Len(), tr.Total())
		}
		if got := tr.Find(0); got != -1 {
			t.Fatalf("n=%d: Find on empty tree = %d, want -1", n, got)
		}
	}
	tr := newSum(0, 2, 0)
	tr.Set(1, 0)
	if tr.Total() != 0 || tr.Find(0) != -1 {
		t.Fatalf("after zeroing: Total=%v Find=%d", tr.Total(), tr.Find(0))
	}
}

func TestSumTreeSetPanics(t *testing.T) {
	tests := []struct {
		name string
		i    int
		v    float64
	}{
		{"negative", 0, -1},
		{"NaN", 0, math.NaN()},
		{"+Inf", 0, math.Inf(1)},
		{"-Inf", 0, math.Inf(-1)},
		{"index high", 3, 1},
		{"index negative", -1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("Set(%d, %v) did not panic", tc.i, tc.v)
				}
			}()
			NewSumTree(3).Set(tc.i, tc.v)
		})
	}
}

// TestSumTreeNeverZero hammers Find with masses at and around every interval
// edge, where rounding is most likely to spill into a neighbouring zero leaf.
func TestSumTreeNeverZero(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 1000
	tr := NewSumTree(n)
	vals := make([]float64, n)
	for round := range 20 {
		for i := range vals {
			v := 0.0
			switch rng.IntN(4) {
			case 0: // stays zero
			case 1:
				v = rng.Float64() * 1e-12
			case 2:
				v = rng.Float64() * 1e6
			default:
				v = rng.ExpFloat64()
			}
			vals[i] = v
			tr.Set(i, v)
		}
		total := tr.Total()
		prefix := 0.0
		check := func(m float64) {
			i := tr.Find(m)
			if i < 0 || i >= n || tr.Get(i) == 0 {
				t.Fatalf("round %d: Find(%v) = %d (leaf value %v), total %v", round, m, i, tr.Get(max(i, 0)), total)
			}
		}
		for _, v := range vals {
			prefix += v
			check(prefix)
			check(math.Nextafter(prefix, 0))
			check(math.Nextafter(prefix, math.Inf(1)))
		}
		check(total)
		check(math.Nextafter(total, 0))
		check(0)
		for range 10000 {
			check(rng.Float64() * total)
		}
	}
}

func TestSumTreeTotalMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 2, 3, 1000, 4097} {
		tr := NewSumTree(n)
		vals := make([]float64, n)
		for range 200 * n {
			i := rng.IntN(n)
			v := 0.0
			if rng.IntN(5) > 0 {
				v = math.Exp(rng.NormFloat64() * 3)
			}
			vals[i] = v
			tr.Set(i, v)
			if tr.Get(i) != v {
				t.Fatalf("Get(%d) = %v after Set %v", i, tr.Get(i), v)
			}
		}
		naive := 0.0
		for _, v := range vals {
			naive += v
		}
		if rel := math.Abs(tr.Total()-naive) / naive; rel > 1e-9 {
			t.Fatalf("n=%d: Total %v vs naive %v (rel %v)", n, tr.Total(), naive, rel)
		}
	}
}

// TestSumTreeProportional draws masses uniformly and checks with a chi-square
// test that leaves are hit in proportion to their values.
func TestSumTreeProportional(t *testing.T) {
	const (
		n     = 50
		draws = 100000
	)
	rng := rand.New(rand.NewPCG(7, 8))
	tr := NewSumTree(n)
	vals := make([]float64, n)
	for i := range vals {
		switch {
		case i%7 == 3:
			vals[i] = 0
		case i%5 == 0:
			vals[i] = 0.05 + rng.Float64()*0.1 // rare leaves
		default:
			vals[i] = 1 + rng.Float64()*9
		}
		tr.Set(i, vals[i])
	}
	total := tr.Total()
	counts := make([]float64, n)
	for range draws {
		counts[tr.Find(rng.Float64()*total)]++
	}

	var obs, exp []float64
	for i, v := range vals {
		if v == 0 {
			if counts[i] != 0 {
				t.Fatalf("zero leaf %d drawn %v times", i, counts[i])
			}
			continue
		}
		obs = append(obs, counts[i])
		exp = append(exp, draws*v/total)
	}
	chi2 := stat.ChiSquare(obs, exp)
	p := distuv.ChiSquared{K: float64(len(obs) - 1)}.Survival(chi2)
	t.Logf("chi2=%.2f df=%d p=%.4f", chi2, len(obs)-1, p)
	if p < 1e-4 {
		t.Fatalf("frequencies do not match weights: chi2=%v p=%v", chi2, p)
	}
}

func TestSumTreeFindAllocs(t *testing.T) {
	tr := newSum(1, 2, 3, 4, 5)
	if a := testing.AllocsPerRun(100, func() { tr.Find(7.5); tr.Set(2, 1) }); a != 0 {
		t.Fatalf("Find/Set allocate: %v allocs", a)
	}
}

// TestSumTreeFindBatchMatchesFind checks FindBatch leaf for leaf against
// Find on trees of several shapes (sizes around powers of two, zero runs,
// one positive leaf, all zero) and on masses at and past the edges:
// negative, zero, the total and beyond, NaN, and uniform ones.
func TestSumTreeFindBatchMatchesFind(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		name  string
		n     int
		value func(i int) float64
	}{
		{"one leaf", 1, func(int) float64 { return 2 }},
		{"all zero", 9, func(int) float64 { return 0 }},
		{"one positive", 33, func(i int) float64 { return float64(i / 32) }},
		{"zero runs", 100, func(i int) float64 { return float64((i / 7) % 2) }},
		{"power of two", 64, func(int) float64 { return rng.Float64() }},
		{"odd", 1001, func(int) float64 { return rng.ExpFloat64() }},
		{"large", 100_000, func(int) float64 { return rng.Float64() * rng.Float64() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewSumTree(tc.n)
			for i := range tc.n {
				tr.Set(i, tc.value(i))
			}
			total := tr.Total()
			masses := []float64{-1, 0, total, total * 2, math.NaN(), math.Inf(1), math.Inf(-1), math.Nextafter(total, 0)}
			for range 500 {
				masses = append(masses, rng.Float64()*total)
			}
			want := make([]int, len(masses))
			for j, m := range masses {
				want[j] = tr.Find(m)
			}
			got := make([]int, len(masses))
			tr.FindBatch(slices.Clone(masses), got)
			for j := range masses {
				if got[j] != want[j] {
					t.Fatalf("mass %v: FindBatch gives leaf %d, Find %d", masses[j], got[j], want[j])
				}
			}
		})
	}
}
