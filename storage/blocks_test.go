package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// blocksSpec is testSpec's compact memmap buffer of capacity rows with
// rows.meta format version 3.
func blocksSpec(capacity int64, d Durability) Spec {
	spec := testSpec(KindMemmap, capacity, true)
	spec.RowMetaLayout = RowMetaBlocks
	spec.Durability = d
	return spec
}

// blocksWorkload writes n rows into b in extends of the given shape:
// "collector" (8 envs in lockstep, batches of 64, episodes of 5 to 40
// steps), "actors" (one step a request from 12 streams in turn) or
// "huge" (one extend of more rows than the ring, then small ones).
func blocksWorkload(t testing.TB, b *Buffer, shape string, n, from int) {
	t.Helper()
	spec := b.Spec()
	switch shape {
	case "collector":
		const envs = 8
		for k := from; k < from+n; k += 64 {
			rows := make([]row, min(64, from+n-k))
			for i := range rows {
				v := k + i
				e := v % envs
				rows[i] = row{env: int64(e), val: float32(v), terminated: (v/envs)%(5+e*5) == 4+e*5, final: float32(-v)}
			}
			mustExtend(t, b, "c", makeBatch(spec, rows, true))
		}
	case "actors":
		for k := from; k < from+n; k++ {
			a := k % 12
			r := row{val: float32(k), truncated: k%(7+a) == 0, final: float32(k) + 0.5}
			mustExtend(t, b, fmt.Sprintf("a%d", a), makeBatch(spec, []row{r}, true))
		}
	case "huge":
		rows := make([]row, int(spec.Capacity)+97)
		for i := range rows {
			v := from + i
			rows[i] = row{env: int64(v % 3), val: float32(v), terminated: v%11 == 10, final: float32(v * 2)}
		}
		mustExtend(t, b, "h", makeBatch(spec, rows, true))
		blocksWorkload(t, b, "collector", n, from+len(rows))
	default:
		t.Fatalf("unknown shape %q", shape)
	}
}

// blocksRing is the version 3 buffer most tests here harm: capacity 300
// (384 slots), 700 rows from a collector (the window [400, 700)).
func blocksRing(t *testing.T, d Durability) (dir string, s *Store, b *Buffer) {
	t.Helper()
	dir = t.TempDir()
	s = openStore(t, dir)
	b = mustCreate(t, s, "b", blocksSpec(300, d))
	blocksWorkload(t, b, "collector", 700, 0)
	return dir, s, b
}

// eachPieceV3 calls fn with every valid version 3 run record of the
// buffer dir bdir: its segment's path and offset, and the record.
func eachPieceV3(t *testing.T, bdir string, fn func(path string, off int64, p pieceV3)) {
	t.Helper()
	nos, _ := runSegmentNumbers(bdir)
	for _, no := range nos {
		path := filepath.Join(bdir, runSegName(no))
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off := segHeaderSize; off+runLogRecordSize <= len(data); off += runLogRecordSize {
			if p, why := decodePieceV3(data[off:off+runLogRecordSize], -1); why == "" {
				fn(path, int64(off), p)
			}
		}
	}
}

// clearFileRange writes n zero bytes at off in the file at path.
func clearFileRange(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(make([]byte, n), off)
	if err := errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
}

// checkCheckpoint verifies the checkpoint in dest and checks that its
// buffer "b" serves exactly want.
func checkCheckpoint(t *testing.T, dest string, want map[int64]servedRow) {
	t.Helper()
	if rep, err := Verify(dest, nil); err != nil || !rep.OK() {
		t.Fatalf("verify the checkpoint: %v %+v", err, rep)
	}
	_, cb := openBuffer(t, dest, "b")
	if got := checkServed(t, cb, want); len(got) != len(want) {
		t.Fatalf("the checkpoint serves %d rows, the buffer %d", len(got), len(want))
	}
}

