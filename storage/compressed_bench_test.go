package storage

// What a chunk decode costs in a compressed buffer, next to the raw speed
// of the zstd decoder on the same bytes. Numbers: docs/performance.md
// ("Compressed storage and frame dedup") and docs/memory-efficient.md.
//
// Smoke run (CI):
//
//	go test ./storage -run '^$' -bench BenchmarkChunkDecode -benchtime 1x -short
//
// Measurement (about a minute):
//
//	go test ./storage -run '^$' -bench BenchmarkChunkDecode -benchtime 2s -count 3 -cpu 2 | tee new.txt
//	go tool benchstat -col /impl new.txt
//
// Rows are the catch env's frames stacked 4 deep ([4,84,84] uint8, a ball
// and a paddle on black: nearly all zeros), or data=noise: the same
// episodes with every frame uniform random bytes (what zstd cannot
// shrink). 8 envs interleaved, episodes of 20 steps, compact_obs with
// final observations, chunks of 32 (so one chunk per episode: 20 rows plus
// the final observation), zstd level 1.

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/rbdb/rbd/collector/envs"
)

const (
	cbEnvs     = 8
	cbK        = 4
	cbFrame    = envs.CatchFrameBytes
	cbCapacity = 8192 // rows (-short: 512)
	cbNoiseLen = 20   // steps per noise episode, as catch's
)

// cbSource produces the rows: frames from catch (single frames, stacked
// here the way the env stacks them: a reset repeats the first frame) or
// random frames.
type cbSource struct {
	noise  bool
	env    *envs.Vector
	rng    *rand.Rand
	stacks [][]byte // per env: K frames, oldest first
	steps  []int
	act    *envs.Actions
	out    *envs.StepResult
	first  []byte // Reset's output: first frames
	mask   []bool
}

func newCBSource(b *testing.B, noise bool) *cbSource {
	env, err := envs.New("catch", cbEnvs, &envs.Options{Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.Close() })
	env.Seed(1)
	spec := env.Spec()
	s := &cbSource{noise: noise, env: env, rng: rand.New(rand.NewPCG(1, 2)), stacks: make([][]byte, cbEnvs), steps: make([]int, cbEnvs),
		act: envs.NewActions(spec, cbEnvs), out: envs.NewStepResult(spec, cbEnvs), first: make([]byte, cbEnvs*cbFrame), mask: make([]bool, cbEnvs)}
	if err := env.Reset(nil, s.first); err != nil {
		b.Fatal(err)
	}
	for e := range s.stacks {
		s.stacks[e] = make([]byte, cbK*cbFrame)
		s.restart(e)
	}
	return s
}

// restart fills env e's stack with its first frame.
func (s *cbSource) restart(e int) {
	f := s.first[e*cbFrame : (e+1)*cbFrame]
	if s.noise {
		s.fill(f)
	}
	for j := range cbK {
		copy(s.stacks[e][j*cbFrame:], f)
	}
	s.steps[e] = 0
}

func (s *cbSource) fill(f []byte) {
	for i := 0; i < len(f); i += 8 {
		v := s.rng.Uint64()
		for k := 0; k < 8 && i+k < len(f); k++ {
			f[i+k] = byte(v >> (8 * k))
		}
	}
}

// push drops env e's oldest frame and appends f.
func (s *cbSource) push(e int, f []byte) {
	st := s.stacks[e]
	copy(st, st[cbFrame:])
	copy(st[(cbK-1)*cbFrame:], f)
}

