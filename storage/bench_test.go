package storage

// Benchmarks of the storage hot paths, each next to the machine limit it
// should be compared with (see "Performance targets" in design.md and the
// numbers in docs/performance.md).
//
// Run everything once as a smoke test (CI):
//
//	go test ./storage -run '^$' -bench . -benchtime 1x
//
// Compare two versions:
//
//	go test ./storage -run '^$' -bench . -benchtime 2s -count 6 -cpu 2 | tee new.txt
//	go tool benchstat old.txt new.txt
//
// Every benchmark sets up its buffer outside the timed loop (b.Loop runs
// the body once per -count) and closes it in b.Cleanup, so at most one
// Atari-sized buffer (20,000 rows, 565 MB) and one baseline array of the
// same size are alive at a time.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

const (
	benchBatchRows = 256 // rows per extend and per gather
	benchEnvs      = 8   // envs interleaved in one extend batch
	benchSeqLists  = 1024
)

// benchShape is a row layout with the capacity used for it.
type benchShape struct {
	name     string
	capacity int64
	episode  int // steps per episode and env, which sets where done rows fall
	spec     func(kind Kind, dur Durability, capacity int64) Spec
}

var benchShapes = []benchShape{
	{name: "cartpole", capacity: 100_000, episode: 200, spec: benchCartpoleSpec},
	{name: "atari", capacity: 20_000, episode: 1000, spec: benchAtariSpec},
}

// benchCartpoleSpec is testSpec's CartPole row: float32[4] observation and
// next.observation, int64 action, float32 reward and the three flags (47 B).
func benchCartpoleSpec(kind Kind, dur Durability, capacity int64) Spec {
	s := testSpec(kind, capacity, false)
	s.Durability = dur
	return s
}

// benchAtariSpec is an Atari row: uint8[84,84,4] observation stored once
// (compact_obs), int64 action, float32 reward and the flags (28,239 B).
func benchAtariSpec(kind Kind, dur Durability, capacity int64) Spec {
	return Spec{
		Capacity: capacity,
		Storage:  kind,
		Fields: []Field{
			{Name: "observation", DType: Uint8, Shape: []int{84, 84, 4}},
			{Name: "action", DType: Int64, Shape: []int{}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
			{Name: "next.done", DType: Bool, Shape: []int{}},
			{Name: "next.terminated", DType: Bool, Shape: []int{}},
			{Name: "next.truncated", DType: Bool, Shape: []int{}},
		},
		CompactObs: true,
		ObsKeys:    []string{"observation"},
		Durability: dur,
	}
}

// benchRowBytes is the size of one row over the spec's fields.
func benchRowBytes(spec Spec) int {
	n := 0
	for _, f := range spec.Fields {
		n += f.RowBytes()
	}
	return n
}

// benchBatches is a cycle of extend batches from one stream of benchEnvs
// envs. The field bytes are random and shared by every batch of the cycle;
// only the flag columns differ, so that each env's episodes end every
// shape.episode steps (envs staggered) however long the run.
type benchBatches struct {
	cycle    []*Batch
	rowBytes int
}

func newBenchBatches(spec Spec, episode int) *benchBatches {
	rng := rand.New(rand.NewPCG(1, 2))
	n := benchBatchRows
	shared := map[string][]byte{}
	for _, f := range spec.Fields {
		switch f.Name {
		case "next.done", "next.terminated", "next.truncated":
			continue
		}
		v := make([]byte, n*f.RowBytes())
		for i := 0; i+8 <= len(v); i += 8 {
			binary.LittleEndian.PutUint64(v[i:], rng.Uint64())
		}
		shared[f.Name] = v
	}
	env := make([]int64, n)
	for r := range env {
		env[r] = int64(r % benchEnvs)
	}
	perEnv := n / benchEnvs
	cycle := episode / benchGCD(episode, perEnv)
	bb := &benchBatches{rowBytes: benchRowBytes(spec)}
	for i := 0; i < cycle; i++ {
		done := make([]byte, n)
		for r := range done {
			e := r % benchEnvs
			t := i*perEnv + r/benchEnvs + e*episode/benchEnvs
			if t%episode == episode-1 {
				done[r] = 1
			}
		}
		f := make(map[string][]byte, len(spec.Fields))
		for k, v := range shared {
			f[k] = v
		}
		f["next.done"], f["next.terminated"] = done, done
		f["next.truncated"] = make([]byte, n)
		bb.cycle = append(bb.cycle, &Batch{Rows: n, Fields: f, Env: env})
	}
	return bb
}

func (bb *benchBatches) at(i int) *Batch { return bb.cycle[i%len(bb.cycle)] }

func benchGCD(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// benchPrefillRows is how many rows benchBuffer writes: whole batches, at
// least one full ring, so later writes overwrite (and evict) rows.
func benchPrefillRows(capacity int64) int64 {
	return (capacity + benchBatchRows - 1) / benchBatchRows * benchBatchRows
}

// benchBuffer opens a store in a temporary directory, creates a buffer and
// fills its ring once from stream "w0". The store is closed in b.Cleanup.
func benchBuffer(b *testing.B, spec Spec, src *benchBatches) *Buffer {
	b.Helper()
	s := openStore(b, b.TempDir())
	b.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	})
	buf := mustCreate(b, s, "bench", spec)
	for i := 0; int64(i)*benchBatchRows < benchPrefillRows(spec.Capacity); i++ {
		mustExtend(b, buf, "w0", src.at(i))
	}
	return buf
}

