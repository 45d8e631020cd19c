package collector_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
)

func obsOf(spec *envs.Spec, vals ...float32) *collector.Obs {
	data := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return &collector.Obs{Spec: spec, N: len(vals) / spec.ObsElems(), Data: data}
}

// The MLP's forward pass, worked by hand for a 2-3-2 network.
func TestMLPQForwardByHand(t *testing.T) {
	p := collector.NewMLPQ(2, 3, 2, 0, 1)
	err := p.SetWeights(map[string][]float32{
		"w1": {1, -1, 0.5, 2, 0, -1}, // [2,3]
		"b1": {0, 0.5, -1},
		"w2": {1, 0, -1, 2, 0.5, 0.5}, // [3,2]
		"b2": {0.1, -0.1},
	}, map[string][]int{"w1": {2, 3}, "b1": {3}, "w2": {3, 2}, "b2": {2}})
	if err != nil {
		t.Fatal(err)
	}
	// o = (1, 2): pre = (1+4, -1+0+0.5, 0.5-2-1) = (5, -0.5, -2.5); h = (5, 0, 0)
	// Q = (5*1 + 0.1, 5*0 - 0.1) = (5.1, -0.1)
	// o = (-1, 1): pre = (-1+2, 1+0.5, -0.5-1-1) = (1, 1.5, -2.5); h = (1, 1.5, 0)
	// Q = (1 - 1.5 + 0.1, 0 + 3 - 0.1) = (-0.4, 2.9)
	q := p.Q([]float32{1, 2, -1, 1}, 2)
	want := []float64{5.1, -0.1, -0.4, 2.9}
	for i := range want {
		if math.Abs(q[i]-want[i]) > 1e-6 { // weights travel as float32
			t.Fatalf("Q = %v, want %v", q, want)
		}
	}
	spec := envs.Spec{Name: "t", ObsDType: "float32", ObsShape: []int{2}, NumActions: 2}
	act := envs.NewActions(spec, 2)
	if err := p.Act(obsOf(&spec, 1, 2, -1, 1), act, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatal(err)
	}
	if act.Discrete[0] != 0 || act.Discrete[1] != 1 {
		t.Fatalf("greedy actions %v, want [0 1]", act.Discrete)
	}
	w, shapes := p.Weights()
	if len(w["w1"]) != 6 || w["b2"][1] != -0.1 || shapes["w2"][0] != 3 {
		t.Fatalf("weights %v %v", w, shapes)
	}
	// The policy refuses an env it was not built for.
	other := envs.CartPoleSpec()
	if err := p.Act(obsOf(&other, 0, 0, 0, 0), envs.NewActions(other, 1), rand.New(rand.NewPCG(1, 1))); err == nil {
		t.Fatal("a 2-input network acted on cartpole")
	}
}

func TestSetWeightsErrors(t *testing.T) {
	lq := collector.NewLinearQ(4, 2, 0.1)
	mq := collector.NewMLPQ(4, 8, 2, 0.1, 1)
	w8, b2 := make([]float32, 8), make([]float32, 2)
	cases := []struct {
		p      collector.WeightSetter
		vals   map[string][]float32
		shapes map[string][]int
		want   string
	}{
		{lq, map[string][]float32{"w": w8, "b": b2}, map[string][]int{"w": {2, 4}, "b": {2}}, "w: shape [2 4], want [4 2]"},
		{lq, map[string][]float32{"w": w8, "b": make([]float32, 3)}, map[string][]int{"w": {4, 2}, "b": {3}}, "b: shape [3], want [2]"},
		{lq, map[string][]float32{"w": w8}, map[string][]int{"w": {4, 2}}, `"b" is required`},
		{lq, map[string][]float32{"w": w8, "b": b2, "c": b2}, map[string][]int{"w": {4, 2}, "b": {2}, "c": {2}}, `"c": unknown`},
		{lq, map[string][]float32{"w": w8, "b": {0, float32(math.NaN())}}, map[string][]int{"w": {4, 2}, "b": {2}}, "finite"},
		{mq, map[string][]float32{"w1": w8}, map[string][]int{"w1": {4, 2}}, "w1: shape [4 2], want [4 8]"},
	}
	for _, c := range cases {
		err := c.p.SetWeights(c.vals, c.shapes)
		var we *collector.WeightsError
		if !errors.As(err, &we) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetWeights: %v, want %q", err, c.want)
		}
	}
	if w, _ := lq.Weights(); w[0] != 0 {
		t.Fatal("a rejected update changed the weights")
	}
}

func TestRandomPolicyRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	spec := envs.PendulumSpec()
	act := envs.NewActions(spec, 100)
	if err := (collector.RandomPolicy{Spec: spec}).Act(nil, act, rng); err != nil {
		t.Fatal(err)
	}
	lo, hi := float32(2), float32(-2)
	for _, a := range act.Continuous {
		lo, hi = min(lo, a), max(hi, a)
	}
	if lo < -2 || hi >= 2 || lo > -1.5 || hi < 1.5 {
		t.Fatalf("torques in [%v, %v]", lo, hi)
	}
	cs := envs.CatchSpec(4)
	act = envs.NewActions(cs, 300)
	if err := (collector.RandomPolicy{Spec: cs}).Act(nil, act, rng); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	for _, a := range act.Discrete {
		seen[a]++
	}
	if len(seen) != 3 || seen[0] < 50 || seen[1] < 50 || seen[2] < 50 {
		t.Fatalf("catch actions %v", seen)
	}
}

// Pixel observations reach policies scaled to [0, 1].
func TestObsFloat32(t *testing.T) {
	spec := envs.Spec{Name: "p", ObsDType: "uint8", ObsShape: []int{3}, NumActions: 2}
	o := &collector.Obs{Spec: &spec, N: 1, Data: []byte{0, 51, 255}}
	if got := o.Float32(); got[0] != 0 || got[1] != 0.2 || got[2] != 1 {
		t.Fatalf("%v", got)
	}
}
