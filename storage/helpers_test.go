package storage

import (
	"cmp"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"testing"
)

// testSpec is a small CartPole-shaped spec. compact drops next.observation.
func testSpec(kind Kind, capacity int64, compact bool) Spec {
	fields := []Field{
		{Name: "observation", DType: Float32, Shape: []int{4}},
		{Name: "action", DType: Int64, Shape: []int{}},
		{Name: "next.reward", DType: Float32, Shape: []int{}},
		{Name: "next.done", DType: Bool, Shape: []int{}},
		{Name: "next.terminated", DType: Bool, Shape: []int{}},
		{Name: "next.truncated", DType: Bool, Shape: []int{}},
	}
	if !compact {
		fields = append(fields, Field{Name: "next.observation", DType: Float32, Shape: []int{4}})
	}
	if kind == KindCompressed {
		// Rows this small stay plain by default; chunk them anyway so
		// that every same-behaviour test runs through the chunk store.
		for i := range fields {
			if !isFlagField(fields[i].Name) {
				fields[i].Compress = new(true)
			}
		}
	}
	s := Spec{Capacity: capacity, Storage: kind, Fields: fields, CompactObs: compact, ObsKeys: []string{"observation"}}
	if kind != KindMemory {
		s.Durability = DurabilityFlush
	}
	if kind == KindMemmap {
		s.RowMetaLayout = testMemmapRowMeta
	}
	return s
}

// testMemmapRowMeta is the row_meta of testSpec's memmap buffers: without
// the variable, "blocks" (rows.meta format version 3: block records and a
// run log), the default of new memmap buffers that are not fsync and hold
// 1,024 rows or more (defaultMemmapRowMeta; test buffers are mostly smaller
// and fsync, and run on version 3 whatever their size, as every new memmap
// buffer did on the day version 3 became the default); RBD_TEST_MEMMAP_ROW_META=row runs every
// test of a memmap buffer made by testSpec on rows.meta format version 1,
// the layout of buffers made by older builds, RBD_TEST_MEMMAP_ROW_META=runs
// on version 2 (the default of buffers made from 2026-11-27 to
// 2026-11-29), and RBD_TEST_MEMMAP_ROW_META=strided on version 2 with
// 8-byte strided memory records (.ci/run runs all three, after the default
// run).
var testMemmapRowMeta = cmp.Or(RowMetaLayout(os.Getenv("RBD_TEST_MEMMAP_ROW_META")), RowMetaBlocks)

var kinds = []Kind{KindMemory, KindMemmap, KindCompressed}

func isFlagField(name string) bool {
	return name == "next.done" || name == "next.terminated" || name == "next.truncated"
}

// row describes one step for makeBatch.
type row struct {
	env        int64
	val        float32 // observation = val, val+1, val+2, val+3
	terminated bool
	truncated  bool
	final      float32 // next.observation base on done rows (compact tail)
}

// makeBatch builds a batch; in compact mode, final observations are sent
// as D rows when tails is true.
func makeBatch(spec Spec, rows []row, tails bool) *Batch {
	n := len(rows)
	f := map[string][]byte{}
	obs := make([]byte, 16*n)
	nobs := make([]byte, 16*n)
	act := make([]byte, 8*n)
	rew := make([]byte, 4*n)
	done := make([]byte, n)
	term := make([]byte, n)
	trunc := make([]byte, n)
	env := make([]int64, n)
	var tail []byte
	for i, r := range rows {
		for k := 0; k < 4; k++ {
			binary.LittleEndian.PutUint32(obs[16*i+4*k:], math.Float32bits(r.val+float32(k)))
			binary.LittleEndian.PutUint32(nobs[16*i+4*k:], math.Float32bits(r.final+float32(k)))
		}
		binary.LittleEndian.PutUint64(act[8*i:], uint64(int64(r.val)))
		binary.LittleEndian.PutUint32(rew[4*i:], math.Float32bits(r.val/10))
		if r.terminated || r.truncated {
			done[i] = 1
			if tails {
				tail = append(tail, nobs[16*i:16*i+16]...)
			}
		}
		if r.terminated {
			term[i] = 1
		}
		if r.truncated {
			trunc[i] = 1
		}
		env[i] = r.env
	}
	f["observation"], f["action"], f["next.reward"] = obs, act, rew
	f["next.done"], f["next.terminated"], f["next.truncated"] = done, term, trunc
	if spec.CompactObs {
		if tails {
			f["next.observation"] = tail
		}
	} else {
		f["next.observation"] = nobs
	}
	return &Batch{Rows: n, Fields: f, Env: env}
}

func obsOf(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	t.Cleanup(func() { removeWitnessesUnder(t, dir) }) // after the store's own cleanups: registered first
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustBuffer(t testing.TB, s *Store, name string) *Buffer {
	t.Helper()
	b, err := s.Buffer(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustCreate(t testing.TB, s *Store, name string, spec Spec) *Buffer {
	t.Helper()
	b, _, err := s.CreateBuffer(name, spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustExtend(t testing.TB, b *Buffer, stream string, batch *Batch) ExtendResult {
	t.Helper()
	res, err := b.Extend(stream, batch)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// metas gathers the metadata of seqs.
func metas(t testing.TB, b *Buffer, seqs ...int64) []RowMeta {
	t.Helper()
	m := make([]RowMeta, len(seqs))
	if _, err := b.Gather(seqs, nil, nil, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// reopenBuffer closes s and opens the data dir at dir again: the new store
// (closed when the test ends) and its buffer name.
func reopenBuffer(t testing.TB, s *Store, dir, name string) (*Store, *Buffer) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return openBuffer(t, dir, name)
}

// openBuffer opens the data dir at dir (closed when the test ends): the
// store and its buffer name.
func openBuffer(t testing.TB, dir, name string) (*Store, *Buffer) {
	t.Helper()
	s := openStore(t, dir)
	t.Cleanup(func() { s.Close() })
	b, err := s.Buffer(name)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// memmapBlocks reports whether a buffer created with spec keeps rows.meta
// in format version 3: a memmap spec that asks for it or leaves row_meta
// out (the default of new memmap buffers).
func memmapBlocks(spec Spec) bool {
	return spec.Storage == KindMemmap && (spec.RowMetaLayout == RowMetaBlocks || spec.RowMetaLayout == "" && defaultMemmapRowMeta(spec) == RowMetaBlocks)
}

// memoryTwin is spec as a memory buffer, the reference a test compares a
// persistent buffer with (row_meta "blocks", memmap only, becomes the
// memory default).
func memoryTwin(spec Spec) Spec {
	spec.Storage, spec.Durability = KindMemory, ""
	if spec.RowMetaLayout == RowMetaBlocks {
		spec.RowMetaLayout = ""
	}
	return spec
}

// skipOnBlocks skips a test of a part of memmap buffers that rows.meta
// format version 3 does not have yet, when RBD_TEST_MEMMAP_ROW_META=blocks
// makes testSpec's memmap buffers version 3.
func skipOnBlocks(t testing.TB, spec Spec, what string) {
	t.Helper()
	if memmapBlocks(spec) {
		t.Skip("rows.meta format version 3 has no " + what + " yet")
	}
}
