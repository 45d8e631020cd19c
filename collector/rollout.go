package collector

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"time"

	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/storage"
)

// Env is a batch of env copies stepped together (see envs.Env).
type Env = envs.Env

// Config configures a collector run. The option names and meanings follow
// TorchRL's collectors; zero values mean the documented defaults.
type Config struct {
	// Env is the batch of env copies to step (required). Run seeds and
	// resets it; the caller closes it.
	Env Env
	// Policy chooses actions; nil means RandomPolicy.
	Policy Policy
	// Writer receives the batches (required).
	Writer Writer
	// Stream names the run's stream in the buffer: trajectory ids are
	// allocated by the store per (stream, env copy), so collectors with
	// distinct streams never collide. "" draws a random name.
	Stream string

	// FramesPerBatch is the number of frames (env steps, one row each)
	// per write. Each copy takes T = ceil(FramesPerBatch/NumEnvs) steps
	// per batch, so a batch holds T*NumEnvs frames. 0 means 256.
	FramesPerBatch int
	// TotalFrames stops the run once at least this many frames are
	// written (whole batches: rounded up to a multiple of the batch, as in
	// TorchRL). -1 (or 0) runs until the context ends.
	TotalFrames int64
	// MaxFramesPerTraj truncates trajectories at this many steps
	// (truncated = true on the step that reaches it; the copy is reset).
	// 0 means no limit beyond the env's own.
	MaxFramesPerTraj int
	// InitRandomFrames uses RandomPolicy instead of Policy while fewer
	// frames than this have been written (checked per batch, so it is
	// rounded up to whole batches, as TorchRL effectively does).
	InitRandomFrames int64
	// ResetAtEachIter resets every copy before each batch, so
	// trajectories never span batches. Each batch's last step is written
	// as truncated (with its final observation), so every batch starts
	// new trajectory ids.
	ResetAtEachIter bool
	// CompactObs leaves next.observation out of every row but done rows,
	// which carry the final observation (next.observation [D, ...] for
	// the D done rows); the buffer must be compact_obs.
	CompactObs bool
	// Seed seeds the env copies (copy i from (Seed, i)) and the policy's
	// random source: a run is a function of its seed.
	Seed uint64
	// MaxRate caps frames per second (0: no cap).
	MaxRate float64
	// StopGrace is how long the batch being written when the context
	// ends may still take before its write is cancelled. 0 means 10s.
	StopGrace time.Duration

	// BeforeBatch, if set, runs before each batch is collected (e.g. to
	// pull new policy weights). An error stops the run with it.
	BeforeBatch func(ctx context.Context, st Stats) error
	// AfterBatch, if set, runs after each batch is written. An error
	// stops the run with it.
	AfterBatch func(b *BatchInfo) error
	// PolicyVersion, if set, gives the version of the policy's weights; the
	// collector stamps each row with the version read just before the
	// policy acted on it (policy_version, for min_policy_version). A
	// weight update that lands between the read and the action labels that
	// step one version older than it is, never newer. Nil stamps 0.
	PolicyVersion func() int64
	// StateField names the buffer field (float32 [H]) that receives a
	// recurrent policy's state before each step; "" means
	// "recurrent_state". It is used only when Policy is a
	// RecurrentPolicy. See docs/recurrent.md for when states are zeroed
	// and when they are carried.
	StateField string
	// OnRateLimited, if set, runs each time the buffer's rate limiter
	// holds a write back (about once per writer wait, a second by
	// default): the run is waiting for learners. It must not block.
	OnRateLimited func(st Stats)
}

// BatchInfo is what AfterBatch sees.
type BatchInfo struct {
	// Stats are the run's totals, this batch included.
	Stats Stats
	// Batch is the batch as written. Its memory is reused for the next
	// batch: copy what must outlive the hook.
	Batch *storage.Batch
	// Result is the writer's answer.
	Result storage.ExtendResult
}

