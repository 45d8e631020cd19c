package rbd

// Benchmarks of the whole in-process sample path: a sampler's draw against
// the trajectory index, the gather of the chosen rows, next-state
// reconstruction and n-step returns. The numbers are written up in
// docs/sampling.md ("Measured"); the targets are in design.md
// ("Performance targets").
//
// Smoke run (CI; every size once, well under a minute):
//
//	go test . -run '^$' -bench . -benchtime 1x
//
// Measurement (about ten minutes on 2 cores; compare runs with benchstat):
//
//	go test . -run '^$' -bench . -benchtime 2s -count 3 -cpu 2 | tee new.txt
//	go tool benchstat -col /rows new.txt
//
// Buffers are filled once per size and shared by the sub-benchmarks of one
// top-level benchmark (b.Loop runs a sub-benchmark's body once per -count,
// so without the cache the fill would be paid again each time); they are
// closed when that top-level benchmark ends, so at most one set of sizes
// is alive at a time (about 2 GB for the 10^7-row CartPole buffer).
// -short skips the 10^7- and 10^6-row sizes.
//
// Every buffer holds episodes of varied length written by 8 interleaved
// envs, the ring wrapped by an eighth of its capacity (so the oldest
// trajectories have lost their first rows). Each observation carries its
// (episode, step) so the setup checks, once per buffer, that samples and
// reconstructed next observations are the right rows.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/rbdb/rbd/sampler"
	"github.com/rbdb/rbd/storage"
)

const (
	sbenchEnvs      = 8    // envs interleaved in every extend
	sbenchActors    = 64   // envs of an actors-written buffer
	sbenchFillBatch = 4096 // rows per extend while filling
	sbenchBatch     = 256  // rows per transition batch
	sbenchSlices    = 8    // slices per slice batch (8 x 32 = 256 rows)
	sbenchSliceLen  = 32
	// sbenchCartpoleCap is CartPole-v1's episode limit: episodes that reach
	// it end truncated, the others terminated.
	sbenchCartpoleCap = 500
	// sbenchAtariCap is Atari's usual 108,000-frame limit at frame skip 4.
	sbenchAtariCap = 27_000
	// sbenchAtariRows is the capacity of the image buffers: 20,000 rows of
	// 84x84x4 uint8 are 565 MB, far beyond any cache.
	sbenchAtariRows = 20_000
	sbenchObsAtari  = 84 * 84 * 4
)

// sbenchConfig names one benchmark buffer.
type sbenchConfig struct {
	rows  int64 // capacity; rows + rows/8 are written
	atari bool  // uint8[84,84,4] observations instead of CartPole's float32[4]
	kind  storage.Kind
	// rowMeta is the buffer's row_meta ("": the default of its kind:
	// "row" for memory, "runs" for memmap).
	rowMeta storage.RowMetaLayout
	// actors: the buffer is written as sbenchActors actors write, each
	// extend 1-4 steps of one env drawn at random, so a trajectory's
	// rows are irregular distances apart; otherwise sbenchEnvs envs in
	// lockstep, sbenchFillBatch rows an extend.
	actors bool
}

func (c sbenchConfig) String() string {
	shape := "cartpole"
	if c.atari {
		shape = "atari"
	}
	if c.rowMeta != "" {
		shape += "/" + string(c.rowMeta)
	}
	if c.actors {
		shape += "/actors"
	}
	return fmt.Sprintf("%s/%s/%d", shape, c.kind, c.rows)
}

// sbenchSpec is the buffer under test: compact observations, the demo's
// CartPole fields (or an Atari frame stack), priorities on CartPole rows so
// every sampler kind runs on the same buffer.
func sbenchSpec(c sbenchConfig) storage.Spec {
	obs := storage.Field{Name: "observation", DType: storage.Float32, Shape: []int{4}}
	if c.atari {
		obs = storage.Field{Name: "observation", DType: storage.Uint8, Shape: []int{84, 84, 4}}
	}
	s := storage.Spec{
		Capacity: c.rows, Storage: c.kind, CompactObs: true, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			obs,
			{Name: "action", DType: storage.Int64},
			{Name: "next.reward", DType: storage.Float32},
			{Name: "next.done", DType: storage.Bool},
			{Name: "next.terminated", DType: storage.Bool},
			{Name: "next.truncated", DType: storage.Bool},
		},
	}
	if !c.atari {
		s.Priority = &storage.PriorityOptions{Alpha: 0.6, Eps: 1e-6}
	}
	s.RowMetaLayout = c.rowMeta
	if c.kind != storage.KindMemory {
		s.Durability = storage.DurabilityNone // the OS writes back; nothing to wait for
	}
	return s
}

