package rbd

// Compressed storage against the plain layouts, through the whole sample
// path (samplers, next-state reconstruction, n-step): the catch env's
// [4, 84, 84] frame stacks are written identically into a memory buffer
// and into compressed buffers (zstd with frame dedup; codec none, chunks of
// 4 rows, delta) and every seeded sample must be byte-identical. A
// non-compact memory buffer, which stores every next.observation the env
// produced, is the reference for the frame stacks dedup rebuilds: at
// trajectory starts (the reset repeats the first frame), after stream
// closes and anonymous requests (stacks that continue without a
// predecessor), for rows whose predecessors the ring overwrote, and for the
// final observations of done rows. One case closes and reopens the stores
// mid-stream and continues writing on the same streams.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

const czK = 4 // catch's frame stack in these tests

// czEnv is one catch game as a writer plays it.
type czEnv struct {
	game    *envs.Catch
	obs     []byte // the current observation (a [4,84,84] stack)
	step    int
	truncAt int // the writer truncates the episode at this step (0: never)
}

// czRow is one step as the env produced it.
type czRow struct {
	env         int64
	obs, next   []byte
	act         int64
	rew         float32
	term, trunc bool
}

// czGen plays groups of catch games, one group per stream, with random
// actions. A third of the episodes are truncated by the writer at a random
// step (some after one step); a done row's next observation is the final
// observation and the game is reset (its stack repeats the first frame).
type czGen struct {
	rng    *rand.Rand
	groups map[string][]*czEnv
}

func newCZGen(seed uint64) *czGen {
	return &czGen{rng: rand.New(rand.NewPCG(seed, 0xca7c4)), groups: map[string][]*czEnv{}}
}

func (g *czGen) reset(e *czEnv) {
	e.game.Reset(g.rng)
	e.game.Obs(e.obs)
	e.step, e.truncAt = 0, 0
	if g.rng.IntN(3) == 0 {
		e.truncAt = 1 + g.rng.IntN(18)
	}
}

func (g *czGen) group(name string, n int) []*czEnv {
	es := g.groups[name]
	for len(es) < n {
		e := &czEnv{game: envs.NewCatch(nil, czK), obs: make([]byte, czK*envs.CatchFrameBytes)}
		g.reset(e)
		es = append(es, e)
	}
	g.groups[name] = es
	return es
}

// rows plays n steps of the group's games, each step on a game drawn at
// random (so rows of one game interleave irregularly with the others').
func (g *czGen) rows(group string, games, n int) []czRow {
	es := g.group(group, games)
	out := make([]czRow, n)
	for i := range out {
		e := g.rng.IntN(games)
		s := es[e]
		act := g.rng.IntN(envs.CatchActions)
		r := czRow{env: int64(e), obs: slices.Clone(s.obs), act: int64(act), next: make([]byte, len(s.obs))}
		r.rew, r.term, _ = s.game.Step(act)
		s.game.Obs(r.next)
		s.step++
		r.trunc = !r.term && s.truncAt > 0 && s.step >= s.truncAt
		if r.term || r.trunc {
			g.reset(s)
		} else {
			copy(s.obs, r.next)
		}
		out[i] = r
	}
	return out
}

// czBatch encodes rows for a compact buffer (final observations of done
// rows only, when tails is set) or for a non-compact one (every row's
// next.observation).
func czBatch(rows []czRow, compact, tails bool) *storage.Batch {
	n := len(rows)
	var obs, next []byte
	act := make([]byte, 0, 8*n)
	rew := make([]byte, 0, 4*n)
	done, term, trunc := make([]byte, n), make([]byte, n), make([]byte, n)
	env := make([]int64, n)
	for i, r := range rows {
		obs = append(obs, r.obs...)
		act = binary.LittleEndian.AppendUint64(act, uint64(r.act))
		rew = binary.LittleEndian.AppendUint32(rew, math.Float32bits(r.rew))
		d := r.term || r.trunc
		done[i], term[i], trunc[i] = u8(d), u8(r.term), u8(r.trunc)
		env[i] = r.env
		if !compact || (tails && d) {
			next = append(next, r.next...)
		}
	}
	f := map[string][]byte{"observation": obs, "action": act, "next.reward": rew, "next.done": done, "next.terminated": term, "next.truncated": trunc}
	if next != nil {
		f["next.observation"] = next
	}
	return &storage.Batch{Rows: n, Fields: f, Env: env}
}

// czLayout is one buffer layout of catch's steps.
type czLayout struct {
	name       string
	kind       storage.Kind
	compact    bool
	dedup      bool
	durability storage.Durability
	comp       *storage.CompressionOptions
}

func (l czLayout) spec(capacity int64) storage.Spec {
	return collector.BufferSpec(envs.CatchSpec(czK), collector.SpecOptions{
		Capacity: capacity, Storage: l.kind, CompactObs: l.compact, Priority: true,
		Durability: l.durability, FrameDedup: l.dedup, Compression: l.comp,
	})
}