// Stats summarises a run so far.
type Stats struct {
	// Frames is the number of rows written.
	Frames int64
	// Batches is the number of batches written.
	Batches int64
	// Trajectories counts trajectories ended (done rows written), the
	// ones the collector cut included.
	Trajectories int64
	// Episodes counts episodes ended by the env or by MaxFramesPerTraj;
	// MeanReturn is the mean undiscounted return of the last 100 of them
	// and MeanLength their mean number of steps (both 0 before the first).
	Episodes   int64
	MeanReturn float64
	MeanLength float64
	// WriteCount is the buffer's write count after the last write.
	WriteCount int64
	// Stream is the stream the run writes to.
	Stream string
	// Elapsed is the run's wall time; CollectTime the part spent
	// stepping envs and policy, WriteTime the part spent in the writer.
	Elapsed, CollectTime, WriteTime time.Duration
	// RateLimitWait is the part of WriteTime the buffer's rate limiter
	// held writes back (waiting for learners; a writer over HTTP counts
	// only the waits that ended in a refusal, since the server's own wait
	// is not reported back); RateLimited tells whether
	// the batch being written now is held back.
	RateLimitWait time.Duration
	RateLimited   bool
	// HeldBack is the number of frames of the last batch that were not
	// written because the run was stopped while the rate limiter held
	// them back.
	HeldBack int64
}

// FramesPerSecond is Frames over Elapsed.
func (s Stats) FramesPerSecond() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Frames) / s.Elapsed.Seconds()
}

// Run steps cfg.Env with cfg.Policy and writes every step through
// cfg.Writer, one batch of FramesPerBatch frames at a time, until
// TotalFrames are written or ctx ends.
//
// When ctx ends, the batch under way is completed and written (its last
// step marked truncated, so no trajectory is left without its final
// observation) and Run returns nil. An error from the env, the policy, the
// writer or a hook stops the run and is returned; the batch under way is
// then not written. On return the stream's open trajectories are closed.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	r, err := newRunner(cfg)
	if err != nil {
		return Stats{}, err
	}
	return r.run(ctx)
}

// runner is one run's state. Everything per step lives in staging, sized
// once.
type runner struct {
	cfg    Config
	spec   envs.Spec
	n, T   int
	stream string
	policy Policy
	random RandomPolicy
	rng    *mrand.Rand

	// rec is Policy as a RecurrentPolicy (nil for stateless policies);
	// state holds each copy's state before the next step (n rows of H),
	// nextState the states the policy returns.
	rec              RecurrentPolicy
	state, nextState []float32

	st        *staging
	acts      *envs.Actions
	out       envs.StepResult
	obs       Obs
	mask      []bool
	stepCount []int
	ret       []float64
	returns   [100]float64
	lengths   [100]int
	nret      int

	stats Stats
	start time.Time
}

func newRunner(cfg Config) (*runner, error) {
	var errs []error
	if cfg.Env == nil {
		errs = append(errs, errors.New("Env is required"))
	}
	if cfg.Writer == nil {
		errs = append(errs, errors.New("Writer is required"))
	}
	if cfg.FramesPerBatch < 0 {
		errs = append(errs, fmt.Errorf("FramesPerBatch %d is negative", cfg.FramesPerBatch))
	}
	if cfg.MaxFramesPerTraj < 0 {
		errs = append(errs, fmt.Errorf("MaxFramesPerTraj %d is negative", cfg.MaxFramesPerTraj))
	}
	if cfg.MaxRate < 0 || math.IsNaN(cfg.MaxRate) {
		errs = append(errs, fmt.Errorf("MaxRate %v is negative", cfg.MaxRate))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("collector: %w", err)
	}
	n := cfg.Env.NumEnvs()
	if n < 1 {
		return nil, fmt.Errorf("collector: env has %d copies", n)
	}
	fpb := cfg.FramesPerBatch
	if fpb == 0 {
		fpb = 256
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	r := &runner{cfg: cfg, spec: cfg.Env.Spec(), n: n, T: (fpb + n - 1) / n, stream: cfg.Stream}
	if r.stream == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		r.stream = "collector-" + hex.EncodeToString(b[:])
	}
	r.random = RandomPolicy{Spec: r.spec}
	r.policy = cfg.Policy
	if r.policy == nil {
		r.policy = r.random
	}
	r.rng = mrand.New(mrand.NewPCG(cfg.Seed, 0xc011ec7))
	r.st = newStaging(r.spec, n, r.T, cfg.CompactObs)
	if rec, ok := r.policy.(RecurrentPolicy); ok {
		h := rec.StateSize()
		if h < 1 {
			return nil, fmt.Errorf("collector: recurrent policy has state size %d; want at least 1", h)
		}
		if cfg.StateField == "" {
			r.cfg.StateField = DefaultStateField
		}
		r.rec = rec
		r.state, r.nextState = make([]float32, n*h), make([]float32, n*h)
		r.st.addState(r.cfg.StateField, h)
	}
	if sw, ok := cfg.Writer.(interface{ BufferSpec() storage.Spec }); ok {
		if err := r.checkSpec(sw.BufferSpec()); err != nil {
			return nil, err
		}
	}
	r.acts = envs.NewActions(r.spec, n)
	r.out = envs.StepResult{Reward: make([]float32, n), Terminated: make([]bool, n), Truncated: make([]bool, n)}
	r.obs = Obs{Spec: &r.spec, N: n}
	r.mask = make([]bool, n)
	r.stepCount = make([]int, n)
	r.ret = make([]float64, n)
	return r, nil
}