// sbenchEpisodeLen draws an episode length. CartPole: nine episodes in ten
// are short (8 + Exp(30) steps, about half of them below a 32-step slice),
// one in ten long (100 + Exp(300), cut at 500 and then truncated). Atari:
// 200 + Exp(800), cut at 27,000.
func sbenchEpisodeLen(rng *rand.Rand, atari bool) (n int, truncated bool) {
	if atari {
		n = 200 + int(rng.ExpFloat64()*800)
		return min(n, sbenchAtariCap), n >= sbenchAtariCap
	}
	if rng.IntN(10) == 0 {
		n = 100 + int(rng.ExpFloat64()*300)
	} else {
		n = 8 + int(rng.ExpFloat64()*30)
	}
	return min(n, sbenchCartpoleCap), n >= sbenchCartpoleCap
}

// sbenchEnv is the episode an env is in.
type sbenchEnv struct {
	ep, step, length int
	truncated        bool
}

// sbenchWriter produces rows batch after batch, reusing its byte slices
// (Extend copies them into the ring before it returns).
type sbenchWriter struct {
	atari  bool
	obsB   int
	rng    *rand.Rand
	envs   []sbenchEnv
	actor  int // the env of every row of a batch (actors), or -1: round robin
	nextEp int
	frame  []byte // template of an Atari observation
	fields map[string][]byte
	env    []int64
}

func newSbenchWriter(c sbenchConfig) *sbenchWriter {
	w := &sbenchWriter{atari: c.atari, obsB: 16, rng: rand.New(rand.NewPCG(1, uint64(c.rows))), envs: make([]sbenchEnv, sbenchEnvs), actor: -1}
	if c.actors {
		w.envs = make([]sbenchEnv, sbenchActors)
	}
	if c.atari {
		w.obsB = sbenchObsAtari
		w.frame = make([]byte, sbenchObsAtari)
		for i := range w.frame {
			w.frame[i] = byte(w.rng.IntN(256))
		}
	}
	for e := range w.envs {
		w.startEpisode(e)
	}
	w.fields = map[string][]byte{}
	return w
}

func (w *sbenchWriter) startEpisode(e int) {
	n, tr := sbenchEpisodeLen(w.rng, w.atari)
	w.envs[e] = sbenchEnv{ep: w.nextEp, length: n, truncated: tr}
	w.nextEp++
}

// putObs writes the observation of (ep, step) into dst: CartPole rows are
// [ep, step, step/100, -step/100] (exact in float32 below 2^24), Atari
// rows start with ep and step as two uint64 and continue with the frame.
func (w *sbenchWriter) putObs(dst []byte, ep, step int) {
	if w.atari {
		copy(dst[16:], w.frame[16:])
	} else {
		binary.LittleEndian.PutUint32(dst[8:], math.Float32bits(float32(step)/100))
		binary.LittleEndian.PutUint32(dst[12:], math.Float32bits(-float32(step)/100))
	}
	sbenchPutStamp(dst, w.atari, ep, step)
}

func sbenchPutStamp(dst []byte, atari bool, ep, step int) {
	if atari {
		binary.LittleEndian.PutUint64(dst, uint64(ep))
		binary.LittleEndian.PutUint64(dst[8:], uint64(step))
		return
	}
	binary.LittleEndian.PutUint32(dst, math.Float32bits(float32(ep)))
	binary.LittleEndian.PutUint32(dst[4:], math.Float32bits(float32(step)))
}

