package perm

import (
	"fmt"
	"math"
	"testing"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

var testSeeds = []uint64{0, 1, 2, 42, 0xdeadbeef, math.MaxUint64}

func checkBijection(t *testing.T, n, seed uint64) {
	t.Helper()
	p := New(n, seed)
	if p.N() != n {
		t.Fatalf("New(%d, %d).N() = %d", n, seed, p.N())
	}
	seen := make([]bool, n)
	for i := range n {
		x := p.At(i)
		if x >= n {
			t.Fatalf("n=%d seed=%d: At(%d) = %d out of range", n, seed, i, x)
		}
		if seen[x] {
			t.Fatalf("n=%d seed=%d: At(%d) = %d repeats an earlier value", n, seed, i, x)
		}
		seen[x] = true
	}
}

func TestBijectionSmall(t *testing.T) {
	for _, seed := range testSeeds {
		for n := range uint64(301) {
			checkBijection(t, n, seed)
		}
	}
}

func TestBijectionLarger(t *testing.T) {
	sizes := []uint64{1000, 1023, 1024, 1025, 4096, 65536, 65537, 1 << 20}
	if testing.Short() {
		sizes = sizes[:5]
	}
	for _, n := range sizes {
		for _, seed := range testSeeds[:3] {
			t.Run(fmt.Sprintf("n=%d/seed=%d", n, seed), func(t *testing.T) {
				checkBijection(t, n, seed)
			})
		}
	}
}

func TestDeterministic(t *testing.T) {
	a, b := New(1000, 7), New(1000, 7)
	for i := range uint64(1000) {
		if a.At(i) != b.At(i) {
			t.Fatalf("same (n, seed) disagree at %d", i)
		}
	}
}

func TestSeedsDiffer(t *testing.T) {
	for _, n := range []uint64{5, 20, 1000, 65537} {
		orders := map[string]uint64{}
		for seed := range uint64(20) {
			p := New(n, seed)
			m := min(n, 64)
			key := make([]byte, 0, m*8)
			for i := range m {
				key = fmt.Appendf(key, "%d,", p.At(i))
			}
			if prev, ok := orders[string(key)]; ok && n >= 20 {
				// 5! = 120 orders, so collisions among 20 seeds are
				// plausible for n=5; for larger n they indicate a bug.
				t.Fatalf("n=%d: seeds %d and %d give the same order", n, prev, seed)
			}
			orders[string(key)] = seed
		}
		if len(orders) < 10 {
			t.Fatalf("n=%d: only %d distinct orders from 20 seeds", n, len(orders))
		}
	}
}

func TestOutOfRangePanics(t *testing.T) {
	for _, tc := range []struct{ n, i uint64 }{{0, 0}, {1, 1}, {10, 10}, {10, math.MaxUint64}} {
		t.Run(fmt.Sprintf("n=%d/i=%d", tc.n, tc.i), func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			New(tc.n, 1).At(tc.i)
		})
	}
}

func TestZeroValue(t *testing.T) {
	var p Perm
	if p.N() != 0 {
		t.Fatalf("zero Perm has N=%d", p.N())
	}
}

func chiSquareP(t *testing.T, counts []float64, total float64) float64 {
	t.Helper()
	exp := make([]float64, len(counts))
	for i := range exp {
		exp[i] = total / float64(len(counts))
	}
	chi2 := stat.ChiSquare(counts, exp)
	return distuv.ChiSquared{K: float64(len(counts) - 1)}.Survival(chi2)
}

// TestUniformAcrossSeeds treats the seed as the source of randomness: over many
// seeds, where element 0 lands and which element comes first should both be
// uniform, and the relative order of the first two positions a fair coin.
func TestUniformAcrossSeeds(t *testing.T) {
	const (
		n     = 20
		seeds = 20000
	)
	posOfZero := make([]float64, n)
	first := make([]float64, n)
	less := 0
	for seed := range uint64(seeds) {
		p := New(n, seed)
		for i := range uint64(n) {
			if p.At(i) == 0 {
				posOfZero[i]++
			}
		}
		a, b := p.At(0), p.At(1)
		first[a]++
		if a < b {
			less++
		}
	}
	if pv := chiSquareP(t, posOfZero, seeds); pv < 1e-4 {
		t.Errorf("position of element 0 not uniform: p=%v counts=%v", pv, posOfZero)
	} else {
		t.Logf("position of 0: p=%.4f", pv)
	}
	if pv := chiSquareP(t, first, seeds); pv < 1e-4 {
		t.Errorf("element at position 0 not uniform: p=%v counts=%v", pv, first)
	} else {
		t.Logf("element at 0: p=%.4f", pv)
	}
	// Binomial(20000, 0.5) has sd ~71; allow ~7 sd.
	frac := float64(less) / seeds
	t.Logf("P(At(0) < At(1)) = %.4f", frac)
	if math.Abs(frac-0.5) > 0.025 {
		t.Errorf("P(At(0) < At(1)) = %v, want ~0.5", frac)
	}
}