func (r *runner) run(ctx context.Context) (st Stats, err error) {
	cfg := r.cfg
	r.start = time.Now()
	r.stats.Stream = r.stream
	if ctx.Err() != nil {
		return r.stats, nil
	}
	// A run always starts new trajectories, even on a stream a previous
	// run left open (after a clean close, persistent buffers keep them).
	if err := cfg.Writer.CloseStream(ctx, r.stream); err != nil {
		return Stats{}, fmt.Errorf("collector: close stream %q before starting: %w", r.stream, err)
	}
	open := false // whether the stream may hold open trajectories
	defer func() {
		if open {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			cerr := cfg.Writer.CloseStream(cctx, r.stream)
			cancel()
			if err == nil && cerr != nil {
				err = fmt.Errorf("collector: close stream %q: %w", r.stream, cerr)
			}
		}
		r.stats.Elapsed = time.Since(r.start)
		st = r.stats
	}()

	cfg.Env.Seed(cfg.Seed)
	if err := cfg.Env.Reset(nil, r.st.obsBlock(0)); err != nil {
		return r.stats, fmt.Errorf("collector: reset: %w", err)
	}
	for cfg.TotalFrames <= 0 || r.stats.Frames < cfg.TotalFrames {
		if ctx.Err() != nil {
			return r.stats, nil
		}
		if cfg.BeforeBatch != nil {
			if err := cfg.BeforeBatch(ctx, r.stats); err != nil {
				return r.stats, fmt.Errorf("collector: before batch %d: %w", r.stats.Batches, err)
			}
		}
		t0 := time.Now()
		last := cfg.TotalFrames > 0 && r.stats.Frames+int64(r.T*r.n) >= cfg.TotalFrames
		cut, err := r.collect(ctx, last)
		r.stats.CollectTime += time.Since(t0)
		if err != nil {
			return r.stats, err
		}
		open = true
		t1 := time.Now()
		res, err := r.write(ctx)
		r.stats.WriteTime += time.Since(t1)
		if errors.Is(err, errHeldBack) {
			// Stopped while waiting for learners: the batch is not
			// written, and its trajectories are closed (truncated) below.
			r.stats.HeldBack = int64(r.st.batch.Rows)
			return r.stats, nil
		}
		if err != nil {
			return r.stats, fmt.Errorf("collector: write batch %d: %w", r.stats.Batches, err)
		}
		open = !cut
		r.stats.Frames += int64(r.st.batch.Rows)
		r.stats.Batches++
		r.stats.WriteCount = res.WriteCount
		r.stats.MeanReturn, r.stats.MeanLength = r.recentEpisodes()
		r.stats.Elapsed = time.Since(r.start)
		if cfg.AfterBatch != nil {
			if err := cfg.AfterBatch(&BatchInfo{Stats: r.stats, Batch: &r.st.batch, Result: res}); err != nil {
				return r.stats, fmt.Errorf("collector: after batch %d: %w", r.stats.Batches-1, err)
			}
		}
		if cut && ctx.Err() != nil {
			return r.stats, nil
		}
		if cfg.MaxRate > 0 && !r.pace(ctx) {
			return r.stats, nil
		}
	}
	return r.stats, nil
}

