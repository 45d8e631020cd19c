package collector

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"gonum.org/v1/gonum/mat"

	"github.com/rbdb/rbd/collector/envs"
)

// RecurrentPolicy is a policy that carries a hidden state per env copy
// from step to step. The collector owns the states: it passes each copy's
// state before the step, stores it with the row (the buffer's
// recurrent-state field), and zeroes it where a trajectory starts. The
// policy only computes; it keeps no per-copy state of its own, so a run can
// be replayed from stored states.
type RecurrentPolicy interface {
	Policy
	// StateSize is the number of float32 values in one copy's state.
	StateSize() int
	// ActRecurrent chooses obs.N actions from the observations and the
	// states before the step (state: obs.N rows of StateSize values) and
	// writes each copy's state after the step into next (same layout).
	// It must be a pure function of its inputs and the weights: the same
	// observation and state give the same next state, whatever else is in
	// the batch.
	ActRecurrent(obs *Obs, state, next []float32, act *envs.Actions, rng *rand.Rand) error
}

// GRUQ is an epsilon-greedy Q policy with a GRU cell, for discrete actions
// in partially observable envs (cartpole-masked):
//
//	r  = sigmoid(x·Wir + bir + h·Whr + bhr)
//	z  = sigmoid(x·Wiz + biz + h·Whz + bhz)
//	n  = tanh(x·Win + bin + r * (h·Whn + bhn))
//	h' = (1 - z) * n + z * h
//	Q  = h'·Wq + bq
//
// the gate equations and gate order (r, z, n) of PyTorch's nn.GRU, with
// matrices stored [inputs, outputs] like MLPQ's. Tensors for SetWeights:
// "w_ih" [obsDim, 3H], "w_hh" [H, 3H], "b_ih" [3H], "b_hh" [3H] (columns
// r, z, n), "w_q" [H, actions], "b_q" [actions]. A step acts on the Q
// values of h', the state after seeing the observation. The new state is
// rounded to float32 before it is returned, so the state carried to the
// next step is exactly the one stored: a replay from a stored state gives
// the same states bit for bit. The products run batched over copies with
// gonum; weights can be replaced while a collector runs.
type GRUQ struct {
	// Epsilon is the probability of a uniformly random action.
	Epsilon float64

	obsDim, hidden, actions int
	weights                 atomic.Pointer[gruWeights]
	scratch                 sync.Pool // *gruScratch
}

type gruWeights struct {
	wih, whh, wq *mat.Dense
	bih, bhh, bq []float64
}

type gruScratch struct {
	n                   int
	x, h, gi, gh, hn, q *mat.Dense
}

// NewGRUQ returns a GRU Q policy with weights drawn from seed (uniform in
// ±1/sqrt(H) as nn.GRU initialises, Glorot for the Q head, zero head bias).
func NewGRUQ(obsDim, hidden, actions int, epsilon float64, seed uint64) *GRUQ {
	p := &GRUQ{Epsilon: epsilon, obsDim: obsDim, hidden: hidden, actions: actions}
	rng := rand.New(rand.NewPCG(seed, 0x677275))
	uniform := func(n int, lim float64) []float64 {
		d := make([]float64, n)
		for i := range d {
			d[i] = (2*rng.Float64() - 1) * lim
		}
		return d
	}
	k := 1 / math.Sqrt(float64(hidden))
	p.weights.Store(&gruWeights{
		wih: mat.NewDense(obsDim, 3*hidden, uniform(obsDim*3*hidden, k)),
		whh: mat.NewDense(hidden, 3*hidden, uniform(hidden*3*hidden, k)),
		bih: uniform(3*hidden, k), bhh: uniform(3*hidden, k),
		wq: mat.NewDense(hidden, actions, uniform(hidden*actions, math.Sqrt(6/float64(hidden+actions)))),
		bq: make([]float64, actions),
	})
	return p
}

// StateSize implements RecurrentPolicy: the hidden width H.
func (p *GRUQ) StateSize() int { return p.hidden }

func (p *GRUQ) shapes() map[string][]int {
	h3 := 3 * p.hidden
	return map[string][]int{
		"w_ih": {p.obsDim, h3}, "w_hh": {p.hidden, h3}, "b_ih": {h3}, "b_hh": {h3},
		"w_q": {p.hidden, p.actions}, "b_q": {p.actions},
	}
}

// SetWeights implements WeightSetter.
func (p *GRUQ) SetWeights(vals map[string][]float32, shapes map[string][]int) error {
	if err := checkWeights(vals, shapes, p.shapes()); err != nil {
		return err
	}
	h3 := 3 * p.hidden
	p.weights.Store(&gruWeights{
		wih: mat.NewDense(p.obsDim, h3, toF64(vals["w_ih"])), whh: mat.NewDense(p.hidden, h3, toF64(vals["w_hh"])),
		bih: toF64(vals["b_ih"]), bhh: toF64(vals["b_hh"]),
		wq: mat.NewDense(p.hidden, p.actions, toF64(vals["w_q"])), bq: toF64(vals["b_q"]),
	})
	return nil
}

