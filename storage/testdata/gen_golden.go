//go:build ignore

// gen_golden writes storage/testdata/v1/datadir, a tiny data dir in format
// version 1 that golden_test.go opens on every test run. Run it from the
// repository root:
//
//	go run ./storage/testdata/gen_golden.go
//
// Do not regenerate it once committed: its point is that bytes written by a
// v1 build keep opening in every later build. A new format version gets a
// new directory (testdata/v2, ...) and a generator of its own; the v1
// directory stays as it is.
//
// It writes one compact memmap buffer with priorities, "golden", of
// capacity 8: 12 rows of two envs with known values, so the ring has
// wrapped, trajectories have ended by termination and truncation (with
// final observations in the tail store), three rows have priorities set
// and one trajectory is still open when the store is closed cleanly. That
// is every kind of file a v1 data dir can hold.
//
// With -row-meta runs it writes the same buffer with rows.meta in format
// version 2 and a run log, into storage/testdata/v2/datadir (written by the
// first build that had version 2, 2026-11-27; never regenerated either):
//
//	go run ./storage/testdata/gen_golden.go -row-meta runs
//
// With -row-meta blocks it writes the same buffer with rows.meta in format
// version 3 (block records, strided pieces, tail entries with checksums),
// into storage/testdata/v3/datadir (written by the first build that made
// version 3 the memmap default, 2026-11-29; never regenerated either):
//
//	go run ./storage/testdata/gen_golden.go -row-meta blocks
//
// Builds since dense tail files (tail format version 2, 2026-11-27) write
// the buffer's tail.observation.col densely: the first of them wrote
// storage/testdata/tails2/datadir (never regenerated either), with
//
//	go run ./storage/testdata/gen_golden.go -o storage/testdata/tails2/datadir
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/rbdb/rbd/storage"
)

func main() {
	out := flag.String("o", "", "data dir to write (replaced if it exists; default storage/testdata/v1/datadir, v2 with -row-meta runs)")
	rowMeta := flag.String("row-meta", "row", "row_meta of the buffer: row (rows.meta format version 1), runs (version 2) or blocks (version 3)")
	flag.Parse()
	if *out == "" {
		*out = "storage/testdata/v1/datadir"
		switch *rowMeta {
		case "runs":
			*out = "storage/testdata/v2/datadir"
		case "blocks":
			*out = "storage/testdata/v3/datadir"
		}
	}
	if err := run(*out, storage.RowMetaLayout(*rowMeta)); err != nil {
		log.Fatal(err)
	}
}

func run(dir string, rowMeta storage.RowMetaLayout) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	s, err := storage.Open(dir, nil)
	if err != nil {
		return err
	}
	spec := storage.Spec{
		Capacity: 8,
		Storage:  storage.KindMemmap,
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Float32, Shape: []int{2}},
			{Name: "action", DType: storage.Int64, Shape: []int{}},
			{Name: "next.reward", DType: storage.Float32, Shape: []int{}},
			{Name: "next.done", DType: storage.Bool, Shape: []int{}},
			{Name: "next.terminated", DType: storage.Bool, Shape: []int{}},
			{Name: "next.truncated", DType: storage.Bool, Shape: []int{}},
		},
		CompactObs: true,
		ObsKeys:    []string{"observation"},
		Priority:   &storage.PriorityOptions{Alpha: 0.6, Eps: 1e-6},
		Durability: storage.DurabilityFlush,
	}
	// Spelled out: since 2026-11-27 a memmap spec that leaves row_meta
	// out gets "runs". (The committed v1 and tails2 dirs were written
	// before, with row_meta left out of their specs.)
	spec.RowMetaLayout = rowMeta
	b, _, err := s.CreateBuffer("golden", spec)
	if err != nil {
		return err
	}
	// Rows 0..11 on stream "gen": env i%2, observation [i, -i], action
	// 100+i, reward i/4; rows 4 and 10 terminate, row 7 is truncated, and
	// each done row i sends the final observation [1000+i, -(1000+i)].
	for _, r := range [][2]int{{0, 6}, {6, 12}} {
		if _, err := b.Extend("gen", batch(r[0], r[1])); err != nil {
			return err
		}
	}
	// Rows written before any update got priority 1; the largest becomes 4.
	if _, _, err := b.UpdatePriorities([]int64{5, 8, 11}, []float64{2.5, 0.5, 4}); err != nil {
		return err
	}
	if err := s.Close(); err != nil {
		return err
	}
	fmt.Println("wrote", dir)
	return nil
}

func batch(from, to int) *storage.Batch {
	le := binary.LittleEndian
	f := map[string][]byte{}
	var env []int64
	for i := from; i < to; i++ {
		term, trunc := i == 4 || i == 10, i == 7
		f["observation"] = le.AppendUint32(le.AppendUint32(f["observation"], math.Float32bits(float32(i))), math.Float32bits(float32(-i)))
		f["action"] = le.AppendUint64(f["action"], uint64(100+i))
		f["next.reward"] = le.AppendUint32(f["next.reward"], math.Float32bits(float32(i)/4))
		f["next.done"] = append(f["next.done"], b2u(term || trunc))
		f["next.terminated"] = append(f["next.terminated"], b2u(term))
		f["next.truncated"] = append(f["next.truncated"], b2u(trunc))
		if term || trunc {
			f["next.observation"] = le.AppendUint32(le.AppendUint32(f["next.observation"], math.Float32bits(float32(1000+i))), math.Float32bits(float32(-1000-i)))
		}
		env = append(env, int64(i%2))
	}
	return &storage.Batch{Rows: to - from, Fields: f, Env: env}
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}
