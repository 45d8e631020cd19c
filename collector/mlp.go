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

// MLPQ is an epsilon-greedy policy over a small Q-network with one hidden
// ReLU layer, for discrete actions:
//
//	Q(o) = relu(o·W1 + b1)·W2 + b2
//
// with W1 [obsDim, hidden], b1 [hidden], W2 [hidden, actions] and
// b2 [actions] (tensors "w1", "b1", "w2", "b2" for SetWeights). Pixel
// observations enter scaled to [0, 1]. The forward pass is a pair of
// gonum matrix products over the whole batch; weights can be replaced while
// a collector runs.
type MLPQ struct {
	// Epsilon is the probability of a uniformly random action.
	Epsilon float64

	obsDim, hidden, actions int
	weights                 atomic.Pointer[mlpWeights]
	scratch                 sync.Pool // *mlpScratch
}

type mlpWeights struct {
	w1, w2 *mat.Dense
	b1, b2 []float64
}

type mlpScratch struct {
	n       int
	x, h, q *mat.Dense
}

// NewMLPQ returns a network with weights drawn from seed (Glorot uniform,
// zero biases), so a fresh policy already prefers actions by state.
func NewMLPQ(obsDim, hidden, actions int, epsilon float64, seed uint64) *MLPQ {
	p := &MLPQ{Epsilon: epsilon, obsDim: obsDim, hidden: hidden, actions: actions}
	rng := rand.New(rand.NewPCG(seed, 0x6d6c70))
	glorot := func(r, c int) *mat.Dense {
		lim := math.Sqrt(6 / float64(r+c))
		d := make([]float64, r*c)
		for i := range d {
			d[i] = (2*rng.Float64() - 1) * lim
		}
		return mat.NewDense(r, c, d)
	}
	p.weights.Store(&mlpWeights{w1: glorot(obsDim, hidden), b1: make([]float64, hidden),
		w2: glorot(hidden, actions), b2: make([]float64, actions)})
	return p
}

func (p *MLPQ) shapes() map[string][]int {
	return map[string][]int{"w1": {p.obsDim, p.hidden}, "b1": {p.hidden}, "w2": {p.hidden, p.actions}, "b2": {p.actions}}
}

// SetWeights implements WeightSetter.
func (p *MLPQ) SetWeights(vals map[string][]float32, shapes map[string][]int) error {
	if err := checkWeights(vals, shapes, p.shapes()); err != nil {
		return err
	}
	p.weights.Store(&mlpWeights{
		w1: mat.NewDense(p.obsDim, p.hidden, toF64(vals["w1"])), b1: toF64(vals["b1"]),
		w2: mat.NewDense(p.hidden, p.actions, toF64(vals["w2"])), b2: toF64(vals["b2"]),
	})
	return nil
}

// Weights returns copies of the weights by name, with their shapes.
func (p *MLPQ) Weights() (map[string][]float32, map[string][]int) {
	w := p.weights.Load()
	return map[string][]float32{"w1": toF32(w.w1.RawMatrix().Data), "b1": toF32(w.b1),
		"w2": toF32(w.w2.RawMatrix().Data), "b2": toF32(w.b2)}, p.shapes()
}

// Q returns the Q-values of n observations (n rows of obsDim float32
// values), n rows of actions values.
func (p *MLPQ) Q(x []float32, n int) []float64 {
	s := p.forward(p.weights.Load(), x, n)
	out := append([]float64(nil), s.q.RawMatrix().Data...)
	p.scratch.Put(s)
	return out
}

func (p *MLPQ) forward(w *mlpWeights, x []float32, n int) *mlpScratch {
	s, _ := p.scratch.Get().(*mlpScratch)
	if s == nil || s.n != n {
		s = &mlpScratch{n: n, x: mat.NewDense(n, p.obsDim, nil), h: mat.NewDense(n, p.hidden, nil), q: mat.NewDense(n, p.actions, nil)}
	}
	xd := s.x.RawMatrix().Data
	for i, v := range x[:n*p.obsDim] {
		xd[i] = float64(v)
	}
	s.h.Mul(s.x, w.w1)
	hd := s.h.RawMatrix().Data
	for i := range hd {
		v := hd[i] + w.b1[i%p.hidden]
		hd[i] = max(v, 0)
	}
	s.q.Mul(s.h, w.w2)
	qd := s.q.RawMatrix().Data
	for i := range qd {
		qd[i] += w.b2[i%p.actions]
	}
	return s
}

// Act implements Policy.
func (p *MLPQ) Act(obs *Obs, act *envs.Actions, rng *rand.Rand) error {
	if obs.Spec.ObsElems() != p.obsDim || obs.Spec.NumActions != p.actions {
		return fmt.Errorf("MLP Q for %d inputs and %d actions cannot act in %s (%d inputs, %d actions)",
			p.obsDim, p.actions, obs.Spec.Name, obs.Spec.ObsElems(), obs.Spec.NumActions)
	}
	s := p.forward(p.weights.Load(), obs.Float32(), obs.N)
	epsilonGreedy(s.q.RawMatrix().Data, p.actions, p.Epsilon, act.Discrete[:obs.N], rng)
	p.scratch.Put(s)
	return nil
}
