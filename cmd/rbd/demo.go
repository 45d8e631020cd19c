package main

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

const (
	demoEnvs    = 8
	demoEpsilon = 0.1
	// demoMaxHidden bounds the hidden width a learner may push, so one
	// request cannot make every env step cost a huge matrix product.
	demoMaxHidden = 1024
)

// demoCollector is the policy of serve --demo's collector and what it
// reports. A learner replaces the policy with PUT
// /v1/collectors/demo/weights: an MLP Q-network (w1, b1, w2, b2, the
// layout examples/learner.py trains) or the linear one (w, b), with an
// optional epsilon. Each update builds a new policy and swaps it in whole,
// so the collector never acts on half-replaced weights.
type demoCollector struct {
	obsDim, actions int
	mu              sync.Mutex // serialises updates
	active          atomic.Pointer[demoPolicy]
	version         atomic.Int64
	stats           atomic.Pointer[collector.Stats]
}

// demoPolicy is one version of the demo's policy.
type demoPolicy struct {
	kind    string // "linear" or "mlp"
	hidden  int
	epsilon float64
	act     collector.Policy
	// weights are the tensors it was built from, kept so that an update
	// of epsilon alone can rebuild it.
	weights map[string][]float32
	shapes  map[string][]int
}

func newDemoCollector(spec envs.Spec) *demoCollector {
	d := &demoCollector{obsDim: spec.ObsElems(), actions: spec.NumActions}
	d.active.Store(&demoPolicy{kind: "linear", epsilon: demoEpsilon, act: collector.NewLinearQ(d.obsDim, d.actions, demoEpsilon)})
	d.stats.Store(&collector.Stats{})
	return d
}

// Act implements collector.Policy with whatever policy is active.
func (d *demoCollector) Act(obs *collector.Obs, act *envs.Actions, rng *rand.Rand) error {
	return d.active.Load().act.Act(obs, act, rng)
}

// observe records the collector's stats after each batch (and while its
// writes are held back by the rate limiter).
func (d *demoCollector) observe(st collector.Stats) { d.stats.Store(&st) }

// SetWeights implements server.WeightSetter.
func (d *demoCollector) SetWeights(name string, vals map[string][]float32, shapes map[string][]int) error {
	if name != "demo" {
		return fmt.Errorf("no collector %q runs in this server (only \"demo\", with --demo): %w", name, storage.ErrNotFound)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := d.active.Load()
	eps := cur.epsilon
	if v, ok := vals["epsilon"]; ok {
		if len(v) != 1 || len(shapes["epsilon"]) > 1 || math.IsNaN(float64(v[0])) || v[0] < 0 || v[0] > 1 {
			return fmt.Errorf("tensor \"epsilon\": want one value in [0, 1] (shape [] or [1]), got %v: %w", v, errBadWeights)
		}
		// The shortest decimal that is this float32 (0.05, not
		// 0.05000000074505806), as the learner meant it.
		eps, _ = strconv.ParseFloat(strconv.FormatFloat(float64(v[0]), 'g', -1, 32), 64)
	}
	w := make(map[string][]float32, len(vals))
	sh := make(map[string][]int, len(vals))
	for k, v := range vals {
		if k != "epsilon" {
			w[k], sh[k] = v, shapes[k]
		}
	}
	kind := ""
	switch {
	case len(w) == 0: // epsilon alone: the same weights
		kind, w, sh = cur.kind, cur.weights, cur.shapes
	case w["w1"] != nil || w["w2"] != nil || w["b1"] != nil || w["b2"] != nil:
		kind = "mlp"
	case w["w"] != nil || w["b"] != nil:
		kind = "linear"
	default:
		return fmt.Errorf("tensors %v: want w1, b1, w2, b2 (an MLP), w, b (linear) and/or epsilon: %w", slices.Sorted(maps.Keys(w)), errBadWeights)
	}
	next := &demoPolicy{kind: kind, epsilon: eps, weights: w, shapes: sh}
	switch kind {
	case "linear":
		p := collector.NewLinearQ(d.obsDim, d.actions, eps)
		if w != nil {
			if err := p.SetWeights(w, sh); err != nil {
				return fmt.Errorf("%v: %w", err, errBadWeights)
			}
		}
		next.act = p
	case "mlp":
		s := sh["w1"]
		if len(s) != 2 || s[0] != d.obsDim || s[1] < 1 || s[1] > demoMaxHidden {
			return fmt.Errorf("tensor \"w1\": shape %v, want [%d, H] with 1 <= H <= %d: %w", s, d.obsDim, demoMaxHidden, errBadWeights)
		}
		p := collector.NewMLPQ(d.obsDim, s[1], d.actions, eps, 0)
		if err := p.SetWeights(w, sh); err != nil {
			return fmt.Errorf("%v: %w", err, errBadWeights)
		}
		next.act, next.hidden = p, s[1]
	}
	d.active.Store(next)
	d.version.Add(1)
	return nil
}

// CollectorInfo implements server.CollectorReporter.
func (d *demoCollector) CollectorInfo(name string) (server.CollectorInfo, error) {
	if name != "demo" {
		return server.CollectorInfo{}, fmt.Errorf("no collector %q runs in this server (only \"demo\", with --demo): %w", name, storage.ErrNotFound)
	}
	p, st := d.active.Load(), d.stats.Load()
	return server.CollectorInfo{
		Name: "demo", Env: "cartpole", Envs: demoEnvs, Buffer: "demo",
		Policy: p.kind, Hidden: p.hidden, Epsilon: p.epsilon, WeightsVersion: d.version.Load(),
		Frames: st.Frames, Episodes: st.Episodes, MeanEpisodeReturn: st.MeanReturn, MeanEpisodeLength: st.MeanLength,
		FramesPerSecond: st.FramesPerSecond(), RateLimited: st.RateLimited, RateLimitWaitSeconds: st.RateLimitWait.Seconds(),
	}, nil
}

var errBadWeights = fmt.Errorf("bad weights: %w", storage.ErrInvalidBatch)

// demoRateLimit is the demo buffer's rate limit for --demo-spi: the first
// sample waits for 1,000 rows, and either side may run two 256-row
// collector batches ahead of the ratio.
func demoRateLimit(spi float64) *ratelimit.Params {
	return &ratelimit.Params{SamplesPerInsert: spi, MinSize: 1000, ErrorBuffer: max(2*256*spi, 1024)}
}