// TestBlocksRoundTrip: a version 3 buffer's rows read back the same after
// a clean close and reopen (verify finds the dir clean), extends go on in
// the block they left off in, and the files hold what version 3 says:
// rows.meta of two record copies a block, columns of S slots.
func TestBlocksRoundTrip(t *testing.T) {
	for _, capacity := range []int64{64, 100, 1000} {
		for _, d := range []Durability{DurabilityNone, DurabilityFlush, DurabilityFsync} {
			for _, shape := range []string{"collector", "actors", "huge"} {
				t.Run(fmt.Sprintf("cap%d/%s/%s", capacity, d, shape), func(t *testing.T) {
					dir := t.TempDir()
					s := openStore(t, dir)
					b := mustCreate(t, s, "b", blocksSpec(capacity, d))
					n := int(capacity)*2 + 37
					blocksWorkload(t, b, shape, n, 0)
					want := servedRows(t, b)
					if len(want) == 0 {
						t.Fatal("no rows")
					}
					wc := b.WriteCount()
					s, b = reopenVerified(t, s, dir, "b")
					if b.WriteCount() != wc {
						t.Fatalf("write count %d after a clean reopen, %d before", b.WriteCount(), wc)
					}
					if got := checkServed(t, b, want); len(got) != len(want) {
						t.Fatalf("%d rows after reopening, %d before", len(got), len(want))
					}
					// The block being filled continues: no seq is skipped.
					blocksWorkload(t, b, shape, 50, n+1000)
					want = servedRows(t, b)
					wc = b.WriteCount()
					s, b = reopenVerified(t, s, dir, "b")
					if got := checkServed(t, b, want); len(got) != len(want) || b.WriteCount() != wc {
						t.Fatalf("%d rows and write count %d after the second reopen, %d and %d before", len(got), b.WriteCount(), len(want), wc)
					}
					slots := spareSlots(capacity)
					if got, want := fileSize(t, metaFile(b.dir)), metaV3Size(slots); got != want {
						t.Errorf("rows.meta is %d bytes, want %d", got, want)
					}
					if got, want := fileSize(t, filepath.Join(b.dir, colFileName("observation"))), headerSize+slots*16; got != want {
						t.Errorf("observation column is %d bytes, want %d (%d slots)", got, want, slots)
					}
					info, err := b.Info()
					if err != nil {
						t.Fatal(err)
					}
					if info.RowMetaBytes != 1 {
						t.Errorf("row_meta_bytes %d, want 1", info.RowMetaBytes)
					}
					_ = s
				})
			}
		}
	}
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestBlocksMemmapOnly: row_meta "blocks" is a memmap buffer's; memory
// and compressed buffers refuse it with a spec error naming the field, and
// a memmap spec that leaves row_meta out gets it.
func TestBlocksMemmapOnly(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	for _, kind := range []Kind{KindMemory, KindCompressed} {
		spec := testSpec(kind, 100, true)
		spec.RowMetaLayout = RowMetaBlocks
		_, _, err := s.CreateBuffer("m", spec)
		var se *SpecError
		if !errors.As(err, &se) || se.Path != "row_meta" {
			t.Errorf("%s buffer with row_meta blocks: %v, want a spec error at row_meta", kind, err)
		}
	}
	// Left out: version 3, but version 2 for an fsync buffer or a ring
	// under 1,024 rows (an open after a crash leaves version 3's block
	// being filled, evicting up to 63 of the oldest rows).
	for i, tc := range []struct {
		capacity int64
		dur      Durability
		want     RowMetaLayout
	}{
		{1024, DurabilityFlush, RowMetaBlocks},
		{100_000, DurabilityNone, RowMetaBlocks},
		{1023, DurabilityFlush, RowMetaRuns},
		{100, DurabilityNone, RowMetaRuns},
		{100_000, DurabilityFsync, RowMetaRuns},
	} {
		spec := testSpec(KindMemmap, tc.capacity, true)
		spec.RowMetaLayout, spec.Durability = "", tc.dur
		b := mustCreate(t, s, fmt.Sprintf("d%d", i), spec)
		if got := b.Spec().RowMetaLayout; got != tc.want || (b.blk != nil) != (tc.want == RowMetaBlocks) {
			t.Errorf("a %s memmap buffer of %d rows that leaves row_meta out has row_meta %q, want %q", tc.dur, tc.capacity, got, tc.want)
		}
	}
}

// powerLossScrambleV3 is powerLossScramble for a buffer with rows.meta
// version 3 in a closed data dir: everything a power loss may take of what
// was written after the last sync is destroyed ("random" bytes, "zeros",
// or for records, "crc": a flipped checksum bit): block record copies that
// name rows at or above the durable watermark W, the rows at or above W
// (in their slots), their dense tail entries, and the run records of
// pieces that start at or above W (a sync covers whole extends). It
// returns W and how many rows it destroyed.
func powerLossScrambleV3(t *testing.T, dir, buf, variant string, rng *rand.Rand) (int64, int) {
	t.Helper()
	powerLossReboot(t, dir)
	bdir := bufferDir(dir, buf)
	path := metaFile(bdir)
	meta, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeMetaHeader(path, meta)
	if err != nil || h.Version != metaVersionBlocks {
		t.Fatalf("%s: header %+v, %v; want version 3", path, h, err)
	}
	wr, why := decodeWatermarkRecord(meta[:headerSize])
	if why != "" {
		t.Fatalf("%s: watermark record torn after kill -9: %s", path, why)
	}
	w, slots := wr.Seq, int64(h.Slots)
	end := w // the end of what the writer may have reached
	for k := range slots / blockRows {
		for i := range 2 {
			off := blockCopyOffset(slots, k, i)
			c, why := decodeBlockCopy(meta[off:off+blockCopySize], k, slots, -1)
			if why != "" || c.Base+int64(c.Rows) <= w {
				continue
			}
			end = max(end, c.Base+int64(c.Rows))
			powerLossDestroy(t, variant, rng, meta[off:off+blockCopySize], bcCRC)
		}
	}
	if err := os.WriteFile(path, meta, 0o644); err != nil {
		t.Fatal(err)
	}
	nos, err := runSegmentNumbers(bdir)
	if err != nil {
		t.Fatal(err)
	}
	for _, no := range nos {
		spath := filepath.Join(bdir, runSegName(no))
		data, err := os.ReadFile(spath)
		if err != nil {
			t.Fatal(err)
		}
		for off := segHeaderSize; off+runLogRecordSize <= len(data); off += runLogRecordSize {
			rec := data[off : off+runLogRecordSize]
			p, why := decodePieceV3(rec, -1)
			if why != "" {
				continue
			}
			end = max(end, p.lastSeq()+1)
			if p.FirstSeq >= w {
				powerLossDestroy(t, variant, rng, rec, rlCRC)
			}
		}
		if err := os.WriteFile(spath, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if variant == "crc" {
		return w, int(end - w)
	}
	wipe := func(b []byte) {
		if variant == "random" {
			powerLossRandom(rng, b)
		} else {
			clear(b)
		}
	}
	powerLossColumns(t, bdir, func(ch colHeader, data []byte) {
		rb := int64(ch.RowBytes)
		if ch.Version == tailVersionDenseV3 {
			powerLossDenseEntries(data, rb, tailTrailerSizeV3, w, wipe)
			return
		}
		for seq := w; seq < end; seq++ {
			off := headerSize + seq%slots*rb
			wipe(data[off : off+rb])
		}
	})
	return w, int(end - w)
}

// TestBlocksPowerLoss is TestPowerLossAboveWatermark for version 3: a
// writer of an fsync and a flush buffer is killed, everything a power loss
// may take of what it wrote after each buffer's last sync is destroyed, and
// the dir must verify clean, hold every fsync-acknowledged row, and take
// new writes under fresh seqs; two rounds per dir.
func TestBlocksPowerLoss(t *testing.T) {
	rounds := 2
	if testing.Short() {
		rounds = 1
	}
	bufs := []string{crashFsyncBlocks, crashFlushBlocks, crashNone}
	for vi, variant := range []string{"random", "zeros", "crc"} {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			rng := rand.New(rand.NewPCG(uint64(vi), 77))
			m := newCrashModel(bufs...)
			for r := 0; r < rounds; r++ {
				delay := time.Duration(120+rng.IntN(250)) * time.Millisecond
				run := crashRunChild(t, crashChildCfg{
					dir: dir, seed: uint64(2000*vi + r), tokenBase: int64(vi*10+r+1) << 32,
					bufs: bufs, intervalMS: 50, killAfter: delay,
				})
				m.absorb(t, r, run)
				durable, destroyed := map[string]int64{}, map[string]int{}
				for _, buf := range bufs {
					durable[buf], destroyed[buf] = powerLossScrambleV3(t, dir, buf, variant, rng)
				}
				if durable[crashFsyncBlocks] < m.maxAckEnd[crashFsyncBlocks] {
					t.Errorf("round %d: the fsync buffer's durable watermark on disk is %d, but rows up to %d were acknowledged",
						r, durable[crashFsyncBlocks], m.maxAckEnd[crashFsyncBlocks]-1)
				}
				t.Logf("round %d: killed %v after ready; acknowledged up to %v; watermarks %v; rows destroyed %v",
					r, delay, m.maxAckEnd, durable, destroyed)
				m.check(t, dir, r, run, crashCheckOpts{powerLoss: true, durable: durable})
				m.writeAfter(t, dir, r)
			}
		})
	}
}

// TestBlocksDamageBelowWatermark flips bytes of durable rows of a version
// 3 buffer: a field byte (its block's checksums fail: the block's rows are
// reported and dropped), a final observation (only its row), one copy of a
// block's record (the other verifies: nothing lost), both copies (the
// block), a run record (its piece's rows). Verify reports the damaged row,
// which is never served; every row dropped is in the damaged block or
// piece, or a later row of a trajectory that lost one.
func TestBlocksDamageBelowWatermark(t *testing.T) {
	const capacity = 300
	type damage struct {
		victim int64          // a row that must be reported and dropped (-1: none)
		may    map[int64]bool // rows that may be dropped besides successors
	}
	blockOf := func(seq int64) map[int64]bool {
		m := map[int64]bool{}
		for s := seq - seq%blockRows; s < seq-seq%blockRows+blockRows; s++ {
			m[s] = true
		}
		return m
	}
	cases := []struct {
		name string
		harm func(t *testing.T, bdir string, b *Buffer, metas map[int64]RowMeta) damage
	}{
		{"field byte", func(t *testing.T, bdir string, b *Buffer, _ map[int64]RowMeta) damage {
			seq := b.WriteCount() - 150
			powerLossFlip(t, filepath.Join(bdir, colFileName("observation")), headerSize+seq%b.slots*16+5)
			return damage{seq, blockOf(seq)}
		}},
		{"tail entry", func(t *testing.T, bdir string, b *Buffer, metas map[int64]RowMeta) damage {
			for seq := b.WriteCount() - 200; ; seq++ {
				if m, ok := metas[seq]; ok && m.HasTail {
					path := tailFile(bdir, "observation")
					powerLossFlip(t, path, denseTailOff(t, path, seq, 16)+3)
					return damage{seq, map[int64]bool{seq: true}}
				}
			}
		}},
		{"one record copy", func(t *testing.T, bdir string, b *Buffer, _ map[int64]RowMeta) damage {
			seq := b.WriteCount() - 150
			powerLossFlip(t, metaFile(bdir), blockCopyOffset(b.slots, b.blockOf(seq-seq%blockRows), 0)+3)
			return damage{-1, nil}
		}},
		{"both record copies", func(t *testing.T, bdir string, b *Buffer, _ map[int64]RowMeta) damage {
			seq := b.WriteCount() - 150
			k := b.blockOf(seq - seq%blockRows)
			powerLossFlip(t, metaFile(bdir), blockCopyOffset(b.slots, k, 0)+3)
			powerLossFlip(t, metaFile(bdir), blockCopyOffset(b.slots, k, 1)+bcCRCh)
			return damage{seq, blockOf(seq)}
		}},
		{"run record", func(t *testing.T, bdir string, b *Buffer, _ map[int64]RowMeta) damage {
			seq := b.WriteCount() - 150
			var may map[int64]bool
			eachPieceV3(t, bdir, func(path string, off int64, p pieceV3) {
				if _, ok := p.rowOf(seq); ok && may == nil {
					powerLossFlip(t, path, off+rlStep)
					may = map[int64]bool{}
					for k := range int(p.Rows) {
						s, _, _, _ := p.row(k)
						may[s] = true
					}
				}
			})
			if may != nil {
				return damage{seq, may}
			}
			t.Fatalf("no piece holds seq %d", seq)
			return damage{}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			b := mustCreate(t, s, "b", blocksSpec(capacity, DurabilityFsync))
			blocksWorkload(t, b, "collector", 700, 0)
			all := b.LiveSeqs(0, capacity)
			metas := map[int64]RowMeta{}
			for i, m := range metasOf(t, b, all) {
				metas[all[i]] = m
			}
			want := servedRows(t, b)
			bdir := b.dir
			d := tc.harm(t, bdir, b, metas)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.victim < 0 {
				if !rep.OK() {
					t.Fatalf("verify after harm that loses nothing: %+v", rep.Buffers)
				}
			} else {
				found := false
				for _, p := range rep.Buffers[0].Problems {
					found = found || strings.Contains(p, fmt.Sprintf("seq %d ", d.victim))
				}
				if !found {
					t.Fatalf("verify does not report seq %d: %v", d.victim, rep.Buffers[0].Problems)
				}
			}
			s2, b2 := openBuffer(t, dir, "b")
			_ = s2
			served := checkServed(t, b2, want)
			live := map[int64]bool{}
			for _, seq := range served {
				live[seq] = true
			}
			if d.victim >= 0 && live[d.victim] {
				t.Errorf("the damaged row %d is served", d.victim)
			}
			lostTraj := map[int64]int64{} // trajectory -> its first dropped seq
			for _, seq := range all {
				if live[seq] {
					continue
				}
				m := metas[seq]
				if first, ok := lostTraj[m.TrajID]; ok && first < seq {
					continue // a successor of a dropped row
				}
				if !d.may[seq] {
					t.Errorf("row %d (trajectory %d) dropped, outside the damaged block or piece", seq, m.TrajID)
				}
				if _, ok := lostTraj[m.TrajID]; !ok {
					lostTraj[m.TrajID] = seq
				}
			}
			if info, _ := b2.Info(); (info.Damaged == 0) != (d.victim < 0) {
				t.Errorf("Info reports %d damaged rows", info.Damaged)
			}
		})
	}
}

func metasOf(t testing.TB, b *Buffer, seqs []int64) []RowMeta { return metas(t, b, seqs...) }

// TestBlocksCheckpointRefusesDamage: a hot checkpoint checks each block it
// copies against the source's checksum of it, so bytes of durable rows
// damaged while the buffer is open (here: written to the column file
// behind the mapping's back) fail the checkpoint with ErrCorrupt, leaving
// no destination, instead of being sealed under the copy's fresh
// checksums; an undamaged buffer's checkpoint verifies and serves the
// same rows.
func TestBlocksCheckpointRefusesDamage(t *testing.T) {
	_, s, b := blocksRing(t, DurabilityFsync)
	defer s.Close()
	want := servedRows(t, b)
	good := filepath.Join(t.TempDir(), "cp")
	if _, err := b.Checkpoint(context.Background(), good, nil); err != nil {
		t.Fatal(err)
	}
	checkCheckpoint(t, good, want)
	seq := b.WriteCount() - 150
	powerLossFlip(t, filepath.Join(b.dir, colFileName("observation")), headerSize+seq%b.slots*16+2)
	bad := filepath.Join(t.TempDir(), "cp")
	_, err := b.Checkpoint(context.Background(), bad, nil)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("block %d ", b.blockOf(seq-seq%blockRows))) {
		t.Fatalf("checkpoint of a buffer with a damaged block: %v, want ErrCorrupt naming block %d", err, b.blockOf(seq-seq%blockRows))
	}
	if _, err := os.Stat(bad); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused checkpoint left %s: %v", bad, err)
	}
}