// collect fills the staging buffers with one batch. last says this is
// the run's last batch. It reports whether the batch's last step was cut
// (marked truncated on every copy that was not done).
func (r *runner) collect(ctx context.Context, last bool) (cut bool, err error) {
	st, n := r.st, r.n
	st.startBatch()
	if r.stats.Batches > 0 {
		if r.cfg.ResetAtEachIter {
			if err := r.cfg.Env.Reset(nil, st.obsBlock(0)); err != nil {
				return false, fmt.Errorf("collector: reset: %w", err)
			}
			clear(r.stepCount)
			clear(r.ret)
			// Recurrent states are zero already: the previous batch's
			// last step was cut, which zeroes them like any done.
		} else {
			copy(st.obsBlock(0), st.obsBlock(r.T))
		}
	}
	random := r.stats.Frames < r.cfg.InitRandomFrames
	for t := 0; t < r.T; t++ {
		// The collector cuts a batch's last step when the copies will not
		// continue from it: a reset follows, or the run ends.
		cut = t == r.T-1 && (r.cfg.ResetAtEachIter || last || ctx.Err() != nil)
		r.obs.reset(st.obsBlock(t))
		if r.cfg.PolicyVersion != nil {
			st.putVersion(t, r.cfg.PolicyVersion())
		}
		if err := r.act(t, random); err != nil {
			return false, err
		}
		st.putActions(t, r.acts)
		next := st.nextBlock(t)
		r.out.Obs = next
		if err := r.cfg.Env.Step(r.acts, &r.out); err != nil {
			return false, fmt.Errorf("collector: step: %w", err)
		}
		anyDone := false
		for e := 0; e < n; e++ {
			term, trunc := r.out.Terminated[e], r.out.Truncated[e]
			rew := r.out.Reward[e]
			r.stepCount[e]++
			r.ret[e] += float64(rew)
			if m := r.cfg.MaxFramesPerTraj; m > 0 && r.stepCount[e] >= m {
				trunc = true
			}
			natural := term || trunc
			if cut && !natural {
				trunc = true
			}
			done := term || trunc
			st.putStep(t*n+e, rew, done, term, trunc)
			r.mask[e] = done
			if !done {
				continue
			}
			if r.rec != nil {
				// The next row of this copy starts a trajectory (step 0):
				// its state is zero, whether the env ended or the
				// collector cut.
				h := r.rec.StateSize()
				clear(r.nextState[e*h : (e+1)*h])
			}
			anyDone = true
			if r.cfg.CompactObs {
				st.tail = append(st.tail, next[e*st.obsB:(e+1)*st.obsB]...)
			}
			r.stats.Trajectories++
			if natural {
				r.addEpisode(r.ret[e], r.stepCount[e])
			}
			r.stepCount[e], r.ret[e] = 0, 0
		}
		if r.rec != nil {
			r.state, r.nextState = r.nextState, r.state
		}
		if !r.cfg.CompactObs {
			copy(st.obsBlock(t+1), next)
		}
		if anyDone && !cut {
			if err := r.cfg.Env.Reset(r.mask, st.obsBlock(t+1)); err != nil {
				return false, fmt.Errorf("collector: reset: %w", err)
			}
		}
	}
	st.finishBatch()
	return cut, nil
}

// DefaultStateField is the field a recurrent policy's states go to when
// Config.StateField is "".
const DefaultStateField = "recurrent_state"

// act chooses tick t's actions. A recurrent policy's states before the step
// are stored first; during InitRandomFrames a recurrent policy still runs
// (so the stored states are the ones it would have had) but the random
// policy's actions are taken.
func (r *runner) act(t int, random bool) error {
	policy := r.policy
	if random {
		policy = r.random
	}
	if r.rec == nil {
		if err := policy.Act(&r.obs, r.acts, r.rng); err != nil {
			return fmt.Errorf("collector: policy: %w", err)
		}
		return nil
	}
	r.st.putState(t, r.state)
	if err := r.rec.ActRecurrent(&r.obs, r.state, r.nextState, r.acts, r.rng); err != nil {
		return fmt.Errorf("collector: policy: %w", err)
	}
	if random {
		if err := policy.Act(&r.obs, r.acts, r.rng); err != nil {
			return fmt.Errorf("collector: policy: %w", err)
		}
	}
	return nil
}

