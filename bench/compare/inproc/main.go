// Command inproc is the "rbd in-process from Go" leg of bench/compare: it
// writes the workload of bench/compare/run.py into a memory buffer of an
// embedded store (rbd.Open) in extends of 256 rows (or, with --actors, as
// that many actors write: one step of one actor an extend), then samples
// uniform batches of 256 for a few seconds, and prints one JSON line with
// rows/s, batches/s and the bytes held per transition.
//
//	go run ./bench/compare/inproc --workload cartpole --capacity 100000
//	go run ./bench/compare/inproc --capacity 1000000 --seconds 0 --settle   # what tests/resident checks
//	go run ./bench/compare/inproc --capacity 1000000 --seconds 1 --settle --row-meta strided --actors 64
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/storage"
)

// workload mirrors run.py's: n envs stepped together, episodes of fixed
// length with staggered starts, observations drawn from a pool of random
// frames, next observation = the env's observation one tick later.
type workload struct {
	obsShape []int
	obsDType storage.DType
	obsBytes int
	episode  int
	pool     [][]byte
}

func newWorkload(name string) (*workload, error) {
	w := &workload{}
	poolSize := 4096
	switch name {
	case "cartpole":
		w.obsShape, w.obsDType, w.obsBytes, w.episode = []int{4}, storage.Float32, 16, 200
	case "atari":
		w.obsShape, w.obsDType, w.obsBytes, w.episode = []int{84, 84, 4}, storage.Uint8, 84*84*4, 1000
		poolSize = 512
	default:
		return nil, fmt.Errorf("unknown workload %q (cartpole or atari)", name)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range poolSize {
		f := make([]byte, w.obsBytes)
		if w.obsDType == storage.Float32 {
			for i := 0; i < len(f); i += 4 {
				binary.LittleEndian.PutUint32(f[i:], math.Float32bits(float32(rng.NormFloat64())))
			}
		} else {
			for i := range f {
				f[i] = byte(rng.UintN(256))
			}
		}
		w.pool = append(w.pool, f)
	}
	return w, nil
}

func (w *workload) obs(env, tick int) []byte { return w.pool[(env*7919+tick)%len(w.pool)] }

func (w *workload) done(env, tick int) bool {
	return (tick+env*w.episode/nEnvs)%w.episode == w.episode-1
}

const nEnvs = 8

func (w *workload) spec(capacity int64, kind storage.Kind, rowMeta storage.RowMetaLayout) storage.Spec {
	var dur storage.Durability
	if kind != storage.KindMemory {
		dur = storage.DurabilityNone // the OS writes back, as a numpy ring never does
	}
	return storage.Spec{
		Capacity: capacity, Storage: kind, Durability: dur, CompactObs: true, ObsKeys: []string{"observation"},
		RowMetaLayout: rowMeta,
		Fields: []storage.Field{
			{Name: "observation", DType: w.obsDType, Shape: w.obsShape},
			{Name: "action", DType: storage.Int64, Shape: []int{}},
			{Name: "next.reward", DType: storage.Float32, Shape: []int{}},
			{Name: "next.done", DType: storage.Bool, Shape: []int{}},
			{Name: "next.terminated", DType: storage.Bool, Shape: []int{}},
			{Name: "next.truncated", DType: storage.Bool, Shape: []int{}},
		},
	}
}

// batch fills b with ticks [tick0, tick0+ticks) of every env, tick-major,
// with one final observation per done row.
func (w *workload) batch(b *storage.Batch, tick0, ticks int) {
	w.envBatch(b, tick0, ticks, 0, nEnvs)
}

// envBatch is batch for envs [env0, env1) only.
func (w *workload) envBatch(b *storage.Batch, tick0, ticks, env0, env1 int) {
	n := ticks * (env1 - env0)
	obs := b.Fields["observation"][:0]
	final := b.Fields["next.observation"][:0]
	act, rew := b.Fields["action"][:0], b.Fields["next.reward"][:0]
	done, term, trunc := b.Fields["next.done"][:0], b.Fields["next.terminated"][:0], b.Fields["next.truncated"][:0]
	b.Env = b.Env[:0]
	for t := tick0; t < tick0+ticks; t++ {
		for e := env0; e < env1; e++ {
			obs = append(obs, w.obs(e, t)...)
			act = binary.LittleEndian.AppendUint64(act, uint64((e+t)%2))
			rew = binary.LittleEndian.AppendUint32(rew, math.Float32bits(1))
			d := w.done(e, t)
			var f byte
			if d {
				f = 1
				final = append(final, w.obs(e, t+1)...)
			}
			done, term, trunc = append(done, f), append(term, f), append(trunc, 0)
			b.Env = append(b.Env, int64(e))
		}
	}
	b.Rows = n
	b.Fields["observation"], b.Fields["next.observation"] = obs, final
	b.Fields["action"], b.Fields["next.reward"] = act, rew
	b.Fields["next.done"], b.Fields["next.terminated"], b.Fields["next.truncated"] = done, term, trunc
	if len(final) == 0 {
		delete(b.Fields, "next.observation")
	}
}

// rss returns the process's resident set size in bytes.
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func main() {
	name := flag.String("workload", "cartpole", "cartpole or atari")
	capacity := flag.Int64("capacity", 100_000, "buffer capacity (rows); the buffer is filled once")
	batchSize := flag.Int("batch", 256, "rows per extend and per sample")
	seconds := flag.Float64("seconds", 2, "how long to sample")
	settle := flag.Bool("settle", false, "collect garbage and return freed memory to the OS before each resident-set reading, so bytes_per_transition_rss counts what the buffer holds, not garbage the fill left (tests/resident)")
	rowMeta := flag.String("row-meta", "", "the buffer's row_meta: row (32-byte memory records, 64-byte file records), runs (16-byte records and run records), strided (8-byte records and strided run records; memmap buffers keep the files of runs) or blocks (memmap: rows.meta format version 3, block checksums, the records of runs in memory); left out, the default of the storage kind (memory: row, memmap: blocks)")
	kind := flag.String("storage", "memory", "the buffer's storage: memory, or memmap (files in a temporary dir, durability none)")
	actors := flag.Int("actors", 0, "write as this many actors do, not as one collector: each extend is --actor-rows steps of one actor (a stream of its own, one env), the actor drawn at random (seeded), so a trajectory's rows are irregular distances apart; 0: 8 envs stepped together, --batch rows an extend")
	actorRows := flag.Int("actor-rows", 1, "steps an actor sends in one extend (with --actors)")
	flag.Parse()
	if *actors < 0 || *actorRows < 1 {
		fmt.Fprintln(os.Stderr, "inproc: --actors must be 0 or more and --actor-rows 1 or more")
		os.Exit(2)
	}
	w := writers{actors: *actors, actorRows: *actorRows}
	if err := run(*name, *capacity, *batchSize, time.Duration(*seconds*float64(time.Second)), *settle, storage.Kind(*kind), storage.RowMetaLayout(*rowMeta), w); err != nil {
		fmt.Fprintln(os.Stderr, "inproc:", err)
		os.Exit(1)
	}
}

// writers says how rows reach the buffer: one collector (actors 0) or
// actors sending a few steps of their own env each.
type writers struct {
	actors, actorRows int
}

func run(name string, capacity int64, batchSize int, sampleFor time.Duration, settle bool, kind storage.Kind, rowMeta storage.RowMetaLayout, wr writers) error {
	w, err := newWorkload(name)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "rbd-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := rbd.Open(dir, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if settle {
		debug.FreeOSMemory() // a GC, then freed pages back to the OS
	}
	rss0 := rss()
	buf, _, err := db.CreateBuffer("bench", w.spec(capacity, kind, rowMeta))
	if err != nil {
		return err
	}
	ticks := batchSize / nEnvs
	b := &storage.Batch{Fields: map[string][]byte{}}
	// Two passes: the first fills the ring (first-touch page faults), the
	// second overwrites it, the steady state of a replay buffer; each is
	// timed on its own, around the extends only.
	var pass [2]time.Duration
	rows, tick := int64(0), 0
	actorTick := make([]int, wr.actors)
	actorStreams := make([]string, wr.actors)
	for a := range actorStreams {
		actorStreams[a] = fmt.Sprintf("actor%d", a)
	}
	pick := rand.New(rand.NewPCG(7, 8))
	for p := range pass {
		for written := int64(0); written < capacity; tick += ticks {
			stream := "bench"
			if wr.actors == 0 {
				w.batch(b, tick, ticks)
			} else {
				// An actor is a stream of its own with one env, as
				// actors writing to rbd serve are.
				a := pick.IntN(wr.actors)
				w.envBatch(b, actorTick[a], wr.actorRows, a, a+1)
				clear(b.Env)
				actorTick[a] += wr.actorRows
				stream = actorStreams[a]
			}
			start := time.Now()
			if _, err := buf.Extend(stream, b); err != nil {
				return err
			}
			pass[p] += time.Since(start)
			written += int64(b.Rows)
		}
		if p == 0 {
			rows = capacity
		}
	}
	info, err := buf.Info()
	if err != nil {
		return err
	}
	if settle {
		debug.FreeOSMemory()
	}
	held := rss() - rss0
	layout := int64(0)
	for _, fb := range info.Bytes {
		layout += fb.Stored
	}

	ctx := context.Background()
	req := &rbd.SampleRequest{BatchSize: batchSize}
	var batches, sampledBytes int64
	start := time.Now()
	for time.Since(start) < sampleFor {
		batch, err := buf.Sample(ctx, req, nil)
		if err != nil {
			return err
		}
		for _, t := range batch.Tensors {
			sampledBytes += int64(len(t.Data))
		}
		batch.Release()
		batches++
	}
	elapsed := time.Since(start).Seconds()
	impl := "rbd in-process (Go)"
	if kind != storage.KindMemory {
		impl += ", " + string(kind)
	}
	// The layout the buffer got (a memmap buffer's default is runs).
	if got := info.Spec.RowMetaLayout; kind != storage.KindMemory || (got != "" && got != storage.RowMetaPerRow) {
		impl += fmt.Sprintf(", row_meta %s", cmp.Or(got, storage.RowMetaPerRow))
	}
	if wr.actors > 0 {
		impl += fmt.Sprintf(", %d actors", wr.actors)
	}
	res := map[string]any{
		"impl": impl, "workload": name, "rows": info.Size,
		"fill_rows_per_s":             float64(rows) / pass[0].Seconds(),
		"add_rows_per_s":              float64(rows) / pass[1].Seconds(),
		"sample_batches_per_s":        float64(batches) / elapsed,
		"sample_gb_per_s":             float64(sampledBytes) / elapsed / 1e9,
		"bytes_per_transition_rss":    float64(held) / float64(info.Size),
		"bytes_per_transition_layout": float64(layout)/float64(info.Size) + float64(info.RowMetaBytes),
	}
	if kind != storage.KindMemory {
		// The files' blocks over the rows: what the buffer takes on disk.
		res["disk_bytes_per_transition"] = float64(info.DiskBytes) / float64(info.Size)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
