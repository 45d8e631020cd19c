package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

type collectOptions struct {
	env              string
	numEnvs          int
	frames           int64
	framesPerBatch   int
	compact          bool
	data             string
	url              string
	buffer           string
	token            string
	tlsClient        tlsClientFlags
	capacity         int64
	storage          string
	rowMeta          string
	frameDedup       bool
	chunkLen         int
	level            int
	codec            string
	seed             uint64
	policy           string
	epsilon          float64
	hidden           int
	weights          string
	maxFramesPerTraj int
	initRandomFrames int64
	resetAtEachIter  bool
	frameStack       int
	workers          int
	stream           string
	rate             float64
	jsonOut          bool
	logEvery         time.Duration

	seedSet, frameStackSet bool
}

// AddFlags registers the collect flags.
func (o *collectOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.env, "env", "cartpole", "environment: "+strings.Join(envs.Names, ", "))
	f.IntVar(&o.numEnvs, "num-envs", 8, "env copies stepped side by side")
	f.Int64Var(&o.frames, "frames", 100_000, "frames (env steps) to collect, rounded up to whole batches; -1 runs until interrupted")
	f.IntVar(&o.framesPerBatch, "frames-per-batch", 256, "frames per write (rounded up to a multiple of --num-envs)")
	f.BoolVar(&o.compact, "compact", false, "compact_obs: store each observation once, next.observation only on done rows")
	f.StringVar(&o.data, "data", "", "write into the data dir DIR in-process (no server may hold it)")
	f.StringVar(&o.url, "url", "", "write to the rbd server at URL (e.g. http://127.0.0.1:7450)")
	f.StringVar(&o.buffer, "buffer", "", "buffer name (default: the env's name); created with the env's spec if missing")
	f.StringVar(&o.token, "token", "", "bearer token for --url (default $RBD_TOKEN)")
	o.tlsClient.addFlags(f)
	f.Int64Var(&o.capacity, "capacity", 100_000, "capacity in rows of a buffer this command creates")
	f.StringVar(&o.storage, "storage", "memmap", "storage kind of a buffer this command creates: memmap, memory or compressed")
	f.StringVar(&o.rowMeta, "row-meta", "", `row metadata layout of a memory or memmap buffer this command creates: "row", "runs", "strided" or, memmap only, "blocks" (left out: the storage kind's default, memory "row", memmap "blocks", or "runs" for an fsync buffer or one under 1,024 rows; a memmap buffer with "row" opens in builds from before 2026-11-27, with "runs" or "strided" in builds from 2026-11-27)`)
	f.BoolVar(&o.frameDedup, "frame-dedup", false, "compressed storage: store each stacked frame once (catch with --frame-stack > 1)")
	f.IntVar(&o.chunkLen, "chunk-len", 0, "compressed storage: rows of one trajectory per chunk (0: 32)")
	f.IntVar(&o.level, "level", 0, "compressed storage: zstd level 1-22 (0: 1)")
	f.StringVar(&o.codec, "codec", "", "compressed storage: zstd (default) or none (chunks and frame dedup only)")
	f.Uint64Var(&o.seed, "seed", 0, "seed of envs and policy (default: random, printed at the end)")
	f.StringVar(&o.policy, "policy", "random", "policy: random, linear-q, mlp-q or gru-q (epsilon-greedy; discrete envs; gru-q stores its state in field recurrent_state)")
	f.Float64Var(&o.epsilon, "epsilon", 0.1, "exploration rate of the Q policies")
	f.IntVar(&o.hidden, "hidden", 32, "hidden units of mlp-q and gru-q")
	f.StringVar(&o.weights, "weights", "", "start the policy from these weights (a safetensors file of float32 tensors, named as PUT /v1/collectors/{name}/weights takes them)")
	f.IntVar(&o.maxFramesPerTraj, "max-frames-per-traj", 0, "truncate trajectories at this many steps (0: the env's own limit)")
	f.Int64Var(&o.initRandomFrames, "init-random-frames", 0, "act randomly until this many frames are collected")
	f.BoolVar(&o.resetAtEachIter, "reset-at-each-iter", false, "reset every env before each batch (trajectories never span batches)")
	f.IntVar(&o.frameStack, "frame-stack", 4, "frames stacked along axis 0 in pixel observations (catch; 1 = none)")
	f.IntVar(&o.workers, "workers", 0, "goroutines stepping env copies (0: chosen by measuring the first steps)")
	f.StringVar(&o.stream, "stream", "", "stream name (default: a random one, printed at the end)")
	f.Float64Var(&o.rate, "rate", 0, "at most this many frames per second (0: no limit)")
	f.BoolVar(&o.jsonOut, "json", false, "print the summary as JSON")
	f.DurationVar(&o.logEvery, "log-every", 5*time.Second, "progress log interval when stderr is not a terminal")
}

