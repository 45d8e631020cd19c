package collector

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/rbdb/rbd/collector/envs"
)

// Obs is the batch of observations a policy acts on: one per env copy, as
// the env wrote them (little-endian bytes in the env's dtype). It is valid
// only during the Act call.
type Obs struct {
	// Spec is the env's spec (dtype and shape of one observation).
	Spec *envs.Spec
	// N is the number of observations.
	N int
	// Data holds N observations, copy-major.
	Data []byte

	f32     []float32 // decoded Data, reused across steps
	decoded bool
}

func (o *Obs) reset(data []byte) {
	o.Data, o.decoded = data, false
}

// Float32 returns the observations as float32, N rows of ObsElems values:
// float32 observations as they are, uint8 pixels scaled to [0, 1]. The
// slice is decoded once per step into memory the collector reuses.
func (o *Obs) Float32() []float32 {
	if o.decoded {
		return o.f32
	}
	n := o.N * o.Spec.ObsElems()
	if cap(o.f32) < n {
		o.f32 = make([]float32, n)
	}
	o.f32 = o.f32[:n]
	switch o.Spec.ObsDType {
	case "float32":
		for i := range o.f32 {
			o.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(o.Data[4*i:]))
		}
	case "uint8":
		for i := range o.f32 {
			o.f32[i] = float32(o.Data[i]) / 255
		}
	default:
		panic("collector: unsupported observation dtype " + o.Spec.ObsDType)
	}
	o.decoded = true
	return o.f32
}

// Policy maps a batch of observations to actions. Act fills act (sized for
// the batch: Discrete for discrete envs, Continuous otherwise) and may draw
// from rng, the collector's seeded random source. An error stops the
// collector.
type Policy interface {
	Act(obs *Obs, act *envs.Actions, rng *rand.Rand) error
}

// WeightSetter is a policy whose weights can be replaced while a collector
// runs it (weight sync from a learner). The new weights apply from the next
// step on; a step sees either the old or the new weights, never a mix.
type WeightSetter interface {
	// SetWeights replaces the weights by name. Tensors of the wrong name
	// or shape are a *WeightsError and leave the weights unchanged.
	SetWeights(vals map[string][]float32, shapes map[string][]int) error
}

// WeightsError reports weights of the wrong name or shape.
type WeightsError struct{ Msg string }

func (e *WeightsError) Error() string { return e.Msg }

// RandomPolicy draws actions uniformly: 0..NumActions-1 for discrete envs,
// each element in [ActionLow, ActionHigh) for continuous ones. The
// collector also uses it during init_random_frames.
type RandomPolicy struct{ Spec envs.Spec }

// Act implements Policy.
func (p RandomPolicy) Act(_ *Obs, act *envs.Actions, rng *rand.Rand) error {
	if p.Spec.Discrete() {
		for i := range act.Discrete {
			act.Discrete[i] = int64(rng.IntN(p.Spec.NumActions))
		}
		return nil
	}
	lo, span := p.Spec.ActionLow, p.Spec.ActionHigh-p.Spec.ActionLow
	for i := range act.Continuous {
		act.Continuous[i] = lo + span*rng.Float32()
	}
	return nil
}

// epsilonGreedy picks, for each of the n rows of q (actions values each),
// a uniform action with probability eps and otherwise the first action of
// largest value.
func epsilonGreedy[F float32 | float64](q []F, actions int, eps float64, out []int64, rng *rand.Rand) {
	for i := range out {
		if rng.Float64() < eps {
			out[i] = int64(rng.IntN(actions))
			continue
		}
		row := q[i*actions : (i+1)*actions]
		best := 0
		for a := 1; a < actions; a++ {
			if row[a] > row[best] {
				best = a
			}
		}
		out[i] = int64(best)
	}
}

// LinearQ is an epsilon-greedy policy over a linear Q-function
// Q(o, a) = o·W[:, a] + B[a] for discrete actions. Its weights can be
// replaced while a collector runs (SetWeights: "w" [obsDim, actions] and
// "b" [actions]).
type LinearQ struct {
	// Epsilon is the probability of a uniformly random action.
	Epsilon float64
	obsDim  int
	actions int
	weights atomic.Pointer[linearWeights]
}