// TestBlocksCheckpointAfterCrash: after an unclean close and a reboot, a
// writable open writes final records of fewer than 64 rows for the blocks
// it leaves early or finds torn (their rows past the prefix are holes); a
// hot checkpoint then checks those blocks against those records, and the
// copy verifies and serves the same rows (a checkpoint once took such a
// block for damage). Without the reboot the open may go on filling the
// block instead (a kill between extends), and the same must hold.
func TestBlocksCheckpointAfterCrash(t *testing.T) {
	for _, buf := range []string{crashFsyncBlocks, crashFlushBlocks} {
		for _, reboot := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/reboot=%v", buf, reboot), func(t *testing.T) {
				checkpointAfterCrash(t, buf, reboot)
			})
		}
	}
}

func checkpointAfterCrash(t *testing.T, buf string, reboot bool) {
	dir := t.TempDir()
	crashRunChild(t, crashChildCfg{dir: dir, seed: 3, tokenBase: 1 << 32, bufs: []string{buf},
		intervalMS: 20, killAfter: 150 * time.Millisecond})
	if reboot {
		powerLossReboot(t, dir)
	}
	s, b := openBuffer(t, dir, buf)
	_ = s
	if wc := b.WriteCount(); reboot && wc%blockRows != 0 {
		t.Fatalf("write count %d after an unclean open: the block being filled was not left", wc)
	}
	want := servedRows(t, b)
	dest := filepath.Join(t.TempDir(), "cp")
	res, err := b.Checkpoint(context.Background(), dest, nil)
	if err != nil {
		t.Fatalf("checkpoint after a crash: %v", err)
	}
	if rep, err := Verify(dest, nil); err != nil || !rep.OK() {
		t.Fatalf("verify the checkpoint: %v %+v", err, rep)
	}
	_, cb := openBuffer(t, dest, buf)
	if got := checkServed(t, cb, want); int64(len(got)) != res.Rows || len(got) != len(want) {
		t.Fatalf("the checkpoint serves %d rows, says %d, the buffer %d", len(got), res.Rows, len(want))
	}
}