// sbenchStamp reads back (ep, step) from an observation.
func sbenchStamp(obs []byte, atari bool) (ep, step int64) {
	if atari {
		return int64(binary.LittleEndian.Uint64(obs)), int64(binary.LittleEndian.Uint64(obs[8:]))
	}
	return int64(math.Float32frombits(binary.LittleEndian.Uint32(obs))),
		int64(math.Float32frombits(binary.LittleEndian.Uint32(obs[4:])))
}

func sbenchBool(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func sbenchGrow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// batch returns the next n rows, envs round robin (or all of w.actor's
// env); done rows carry their final observation (one per done row, the
// compact form).
func (w *sbenchWriter) batch(n int) *storage.Batch {
	f := w.fields
	obs := sbenchGrow(f["observation"], n*w.obsB)
	act := sbenchGrow(f["action"], n*8)
	rew := sbenchGrow(f["next.reward"], n*4)
	done := sbenchGrow(f["next.done"], n)
	term := sbenchGrow(f["next.terminated"], n)
	trunc := sbenchGrow(f["next.truncated"], n)
	tail := f["next.observation"][:0]
	if cap(w.env) < n {
		w.env = make([]int64, n)
	}
	w.env = w.env[:n]
	for r := range n {
		e := r % sbenchEnvs
		if w.actor >= 0 {
			e = w.actor
		}
		st := &w.envs[e]
		w.env[r] = int64(e)
		w.putObs(obs[r*w.obsB:(r+1)*w.obsB], st.ep, st.step)
		binary.LittleEndian.PutUint64(act[8*r:], uint64(st.step&1))
		binary.LittleEndian.PutUint32(rew[4*r:], math.Float32bits(1))
		d := st.step == st.length-1
		done[r], term[r], trunc[r] = sbenchBool(d), sbenchBool(d && !st.truncated), sbenchBool(d && st.truncated)
		if !d {
			st.step++
			continue
		}
		k := len(tail)
		tail = slices.Grow(tail, w.obsB)[:k+w.obsB]
		w.putObs(tail[k:], st.ep, st.step+1)
		w.startEpisode(e)
	}
	f["observation"], f["action"], f["next.reward"] = obs, act, rew
	f["next.done"], f["next.terminated"], f["next.truncated"], f["next.observation"] = done, term, trunc, tail
	return &storage.Batch{Rows: n, Fields: f, Env: w.env}
}

// sbenchBuf is a filled benchmark buffer.
type sbenchBuf struct {
	db  *DB
	buf *Buffer
}

// sbenchCache holds the buffers of one top-level benchmark.
type sbenchCache struct {
	mu   sync.Mutex
	bufs map[sbenchConfig]*sbenchBuf
}

// newSbenchCache returns a cache whose buffers are closed when the
// top-level benchmark b ends.
func newSbenchCache(b *testing.B) *sbenchCache {
	c := &sbenchCache{bufs: map[sbenchConfig]*sbenchBuf{}}
	b.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, sb := range c.bufs {
			sb.db.Close()
		}
		c.bufs = nil
	})
	return c
}

// get returns the buffer of cfg, filling it on first use. dir must outlive
// the top-level benchmark (its b.TempDir).
func (c *sbenchCache) get(b *testing.B, dir string, cfg sbenchConfig) *Buffer {
	b.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if sb := c.bufs[cfg]; sb != nil {
		return sb.buf
	}
	db, err := Open(fmt.Sprintf("%s/%d", dir, len(c.bufs)), nil)
	if err != nil {
		b.Fatal(err)
	}
	buf, _, err := db.CreateBuffer("bench", sbenchSpec(cfg))
	if err != nil {
		db.Close()
		b.Fatal(err)
	}
	c.bufs[cfg] = &sbenchBuf{db: db, buf: buf}
	sbenchFill(b, buf, cfg)
	sbenchCheck(b, buf, cfg)
	return buf
}

