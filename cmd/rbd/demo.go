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
	"time"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/internal/series"
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
	env             string
	obsDim, actions int
	// stateSize is the recurrent state the demo buffer stores per row
	// (recurrent_state, --demo-hidden) with --demo-env cartpole-masked;
	// 0 otherwise. Only then may a learner push a GRU.
	stateSize int
	mu        sync.Mutex // serialises updates
	active    atomic.Pointer[demoPolicy]
	version   atomic.Int64
	stats     atomic.Pointer[collector.Stats]
	// history is the last minutes of frames, episodes, mean return and
	// mean length, a point per second with a batch (the dashboard's
	// learning curve).
	history *series.Ring
}

// demoPolicy is one version of the demo's policy.
type demoPolicy struct {
	kind    string // "linear", "mlp" or "gru"
	hidden  int
	epsilon float64
	act     collector.Policy
	// weights are the tensors it was built from, kept so that an update
	// of epsilon alone can rebuild it.
	weights map[string][]float32
	shapes  map[string][]int
}

// newDemoCollector returns the demo's policy for env, starting from zero
// weights: the linear Q policy, or with stateSize > 0 a GRU of that width
// (every action ties, so the collector pushes left but for epsilon).
func newDemoCollector(spec envs.Spec, stateSize int) *demoCollector {
	d := &demoCollector{env: spec.Name, obsDim: spec.ObsElems(), actions: spec.NumActions, stateSize: stateSize}
	p := &demoPolicy{kind: "linear", epsilon: demoEpsilon, act: collector.NewLinearQ(d.obsDim, d.actions, demoEpsilon)}
	if stateSize > 0 {
		g := collector.NewGRUQ(d.obsDim, stateSize, d.actions, demoEpsilon, 0)
		w, sh := g.Weights()
		for _, v := range w {
			clear(v)
		}
		if err := g.SetWeights(w, sh); err != nil {
			panic("demo: zero GRU weights refused: " + err.Error())
		}
		p = &demoPolicy{kind: "gru", hidden: stateSize, epsilon: demoEpsilon, act: g, weights: w, shapes: sh}
	}
	d.active.Store(p)
	d.stats.Store(&collector.Stats{})
	d.history = series.New(storage.ActivityWindow, 4)
	return d
}

// policy is what the collector runs: the demo itself, or with a recurrent
// state the demo as a collector.RecurrentPolicy.
func (d *demoCollector) policy() collector.Policy {
	if d.stateSize > 0 {
		return recurrentDemo{d}
	}
	return d
}

// recurrentDemo is the demo collector of a buffer with recurrent states:
// a GRU the learner pushed carries them; a linear or MLP policy has none,
// so its rows store zero states.
type recurrentDemo struct{ *demoCollector }

// StateSize implements collector.RecurrentPolicy.
func (r recurrentDemo) StateSize() int { return r.stateSize }

// ActRecurrent implements collector.RecurrentPolicy.
func (r recurrentDemo) ActRecurrent(obs *collector.Obs, state, next []float32, act *envs.Actions, rng *rand.Rand) error {
	p := r.active.Load().act
	if rp, ok := p.(collector.RecurrentPolicy); ok {
		return rp.ActRecurrent(obs, state, next, act, rng)
	}
	clear(next[:obs.N*r.stateSize])
	return p.Act(obs, act, rng)
}

// Act implements collector.Policy with whatever policy is active.
func (d *demoCollector) Act(obs *collector.Obs, act *envs.Actions, rng *rand.Rand) error {
	return d.active.Load().act.Act(obs, act, rng)
}

// observe records the collector's stats after each batch (and while its
// writes are held back by the rate limiter).
func (d *demoCollector) observe(st collector.Stats) {
	d.stats.Store(&st)
	d.history.SetAll(time.Now(), float64(st.Frames), float64(st.Episodes), st.MeanReturn, st.MeanLength)
}

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
	case w["w_ih"] != nil || w["w_hh"] != nil || w["w_q"] != nil:
		kind = "gru"
	default:
		return fmt.Errorf("tensors %v: want w1, b1, w2, b2 (an MLP), w, b (linear), w_ih, w_hh, b_ih, b_hh, w_q, b_q (a GRU, with --demo-env cartpole-masked) and/or epsilon: %w",
			slices.Sorted(maps.Keys(w)), errBadWeights)
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
	case "gru":
		if d.stateSize == 0 {
			return fmt.Errorf("GRU weights: the demo buffer stores no recurrent state (serve --demo --demo-env cartpole-masked): %w", errBadWeights)
		}
		if s := sh["w_hh"]; len(s) != 2 || s[0] != d.stateSize {
			return fmt.Errorf("tensor \"w_hh\": shape %v, want [%d, %d]: the demo buffer's recurrent_state holds %d values (--demo-hidden): %w",
				s, d.stateSize, 3*d.stateSize, d.stateSize, errBadWeights)
		}
		p := collector.NewGRUQ(d.obsDim, d.stateSize, d.actions, eps, 0)
		if err := p.SetWeights(w, sh); err != nil {
			return fmt.Errorf("%v: %w", err, errBadWeights)
		}
		next.act, next.hidden = p, d.stateSize
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
		Name: "demo", Env: d.env, Envs: demoEnvs, Buffer: "demo",
		Policy: p.kind, Hidden: p.hidden, Epsilon: p.epsilon, WeightsVersion: d.version.Load(),
		Frames: st.Frames, Episodes: st.Episodes, MeanEpisodeReturn: st.MeanReturn, MeanEpisodeLength: st.MeanLength,
		FramesPerSecond: st.FramesPerSecond(), RateLimited: st.RateLimited, RateLimitWaitSeconds: st.RateLimitWait.Seconds(),
	}, nil
}

// Collectors implements server.CollectorHistory.
func (d *demoCollector) Collectors() []string { return []string{"demo"} }

// CollectorActivity implements server.CollectorHistory.
func (d *demoCollector) CollectorActivity(name string, since int64) (server.CollectorActivity, error) {
	if _, err := d.CollectorInfo(name); err != nil {
		return server.CollectorActivity{}, err
	}
	t, cols := d.history.Columns(since)
	return server.CollectorActivity{T: t, Frames: cols[0], Episodes: cols[1], MeanEpisodeReturn: cols[2], MeanEpisodeLength: cols[3]}, nil
}

var errBadWeights = fmt.Errorf("bad weights: %w", storage.ErrInvalidBatch)

// demoRateLimit is the demo buffer's rate limit for --demo-spi: the first
// sample waits for 1,000 rows, and either side may run two 256-row
// collector batches ahead of the ratio.
func demoRateLimit(spi float64) *ratelimit.Params {
	return &ratelimit.Params{SamplesPerInsert: spi, MinSize: 1000, ErrorBuffer: max(2*256*spi, 1024)}
}