// reportRate adds per-second metrics computed from b.N and b.Elapsed.
func reportRate(b *testing.B, perOp float64, unit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(perOp*float64(b.N)/s, unit)
	}
}

// BenchmarkExtend appends batches of 256 rows (8 envs interleaved, episodes
// ending at a steady rate) to a full ring, so every row written also
// evicts one. writers=4 runs four streams concurrently on one buffer, four
// batches per op: with durability=fsync their syncs should be shared
// (group commit), so rows/s should rise well above writers=1.
//
//	go test ./storage -run '^$' -bench BenchmarkExtend -benchtime 2s -count 6 -cpu 2 | tee new.txt
//	go tool benchstat -col /kind old.txt new.txt
func BenchmarkExtend(b *testing.B) {
	type config struct {
		kind    Kind
		dur     Durability
		writers []int
	}
	configs := []config{
		{KindMemory, "", []int{1}},
		{KindMemmap, DurabilityNone, []int{1}},
		{KindMemmap, DurabilityFlush, []int{1}},
		{KindMemmap, DurabilityFsync, []int{1, 4}},
	}
	for _, c := range configs {
		dname := c.dur
		if dname == "" {
			dname = DurabilityNone // memory buffers take no durability in their spec
		}
		for _, shape := range benchShapes {
			for _, w := range c.writers {
				name := fmt.Sprintf("kind=%s/durability=%s/row=%s/writers=%d", c.kind, dname, shape.name, w)
				b.Run(name, func(b *testing.B) {
					benchExtend(b, shape.spec(c.kind, c.dur, shape.capacity), shape.episode, w)
				})
			}
		}
	}
}

