package storage

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The upgrade of a memmap buffer to rows.meta format version 3
// (docs/format.md, "Upgrade to version 3"). Every file changes size (the
// ring gets a spare block of slots) and version, so the new files are a
// whole buffer dir of their own, the stage, written beside the buffer's
// as buffers/.upgrade-v3.<name> (a name no buffer can have) and synced;
// the catalog then switches the buffer's spec and state in one
// transaction; then the buffer's dir goes to the trash and the stage takes
// its name. A kill at any point leaves the old version or the new, never
// a mix: an open that finds a stage finishes the renames if the catalog
// says version 3 (a read-only open reads the stage where it is) and
// removes it if not.

// upgradeStagePrefix starts the names of stages: buffer names start with
// a letter or digit.
const upgradeStagePrefix = ".upgrade-v3."

// upgradeStageDone is the last file written into a stage, after every
// other is synced: a switch takes only a stage that has it.
const upgradeStageDone = "upgrade-v3.done"

func upgradeStage(root, name string) string {
	return filepath.Join(root, "buffers", upgradeStagePrefix+name)
}

// removeStage deletes a stage, its done marker first (synced), so that a
// removal cut short never leaves a stage a switch would take for whole.
func removeStage(stage string) error {
	if err := os.Remove(filepath.Join(stage, upgradeStageDone)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := syncDir(stage); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(stage)
}

// stageDone reports whether stage holds the done marker: every file
// written and synced.
func stageDone(stage string) error {
	if _, err := os.Stat(filepath.Join(stage, upgradeStageDone)); err != nil {
		return fmt.Errorf("%s is not a whole set of version 3 files (no %s): %w", stage, upgradeStageDone, err)
	}
	return nil
}

// upgradeOldDir is where the buffer's old dir goes once the catalog has
// switched: the trash, under a name restoreFromTrash never takes back.
func upgradeOldDir(root, name string, uid uint64) string {
	return filepath.Join(root, trashDir, fmt.Sprintf("%s.%016x.before-v3", name, uid))
}

// upgradeChunk is how many seqs the stage is written at a time: a whole
// number of blocks, so that a block's checksum is taken once its rows are
// all written.
const upgradeChunk = 64 * blockRows

// stagedBlocks is what writeBlockStage wrote: the write count and the seqs
// of the window without a live row, which become holes of the buffer's
// state at the switch.
type stagedBlocks struct {
	writeCount int64
	holes      [][2]int64
	pieces     int64
	tails      int64
}

// writeBlockStage writes the files of buffer b (memmap, rows.meta version
// 1 or 2, opened read-only and verified) in version 3 into stage, from
// its live rows, and syncs them: the window's rows at seq mod S, every
// block of the window whole from its first slot (slots without a live
// row are zeros under the block's checksum), each block's final record in
// both copies, the block W ends in with one copy that is not final and
// the watermark record's tip, a run segment of version 3 pieces, and
// dense tail entries in seq order.
func (b *Buffer) writeBlockStage(stage string, say func(string, ...any)) (out stagedBlocks, retErr error) {
	if b.spec.Storage != KindMemmap || b.blk != nil {
		return out, fmt.Errorf("not a memmap buffer with rows.meta in format version 1 or 2")
	}
	spec := b.spec
	spec.RowMetaLayout = RowMetaBlocks
	t, err := newBuffer(b.store, b.name, spec, b.uid, ringSlotCount(spec, false))
	if err != nil {
		return out, err
	}
	t.dir = stage
	if err := t.createFiles(); err != nil { // removes whatever an earlier try left; unmaps on failure
		return out, err
	}
	defer func() {
		if err := t.unmap(); err != nil && retErr == nil {
			retErr = err
		}
		if retErr != nil {
			retErr = errors.Join(retErr, removeStage(stage))
		}
	}()

	wc := b.writeCount.Load()
	lo := max(0, wc-b.capacity)
	out.writeCount = wc
	addHole := func(seq int64) {
		if n := len(out.holes); n > 0 && out.holes[n-1][1] == seq {
			out.holes[n-1][1]++
			return
		}
		out.holes = append(out.holes, [2]int64{seq, seq + 1})
	}
	tcols := t.allColumns() // b.allColumns() order: fields, tails, priority
	scols := b.allColumns()
	if len(tcols) != len(scols) {
		return out, fmt.Errorf("%d columns in version 3, %d before", len(tcols), len(scols))
	}
	l := newRunLog(t)
	// The pieces go to one run segment as they are planned (a ring of
	// actors' rows has a piece a row: 64 bytes a row, too many to hold).
	segPath := filepath.Join(stage, runSegName(1))
	segFile, err := os.Create(segPath)
	if err != nil {
		return out, err
	}
	defer func() {
		if segFile != nil {
			retErr = errors.Join(retErr, segFile.Close())
		}
	}()
	seg := bufio.NewWriterSize(segFile, 1<<20)
	if _, err := seg.Write(segHeader{Magic: runSegMagic, Version: metaVersionBlocks, UID: b.uid, Number: 1}.encode()); err != nil {
		return out, fmt.Errorf("write %s: %w", segPath, err)
	}
	var recs []record
	tip := watermarkRecord{Seq: wc, TipBase: -1}
	var enc [blockCopySize]byte
	meta := t.meta.Bytes()
	chunks := 0
	for cs := lo - lo%blockRows; cs < wc; {
		// A chunk of whole blocks that does not wrap round the new ring.
		ce := min(cs+upgradeChunk, cs-cs%t.slots+t.slots)
		recs = recs[:0]
		for seq := cs; seq < min(ce, wc); seq++ {
			if seq < lo {
				continue // below the window: zeros under its block's checksum
			}
			if b.stamps.Load(seq%b.slots) != seq {
				addHole(seq)
				continue
			}
			var r record
			b.loadRecord(seq, &r)
			r.Seq = seq
			src, dst := seq%b.slots, seq%t.slots
			if r.Flags&flagHasTail != 0 && len(t.tails) > 0 {
				// One entry in every tail file, its blocks allocated
				// first (a full disk is an error, not a fault).
				if err := t.tailIx.allocate(1); err != nil {
					return out, err
				}
				t.tailIx.begin(seq)
				t.tailIx.add(seq)
				out.tails++
			}
			for i, c := range scols {
				tc := tcols[i]
				switch c.role {
				case roleTail:
					if r.Flags&flagHasTail == 0 {
						continue
					}
					from := src
					if b.tailIx != nil {
						from = b.tailIx.pos(seq)
					}
					p := c.pitch()
					obs := c.data[from*p : from*p+int64(c.rowBytes)]
					at := t.tailIx.pos(seq)
					entry := tc.data[at*tc.pitch() : (at+1)*tc.pitch()]
					copy(entry, obs)
					putTailTrailerV3(entry, tc.rowBytes, seq, r.TrajID, r.Step)
				default:
					copy(tc.row(dst), c.row(src))
				}
			}
			recs = append(recs, r)
		}
		if len(recs) > 0 {
			l.planStrided(recs, recs[0].Seq)
			for i := range l.pv3 {
				var rec [runLogRecordSize]byte
				l.pv3[i].encode(rec[:])
				if _, err := seg.Write(rec[:]); err != nil {
					return out, fmt.Errorf("write %s: %w", segPath, err)
				}
			}
			out.pieces += int64(len(l.pv3))
		}
		for base := cs; base < min(ce, wc); base += blockRows {
			h := int(min(wc-base, blockRows))
			sums := t.prefixSums(base, h)
			c := blockCopy{Base: base, Rows: h, Final: h == blockRows, CRC: sums.at[h]}
			for i := range 2 {
				if i == 1 && !c.Final {
					break // the block W ends in: one copy, and the watermark record's tip
				}
				c.Gen = uint32(i + 1)
				c.encode(enc[:])
				off := blockCopyOffset(t.slots, t.blockOf(base), i)
				copy(meta[off:off+blockCopySize], enc[:])
			}
			if !c.Final {
				tip = tipOf(wc, c.CRC)
			}
		}
		if chunks++; say != nil && chunks%64 == 0 {
			say("buffer %q: %d of %d seqs", b.name, min(ce, wc)-lo, wc-lo)
		}
		cs = ce
	}
	err = errors.Join(seg.Flush(), segFile.Sync(), segFile.Close())
	segFile = nil
	if err != nil {
		return out, fmt.Errorf("write %s: %w", segPath, err)
	}
	for _, c := range tcols {
		if err := c.region.Sync(); err != nil {
			return out, fmt.Errorf("sync %s: %w", filepath.Join(stage, c.file), err)
		}
	}
	if err := t.meta.Sync(); err != nil {
		return out, fmt.Errorf("sync %s: %w", metaFile(stage), err)
	}
	// The watermark record last: it claims the rows synced above.
	if err := t.writeWatermarkRecord(tip); err != nil {
		return out, err
	}
	if err := syncDir(stage); err != nil {
		return out, err
	}
	if err := writeSynced(filepath.Join(stage, upgradeStageDone), []byte("rbd upgrade to rows.meta version 3: every file written and synced\n")); err != nil {
		return out, err
	}
	return out, syncDir(stage)
}

// finishBlocksUpgrade puts a buffer's stage in place once the catalog says
// version 3: the old dir to the trash, the stage to the buffer's name,
// each rename synced with its dirs, then the old dir removed. Each step
// is one a later call repeats or skips, so a kill anywhere is finished by
// the next writable open.
func finishBlocksUpgrade(root, name string, uid uint64, crash *crasher) error {
	stage, dir, old := upgradeStage(root, name), bufferDir(root, name), upgradeOldDir(root, name, uid)
	if _, err := os.Stat(stage); err != nil {
		return nil
	}
	if err := stageDone(stage); err != nil {
		return fmt.Errorf("buffer %q: %w; its version 3 files are lost, and its version 1 or 2 files are in %s: move the stage away and set the catalog back, or restore the buffer from a checkpoint", name, err, dir)
	}
	// Never a stage of another buffer of that name (one deleted since):
	// its files would replace this buffer's.
	hdr := make([]byte, headerSize)
	if f, err := os.Open(metaFile(stage)); err != nil {
		return fmt.Errorf("read the version 3 files of buffer %q: %w", name, err)
	} else if _, err = f.ReadAt(hdr, 0); errors.Join(err, f.Close()) != nil {
		return fmt.Errorf("read the version 3 files of buffer %q: %w", name, err)
	}
	if h, err := decodeMetaHeader(metaFile(stage), hdr); err != nil || h.UID != uid || h.Version != metaVersionBlocks {
		return fmt.Errorf("%s is not the version 3 files of buffer %q (uid %016x): %v; move it away", stage, name, uid, err)
	}
	buffers := filepath.Dir(dir)
	if _, err := os.Stat(dir); err == nil {
		if err := os.MkdirAll(filepath.Dir(old), 0o755); err != nil {
			return err
		}
		if err := os.RemoveAll(old); err != nil {
			return err
		}
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("move the version 1 or 2 files of buffer %q to the trash: %w", name, err)
		}
		if err := errors.Join(syncDir(buffers), syncDir(filepath.Dir(old))); err != nil {
			return err
		}
		crash.at("upgrade-v3-old-gone")
	}
	if err := os.Rename(stage, dir); err != nil {
		return fmt.Errorf("put the version 3 files of buffer %q in place: %w", name, err)
	}
	if err := syncDir(buffers); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, upgradeStageDone)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(old)
}