// TestBlocksRecordsFarAhead: a power loss can keep block records of an
// unacknowledged write that ran far ahead of the pieces the run log kept
// (here: a valid copy of block 2's pass at 1856 written into a dir whose
// rows end at 1000, with the reservation past it). Open counts the seqs
// that write reached from the records of every block at or past the
// pieces' end, whatever their pass; it once read only the next slots'
// worth, left that copy for a later open to find once the writer had
// replaced the other, and the second open then moved the window past
// acknowledged rows without a word.
func TestBlocksRecordsFarAhead(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := blocksSpec(100, DurabilityFsync)
	b := mustCreate(t, s, "b", spec)
	blocksWorkload(t, b, "collector", 1000, 0)
	slots := b.slots // 192
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	const far = 1856 // block 2's pass after next, past wc + slots
	bdir := bufferDir(dir, "b")
	meta, err := os.ReadFile(metaFile(bdir))
	if err != nil {
		t.Fatal(err)
	}
	k := int64(far % 192 / blockRows)
	c0, why := decodeBlockCopy(meta[blockCopyOffset(slots, k, 0):], k, slots, -1)
	if why != "" {
		t.Fatalf("block %d copy A: %s", k, why)
	}
	blockCopy{Base: far, Gen: c0.Gen + 7, Rows: blockRows, Final: true, CRC: 1}.encode(meta[blockCopyOffset(slots, k, 1):])
	if err := os.WriteFile(metaFile(bdir), meta, 0o644); err != nil {
		t.Fatal(err)
	}
	// The writer had reserved seqs up to 2048 and crashed.
	cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	es, err := cat.entries()
	if err != nil || len(es) != 1 {
		t.Fatalf("catalog entries %v, %v", es, err)
	}
	st := es[0].state
	st.SeqReserved, st.Clean = 2048, false
	if err := errors.Join(cat.putState("b", st, nil, false), cat.close()); err != nil {
		t.Fatal(err)
	}
	s, b = openBuffer(t, dir, "b")
	wc1 := b.WriteCount()
	if wc1 < far+blockRows {
		t.Fatalf("write count %d after the open: the record naming seqs up to %d was not counted", wc1, far+blockRows)
	}
	blocksWorkload(t, b, "collector", 300, 5000)
	want := servedRows(t, b)
	wc2 := b.WriteCount()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, b = openBuffer(t, dir, "b")
	if b.WriteCount() != wc2 {
		t.Fatalf("write count %d after a clean reopen, %d before", b.WriteCount(), wc2)
	}
	if got := checkServed(t, b, want); len(got) != len(want) {
		t.Fatalf("%d rows after a clean reopen, %d before", len(got), len(want))
	}
}

// TestBlocksExtendAfterFault: an extend that was admitted while another
// faulted on the buffer's files (it waited for the writer's lock) is
// refused with ErrIO and writes nothing: the faulting extend may have left
// its seqs' pieces and a block's records half written.
func TestBlocksExtendAfterFault(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := blocksSpec(100, DurabilityFlush)
	b := mustCreate(t, s, "b", spec)
	blocksWorkload(t, b, "collector", 100, 0)
	wc := b.WriteCount()
	b.wmu.Lock()
	b.blk.faulted = true // what the faulting extend leaves, under wmu
	b.wmu.Unlock()
	p, err := b.validate(makeBatch(spec, []row{{val: 1}}, true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.write("c", p); !errors.Is(err, ErrIO) {
		t.Fatalf("extend after a fault: %v, want ErrIO", err)
	}
	if b.WriteCount() != wc {
		t.Fatalf("write count %d, want %d", b.WriteCount(), wc)
	}
	if err := b.syncTo(wc + 1); !errors.Is(err, ErrIO) {
		t.Fatalf("sync after a fault: %v, want ErrIO", err)
	}
}

// TestBlocksTailLetGo: after an unclean close, an fsync buffer may find a
// row whose block verifies but whose final observation's entry names a
// newer row. When enough final observations could have been written after
// it to reuse its entry (tails reuse the oldest entries; a power loss can
// keep the tail file's page and lose the columns'), the row is let go as
// a hole, as the walk lets go blocks; when they could not (long episodes,
// a reservation close to the write count), it is damage, reported. Every
// other row is served either way.
func TestBlocksTailLetGo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		episode  int   // steps an episode: a final observation every episode
		reserved int64 // the catalog's reservation after the crash
		damage   bool
	}{
		{"one-step episodes", 1, 640, false},
		{"ten-step episodes", 10, 448, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			spec := blocksSpec(100, DurabilityFsync)
			b := mustCreate(t, s, "b", spec)
			rows := make([]row, 320)
			for i := range rows {
				rows[i] = row{val: float32(i), terminated: i%tc.episode == tc.episode-1, final: float32(-i)}
			}
			mustExtend(t, b, "c", makeBatch(spec, rows, true))
			want := servedRows(t, b)
			slots := b.slots
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			victim := int64(220 + tc.episode - 1) // a done row near the window's bottom (220)
			path := tailFile(bufferDir(dir, "b"), "observation")
			off := denseTailOff(t, path, victim, 16)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			newer := victim + slots + 5
			putTailTrailerV3(data[off:], 16, newer, 777, 0) // a newer row's entry
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			es, err := cat.entries()
			if err != nil {
				t.Fatal(err)
			}
			st := es[0].state
			st.SeqReserved, st.Clean = tc.reserved, false
			if err := errors.Join(cat.putState("b", st, nil, false), cat.close()); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() == tc.damage {
				t.Fatalf("verify OK %v, want %v: %+v", rep.OK(), !tc.damage, rep.Buffers)
			}
			// A row let go is counted, not reported; one reported is not
			// counted.
			if letGo := rep.Buffers[0].LetGo; (letGo == 1) != !tc.damage || letGo > 1 {
				t.Fatalf("verify counts %d rows let go, want %d", letGo, map[bool]int{false: 1, true: 0}[tc.damage])
			}
			_, b = openBuffer(t, dir, "b")
			delete(want, victim)
			if b.Live(victim) {
				t.Fatalf("row %d, whose entry names seq %d, is served", victim, newer)
			}
			if got := checkServed(t, b, want); len(got) != len(want) {
				t.Fatalf("%d rows served, want %d", len(got), len(want))
			}
		})
	}
}