// sbenchFill writes rows + rows/8 rows in batches of sbenchFillBatch, then
// spreads the priorities (Exp(1)) so prioritised draws and weights vary.
func sbenchFill(b *testing.B, buf *Buffer, cfg sbenchConfig) {
	w := newSbenchWriter(cfg)
	total := cfg.rows + cfg.rows/8
	for done := int64(0); done < total; {
		n := int(min(sbenchFillBatch, total-done))
		if cfg.actors {
			w.actor = w.rng.IntN(len(w.envs))
			n = int(min(1+w.rng.Int64N(4), total-done))
		}
		if _, err := buf.Extend("bench", w.batch(n)); err != nil {
			b.Fatal(err)
		}
		done += int64(n)
	}
	if cfg.atari {
		return
	}
	rng := rand.New(rand.NewPCG(2, uint64(cfg.rows)))
	seqs, prios := make([]int64, 0, 1<<16), make([]float64, 0, 1<<16)
	for s := total - cfg.rows; s < total; {
		seqs, prios = seqs[:0], prios[:0]
		for ; s < total && len(seqs) < cap(seqs); s++ {
			seqs, prios = append(seqs, s), append(prios, rng.ExpFloat64())
		}
		if _, _, err := buf.UpdatePriorities(seqs, prios); err != nil {
			b.Fatal(err)
		}
	}
}

// sbenchCheck samples the buffer once with a transition and a slice
// sampler and checks the rows against their stamps: the step tensor, and
// next.observation = the observation of (episode, step+1).
func sbenchCheck(b *testing.B, buf *Buffer, cfg sbenchConfig) {
	b.Helper()
	reqs := []*SampleRequest{
		{Sampler: sampler.Uniform, BatchSize: sbenchBatch, Seed: new(uint64(1))},
		{Sampler: sampler.Slice, NumSlices: sbenchSlices, SliceLen: sbenchSliceLen, Seed: new(uint64(2))},
	}
	for _, req := range reqs {
		got, err := buf.Sample(context.Background(), req, nil)
		if err != nil {
			b.Fatalf("%v: check %s: %v", cfg, req.Sampler, err)
		}
		obs, _ := got.Tensor("observation")
		next, _ := got.Tensor("next.observation")
		step, _ := got.Tensor("step")
		valid, hasValid := got.Tensor("next.observation_valid")
		rb := len(obs.Data) / (len(step.Data) / 8)
		for i := range len(step.Data) / 8 {
			ep, st := sbenchStamp(obs.Data[i*rb:], cfg.atari)
			if want := int64(binary.LittleEndian.Uint64(step.Data[8*i:])); st != want {
				b.Fatalf("%v: %s row %d: observation of step %d, want step %d", cfg, req.Sampler, i, st, want)
			}
			if hasValid && valid.Data[i] == 0 {
				continue
			}
			if nep, nst := sbenchStamp(next.Data[i*rb:], cfg.atari); nep != ep || nst != st+1 {
				b.Fatalf("%v: %s row %d: next observation of (ep %d, step %d), want (%d, %d)", cfg, req.Sampler, i, nep, nst, ep, st+1)
			}
		}
	}
}

