package collector_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
)

// The GRU cell, worked by hand for one input, one hidden unit and two
// actions, against PyTorch's nn.GRU equations (gate order r, z, n).
func TestGRUQStepByHand(t *testing.T) {
	p := collector.NewGRUQ(1, 1, 2, 0, 1)
	w := map[string][]float32{
		"w_ih": {0.5, -1, 2}, "w_hh": {1, 0.5, -0.5}, // [1, 3]: r, z, n
		"b_ih": {0, 0.25, 0}, "b_hh": {0.5, 0, 1},
		"w_q": {1, -1}, "b_q": {0, 0.5},
	}
	shapes := map[string][]int{"w_ih": {1, 3}, "w_hh": {1, 3}, "b_ih": {3}, "b_hh": {3}, "w_q": {1, 2}, "b_q": {2}}
	if err := p.SetWeights(w, shapes); err != nil {
		t.Fatal(err)
	}
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	x, h := 2.0, 0.5
	r := sig(0.5*x + 0 + 1*h + 0.5)
	z := sig(-1*x + 0.25 + 0.5*h + 0)
	n := math.Tanh(2*x + 0 + r*(-0.5*h+1))
	hn := float32((1-z)*n + z*h)
	next := make([]float32, 1)
	q := p.Step([]float32{float32(x)}, []float32{float32(h)}, 1, next)
	if next[0] != hn {
		t.Fatalf("h' = %v, want %v", next[0], hn)
	}
	if q[0] != float64(hn) || q[1] != -float64(hn)+0.5 {
		t.Fatalf("Q = %v, want [%v %v]", q, float64(hn), -float64(hn)+0.5)
	}
	// Greedy acting takes the larger Q and returns the same state.
	spec := envs.Spec{Name: "t", ObsDType: "float32", ObsShape: []int{1}, NumActions: 2}
	act := envs.NewActions(spec, 1)
	got := make([]float32, 1)
	if err := p.ActRecurrent(obsOf(&spec, float32(x)), []float32{float32(h)}, got, act, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatal(err)
	}
	wantAct := int64(0)
	if q[1] > q[0] {
		wantAct = 1
	}
	if got[0] != hn || act.Discrete[0] != wantAct {
		t.Fatalf("ActRecurrent: state %v action %d, want %v %d", got[0], act.Discrete[0], hn, wantAct)
	}
	back, backShapes := p.Weights()
	for k, v := range w {
		if len(back[k]) != len(v) || back[k][0] != v[0] || len(backShapes[k]) != len(shapes[k]) {
			t.Fatalf("weights %s: %v %v, want %v %v", k, back[k], backShapes[k], v, shapes[k])
		}
	}
}

// A state depends only on its own row: a batch gives each row exactly what
// the row alone gives, whatever else the batch holds. The collector steps
// copies together and a replay steps one row, so this is what makes stored
// states replayable bit for bit.
func TestGRUQRowsAreIndependentOfTheBatch(t *testing.T) {
	const D, H, n = 3, 16, 37
	p := collector.NewGRUQ(D, H, 4, 0, 7)
	rng := rand.New(rand.NewPCG(3, 3))
	x, h := make([]float32, n*D), make([]float32, n*H)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for i := range h {
		h[i] = float32(rng.Float64()*2 - 1)
	}
	batch := make([]float32, n*H)
	qb := p.Step(x, h, n, batch)
	for i := range n {
		one := make([]float32, H)
		q1 := p.Step(x[i*D:(i+1)*D], h[i*H:(i+1)*H], 1, one)
		for j := range H {
			if math.Float32bits(one[j]) != math.Float32bits(batch[i*H+j]) {
				t.Fatalf("row %d unit %d: %v alone, %v in the batch", i, j, one[j], batch[i*H+j])
			}
		}
		for a := range 4 {
			if math.Float64bits(q1[a]) != math.Float64bits(qb[i*4+a]) {
				t.Fatalf("row %d Q[%d]: %v alone, %v in the batch", i, a, q1[a], qb[i*4+a])
			}
		}
	}
}

func TestGRUQRejectsBadWeights(t *testing.T) {
	good := func() (map[string][]float32, map[string][]int) {
		return collector.NewGRUQ(2, 4, 2, 0, 1).Weights()
	}
	tests := []struct {
		name   string
		change func(map[string][]float32, map[string][]int)
		want   string
	}{
		{"wrong hidden size", func(v map[string][]float32, s map[string][]int) {
			v["w_hh"], s["w_hh"] = make([]float32, 5*15), []int{5, 15}
		}, "w_hh: shape [5 15], want [4 12]"},
		{"missing", func(v map[string][]float32, s map[string][]int) { delete(v, "b_q") }, `tensor "b_q" is required`},
		{"unknown", func(v map[string][]float32, s map[string][]int) { v["w1"], s["w1"] = []float32{1}, []int{1} }, `tensor "w1": unknown`},
		{"not finite", func(v map[string][]float32, s map[string][]int) { v["b_ih"][3] = float32(math.NaN()) }, "b_ih: holds NaN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := collector.NewGRUQ(2, 4, 2, 0, 1)
			before, _ := p.Weights()
			v, s := good()
			tc.change(v, s)
			err := p.SetWeights(v, s)
			var we *collector.WeightsError
			if !errors.As(err, &we) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want a WeightsError saying %q", err, tc.want)
			}
			after, _ := p.Weights()
			if after["w_hh"][0] != before["w_hh"][0] || len(after["w_hh"]) != len(before["w_hh"]) {
				t.Fatal("a refused update changed the weights")
			}
		})
	}
}