// TestBlocksCheckpointSkipsDamaged: rows an open dropped as damage have no
// stamp, as rows a writer overwrote do; a hot checkpoint leaves them out
// as holes and copies every older live row (it once took them for
// overwritten and left out every older row with them).
func TestBlocksCheckpointSkipsDamaged(t *testing.T) {
	dir, s, b := blocksRing(t, DurabilityFsync)
	seq := b.WriteCount() - 150 // a block in the middle of the window
	col := filepath.Join(b.dir, colFileName("observation"))
	off := headerSize + seq%b.slots*16 + 2
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	powerLossFlip(t, col, off)
	_, b = openBuffer(t, dir, "b")
	if info, _ := b.Info(); info.Damaged == 0 {
		t.Fatal("the open found no damage")
	}
	live := servedRows(t, b)
	dest := filepath.Join(t.TempDir(), "cp")
	res, err := b.Checkpoint(context.Background(), dest, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != int64(len(live)) || res.Overwritten != 0 {
		t.Fatalf("checkpoint of %d rows (%d overwritten), the buffer serves %d", res.Rows, res.Overwritten, len(live))
	}
	checkCheckpoint(t, dest, live)
}

// TestBlocksCheckpointEvictedWhileRead: a block the writer began to evict
// while a hot checkpoint read it (its oldest rows left the window, none of
// its slots written again) is still checked against its checksum: a
// damaged row kept by the copy fails the checkpoint. It was once copied
// unchecked, and the copy's fresh checksum made the damage valid.
func TestBlocksCheckpointEvictedWhileRead(t *testing.T) {
	_, s, b := blocksRing(t, DurabilityFlush)
	defer s.Close()
	// W = 700, the window [400, 700); its bottom block is seqs 384-447.
	seq := int64(440)
	powerLossFlip(t, filepath.Join(b.dir, colFileName("observation")), headerSize+seq%b.slots*16+2)
	extended := false
	evict := func(done, total int64) {
		if !extended {
			extended = true // 10 rows: seqs 400-409 leave the window, no slot of the bottom block is written
			rows := make([]row, 10)
			for i := range rows {
				rows[i] = row{env: int64(i % 8), val: float32(700 + i)}
			}
			mustExtend(t, b, "c", makeBatch(b.Spec(), rows, true))
		}
	}
	dest := filepath.Join(t.TempDir(), "cp")
	res, err := b.Checkpoint(context.Background(), dest, &CheckpointOptions{Progress: evict})
	if !extended {
		t.Fatal("fixture: the checkpoint reported no progress")
	}
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("block %d ", b.blockOf(seq-seq%blockRows))) {
		t.Fatalf("checkpoint of a damaged block evicted in part while it was read: %v (%+v), want ErrCorrupt naming block %d", err, res, b.blockOf(seq-seq%blockRows))
	}
}

// TestBlocksCheckpointReadOnly: a read-only store (no writer, no running
// checksum in memory) checkpoints a version 3 buffer whose write count is
// not a block boundary, checking the block it ends in against the tip of
// the watermark record on disk; the copy verifies and serves the same
// rows. It once failed: "block records out of step with the write count".
func TestBlocksCheckpointReadOnly(t *testing.T) {
	dir, s, b := blocksRing(t, DurabilityFlush)
	if b.WriteCount()%blockRows == 0 {
		t.Fatalf("fixture: write count %d is a block boundary", b.WriteCount())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	rb := mustBuffer(t, ro, "b")
	want := servedRows(t, rb)
	dest := filepath.Join(t.TempDir(), "cp")
	res, err := rb.Checkpoint(context.Background(), dest, nil)
	if err != nil || res.Rows != int64(len(want)) {
		t.Fatalf("checkpoint of a read-only store: %v (%+v), want %d rows", err, res, len(want))
	}
	checkCheckpoint(t, dest, want)
	// Damage under the tip: refused, as in a writable store.
	seq := rb.WriteCount() - 3
	powerLossFlip(t, filepath.Join(rb.dir, colFileName("observation")), headerSize+seq%rb.slots*16+1)
	if _, err := rb.Checkpoint(context.Background(), filepath.Join(t.TempDir(), "cp"), nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("checkpoint of a damaged tip block: %v, want ErrCorrupt", err)
	}
}

// TestBlocksSnapshotCraftedSeqs: a run record naming seqs near 2^63 (valid
// checksum, written behind a running writer) does not crash a snapshot
// open (rbd verify next to a server), which has no seq reservation to
// bound records by: seq + capacity once overflowed into a negative block
// and an index out of range. Such a record is invalid, and names no seq
// of the window.
func TestBlocksSnapshotCraftedSeqs(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  pieceV3
	}{
		{"hole", holeRecord(math.MaxInt64-2, math.MaxInt64-1)},
		{"piece", pieceV3{FirstSeq: math.MaxInt64 - 70_000, TrajID: 1, Rows: 2, Stride: 3, PrevSeq: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			defer s.Close()
			b := mustCreate(t, s, "b", blocksSpec(70_000, DurabilityFlush))
			blocksWorkload(t, b, "collector", 2000, 0)
			var rec [runLogRecordSize]byte
			tc.rec.encode(rec[:])
			seg := append(segHeader{Magic: runSegMagic, Version: metaVersionBlocks, UID: b.uid, Number: 99}.encode(), rec[:]...)
			if err := os.WriteFile(filepath.Join(b.dir, runSegName(99)), seg, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir, nil) // a snapshot open: the store holds the dir
			if err != nil {
				t.Fatal(err)
			}
			if br := rep.Buffers[0]; br.LiveRows != 2000 || !rep.OK() {
				t.Fatalf("verify next to the writer: %d live rows, problems %q; want 2000 and none (the record names no seq of the window)", br.LiveRows, br.Problems)
			}
		})
	}
}