// BenchmarkExtendRunMeta is BenchmarkExtend's memory buffers and memmap
// buffers (durability none) with run records (row_meta "runs"), next to
// row_meta "row" (each spelled out): what placing each row in its trajectory's run costs a
// writer, and for memmap buffers what rows.meta format version 2 (16-byte
// records and a run log, beside 16-byte memory records) costs against
// version 1 (64-byte records and a stamp table), and what strided runs
// (row_meta "strided": 8-byte memory records) cost. disk_B/row
// is the buffer's files over its capacity (Info.DiskBytes, memmap only).
//
// go test ./storage -run '^$' -bench BenchmarkExtendRunMeta -benchtime 1s -count 3
func BenchmarkExtendRunMeta(b *testing.B) {
	for _, kind := range []Kind{KindMemory, KindMemmap} {
		for _, shape := range benchShapes {
			for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaStrided, RowMetaBlocks} {
				if layout == RowMetaBlocks && kind != KindMemmap {
					continue
				}
				b.Run(fmt.Sprintf("kind=%s/row=%s/row_meta=%s", kind, shape.name, layout), func(b *testing.B) {
					dur := DurabilityNone
					if kind == KindMemory {
						dur = ""
					}
					spec := shape.spec(kind, dur, shape.capacity)
					spec.RowMetaLayout = layout
					buf := benchExtend(b, spec, shape.episode, 1)
					if kind != KindMemory {
						info, err := buf.Info()
						if err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(float64(info.DiskBytes)/float64(spec.Capacity), "disk_B/row")
					}
				})
			}
		}
	}
}

// BenchmarkExtendActors writes as actors write to a server: 64 actors,
// each a stream of its own with one env (streams=64), each extend one step
// of an actor drawn at random (episodes of 200 steps), so a trajectory's
// rows are irregular distances apart (the index packs them, strided tables
// keep irregular runs); streams=1 writes the actors as 64 envs of one
// stream, as a writer that multiplexes actors does. An op is 256 extends,
// as many rows as BenchmarkExtendRunMeta's op.
//
//	go test ./storage -run '^$' -bench BenchmarkExtendActors -benchtime 2s -count 6
func BenchmarkExtendActors(b *testing.B) {
	const actors, episode = 64, 200
	for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaStrided} {
		for _, nStreams := range []int{actors, 1} {
			b.Run(fmt.Sprintf("kind=memory/row=cartpole/row_meta=%s/streams=%d", layout, nStreams), func(b *testing.B) {
				spec := benchCartpoleSpec(KindMemory, "", 100_000)
				spec.RowMetaLayout = layout
				src := newBenchBatches(spec, episode)
				buf := benchBuffer(b, spec, src)
				// One row of every field, and the same row with done set.
				row := func(env int64, done bool) *Batch {
					f := map[string][]byte{}
					for name, v := range src.at(0).Fields {
						w := len(v) / benchBatchRows
						f[name] = slices.Clone(v[:w])
					}
					flag := []byte{0}
					if done {
						flag[0] = 1
					}
					f["next.done"], f["next.terminated"] = flag, flag
					return &Batch{Rows: 1, Fields: f, Env: []int64{env}}
				}
				var steps [actors]int
				var rows, ends [actors]*Batch
				var streams [actors]string
				for a := range actors {
					env, stream := int64(0), fmt.Sprintf("actor%d", a)
					if nStreams == 1 {
						env, stream = int64(a), "actors"
					}
					rows[a], ends[a], streams[a] = row(env, false), row(env, true), stream
				}
				rng := rand.New(rand.NewPCG(9, 10))
				b.SetBytes(int64(benchBatchRows * src.rowBytes))
				b.ReportAllocs()
				for b.Loop() {
					for range benchBatchRows {
						a := rng.IntN(actors)
						batch := rows[a]
						if steps[a]++; steps[a]%episode == 0 {
							batch = ends[a]
						}
						if _, err := buf.Extend(streams[a], batch); err != nil {
							b.Fatal(err)
						}
					}
				}
				reportRate(b, benchBatchRows, "rows/s")
			})
		}
	}
}

