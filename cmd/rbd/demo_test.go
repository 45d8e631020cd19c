package main

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

// TestDemoCollectorWeights: the demo collector takes the learner's MLP,
// the linear layout and epsilon, in any order, and refuses the rest
// without touching the policy that acts.
func TestDemoCollectorWeights(t *testing.T) {
	env, err := envs.New("cartpole", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	d := newDemoCollector(env.Spec(), 0)
	f := func(n int, v float32) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	mlp := func(h int) (map[string][]float32, map[string][]int) {
		return map[string][]float32{"w1": f(4*h, 0.1), "b1": f(h, 0), "w2": f(h*2, 0.1), "b2": {0, 1}},
			map[string][]int{"w1": {4, h}, "b1": {h}, "w2": {h, 2}, "b2": {2}}
	}
	m16v, m16s := mlp(16)
	m8v, m8s := mlp(8)
	m8v["epsilon"], m8s["epsilon"] = []float32{0.3}, []int{}
	badW1v, badW1s := mlp(2000)
	mixedV, mixedS := mlp(4)
	mixedV["w"], mixedS["w"] = f(8, 1), []int{4, 2}
	steps := []struct {
		name    string
		vals    map[string][]float32
		shapes  map[string][]int
		err     string // substring of the error; "" for success
		policy  string
		hidden  int
		epsilon float64
	}{
		{"mlp", m16v, m16s, "", "mlp", 16, demoEpsilon},
		{"epsilon alone keeps the network", map[string][]float32{"epsilon": {0.05}}, map[string][]int{"epsilon": {1}}, "", "mlp", 16, 0.05},
		{"mlp of another width with epsilon", m8v, m8s, "", "mlp", 8, 0.3},
		{"linear", map[string][]float32{"w": f(8, 1), "b": {0, 0}}, map[string][]int{"w": {4, 2}, "b": {2}}, "", "linear", 0, 0.3},
		{"epsilon out of range", map[string][]float32{"epsilon": {1.5}}, map[string][]int{"epsilon": {}}, "epsilon", "linear", 0, 0.3},
		{"epsilon of two values", map[string][]float32{"epsilon": {0.1, 0.2}}, map[string][]int{"epsilon": {2}}, "epsilon", "linear", 0, 0.3},
		{"hidden too wide", badW1v, badW1s, "1 <= H <= 1024", "linear", 0, 0.3},
		{"mlp and linear at once", mixedV, mixedS, "w", "linear", 0, 0.3},
		{"mlp missing a tensor", map[string][]float32{"w1": f(16, 0), "b1": f(4, 0)}, map[string][]int{"w1": {4, 4}, "b1": {4}}, "w2", "linear", 0, 0.3},
		{"unknown tensor", map[string][]float32{"theta": {1}}, map[string][]int{"theta": {1}}, "want w1, b1, w2, b2", "linear", 0, 0.3},
		{"linear wrong shape", map[string][]float32{"w": f(8, 1), "b": {0, 0}}, map[string][]int{"w": {2, 4}, "b": {2}}, "shape", "linear", 0, 0.3},
	}
	version := int64(0)
	for _, s := range steps {
		err := d.SetWeights("demo", s.vals, s.shapes)
		switch {
		case s.err == "" && err != nil:
			t.Fatalf("%s: %v", s.name, err)
		case s.err != "" && (err == nil || !strings.Contains(err.Error(), s.err) || !errors.Is(err, storage.ErrInvalidBatch)):
			t.Fatalf("%s: error %v, want one naming %q that is a 400", s.name, err, s.err)
		case err == nil:
			version++
		}
		info, err := d.CollectorInfo("demo")
		if err != nil {
			t.Fatal(err)
		}
		if info.Policy != s.policy || info.Hidden != s.hidden || info.Epsilon != s.epsilon || info.WeightsVersion != version {
			t.Fatalf("%s: acting policy %s hidden %d epsilon %v version %d; want %s %d %v %d", s.name,
				info.Policy, info.Hidden, info.Epsilon, info.WeightsVersion, s.policy, s.hidden, s.epsilon, version)
		}
		// Whatever is active can act.
		spec := env.Spec()
		obs := collector.Obs{Spec: &spec, N: 1}
		obs.Data = make([]byte, 16)
		acts := &envs.Actions{Discrete: make([]int64, 1)}
		if err := d.Act(&obs, acts, rand.New(rand.NewPCG(1, 2))); err != nil {
			t.Fatalf("%s: act: %v", s.name, err)
		}
	}
	if err := d.SetWeights("other", m16v, m16s); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("unknown collector: %v", err)
	}
	if _, err := d.CollectorInfo("other"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("unknown collector info: %v", err)
	}
}

