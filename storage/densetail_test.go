package storage

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"testing"
)

// TestDenseTails: a new compact memmap buffer keeps its final observations
// in dense tail files (format version 2): over many laps of the ring the
// file takes about the live final observations' bytes, not a row's worth
// for every slot; the rows read back as written, from a hot checkpoint
// (copied entry by entry), after a reopen and after writes that follow
// the reopen (the rebuilt index hands out the next entries).
func TestDenseTails(t *testing.T) {
	for _, tc := range []struct{ ob, ep, rows int }{{16, 9, 3000}, {64 * 64 * 2, 7, 900}, {4096, 30, 2100}, {64 * 64 * 2, 2, 10000}} {
		t.Run(fmt.Sprintf("bytes=%d", tc.ob), func(t *testing.T) { testDenseTails(t, tc.ob, tc.ep, tc.rows) })
	}
}

func testDenseTails(t *testing.T, ob, ep, rows int) {
	const capacity = 256
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := sparseSpec(capacity, ob)
	b := mustCreate(t, s, "img", spec)
	ref := mustCreate(t, openStore(t, t.TempDir()), "img", memoryTwin(spec))
	if c := b.tails[0]; !c.dense || c.sparse {
		t.Fatalf("the final observation column of a new memmap buffer is not dense: %+v", c)
	}
	if info, err := b.Info(); err != nil || info.TailLayout != "dense" {
		t.Fatalf("info: tail_layout %q, %v", info.TailLayout, err)
	}
	path := tailFile(b.dir, "observation")
	if got := fileBytes(path); got > headerSize {
		t.Fatalf("a new dense tail file takes %d bytes", got)
	}
	extend := func(from, to int) {
		for k := from; k < to; k += 30 {
			mustExtend(t, b, "s", sparseBatch(k, 30, ob, ep))
			mustExtend(t, ref, "s", sparseBatch(k, 30, ob, ep))
			if k%600 == 0 {
				// Synced now and then, as a flush buffer is, between
				// punches. (The pages a large folio's writeback allocated
				// again, which adviseDense prevents, showed only in
				// BenchmarkExtendSparseTails's disk_B/row: 10,010 bytes a
				// row where 8,428 are now.)
				if err := s.Checkpoint(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	extend(0, rows)
	live := 0
	for _, seq := range b.LiveSeqs(0, capacity) {
		if metas(t, b, seq)[0].HasTail {
			live++
		}
	}
	if live == 0 {
		t.Fatal("no live row has a final observation")
	}
	// Allowed: the live entries, the pages at both ends of them, the
	// blocks allocated ahead and those not punched yet (a step each), and
	// a few blocks the filesystem counts for itself.
	pitch := b.tails[0].pitch()
	step := b.tailIx.step
	allowed := headerSize + int64(live)*pitch + 2*4096 + 2*step + 4*4096
	if b.blk != nil {
		// Version 3 keeps the entries of rows that left the window until
		// the ring's next pass reaches their slots.
		allowed += (b.slots - capacity + blockRows) * pitch
	}
	whole := headerSize + capacity*int64(ob)
	if got := fileBytes(path); got > allowed {
		t.Errorf("the tail file takes %d bytes for %d live final observations of %d bytes (allowed %d; a column at the slot takes %d)", got, live, ob, allowed, whole)
	}
	compareBuffers(t, ref, b)
	s, b = checkTailCopies(t, s, dir, b, ref, allowed)
	extend(rows, rows+3*capacity)
	compareBuffers(t, ref, b)
	_, b = reopenVerified(t, s, dir, "img")
	compareBuffers(t, ref, b)
}

// TestDenseTailsDiskFull: on a full disk an extend whose final
// observations need blocks beyond those allocated ahead is refused before
// any row is written, with an out-of-space error, and goes in once space
// returns, without a restart.
func TestDenseTailsDiskFull(t *testing.T) { testTailsDiskFull(t, false, 1400) }

// denseTailFixture writes rows with final observations to a closed dir and
// returns it with the rows served and the live seqs that have one, oldest
// first.
func denseTailFixture(t *testing.T, capacity int64, rows int) (dir string, want map[int64]servedRow, tails []int64) {
	t.Helper()
	dir = t.TempDir()
	s := openStore(t, dir)
	spec := testSpec(KindMemmap, capacity, true)
	b := mustCreate(t, s, "b", spec)
	batch := make([]row, 20)
	for k := 0; k < rows; k += len(batch) {
		for i := range batch {
			v := k + i
			batch[i] = row{env: int64(v % 3), val: float32(v), terminated: v%5 == 4, final: float32(1000 + v)}
		}
		mustExtend(t, b, "s", makeBatch(spec, batch, true))
	}
	want = servedRows(t, b)
	for seq, r := range want {
		if r.meta.HasTail {
			tails = append(tails, seq)
		}
	}
	slices.Sort(tails)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, want, tails
}

// TestDenseTailsOutOfOrder: entries follow the seqs of their rows, so a
// final observation found earlier in the file than the row before it
// allows (two entries swapped, each still naming its row) is damage: the
// later row is reported and dropped, every other row is served, and the
// writer goes on after the last entry.
func TestDenseTailsOutOfOrder(t *testing.T) {
	dir, want, tails := denseTailFixture(t, 200, 300)
	if len(tails) < 4 {
		t.Fatalf("fixture has %d live rows with a final observation", len(tails))
	}
	a, c := tails[1], tails[2]
	path, data, pitch := readFixtureTail(t, dir)
	offA, okA := denseTailEntry(data, a, 16)
	offC, okC := denseTailEntry(data, c, 16)
	if !okA || !okC || offC != offA+pitch {
		t.Fatalf("entries of seqs %d and %d at %d and %d: not neighbours", a, c, offA, offC)
	}
	ea, ec := slices.Clone(data[offA:offA+pitch]), slices.Clone(data[offC:offC+pitch])
	copy(data[offA:], ec)
	copy(data[offC:], ea)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || len(rep.Buffers) != 1 || len(rep.Buffers[0].Problems) != 1 {
		t.Fatalf("verify of swapped entries: %+v", rep)
	}
	s := openStore(t, dir)
	defer func() { s.Close() }()
	b, err := s.Buffer("b")
	if err != nil {
		t.Fatal(err)
	}
	delete(want, c)
	if got := checkServed(t, b, want); len(got) != len(want) {
		t.Fatalf("%d rows served, want %d", len(got), len(want))
	}
	if b.Live(c) {
		t.Fatalf("seq %d, whose final observation is out of order, is served", c)
	}
	// Rows written after the open get entries that read back.
	spec := b.Spec()
	rows := []row{{env: 7, val: 1}, {env: 7, val: 2, terminated: true, final: 77}}
	res := mustExtend(t, b, "t", makeBatch(spec, rows, true))
	last := res.WriteCount - 1
	if m := metas(t, b, last)[0]; !m.HasTail {
		t.Fatalf("new done row %+v has no final observation", m)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	if b, err = s.Buffer("b"); err != nil {
		t.Fatal(err)
	}
	if !b.Live(last) || len(b.Damage()) != 1 {
		t.Fatalf("after a reopen: the row written after the open live %v, damage %q (want the swapped row's alone)", b.Live(last), b.Damage())
	}
}

// TestDenseTailsSeqWrittenTwice: after a crash a writer may write a seq
// again (an fsync buffer resumes where its complete rows end), so two
// entries can name one seq. Here the newest row with a final observation
// has a stale entry (other bytes, its seq) where its entry was, and its
// real one an entry later: open tries the stale one first (entries sort
// by place), finds the checksum wrong, takes the real one, and the writer
// goes on after it.
func TestDenseTailsSeqWrittenTwice(t *testing.T) {
	dir, want, tails := denseTailFixture(t, 200, 300)
	last := tails[len(tails)-1]
	path, data, pitch := readFixtureTail(t, dir)
	off, ok := denseTailEntry(data, last, 16)
	if !ok || last-tails[len(tails)-2] < 2 || off+2*pitch > int64(len(data)) || binary.LittleEndian.Uint64(data[off+pitch+16:]) != 0 {
		t.Fatalf("fixture: seq %d's entry at %d, the next one not free", last, off)
	}
	copy(data[off+pitch:], data[off:off+pitch]) // the real entry, one on
	for i := range 16 {
		data[off+int64(i)] = byte(i + 1) // the stale one, still naming the seq
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	s := openStore(t, dir)
	defer func() { s.Close() }()
	b, err := s.Buffer("b")
	if err != nil {
		t.Fatal(err)
	}
	if got := checkServed(t, b, want); len(got) != len(want) {
		t.Fatalf("%d rows served, want %d", len(got), len(want))
	}
	// The next final observation goes after the real entry: both read
	// back after a reopen.
	rows := []row{{env: 7, val: 1}, {env: 7, val: 2, terminated: true, final: 77}}
	res := mustExtend(t, b, "t", makeBatch(b.Spec(), rows, true))
	s, b = reopenVerified(t, s, dir, "b")
	if !b.Live(res.WriteCount-1) || !b.Live(last) {
		t.Fatalf("after writes and a reopen: the new done row live %v, seq %d live %v", b.Live(res.WriteCount-1), last, b.Live(last))
	}
}

// TestTailLayoutInfo: Info says where each kind keeps final observations.
func TestTailLayoutInfo(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	for _, tc := range []struct {
		kind    Kind
		compact bool
		want    string
	}{
		{KindMemory, true, "dense"},
		{KindMemmap, true, "dense"},
		{KindCompressed, true, "chunks"}, // testSpec compresses the observation
		{KindMemmap, false, ""},
	} {
		b := mustCreate(t, s, fmt.Sprintf("%s-%v", tc.kind, tc.compact), testSpec(tc.kind, 64, tc.compact))
		if info, err := b.Info(); err != nil || info.TailLayout != tc.want {
			t.Errorf("%s compact %v: tail_layout %q (%v), want %q", tc.kind, tc.compact, info.TailLayout, err, tc.want)
		}
	}
}

// readFixtureTail reads the dense tail file of denseTailFixture's buffer:
// its path, its bytes and the pitch of its entries (16-byte observations
// and a trailer).
func readFixtureTail(t *testing.T, dir string) (path string, data []byte, pitch int64) {
	t.Helper()
	path = tailFile(bufferDir(dir, "b"), "observation")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, data, 16 + denseTrailerOf(data)
}