// Weights returns copies of the weights by name, with their shapes.
func (p *GRUQ) Weights() (map[string][]float32, map[string][]int) {
	w := p.weights.Load()
	return map[string][]float32{
		"w_ih": toF32(w.wih.RawMatrix().Data), "w_hh": toF32(w.whh.RawMatrix().Data),
		"b_ih": toF32(w.bih), "b_hh": toF32(w.bhh),
		"w_q": toF32(w.wq.RawMatrix().Data), "b_q": toF32(w.bq),
	}, p.shapes()
}

// Step computes the states after n observations x (n rows of obsDim
// values) from the states before them h (n rows of H) into next, and
// returns the Q values of the new states (n rows of actions values). It is
// what ActRecurrent runs, exported so that a test or a learner can replay
// stored trajectories.
func (p *GRUQ) Step(x, h []float32, n int, next []float32) []float64 {
	s := p.forward(p.weights.Load(), x, h, n, next)
	q := append([]float64(nil), s.q.RawMatrix().Data...)
	p.scratch.Put(s)
	return q
}

// ActRecurrent implements RecurrentPolicy.
func (p *GRUQ) ActRecurrent(obs *Obs, state, next []float32, act *envs.Actions, rng *rand.Rand) error {
	if obs.Spec.ObsElems() != p.obsDim || obs.Spec.NumActions != p.actions {
		return fmt.Errorf("GRU Q for %d inputs and %d actions cannot act in %s (%d inputs, %d actions)",
			p.obsDim, p.actions, obs.Spec.Name, obs.Spec.ObsElems(), obs.Spec.NumActions)
	}
	if len(state) < obs.N*p.hidden || len(next) < obs.N*p.hidden {
		return fmt.Errorf("GRU Q with %d hidden units: states for %d copies hold %d and %d values, want %d",
			p.hidden, obs.N, len(state), len(next), obs.N*p.hidden)
	}
	s := p.forward(p.weights.Load(), obs.Float32(), state, obs.N, next)
	epsilonGreedy(s.q.RawMatrix().Data, p.actions, p.Epsilon, act.Discrete[:obs.N], rng)
	p.scratch.Put(s)
	return nil
}

// Act implements Policy for callers that do not carry states: every step
// starts from the zero state, so the policy sees only the current
// observation. The collector calls ActRecurrent instead.
func (p *GRUQ) Act(obs *Obs, act *envs.Actions, rng *rand.Rand) error {
	zero := make([]float32, obs.N*p.hidden)
	return p.ActRecurrent(obs, zero, make([]float32, obs.N*p.hidden), act, rng)
}

func (p *GRUQ) forward(w *gruWeights, x, h []float32, n int, next []float32) *gruScratch {
	H := p.hidden
	s, _ := p.scratch.Get().(*gruScratch)
	if s == nil || s.n != n {
		s = &gruScratch{n: n, x: mat.NewDense(n, p.obsDim, nil), h: mat.NewDense(n, H, nil),
			gi: mat.NewDense(n, 3*H, nil), gh: mat.NewDense(n, 3*H, nil),
			hn: mat.NewDense(n, H, nil), q: mat.NewDense(n, p.actions, nil)}
	}
	xd, hd := s.x.RawMatrix().Data, s.h.RawMatrix().Data
	for i, v := range x[:n*p.obsDim] {
		xd[i] = float64(v)
	}
	for i, v := range h[:n*H] {
		hd[i] = float64(v)
	}
	s.gi.Mul(s.x, w.wih)
	s.gh.Mul(s.h, w.whh)
	gi, gh, hn := s.gi.RawMatrix().Data, s.gh.RawMatrix().Data, s.hn.RawMatrix().Data
	for i := range n {
		gir, ghr := gi[i*3*H:(i+1)*3*H], gh[i*3*H:(i+1)*3*H]
		for j := range H {
			r := sigmoid(gir[j] + w.bih[j] + ghr[j] + w.bhh[j])
			z := sigmoid(gir[H+j] + w.bih[H+j] + ghr[H+j] + w.bhh[H+j])
			c := math.Tanh(gir[2*H+j] + w.bih[2*H+j] + r*(ghr[2*H+j]+w.bhh[2*H+j]))
			v := float32((1-z)*c + z*hd[i*H+j])
			next[i*H+j] = v
			hn[i*H+j] = float64(v)
		}
	}
	s.q.Mul(s.hn, w.wq)
	qd := s.q.RawMatrix().Data
	for i := range qd {
		qd[i] += w.bq[i%p.actions]
	}
	return s
}

func sigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

func toF64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func toF32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}
