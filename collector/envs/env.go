package envs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"
)

// Spec describes an environment: what an observation is and what actions it
// takes. Observations travel as little-endian bytes in ObsDType (what a
// buffer stores), actions as int64 (discrete) or float32 (continuous).
type Spec struct {
	// Name is the registry name ("cartpole", "cartpole-masked", "pendulum",
	// "catch").
	Name string
	// ObsDType is "float32" or "uint8".
	ObsDType string
	// ObsShape is the shape of one observation.
	ObsShape []int
	// NumActions > 0 means discrete actions 0..NumActions-1 (an int64
	// scalar per step).
	NumActions int
	// ActionShape, for continuous envs, is the shape of one float32
	// action; every element lies in [ActionLow, ActionHigh].
	ActionShape           []int
	ActionLow, ActionHigh float32
	// MaxEpisodeSteps is the env's own time limit (truncation), 0 if none.
	MaxEpisodeSteps int
	// Pixels marks image observations.
	Pixels bool
	// FrameStack > 1 means an observation stacks the last FrameStack
	// frames along axis 0, oldest first (a reset repeats the first frame).
	FrameStack int
}

// Discrete reports whether actions are discrete.
func (s Spec) Discrete() bool { return s.NumActions > 0 }

// ObsElems is the number of elements in one observation.
func (s Spec) ObsElems() int { return prod(s.ObsShape) }

// ObsBytes is the size of one observation in bytes.
func (s Spec) ObsBytes() int { return s.ObsElems() * dtypeSize(s.ObsDType) }

// ActionElems is the number of elements of one action: 1 for discrete
// envs.
func (s Spec) ActionElems() int {
	if s.Discrete() {
		return 1
	}
	return prod(s.ActionShape)
}