// sbenchRun samples req in a b.Loop and reports rows/s, batches/s and the
// answer's GB/s. None of these draws should be not ready (without-replacement
// epochs no longer end on an empty batch: docs/sampling.md, Known
// problems); one that is gets retried once and counted as "notready/op",
// so that a regression shows in the numbers.
func sbenchRun(b *testing.B, buf *Buffer, req *SampleRequest) {
	ctx := context.Background()
	var rows, bytes, notReady int64
	var s uint64
	b.ReportAllocs()
	for b.Loop() {
		s++
		req.Seed = &s
		got, err := buf.Sample(ctx, req, nil)
		if errors.Is(err, ErrNotReady) {
			notReady++
			got, err = buf.Sample(ctx, req, nil)
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range got.Tensors {
			bytes += int64(len(t.Data))
			if t.Name == "seq" {
				rows += int64(len(t.Data) / 8)
			}
		}
		got.Release() // a learner loop hands the memory back, as the server does
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(rows)/sec, "rows/s")
	b.ReportMetric(float64(b.N)/sec, "batches/s")
	b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
	if notReady > 0 {
		b.ReportMetric(float64(notReady)/float64(b.N), "notready/op")
	}
}

func sbenchRowsLabel(n int64) string {
	e := 0
	for v := n; v >= 10 && v%10 == 0; v /= 10 {
		e++
	}
	if n == int64(math.Pow10(e)) {
		return fmt.Sprintf("1e%d", e)
	}
	return fmt.Sprint(n)
}

// BenchmarkSample draws batches of 256 rows (8 slices of 32 for slice
// kinds) with every sampler kind, all keys, next-state reconstruction on,
// from CartPole buffers of 10^3, 10^5 and 10^7 rows: the cost per batch
// should not grow with the number of rows beyond what cache misses add.
//
// go test . -run '^$' -bench BenchmarkSample -benchtime 2s -count 3 -cpu 2
func BenchmarkSample(b *testing.B) {
	sbenchKinds(b, storage.KindMemory, sampler.Kinds, []int64{1e3, 1e5, 1e7}, "-short: 10^7 rows take about 2 GB and a few seconds to fill")
}

// BenchmarkSampleRunMeta is BenchmarkSample's uniform and slice draws from
// buffers with run records (row_meta "runs") next to row_meta "row", each
// spelled out (a memmap buffer's default is "runs", a memory buffer's
// "row"): memory buffers (a 16-byte record in the row group and a run record per
// stretch of a trajectory, against a 32-byte record), and memmap buffers
// (16-byte memory records and rows.meta format version 2, against 64-byte
// file records read from the page cache and a stamp table); and buffers
// with strided runs (row_meta "strided": an 8-byte record, the row's
// offset in its run a multiply away; a memmap buffer's files are those of
// "runs").
//
// go test . -run '^$' -bench BenchmarkSampleRunMeta -benchtime 1s -count 3
func BenchmarkSampleRunMeta(b *testing.B) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	for _, sk := range []storage.Kind{storage.KindMemory, storage.KindMemmap} {
		for _, kind := range []string{"uniform", "slice"} {
			for _, rows := range []int64{1e5, 1e7} {
				for _, layout := range []storage.RowMetaLayout{storage.RowMetaPerRow, storage.RowMetaRuns, storage.RowMetaStrided, storage.RowMetaBlocks} {
					if layout == storage.RowMetaBlocks && sk != storage.KindMemmap {
						continue
					}
					b.Run(fmt.Sprintf("kind=%s/sampler=%s/rows=%s/row_meta=%s", sk, kind, sbenchRowsLabel(rows), layout), func(b *testing.B) {
						if testing.Short() && rows > 1e5 {
							b.Skip("-short: 10^7 rows take about 2 GB and a few seconds to fill")
						}
						buf := cache.get(b, dir, sbenchConfig{rows: rows, kind: sk, rowMeta: layout})
						req := &SampleRequest{Sampler: kind, BatchSize: sbenchBatch}
						if sampler.IsSlice(kind) {
							req = &SampleRequest{Sampler: kind, NumSlices: sbenchSlices, SliceLen: sbenchSliceLen}
						}
						sbenchRun(b, buf, req)
					})
				}
			}
		}
	}
}

// BenchmarkSampleActors is BenchmarkSampleRunMeta's memory draws from
// buffers written as actors write to a server (sbenchConfig.actors: 64
// envs, 1-4 steps of one env an extend): a trajectory's rows come at
// irregular distances, so the index packs their seqs (seqRun) and strided
// runs are irregular runs, whose rows' offsets and distances are in a side
// table.
//
// go test . -run '^$' -bench BenchmarkSampleActors -benchtime 1s -count 3
func BenchmarkSampleActors(b *testing.B) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	for _, kind := range []string{"uniform", "slice"} {
		for _, rows := range []int64{1e5, 1e6} {
			for _, layout := range []storage.RowMetaLayout{storage.RowMetaPerRow, storage.RowMetaRuns, storage.RowMetaStrided} {
				b.Run(fmt.Sprintf("sampler=%s/rows=%s/row_meta=%s", kind, sbenchRowsLabel(rows), layout), func(b *testing.B) {
					if testing.Short() && rows > 1e5 {
						b.Skip("-short: 10^6 rows take half a million extends to fill")
					}
					buf := cache.get(b, dir, sbenchConfig{rows: rows, kind: storage.KindMemory, rowMeta: layout, actors: true})
					req := &SampleRequest{Sampler: kind, BatchSize: sbenchBatch}
					if sampler.IsSlice(kind) {
						req = &SampleRequest{Sampler: kind, NumSlices: sbenchSlices, SliceLen: sbenchSliceLen}
					}
					sbenchRun(b, buf, req)
				})
			}
		}
	}
}