// With --demo-env cartpole-masked the demo starts as a zero-weight GRU
// whose width is the buffer's recurrent_state; a learner may push a GRU of
// that width (not another), an MLP (whose rows then store zero states) or
// epsilon; a plain demo refuses GRU weights.
func TestDemoCollectorRecurrent(t *testing.T) {
	const H = 4
	spec := envs.CartPoleMaskedSpec()
	d := newDemoCollector(spec, H)
	rp, ok := d.policy().(collector.RecurrentPolicy)
	if !ok || rp.StateSize() != H {
		t.Fatalf("the recurrent demo's policy is %T", d.policy())
	}
	info, _ := d.CollectorInfo("demo")
	if info.Policy != "gru" || info.Hidden != H || info.Env != "cartpole-masked" {
		t.Fatalf("info %+v", info)
	}
	gru := func(h int) (map[string][]float32, map[string][]int) {
		return collector.NewGRUQ(2, h, 2, 0, 3).Weights()
	}
	act := func() []float32 {
		t.Helper()
		obs := collector.Obs{Spec: &spec, N: 2, Data: make([]byte, 16)}
		for i := range 4 {
			obs.Data[4*i+3] = 0x3f // 0.5 in every position
		}
		state, next := []float32{1, 1, 1, 1, 0, 0, 0, 0}, make([]float32, 2*H)
		for i := range next {
			next[i] = 9
		}
		if err := rp.ActRecurrent(&obs, state, next, &envs.Actions{Discrete: make([]int64, 2)}, rand.New(rand.NewPCG(1, 1))); err != nil {
			t.Fatal(err)
		}
		return next
	}
	if next := act(); next[0] != 0.5 || next[H] != 0 {
		// Zero weights: every gate is 1/2 and the candidate 0, so h' = h/2.
		t.Fatalf("zero-weight GRU: next states %v", next)
	}
	v, s := gru(H)
	if err := d.SetWeights("demo", v, s); err != nil {
		t.Fatal(err)
	}
	if next := act(); next[0] == 0.5 || next[0] == 9 {
		t.Fatalf("pushed GRU: next states %v", next)
	}
	v, s = gru(H + 1)
	if err := d.SetWeights("demo", v, s); err == nil || !strings.Contains(err.Error(), "recurrent_state holds 4 values") || !errors.Is(err, storage.ErrInvalidBatch) {
		t.Fatalf("GRU of another width: %v", err)
	}
	mlp := map[string][]float32{"w1": make([]float32, 2*3), "b1": make([]float32, 3), "w2": make([]float32, 3*2), "b2": {0, 1}}
	if err := d.SetWeights("demo", mlp, map[string][]int{"w1": {2, 3}, "b1": {3}, "w2": {3, 2}, "b2": {2}}); err != nil {
		t.Fatal(err)
	}
	for i, x := range act() {
		if x != 0 {
			t.Fatalf("an MLP has no state, yet next state %d is %v", i, x)
		}
	}
	plain := newDemoCollector(envs.CartPoleSpec(), 0)
	if _, ok := plain.policy().(collector.RecurrentPolicy); ok {
		t.Fatal("the plain demo is recurrent")
	}
	v, s = gru(H)
	for k := range v { // a GRU for 4 inputs
		if k == "w_ih" {
			v[k], s[k] = make([]float32, 4*3*H), []int{4, 3 * H}
		}
	}
	if err := plain.SetWeights("demo", v, s); err == nil || !strings.Contains(err.Error(), "stores no recurrent state") {
		t.Fatalf("GRU weights on the plain demo: %v", err)
	}
}