// Clone returns a copy sharing no memory with s.
func (s Spec) Clone() Spec {
	c := s
	c.ObsShape = slices.Clone(s.ObsShape)
	c.ActionShape = slices.Clone(s.ActionShape)
	return c
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func dtypeSize(dt string) int {
	switch dt {
	case "uint8":
		return 1
	case "float32":
		return 4
	}
	panic("envs: unsupported observation dtype " + dt)
}

// Actions is a batch of actions, one per env copy. Exactly one of the two
// slices is used, by the env's kind.
type Actions struct {
	// Discrete holds one action per copy (len NumEnvs).
	Discrete []int64
	// Continuous holds ActionElems values per copy, copy-major.
	Continuous []float32
}

// NewActions returns an Actions sized for n copies of spec.
func NewActions(spec Spec, n int) *Actions {
	if spec.Discrete() {
		return &Actions{Discrete: make([]int64, n)}
	}
	return &Actions{Continuous: make([]float32, n*spec.ActionElems())}
}

// StepResult receives one step of every copy. The caller owns the memory;
// the env writes into it.
type StepResult struct {
	// Obs receives each copy's next observation (NumEnvs*ObsBytes bytes,
	// copy-major). For a copy that ended (terminated or truncated) it is the
	// final observation of the episode; the env is not reset.
	Obs []byte
	// Reward, Terminated and Truncated have one entry per copy.
	Reward     []float32
	Terminated []bool
	Truncated  []bool
}

// NewStepResult returns a StepResult sized for n copies of spec.
func NewStepResult(spec Spec, n int) *StepResult {
	return &StepResult{Obs: make([]byte, n*spec.ObsBytes()), Reward: make([]float32, n),
		Terminated: make([]bool, n), Truncated: make([]bool, n)}
}

// Env is a batch of NumEnvs copies of one environment, stepped together.
// Copies do not reset themselves: the caller resets the copies that ended,
// after reading their final observation. An Env is used by one goroutine
// at a time.
type Env interface {
	Spec() Spec
	NumEnvs() int
	// Seed reseeds every copy: copy i draws from a stream derived from
	// (seed, i) only, so a copy's episodes do not depend on the others.
	Seed(seed uint64)
	// Reset starts a new episode in every copy i with mask[i] true (every
	// copy when mask is nil) and writes its first observation to
	// obs[i*ObsBytes:]; the other copies' bytes are left alone.
	Reset(mask []bool, obs []byte) error
	// Step advances every copy by one step with its action.
	Step(act *Actions, out *StepResult) error
	// Close releases the env's goroutines, if any.
	Close() error
}

// Copy is one copy of an environment, the unit Vector batches.
type Copy interface {
	// Reset starts an episode, drawing from rng, and writes the first
	// observation to obs.
	Reset(rng *rand.Rand, obs []byte)
	// Step applies one action (act holds ActionElems values; for discrete
	// envs act is nil and a the action) and writes the next observation.
	Step(a int64, act []float32, obs []byte) (reward float32, terminated, truncated bool)
}

// Vector batches NumEnvs copies. With more than one worker it steps
// disjoint ranges of copies in parallel goroutines (each copy owns its
// state and random stream, so results do not depend on the number of
// workers).
type Vector struct {
	spec   Spec
	copies []Copy
	rngs   []*rand.Rand
	pcgs   []*rand.PCG
	obsB   int

	pool *pool
	// auto: the first probeSteps steps run serially and are timed; if a
	// step (of all copies) took longer than ParallelMinStep on average,
	// later steps run on a pool.
	auto       bool
	probeSteps int
	probeTime  time.Duration
	// The jobs as func values, made once: a method value made per call
	// would allocate on every step.
	stepJob, resetJob func(lo, hi int)
	// job arguments, read by workers between start and done
	act  *Actions
	out  *StepResult
	mask []bool
	obs  []byte
}

// ParallelMinStep is the step time (all copies, stepped serially) above
// which a Vector with automatic workers steps copies in parallel: handing
// a step to another goroutine costs a few microseconds (more on a busy
// machine), so only steps well above that gain from it.
const ParallelMinStep = 100 * time.Microsecond

// probeSteps is how many steps an automatic Vector times before choosing.
const probeSteps = 32

// NewVector returns a Vector over copies. workers is the number of
// goroutines that step copies: 1 steps them in the caller's goroutine, k >
// 1 on k goroutines, and 0 chooses by measurement: the first steps run
// serially and are timed, and if a step takes more than ParallelMinStep,
// the rest run on min(GOMAXPROCS, NumEnvs) goroutines.
func NewVector(spec Spec, copies []Copy, workers int) *Vector {
	n := len(copies)
	auto := workers <= 0
	if auto {
		workers = 1
	}
	workers = max(1, min(workers, n))
	v := &Vector{spec: spec.Clone(), copies: copies, obsB: spec.ObsBytes(), auto: auto && n > 1 && runtime.GOMAXPROCS(0) > 1,
		rngs: make([]*rand.Rand, n), pcgs: make([]*rand.PCG, n)}
	for i := range v.rngs {
		v.pcgs[i] = rand.NewPCG(0, uint64(i)+1)
		v.rngs[i] = rand.New(v.pcgs[i])
	}
	v.stepJob, v.resetJob = v.stepRange, v.resetRange
	if workers > 1 {
		v.pool = newPool(n, workers)
	}
	return v
}

// Spec implements Env.
func (v *Vector) Spec() Spec { return v.spec.Clone() }

// NumEnvs implements Env.
func (v *Vector) NumEnvs() int { return len(v.copies) }

// Workers is the number of goroutines that step copies.
func (v *Vector) Workers() int {
	if v.pool == nil {
		return 1
	}
	return v.pool.workers
}

// Seed implements Env: copy i draws from PCG(seed, i+1).
func (v *Vector) Seed(seed uint64) {
	for i, p := range v.pcgs {
		p.Seed(seed, uint64(i)+1)
	}
}

// Reset implements Env.
func (v *Vector) Reset(mask []bool, obs []byte) error {
	if mask != nil && len(mask) != len(v.copies) {
		return fmt.Errorf("envs: reset mask has %d entries for %d copies", len(mask), len(v.copies))
	}
	if len(obs) < len(v.copies)*v.obsB {
		return fmt.Errorf("envs: reset buffer has %d bytes, want %d", len(obs), len(v.copies)*v.obsB)
	}
	v.mask, v.obs = mask, obs
	return v.run(v.resetJob)
}

func (v *Vector) resetRange(lo, hi int) {
	for i := lo; i < hi; i++ {
		if v.mask == nil || v.mask[i] {
			v.copies[i].Reset(v.rngs[i], v.obs[i*v.obsB:(i+1)*v.obsB])
		}
	}
}

// Step implements Env.
func (v *Vector) Step(act *Actions, out *StepResult) error {
	n := len(v.copies)
	if v.spec.Discrete() && len(act.Discrete) < n || !v.spec.Discrete() && len(act.Continuous) < n*v.spec.ActionElems() {
		return fmt.Errorf("envs: %s: too few actions for %d copies", v.spec.Name, n)
	}
	if len(out.Obs) < n*v.obsB || len(out.Reward) < n || len(out.Terminated) < n || len(out.Truncated) < n {
		return errors.New("envs: step result too small for the copies")
	}
	v.act, v.out = act, out
	if v.auto && v.pool == nil && v.probeSteps < probeSteps {
		t0 := time.Now()
		err := v.run(v.stepJob)
		v.probeTime += time.Since(t0)
		if v.probeSteps++; v.probeSteps == probeSteps && v.probeTime/probeSteps > ParallelMinStep {
			v.pool = newPool(len(v.copies), min(runtime.GOMAXPROCS(0), len(v.copies)))
		}
		return err
	}
	return v.run(v.stepJob)
}

func (v *Vector) stepRange(lo, hi int) {
	k := v.spec.ActionElems()
	for i := lo; i < hi; i++ {
		var a int64
		var c []float32
		if v.spec.Discrete() {
			a = v.act.Discrete[i]
		} else {
			c = v.act.Continuous[i*k : (i+1)*k]
		}
		r, term, trunc := v.copies[i].Step(a, c, v.out.Obs[i*v.obsB:(i+1)*v.obsB])
		v.out.Reward[i], v.out.Terminated[i], v.out.Truncated[i] = r, term, trunc
	}
}

func (v *Vector) run(job func(lo, hi int)) error {
	if v.pool == nil {
		return guard(job, 0, len(v.copies))
	}
	return v.pool.run(job)
}

// Close implements Env: it stops the worker goroutines.
func (v *Vector) Close() error {
	if v.pool != nil {
		v.pool.close()
		v.pool = nil
	}
	return nil
}

// guard runs job and turns a panic into an error, so that a broken env
// stops a collector with an error instead of taking the process down from
// a worker goroutine.
func guard(job func(lo, hi int), lo, hi int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("envs: env copies %d..%d panicked: %v", lo, hi-1, r)
		}
	}()
	job(lo, hi)
	return nil
}

