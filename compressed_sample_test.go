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
	s := collector.BufferSpec(envs.CatchSpec(czK), collector.SpecOptions{
		Capacity: capacity, Storage: l.kind, CompactObs: l.compact, Priority: true,
		Durability: l.durability, FrameDedup: l.dedup, Compression: l.comp,
	})
	return s
}

// The layouts compared. Compressed buffers sync on every extend (fsync),
// so segments are collected and chunk links cut as early as they can be.
var (
	czMemory      = czLayout{name: "memory", kind: storage.KindMemory, compact: true}
	czMemoryFull  = czLayout{name: "memory-full", kind: storage.KindMemory}
	czMemmap      = czLayout{name: "memmap", kind: storage.KindMemmap, compact: true, durability: storage.DurabilityFlush}
	czDedup       = czLayout{name: "zstd-dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync}
	czNoneDelta   = czLayout{name: "none-chunk4-delta-dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync, comp: &storage.CompressionOptions{Codec: "none", ChunkLen: 4, Delta: true}}
	czZstdNoStack = czLayout{name: "zstd3-chunk8-delta", kind: storage.KindCompressed, compact: true, durability: storage.DurabilityFlush, comp: &storage.CompressionOptions{Codec: "zstd", Level: 3, ChunkLen: 8, Delta: true}}
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

// A trajectory's chunk boundary, then a pause in which the ring moves on
// past the previous chunk, then its next row: that row's frame stack
// reaches back into the previous chunk, which the store has already let go
// (collect cuts the link, and may delete its segment, once the chunk's
// dieAt is below the ring's window, but the open chunk's next rows still
// need it).
func TestCompressedPausedTrajectoryAcrossChunkBoundary(t *testing.T) {
	for _, comp := range []*storage.CompressionOptions{{Codec: "none", ChunkLen: 4}, {Codec: "zstd", ChunkLen: 4}} {
		t.Run(comp.Codec, func(t *testing.T) {
			l := czLayout{name: "dedup", kind: storage.KindCompressed, compact: true, dedup: true, durability: storage.DurabilityFsync, comp: comp}
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
			// Five steps of one game: the first chunk (4 rows) is sealed,
			// the fifth row opens the second chunk.
			g.group("slow", 1)[0].truncAt = 0
			extend("slow", g.rows("slow", 1, 5))
			// Another actor writes more than the ring holds.
			for range 3 {
				extend("fast", g.rows("fast", 2, 10))
			}
			// The slow game's sixth step: a live row whose stack is its
			// newest frame on top of rows 5, 4 and 3 of the trajectory.
			extend("slow", g.rows("slow", 1, 1))
			seq := int64(len(written) - 1)
			var meta [1]storage.RowMeta
			if _, err := s.buf.Gather([]int64{seq}, nil, nil, meta[:]); err != nil || meta[0].Step != 5 {
				t.Fatalf("setup: seq %d meta %+v, %v", seq, meta[0], err)
			}
			c, _ := s.buf.Column("observation")
			dst := [][]byte{make([]byte, c.RowBytes)}
			missing, err := s.buf.Gather([]int64{seq}, []storage.Column{c}, dst, nil)
			if err != nil || len(missing) > 0 {
				t.Fatalf("gather the paused trajectory's newest row (seq %d, step 5): missing %v, %v", seq, missing, err)
			}
			if !bytes.Equal(dst[0], written[seq].obs) {
				t.Fatalf("observation of seq %d differs from the one written", seq)
			}
		})
	}
}

var _ = errors.New
var _ = context.Background
var _ = fmt.Sprint
