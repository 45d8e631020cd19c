package segtree

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestMinTreeBasic(t *testing.T) {
	tests := []struct {
		name string
		ops  func(*MinTree)
		want float64
	}{
		{"empty", func(*MinTree) {}, math.Inf(1)},
		{"one", func(m *MinTree) { m.Set(2, 5) }, 5},
		{"two", func(m *MinTree) { m.Set(2, 5); m.Set(4, 3) }, 3},
		{"overwrite up", func(m *MinTree) { m.Set(2, 5); m.Set(4, 3); m.Set(4, 9) }, 5},
		{"clear min", func(m *MinTree) { m.Set(0, 1); m.Set(4, 2); m.Clear(0) }, 2},
		{"clear all", func(m *MinTree) { m.Set(0, 1); m.Clear(0) }, math.Inf(1)},
		{"negative ok", func(m *MinTree) { m.Set(3, -2); m.Set(1, 0) }, -2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMinTree(5)
			tc.ops(m)
			if got := m.Min(); got != tc.want {
				t.Fatalf("Min = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMinTreeEdgeSizes(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3} {
		m := NewMinTree(n)
		if m.Len() != n || !math.IsInf(m.Min(), 1) {
			t.Fatalf("n=%d: Len=%d Min=%v", n, m.Len(), m.Min())
		}
		if n > 0 {
			m.Set(n-1, 7)
			if m.Min() != 7 || m.Get(n-1) != 7 {
				t.Fatalf("n=%d: Min=%v", n, m.Min())
			}
		}
	}
}

func TestMinTreePanics(t *testing.T) {
	for name, f := range map[string]func(m *MinTree){
		"NaN":         func(m *MinTree) { m.Set(0, math.NaN()) },
		"set range":   func(m *MinTree) { m.Set(2, 1) },
		"clear range": func(m *MinTree) { m.Clear(-1) },
		"get range":   func(m *MinTree) { m.Get(2) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("did not panic")
				}
			}()
			f(NewMinTree(2))
		})
	}
}

func TestMinTreeRandomAgainstNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 2, 3, 17, 1000, 1025} {
		m := NewMinTree(n)
		vals := make([]float64, n)
		for i := range vals {
			vals[i] = math.Inf(1)
		}
		for step := range 20 * n {
			i := rng.IntN(n)
			if rng.IntN(3) == 0 {
				m.Clear(i)
				vals[i] = math.Inf(1)
			} else {
				v := rng.Float64() * 100
				m.Set(i, v)
				vals[i] = v
			}
			want := math.Inf(1)
			for _, v := range vals {
				want = min(want, v)
			}
			if got := m.Min(); got != want {
				t.Fatalf("n=%d step %d: Min=%v want %v", n, step, got, want)
			}
			if m.Get(i) != vals[i] {
				t.Fatalf("n=%d: Get(%d)=%v want %v", n, i, m.Get(i), vals[i])
			}
		}
	}
}