// TestBlocksNewestRowsLost: when the pieces and block records of the
// newest synced rows are lost (damage, or a power loss that took pages a
// sync had flushed) and the catalog's count is older, the watermark
// record still counts those rows: an open reports them as damage. They
// once vanished without a word, the window ending before them.
func TestBlocksNewestRowsLost(t *testing.T) {
	dir, s, b := blocksRing(t, DurabilityFsync)
	w, slots, bdir := b.WriteCount(), b.slots, b.dir
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	from := w - 40
	eachPieceV3(t, bdir, func(path string, off int64, p pieceV3) {
		if p.lastSeq() >= from {
			clearFileRange(t, path, off, runLogRecordSize)
		}
	})
	meta, err := os.ReadFile(metaFile(bdir))
	if err != nil {
		t.Fatal(err)
	}
	for base := from - from%blockRows; base < w; base += blockRows {
		for i := range 2 {
			off := blockCopyOffset(slots, base%slots/blockRows, i)
			clear(meta[off : off+blockCopySize])
		}
	}
	if err := os.WriteFile(metaFile(bdir), meta, 0o644); err != nil {
		t.Fatal(err)
	}
	upEditStates(t, dir, func(_ string, st *bufferState) { st.Clean, st.WriteCount = false, from-100 })
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	br := rep.Buffers[0]
	if br.WriteCount != w || !slices.ContainsFunc(br.Problems, func(p string) bool { return strings.Contains(p, fmt.Sprintf("seq %d ", w-1)) }) {
		t.Fatalf("verify: write count %d (watermark %d), problems %q: want seq %d reported", br.WriteCount, w, br.Problems, w-1)
	}
}

// TestBlocksCheckpointRefusesTailDamage: a damaged final observation of a
// live row (its entry's trailer checksum fails) fails a hot checkpoint
// with ErrCorrupt naming the row, as damaged fields do. It was once copied
// as read, leaving the damage for the copy's open to find.
func TestBlocksCheckpointRefusesTailDamage(t *testing.T) {
	_, s, b := blocksRing(t, DurabilityFlush)
	defer s.Close()
	seqs := b.LiveSeqs(0, 300)
	var done int64 = -1
	for i, m := range metasOf(t, b, seqs) {
		if m.HasTail && seqs[i] < b.WriteCount()-100 {
			done = seqs[i]
		}
	}
	if done < 0 {
		t.Fatal("fixture: no done row")
	}
	path := tailFile(b.dir, "observation")
	powerLossFlip(t, path, denseTailOff(t, path, done, 16)+3)
	_, err := b.Checkpoint(context.Background(), filepath.Join(t.TempDir(), "cp"), nil)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("seq %d ", done)) {
		t.Fatalf("checkpoint of a buffer with a damaged final observation: %v, want ErrCorrupt naming seq %d", err, done)
	}
}

// TestBlocksWalkLetGoCounted: after a crash, an fsync buffer whose bottom
// block does not verify, while a reserved write of that block's next pass
// could have been overwriting it, lets the block's rows of the window go:
// verify finds no damage and counts them, and they are not served.
func TestBlocksWalkLetGoCounted(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := blocksSpec(100, DurabilityFsync)
	b := mustCreate(t, s, "b", spec)
	rows := make([]row, 320)
	for i := range rows {
		rows[i] = row{val: float32(i), terminated: i%10 == 9, final: float32(-i)}
	}
	mustExtend(t, b, "c", makeBatch(spec, rows, true))
	slots := b.slots // 192: the window [220, 320), its bottom block seqs 192-255
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	powerLossFlip(t, filepath.Join(bufferDir(dir, "b"), colFileName("observation")), headerSize+230%slots*16+1)
	upEditStates(t, dir, func(_ string, st *bufferState) { st.Clean, st.SeqReserved = false, 448 }) // 192 + S < 448
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if br := rep.Buffers[0]; !rep.OK() || br.LetGo != 256-220 {
		t.Fatalf("verify: OK %v, %d rows let go (want %d): %+v", rep.OK(), br.LetGo, 256-220, br)
	}
	_, b = openBuffer(t, dir, "b")
	for seq := int64(220); seq < 256; seq++ {
		if b.Live(seq) {
			t.Fatalf("row %d of the block let go is served", seq)
		}
	}
	if !b.Live(300) {
		t.Fatal("row 300, above the block let go, is not served")
	}
}

// TestBlocksCheckpointOverwrittenAfterCheck: a writer that moves on right
// after a hot checkpoint checked a block's stamps (rows still kept) and
// writes the block's next pass replaces its records; the checkpoint
// checks the rows against the records it read before the stamps, and
// succeeds. It read them after, found only the next pass's, and failed
// with a false ErrCorrupt.
func TestBlocksCheckpointOverwrittenAfterCheck(t *testing.T) {
	_, s, b := blocksRing(t, DurabilityFlush)
	defer s.Close()
	// W = 700: the window [400, 700), its bottom block seqs 384-447 (slots
	// 0-63 of 384); 132 more rows evict it and write slots 0-67 again.
	moved := false
	s.hooks.checkpointChecked = func(base int64) {
		if base == 384 && !moved {
			moved = true
			blocksWorkload(t, b, "collector", 132, 700)
		}
	}
	dest := filepath.Join(t.TempDir(), "cp")
	res, err := b.Checkpoint(context.Background(), dest, nil)
	if !moved {
		t.Fatal("fixture: the hook did not run at the bottom block")
	}
	if err != nil {
		t.Fatalf("checkpoint with the bottom block overwritten after its check: %v", err)
	}
	if rep, err := Verify(dest, nil); err != nil || !rep.OK() {
		t.Fatalf("verify the checkpoint: %v %+v", err, rep)
	}
	t.Logf("%d rows kept, %d overwritten", res.Rows, res.Overwritten)
}

