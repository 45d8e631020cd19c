package collector

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// Policy maps a batch of observations to actions.
type Policy interface {
	// Act fills actions[i] for observation i (obs is row-major,
	// len(actions) rows of obsDim values).
	Act(obs []float32, obsDim int, actions []int64, rng *rand.Rand)
}

// RandomPolicy picks actions uniformly from [0, N).
type RandomPolicy struct{ N int }

// Act implements Policy.
func (p RandomPolicy) Act(_ []float32, _ int, actions []int64, rng *rand.Rand) {
	for i := range actions {
		actions[i] = int64(rng.IntN(p.N))
	}
}

// LinearQ is an epsilon-greedy policy over a linear Q-function
// Q(o, a) = o·W[:, a] + B[a]. Its weights can be replaced while a collector
// runs (weight sync from a learner); Act sees either the old or the new
// weights, never a mix.
type LinearQ struct {
	Epsilon float64
	mu      sync.RWMutex
	w       []float32 // [obsDim, actions], row-major
	b       []float32 // [actions]
	obsDim  int
	actions int
}

// NewLinearQ returns a policy with zero weights (every action ties; ties
// break towards action 0, so exploration comes from Epsilon).
func NewLinearQ(obsDim, actions int, epsilon float64) *LinearQ {
	return &LinearQ{Epsilon: epsilon, w: make([]float32, obsDim*actions), b: make([]float32, actions), obsDim: obsDim, actions: actions}
}

// WeightsError reports weights of the wrong name or shape.
type WeightsError struct{ Msg string }

func (e *WeightsError) Error() string { return e.Msg }

// SetWeights replaces W ([obsDim, actions]) and B ([actions]).
func (p *LinearQ) SetWeights(w, b []float32, wShape, bShape []int) error {
	if len(wShape) != 2 || wShape[0] != p.obsDim || wShape[1] != p.actions || len(w) != p.obsDim*p.actions {
		return &WeightsError{fmt.Sprintf("w: shape %v, want [%d %d]", wShape, p.obsDim, p.actions)}
	}
	if len(bShape) != 1 || bShape[0] != p.actions || len(b) != p.actions {
		return &WeightsError{fmt.Sprintf("b: shape %v, want [%d]", bShape, p.actions)}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.w = append([]float32(nil), w...)
	p.b = append([]float32(nil), b...)
	return nil
}

// Weights returns copies of W and B.
func (p *LinearQ) Weights() (w, b []float32) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]float32(nil), p.w...), append([]float32(nil), p.b...)
}

// Act implements Policy.
func (p *LinearQ) Act(obs []float32, obsDim int, actions []int64, rng *rand.Rand) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for i := range actions {
		if rng.Float64() < p.Epsilon {
			actions[i] = int64(rng.IntN(p.actions))
			continue
		}
		o := obs[i*obsDim : (i+1)*obsDim]
		best, bestQ := 0, float32(0)
		for a := 0; a < p.actions; a++ {
			q := p.b[a]
			for k, v := range o {
				q += v * p.w[k*p.actions+a]
			}
			if a == 0 || q > bestQ {
				best, bestQ = a, q
			}
		}
		actions[i] = int64(best)
	}
}
