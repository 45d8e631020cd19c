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
	d := newDemoCollector(env.Spec())
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