// openBlocksUpgradeState handles, before a memmap buffer's files are
// opened, a stage an upgrade to version 3 left: the catalog says version
// 3 (the switch was committed): the renames are finished (writable) or the
// stage is read where it is; otherwise the stage is removed (writable) or
// ignored.
func (s *Store) openBlocksUpgradeState(b *Buffer) error {
	stage := upgradeStage(s.dir, b.name)
	if _, err := os.Stat(stage); err != nil {
		if b.blk != nil && !s.readOnly {
			// A kill after the stage took the buffer's name left its
			// marker there.
			if err := os.Remove(filepath.Join(b.dir, upgradeStageDone)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		return nil
	}
	switch {
	case b.blk != nil && s.readOnly:
		b.dir = stage
		return nil
	case b.blk != nil:
		b.log.Warn("finishing an upgrade to rows.meta version 3 that stopped after it switched the buffer", "dir", b.dir)
		return finishBlocksUpgrade(s.dir, b.name, b.uid, s.crash)
	case s.readOnly:
		return nil
	}
	b.log.Warn("removing the files of an upgrade to rows.meta version 3 that stopped before it switched the buffer", "dir", stage)
	return removeStage(stage)
}

// settleBlocksUpgrades finishes or removes, under the store's lock (a
// writable catalog open, not a store open: that would mark every buffer
// unclean until its close), the stages an earlier upgrade to version 3
// left, by what the catalog says of each buffer.
func settleBlocksUpgrades(dir string, lockTimeout time.Duration) error {
	path := filepath.Join(dir, "catalog.db")
	if !fileExists(path) {
		return nil // not a data dir: the open that follows says so, and nothing is created
	}
	cat, err := openCatalog(path, false, lockTimeout)
	if err != nil {
		return err
	}
	entries, err := cat.entries()
	known := map[string]bool{}
	for _, e := range entries {
		known[upgradeStage(dir, e.name)] = true
		if err != nil || e.spec.Storage != KindMemmap {
			continue
		}
		if _, serr := os.Stat(upgradeStage(dir, e.name)); serr != nil {
			continue
		}
		if e.spec.blockFiles() {
			err = finishBlocksUpgrade(dir, e.name, e.state.UID, nil)
		} else {
			err = removeStage(upgradeStage(dir, e.name))
		}
	}
	// Stages of buffers deleted since: nothing will take them.
	stages, _ := filepath.Glob(filepath.Join(dir, "buffers", upgradeStagePrefix+"*"))
	for _, st := range stages {
		if err == nil && !known[st] {
			err = removeStage(st)
		}
	}
	return errors.Join(err, cat.close())
}

// upgradeBlocks is Upgrade to rows.meta version 3.
func upgradeBlocks(dir string, o UpgradeOptions, say func(string, ...any)) (*UpgradeReport, error) {
	if err := checkComplete(dir); err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}
	if err := settleBlocksUpgrades(dir, o.Store.withDefaults().LockTimeout); err != nil {
		if errors.Is(err, ErrLocked) {
			err = fmt.Errorf("%w (a running store holds it: stop it first)", err)
		}
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}
	// Asked for version 3, every memmap buffer; by default, those a new
	// buffer of their spec would have in version 3.
	s, ro, targets, err := openUpgradeSource(dir, o, func(b *Buffer) bool {
		return b.spec.Storage == KindMemmap && b.blk == nil && (o.RowMeta == RowMetaBlocks || defaultMemmapRowMeta(b.spec) == RowMetaBlocks)
	}, "rows.meta in format version 1 or 2 (every one is version 3 already, or there is none)")
	if err != nil {
		return nil, err
	}
	names := make([]string, len(targets))
	for i, b := range targets {
		names[i] = b.name
	}
	// The catalog as this open read it: the switch takes a stage only if
	// its buffer's entry is still the same (no store wrote, deleted or
	// recreated it in between).
	read, err := s.cat.entries()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("upgrade %s: %w", dir, err), s.Close())
	}
	readState := map[string]bufferState{}
	for _, e := range read {
		readState[e.name] = e.state
	}
	say("verified %s; upgrading %s to rows.meta version 3", dir, strings.Join(names, ", "))

	// 1. The stages, synced.
	out := &UpgradeReport{Dir: dir}
	digests := map[string]metaDigest{}
	staged := map[string]stagedBlocks{}
	for _, b := range targets {
		ub := UpgradedBuffer{Name: b.name, FormatVersion: int(metaVersionBlocks), BytesBefore: dirBytes(b.dir),
			MetaBytesBefore: fileBytes(metaFile(b.dir)), TailBytesBefore: b.tailFileBytes()}
		if b.rlog != nil {
			ub.MetaBytesBefore += b.rlog.files()
		}
		d, err := b.metaDigest()
		var st stagedBlocks
		if err == nil {
			st, err = b.writeBlockStage(upgradeStage(dir, b.name), say)
		}
		if err != nil {
			// The stages written so far go too: nothing changed.
			for name := range staged {
				err = errors.Join(err, removeStage(upgradeStage(dir, name)))
			}
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (the buffers are unchanged)", dir, b.name, err), s.Close())
		}
		ub.Rows, ub.RunRecords, ub.Tails = d.rows, st.pieces, st.tails
		out.Buffers = append(out.Buffers, ub)
		digests[b.name], staged[b.name] = d, st
		say("buffer %q: %d rows, %d run records, %d final observations written in version 3", b.name, ub.Rows, ub.RunRecords, ub.Tails)
	}
	// The stages' own entries in buffers/, before any switch names them.
	if err := syncDir(filepath.Join(dir, "buffers")); err != nil {
		return nil, errors.Join(fmt.Errorf("upgrade %s: %w", dir, err), s.Close())
	}
	crash := s.crash
	crash.at("upgrade-v3-files")

	// 2. Per buffer, the switch (spec and state in one transaction), then
	// the renames.
	cat, entries, err := switchCatalog(dir, s, o)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		st, ok := staged[e.name]
		if !ok {
			continue
		}
		fail := func(err error) (*UpgradeReport, error) {
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w", dir, e.name, err), cat.close())
		}
		// Under the lock, the stage must still be whole and the buffer
		// as it was read: a store opened between the close above and the
		// lock would have removed the stage (marker first), or written,
		// deleted or recreated the buffer.
		if err := stageDone(upgradeStage(dir, e.name)); err != nil {
			return fail(fmt.Errorf("%w (was the dir opened meanwhile? the buffer is unchanged; run the upgrade again)", err))
		}
		state := e.state
		if !sameState(state, readState[e.name]) {
			return fail(fmt.Errorf("its catalog entry changed since it was read (was the dir opened meanwhile?): the buffer is unchanged; run the upgrade again"))
		}
		if state.Clean && state.WriteCount != st.writeCount {
			return fail(fmt.Errorf("the catalog's write count is %d, the files' %d (the buffer is unchanged)", state.WriteCount, st.writeCount))
		}
		// Clean: the stage is what a clean close leaves, every row synced
		// up to the watermark record. A buffer that was not closed
		// cleanly was recovered by the open that read it (its seqs
		// skipped, its let-go rows gone), and an open consumes the saved
		// streams, so there are none to continue; a next open that
		// treated the stage as a crash's would skip seqs again and evict
		// as many of the oldest rows.
		// The holes are the window's seqs without a live row, as the open
		// that read it found them: a hole range of the catalog over rows
		// that recovery accepted anyway is not one to version 3.
		state.Clean = true
		state.WriteCount = st.writeCount
		state.SeqReserved = (max(state.SeqReserved, st.writeCount) + blockRows - 1) / blockRows * blockRows
		state.Holes = st.holes
		spec := e.spec
		spec.RowMetaLayout = RowMetaBlocks
		// Streams saved by a clean close continue; a buffer that was not
		// closed cleanly has none to continue (an open consumed them).
		if err := cat.switchBuffer(e.name, spec, state, !e.state.Clean); err != nil {
			return fail(fmt.Errorf("switch the spec and state: %w (the buffer is unchanged)", err))
		}
		crash.at("upgrade-v3-commit")
		if err := finishBlocksUpgrade(dir, e.name, e.state.UID, crash); err != nil {
			return fail(fmt.Errorf("%w (the catalog says version 3: the next open finishes the upgrade)", err))
		}
		crash.at("upgrade-v3-rename")
	}
	if err := cat.close(); err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}

	// 3. Read it back: the same rows with the same fields and metadata.
	if err := readBackUpgrade(dir, ro, out, digests, say); err != nil {
		return nil, err
	}
	return out, nil
}

// dirBytes is the disk space the files directly in dir take.
func dirBytes(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		n += fileBytes(filepath.Join(dir, e.Name()))
	}
	return n
}