// Options configures New.
type Options struct {
	// Workers is the number of goroutines stepping copies (see NewVector);
	// 0 chooses by measuring the first steps.
	Workers int
	// FrameStack is the number of frames a pixel observation stacks along
	// axis 0 (catch only); 0 or 1 means a single frame [84, 84].
	FrameStack int
}

// Names lists the built-in envs.
var Names = []string{"cartpole", "cartpole-masked", "pendulum", "catch"}

// New returns n copies of the built-in env name, batched. opts may be nil.
func New(name string, n int, opts *Options) (*Vector, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if n < 1 {
		return nil, fmt.Errorf("envs: %d copies; want at least 1", n)
	}
	if o.FrameStack != 0 && name != "catch" {
		return nil, fmt.Errorf("envs: %s: frame stacking applies to pixel envs (catch) only", name)
	}
	copies := make([]Copy, n)
	var spec Spec
	switch name {
	case "cartpole":
		spec = CartPoleSpec()
		for i := range copies {
			copies[i] = &cartPoleCopy{}
		}
	case "cartpole-masked":
		spec = CartPoleMaskedSpec()
		for i := range copies {
			copies[i] = &cartPoleMaskedCopy{}
		}
	case "pendulum":
		spec = PendulumSpec()
		for i := range copies {
			copies[i] = &pendulumCopy{}
		}
	case "catch":
		if o.FrameStack < 0 || o.FrameStack > 16 {
			return nil, fmt.Errorf("envs: catch: frame stack %d; want 0..16", o.FrameStack)
		}
		spec = CatchSpec(o.FrameStack)
		for i := range copies {
			copies[i] = &catchCopy{c: NewCatch(nil, o.FrameStack)}
		}
	default:
		return nil, fmt.Errorf("envs: unknown env %q (built in: cartpole, cartpole-masked, pendulum, catch)", name)
	}
	return NewVector(spec, copies, o.Workers), nil
}
