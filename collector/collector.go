package collector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

// Writer receives the collector's batches: an in-process buffer (see
// BufferWriter) or an rbd server through the HTTP client.
type Writer interface {
	Extend(ctx context.Context, stream string, batch *storage.Batch) (storage.ExtendResult, error)
	CloseStream(ctx context.Context, stream string) error
}

// BufferWriter writes into an in-process storage.Buffer.
type BufferWriter struct{ Buffer *storage.Buffer }

// Extend implements Writer.
func (w BufferWriter) Extend(_ context.Context, stream string, b *storage.Batch) (storage.ExtendResult, error) {
	return w.Buffer.Extend(stream, b)
}

// CloseStream implements Writer.
func (w BufferWriter) CloseStream(_ context.Context, stream string) error {
	_, err := w.Buffer.CloseStream(stream)
	return err
}

// CartPoleSpec is the buffer spec of CartPole steps (compact drops
// next.observation).
func CartPoleSpec(capacity int64, compact bool, prio bool) storage.Spec {
	s := storage.Spec{
		Capacity: capacity, Storage: storage.KindMemmap, CompactObs: compact, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Float32, Shape: []int{4}},
			{Name: "action", DType: storage.Int64, Shape: []int{}},
			{Name: "next.reward", DType: storage.Float32, Shape: []int{}},
			{Name: "next.done", DType: storage.Bool, Shape: []int{}},
			{Name: "next.terminated", DType: storage.Bool, Shape: []int{}},
			{Name: "next.truncated", DType: storage.Bool, Shape: []int{}},
		},
	}
	if !compact {
		s.Fields = append(s.Fields, storage.Field{Name: "next.observation", DType: storage.Float32, Shape: []int{4}})
	}
	if prio {
		p := storage.DefaultPriority()
		s.Priority = &p
	}
	return s
}

// Config configures a CartPole collector run. Zero values mean the
// documented defaults.
type Config struct {
	// NumEnvs is the number of envs stepped side by side. Zero means 1.
	NumEnvs int
	// FramesPerBatch is the number of frames (env steps) per write,
	// rounded up to a multiple of NumEnvs. Zero means 256.
	FramesPerBatch int
	// TotalFrames stops the run after this many frames; -1 (or 0) runs
	// until the context ends.
	TotalFrames int64
	// MaxRate caps frames per second (0: no cap).
	MaxRate float64
	// CompactObs drops next.observation except on done rows.
	CompactObs bool
	// Stream names the collector's stream in the buffer. Empty means
	// "collector".
	Stream string
	// Seed seeds envs and policy.
	Seed uint64
	// Policy chooses actions. Nil means uniformly random.
	Policy Policy
	// AfterBatch, if set, is called after every write.
	AfterBatch func(Stats)
}

// Stats summarises a run so far.
type Stats struct {
	Frames       int64
	Batches      int64
	Episodes     int64
	MeanReturn   float64 // over the last 100 episodes
	LastWriteSeq int64
}

// RunCartPole steps CartPole envs and writes their steps until TotalFrames
// or ctx ends. On return the stream's open trajectories are closed (the
// envs stop mid-episode). A writer error stops the run and is returned.
func RunCartPole(ctx context.Context, w Writer, cfg Config) (Stats, error) {
	n := max(cfg.NumEnvs, 1)
	fpb := cfg.FramesPerBatch
	if fpb <= 0 {
		fpb = 256
	}
	ticks := (fpb + n - 1) / n
	stream := cfg.Stream
	if stream == "" {
		stream = "collector"
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc011ec7))
	policy := cfg.Policy
	if policy == nil {
		policy = RandomPolicy{N: envs.CartPoleActionsCount}
	}
	cps := make([]*envs.CartPole, n)
	obs := make([]float32, 4*n)
	ret := make([]float64, n)
	for i := range cps {
		cps[i] = envs.NewCartPole(rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1)))
		o := cps[i].Reset()
		copy(obs[4*i:], o[:])
	}
	var st Stats
	var returns []float64
	actions := make([]int64, n)
	start := time.Now()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = w.CloseStream(cctx, stream)
	}()
	for cfg.TotalFrames <= 0 || st.Frames < cfg.TotalFrames {
		if err := ctx.Err(); err != nil {
			return st, nil
		}
		var b batchBuilder
		for t := 0; t < ticks; t++ {
			policy.Act(obs, 4, actions, rng)
			for e := 0; e < n; e++ {
				next, r, term, trunc := cps[e].Step(int(actions[e]))
				b.add(int64(e), obs[4*e:4*e+4], actions[e], r, term, trunc, next[:], cfg.CompactObs)
				ret[e] += float64(r)
				copy(obs[4*e:], next[:])
				if term || trunc {
					st.Episodes++
					returns = append(returns, ret[e])
					if len(returns) > 100 {
						returns = returns[1:]
					}
					ret[e] = 0
					o := cps[e].Reset()
					copy(obs[4*e:], o[:])
				}
			}
		}
		res, err := w.Extend(ctx, stream, b.batch(cfg.CompactObs))
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return st, nil
			}
			return st, fmt.Errorf("collector: write batch %d: %w", st.Batches, err)
		}
		st.Frames += int64(b.rows)
		st.Batches++
		st.LastWriteSeq = res.WriteCount - 1
		st.MeanReturn = mean(returns)
		if cfg.AfterBatch != nil {
			cfg.AfterBatch(st)
		}
		if cfg.MaxRate > 0 {
			ahead := time.Duration(float64(st.Frames)/cfg.MaxRate*float64(time.Second)) - time.Since(start)
			if ahead > 0 {
				t := time.NewTimer(ahead)
				select {
				case <-ctx.Done():
					t.Stop()
					return st, nil
				case <-t.C:
				}
			}
		}
	}
	return st, nil
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// batchBuilder stages CartPole rows column by column.
type batchBuilder struct {
	obs, nobs, act, rew, done, term, trunc []byte
	env                                    []int64
	rows                                   int
}

func appendF32(b []byte, v ...float32) []byte {
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func (s *batchBuilder) add(env int64, obs []float32, a int64, r float32, term, trunc bool, next []float32, compact bool) {
	s.obs = appendF32(s.obs, obs...)
	s.act = binary.LittleEndian.AppendUint64(s.act, uint64(a))
	s.rew = appendF32(s.rew, r)
	d := term || trunc
	s.done, s.term, s.trunc = append(s.done, u8(d)), append(s.term, u8(term)), append(s.trunc, u8(trunc))
	if !compact || d {
		// compact_obs: the next observation travels on done rows only,
		// as the final observation of the trajectory.
		s.nobs = appendF32(s.nobs, next...)
	}
	s.env = append(s.env, env)
	s.rows++
}

func (s *batchBuilder) batch(compact bool) *storage.Batch {
	f := map[string][]byte{"observation": s.obs, "action": s.act, "next.reward": s.rew,
		"next.done": s.done, "next.terminated": s.term, "next.truncated": s.trunc}
	if !compact || len(s.nobs) > 0 {
		f["next.observation"] = s.nobs
	}
	return &storage.Batch{Rows: s.rows, Fields: f, Env: s.env}
}

func u8(b bool) byte {
	if b {
		return 1
	}
	return 0
}