func benchExtend(b *testing.B, spec Spec, episode, writers int) *Buffer {
	src := newBenchBatches(spec, episode)
	buf := benchBuffer(b, spec, src)
	b.SetBytes(int64(writers * benchBatchRows * src.rowBytes))
	b.ReportAllocs()
	if writers == 1 {
		// Continue w0, whose trajectories the prefill left open.
		i := int(benchPrefillRows(spec.Capacity) / benchBatchRows)
		// Per extend, what a writer sees of the slow ones: the largest
		// latency, and the p99 of the last 2^16 extends, kept in memory
		// allocated before the loop so that B/op and allocs/op stay the
		// extend's own.
		lat := make([]time.Duration, 1<<16)
		var n int
		var most time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := buf.Extend("w0", src.at(i)); err != nil {
				b.Fatal(err)
			}
			d := time.Since(t0)
			lat[n%len(lat)], most = d, max(most, d)
			n++
			i++
		}
		lat = lat[:min(n, len(lat))]
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99_µs")
		b.ReportMetric(float64(most.Microseconds()), "max_µs")
	} else {
		// Long-lived writers, started together once per op.
		start := make([]chan struct{}, writers)
		errs := make([]error, writers)
		var wg sync.WaitGroup
		for w := range writers {
			start[w] = make(chan struct{})
			go func() {
				stream := fmt.Sprintf("w%d", w)
				for i := 0; ; i++ {
					if _, ok := <-start[w]; !ok {
						return
					}
					_, err := buf.Extend(stream, src.at(i))
					if err != nil && errs[w] == nil {
						errs[w] = err
					}
					wg.Done()
				}
			}()
		}
		for b.Loop() {
			wg.Add(writers)
			for _, ch := range start {
				ch <- struct{}{}
			}
			wg.Wait()
		}
		for _, ch := range start {
			close(ch)
		}
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	batches := float64(writers)
	reportRate(b, batches*benchBatchRows, "rows/s")
	reportRate(b, batches, "batches/s")
	return buf
}

// BenchmarkGather copies 256 rows chosen uniformly among the live rows of a
// full buffer, every field of the spec, into reused destination buffers;
// meta=true also fills the row metadata (with next links). The seq lists
// are drawn once with a fixed seed. Next to it, in the same run:
// baseline=copy gathers the same slots with one plain copy per row from a
// row-major []byte of the same size, and baseline=copycols with one copy
// per field from a column-major one (the layout of file-backed buffers;
// memory buffers interleave their small fields row-major). The target is
// gather >= 0.8x baseline=copy.
//
//	go test ./storage -run '^$' -bench BenchmarkGather -benchtime 2s -count 6 -cpu 2 | tee new.txt
//	go tool benchstat -col /kind,/baseline new.txt
func BenchmarkGather(b *testing.B) {
	for _, shape := range benchShapes {
		b.Run("row="+shape.name, func(b *testing.B) {
			capacity := shape.capacity
			rng := rand.New(rand.NewPCG(3, 4))
			offs := make([]int64, benchSeqLists*benchBatchRows) // offsets in the live range
			for i := range offs {
				offs[i] = rng.Int64N(capacity)
			}
			lo := benchPrefillRows(capacity) - capacity // the oldest live seq
			for _, kind := range kinds {
				b.Run("kind="+string(kind), func(b *testing.B) {
					dur := Durability("")
					if kind != KindMemory {
						dur = DurabilityNone
					}
					spec := shape.spec(kind, dur, capacity)
					buf := benchBuffer(b, spec, newBenchBatches(spec, shape.episode))
					seqs := make([]int64, len(offs))
					for i, o := range offs {
						seqs[i] = lo + o
					}
					var cols []Column
					for _, f := range spec.Fields {
						c, ok := buf.Column(f.Name)
						if !ok {
							b.Fatalf("no column %q", f.Name)
						}
						cols = append(cols, c)
					}
					benchWarm(b, buf, cols, lo, capacity)
					for _, withMeta := range []bool{false, true} {
						b.Run(fmt.Sprintf("meta=%v", withMeta), func(b *testing.B) {
							benchGather(b, buf, cols, seqs, withMeta)
						})
					}
					if kind == KindCompressed {
						return // CopyIndexed refuses chunked columns
					}
					for _, withMeta := range []bool{false, true} {
						b.Run(fmt.Sprintf("indexed/meta=%v", withMeta), func(b *testing.B) {
							benchCopyIndexed(b, buf, cols, seqs, withMeta)
						})
					}
				})
			}
			spec := shape.spec(KindMemory, "", capacity)
			for _, layout := range []string{"copy", "copycols"} {
				b.Run("baseline="+layout, func(b *testing.B) {
					slots := make([]int64, len(offs))
					for i, o := range offs {
						slots[i] = (lo + o) % capacity
					}
					benchCopyGather(b, spec, slots, layout == "copycols")
				})
			}
		})
	}
}