// The layouts compared. The dedup layouts sync on every extend (fsync), so
// segments are collected and chunk links cut as early as they can be.
var (
	czMemory      = czLayout{name: "memory", kind: storage.KindMemory, compact: true}
	czMemoryFull  = czLayout{name: "memory-full", kind: storage.KindMemory}
	czMemmap      = czLayout{name: "memmap", kind: storage.KindMemmap, compact: true, durability: storage.DurabilityFlush}
	czDedup       = czLayout{name: "zstd-dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync}
	czNoneDelta   = czLayout{name: "none-chunk4-delta-dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync, comp: &storage.CompressionOptions{Codec: "none", ChunkLen: 4, Delta: true}}
	czZstdNoStack = czLayout{name: "zstd3-chunk8", kind: storage.KindCompressed, compact: true, durability: storage.DurabilityFlush, comp: &storage.CompressionOptions{Codec: "zstd", Level: 3, ChunkLen: 8}}
)

// czStore is one buffer in a data dir of its own (trajectory ids come from
// one counter per data dir, so buffers written alike get the same ids).
type czStore struct {
	layout czLayout
	dir    string
	db     *DB
	buf    *Buffer
}

func openCZStore(t *testing.T, l czLayout, capacity int64) *czStore {
	t.Helper()
	s := &czStore{layout: l, dir: t.TempDir()}
	s.open(t)
	b, _, err := s.db.CreateBuffer("catch", l.spec(capacity))
	if err != nil {
		t.Fatalf("%s: create: %v", l.name, err)
	}
	s.buf = b
	t.Cleanup(func() {
		if s.db != nil {
			if err := s.db.Close(); err != nil {
				t.Errorf("%s: close: %v", l.name, err)
			}
		}
	})
	return s
}

func (s *czStore) open(t *testing.T) {
	t.Helper()
	db, err := Open(s.dir, nil)
	if err != nil {
		t.Fatalf("%s: open: %v", s.layout.name, err)
	}
	s.db = db
	if b, err := db.Buffer("catch"); err == nil {
		s.buf = b
	}
}

// reopen closes the data dir cleanly and opens it again.
func (s *czStore) reopen(t *testing.T) {
	t.Helper()
	if err := s.db.Close(); err != nil {
		t.Fatalf("%s: close: %v", s.layout.name, err)
	}
	s.db, s.buf = nil, nil
	s.open(t)
	if s.buf == nil {
		t.Fatalf("%s: buffer gone after reopen", s.layout.name)
	}
}

// A trajectory crosses a chunk boundary, pauses while other actors move
// the ring past its previous chunk, then writes its next row: that row's
// frame stack (its newest frame on top of the trajectory's three previous
// rows) reaches back into the previous chunk, which the store has already
// let go. collect cuts the open chunk's link to it once the chunk's dieAt is
// below the ring's window (and may delete its segment), but dieAt only
// counts rows written so far, not the open chunk's rows still to come.
// "open" leaves one row in the new chunk before the pause; "sealed" ends
// the pause exactly at the boundary (the new chunk is opened after it, on
// a predecessor whose segment is gone).
func TestCompressedPausedTrajectoryAcrossChunkBoundary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first int // rows of the slow trajectory before the pause
		comp  *storage.CompressionOptions
	}{
		{"open/none", 5, &storage.CompressionOptions{Codec: "none", ChunkLen: 4}},
		{"open/zstd", 5, &storage.CompressionOptions{Codec: "zstd", ChunkLen: 4}},
		{"sealed/none", 4, &storage.CompressionOptions{Codec: "none", ChunkLen: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := czLayout{name: "dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync, comp: tc.comp}
			s := openCZStore(t, l, 20)
			g := newCZGen(1)
			var written []czRow
			extend := func(stream string, rows []czRow) {
				t.Helper()
				if _, err := s.buf.Extend(stream, czBatch(rows, true, true)); err != nil {
					t.Fatal(err)
				}
				written = append(written, rows...)
			}
			g.group("slow", 1)[0].truncAt = 0 // catch episodes last 20 steps
			extend("slow", g.rows("slow", 1, tc.first))
			// Another actor writes more than the ring holds.
			for range 3 {
				extend("fast", g.rows("fast", 2, 10))
			}
			extend("slow", g.rows("slow", 1, 1))
			seq := int64(len(written) - 1)
			var meta [1]storage.RowMeta
			if _, err := s.buf.Gather([]int64{seq}, nil, nil, meta[:]); err != nil || meta[0].Step != int64(tc.first) {
				t.Fatalf("setup: seq %d meta %+v, %v", seq, meta[0], err)
			}
			c, _ := s.buf.Column("observation")
			dst := [][]byte{make([]byte, c.RowBytes)}
			missing, err := s.buf.Gather([]int64{seq}, []storage.Column{c}, dst, nil)
			if err != nil || len(missing) > 0 {
				t.Fatalf("gather the paused trajectory's newest row (seq %d, step %d): missing %v, %v", seq, tc.first, missing, err)
			}
			if !bytes.Equal(dst[0], written[seq].obs) {
				t.Fatalf("observation of seq %d differs from the one written", seq)
			}
		})
	}
}

// A trajectory writes one row, pauses while the ring moves past it, then
// goes on (its next rows store only their newest frame, on top of the
// first row's stack: the open chunk still holds it in memory), and the
// store is closed cleanly and reopened. The open chunk's first fragment
// was collected with its segment while the chunk was still open (its dieAt
// counted only the rows written so far), so the reopened chunk starts at
// the second fragment and its live rows cannot be rebuilt. (A crash
// instead of the clean close loses them the same way.)
func TestCompressedPausedTrajectoryReopen(t *testing.T) {
	l := czLayout{name: "dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync,
		comp: &storage.CompressionOptions{Codec: "none", ChunkLen: 4}}
	s := openCZStore(t, l, 20)
	g := newCZGen(1)
	var written []czRow
	extend := func(stream string, rows []czRow) {
		t.Helper()
		if _, err := s.buf.Extend(stream, czBatch(rows, true, true)); err != nil {
			t.Fatal(err)
		}
		written = append(written, rows...)
	}
	g.group("slow", 1)[0].truncAt = 0 // catch episodes last 20 steps
	extend("slow", g.rows("slow", 1, 1))
	for range 6 {
		extend("fast", g.rows("fast", 2, 10))
	}
	// Setup: the segment holding the slow row's fragment is gone.
	if _, err := os.Stat(filepath.Join(s.dir, "buffers", "catch", "seg.00000001.rbdk")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("setup: the first segment was not collected: %v", err)
	}
	extend("slow", g.rows("slow", 1, 2))
	seqs := []int64{int64(len(written) - 2), int64(len(written) - 1)}
	read := func(what string) {
		t.Helper()
		c, _ := s.buf.Column("observation") // a reopened buffer's own column
		dst := [][]byte{make([]byte, 2*c.RowBytes)}
		missing, err := s.buf.Gather(seqs, []storage.Column{c}, dst, nil)
		if err != nil || len(missing) > 0 {
			t.Fatalf("%s: gather the paused trajectory's rows %v: missing %v, %v", what, seqs, missing, err)
		}
		for i, seq := range seqs {
			if !bytes.Equal(dst[0][i*c.RowBytes:(i+1)*c.RowBytes], written[seq].obs) {
				t.Fatalf("%s: observation of seq %d differs from the one written", what, seq)
			}
		}
	}
	read("before closing")
	s.reopen(t)
	read("after reopening")
}

// ---- writing the same steps into several buffers ----

// czWriter feeds the same steps to every buffer: compact buffers get
// compact batches, non-compact ones (the references) full batches.
type czWriter struct {
	t      *testing.T
	g      *czGen
	rng    *rand.Rand
	stores []*czStore
	wc     int64
	big    bool // the extend larger than the ring was written
}

func (w *czWriter) extend(stream string, rows []czRow, tails bool) {
	t := w.t
	t.Helper()
	var cb, fb *storage.Batch
	for _, s := range w.stores {
		b := &cb
		if !s.layout.compact {
			b = &fb
		}
		if *b == nil {
			*b = czBatch(rows, s.layout.compact, tails)
		}
		res, err := s.buf.Extend(stream, *b)
		if err != nil {
			t.Fatalf("%s: extend %d rows on %q at seq %d: %v", s.layout.name, len(rows), stream, w.wc, err)
		}
		if res.FirstSeq != w.wc || res.Rows != len(rows) {
			t.Fatalf("%s: extend at %d answered %+v", s.layout.name, w.wc, res)
		}
	}
	w.wc += int64(len(rows))
}

func (w *czWriter) closeStream(stream string) {
	w.t.Helper()
	for _, s := range w.stores {
		if _, err := s.buf.CloseStream(stream); err != nil {
			w.t.Fatalf("%s: close stream %q: %v", s.layout.name, stream, err)
		}
	}
}

// step writes one extend of a mix of actors: stream a (3 games, often),
// b (2 games), slow (1 game, a row or two now and then, so its
// trajectories pause while the ring moves on) and anonymous requests (2
// games whose stacks continue from call to call while each call's rows
// are new trajectories). Final observations are left out now and then;
// named streams are sometimes closed mid-episode (the games go on, so the
// next trajectory starts with a stack that continues the old one). Once
// the ring is full, one extend is larger than the ring.
func (w *czWriter) step(capacity int64) {
	rng := w.rng
	tails := rng.IntN(8) != 0
	r := rng.IntN(100)
	stream, games, n := "a", 3, 1+rng.IntN(12)
	switch {
	case !w.big && w.wc > capacity:
		n, w.big = int(capacity)+7, true
	case r < 45:
	case r < 72:
		stream, games, n = "b", 2, 1+rng.IntN(8)
	case r < 82:
		stream, games, n = "slow", 1, 1+rng.IntN(2)
	default:
		stream, games, n = "", 2, 1+rng.IntN(6)
	}
	group := stream
	if group == "" {
		group = "anon"
	}
	w.extend(stream, w.g.rows(group, games, n), tails)
	if stream != "" && rng.IntN(20) == 0 {
		w.closeStream(stream)
	}
}

// updatePriorities sets the same random priorities (some zero) on every
// buffer with priorities.
func (w *czWriter) updatePriorities(capacity int64) {
	t := w.t
	t.Helper()
	live := w.stores[0].buf.LiveSeqs(0, int(capacity)+1)
	var seqs []int64
	var vals []float64
	for _, s := range live {
		if w.rng.IntN(3) == 0 {
			continue
		}
		v := 0.05 + 4*w.rng.Float64()
		if w.rng.IntN(8) == 0 {
			v = 0
		}
		seqs, vals = append(seqs, s), append(vals, v)
	}
	seqs, vals = append(seqs, w.wc-capacity-1), append(vals, 1) // stale
	var first [2]int
	for i, s := range w.stores {
		if got := s.buf.LiveSeqs(0, int(capacity)+1); !slices.Equal(got, live) {
			t.Fatalf("%s: %d live seqs, %s has %d", s.layout.name, len(got), w.stores[0].layout.name, len(live))
		}
		u, st, err := s.buf.UpdatePriorities(seqs, vals)
		if err != nil {
			t.Fatalf("%s: update priorities: %v", s.layout.name, err)
		}
		if i == 0 {
			first = [2]int{u, st}
		} else if first != [2]int{u, st} {
			t.Fatalf("%s: priorities updated %d stale %d, %s %v", s.layout.name, u, st, w.stores[0].layout.name, first)
		}
	}
}

// ---- comparing answers ----

func czVariants() []SampleRequest {
	ns := &NStep{N: 3, Gamma: 0.9}
	return []SampleRequest{
		{Sampler: "uniform", BatchSize: 8},
		{Sampler: "uniform", BatchSize: 8, NStep: ns},
		{Sampler: "uniform", BatchSize: 8, IncludeIncomplete: true, NStep: ns},
		{Sampler: "uniform", BatchSize: 6, NextState: ptr(false)},
		{Sampler: "uniform", BatchSize: 6, Keys: []string{"next.observation", "next.reward"}},
		{Sampler: "without_replacement", BatchSize: 12, Consumer: "wr"},
		{Sampler: "without_replacement", BatchSize: 12, Consumer: "wr-n", NStep: ns},
		{Sampler: "prioritized", BatchSize: 8, Beta: ptr(0.5)},
		{Sampler: "prioritized", BatchSize: 8, Beta: ptr(1.0), NStep: ns, IncludeIncomplete: true},
		{Sampler: "slice", NumSlices: 2, SliceLen: 6},
		{Sampler: "slice", NumSlices: 2, SliceLen: 10, StrictLength: ptr(false), NStep: ns},
		{Sampler: "slice_without_replacement", NumSlices: 2, SliceLen: 5, Consumer: "swr"},
		{Sampler: "slice_without_replacement", NumSlices: 2, SliceLen: 8, StrictLength: ptr(false), Consumer: "swr-ns", NStep: ns},
		{Sampler: "prioritized_slice", NumSlices: 2, SliceLen: 6, Beta: ptr(0.5)},
		{Sampler: "prioritized_slice", NumSlices: 2, SliceLen: 12, StrictLength: ptr(false), NStep: ns},
	}
}

func czReqName(r SampleRequest) string {
	s := r.Sampler
	if r.NStep != nil {
		s += "/nstep"
	}
	if r.StrictLength != nil && !*r.StrictLength {
		s += "/nonstrict"
	}
	if r.IncludeIncomplete {
		s += "/incomplete"
	}
	if r.NextState != nil && !*r.NextState {
		s += "/no-next-state"
	}
	if r.Keys != nil {
		s += fmt.Sprintf("/keys%v", r.Keys)
	}
	return s
}

// czSample draws req from every store. A request that fails must fail
// alike everywhere, and then nil is returned: a without-replacement epoch
// can end on a not-ready answer when every trajectory or row left in it
// has been overwritten (known problem 2 in docs/sampling.md).
func czSample(t *testing.T, stores []*czStore, req SampleRequest) []*Batch {
	t.Helper()
	out := make([]*Batch, len(stores))
	errs := make([]error, len(stores))
	failed := 0
	for i, s := range stores {
		r := req
		out[i], errs[i] = rtTrySample(s.buf, &r)
		if errs[i] != nil {
			failed++
		}
	}
	switch {
	case failed == 0:
		return out
	case failed == len(stores) && !errors.Is(errs[0], ErrBadRequest):
		for _, e := range errs[1:] {
			if e.Error() != errs[0].Error() {
				t.Fatalf("%s: errors differ: %v / %v", czReqName(req), errs[0], e)
			}
		}
		t.Logf("%s seed %d: every buffer answers %v", czReqName(req), *req.Seed, errs[0])
		return nil
	}
	for i, s := range stores {
		if errs[i] != nil {
			t.Fatalf("%s seed %d: %s: %v", czReqName(req), *req.Seed, s.layout.name, errs[i])
		}
	}
	t.Fatalf("%s: unreachable", czReqName(req))
	return nil
}

// czSame requires every batch to equal the first one byte for byte: the
// same tensors, in the same order, with the same dtypes, shapes and bytes,
// and the same metadata.
func czSame(t *testing.T, what string, stores []*czStore, got []*Batch) {
	t.Helper()
	ref := got[0]
	seqT, _ := ref.Tensor("seq")
	for i := 1; i < len(got); i++ {
		b := got[i]
		name := stores[i].layout.name
		if len(b.Tensors) != len(ref.Tensors) {
			t.Fatalf("%s: %s has %d tensors, %s %d", what, name, len(b.Tensors), stores[0].layout.name, len(ref.Tensors))
		}
		for k, want := range ref.Tensors {
			have := b.Tensors[k]
			if have.Name != want.Name || have.DType != want.DType || !slices.Equal(have.Shape, want.Shape) {
				t.Fatalf("%s: %s tensor %d is %s %v %v, %s has %s %v %v", what, name, k, have.Name, have.DType, have.Shape,
					stores[0].layout.name, want.Name, want.DType, want.Shape)
			}
			if bytes.Equal(have.Data, want.Data) {
				continue
			}
			rows := len(seqT.Data) / 8
			rb := len(want.Data) / rows
			for j := 0; j < rows; j++ {
				if !bytes.Equal(have.Data[j*rb:(j+1)*rb], want.Data[j*rb:(j+1)*rb]) {
					t.Fatalf("%s: %s of row %d (seq %d) differs between %s and %s", what, want.Name, j,
						int64(binary.LittleEndian.Uint64(seqT.Data[8*j:])), stores[0].layout.name, name)
				}
			}
			t.Fatalf("%s: %s differs between %s and %s", what, want.Name, stores[0].layout.name, name)
		}
		if fmt.Sprint(b.Metadata) != fmt.Sprint(ref.Metadata) {
			t.Fatalf("%s: metadata %v, %s has %v", what, b.Metadata, stores[0].layout.name, ref.Metadata)
		}
	}
}

// czRows is every live row of a buffer, read directly: the observation,
// the final observation (tail) and the metadata.
type czRows struct {
	seqs      []int64
	meta      []storage.RowMeta
	obs, tail []byte
	rest      map[string][]byte
}

func czReadAll(t *testing.T, s *czStore, capacity int64) *czRows {
	t.Helper()
	b := s.buf
	r := &czRows{seqs: b.LiveSeqs(0, int(capacity)+1), rest: map[string][]byte{}}
	names := []string{"observation", "next.observation", "action", "next.reward", "next.done", "next.terminated", "next.truncated"}
	cols := make([]storage.Column, len(names))
	dst := make([][]byte, len(names))
	for i, n := range names {
		c, ok := b.Column(n)
		if !ok {
			t.Fatalf("%s: no column %s", s.layout.name, n)
		}
		cols[i], dst[i] = c, make([]byte, len(r.seqs)*c.RowBytes)
	}
	r.meta = make([]storage.RowMeta, len(r.seqs))
	missing, err := b.Gather(r.seqs, cols, dst, r.meta)
	if err != nil || len(missing) > 0 {
		t.Fatalf("%s: gather every live row: missing %v, %v", s.layout.name, missing, err)
	}
	r.obs, r.tail = dst[0], dst[1]
	for i, n := range names[2:] {
		r.rest[n] = dst[i+2]
	}
	return r
}

// czSameRows requires every store to hold the same live rows as the first.
func czSameRows(t *testing.T, what string, stores []*czStore, capacity int64) {
	t.Helper()
	ref := czReadAll(t, stores[0], capacity)
	for _, s := range stores[1:] {
		got := czReadAll(t, s, capacity)
		if !slices.Equal(got.seqs, ref.seqs) || !slices.Equal(got.meta, ref.meta) {
			t.Fatalf("%s: %s: live rows or their metadata differ from %s's", what, s.layout.name, stores[0].layout.name)
		}
		for j, seq := range ref.seqs {
			o := czK * envs.CatchFrameBytes
			if !bytes.Equal(got.obs[j*o:(j+1)*o], ref.obs[j*o:(j+1)*o]) {
				t.Fatalf("%s: %s: observation of seq %d (step %d) differs from %s's", what, s.layout.name, seq, ref.meta[j].Step, stores[0].layout.name)
			}
			if !bytes.Equal(got.tail[j*o:(j+1)*o], ref.tail[j*o:(j+1)*o]) {
				t.Fatalf("%s: %s: final observation of seq %d (step %d) differs from %s's", what, s.layout.name, seq, ref.meta[j].Step, stores[0].layout.name)
			}
		}
		for n, v := range ref.rest {
			if !bytes.Equal(got.rest[n], v) {
				t.Fatalf("%s: %s: %s differs from %s's", what, s.layout.name, n, stores[0].layout.name)
			}
		}
	}
}

// czCompare draws every variant with the given seeds from every store and
// requires byte-identical answers.
func czCompare(t *testing.T, what string, stores []*czStore, seeds []uint64) {
	t.Helper()
	sameSlots := true
	for _, s := range stores {
		sameSlots = sameSlots && czSlots(t, s) == czSlots(t, stores[0])
	}
	for vi, v := range czVariants() {
		if !sameSlots && drawsSlots(v.Sampler) {
			// A memory buffer with a spare block (the rbd_spareslots
			// build tag) or a memmap buffer of format version 3 has
			// more slots than the compressed ones, and these samplers
			// draw slots: the same seed picks other rows.
			continue
		}
		for _, sd := range seeds {
			req := v
			req.Seed = seed(sd*1009 + uint64(vi))
			got := czSample(t, stores, req)
			if got == nil {
				continue
			}
			czSame(t, fmt.Sprintf("%s: %s seed %d", what, czReqName(v), *req.Seed), stores, got)
			for _, b := range got {
				b.Release()
			}
		}
	}
}

// czSameSlots is the stores whose rings have as many slots as the last
// one's (a compressed buffer's: one a row).
func czSameSlots(t *testing.T, stores []*czStore) []*czStore {
	var out []*czStore
	for _, s := range stores {
		if czSlots(t, s) == czSlots(t, stores[len(stores)-1]) {
			out = append(out, s)
		}
	}
	return out
}

// czSlots is how many slots s's buffer maps seqs onto.
func czSlots(t *testing.T, s *czStore) int64 {
	t.Helper()
	var n int64
	if err := s.buf.ReadIndex(func(ix storage.Index) { n = ix.Slots() }); err != nil {
		t.Fatal(err)
	}
	return n
}

// drawsSlots reports whether a sampler draws ring slots (a permutation or
// a sum tree over them), so that its seeded draws depend on how many the
// ring has.
func drawsSlots(sampler string) bool {
	switch sampler {
	case "without_replacement", "prioritized", "prioritized_slice":
		return true
	}
	return false
}

// ---- 1: bit-exact round trips ----

// The same catch steps in a compact memory buffer and in compressed
// buffers (frame dedup with zstd; frame dedup with codec none, chunks of 4
// rows and delta; zstd level 3 with chunks of 8, no dedup): every
// sampler, with and without n-step, next-state reconstruction and the
// incomplete-row and key options, answers byte for byte alike with the
// same seed, while the ring wraps, after priority updates and (collector
// case) between batches.
func TestCompressedSampleBitExact(t *testing.T) {
	t.Run("extends", func(t *testing.T) {
		const capacity = 96
		var stores []*czStore
		for _, l := range []czLayout{czMemory, czDedup, czNoneDelta, czZstdNoStack} {
			stores = append(stores, openCZStore(t, l, capacity))
		}
		w := &czWriter{t: t, g: newCZGen(7), rng: rand.New(rand.NewPCG(7, 7)), stores: stores}
		for round := 1; w.wc < 5*capacity; {
			w.step(capacity)
			if w.wc < int64(round)*capacity*3/2 {
				continue
			}
			if round > 1 {
				w.updatePriorities(capacity)
			}
			what := fmt.Sprintf("after %d rows", w.wc)
			czSameRows(t, what, stores, capacity)
			czCompare(t, what, stores, []uint64{uint64(round)})
			round++
		}
	})
	t.Run("collector", func(t *testing.T) {
		const capacity = 80
		var stores []*czStore
		for _, l := range []czLayout{czMemory, czDedup, czNoneDelta} {
			stores = append(stores, openCZStore(t, l, capacity))
		}
		w := &czWriter{t: t, rng: rand.New(rand.NewPCG(8, 8)), stores: stores}
		batches := 0
		for _, run := range []struct {
			stream       string
			n, fpb       int
			frames       int64
			maxTraj      int
			seed         uint64
			compareEvery int
		}{
			// Episodes of 20 steps spanning batches; then episodes the
			// collector truncates at 7 steps. Each run ends with a cut.
			{"c1", 3, 30, 240, 0, 5, 4},
			{"c2", 4, 28, 196, 7, 6, 4},
		} {
			env, err := envs.New("catch", run.n, &envs.Options{FrameStack: czK, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			_, err = collector.Run(context.Background(), collector.Config{
				Env: env, Writer: czFanout(stores), Stream: run.stream, Seed: run.seed, FramesPerBatch: run.fpb,
				TotalFrames: run.frames, MaxFramesPerTraj: run.maxTraj, CompactObs: true,
				AfterBatch: func(bi *collector.BatchInfo) error {
					w.wc = bi.Stats.WriteCount
					if batches++; batches%run.compareEvery == 0 {
						what := fmt.Sprintf("%s after %d rows", run.stream, w.wc)
						czSameRows(t, what, stores, capacity)
						czCompare(t, what, stores, []uint64{uint64(batches)})
					}
					return nil
				},
			})
			env.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		w.updatePriorities(capacity)
		czSameRows(t, "at the end", stores, capacity)
		czCompare(t, "at the end, priorities updated", stores, []uint64{1, 2})
	})
}

// czFanout is a collector writer that writes every batch into each store.
type czFanout []*czStore

func (f czFanout) Extend(_ context.Context, stream string, b *storage.Batch) (storage.ExtendResult, error) {
	var first storage.ExtendResult
	for i, s := range f {
		res, err := s.buf.Extend(stream, b)
		if err != nil {
			return res, fmt.Errorf("%s: %w", s.layout.name, err)
		}
		if i == 0 {
			first = res
		} else if res != first {
			return res, fmt.Errorf("%s: extend answered %+v, %s %+v", s.layout.name, res, f[0].layout.name, first)
		}
	}
	return first, nil
}

func (f czFanout) CloseStream(_ context.Context, stream string) error {
	for _, s := range f {
		if _, err := s.buf.CloseStream(stream); err != nil {
			return err
		}
	}
	return nil
}

// ---- 2: dedup against the stacks the env produced ----

// czStats counts the cases the reference checks met.
type czStats struct {
	rows       int // sampled rows checked
	starts     int // ... at a trajectory's start
	contStarts int // ... at a start whose stack continues an earlier one (stream closed, anonymous request)
	deadPrev   int // ... whose predecessor in the trajectory was overwritten
	deadPrev3  int // ... whose second or third predecessor was overwritten, but not the first
	finals     int // ... whose next observation is a done row's final observation
	invalid    int // ... whose next observation is unknown (zero-filled)
	sweptDead  int // live rows read directly whose predecessor was overwritten
}

func (st *czStats) String() string {
	return fmt.Sprintf("%d sampled rows: %d starts (%d continuing a stack), %d with an overwritten predecessor, %d with an older one (up to 3 back) overwritten, %d final observations, %d unknown; %d live rows with an overwritten predecessor",
		st.rows, st.starts, st.contStarts, st.deadPrev, st.deadPrev3, st.finals, st.invalid, st.sweptDead)
}

// czRepeated reports whether every frame of a stack is its first frame.
func czRepeated(stack []byte) bool {
	f := envs.CatchFrameBytes
	for j := 1; j < czK; j++ {
		if !bytes.Equal(stack[j*f:(j+1)*f], stack[:f]) {
			return false
		}
	}
	return true
}

// czGatherCol reads one column at seqs (-1: zero) from s.
func czGatherCol(t *testing.T, s *czStore, name string, seqs []int64) []byte {
	t.Helper()
	c, ok := s.buf.Column(name)
	if !ok {
		t.Fatalf("%s: no column %s", s.layout.name, name)
	}
	dst := [][]byte{make([]byte, len(seqs)*c.RowBytes)}
	missing, err := s.buf.Gather(seqs, []storage.Column{c}, dst, nil)
	if err != nil {
		t.Fatalf("%s: gather %s: %v", s.layout.name, name, err)
	}
	for _, j := range missing {
		if seqs[j] >= 0 {
			t.Fatalf("%s: seq %d is not live", s.layout.name, seqs[j])
		}
	}
	return dst[0]
}

// czAgainstFull checks a batch sampled from s against ref, a non-compact
// buffer holding the same rows with every next.observation the env
// produced: observation and next.observation of each real row must be the
// env's (the n-step next.observation that of the window's last row), and
// an unknown next observation must be zero.
func czAgainstFull(t *testing.T, what string, s, ref *czStore, got *Batch, st *czStats) {
	t.Helper()
	seqs := i64s(t, got, "seq")
	meta := rtMetas(t, s.buf, seqs)
	var valid []bool
	if _, ok := got.Tensor("next.observation_valid"); ok {
		valid = bools(t, got, "next.observation_valid")
	}
	var ks []int64
	if _, ok := got.Tensor("steps_to_next_obs"); ok {
		ks = i64s(t, got, "steps_to_next_obs")
	}
	o := czK * envs.CatchFrameBytes
	// Where each row's next observation comes from: the row itself, or
	// the last row of its n-step window.
	targets := slices.Clone(seqs)
	for i, seq := range seqs {
		if seq < 0 || (valid != nil && !valid[i]) || ks == nil {
			continue
		}
		for j := int64(1); j < ks[i]; j++ {
			m := rtMetas(t, s.buf, []int64{targets[i]})[0]
			if m.NextSeq < 0 {
				t.Fatalf("%s: seq %d: n-step window of %d rows, but row %d has no next", what, seq, ks[i], targets[i])
			}
			targets[i] = m.NextSeq
		}
	}
	for i := range targets {
		if seqs[i] < 0 || (valid != nil && !valid[i]) {
			targets[i] = -1
		}
	}
	refObs := czGatherCol(t, ref, "observation", seqs)
	refNext := czGatherCol(t, ref, "next.observation", targets)
	targetMeta := rtMetas(t, s.buf, targets)
	obsT, hasObs := got.Tensor("observation")
	nextT, hasNext := got.Tensor("next.observation")
	for i, seq := range seqs {
		if seq < 0 {
			continue
		}
		m := meta[i]
		row := func(b []byte) []byte { return b[i*o : (i+1)*o] }
		if hasObs && !bytes.Equal(row(obsT.Data), row(refObs)) {
			t.Fatalf("%s: observation of seq %d (traj %d step %d) is not the stack the env produced", what, seq, m.TrajID, m.Step)
		}
		if hasNext {
			switch {
			case targets[i] < 0:
				if !bytes.Equal(row(nextT.Data), make([]byte, o)) {
					t.Fatalf("%s: next.observation of seq %d is unknown but not zero", what, seq)
				}
				st.invalid++
			case !bytes.Equal(row(nextT.Data), row(refNext)):
				t.Fatalf("%s: next.observation of seq %d (traj %d step %d, from seq %d, done %v) is not the stack the env produced",
					what, seq, m.TrajID, m.Step, targets[i], targetMeta[i].Done)
			case targetMeta[i].Done:
				st.finals++
			}
		}
		st.rows++
		if m.Step == 0 {
			st.starts++
			if hasObs && !czRepeated(row(obsT.Data)) {
				st.contStarts++
			}
		}
		if m.PrevSeq >= 0 && !s.buf.Live(m.PrevSeq) {
			st.deadPrev++
		} else if m.PrevSeq >= 0 {
			// Is one of the older rows the stack reaches back to
			// overwritten?
			p := m.PrevSeq
			for range czK - 2 {
				if p = rtMetas(t, s.buf, []int64{p})[0].PrevSeq; p < 0 || !s.buf.Live(p) {
					break
				}
			}
			if p >= 0 && !s.buf.Live(p) {
				st.deadPrev3++
			}
		}
	}
}

// czSweepAgainstFull reads every live row of s directly and compares its
// observation and final observation with ref's.
func czSweepAgainstFull(t *testing.T, what string, s, ref *czStore, capacity int64, st *czStats) {
	t.Helper()
	got, want := czReadAll(t, s, capacity), czReadAll(t, ref, capacity)
	if !slices.Equal(got.seqs, want.seqs) {
		t.Fatalf("%s: %s has %d live rows, the reference %d", what, s.layout.name, len(got.seqs), len(want.seqs))
	}
	o := czK * envs.CatchFrameBytes
	zero := make([]byte, o)
	for j, seq := range got.seqs {
		m := got.meta[j]
		if !bytes.Equal(got.obs[j*o:(j+1)*o], want.obs[j*o:(j+1)*o]) {
			t.Fatalf("%s: %s: observation of seq %d (traj %d step %d) is not the stack the env produced", what, s.layout.name, seq, m.TrajID, m.Step)
		}
		wantTail := zero
		if m.HasTail {
			wantTail = want.tail[j*o : (j+1)*o]
		}
		if !bytes.Equal(got.tail[j*o:(j+1)*o], wantTail) {
			t.Fatalf("%s: %s: final observation of seq %d (traj %d step %d, has tail %v) is not the env's", what, s.layout.name, seq, m.TrajID, m.Step, m.HasTail)
		}
		if m.PrevSeq >= 0 && !s.buf.Live(m.PrevSeq) {
			st.sweptDead++
		}
	}
}

// czCheckFull samples every variant from the compressed stores (which must
// agree byte for byte) and checks the answers and every live row against
// the reference.
func czCheckFull(t *testing.T, what string, ref *czStore, stores []*czStore, capacity int64, sd uint64, st *czStats) {
	t.Helper()
	for _, s := range stores {
		czSweepAgainstFull(t, what, s, ref, capacity, st)
	}
	for vi, v := range czVariants() {
		req := v
		req.Seed = seed(sd*1009 + uint64(vi))
		same := stores
		if drawsSlots(v.Sampler) {
			// A seed picks the same rows only in rings of as many slots:
			// a memmap buffer of format version 3 has a spare block.
			same = czSameSlots(t, stores)
		}
		got := czSample(t, same, req)
		if got == nil {
			continue
		}
		name := fmt.Sprintf("%s: %s seed %d", what, czReqName(v), *req.Seed)
		czSame(t, name, same, got)
		czAgainstFull(t, name, same[0], ref, got[0], st)
		for _, b := range got {
			b.Release()
		}
	}
}

// The frame stacks dedup rebuilds are the env's own: a small ring
// (50 rows) with catch episodes of up to 20 steps from several actors
// interleaved, so that many live rows' predecessors are overwritten, some
// trajectories pause while the ring moves on (the slow actor), stream
// closes and anonymous requests start trajectories with stacks that
// continue earlier ones, and done rows keep their final observations.
func TestCompressedDedupAgainstWriterStacks(t *testing.T) {
	const capacity = 50
	ref := openCZStore(t, czMemoryFull, capacity)
	stores := []*czStore{openCZStore(t, czDedup, capacity), openCZStore(t, czNoneDelta, capacity)}
	w := &czWriter{t: t, g: newCZGen(11), rng: rand.New(rand.NewPCG(11, 11)), stores: append([]*czStore{ref}, stores...)}
	st := &czStats{}
	for round := 1; w.wc < 7*capacity; {
		w.step(capacity)
		if w.wc < int64(round)*50 {
			continue
		}
		czCheckFull(t, fmt.Sprintf("after %d rows", w.wc), ref, stores, capacity, uint64(round), st)
		round++
	}
	t.Log(st)
	if st.starts == 0 || st.contStarts == 0 || st.deadPrev < 10 || st.deadPrev3 == 0 || st.finals < 10 || st.invalid == 0 || st.sweptDead < 10 {
		t.Fatalf("the data lacks a case: %v", st)
	}
}

// ---- 3: reopen mid-stream ----

// Compressed and memmap stores closed cleanly while every stream has open
// trajectories (open chunks kept as fragments), reopened, written on along
// the same streams (the trajectories continue), closed and reopened once
// more: they keep answering alike, byte for byte, and with the env's
// stacks.
func TestCompressedSampleReopen(t *testing.T) {
	const capacity = 64
	ref := openCZStore(t, czMemoryFull, capacity)
	stores := []*czStore{openCZStore(t, czMemmap, capacity), openCZStore(t, czDedup, capacity), openCZStore(t, czNoneDelta, capacity)}
	w := &czWriter{t: t, g: newCZGen(13), rng: rand.New(rand.NewPCG(13, 13)), stores: append([]*czStore{ref}, stores...)}
	st := &czStats{}
	check := func(what string, sd uint64) {
		t.Helper()
		czSameRows(t, what, stores, capacity)
		czCheckFull(t, what, ref, stores, capacity, sd, st)
	}
	// Rows on every named stream just before a close, so that most of
	// their games have open trajectories (and open chunks, kept as
	// fragments) when the store closes.
	openAll := func() {
		for _, s := range []struct {
			name  string
			games int
		}{{"a", 3}, {"b", 2}, {"slow", 1}} {
			w.extend(s.name, w.g.rows(s.name, s.games, 2*s.games), true)
		}
	}
	reopen := func() int64 {
		t.Helper()
		at := w.wc
		for _, s := range stores {
			s.reopen(t)
			if wc := s.buf.WriteCount(); wc != at {
				t.Fatalf("%s: write count %d after reopen, %d before", s.layout.name, wc, at)
			}
			if info, err := s.buf.Info(); err != nil || info.OpenTrajectories == 0 {
				t.Fatalf("%s: after reopen: %+v, %v: want open trajectories", s.layout.name, info, err)
			}
		}
		return at
	}
	// continued requires live rows written after at whose predecessor
	// was written before it.
	continued := func(at int64) {
		t.Helper()
		n := 0
		for _, m := range czReadAll(t, stores[2], capacity).meta {
			if m.Seq >= at && m.PrevSeq >= 0 && m.PrevSeq < at {
				n++
			}
		}
		if n == 0 {
			t.Fatalf("no live row continues a trajectory across the reopen at %d", at)
		}
	}
	for w.wc < 3*capacity {
		w.step(capacity)
	}
	openAll()
	w.updatePriorities(capacity)
	check(fmt.Sprintf("before closing at %d rows", w.wc), 1)
	at1 := reopen()
	check("just reopened", 2)
	openAll()
	continued(at1)
	at2 := reopen()
	for w.wc < at2+capacity/2 {
		w.step(capacity)
	}
	w.updatePriorities(capacity)
	check(fmt.Sprintf("reopened twice, at %d rows", w.wc), 3)
	continued(at2)
	t.Log(st)
}