// checkSpec checks, before anything is written, that the buffer holds the
// recurrent state field with the policy's state size.
func (r *runner) checkSpec(spec storage.Spec) error {
	if r.rec == nil {
		return nil
	}
	h, name := r.rec.StateSize(), r.cfg.StateField
	f, ok := spec.Field(name)
	if !ok {
		return fmt.Errorf("collector: buffer has no field %q for the recurrent policy's states (float32 [%d]): %w",
			name, h, storage.ErrInvalidBatch)
	}
	if f.DType != storage.Float32 || len(f.Shape) != 1 || f.Shape[0] != h {
		return fmt.Errorf("collector: field %q is %s %v; the recurrent policy's states are float32 [%d]: %w",
			name, f.DType, f.Shape, h, storage.ErrInvalidBatch)
	}
	return nil
}

// errHeldBack ends a run stopped while the rate limiter held its batch.
var errHeldBack = errors.New("collector: stopped while the rate limiter held the batch back")

// write sends the staged batch, again and again while the buffer's rate
// limiter holds it back (each writer call waits a while on its own). Once
// ctx ends the write may go on for StopGrace, so the batch under way is
// written rather than lost; but a batch the limiter holds back when ctx
// ends is given up (errHeldBack), since learners may never come.
func (r *runner) write(ctx context.Context) (storage.ExtendResult, error) {
	for {
		t := time.Now()
		res, err := r.writeOnce(ctx)
		if !errors.Is(err, ratelimit.ErrRateLimited) {
			r.stats.RateLimited = false
			r.stats.RateLimitWait += res.RateLimitWait
			return res, err
		}
		r.stats.RateLimitWait += time.Since(t)
		r.stats.RateLimited = true
		if r.cfg.OnRateLimited != nil {
			r.stats.Elapsed = time.Since(r.start)
			r.cfg.OnRateLimited(r.stats)
		}
		if ctx.Err() != nil {
			return res, errHeldBack
		}
		// A writer that answers at once must not make this a busy loop.
		if wait := time.Since(t); wait < 10*time.Millisecond {
			select {
			case <-ctx.Done():
			case <-time.After(10*time.Millisecond - wait):
			}
		}
	}
}

func (r *runner) writeOnce(ctx context.Context) (storage.ExtendResult, error) {
	wctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(r.cfg.StopGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(fmt.Errorf("collector: write still running %v after the run was stopped: %w", r.cfg.StopGrace, context.Cause(ctx)))
		case <-wctx.Done():
		}
	})
	defer stop()
	return r.cfg.Writer.Extend(wctx, r.stream, &r.st.batch)
}