// benchWarm reads every live row once, so a memmap buffer is measured warm
// (pages resident and mapped).
func benchWarm(b *testing.B, buf *Buffer, cols []Column, lo, capacity int64) {
	b.Helper()
	seqs := make([]int64, benchBatchRows)
	dst := benchDst(cols, len(seqs))
	for s := lo; s < lo+capacity; s += int64(len(seqs)) {
		n := min(int64(len(seqs)), lo+capacity-s)
		for i := range n {
			seqs[i] = s + i
		}
		d := make([][]byte, len(dst))
		for i := range dst {
			d[i] = dst[i][:int(n)*cols[i].RowBytes]
		}
		if missing, err := buf.Gather(seqs[:n], cols, d, nil); err != nil || len(missing) > 0 {
			b.Fatalf("warm-up gather: %d missing, err %v", len(missing), err)
		}
	}
}

// benchDst makes destination buffers, faulted in so that the first timed
// gather does not pay for page faults.
func benchDst(cols []Column, rows int) [][]byte {
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = benchTouched(rows * c.RowBytes)
	}
	return dst
}

// benchTouched returns n bytes with every page written.
func benchTouched(n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

func benchGather(b *testing.B, buf *Buffer, cols []Column, seqs []int64, withMeta bool) {
	benchRead(b, buf, cols, seqs, withMeta, func(list []int64, dst [][]byte, meta []RowMeta) ([]int, error) {
		return buf.Gather(list, cols, dst, meta)
	})
}

// benchCopyIndexed is benchGather the way a sample of small rows copies:
// inside ReadIndex, Index.Rows for the metadata (meta=true), then
// Index.CopyIndexed.
func benchCopyIndexed(b *testing.B, buf *Buffer, cols []Column, seqs []int64, withMeta bool) {
	benchRead(b, buf, cols, seqs, withMeta, func(list []int64, dst [][]byte, meta []RowMeta) (missing []int, err error) {
		if rerr := buf.ReadIndex(func(ix Index) {
			if meta != nil {
				ix.Rows(list, meta)
			}
			missing, err = ix.CopyIndexed(list, cols, dst, missing[:0])
		}); rerr != nil {
			return nil, rerr
		}
		return missing, err
	})
}

// benchRead times read over the benchmark's seq lists, 256 rows at a time.
func benchRead(b *testing.B, buf *Buffer, cols []Column, seqs []int64, withMeta bool, read func(list []int64, dst [][]byte, meta []RowMeta) ([]int, error)) {
	dst := benchDst(cols, benchBatchRows)
	var meta []RowMeta
	if withMeta {
		meta = make([]RowMeta, benchBatchRows)
	}
	rowBytes := 0
	for _, c := range cols {
		rowBytes += c.RowBytes
	}
	b.SetBytes(int64(benchBatchRows * rowBytes))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		list := seqs[i*benchBatchRows : (i+1)*benchBatchRows]
		missing, err := read(list, dst, meta)
		if err != nil || len(missing) > 0 {
			b.Fatalf("read: %d missing, err %v", len(missing), err)
		}
		if i++; i == benchSeqLists {
			i = 0
		}
	}
	benchReportGather(b, rowBytes)
}

