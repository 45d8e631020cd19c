package collector_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

// Frames per second of the collector next to the env stepping alone, so
// the collector's own overhead shows:
//
//	go test ./collector -run '^$' -bench . -benchtime 2s -count 3 -cpu 2 | tee new.txt
//	go tool benchstat new.txt
//
// env=catch is [4,84,84] uint8 frames (28,224 bytes); every run is compact
// (next.observation on done rows only) with a random policy.

// env=heavy is a synthetic env whose step costs about 50µs of arithmetic
// per copy, where stepping copies in parallel pays; heavy-serial is the
// same with one worker. The built-in envs step in about 0.1µs (cartpole)
// and 1µs (catch) per copy, so automatic workers keep them serial.
var benchEnvs = []struct {
	name string
	opts envs.Options
}{
	{"cartpole", envs.Options{}},
	{"catch", envs.Options{FrameStack: 4}},
	{"heavy", envs.Options{}},
	{"heavy-serial", envs.Options{Workers: 1}},
}

func benchEnv(b *testing.B, name string, opts envs.Options, n int) *envs.Vector {
	b.Helper()
	var v *envs.Vector
	if name == "heavy" || name == "heavy-serial" {
		copies := make([]envs.Copy, n)
		for i := range copies {
			copies[i] = &heavyCopy{}
		}
		v = envs.NewVector(heavySpec, copies, opts.Workers)
	} else {
		var err error
		if v, err = envs.New(name, n, &opts); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { v.Close() })
	return v
}

var heavySpec = envs.Spec{Name: "heavy", ObsDType: "float32", ObsShape: []int{16}, NumActions: 2, MaxEpisodeSteps: 100}

// heavyCopy integrates a chaotic map for a while per step.
type heavyCopy struct {
	x     [16]float64
	steps int
}

func (h *heavyCopy) Reset(rng *rand.Rand, obs []byte) {
	for i := range h.x {
		h.x[i] = rng.Float64()
	}
	h.steps = 0
	h.obs(obs)
}

func (h *heavyCopy) obs(dst []byte) {
	for i, v := range h.x {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(float32(v)))
	}
}

func (h *heavyCopy) Step(a int64, _ []float32, obs []byte) (float32, bool, bool) {
	for k := 0; k < 2000; k++ {
		for i := range h.x {
			h.x[i] = 3.9 * h.x[i] * (1 - h.x[i])
		}
	}
	h.x[0] = math.Min(0.99, h.x[0]+0.001*float64(a))
	h.steps++
	h.obs(obs)
	return float32(h.x[0]), false, h.steps >= 100
}

// BenchmarkEnvStep steps the env alone (with the resets of ended copies):
// one op is one frame.
func BenchmarkEnvStep(b *testing.B) {
	for _, be := range benchEnvs {
		for _, n := range []int{1, 2, 8} {
			b.Run(fmt.Sprintf("env=%s/envs=%d", be.name, n), func(b *testing.B) {
				v := benchEnv(b, be.name, be.opts, n)
				spec := v.Spec()
				obs := make([]byte, n*spec.ObsBytes())
				if err := v.Reset(nil, obs); err != nil {
					b.Fatal(err)
				}
				act, out := envs.NewActions(spec, n), envs.NewStepResult(spec, n)
				mask := make([]bool, n)
				b.SetBytes(int64(spec.ObsBytes()))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += n {
					for j := range act.Discrete {
						act.Discrete[j] = int64((i + j) % spec.NumActions)
					}
					if err := v.Step(act, out); err != nil {
						b.Fatal(err)
					}
					any := false
					for j := range mask {
						mask[j] = out.Terminated[j] || out.Truncated[j]
						any = any || mask[j]
					}
					if any {
						if err := v.Reset(mask, out.Obs); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
			})
		}
	}
}

// BenchmarkCollect runs the collector: writer=discard measures the rollout
// loop alone, writer=buffer an in-process memory buffer, writer=http the
// same buffer through rbd's HTTP server on loopback. One op is one frame.
func BenchmarkCollect(b *testing.B) {
	for _, be := range benchEnvs {
		for _, n := range []int{1, 2, 8} {
			for _, writer := range []string{"discard", "buffer", "http"} {
				b.Run(fmt.Sprintf("env=%s/envs=%d/writer=%s", be.name, n, writer), func(b *testing.B) {
					v := benchEnv(b, be.name, be.opts, n)
					spec := collector.BufferSpec(v.Spec(), collector.SpecOptions{Capacity: 1 << 17, Storage: storage.KindMemory, CompactObs: true})
					if v.Spec().Pixels {
						spec.Capacity = 4096
					}
					var w collector.Writer = nopWriter{}
					switch writer {
					case "buffer", "http":
						db := openDB(b)
						buf, _, err := db.CreateBuffer("bench", spec)
						if err != nil {
							b.Fatal(err)
						}
						w = collector.BufferWriter{Buffer: buf.Buffer}
						if writer == "http" {
							c, _ := httpServer(b, db)
							w = collector.NewHTTPWriter(c, "bench", spec)
						}
					}
					b.SetBytes(int64(v.Spec().ObsBytes()))
					b.ReportAllocs()
					b.ResetTimer()
					st, err := collector.Run(context.Background(), collector.Config{Env: v, Writer: w, FramesPerBatch: 256,
						TotalFrames: int64(b.N), CompactObs: true})
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					b.ReportMetric(float64(st.Frames)/b.Elapsed().Seconds(), "frames/s")
					if st.Elapsed > 0 {
						b.ReportMetric(100*st.WriteTime.Seconds()/st.Elapsed.Seconds(), "%write")
					}
				})
			}
		}
	}
}

// BenchmarkCollectRecurrent runs a GRU Q policy (which stores its state in
// every row) on cartpole-masked next to a feed-forward MLP of the same
// width, into an in-process memory buffer: the cost of carrying and storing
// recurrent states. One op is one frame.
//
//	go test ./collector -run '^$' -bench BenchmarkCollectRecurrent -benchtime 2s -count 3 -cpu 2
func BenchmarkCollectRecurrent(b *testing.B) {
	for _, policy := range []string{"mlp", "gru"} {
		for _, hidden := range []int{32, 128} {
			b.Run(fmt.Sprintf("policy=%s/hidden=%d/envs=8", policy, hidden), func(b *testing.B) {
				v := benchEnv(b, "cartpole-masked", envs.Options{}, 8)
				var p collector.Policy = collector.NewMLPQ(2, hidden, 2, 0.1, 1)
				so := collector.SpecOptions{Capacity: 1 << 17, Storage: storage.KindMemory, CompactObs: true}
				if policy == "gru" {
					p, so.RecurrentState = collector.NewGRUQ(2, hidden, 2, 0.1, 1), hidden
				}
				db := openDB(b)
				buf, _, err := db.CreateBuffer("bench", collector.BufferSpec(v.Spec(), so))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				st, err := collector.Run(context.Background(), collector.Config{Env: v, Policy: p,
					Writer: collector.BufferWriter{Buffer: buf.Buffer}, FramesPerBatch: 256, TotalFrames: int64(b.N), CompactObs: true})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric(float64(st.Frames)/b.Elapsed().Seconds(), "frames/s")
			})
		}
	}
}