// batch returns the next rows (a multiple of cbEnvs), envs interleaved;
// done rows carry their final observation.
func (s *cbSource) batch(b *testing.B, rows int) *Batch {
	rb := cbK * cbFrame
	obs, act, rew := make([]byte, rows*rb), make([]byte, rows*8), make([]byte, rows*4)
	done, term, trunc := make([]byte, rows), make([]byte, rows), make([]byte, rows)
	env := make([]int64, rows)
	var tail []byte
	for r := 0; r < rows; r += cbEnvs {
		for e := range cbEnvs {
			copy(obs[(r+e)*rb:], s.stacks[e])
			env[r+e] = int64(e)
			s.act.Discrete[e] = int64(s.rng.IntN(envs.CatchActions))
			act[8*(r+e)] = byte(s.act.Discrete[e])
		}
		if err := s.env.Step(s.act, s.out); err != nil {
			b.Fatal(err)
		}
		anyDone := false
		for e := range cbEnvs {
			f := s.out.Obs[e*cbFrame : (e+1)*cbFrame]
			s.steps[e]++
			d := s.out.Terminated[e]
			if s.noise {
				s.fill(f)
				d = s.steps[e] == cbNoiseLen
			}
			s.push(e, f)
			s.mask[e] = s.out.Terminated[e] || s.out.Truncated[e]
			anyDone = anyDone || s.mask[e]
			if d {
				done[r+e], term[r+e] = 1, 1
				tail = append(tail, s.stacks[e]...)
			}
		}
		if anyDone {
			if err := s.env.Reset(s.mask, s.first); err != nil {
				b.Fatal(err)
			}
		}
		for e := range cbEnvs {
			if done[r+e] == 1 || (s.mask[e] && !s.noise) {
				s.restart(e)
			}
		}
	}
	return &Batch{Rows: rows, Env: env, Fields: map[string][]byte{"observation": obs, "action": act, "next.reward": rew,
		"next.done": done, "next.terminated": term, "next.truncated": trunc, "next.observation": tail}}
}

func cbSpec(capacity int64, dedup bool) Spec {
	obs := Field{Name: "observation", DType: Uint8, Shape: []int{cbK, envs.CatchSize, envs.CatchSize}}
	if dedup {
		obs.FrameStack = &FrameStack{K: cbK, Axis: 0}
	}
	return Spec{Capacity: capacity, Storage: KindCompressed, CompactObs: true, ObsKeys: []string{"observation"},
		Durability: DurabilityNone,
		// A 1 MiB cache holds at most one undeduplicated chunk (21 x 28,224
		// B), so cycling through hundreds of chunks misses every time.
		Compression: &CompressionOptions{Codec: "zstd", Level: 1, ChunkLen: 32, CacheMiB: 1},
		Fields: []Field{obs,
			{Name: "action", DType: Int64}, {Name: "next.reward", DType: Float32},
			{Name: "next.done", DType: Bool}, {Name: "next.terminated", DType: Bool}, {Name: "next.truncated", DType: Bool}}}
}

// cbFixture is a filled buffer with one row picked in each sealed chunk
// (a middle row, whose frame stack lies within its own chunk) and those
// chunks' stored payloads.
type cbFixture struct {
	buf      *Buffer
	col      Column
	seqs     []int64
	payloads [][]byte
	raw      []int // decoded size of each payload
	stored   int64
	rawTotal int64
}

// newCBFixture builds the fixture inside sub-benchmark b; it lives (its
// store stays open) until owner, the benchmark sharing it, ends.
func newCBFixture(b, owner *testing.B, noise, dedup bool) *cbFixture {
	capacity := int64(cbCapacity)
	if testing.Short() {
		capacity = 512
	}
	s := openStore(b, owner.TempDir())
	owner.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	})
	buf := mustCreate(b, s, "bench", cbSpec(capacity, dedup))
	src := newCBSource(b, noise)
	for w := int64(0); w < capacity+capacity/4; w += 256 {
		mustExtend(b, buf, "w0", src.batch(b, 256))
	}
	fx := &cbFixture{buf: buf}
	fx.col, _ = buf.Column("observation")
	seen := map[*chunk]bool{}
	wc := buf.WriteCount()
	for seq := wc - capacity; seq < wc; seq++ {
		l := buf.cs.loc[seq%capacity]
		c := l.c
		if c == nil || !c.sealed || seen[c] || l.i != len(c.seqs)/2 || l.i < cbK-1 {
			continue
		}
		seen[c] = true
		f := &c.f[0]
		p := make([]byte, f.stored)
		if _, err := c.seg.f.ReadAt(p, f.payOff); err != nil {
			b.Fatal(err)
		}
		fx.seqs = append(fx.seqs, seq)
		fx.payloads = append(fx.payloads, p)
		fx.raw = append(fx.raw, f.offs[len(f.offs)-1])
		fx.stored += int64(len(p))
		fx.rawTotal += int64(f.offs[len(f.offs)-1])
	}
	if len(fx.seqs) < 16 {
		b.Fatalf("only %d sealed chunks to decode", len(fx.seqs))
	}
	return fx
}