// sbenchKinds runs BenchmarkSample's draws (256 rows, or 8 slices of 32)
// for each sampler kind and capacity, from buffers of storage kind sk;
// -short skips capacities above 10^5 with skipWhy.
func sbenchKinds(b *testing.B, sk storage.Kind, kinds []string, capacities []int64, skipWhy string) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	for _, kind := range kinds {
		for _, rows := range capacities {
			b.Run(fmt.Sprintf("sampler=%s/rows=%s", kind, sbenchRowsLabel(rows)), func(b *testing.B) {
				if testing.Short() && rows > 1e5 {
					b.Skip(skipWhy)
				}
				buf := cache.get(b, dir, sbenchConfig{rows: rows, kind: sk})
				req := &SampleRequest{Sampler: kind, BatchSize: sbenchBatch}
				if sampler.IsSlice(kind) {
					req = &SampleRequest{Sampler: kind, NumSlices: sbenchSlices, SliceLen: sbenchSliceLen}
				}
				sbenchRun(b, buf, req)
			})
		}
	}
}

// BenchmarkSampleWithoutNextState draws uniform batches of 256 with
// next-state reconstruction off: the draw then tests each candidate's stamp
// (Index.Live), which in a memory buffer is in the row's line, where the
// next-known test reads a bit of the index.
//
// go test . -run '^$' -bench BenchmarkSampleWithoutNextState -benchtime 2s -count 3 -cpu 2
func BenchmarkSampleWithoutNextState(b *testing.B) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	off := false
	for _, rows := range []int64{1e5, 1e6} {
		b.Run("rows="+sbenchRowsLabel(rows), func(b *testing.B) {
			if testing.Short() && rows > 1e5 {
				b.Skip("-short: 10^6 rows")
			}
			buf := cache.get(b, dir, sbenchConfig{rows: rows, kind: storage.KindMemory})
			sbenchRun(b, buf, &SampleRequest{BatchSize: sbenchBatch, NextState: &off})
		})
	}
}

// BenchmarkSampleMemmap is BenchmarkSample's uniform and slice draws from
// memory-mapped buffers, whose row records, stamps and fields are in
// separate files and tables (no row group): each row is several cache
// misses, not one.
//
// go test . -run '^$' -bench BenchmarkSampleMemmap -benchtime 2s -count 3 -cpu 2
func BenchmarkSampleMemmap(b *testing.B) {
	sbenchKinds(b, storage.KindMemmap, []string{sampler.Uniform, sampler.Slice}, []int64{1e5, 1e7}, "-short: 10^7 rows take about 1.5 GB of files")
}

// BenchmarkSliceR2D2 draws R2D2-shaped batches, 64 slices of 80 steps
// (strict: only the trajectories with 80 rows or more qualify, about 18%),
// with next-state reconstruction, without and with 5-step returns.
//
// go test . -run '^$' -bench BenchmarkSliceR2D2 -benchtime 2s -count 3 -cpu 2
func BenchmarkSliceR2D2(b *testing.B) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	for _, rows := range []int64{1e5, 1e6} {
		for _, n := range []int{1, 5} {
			b.Run(fmt.Sprintf("rows=%s/n_step=%d", sbenchRowsLabel(rows), n), func(b *testing.B) {
				if testing.Short() && rows > 1e5 {
					b.Skip("-short: 10^6 rows")
				}
				buf := cache.get(b, dir, sbenchConfig{rows: rows, kind: storage.KindMemory})
				req := &SampleRequest{Sampler: sampler.Slice, NumSlices: 64, SliceLen: 80, NextState: new(true)}
				if n > 1 {
					req.NStep = &NStep{N: n, Gamma: 0.99}
				}
				sbenchRun(b, buf, req)
			})
		}
	}
}