// TestUniformTinyDomains repeats the first-element check around the switch
// from the explicit table to the Feistel network, whose narrowest halves
// (3 bits) are its weakest case.
func TestUniformTinyDomains(t *testing.T) {
	const seeds = 20000
	for _, n := range []uint64{2, 3, 4, 5, 7, 16, 17, 31, 64, 65} {
		first := make([]float64, n)
		for seed := range uint64(seeds) {
			first[New(n, seed).At(0)]++
		}
		if pv := chiSquareP(t, first, seeds); pv < 1e-4 {
			t.Errorf("n=%d: element at position 0 not uniform: p=%v counts=%v", n, pv, first)
		}
	}
}

// TestSmallAllOrdersUniform checks the explicit-table path: every one of the
// n! orders must be reachable and equally likely.
func TestSmallAllOrdersUniform(t *testing.T) {
	for _, n := range []uint64{2, 3, 4, 5} {
		const seeds = 120000
		idx := map[[5]uint64]int{}
		var counts []float64
		for seed := range uint64(seeds) {
			p := New(n, seed)
			var order [5]uint64
			for i := range n {
				order[i] = p.At(i)
			}
			j, ok := idx[order]
			if !ok {
				j = len(counts)
				idx[order] = j
				counts = append(counts, 0)
			}
			counts[j]++
		}
		want := 1
		for k := 2; k <= int(n); k++ {
			want *= k
		}
		if len(counts) != want {
			t.Fatalf("n=%d: %d distinct orders, want %d", n, len(counts), want)
		}
		if pv := chiSquareP(t, counts, seeds); pv < 1e-4 {
			t.Errorf("n=%d: orders not uniform: p=%v", n, pv)
		}
	}
}

// TestWalkCost checks the documented cycle-walking bound: the average number
// of Feistel applications per At is below domain/n < 4.
func TestWalkCost(t *testing.T) {
	for _, n := range []uint64{17, 65, 257, 1025, 4097, 1<<20 + 1} {
		p := New(n, 3)
		domain := uint64(1) << (2 * p.half)
		if domain >= 4*n {
			t.Fatalf("n=%d: domain %d not < 4n", n, domain)
		}
		steps := uint64(0)
		for i := range n {
			x := i
			for {
				steps++
				x = p.feistel(x)
				if x < n {
					break
				}
			}
		}
		if mean := float64(steps) / float64(n); mean > float64(domain)/float64(n) {
			t.Fatalf("n=%d: mean walk %v exceeds domain/n = %v", n, mean, float64(domain)/float64(n))
		}
	}
}

func TestAtAllocs(t *testing.T) {
	p := New(1e7, 1)
	if a := testing.AllocsPerRun(100, func() { p.At(12345) }); a != 0 {
		t.Fatalf("At allocates: %v", a)
	}
}

func BenchmarkAt(b *testing.B) {
	for _, n := range []uint64{1e3, 1e7, 1<<24 + 1} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			p := New(n, 1)
			i, rows := uint64(0), 0
			for b.Loop() {
				p.At(i)
				if i++; i == n {
					i = 0
				}
				rows++
			}
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// TestAtBatchMatchesAt checks AtBatch against At for every index of small
// and medium domains (the table, the Feistel network with short and long
// cycle walks, lengths that are and are not multiples of four) and for
// windows of a large one, from every start.
func TestAtBatchMatchesAt(t *testing.T) {
	for _, n := range []uint64{1, 5, 16, 17, 100, 257, 1000, 4097, 100_003} {
		for _, seed := range testSeeds {
			p := New(n, seed)
			for _, start := range []uint64{0, 1, n / 3, n - min(n, 7)} {
				length := min(n-start, 1030)
				got := make([]uint64, length)
				p.AtBatch(start, got)
				for j, v := range got {
					if want := p.At(start + uint64(j)); v != want {
						t.Fatalf("n=%d seed=%d: AtBatch(%d)[%d] = %d, At(%d) = %d", n, seed, start, j, v, start+uint64(j), want)
					}
				}
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("AtBatch past the end did not panic")
		}
	}()
	New(10, 1).AtBatch(8, make([]uint64, 3))
}

func BenchmarkAtBatch(b *testing.B) {
	p := New(100_000, 7)
	dst := make([]uint64, 256)
	for _, batch := range []bool{false, true} {
		b.Run(fmt.Sprintf("batch=%v", batch), func(b *testing.B) {
			start := uint64(0)
			for b.Loop() {
				if batch {
					p.AtBatch(start, dst)
				} else {
					for j := range dst {
						dst[j] = p.At(start + uint64(j))
					}
				}
				if start += 256; start+256 > p.N() {
					start = 0
				}
			}
		})
	}
}