type linearWeights struct {
	w []float32 // [obsDim, actions], row-major
	b []float32 // [actions]
}

// NewLinearQ returns a policy with zero weights (every action ties; ties
// break towards action 0, so exploration comes from epsilon).
func NewLinearQ(obsDim, actions int, epsilon float64) *LinearQ {
	p := &LinearQ{Epsilon: epsilon, obsDim: obsDim, actions: actions}
	p.weights.Store(&linearWeights{w: make([]float32, obsDim*actions), b: make([]float32, actions)})
	return p
}

// SetWeights implements WeightSetter with "w" float32 [obsDim, actions]
// and "b" float32 [actions].
func (p *LinearQ) SetWeights(vals map[string][]float32, shapes map[string][]int) error {
	if err := checkWeights(vals, shapes, map[string][]int{"w": {p.obsDim, p.actions}, "b": {p.actions}}); err != nil {
		return err
	}
	p.weights.Store(&linearWeights{w: slices.Clone(vals["w"]), b: slices.Clone(vals["b"])})
	return nil
}

// Weights returns copies of W and B.
func (p *LinearQ) Weights() (w, b []float32) {
	lw := p.weights.Load()
	return slices.Clone(lw.w), slices.Clone(lw.b)
}

// Act implements Policy.
func (p *LinearQ) Act(obs *Obs, act *envs.Actions, rng *rand.Rand) error {
	if obs.Spec.ObsElems() != p.obsDim || obs.Spec.NumActions != p.actions {
		return fmt.Errorf("linear Q for %d inputs and %d actions cannot act in %s (%d inputs, %d actions)",
			p.obsDim, p.actions, obs.Spec.Name, obs.Spec.ObsElems(), obs.Spec.NumActions)
	}
	lw := p.weights.Load()
	x := obs.Float32()
	out := act.Discrete[:obs.N]
	for i := range out {
		if rng.Float64() < p.Epsilon {
			out[i] = int64(rng.IntN(p.actions))
			continue
		}
		o := x[i*p.obsDim : (i+1)*p.obsDim]
		best, bestQ := 0, float32(0)
		for a := 0; a < p.actions; a++ {
			q := lw.b[a]
			for k, v := range o {
				q += v * lw.w[k*p.actions+a]
			}
			if a == 0 || q > bestQ {
				best, bestQ = a, q
			}
		}
		out[i] = int64(best)
	}
	return nil
}

// checkWeights checks that vals holds exactly the tensors of want, with
// their shapes and sizes.
func checkWeights(vals map[string][]float32, shapes map[string][]int, want map[string][]int) error {
	names := make([]string, 0, len(want))
	for k := range want {
		names = append(names, k)
	}
	sort.Strings(names)
	for k := range vals {
		if _, ok := want[k]; !ok {
			return &WeightsError{fmt.Sprintf("tensor %q: unknown (want %s)", k, strings.Join(names, ", "))}
		}
	}
	// Report in a fixed order: the first tensor of want's sorted names
	// that is wrong, except that "w" before "b" reads naturally.
	sort.Slice(names, func(i, j int) bool { return weightOrder(names[i]) < weightOrder(names[j]) })
	for _, k := range names {
		v, ok := vals[k]
		if !ok {
			return &WeightsError{fmt.Sprintf("tensor %q is required (want %s)", k, strings.Join(names, ", "))}
		}
		if !slices.Equal(shapes[k], want[k]) || len(v) != prodInts(want[k]) {
			return &WeightsError{fmt.Sprintf("%s: shape %v, want %v", k, shapes[k], want[k])}
		}
	}
	for k, v := range vals {
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return &WeightsError{fmt.Sprintf("%s: holds %v; weights must be finite", k, x)}
			}
		}
	}
	return nil
}

// weightOrder sorts weight names as layers read: w1 b1 w2 b2 (w before b
// within a layer).
func weightOrder(name string) string {
	if len(name) >= 1 && (name[0] == 'w' || name[0] == 'b') {
		layer := name[1:]
		kind := "0"
		if name[0] == 'b' {
			kind = "1"
		}
		return layer + kind
	}
	return name
}

func prodInts(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}