// pace sleeps until the run is back under MaxRate; false if ctx ended.
func (r *runner) pace(ctx context.Context) bool {
	ahead := time.Duration(float64(r.stats.Frames)/r.cfg.MaxRate*float64(time.Second)) - time.Since(r.start)
	if ahead <= 0 {
		return true
	}
	t := time.NewTimer(ahead)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (r *runner) addEpisode(ret float64, length int) {
	i := r.stats.Episodes % int64(len(r.returns))
	r.returns[i], r.lengths[i] = ret, length
	r.stats.Episodes++
	r.nret = min(r.nret+1, len(r.returns))
}

// recentEpisodes returns the mean return and length of the last 100
// episodes.
func (r *runner) recentEpisodes() (meanReturn, meanLength float64) {
	if r.nret == 0 {
		return 0, 0
	}
	for i := range r.nret {
		meanReturn += r.returns[i]
		meanLength += float64(r.lengths[i])
	}
	return meanReturn / float64(r.nret), meanLength / float64(r.nret)
}

// staging holds one batch, column by column, in the layout the store
// takes: rows tick-major (row t*n+e is copy e's step t), so the rows of
// one tick are a contiguous block of every column. It is allocated once
// per run and reused for every batch.
type staging struct {
	n, T       int
	obsB, actB int
	discrete   bool
	compact    bool

	// obs holds T+1 blocks of n observations: block t is the
	// observation of tick t, block T carries over to the next batch.
	obs []byte
	// next holds the next.observation column (T blocks), non-compact
	// only. In compact mode the env writes tick t's next observations
	// straight into obs block t+1.
	next              []byte
	act               []byte
	rew               []byte
	done, term, trunc []byte
	// tail holds the final observations of done rows, in row order
	// (compact only); its capacity is kept across batches.
	tail    []byte
	env     []int64
	version []int64 // nil without Config.PolicyVersion
	// state holds recurrent states before each step (rows of h float32),
	// nil for stateless policies.
	state []byte
	h     int

	batch storage.Batch
}

func newStaging(spec envs.Spec, n, T int, compact bool) *staging {
	rows := n * T
	s := &staging{n: n, T: T, obsB: spec.ObsBytes(), discrete: spec.Discrete(), compact: compact}
	s.actB = 8
	if !s.discrete {
		s.actB = 4 * spec.ActionElems()
	}
	s.obs = make([]byte, (T+1)*n*s.obsB)
	if !compact {
		s.next = make([]byte, rows*s.obsB)
	}
	s.act = make([]byte, rows*s.actB)
	s.rew = make([]byte, rows*4)
	s.done, s.term, s.trunc = make([]byte, rows), make([]byte, rows), make([]byte, rows)
	s.env = make([]int64, rows)
	for i := range s.env {
		s.env[i] = int64(i % n)
	}
	s.batch = storage.Batch{Rows: rows, Env: s.env, Fields: map[string][]byte{
		"observation": s.obs[:rows*s.obsB], "action": s.act, "next.reward": s.rew,
		"next.done": s.done, "next.terminated": s.term, "next.truncated": s.trunc,
	}}
	if !compact {
		s.batch.Fields["next.observation"] = s.next
	}
	return s
}

func (s *staging) obsBlock(t int) []byte {
	b := s.n * s.obsB
	return s.obs[t*b : (t+1)*b]
}

// nextBlock is where the env writes tick t's next observations.
func (s *staging) nextBlock(t int) []byte {
	if s.compact {
		return s.obsBlock(t + 1)
	}
	b := s.n * s.obsB
	return s.next[t*b : (t+1)*b]
}

func (s *staging) startBatch() { s.tail = s.tail[:0] }

// addState adds the column of recurrent states, h float32 per row.
func (s *staging) addState(field string, h int) {
	s.h = h
	s.state = make([]byte, len(s.env)*h*4)
	s.batch.Fields[field] = s.state
}

// putState stores tick t's states before the step (n rows of h).
func (s *staging) putState(t int, state []float32) {
	blk := s.state[t*s.n*s.h*4 : (t+1)*s.n*s.h*4]
	for i, v := range state[:s.n*s.h] {
		binary.LittleEndian.PutUint32(blk[4*i:], math.Float32bits(v))
	}
}

// putVersion stamps tick t's rows with a policy version.
func (s *staging) putVersion(t int, v int64) {
	if s.version == nil {
		s.version = make([]int64, len(s.env))
		s.batch.PolicyVersion = s.version
	}
	for e := range s.n {
		s.version[t*s.n+e] = v
	}
}

func (s *staging) putActions(t int, a *envs.Actions) {
	blk := s.act[t*s.n*s.actB : (t+1)*s.n*s.actB]
	if s.discrete {
		for e, v := range a.Discrete[:s.n] {
			binary.LittleEndian.PutUint64(blk[8*e:], uint64(v))
		}
		return
	}
	for i, v := range a.Continuous[:len(blk)/4] {
		binary.LittleEndian.PutUint32(blk[4*i:], math.Float32bits(v))
	}
}

func (s *staging) putStep(row int, rew float32, done, term, trunc bool) {
	binary.LittleEndian.PutUint32(s.rew[4*row:], math.Float32bits(rew))
	s.done[row], s.term[row], s.trunc[row] = b2u(done), b2u(term), b2u(trunc)
}

func (s *staging) finishBatch() {
	if !s.compact {
		return
	}
	if len(s.tail) > 0 {
		s.batch.Fields["next.observation"] = s.tail
	} else {
		delete(s.batch.Fields, "next.observation")
	}
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}