// BenchmarkChunkDecode: one op decodes one chunk's observation field.
//
//   - impl=zstd: zstd.Decoder.DecodeAll of the stored payload into a
//     reused buffer (a decoder with the store's options), the chunks in
//     turn: the codec's own speed.
//   - impl=gather-cold: Buffer.Gather of one row of that chunk's
//     observation while the chunk is not in the decoded-chunk cache: read
//     the payload from its segment, check its CRC, decode into a new
//     buffer, put it in the cache, rebuild the row's frame stack (dedup) or
//     copy the row out.
//   - impl=gather-warm: the same Gather of a row whose chunk is cached (the
//     hit path: a cache lookup per frame-stack unit and the copy).
//
// decoded-GB/s counts the chunk field's decoded bytes (what the cache
// holds: 21 stacks of 28,224 B, or with dedup mostly single 7,056-B
// frames); x-zstd is decoded over stored bytes.
func BenchmarkChunkDecode(b *testing.B) {
	for _, data := range []string{"catch", "noise"} {
		for _, dedup := range []bool{false, true} {
			var fx *cbFixture // shared by the three impls
			owner := b
			get := func(b *testing.B) *cbFixture {
				if fx == nil {
					fx = newCBFixture(b, owner, data == "noise", dedup)
				}
				return fx
			}
			name := fmt.Sprintf("data=%s/dedup=%v", data, dedup)
			b.Run(name+"/impl=zstd", func(b *testing.B) {
				fx := get(b)
				dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(64<<20), zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)))
				if err != nil {
					b.Fatal(err)
				}
				defer dec.Close()
				dst := make([]byte, 0, 33*cbK*cbFrame)
				var raw int64
				i := 0
				for b.Loop() {
					out, err := dec.DecodeAll(fx.payloads[i], dst[:0])
					if err != nil || len(out) != fx.raw[i] {
						b.Fatalf("chunk %d: %d bytes, want %d: %v", i, len(out), fx.raw[i], err)
					}
					raw += int64(len(out))
					i = (i + 1) % len(fx.payloads)
				}
				b.ReportMetric(float64(raw)/b.Elapsed().Seconds()/1e9, "decoded-GB/s")
				b.ReportMetric(float64(fx.rawTotal)/float64(fx.stored), "x-zstd")
			})
			b.Run(name+"/impl=gather-cold", func(b *testing.B) {
				fx := get(b)
				cbGather(b, fx, true)
			})
			b.Run(name+"/impl=gather-warm", func(b *testing.B) {
				fx := get(b)
				cbGather(b, fx, false)
			})
		}
	}
}

func cbGather(b *testing.B, fx *cbFixture, cold bool) {
	cols := []Column{fx.col}
	dst := [][]byte{make([]byte, fx.col.RowBytes)}
	seq := []int64{0}
	before := fx.buf.cs.cache.stats()
	var raw int64
	i := 0
	for b.Loop() {
		seq[0] = fx.seqs[i]
		missing, err := fx.buf.Gather(seq, cols, dst, nil)
		if err != nil || len(missing) > 0 {
			b.Fatalf("gather seq %d: missing %v, %v", seq[0], missing, err)
		}
		raw += int64(fx.raw[i])
		if cold {
			i = (i + 1) % len(fx.seqs)
		}
	}
	after := fx.buf.cs.cache.stats()
	sec := b.Elapsed().Seconds()
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	b.ReportMetric(100*float64(hits)/float64(max(hits+misses, 1)), "hit%")
	b.ReportMetric(float64(b.N)/sec, "rows/s")
	if cold {
		b.ReportMetric(float64(raw)/sec/1e9, "decoded-GB/s")
	}
}
