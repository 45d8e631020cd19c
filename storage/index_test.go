package storage

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// nextKnownFromRow is the reference rule Index.NextKnown must agree with,
// computed from the row's record and the trajectory index the slow way
// (the rule of transforms.NextOf, which this package cannot import).
func nextKnownFromRow(v Index, seq int64, compact bool) bool {
	m, ok := v.Row(seq)
	switch {
	case !ok:
		return false
	case !compact:
		return true
	case m.Done:
		return m.HasTail
	default:
		return m.NextSeq >= 0
	}
}

// checkIndex compares Index.NextKnown with the reference for every seq of
// the window and a few on each side of it, and the length buckets with a
// count over the trajectories.
func checkIndex(t *testing.T, b *Buffer, when string) {
	t.Helper()
	err := b.ReadIndex(func(v Index) {
		lo, hi := v.Window()
		var known []int64
		for seq := lo; seq < hi; seq++ {
			if v.NextKnown(seq) {
				known = append(known, seq)
			}
		}
		if got := v.AppendNextKnown([]int64{-7}); !slices.Equal(got, append([]int64{-7}, known...)) {
			t.Fatalf("%s: AppendNextKnown = %v, want %v", when, got, known)
		}
		// AppendLive filters a shuffled block as Live and NextKnown do one
		// seq at a time, keeping the block's order.
		var cands []int64
		for seq := lo - 3; seq < hi+3; seq++ {
			cands = append(cands, seq)
		}
		shuffle := rand.New(rand.NewPCG(uint64(hi), 9))
		shuffle.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		for _, nk := range []bool{false, true} {
			want := []int64{-7}
			for _, seq := range cands {
				if (nk && v.NextKnown(seq)) || (!nk && v.Live(seq)) {
					want = append(want, seq)
				}
			}
			if got := v.AppendLive([]int64{-7}, cands, nk); !slices.Equal(got, want) {
				t.Fatalf("%s: AppendLive(next known %v) = %v, one at a time %v", when, nk, got, want)
			}
		}
		for seq := lo - 3; seq < hi+3; seq++ {
			want := nextKnownFromRow(v, seq, b.spec.CompactObs)
			if got := v.NextKnown(seq); got != want {
				m, _ := v.Row(seq)
				t.Fatalf("%s: NextKnown(%d) = %v, rows say %v (window [%d, %d), row %+v)", when, seq, got, want, lo, hi, m)
			}
			if got, want := v.Live(seq), seq >= 0 && v.b.Live(seq); got != want {
				t.Fatalf("%s: Live(%d) = %v, want %v", when, seq, got, want)
			}
			// The next seq from the per-slot delta against the trajectory's
			// own list of rows.
			if m, ok := v.Row(seq); ok {
				want := int64(-1)
				if tr, pos := v.Position(m); tr != nil && pos+1 < tr.Len() {
					want = tr.Seq(pos + 1)
				}
				if m.NextSeq != want {
					t.Fatalf("%s: row %d next seq %d, its trajectory says %d (row %+v)", when, seq, m.NextSeq, want, m)
				}
			}
		}
		longest := 0
		for i := range v.NumTrajectories() {
			longest = max(longest, v.Trajectory(i).Len())
		}
		rng := rand.New(rand.NewPCG(1, 1))
		for n := 1; n <= longest+1; n++ {
			want := 0
			for i := range v.NumTrajectories() {
				if v.Trajectory(i).Len() >= n {
					want++
				}
			}
			if got := v.CountAtLeast(n); got != want {
				t.Fatalf("%s: CountAtLeast(%d) = %d, trajectories say %d", when, n, got, want)
			}
			tr := v.PickAtLeast(n, rng)
			if (tr == nil) != (want == 0) || (tr != nil && (tr.Len() < n || v.ByID(tr.ID()) != tr)) {
				t.Fatalf("%s: PickAtLeast(%d) = %v with %d qualifying", when, n, tr, want)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// refTrajectories is the reference the index's trajectories are checked
// against: a plain list of seqs per trajectory, built from what the test
// wrote (which stream and env each row came from, and what ended each
// trajectory), not from anything the buffer says.
type refTrajectories struct {
	open map[string]map[int64]*[]int64 // stream -> env -> the seqs of its open trajectory
	all  []*[]int64
}

func (r *refTrajectories) extend(stream string, first int64, rows []row) {
	if r.open == nil {
		r.open = map[string]map[int64]*[]int64{}
	}
	if r.open[stream] == nil {
		r.open[stream] = map[int64]*[]int64{}
	}
	for i, rw := range rows {
		tr := r.open[stream][rw.env]
		if tr == nil {
			tr = new([]int64)
			r.all = append(r.all, tr)
			r.open[stream][rw.env] = tr
		}
		*tr = append(*tr, first+int64(i))
		if rw.terminated || rw.truncated {
			delete(r.open[stream], rw.env)
		}
	}
	if stream == "" {
		delete(r.open, stream) // an anonymous stream ends with its request
	}
}

func (r *refTrajectories) closeStream(stream string) { delete(r.open, stream) }

// check compares every trajectory with live rows (seqs in the window)
// with the index: same number of trajectories, and each one's live seqs,
// in order, through Len and Seq.
func (r *refTrajectories) check(t *testing.T, b *Buffer, when string) {
	t.Helper()
	lo := max(0, b.writeCount.Load()-b.capacity)
	type liveTraj struct {
		id   int64
		seqs []int64
	}
	var want []liveTraj
	for _, tr := range r.all {
		i, _ := slices.BinarySearch(*tr, lo)
		if live := (*tr)[i:]; len(live) > 0 {
			want = append(want, liveTraj{metas(t, b, live[0])[0].TrajID, live})
		}
	}
	err := b.ReadIndex(func(v Index) {
		if v.NumTrajectories() != len(want) {
			t.Fatalf("%s: the index has %d trajectories, the reference %d", when, v.NumTrajectories(), len(want))
		}
		for _, w := range want {
			tr := v.ByID(w.id)
			if tr == nil {
				t.Fatalf("%s: trajectory %d (seqs %v) is not in the index", when, w.id, w.seqs)
			}
			got := make([]int64, tr.Len())
			for i := range got {
				got[i] = tr.Seq(i)
			}
			if !slices.Equal(got, w.seqs) {
				t.Fatalf("%s: trajectory %d has seqs %v, the reference %v", when, w.id, got, w.seqs)
			}
			// Every stretch, through AppendSeqs's walk along the runs.
			for i := range w.seqs {
				for n := 0; i+n <= len(w.seqs); n += 1 + n/2 {
					if got := tr.AppendSeqs([]int64{-9}, i, n); !slices.Equal(got[1:], w.seqs[i:i+n]) || got[0] != -9 {
						t.Fatalf("%s: trajectory %d rows %d..%d: AppendSeqs gives %v, the reference %v", when, w.id, i, i+n-1, got, w.seqs[i:i+n])
					}
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestIndexMatchesRows drives random interleaved writes (several
// streams and envs, rows in random env order or env after env as a
// vector env writes them, done rows with and without final observations,
// stream closes, anonymous extends, ring overwrites, a reopen) and checks
// after every step that the index's next-known bits say what the rows
// say, that its length buckets hold every trajectory under its live
// length, and that its trajectories hold exactly the live seqs of a
// reference built from what was written (refTrajectories).
func TestIndexMatchesRows(t *testing.T) {
	cases := []struct {
		kind     Kind
		capacity int64
		compact  bool
	}{
		{KindMemory, 37, true},
		{KindMemory, 200, true},
		{KindMemory, 37, false},
		{KindMemmap, 53, true},
		{KindCompressed, 64, true},
		// Rings this large map their next distances (growNextDeltas);
		// the memmap one maps them again after the reopen.
		{KindMemory, 40_000, true},
		{KindMemmap, 40_000, true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/cap=%d/compact=%v", tc.kind, tc.capacity, tc.compact), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			spec := testSpec(tc.kind, tc.capacity, tc.compact)
			b := mustCreate(t, s, "b", spec)
			rng := rand.New(rand.NewPCG(7, uint64(tc.capacity)))
			streams := []string{"a", "b", "c", ""}
			var ref refTrajectories
			val := float32(0)
			for op := range 400 {
				if op == 200 && tc.kind != KindMemory {
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					s = openStore(t, dir)
					var err error
					if b, err = s.Buffer("b"); err != nil {
						t.Fatal(err)
					}
					checkIndex(t, b, "after reopen")
					ref.check(t, b, "after reopen")
				}
				stream := streams[rng.IntN(len(streams))]
				if stream != "" && rng.IntN(10) == 0 {
					if _, err := b.CloseStream(stream); err != nil {
						t.Fatal(err)
					}
					ref.closeStream(stream)
					checkIndex(t, b, fmt.Sprintf("op %d: close %q", op, stream))
					ref.check(t, b, fmt.Sprintf("op %d: close %q", op, stream))
					continue
				}
				rows := make([]row, 1+rng.IntN(12))
				lockstep := rng.IntN(2) == 0 // env 0, 1, 2, 0, 1, 2, ...: evenly spaced seqs
				for i := range rows {
					val++
					env := int64(rng.IntN(3))
					if lockstep {
						env = int64(i % 3)
					}
					rows[i] = row{env: env, val: val, final: -val}
					switch rng.IntN(8) {
					case 0:
						rows[i].terminated = true
					case 1:
						rows[i].truncated = true
					}
				}
				res := mustExtend(t, b, stream, makeBatch(spec, rows, rng.IntN(3) != 0))
				ref.extend(stream, res.FirstSeq, rows)
				when := fmt.Sprintf("op %d: extend %q with %d rows", op, stream, len(rows))
				checkIndex(t, b, when)
				ref.check(t, b, when)
			}
			if tc.kind == KindMemory {
				// Deltas too far for 16 bits are stored as 0: the
				// trajectory answers instead.
				restore := zeroNextDists(&b.ix)
				checkIndex(t, b, "every next delta unknown")
				restore()
				// The middle of an extend: the rows about to be
				// overwritten have left the index, the write count has
				// not moved, so they are still inside the window.
				wc := b.writeCount.Load()
				b.wmu.Lock()
				b.evictForWrite(wc, wc+5)
				b.wmu.Unlock()
				checkIndex(t, b, "mid-extend, after the eviction")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNextDeltaTooFar: a row whose successor comes more than 65,535 seqs
// later (another env wrote that many rows in between) has no next distance
// in the index's 16 bits; its next seq comes from the trajectory instead,
// and a sample's next observation is still the successor's.
func TestNextDeltaTooFar(t *testing.T) {
	s := openStore(t, t.TempDir())
	spec := testSpec(KindMemory, 200_000, true)
	b := mustCreate(t, s, "b", spec)
	const gap = 70_000
	mustExtend(t, b, "s", makeBatch(spec, []row{{env: 0, val: 1}}, true))
	far := make([]row, gap)
	for i := range far {
		far[i] = row{env: 1, val: float32(10 + i)}
	}
	mustExtend(t, b, "s", makeBatch(spec, far, true))
	mustExtend(t, b, "s", makeBatch(spec, []row{{env: 0, val: 2}, {env: 1, val: 5}}, true))
	var m, n RowMeta
	var ok, okN bool
	if err := b.ReadIndex(func(ix Index) {
		m, ok = ix.Row(0)
		n, okN = ix.Row(1)
	}); err != nil {
		t.Fatal(err)
	}
	if !ok || m.NextSeq != gap+1 {
		t.Fatalf("row 0: next seq %d (found %v), want %d: its successor is %d seqs later", m.NextSeq, ok, gap+1, gap+1)
	}
	if !okN || n.NextSeq != 2 {
		t.Fatalf("row 1: next seq %d (found %v), want 2", n.NextSeq, okN)
	}
	if d := b.ix.nextDist(0); d != 0 {
		t.Fatalf("row 0's next distance is stored as %d, want 0 (too far for 16 bits)", d)
	}
	checkIndex(t, b, "after a successor 70,001 seqs on")
}

// TestNextDistancesMappedAndReleased: a large ring's next distances live
// in a mapping of their own (off the Go heap), which goes when the buffer
// does: closed with its store, or deleted. A small ring's are on the heap.
func TestNextDistancesMappedAndReleased(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kind     Kind
		capacity int64
		mapped   bool
		end      func(t *testing.T, s *Store)
	}{
		// Memory buffers keep them in their rows where the rows have
		// room (TestNextDistancesInRows); these have none: runs records
		// and 32 bytes of fields fill a 48-byte row.
		{"memory/deleted", KindMemory, 1 << 16, true, func(t *testing.T, s *Store) {
			if err := s.DeleteBuffer("b"); err != nil {
				t.Fatal(err)
			}
		}},
		{"memmap/closed", KindMemmap, 1 << 16, true, func(t *testing.T, s *Store) {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"memory/small", KindMemory, largestHeapDeltas(), false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, t.TempDir())
			spec := testSpec(tc.kind, tc.capacity, true)
			if tc.kind == KindMemory {
				spec.RowMetaLayout = RowMetaRuns
				spec.Fields = append(spec.Fields, Field{Name: "extra", DType: Uint8, Shape: []int{1}})
			}
			b := mustCreate(t, s, "b", spec)
			if b.ix.nextDelta != nil {
				t.Fatal("next distances exist before any row has a successor")
			}
			batch := makeBatch(spec, []row{{env: 0, val: 1}, {env: 1, val: 2}, {env: 0, val: 3}}, true)
			if tc.kind == KindMemory {
				batch.Fields["extra"] = make([]byte, 3)
			}
			mustExtend(t, b, "s", batch)
			// Mapped: one a slot at once. On the heap: grown as slots
			// are written (slot 0 so far).
			want := 1
			if tc.mapped {
				want = int(b.slots)
			}
			if got := len(b.ix.nextDelta); got != want {
				t.Fatalf("%d next distances, want %d", got, want)
			}
			if d := b.ix.nextDelta[0]; d != 2 {
				t.Fatalf("row 0's next distance is %d, want 2", d)
			}
			if (b.ix.deltas != nil) != tc.mapped {
				t.Fatalf("next distances mapped: %v, want %v", b.ix.deltas != nil, tc.mapped)
			}
			if !tc.mapped {
				return
			}
			start := uintptr(unsafe.Pointer(&b.ix.nextDelta[0]))
			if !mapped(t, start) {
				t.Fatalf("no mapping starts at the next distances (%#x) in /proc/self/maps", start)
			}
			tc.end(t, s)
			if mapped(t, start) {
				t.Fatalf("the next distances' mapping (%#x) outlived the buffer", start)
			}
		})
	}
}

// largestHeapDeltas is the capacity of the largest memory ring whose next
// distances live on the heap: 2 bytes a slot below mappedDeltaBytes.
func largestHeapDeltas() int64 {
	c := int64(mappedDeltaBytes / 2)
	for ringSlotCount(Spec{Storage: KindMemory, Capacity: c}, false)*2 >= mappedDeltaBytes {
		c--
	}
	return c
}

// zeroNextDists sets every next distance of ix to 0 (unknown: the
// trajectory answers) and returns what puts them back.
func zeroNextDists(ix *index) (restore func()) {
	if ix.deltaRows == nil {
		saved := ix.nextDelta
		ix.nextDelta = make([]uint16, len(saved))
		return func() { ix.nextDelta = saved }
	}
	saved := make([]uint16, ix.slots)
	for slot := range ix.slots {
		saved[slot] = ix.nextDist(slot)
		ix.setNextDelta(slot, 0)
	}
	return func() {
		for slot, d := range saved {
			ix.setNextDelta(int64(slot), int64(d))
		}
	}
}

// TestNextDistancesInRows: a memory buffer keeps each row's next distance
// in the row where the row has room: the top 16 bits of the row layout's
// traj_id word, or the padding after the small fields of a runs or strided
// row group (one byte for compact CartPole rows: distances up to 255,
// further ones 0), else in the index's array. Every row with a successor
// has its distance there while the ring wraps (an env that pauses for 384
// rows has 0 where the byte cannot hold that), the traj_ids beside them
// read back whole (the row layout's narrow limit, 2^48 - 1; 2^48 goes
// wide), and a restored checkpoint moves the distances its recovery put
// in an array into the rows.
func TestNextDistancesInRows(t *testing.T) {
	for _, tc := range []struct {
		layout RowMetaLayout
		extra  int // bytes of one more small field, beside the 31 of testSpec
		width  int // bytes of distance in the row; 0: the index's array
	}{
		{RowMetaPerRow, 0, 2},
		{RowMetaRuns, 0, 1},    // 16 + 31 in 48
		{RowMetaStrided, 0, 1}, // 8 + 31 in 40
		{RowMetaRuns, 3, 2},    // 16 + 34 in 64
		{RowMetaRuns, 1, 0},    // 16 + 32 in 48: no room
		{RowMetaStrided, 1, 0}, // 8 + 32 in 40
	} {
		t.Run(fmt.Sprintf("%s/extra=%d", tc.layout, tc.extra), func(t *testing.T) {
			s := openStore(t, t.TempDir())
			spec := testSpec(KindMemory, 1000, true)
			spec.RowMetaLayout = tc.layout
			if tc.extra > 0 {
				spec.Fields = append(spec.Fields, Field{Name: "extra", DType: Uint8, Shape: []int{tc.extra}})
			}
			b := mustCreate(t, s, "b", spec)
			val := float32(0)
			for i := range 9 {
				rows := make([]row, 128)
				for j := range rows {
					val++
					rows[j] = row{env: int64(j % (3 + i%2)), val: val, terminated: j%37 == 36, final: -val}
				}
				if i == 4 || i == 7 {
					rows[0].env = 9 // two steps 384 seqs apart
				}
				batch := makeBatch(spec, rows, true)
				if tc.extra > 0 {
					batch.Fields["extra"] = make([]byte, tc.extra*len(rows))
				}
				mustExtend(t, b, "s", batch)
			}
			check := func(b *Buffer, when string) {
				t.Helper()
				if inRows := b.ix.deltaRows != nil; inRows != (tc.width > 0) || b.ix.deltaBytes != tc.width {
					t.Fatalf("%s: next distances in the rows %v (%d bytes), want %d bytes", when, inRows, b.ix.deltaBytes, tc.width)
				}
				if tc.width > 0 && (b.ix.nextDelta != nil || b.ix.deltas != nil) {
					t.Fatalf("%s: next distances in the rows and in an array of %d", when, len(b.ix.nextDelta))
				}
				withNext, far := 0, 0
				if err := b.ReadIndex(func(v Index) {
					lo, hi := v.Window()
					for seq := lo; seq < hi; seq++ {
						m, ok := v.Row(seq)
						if !ok {
							continue
						}
						tr, pos := v.Position(m)
						if tr == nil || tr.ID() != m.TrajID {
							t.Fatalf("%s: row %d reads traj_id %d, which the index does not hold it in", when, seq, m.TrajID)
						}
						if pos+1 >= tr.Len() {
							continue
						}
						withNext++
						d := tr.Seq(pos+1) - seq
						want := uint16(d)
						if tc.width == 1 && d > math.MaxUint8 {
							want, far = 0, far+1
						}
						if got := b.ix.nextDist(v.ix.ring.of(seq)); got != want {
							t.Fatalf("%s: row %d's next distance is %d, want %d (successor %d seqs on)", when, seq, got, want, d)
						}
					}
				}); err != nil {
					t.Fatal(err)
				}
				if withNext < 900 || (tc.width == 1 && far != 1) {
					t.Fatalf("%s: %d rows with a successor in a full ring of 1000, %d too far for a byte", when, withNext, far)
				}
			}
			check(b, "written")
			checkIndex(t, b, "written")

			dest := filepath.Join(t.TempDir(), "cp")
			if _, err := b.Checkpoint(context.Background(), dest, nil); err != nil {
				t.Fatal(err)
			}
			cs := openStore(t, dest)
			defer cs.Close()
			cb := mustBuffer(t, cs, "b")
			check(cb, "restored")
			checkIndex(t, cb, "restored")

			if tc.layout != RowMetaPerRow {
				return
			}
			// The traj_id word's own bits, with the distance's bits all set.
			b.wmu.Lock()
			defer b.wmu.Unlock()
			for _, id := range []int64{0, 1<<trajBits - 1, 1 << trajBits, math.MaxInt64} {
				r := record{Seq: 5000, TrajID: id, Step: 3, PrevSeq: 4999, Env: 1, PolicyVersion: 2}
				b.putMemRecord(0, &r)
				if got := b.ix.nextDist(0); got != 0 {
					t.Fatalf("traj_id %d: a new record left next distance %d", id, got)
				}
				b.ix.setNextDelta(0, math.MaxUint16)
				traj, step, prev, env, version, _ := b.memFields(0, 5000)
				if traj != id || step != 3 || prev != 4999 || env != 1 || version != 2 {
					t.Fatalf("traj_id %d reads back as %d (step %d prev %d env %d version %d)", id, traj, step, prev, env, version)
				}
				if wide := b.wide.n > 0; wide != (id >= 1<<trajBits) {
					t.Fatalf("traj_id %d: wide %v", id, wide)
				}
			}
		})
	}
}

// TestNextDistancesWhenMappingFails: a ring whose distances the OS will
// not map (here 2^62 bytes of them) grows them on the heap as slots are
// written, as small rings do, instead of allocating all of them at once.
func TestNextDistancesWhenMappingFails(t *testing.T) {
	var ix index
	ix.init(1 << 61)
	ix.setNextDelta(0, 2)
	ix.setNextDelta(5, 70_000) // too far for 16 bits: stored as 0
	ix.setNextDelta(3, 1)
	if ix.deltas != nil {
		t.Fatal("2^62 bytes of next distances were mapped")
	}
	if got, want := ix.nextDelta, []uint16{2, 0, 0, 1, 0, 0}; !slices.Equal(got, want) {
		t.Fatalf("next distances %v, want %v", got, want)
	}
	if c := cap(ix.nextDelta); c > 64 {
		t.Fatalf("next distances hold room for %d slots after 6 were written", c)
	}
}

// mapped reports whether a mapping of this process starts at addr.
func mapped(t *testing.T, addr uintptr) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	prefix := strconv.FormatUint(uint64(addr), 16) + "-"
	for line := range strings.Lines(string(maps)) {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// TestRowIntoSetsEveryField: rowInto fills a RowMeta field by field (a
// composite literal costs a copy), into metas that samples reuse, so a
// field it forgot would carry the previous row's value. Every field of a
// RowMeta full of junk must come out as in a fresh one, on both record
// kinds; a field added to RowMeta and not to rowInto fails here.
func TestRowIntoSetsEveryField(t *testing.T) {
	for _, kind := range []Kind{KindMemory, KindMemmap} {
		t.Run(string(kind), func(t *testing.T) {
			s := openStore(t, t.TempDir())
			defer s.Close()
			spec := testSpec(kind, 64, true)
			b := mustCreate(t, s, "b", spec)
			rows := []row{{env: 2, val: 1}, {env: 2, val: 2, terminated: true, final: 9}, {env: 3, val: 3}}
			mustExtend(t, b, "s", makeBatch(spec, rows, true))
			var v Index
			b.ReadIndex(func(ix Index) { v = ix }) // single-threaded: nothing writes meanwhile
			wc := b.writeCount.Load()
			for seq := range int64(3) {
				var fresh RowMeta
				v.rowInto(seq, wc, &fresh)
				junk := RowMeta{}
				rv := reflect.ValueOf(&junk).Elem()
				for i := range rv.NumField() {
					switch f := rv.Field(i); f.Kind() {
					case reflect.Int64:
						f.SetInt(-12345)
					case reflect.Bool:
						f.SetBool(true)
					default:
						t.Fatalf("RowMeta.%s: a %s field this test does not fill", rv.Type().Field(i).Name, f.Kind())
					}
				}
				v.rowInto(seq, wc, &junk)
				if junk != fresh {
					t.Fatalf("seq %d: rowInto into a used RowMeta gives %+v, into a fresh one %+v", seq, junk, fresh)
				}
			}
		})
	}
}

// TestTrajectorySeqRuns pushes seqs at random distances (evenly spaced
// stretches, irregular ones, distances past what a packed run holds) into
// a Trajectory, drops its oldest rows now and then, and checks Seq,
// AppendSeqs and lastSeq against a plain slice after every step. Then it
// checks what the runs cost: rows arriving evenly take one run, rows at
// irregular distances one per 5 to 11 rows, by how far apart they are.
// Each trajectory is then closed (clip) and its rows dropped one by one.
func TestTrajectorySeqRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := range 200 {
		tr := &Trajectory{}
		var ref []int64 // the live seqs
		seq := rng.Int64N(1 << 40)
		stride := int64(1 + rng.IntN(8))
		for step := range 300 {
			switch rng.IntN(10) {
			case 0:
				stride = int64(1 + rng.IntN(8)) // a new even spacing
			case 1:
				// The largest distance of a packed width, and its
				// neighbours.
				limit := int64(1)<<packedWidths[rng.IntN(len(packedWidths))] - 1
				seq += limit + rng.Int64N(3) - 1
			case 2, 3:
				seq += 1 + rng.Int64N(200) // irregular
			case 4:
				seq += 1 + rng.Int64N(60) // irregular, close
			default:
				seq += stride
			}
			tr.push(seq)
			ref = append(ref, seq)
			if len(ref) > 1 && rng.IntN(3) == 0 {
				for range 1 + rng.IntN(3) {
					if len(ref) > 1 {
						tr.popOldest()
						ref = ref[1:]
					}
				}
			}
			checkTrajectorySeqs(t, tr, ref, fmt.Sprintf("trial %d, step %d", trial, step), rng)
		}
		tr.clip()
		if cap(tr.runs)-len(tr.runs[tr.hr:]) >= 2 {
			t.Fatalf("trial %d: a closed trajectory keeps room for %d runs, %d live", trial, cap(tr.runs), len(tr.runs[tr.hr:]))
		}
		for len(ref) > 1 {
			checkTrajectorySeqs(t, tr, ref, fmt.Sprintf("trial %d, closed, %d rows", trial, len(ref)), rng)
			tr.popOldest()
			ref = ref[1:]
		}
	}
	cost := func(dist func(i int) int64) int {
		tr := &Trajectory{}
		seq := int64(1000)
		for i := range 1000 {
			seq += dist(i)
			tr.push(seq)
		}
		return len(tr.runs)
	}
	if n := cost(func(int) int64 { return 8 }); n != 1 {
		t.Errorf("rows 8 seqs apart took %d runs, want 1", n)
	}
	irregular := rand.New(rand.NewPCG(23, 24))
	widest := int64(1)<<packedWidths[0] - 1 // the largest distance a packed run holds
	for _, c := range []struct {
		maxDist, rowsPerRun int64
	}{
		{500, 5}, // 10-bit runs when the distances so far allow, else 15
		{widest, 5},
		{1023, 7},
		{255, 8}, // 64 actors: distances around 64
		{63, 11},
	} {
		if n := cost(func(int) int64 { return 1 + irregular.Int64N(c.maxDist) }); n > int(1000/c.rowsPerRun+1) {
			t.Errorf("rows at distances up to %d took %d runs for 1000 rows, want at most %d", c.maxDist, n, 1000/c.rowsPerRun+1)
		}
	}
	if n := cost(func(i int) int64 { return widest + 1 + int64(i%2) }); n > 500+1 {
		t.Errorf("rows too far apart to pack took %d runs for 1000 rows, want at most 501 (one for two)", n)
	}
}

func checkTrajectorySeqs(t *testing.T, tr *Trajectory, ref []int64, when string, rng *rand.Rand) {
	t.Helper()
	if tr.Len() != len(ref) {
		t.Fatalf("%s: %d live rows, want %d", when, tr.Len(), len(ref))
	}
	for i, want := range ref {
		if got := tr.Seq(i); got != want {
			t.Fatalf("%s: Seq(%d) = %d, want %d (runs %+v)", when, i, got, want, tr.runs[tr.hr:])
		}
	}
	if got := tr.lastSeq(); got != ref[len(ref)-1] {
		t.Fatalf("%s: lastSeq %d, want %d", when, got, ref[len(ref)-1])
	}
	i := rng.IntN(len(ref))
	n := rng.IntN(len(ref) - i + 1)
	if got := tr.AppendSeqs(nil, i, n); !slices.Equal(got, ref[i:i+n]) {
		t.Fatalf("%s: AppendSeqs(%d, %d) = %v, want %v", when, i, n, got, ref[i:i+n])
	}
}