// BenchmarkGatherWithNextState samples 256 Atari rows uniformly and returns
// observation and the reconstructed next.observation (2 x 256 x 28,224 B
// = 14.5 MB per batch) from a compact buffer of 20,000 rows, next to
// impl=copy: a plain Go copy of the same bytes (512 rows at random
// indices) from a []byte of the same size. The design's target is rbd at
// least half of copy's GB/s.
//
// go test . -run '^$' -bench BenchmarkGatherWithNextState -benchtime 2s -count 3 -cpu 2
func BenchmarkGatherWithNextState(b *testing.B) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	const batchBytes = 2 * sbenchBatch * sbenchObsAtari
	for _, kind := range []storage.Kind{storage.KindMemory, storage.KindMemmap} {
		b.Run(fmt.Sprintf("impl=rbd/storage=%s", kind), func(b *testing.B) {
			buf := cache.get(b, dir, sbenchConfig{rows: sbenchAtariRows, atari: true, kind: kind})
			req := &SampleRequest{Sampler: sampler.Uniform, BatchSize: sbenchBatch, Keys: []string{"observation", "next.observation"}}
			ctx := context.Background()
			var s uint64
			b.SetBytes(batchBytes)
			b.ReportAllocs()
			for b.Loop() {
				s++
				req.Seed = &s
				got, err := buf.Sample(ctx, req, nil)
				if err != nil {
					b.Fatal(err)
				}
				got.Release()
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(b.N)*sbenchBatch/sec, "rows/s")
			b.ReportMetric(float64(b.N)/sec, "batches/s")
			b.ReportMetric(float64(b.N)*batchBytes/sec/1e9, "GB/s")
		})
	}
	b.Run("impl=copy", func(b *testing.B) {
		const rowB = sbenchObsAtari
		src := make([]byte, sbenchAtariRows*rowB)
		frame := newSbenchWriter(sbenchConfig{rows: sbenchAtariRows, atari: true}).frame
		for i := range sbenchAtariRows {
			copy(src[i*rowB:], frame) // every page really backed, as in the buffer
		}
		dst := make([]byte, 2*sbenchBatch*rowB)
		rng := rand.New(rand.NewPCG(3, 4))
		b.SetBytes(batchBytes)
		b.ReportAllocs()
		for b.Loop() {
			for j := range 2 * sbenchBatch {
				i := rng.IntN(sbenchAtariRows)
				copy(dst[j*rowB:(j+1)*rowB], src[i*rowB:(i+1)*rowB])
			}
		}
		sec := b.Elapsed().Seconds()
		b.ReportMetric(float64(b.N)*sbenchBatch/sec, "rows/s")
		b.ReportMetric(float64(b.N)/sec, "batches/s")
		b.ReportMetric(float64(b.N)*batchBytes/sec/1e9, "GB/s")
	})
}

// BenchmarkSampleBatchSizes draws uniform CartPole batches of 256, 2048 and
// 4096 rows from 10^5 rows: 2048 is the largest batch whose copy is made
// while the sample holds the index (gatherLockedMaxBytes), so its time
// bounds how long a writer can wait for one sample; 4096 copies lock-free.
//
// go test . -run '^$' -bench BenchmarkSampleBatchSizes -benchtime 2s
func BenchmarkSampleBatchSizes(b *testing.B) {
	dir := b.TempDir() // removed after the cache's buffers are closed
	cache := newSbenchCache(b)
	for _, n := range []int{256, 2048, 4096} {
		buf := cache.get(b, dir, sbenchConfig{rows: 1e5, kind: storage.KindMemory})
		req := &SampleRequest{BatchSize: n}
		p, err := buf.planSample(req, 0)
		if err != nil {
			b.Fatal(err)
		}
		copyKind := "lock-free"
		if p.gatherLocked {
			copyKind = "under-index"
		}
		b.Run(fmt.Sprintf("batch=%d/copy=%s", n, copyKind), func(b *testing.B) { sbenchRun(b, buf, req) })
	}
}
