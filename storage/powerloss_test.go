package storage

// Power-loss tests. kill -9 keeps the page cache, so a killed writer loses
// nothing the kernel already holds; a power loss also loses every page not
// yet on stable storage. These tests kill a real writer and then destroy
// every row at or above each buffer's durable watermark in the files (what
// a power loss may leave), and check that recovery accepts that as a torn
// tail while keeping every fsync-acknowledged row; and that damage below
// the watermark is reported, never served.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// powerLossScramble destroys, in buffer buf of a closed data dir, every
// slot whose record is not a complete row below the durable watermark:
// variant "random" overwrites record and row bytes with random bytes,
// "zeros" with zeros, "crc" only flips a bit of the record checksum. It
// returns the watermark and how many slots it destroyed.
func powerLossScramble(t *testing.T, dir, buf, variant string, rng *rand.Rand) (int64, int) {
	t.Helper()
	powerLossReboot(t, dir)
	bdir := bufferDir(dir, buf)
	path := metaFile(bdir)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeMetaHeader(path, data)
	if err != nil {
		t.Fatal(err)
	}
	durable, ok := readWatermark(data[:headerSize])
	if !ok {
		t.Fatalf("%s: durable watermark block torn after kill -9", path)
	}
	capacity := int64(h.Capacity)
	size, crcOff := int64(recordSize), recCRC
	if h.Version == metaVersionRuns {
		size, crcOff = fileRunRecordSize, frCRC
		powerLossRuns(t, bdir, durable, variant, rng)
	}
	var slots []int64
	for slot := int64(0); slot < capacity; slot++ {
		rec := data[headerSize+slot*size : headerSize+(slot+1)*size]
		if powerLossZero(rec) {
			continue // never written
		}
		if size == fileRunRecordSize {
			// A complete record below the watermark (its checksum is
			// recovery's business: nothing here damages those).
			if w := binary.LittleEndian.Uint64(rec); w&frWriting == 0 && resolveSeq(w&seqResidueMask, durable) < durable {
				continue
			}
		} else if r, ok := decodeRecord(rec, new([recordSize]byte)); ok && r.Seq < durable {
			continue // durable
		}
		slots = append(slots, slot)
		powerLossDestroy(t, variant, rng, rec, crcOff)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if variant == "crc" {
		return durable, len(slots)
	}
	// What a lost page holds instead of the bytes written to it.
	wipe := func(b []byte) {
		if variant == "random" {
			powerLossRandom(rng, b)
		} else {
			clear(b)
		}
	}
	powerLossColumns(t, bdir, func(ch colHeader, cdata []byte) {
		rb := int64(ch.RowBytes)
		if ch.Version == tailVersionDense {
			powerLossDenseEntries(cdata, rb, tailTrailerSize, durable, wipe)
			return
		}
		for _, slot := range slots {
			wipe(cdata[headerSize+slot*rb : headerSize+(slot+1)*rb])
		}
	})
	return durable, len(slots)
}

// powerLossReboot leaves the dir as a reboot does: no buffer has a seq
// witness (a tmpfs does not outlive the kernel), so recovery cannot know
// how far a crashed writer handed seqs out (witness.go).
func powerLossReboot(t testing.TB, dir string) {
	t.Helper()
	upEditStates(t, dir, func(name string, st *bufferState) {
		abs, err := filepath.Abs(bufferDir(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(witnessFile(defaultWitnessDir, abs, st.UID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	})
}

// removeWitnessesUnder removes the seq witnesses that killed writers of
// buffers under dir left in defaultWitnessDir (a clean close removes its
// own): tests kill thousands, and the tmpfs lasts until a reboot.
func removeWitnessesUnder(t testing.TB, dir string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return
	}
	for f, w := range witnessFiles(defaultWitnessDir) {
		if strings.HasPrefix(w.dir, abs+string(filepath.Separator)) {
			os.Remove(f)
		}
	}
}

// witnessesHere reports whether this machine keeps seq witnesses (a boot
// id and a tmpfs at defaultWitnessDir): without them every crash counts
// as a power loss.
func witnessesHere() bool { return currentBoot() != "" && onTmpfs(defaultWitnessDir) }

// powerLossColumns rewrites every column file of the buffer dir bdir with
// what fn makes of its bytes (fn gets the file's header).
func powerLossColumns(t *testing.T, bdir string, fn func(ch colHeader, data []byte)) {
	t.Helper()
	cols, err := filepath.Glob(filepath.Join(bdir, "*.col"))
	if err != nil || len(cols) == 0 {
		t.Fatalf("no column files in %s: %v", bdir, err)
	}
	for _, cpath := range cols {
		data, err := os.ReadFile(cpath)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := decodeColHeader(cpath, data)
		if err != nil {
			t.Fatal(err)
		}
		fn(ch, data)
		if err := os.WriteFile(cpath, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// powerLossDenseEntries wipes the entries of a dense tail file (data,
// entries of rb bytes and a trailer) written after the last sync: those
// of rows at or above the durable watermark (entries go in seq order).
func powerLossDenseEntries(data []byte, rb, trailer, durable int64, wipe func([]byte)) {
	pitch := rb + trailer
	for off := int64(headerSize); off+pitch <= int64(len(data)); off += pitch {
		if v := int64(binary.LittleEndian.Uint64(data[off+rb:])); v > 0 && v-1 >= durable {
			wipe(data[off : off+pitch])
		}
	}
}

// powerLossRuns destroys the run records of the run log in bdir whose
// pieces start at or above the durable watermark (appended after the last
// sync, so a power loss may take them), as powerLossScramble destroys
// records: pieces are written per extend, and a sync covers whole extends.
func powerLossRuns(t *testing.T, bdir string, durable int64, variant string, rng *rand.Rand) {
	t.Helper()
	nos, err := runSegmentNumbers(bdir)
	if err != nil {
		t.Fatal(err)
	}
	for _, no := range nos {
		path := filepath.Join(bdir, runSegName(no))
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off := segHeaderSize; off+runLogRecordSize <= len(data); off += runLogRecordSize {
			rec := data[off : off+runLogRecordSize]
			if p, why := decodeRunPiece(rec); why != "" || p.FirstSeq < durable {
				continue
			}
			powerLossDestroy(t, variant, rng, rec, rlCRC)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// powerLossDestroy destroys a record as a power loss may: random bytes,
// zeros, or ("crc") one flipped bit of its checksum at crcOff.
func powerLossDestroy(t *testing.T, variant string, rng *rand.Rand, rec []byte, crcOff int) {
	t.Helper()
	switch variant {
	case "random":
		powerLossRandom(rng, rec)
	case "zeros":
		clear(rec)
	case "crc":
		rec[crcOff] ^= 0x10
	default:
		t.Fatalf("unknown variant %q", variant)
	}
}

func powerLossZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func powerLossRandom(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// TestPowerLossAboveWatermark kills a writer of an fsync and a flush buffer,
// destroys everything above each durable watermark, and reopens: verify must
// pass (a torn tail above the watermark is what a crash leaves), every
// fsync-acknowledged row must be there, and the store must take new writes
// under fresh seqs. Two rounds per data dir, so holes left by the first
// power loss are recovered again.
func TestPowerLossAboveWatermark(t *testing.T) {
	skipOnBlocks(t, crashSpecFor(crashFsync), "files of versions 1 and 2 (TestBlocksPowerLoss is version 3's)")
	rounds := 2
	if testing.Short() {
		rounds = 1
	}
	for vi, variant := range []string{"random", "zeros", "crc"} {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			rng := rand.New(rand.NewPCG(uint64(vi), 99))
			m := newCrashModel(crashFsync, crashFlush, crashFsyncRuns)
			for r := 0; r < rounds; r++ {
				delay := time.Duration(120+rng.IntN(250)) * time.Millisecond
				run := crashRunChild(t, crashChildCfg{
					dir: dir, seed: uint64(1000*vi + r), tokenBase: int64(vi*10+r+1) << 32,
					bufs: []string{crashFsync, crashFlush, crashFsyncRuns}, intervalMS: 50, killAfter: delay,
				})
				m.absorb(t, r, run)
				durable := map[string]int64{}
				destroyed := map[string]int{}
				for _, buf := range []string{crashFsync, crashFlush, crashFsyncRuns} {
					durable[buf], destroyed[buf] = powerLossScramble(t, dir, buf, variant, rng)
				}
				for _, buf := range []string{crashFsync, crashFsyncRuns} {
					if durable[buf] < m.maxAckEnd[buf] {
						t.Errorf("round %d: fsync buffer %q's durable watermark on disk is %d, but rows up to %d were acknowledged",
							r, buf, durable[buf], m.maxAckEnd[buf]-1)
					}
				}
				t.Logf("round %d: killed %v after ready; acknowledged up to %v; watermarks %v; destroyed slots %v",
					r, delay, m.maxAckEnd, durable, destroyed)
				if destroyed[crashFlush] == 0 {
					t.Logf("round %d: nothing above the flush buffer's watermark to destroy", r)
				}
				m.check(t, dir, r, run, crashCheckOpts{powerLoss: true, durable: durable})
				// writeAfter (through the model) also checks that seqs are
				// never reused, even when the rows that carried them were
				// lost: a learner may still hold them (sample output,
				// priority updates) and must see them as stale.
				m.writeAfter(t, dir, r)
			}
		})
	}
}

// TestPowerLossDamageBelowWatermark flips one byte of a row below the
// durable watermark: verify must report it in that buffer, and the row must
// never be served (Gather reports it missing).
func TestPowerLossDamageBelowWatermark(t *testing.T) {
	type target struct {
		file string // column file or rows.meta
		off  int64  // byte offset in the file
		seq  int64
	}
	// Offsets of slot seq in the files of the fs buffer.
	spec := crashSpecFor(crashFsync)
	var layout RowMetaLayout // the created buffer's
	colOff := func(seq int64, rowBytes int, within int) int64 {
		return headerSize + (seq%spec.Capacity)*int64(rowBytes) + int64(within)
	}
	cases := []struct {
		name string
		pick func(bdir string, done []int64) target
	}{
		{"blob", func(bdir string, _ []int64) target {
			return target{powerLossColPath(bdir, "blob"), colOff(50, crashBlobBytes, 123), 50}
		}},
		{"action", func(bdir string, _ []int64) target {
			return target{powerLossColPath(bdir, "action"), colOff(61, 8, 0), 61}
		}},
		{"record", func(bdir string, _ []int64) target {
			if layout == RowMetaRuns || layout == RowMetaStrided { // rows.meta version 2
				return target{metaFile(bdir), headerSize + 77*fileRunRecordSize + frOff, 77}
			}
			return target{metaFile(bdir), headerSize + 77*recordSize + recStep, 77}
		}},
		{"tail", func(bdir string, done []int64) target {
			return target{powerLossTailPath(bdir, "observation"), denseTailOff(t, powerLossTailPath(bdir, "observation"), done[1], 16) + 5, done[1]}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			skipOnBlocks(t, spec, "files of versions 1 and 2 (TestBlocksDamageBelowWatermark is version 3's)")
			dir := t.TempDir()
			s := openStore(t, dir)
			b := mustCreate(t, s, crashFsync, spec)
			layout = b.Spec().RowMetaLayout // the default's, when spec leaves it out
			tok := int64(1)
			for i := 0; i < 10; i++ {
				tokens := make([]int64, 20)
				for j := range tokens {
					tokens[j] = tok
					tok++
				}
				mustExtend(t, b, "a", crashBatch(spec, tokens, i%2 == 0))
			}
			all := b.LiveSeqs(0, 1000)
			before := metas(t, b, all...)
			var done []int64
			for _, m := range before {
				if m.Done && m.HasTail {
					done = append(done, m.Seq)
				}
			}
			if len(done) < 2 {
				t.Fatalf("only %d done rows with final observations", len(done))
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tg := tc.pick(bufferDir(dir, crashFsync), done)
			powerLossFlip(t, tg.file, tg.off)
			victim := before[tg.seq]

			rep, err := Verify(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() {
				t.Fatalf("verify is OK after a byte of seq %d (below the durable watermark) was flipped in %s", tg.seq, filepath.Base(tg.file))
			}
			found := false
			for _, br := range rep.Buffers {
				if br.Name != crashFsync {
					if len(br.Problems) > 0 {
						t.Errorf("problems reported in buffer %q, which was not touched: %v", br.Name, br.Problems)
					}
					continue
				}
				for _, p := range br.Problems {
					found = found || strings.Contains(p, fmt.Sprintf("seq %d ", tg.seq))
				}
				if !found {
					t.Errorf("verify names buffer %q but not seq %d: %v", br.Name, tg.seq, br.Problems)
				}
			}
			if !found {
				t.Errorf("verify does not report the damaged row in buffer %q: %+v", crashFsync, rep.Buffers)
			}

			s = openStore(t, dir)
			defer s.Close()
			b, err = s.Buffer(crashFsync)
			if err != nil {
				t.Fatal(err)
			}
			cols := crashColumns(b)
			dst := crashDst(cols, len(all))
			ms := make([]RowMeta, len(all))
			missing, err := b.Gather(all, cols, dst, ms)
			if err != nil {
				t.Fatal(err)
			}
			miss := map[int64]bool{}
			for _, j := range missing {
				miss[all[j]] = true
			}
			if !miss[tg.seq] || b.Live(tg.seq) {
				t.Errorf("the damaged row %d is served (missing %v)", tg.seq, missing)
			}
			scratch := make([]byte, 1<<16)
			for j, seq := range all {
				if miss[seq] {
					// Only the damaged row and its own trajectory's later
					// rows (whose predecessor is gone) may be dropped.
					if seq != tg.seq && (before[seq].TrajID != victim.TrajID || seq < tg.seq) {
						t.Errorf("row %d (trajectory %d) dropped, but only row %d of trajectory %d was damaged", seq, before[seq].TrajID, tg.seq, victim.TrajID)
					}
					continue
				}
				if tok, err := crashCheckRow(cols, dst, j, ms[j], scratch); err != nil || tok != seq+1 {
					t.Errorf("row %d served with token %d: %v", seq, tok, err)
				}
			}
			if info, _ := b.Info(); info.Damaged == 0 {
				t.Errorf("Info reports no damaged rows: %+v", info)
			}
		})
	}

	// The same after a real kill: a byte of an acknowledged, durable row of
	// an fsync buffer is flipped (rows.meta format version 1, then 2).
	for _, fb := range []string{crashFsync, crashFsyncRuns} {
		t.Run("killed-writer/"+fb, func(t *testing.T) { powerLossKilledWriter(t, fb) })
	}
}

func powerLossKilledWriter(t *testing.T, fb string) {
	spec := crashSpecFor(fb)
	skipOnBlocks(t, spec, "files of versions 1 and 2 (TestBlocksDamageBelowWatermark is version 3's)")
	colOff := func(seq int64, rowBytes int, within int) int64 {
		return headerSize + (seq%spec.Capacity)*int64(rowBytes) + int64(within)
	}
	dir := t.TempDir()
	m := newCrashModel(fb, crashFlush)
	run := crashRunChild(t, crashChildCfg{
		dir: dir, seed: 5, tokenBase: 1 << 32, bufs: []string{fb, crashFlush},
		intervalMS: 20, killAfter: 200 * time.Millisecond,
	})
	m.absorb(t, 0, run)
	wMax := run.start[fb]
	for _, e := range run.begins {
		if e.buf == fb {
			wMax += int64(e.rows)
		}
	}
	// The oldest acknowledged row nothing can have overwritten.
	seq := int64(-1)
	for s := range m.acked[fb] {
		if s >= wMax-spec.Capacity && (seq < 0 || s < seq) {
			seq = s
		}
	}
	if seq < 0 {
		t.Fatal("nothing acknowledged in the fsync buffer")
	}
	powerLossFlip(t, powerLossColPath(bufferDir(dir, fb), "observation"), colOff(seq, 16, 9))
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, br := range rep.Buffers {
		for _, p := range br.Problems {
			found = found || (br.Name == fb && strings.Contains(p, fmt.Sprintf("seq %d ", seq)))
		}
	}
	if !found {
		t.Errorf("verify does not report acknowledged seq %d with a flipped byte in buffer %q: %+v", seq, fb, rep.Buffers)
	}
	s := openStore(t, dir)
	defer s.Close()
	b, err := s.Buffer(fb)
	if err != nil {
		t.Fatal(err)
	}
	cols := crashColumns(b)
	dst := crashDst(cols, 1)
	missing, err := b.Gather([]int64{seq}, cols, dst, make([]RowMeta, 1))
	if err != nil || len(missing) != 1 {
		t.Errorf("the damaged row %d is served (missing %v, %v)", seq, missing, err)
	}
}

// File names inside a buffer dir, as docs/format.md gives them.
func powerLossColPath(bdir, field string) string { return filepath.Join(bdir, "f."+field+".col") }
func powerLossTailPath(bdir, key string) string  { return filepath.Join(bdir, "tail."+key+".col") }

// powerLossFlip flips the bits of one byte of a file.
func powerLossFlip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xFF
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// denseTailOff is the offset in the dense tail file at path (entries of rb
// bytes and a trailer) of seq's final observation.
func denseTailOff(t *testing.T, path string, seq int64, rb int64) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off, ok := denseTailEntry(data, seq, rb)
	if !ok {
		t.Fatalf("%s: no entry holds seq %d's final observation", path, seq)
	}
	return off
}

// denseTailEntry finds seq's entry in the bytes of a dense tail file.
func denseTailEntry(data []byte, seq int64, rb int64) (int64, bool) {
	pitch := rb + denseTrailerOf(data)
	for off := int64(headerSize); off+pitch <= int64(len(data)); off += pitch {
		if binary.LittleEndian.Uint64(data[off+rb:]) == uint64(seq+1) {
			return off, true
		}
	}
	return 0, false
}

// TestPowerLossWrapAtSlotZero is the power loss TestPowerLossAboveWatermark
// met by chance (its "zeros" variant, 2026-11-27): an fsync buffer with
// rows.meta version 2 acknowledged rows up to the end of its first pass
// round the ring, an unacknowledged extend went on past the wrap into slots
// 0.., and the power loss took every page of that extend, so slot 0's record
// is all zeros. A zero seq word is also what the complete record of seq 0
// begins with, and recovery took slot 0 for seq 0 still in place: the rows the
// extend was overwriting were kept as damage below the watermark instead of
// being let go, and the acknowledged rows after them, whose previous steps
// they are, were dropped with them. Recovery must let rows 0-3 go and keep
// 4-11 byte for byte, with nothing reported.
func TestPowerLossWrapAtSlotZero(t *testing.T) {
	const name, capacity, acked, written = "rs", 16, 12, 20
	spec := crashSpec(KindMemmap, capacity, crashBlobBytes, true, DurabilityFsync)
	spec.RowMetaLayout = RowMetaRuns
	dir := t.TempDir()
	s := openStore(t, dir)
	b := mustCreate(t, s, name, spec)
	tokens := func(from, to int64) []int64 {
		var out []int64
		for tok := from; tok < to; tok++ {
			out = append(out, tok+1)
		}
		return out
	}
	mustExtend(t, b, "a", crashBatch(spec, tokens(0, acked), true))
	mustExtend(t, b, "a", crashBatch(spec, tokens(acked, written), true))
	cols := crashColumns(b)
	keep := []int64{4, 5, 6, 7, 8, 9, 10, 11}
	read := func(b *Buffer) ([][]byte, []RowMeta) {
		t.Helper()
		dst := make([][]byte, len(cols))
		for i, c := range cols {
			dst[i] = make([]byte, len(keep)*c.RowBytes)
		}
		m := make([]RowMeta, len(keep))
		missing, err := b.Gather(keep, cols, dst, m)
		if err != nil || len(missing) > 0 {
			t.Fatalf("gather %v: missing %v, %v", keep, missing, err)
		}
		return dst, m
	}
	wantData, wantMeta := read(b)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The state a power loss leaves: the catalog as last committed (the
	// extend's seqs reserved, the buffer not closed cleanly), the durable
	// watermark at the last acknowledged row, and every page the
	// unacknowledged extend wrote lost.
	cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := cat.entries()
	if err != nil || len(entries) != 1 {
		t.Fatalf("catalog entries %v, %v", entries, err)
	}
	st := entries[0].state
	st.WriteCount, st.SeqReserved, st.Clean = acked, max(st.SeqReserved, written), false
	if err := cat.putState(name, st, entries[0].streams, false); err != nil {
		t.Fatal(err)
	}
	if err := cat.close(); err != nil {
		t.Fatal(err)
	}
	path := metaFile(bufferDir(dir, name))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	putWatermark(data[:headerSize], acked)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, destroyed := powerLossScramble(t, dir, name, "zeros", rand.New(rand.NewPCG(1, 2))); destroyed != written-acked {
		t.Fatalf("%d slots destroyed, want the unacknowledged extend's %d", destroyed, written-acked)
	}

	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("verify after the power loss: %+v", rep.Buffers)
	}
	_, b = openBuffer(t, dir, name)
	cols = crashColumns(b)
	if got := b.LiveSeqs(0, 100); !slices.Equal(got, keep) {
		t.Errorf("live seqs %v after the power loss, want %v (rows 0-3 let go with the extend that was overwriting them)", got, keep)
	}
	gotData, gotMeta := read(b)
	for i, c := range cols {
		if !bytes.Equal(gotData[i], wantData[i]) {
			t.Errorf("column %q of rows %v changed across the power loss", c.Name, keep)
		}
	}
	for j := range keep {
		if gotMeta[j].TrajID != wantMeta[j].TrajID || gotMeta[j].Step != wantMeta[j].Step || gotMeta[j].Done != wantMeta[j].Done {
			t.Errorf("row %d: %+v after the power loss, %+v before", keep[j], gotMeta[j], wantMeta[j])
		}
	}
}

// denseTrailerOf is the trailer size of the dense tail file whose bytes
// are data, by its header's version.
func denseTrailerOf(data []byte) int64 {
	if binary.LittleEndian.Uint32(data[8:]) == tailVersionDenseV3 {
		return tailTrailerSizeV3
	}
	return tailTrailerSize
}