// benchCopyGather is the baseline: the same slots gathered with plain
// copies from one []byte as large as the buffer's columns together, laid
// out row-major (one copy per row) or column-major (one copy per field and
// row, as the store lays rows out).
func benchCopyGather(b *testing.B, spec Spec, slots []int64, columnar bool) {
	capacity := spec.Capacity
	var widths []int
	for _, f := range spec.Fields {
		widths = append(widths, f.RowBytes())
	}
	rowBytes := benchRowBytes(spec)
	data := make([]byte, capacity*int64(rowBytes))
	// Touch every page with non-zero bytes: untouched pages would all read
	// the kernel's shared zero page and flatter the baseline.
	var block [4096]byte
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range block {
		block[i] = byte(rng.Uint32())
	}
	for off := 0; off < len(data); off += len(block) {
		copy(data[off:], block[:])
	}
	b.SetBytes(int64(benchBatchRows * rowBytes))
	b.ReportAllocs()
	i := 0
	if !columnar {
		dst := benchTouched(benchBatchRows * rowBytes)
		rb := int64(rowBytes)
		for b.Loop() {
			for j, s := range slots[i*benchBatchRows : (i+1)*benchBatchRows] {
				copy(dst[j*rowBytes:(j+1)*rowBytes], data[s*rb:(s+1)*rb])
			}
			if i++; i == benchSeqLists {
				i = 0
			}
		}
	} else {
		cols := make([][]byte, len(widths))
		dst := make([][]byte, len(widths))
		off := int64(0)
		for c, w := range widths {
			cols[c] = data[off : off+capacity*int64(w)]
			off += capacity * int64(w)
			dst[c] = benchTouched(benchBatchRows * w)
		}
		for b.Loop() {
			for j, s := range slots[i*benchBatchRows : (i+1)*benchBatchRows] {
				for c, w := range widths {
					copy(dst[c][j*w:(j+1)*w], cols[c][s*int64(w):(s+1)*int64(w)])
				}
			}
			if i++; i == benchSeqLists {
				i = 0
			}
		}
	}
	benchReportGather(b, rowBytes)
}

func benchReportGather(b *testing.B, rowBytes int) {
	reportRate(b, float64(benchBatchRows*rowBytes)/1e9, "GB/s")
	reportRate(b, benchBatchRows, "rows/s")
	reportRate(b, 1, "batches/s")
}

// BenchmarkMemcpy is the machine limit: one copy of 64 MiB, larger than
// the last-level cache.
//
//	go test ./storage -run '^$' -bench BenchmarkMemcpy -benchtime 2s -count 6 -cpu 2 | tee new.txt
func BenchmarkMemcpy(b *testing.B) {
	const size = 64 << 20
	src, dst := benchTouched(size), benchTouched(size)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		copy(dst, src)
	}
	reportRate(b, size/1e9, "GB/s")
}

// BenchmarkReopen is what a restart costs: a memmap CartPole buffer of
// 10^6 rows (full, collector rows, closed cleanly), opened for writing and
// closed again, an op each. Recovery reads every row of the window to
// check it (version 2: its record's checksum; version 3: its block's),
// and the run log.
//
//	go test ./storage -run '^$' -bench BenchmarkReopen -benchtime 10x -count 6
func BenchmarkReopen(b *testing.B) {
	for _, layout := range []RowMetaLayout{RowMetaRuns, RowMetaBlocks} {
		b.Run(fmt.Sprintf("rows=1e6/row_meta=%s", layout), func(b *testing.B) {
			const capacity = 1_000_000
			spec := benchCartpoleSpec(KindMemmap, DurabilityNone, capacity)
			spec.RowMetaLayout = layout
			src := newBenchBatches(spec, 200)
			dir := b.TempDir()
			s := openStore(b, dir)
			buf := mustCreate(b, s, "bench", spec)
			for i := 0; int64(i)*benchBatchRows < capacity+benchBatchRows; i++ {
				mustExtend(b, buf, "w0", src.at(i))
			}
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				s, err := Open(dir, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b, capacity, "rows/s")
		})
	}
}