// TestBlocksCheckpointRefusedOnSnapshot: a read-only open next to a
// running server reads files another process writes, whose writes change
// no stamp it sees: its checkpoint is refused (ErrReadOnly) instead of
// copying rows the server overwrites, or failing with a false ErrCorrupt.
func TestBlocksCheckpointRefusedOnSnapshot(t *testing.T) {
	dir, s, _ := blocksRing(t, DurabilityFlush)
	defer s.Close()
	ro, err := Open(dir, &Options{ReadOnly: true, LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, ok := ro.SnapshotTime(); !ok {
		t.Fatal("fixture: the read-only open is not a snapshot open")
	}
	dest := filepath.Join(t.TempDir(), "cp")
	if _, err := mustBuffer(t, ro, "b").Checkpoint(context.Background(), dest, nil); !errors.Is(err, ErrReadOnly) || !strings.Contains(err.Error(), "ask the server") {
		t.Fatalf("checkpoint of a snapshot open: %v, want ErrReadOnly saying to ask the server", err)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused checkpoint left %s: %v", dest, err)
	}
}

// TestBlocksWatermarkPastReservation: a watermark record naming rows past
// the catalog's seq reservation (damage: no writer syncs seqs it has not
// reserved) is reported, and the open falls back to the catalog's count.
func TestBlocksWatermarkPastReservation(t *testing.T) {
	dir, s, b := blocksRing(t, DurabilityFsync)
	w := b.WriteCount()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	upEditStates(t, dir, func(_ string, st *bufferState) { st.SeqReserved = 640 })
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("watermark %d past the seq reservation 640", w)
	if br := rep.Buffers[0]; !slices.ContainsFunc(br.Problems, func(p string) bool { return strings.Contains(p, want) }) {
		t.Fatalf("verify: %+v; want %q", br, want)
	}
}

// TestBlocksKillKeepsBlock: a writer killed under the same kernel (its
// seq witness kept) leaves the block it was filling, and the reopen goes on
// filling it, wherever the kill came: between two extends (right after the
// 9th wrote its block records, before it returned: rows and records in the
// page cache only), or inside one (after its pieces, before any of its
// rows' bytes; after its rows' bytes, before its block records). The write
// count stays where the witness says the writer got to: no seq is skipped
// to the block's end, so none of the oldest rows leaves the window (a
// version 3 open used to leave the block, evicting up to 63 of them, and
// still does after a power loss); the rows of an extend cut off are holes,
// never served, whose bytes the reopen zeroes for the block's running
// checksum to go over. Every acknowledged row is there; rows written after it, across
// the block's end, verify; and a later kill followed by a power loss (no
// witness: the page cache lost past the last sync) still finds the cut-off
// rows holes, though records now cover their slots.
func TestBlocksKillKeepsBlock(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here (a boot id and a tmpfs at " + defaultWitnessDir + "): every unclean open leaves the block")
	}
	cases := []struct {
		name, point string
		inside      bool // the kill cut an extend off
		bufs        []string
	}{
		{"between extends", "after-meta", false, []string{crashFlushBlocks, crashNone}},
		{"inside an extend, its rows written", "after-data", true, []string{crashFlushBlocks, crashNone, crashFsyncBlocks}},
		{"inside an extend, only its pieces", "after-runs", true, []string{crashFlushBlocks, crashFsyncBlocks}},
	}
	for ci, tc := range cases {
		for i, buf := range tc.bufs {
			t.Run(tc.name+"/"+buf, func(t *testing.T) {
				dir := t.TempDir()
				m := newCrashModel(buf)
				run := crashRunChild(t, crashChildCfg{
					dir: dir, seed: uint64(40 + i), tokenBase: 1 << 32, bufs: []string{buf}, writers: 1,
					maxExt: 20, intervalMS: 3600_000, crashAt: tc.point, crashAfter: 9,
				})
				m.absorb(t, 0, run)
				acks, inflight := run.acksOf(buf), run.inFlight(buf)
				if len(acks) != 8 || len(inflight) != 1 {
					t.Fatalf("%d extends acknowledged, %d in flight; want 8 and 1", len(acks), len(inflight))
				}
				end := run.maxWriteCount(buf, 0)
				cut := end // the first seq of the extend cut off, if any
				if tc.inside {
					cut = end - int64(inflight[0].rows)
				}
				if end%blockRows == 0 || cut%blockRows == 0 {
					t.Fatalf("the child's rows end at %d (the cut-off extend's at %d), a block boundary: pick another seed", end, cut)
				}
				st := m.check(t, dir, 0, run, crashCheckOpts{})[buf]
				if st == nil {
					t.Fatal("buffer missing after the crash")
				}
				if st.info.WriteCount != end {
					t.Fatalf("write count %d after the reopen, the writer handed out seqs up to %d: the block being filled was left", st.info.WriteCount, end)
				}
				for seq := cut; seq < end; seq++ {
					if _, ok := st.live[seq]; ok {
						t.Errorf("row %d of the extend the kill cut off is live", seq)
					}
				}
				if tc.inside {
					// The reopen zeroed the bytes of the cut-off rows in
					// the block it goes on filling (an extend killed
					// after its rows' bytes had written them) for the
					// running checksum to go over; a block below it the
					// extend wrote into is left, its final record naming
					// the rows before them.
					col, err := os.ReadFile(filepath.Join(bufferDir(dir, buf), colFileName("observation")))
					if err != nil {
						t.Fatal(err)
					}
					slots := spareSlots(crashSpecFor(buf).Capacity)
					for seq := max(cut, end-end%blockRows); seq < end; seq++ {
						if off := headerSize + seq%slots*16; !powerLossZero(col[off : off+16]) {
							t.Errorf("row %d of the extend the kill cut off: its observation bytes %x are not zeroed", seq, col[off:off+16])
						}
					}
				}
				m.writeAfter(t, dir, 1)
				s, b := openBuffer(t, dir, buf)
				tokens := make([]int64, blockRows+5)
				for j := range tokens {
					tokens[j] = 9<<40 + int64(j)
					m.begun[tokens[j]] = true
				}
				mustExtend(t, b, "after", crashBatch(b.Spec(), tokens, false))
				want := servedRows(t, b)
				for seq := range st.tok {
					if _, ok := want[seq]; !ok && seq >= b.WriteCount()-b.Capacity() {
						t.Errorf("row %d, live after the reopen and in the window, is gone", seq)
					}
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				rep, err := Verify(dir, nil)
				if err != nil || !rep.OK() || rep.Buffers[0].Holes != end-cut {
					t.Fatalf("verify after writing on: %v %+v; want %d holes (the cut-off extend's rows)", err, rep, end-cut)
				}
				s, b = openBuffer(t, dir, buf)
				checkServed(t, b, want)
				if got := b.liveRows(); got != int64(len(want)) {
					t.Fatalf("%d live rows after a clean reopen, %d before the close", got, len(want))
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if !tc.inside {
					return
				}
				// A power loss after more writes: the cut-off rows'
				// slots are under block records now; the catalog's
				// holes keep them out.
				run2 := crashRunChild(t, crashChildCfg{
					dir: dir, seed: uint64(60 + ci), tokenBase: 2 << 32, bufs: []string{buf}, writers: 1,
					maxExt: 20, intervalMS: 3600_000, crashAt: "after-meta", crashAfter: 3,
				})
				m.absorb(t, 1, run2)
				durable, _ := powerLossScrambleV3(t, dir, buf, "random", rand.New(rand.NewPCG(uint64(ci), 5)))
				st = m.check(t, dir, 1, run2, crashCheckOpts{powerLoss: true, durable: map[string]int64{buf: durable}})[buf]
				for seq := cut; seq < end; seq++ {
					if _, ok := st.live[seq]; ok {
						t.Errorf("row %d of the extend the first kill cut off is live after a power loss", seq)
					}
				}
			})
		}
	}
}

// TestHolesCover: the check that lets an open go on filling a block past
// rows an extend cut off (resumeBlocks) says yes only when one merged
// hole holds every seq of the range.
func TestHolesCover(t *testing.T) {
	holes := [][2]int64{{10, 20}, {30, 31}, {40, 64}}
	cases := []struct {
		from, to int64
		want     bool
	}{
		{5, 5, true}, // nothing to cover
		{10, 20, true},
		{12, 15, true},
		{9, 12, false},
		{15, 21, false},
		{20, 21, false},
		{30, 31, true},
		{30, 32, false},
		{19, 31, false}, // spans a gap
		{40, 64, true},
		{63, 64, true},
		{64, 65, false},
		{0, 1, false},
	}
	for _, tc := range cases {
		if got := holesCover(holes, tc.from, tc.to); got != tc.want {
			t.Errorf("holesCover(%v, %d, %d) = %v, want %v", holes, tc.from, tc.to, got, tc.want)
		}
	}
	if holesCover(nil, 3, 4) {
		t.Error("no holes cover [3, 4)")
	}
}

// killInsideAnExtend runs a child writer of buf in a new dir that is
// killed inside its 9th extend (at point: after its rows' bytes, or after
// its pieces only), and returns the dir, the cut-off extend's first seq and
// the end of what the writer handed out; both inside one block, not on its
// boundary, and past the block's first row.
func killInsideAnExtend(t *testing.T, buf, point string) (dir string, m *crashModel, cut, end int64) {
	t.Helper()
	for seed := uint64(40); seed < 80; seed++ {
		dir = t.TempDir()
		m = newCrashModel(buf)
		run := crashRunChild(t, crashChildCfg{
			dir: dir, seed: seed, tokenBase: 1 << 32, bufs: []string{buf}, writers: 1,
			maxExt: 20, intervalMS: 3600_000, crashAt: point, crashAfter: 9,
		})
		m.absorb(t, 0, run)
		inflight := run.inFlight(buf)
		if len(inflight) != 1 {
			t.Fatalf("%d extends in flight, want 1", len(inflight))
		}
		end = run.maxWriteCount(buf, 0)
		cut = end - int64(inflight[0].rows)
		if cut%blockRows != 0 && end%blockRows != 0 && cut/blockRows == end/blockRows {
			return dir, m, cut, end
		}
	}
	t.Fatal("no seed left an extend cut off inside one block")
	return
}

// TestBlocksSnapshotOpenAfterKillInsideAnExtend: the reopen that goes on
// filling the block past an extend a kill cut off (TestBlocksKillKeepsBlock)
// makes its rows holes in the catalog and in the run log. A snapshot open
// next to the writer whose catalog copy predates that reopen (a publish that
// failed, or one read while the writer restarted) must still take them for
// holes once the writer's block records cover their slots: they come from
// the run log's hole record.
func TestBlocksSnapshotOpenAfterKillInsideAnExtend(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here: every unclean open leaves the block")
	}
	for _, point := range []string{"after-data", "after-runs"} {
		t.Run(point, func(t *testing.T) {
			buf := crashFlushBlocks
			dir, m, cut, end := killInsideAnExtend(t, buf, point)
			stale, err := os.ReadFile(filepath.Join(dir, snapshotFile))
			if err != nil {
				t.Fatal(err)
			}
			// No checkpoint publishes a snapshot while the reader opens.
			s, err := Open(dir, &Options{CheckpointInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b, err := s.Buffer(buf)
			if err != nil {
				t.Fatal(err)
			}
			if b.WriteCount() != end {
				t.Fatalf("write count %d after the reopen, want %d: the block was left", b.WriteCount(), end)
			}
			tokens := []int64{9 << 40, 9<<40 + 1, 9<<40 + 2}
			for _, tok := range tokens {
				m.begun[tok] = true
			}
			mustExtend(t, b, "after", crashBatch(b.Spec(), tokens, false))
			if err := os.WriteFile(filepath.Join(dir, snapshotFile), stale, 0o644); err != nil {
				t.Fatal(err)
			}
			rs, err := Open(dir, &Options{ReadOnly: true, LockTimeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			var staleSnap snapshot
			if err := json.Unmarshal(stale, &staleSnap); err != nil {
				t.Fatal(err)
			}
			if at, ok := rs.SnapshotTime(); !ok || !at.Equal(staleSnap.WrittenAt) {
				t.Fatalf("snapshot open at %v (%v); want one of the catalog copy from before the reopen, %v", at, ok, staleSnap.WrittenAt)
			}
			rb, err := rs.Buffer(buf)
			if err != nil {
				t.Fatal(err)
			}
			for seq := cut; seq < end; seq++ {
				if rb.Live(seq) {
					t.Errorf("row %d of the extend the kill cut off is live in a snapshot open", seq)
				}
			}
			if info, err := rb.Info(); err != nil || info.Damaged != 0 {
				t.Errorf("snapshot open: %+v, %v; want no damage", info, err)
			}
			for seq := end; seq < end+int64(len(tokens)); seq++ {
				if !rb.Live(seq) {
					t.Errorf("row %d, written after the reopen, is not live in the snapshot open", seq)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBlocksDamageInTheBlockBeingFilled: when a synced row of the block
// being filled no longer verifies (damage below the durable watermark)
// and a kill cut an extend off in that block, the reopen must not go on
// filling it: its running checksum would seal the damaged bytes, and a
// later open would serve them. The block is left, and the damage is
// reported by every open after it.
func TestBlocksDamageInTheBlockBeingFilled(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here: every unclean open leaves the block")
	}
	buf := crashFsyncBlocks // every acknowledged extend synced: the block's first rows are below the watermark
	dir, _, cut, end := killInsideAnExtend(t, buf, "after-data")
	base := cut - cut%blockRows
	victim := base // synced: below the cut-off extend
	slots := spareSlots(crashSpecFor(buf).Capacity)
	powerLossFlip(t, filepath.Join(bufferDir(dir, buf), colFileName("observation")), headerSize+victim%slots*16+3)
	s, b := openBuffer(t, dir, buf)
	if b.WriteCount() == end {
		t.Errorf("write count %d: the reopen went on filling a block with a damaged row", end)
	}
	info, err := b.Info()
	if err != nil || info.Damaged == 0 || b.Live(victim) {
		t.Fatalf("the reopen: %+v, %v, row %d live %v; want the damaged row reported and not served", info, err, victim, b.Live(victim))
	}
	tokens := make([]int64, blockRows+5)
	for j := range tokens {
		tokens[j] = 9<<40 + int64(j)
	}
	mustExtend(t, b, "after", crashBatch(b.Spec(), tokens, false))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, b = openBuffer(t, dir, buf)
	if info, err := b.Info(); err != nil || info.Damaged == 0 || b.Live(victim) {
		t.Fatalf("a clean reopen after more writes: %+v, %v, row %d live %v; want the damage still reported, the row not served", info, err, victim, b.Live(victim))
	}
}