func newCollectCommand() *cobra.Command {
	o := &collectOptions{}
	cmd := &cobra.Command{
		Use:   "collect --env ENV (--data DIR | --url URL)",
		Short: "Run a built-in collector: step envs with a policy and write the steps into a buffer",
		Long: `collect steps NUM_ENVS copies of a built-in environment with a policy and
writes every step into a buffer, in-process (--data) or through an rbd
server (--url). The buffer defaults to the env's name and is created with the
env's spec (TorchRL's layout: observation, action, next.reward, next.done,
next.terminated, next.truncated, next.observation unless --compact).

Envs: cartpole (CartPole-v1), cartpole-masked (CartPole-v1 observing only
x and theta: partially observable), pendulum (Pendulum-v1, continuous
torque) and catch (84x84 uint8 frames, stacked 4 deep by default:
[4,84,84]).

--policy gru-q is a recurrent (GRU) Q policy: the buffer gets a field
recurrent_state float32 [--hidden] holding each row's state before the step
(zero where a trajectory starts; see docs/recurrent.md).

Progress goes to stderr: a progress bar on a terminal, a log line every
--log-every otherwise. Ctrl-C stops after the batch under way is written.
The summary goes to stdout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.token == "" {
				o.token = os.Getenv("RBD_TOKEN")
			}
			o.seedSet = cmd.Flags().Changed("seed")
			o.frameStackSet = cmd.Flags().Changed("frame-stack")
			return runCollect(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// collectSummary is the --json output.
type collectSummary struct {
	Buffer          string  `json:"buffer"`
	Env             string  `json:"env"`
	Stream          string  `json:"stream"`
	Seed            uint64  `json:"seed"`
	Frames          int64   `json:"frames"`
	Batches         int64   `json:"batches"`
	Trajectories    int64   `json:"trajectories"`
	Episodes        int64   `json:"episodes"`
	MeanReturn      float64 `json:"mean_return"`
	WriteCount      int64   `json:"write_count"`
	Seconds         float64 `json:"seconds"`
	FramesPerSecond float64 `json:"frames_per_second"`
	WriteSeconds    float64 `json:"write_seconds"`
	// RateLimitSeconds is the part of WriteSeconds the buffer's rate
	// limiter held writes back; HeldBack the frames of a last batch it
	// still held when the run was stopped (not written).
	RateLimitSeconds float64 `json:"rate_limit_seconds"`
	HeldBack         int64   `json:"held_back_frames"`
	Interrupted      bool    `json:"interrupted"`
}

func (o *collectOptions) validate() error {
	var errs []error
	if (o.data == "") == (o.url == "") {
		errs = append(errs, errors.New("give exactly one of --data DIR and --url URL"))
	}
	if o.numEnvs < 1 || o.numEnvs > 4096 {
		errs = append(errs, fmt.Errorf("--num-envs %d: want 1..4096", o.numEnvs))
	}
	if o.frames == 0 || o.frames < -1 {
		errs = append(errs, fmt.Errorf("--frames %d: want a positive count or -1", o.frames))
	}
	if o.framesPerBatch < 1 {
		errs = append(errs, fmt.Errorf("--frames-per-batch %d: want at least 1", o.framesPerBatch))
	}
	if o.capacity < 1 {
		errs = append(errs, fmt.Errorf("--capacity %d: want at least 1", o.capacity))
	}
	switch {
	case o.storage != "memmap" && o.storage != "memory" && o.storage != "compressed":
		errs = append(errs, fmt.Errorf("--storage %q: want memmap, memory or compressed", o.storage))
	case o.storage != "compressed" && (o.frameDedup || o.chunkLen != 0 || o.level != 0 || o.codec != ""):
		errs = append(errs, fmt.Errorf("--frame-dedup, --chunk-len, --level and --codec need --storage compressed"))
	}
	switch {
	case o.rowMeta != "" && o.rowMeta != string(storage.RowMetaPerRow) && o.rowMeta != string(storage.RowMetaRuns) && o.rowMeta != string(storage.RowMetaStrided) && o.rowMeta != string(storage.RowMetaBlocks):
		errs = append(errs, fmt.Errorf("--row-meta %q: want %s, %s, %s or %s", o.rowMeta, storage.RowMetaPerRow, storage.RowMetaRuns, storage.RowMetaStrided, storage.RowMetaBlocks))
	case o.rowMeta == string(storage.RowMetaBlocks) && o.storage != "memmap":
		errs = append(errs, fmt.Errorf("--row-meta blocks needs --storage memmap (block checksums of files)"))
	case o.rowMeta != "" && o.rowMeta != string(storage.RowMetaPerRow) && o.storage == "compressed":
		errs = append(errs, fmt.Errorf("--row-meta %s needs --storage memory or memmap (compressed buffers keep 64-byte row records)", o.rowMeta))
	}
	if o.epsilon < 0 || o.epsilon > 1 {
		errs = append(errs, fmt.Errorf("--epsilon %v: want 0..1", o.epsilon))
	}
	if o.maxFramesPerTraj < 0 || o.initRandomFrames < 0 || o.rate < 0 || o.workers < 0 || o.hidden < 1 {
		errs = append(errs, errors.New("--max-frames-per-traj, --init-random-frames, --rate and --workers must not be negative, --hidden must be positive"))
	}
	if o.frameStackSet && o.env != "catch" {
		errs = append(errs, fmt.Errorf("--frame-stack applies to catch, not %s", o.env))
	}
	return errors.Join(errs...)
}

func runCollect(ctx context.Context, stdout, stderr io.Writer, o *collectOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	eo := &envs.Options{Workers: o.workers}
	if o.env == "catch" {
		eo.FrameStack = o.frameStack
	}
	env, err := envs.New(o.env, o.numEnvs, eo)
	if err != nil {
		return err
	}
	defer env.Close()
	espec := env.Spec()
	if o.buffer == "" {
		o.buffer = o.env
	}
	if !o.seedSet {
		o.seed = rand.Uint64() >> 11 // fits a JSON number exactly
	}
	policy, err := o.newPolicy(espec)
	if err != nil {
		return err
	}
	if o.weights != "" {
		if err := loadWeights(o.weights, policy); err != nil {
			return err
		}
	}
	so := collector.SpecOptions{Capacity: o.capacity, Storage: storage.Kind(o.storage), CompactObs: o.compact, FrameDedup: o.frameDedup, RowMeta: storage.RowMetaLayout(o.rowMeta)}
	if rp, ok := policy.(collector.RecurrentPolicy); ok {
		so.RecurrentState = rp.StateSize()
	}
	if o.storage == "compressed" {
		so.Compression = &storage.CompressionOptions{Codec: o.codec, ChunkLen: o.chunkLen, Level: o.level}
	}
	spec := collector.BufferSpec(espec, so)

	var w collector.Writer
	var closeDB func() error
	if o.data != "" {
		db, err := rbd.Open(o.data, &rbd.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		closeDB = db.Close
		buf, _, err := db.CreateBuffer(o.buffer, spec)
		if err != nil {
			return errors.Join(specError(o, err, errors.Is(err, storage.ErrSpecConflict)), db.Close())
		}
		w = collector.BufferWriter{Buffer: buf.Buffer}
	} else {
		c, err := o.tlsClient.newClient(o.url, o.token)
		if err != nil {
			return err
		}
		raw, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		if _, _, err := c.CreateBufferJSON(ctx, o.buffer, raw); err != nil {
			return specError(o, err, errors.Is(err, client.ErrConflict))
		}
		w = collector.NewHTTPWriter(c, o.buffer, spec)
	}

	prog := newProgress(stderr, o)
	st, runErr := collector.Run(ctx, collector.Config{
		Env: env, Policy: policy, Writer: w, Stream: o.stream, Seed: o.seed,
		FramesPerBatch: o.framesPerBatch, TotalFrames: o.frames, MaxFramesPerTraj: o.maxFramesPerTraj,
		InitRandomFrames: o.initRandomFrames, ResetAtEachIter: o.resetAtEachIter, CompactObs: o.compact,
		MaxRate: o.rate, AfterBatch: prog.update, OnRateLimited: prog.rateLimited,
	})
	prog.finish(st)
	if closeDB != nil {
		runErr = errors.Join(runErr, closeDB())
	}
	if runErr != nil {
		return runErr
	}
	sum := collectSummary{Buffer: o.buffer, Env: o.env, Stream: st.Stream, Seed: o.seed, Frames: st.Frames, Batches: st.Batches,
		Trajectories: st.Trajectories, Episodes: st.Episodes, MeanReturn: st.MeanReturn, WriteCount: st.WriteCount,
		Seconds: st.Elapsed.Seconds(), FramesPerSecond: st.FramesPerSecond(), WriteSeconds: st.WriteTime.Seconds(),
		RateLimitSeconds: st.RateLimitWait.Seconds(), HeldBack: st.HeldBack, Interrupted: ctx.Err() != nil}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		return enc.Encode(sum)
	}
	stopped := ""
	if sum.Interrupted {
		stopped = " (interrupted)"
	}
	fmt.Fprintf(stdout, "collected %d frames%s into buffer %q: %d trajectories, mean return %.2f over the last %d episodes\n",
		sum.Frames, stopped, sum.Buffer, sum.Trajectories, sum.MeanReturn, min(sum.Episodes, 100))
	fmt.Fprintf(stdout, "%.2fs, %.0f frames/s (%.0f%% writing); write_count %d; stream %s, seed %d\n",
		sum.Seconds, sum.FramesPerSecond, 100*sum.WriteSeconds/max(sum.Seconds, 1e-9), sum.WriteCount, sum.Stream, sum.Seed)
	if sum.RateLimitSeconds > 0 || sum.HeldBack > 0 {
		fmt.Fprintf(stdout, "waited %.2fs for learners (the buffer's rate limit)", sum.RateLimitSeconds)
		if sum.HeldBack > 0 {
			fmt.Fprintf(stdout, "; the last %d frames were still held back when the run stopped and were not written", sum.HeldBack)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

func specError(o *collectOptions, err error, conflict bool) error {
	if conflict {
		return fmt.Errorf("buffer %q exists with a different spec (another env, --compact, --capacity, --storage, --row-meta, --policy gru-q or --hidden): "+
			"pass another --buffer or the options it was created with: %w", o.buffer, err)
	}
	return fmt.Errorf("create buffer %q: %w", o.buffer, err)
}

// loadWeights sets the policy's weights from a safetensors file.
func loadWeights(path string, p collector.Policy) error {
	ws, ok := p.(collector.WeightSetter)
	if !ok {
		return fmt.Errorf("--weights %s: the random policy has no weights (use --policy linear-q, mlp-q or gru-q)", path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--weights: %w", err)
	}
	tensors, _, err := codec.DecodeSafetensors(raw)
	if err != nil {
		return fmt.Errorf("--weights %s: %w", path, err)
	}
	vals, shapes, err := codec.Float32Map(tensors)
	if err != nil {
		return fmt.Errorf("--weights %s: %w", path, err)
	}
	if err := ws.SetWeights(vals, shapes); err != nil {
		return fmt.Errorf("--weights %s: %w", path, err)
	}
	return nil
}

func (o *collectOptions) newPolicy(spec envs.Spec) (collector.Policy, error) {
	switch o.policy {
	case "random":
		return nil, nil
	case "linear-q", "mlp-q", "gru-q":
		if !spec.Discrete() {
			return nil, fmt.Errorf("--policy %s needs discrete actions; %s's are continuous (use random)", o.policy, spec.Name)
		}
		switch o.policy {
		case "linear-q":
			return collector.NewLinearQ(spec.ObsElems(), spec.NumActions, o.epsilon), nil
		case "gru-q":
			return collector.NewGRUQ(spec.ObsElems(), o.hidden, spec.NumActions, o.epsilon, o.seed), nil
		}
		return collector.NewMLPQ(spec.ObsElems(), o.hidden, spec.NumActions, o.epsilon, o.seed), nil
	}
	return nil, fmt.Errorf("--policy %q: want random, linear-q, mlp-q or gru-q", o.policy)
}

// progress reports a run on stderr: a bar on a terminal, log lines
// otherwise.
type progress struct {
	bar     *progressbar.ProgressBar
	log     *slog.Logger
	every   time.Duration
	lastLog time.Time
	buffer  string
	env     string
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func newProgress(stderr io.Writer, o *collectOptions) *progress {
	p := &progress{every: o.logEvery, lastLog: time.Now(), buffer: o.buffer, env: o.env}
	if isTerminal(stderr) {
		p.bar = progressbar.NewOptions64(o.frames,
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetVisibility(true),
			progressbar.OptionSetDescription(o.env),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("frames"),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetWidth(30),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(stderr) }),
		)
		return p
	}
	p.log = slog.New(slog.NewTextHandler(stderr, nil))
	return p
}

func (p *progress) update(b *collector.BatchInfo) error {
	st := b.Stats
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s: %d traj, return %.1f", p.env, st.Trajectories, st.MeanReturn))
		_ = p.bar.Set64(st.Frames)
		return nil
	}
	if time.Since(p.lastLog) >= p.every {
		p.lastLog = time.Now()
		p.line("collecting", st)
	}
	return nil
}

// rateLimited shows that the buffer's rate limiter holds the run back.
func (p *progress) rateLimited(st collector.Stats) {
	const msg = "waiting for learners (the buffer's rate limit)"
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s: %s", p.env, msg))
		return
	}
	if time.Since(p.lastLog) >= p.every {
		p.lastLog = time.Now()
		p.log.Info(msg, "buffer", p.buffer, "frames", st.Frames, "waited_s", fmt.Sprintf("%.1f", st.RateLimitWait.Seconds()))
	}
}

func (p *progress) line(msg string, st collector.Stats) {
	p.log.Info(msg, "buffer", p.buffer, "frames", st.Frames, "frames_per_s", int64(st.FramesPerSecond()),
		"trajectories", st.Trajectories, "mean_return", fmt.Sprintf("%.2f", st.MeanReturn), "write_count", st.WriteCount)
}

func (p *progress) finish(st collector.Stats) {
	if p.bar != nil {
		_ = p.bar.Finish()
		return
	}
	p.line("done", st)
}
