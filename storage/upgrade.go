package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// ErrNothingToUpgrade is returned by Upgrade for a data dir with no memmap
// buffer to convert: none in rows.meta format version 1 or 2 (to version
// 3), or none in version 1 or with version 1 tail files (to version 2).
var ErrNothingToUpgrade = errors.New("storage: nothing to upgrade")

// UpgradeOptions configures Upgrade. Nil gives the defaults.
type UpgradeOptions struct {
	// Store is passed to the opens Upgrade makes (nil: defaults).
	Store *Options
	// RowMeta is the layout memmap buffers are upgraded to: RowMetaBlocks
	// (rows.meta format version 3, every memmap buffer) or RowMetaRuns
	// (version 2 and dense tail files, which builds from 2026-11-27 on
	// open; builds before 2026-11-29 cannot open version 3). The zero
	// value takes each buffer to what a new buffer of its spec gets
	// (defaultMemmapRowMeta): version 3, but version 2 for fsync buffers
	// and rings under 1,024 rows.
	RowMeta RowMetaLayout
	// Progress, when set, is told what Upgrade is doing.
	Progress func(msg string)
}

// UpgradedBuffer says what Upgrade did to one buffer.
type UpgradedBuffer struct {
	Name string `json:"name"`
	// Rows is the live rows, the same before and after.
	Rows int64 `json:"rows"`
	// RunRecords is the run records written for them.
	RunRecords int64 `json:"run_records"`
	// MetaBytesBefore and MetaBytesAfter are what rows.meta (and, after,
	// the run log) take on disk.
	MetaBytesBefore int64 `json:"meta_bytes_before"`
	MetaBytesAfter  int64 `json:"meta_bytes_after"`
	// Tails is the final observations moved into dense tail files (0 when
	// the tail files were not converted); TailBytesBefore and
	// TailBytesAfter are what the tail files take on disk.
	Tails           int64 `json:"tails"`
	TailBytesBefore int64 `json:"tail_bytes_before"`
	TailBytesAfter  int64 `json:"tail_bytes_after"`
	// FormatVersion is the buffer's rows.meta format version after the
	// upgrade (2 or 3); BytesBefore and BytesAfter are what all its files
	// take on disk.
	FormatVersion int   `json:"format_version"`
	BytesBefore   int64 `json:"bytes_before"`
	BytesAfter    int64 `json:"bytes_after"`
}

// UpgradeReport is the result of Upgrade.
type UpgradeReport struct {
	Dir     string           `json:"dir"`
	Buffers []UpgradedBuffer `json:"buffers"`
}

// Upgrade converts the memmap buffers of a data dir to the layout
// opts.RowMeta names, keeping every row, link, stream and counter:
//
//   - RowMetaBlocks (for the zero value, the buffers defaultMemmapRowMeta
//     gives version 3, then RowMetaRuns for the others): every memmap buffer whose rows.meta is
//     format version 1 or 2 to version 3 ("row_meta": "blocks",
//     docs/format.md), with version 3 dense tail files. The new files are
//     written as a whole buffer dir beside the buffer's, the stage, and
//     synced; the catalog switches the buffer's spec and state in one
//     transaction; then the old dir goes to the trash and the stage takes
//     its place (upgradeblocks.go).
//   - RowMetaRuns: every memmap buffer whose rows.meta is version 1 to
//     version 2 ("row_meta": "runs"), and whose tail files keep final
//     observations at the slot (version 1) to dense tail files (version
//     2): the version 2 files are written beside the version 1 ones and
//     synced; then rows.meta's switch is committed by the catalog's spec
//     and done by a rename, and the tail files' by a marker file and done
//     by renames.
//
// It refuses, changing nothing, a dir a running store holds (ErrLocked),
// one of a newer format (ErrVersionMismatch), one that Verify finds
// damaged, an incomplete checkpoint, and one with nothing to upgrade
// (ErrNothingToUpgrade). A kill at any point leaves each buffer in its
// old version or its new one, never a mix: an open removes the files of
// an upgrade that stopped before a commit and finishes the renames of one
// that stopped after it. Upgrade opens the dir again at the end and checks
// that every live row reads back with the fields, metadata, final
// observation and priority it had (a digest of them, in seq order).
func Upgrade(dir string, opts *UpgradeOptions) (*UpgradeReport, error) {
	var o UpgradeOptions
	if opts != nil {
		o = *opts
	}
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf(format, args...))
		}
	}
	switch o.RowMeta {
	case RowMetaBlocks:
		return upgradeBlocks(dir, o, say)
	case "":
		// Each buffer to what a new buffer of its spec gets: version 3,
		// but version 2 for fsync buffers and rings under 1,024 rows
		// (defaultMemmapRowMeta). Two steps, each safe to kill.
		v3, err3 := upgradeBlocks(dir, o, say)
		if err3 != nil && !errors.Is(err3, ErrNothingToUpgrade) {
			return nil, err3
		}
		v2, err2 := upgradeRuns(dir, o, say)
		if err2 != nil && !errors.Is(err2, ErrNothingToUpgrade) {
			return nil, err2
		}
		if err3 != nil && err2 != nil {
			return nil, fmt.Errorf("upgrade %s: no memmap buffer to convert: none in rows.meta format version 1 or 2 that a new buffer would get in version 3, none in version 1 or with final observations at the slot (fsync buffers and rings under 1,024 rows stay in version 2; --row-meta blocks converts them to version 3): %w", dir, ErrNothingToUpgrade)
		}
		out := &UpgradeReport{Dir: dir}
		for _, r := range []*UpgradeReport{v3, v2} {
			if r != nil {
				out.Buffers = append(out.Buffers, r.Buffers...)
			}
		}
		slices.SortFunc(out.Buffers, func(a, b UpgradedBuffer) int { return strings.Compare(a.Name, b.Name) })
		return out, nil
	case RowMetaRuns:
		return upgradeRuns(dir, o, say)
	}
	return nil, fmt.Errorf("upgrade %s: row_meta %q: want %q (version 3) or %q (version 2)", dir, o.RowMeta, RowMetaBlocks, RowMetaRuns)
}

// upgradeRuns is Upgrade to rows.meta version 2 and dense tail files.
func upgradeRuns(dir string, o UpgradeOptions, say func(string, ...any)) (*UpgradeReport, error) {
	metaTo, tailsTo := map[string]bool{}, map[string]bool{}
	s, ro, targets, err := openUpgradeSource(dir, o, func(b *Buffer) bool {
		if b.spec.Storage != KindMemmap {
			return false
		}
		metaTo[b.name] = b.rlog == nil
		tailsTo[b.name] = len(b.tails) > 0 && !b.tails[0].dense
		return metaTo[b.name] || tailsTo[b.name]
	}, "rows.meta in format version 1 or final observations at the slot (every one is version 2 or 3 already, or there is none)")
	if err != nil {
		return nil, err
	}
	names := make([]string, len(targets))
	for i, b := range targets {
		names[i] = b.name
	}
	say("verified %s; upgrading %s", dir, strings.Join(names, ", "))

	// 1. The version 2 files, beside the version 1 ones, synced.
	out := &UpgradeReport{Dir: dir}
	digests := map[string]metaDigest{}
	for _, b := range targets {
		ub := UpgradedBuffer{Name: b.name, FormatVersion: int(metaVersionRuns), MetaBytesBefore: fileBytes(metaFile(b.dir)), BytesBefore: dirBytes(b.dir)}
		d, err := b.metaDigest()
		if err == nil && metaTo[b.name] {
			err = b.writeRunFiles(&ub, say)
		}
		if err == nil && tailsTo[b.name] {
			err = b.writeDenseTailFiles(&ub, say)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (the buffer is unchanged)", dir, b.name, err), s.Close())
		}
		ub.Rows = d.rows
		out.Buffers = append(out.Buffers, ub)
		digests[b.name] = d
		say("buffer %q: %d rows, %d run records, %d final observations written", b.name, ub.Rows, ub.RunRecords, ub.Tails)
	}
	crash := s.crash
	crash.at("upgrade-files")

	// 2. Per buffer, the switch: the spec in the catalog, then rows.meta.
	cat, entries, err := switchCatalog(dir, s, o)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !slices.Contains(names, e.name) {
			continue
		}
		bdir := bufferDir(dir, e.name)
		if metaTo[e.name] {
			spec := e.spec
			spec.RowMetaLayout = RowMetaRuns
			if err := cat.putSpec(e.name, spec); err != nil {
				return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: switch the spec: %w (the buffer is unchanged)", dir, e.name, err), cat.close())
			}
			crash.at("upgrade-commit")
			if err := finishRunsUpgrade(bdir); err != nil {
				// The catalog says version 2: the next open finishes it.
				return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (the next open finishes the upgrade)", dir, e.name, err), cat.close())
			}
			crash.at("upgrade-rename")
		}
		if tailsTo[e.name] {
			if err := commitTailsUpgrade(bdir); err != nil {
				return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (its tail files are unchanged)", dir, e.name, err), cat.close())
			}
			crash.at("upgrade-tails-commit")
			if err := finishTailsUpgrade(bdir); err != nil {
				return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (the next open finishes the upgrade)", dir, e.name, err), cat.close())
			}
			crash.at("upgrade-tails-rename")
		}
	}
	if err := cat.close(); err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}

	// 3. Read it back: the same rows with the same metadata.
	if err := readBackUpgrade(dir, ro, out, digests, say); err != nil {
		return nil, err
	}
	return out, nil
}

// switchCatalog closes the read-only store s of an upgrade's first step
// and opens the catalog for the switch (the store's lock), with its
// entries.
func switchCatalog(dir string, s *Store, o UpgradeOptions) (*catalog, []catalogEntry, error) {
	if err := s.Close(); err != nil {
		return nil, nil, fmt.Errorf("upgrade %s: close: %w", dir, err)
	}
	cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, o.Store.withDefaults().LockTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("upgrade %s: %w (the buffers are unchanged)", dir, err)
	}
	// The snapshot the last store published describes the buffers as
	// they were: a read-only open that finds the catalog locked (by this
	// switch, or a store opening next) must not read the old layouts
	// from it. The next store publishes a new one.
	if err := os.Remove(filepath.Join(dir, snapshotFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, errors.Join(fmt.Errorf("upgrade %s: %w (the buffers are unchanged)", dir, err), cat.close())
	}
	entries, err := cat.entries()
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("upgrade %s: %w", dir, err), cat.close())
	}
	return cat, entries, nil
}

// openUpgradeSource opens dir read-only for an upgrade and returns the
// buffers pick takes, refusing (the store closed) a dir a running store
// holds and one whose open finds damage (what Verify checks, from this
// open's recovery), and one where pick takes none (ErrNothingToUpgrade,
// saying that no memmap buffer keeps what none says).
//
// Upgrades open read-only throughout but for the switch: a kill must not
// count as a crash of the buffers (a flush buffer reopened after a crash
// resumes at its seq reservation, and its oldest rows leave the window
// early).
func openUpgradeSource(dir string, o UpgradeOptions, pick func(*Buffer) bool, none string) (*Store, Options, []*Buffer, error) {
	ro := Options{ReadOnly: true}
	if o.Store != nil {
		ro = *o.Store
		ro.ReadOnly = true
	}
	s, err := Open(dir, &ro)
	if err != nil {
		return nil, ro, nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}
	if !s.snapAt.IsZero() {
		return nil, ro, nil, errors.Join(fmt.Errorf("upgrade %s: %w (a running store holds it: stop it first)", dir, ErrLocked), s.Close())
	}
	var targets []*Buffer
	for _, b := range s.Buffers() {
		if probs := append(slices.Clip(b.Damage()), b.checkIndex()...); len(probs) > 0 {
			return nil, ro, nil, errors.Join(fmt.Errorf("upgrade %s: verify found problems, nothing changed (rbd verify %s lists them): buffer %q: %s", dir, dir, b.name, probs[0]), s.Close())
		}
		if pick(b) {
			targets = append(targets, b)
		}
	}
	if len(targets) == 0 {
		return nil, ro, nil, errors.Join(fmt.Errorf("upgrade %s: no memmap buffer keeps %s: %w", dir, none, ErrNothingToUpgrade), s.Close())
	}
	return s, ro, targets, nil
}

// readBackUpgrade opens the upgraded dir read-only and checks that each
// buffer of out reads as it did (its digest in digests) and has no
// damage, noting its files' sizes in out.
func readBackUpgrade(dir string, ro Options, out *UpgradeReport, digests map[string]metaDigest, say func(string, ...any)) error {
	say("reading the upgraded buffers back")
	s, err := Open(dir, &ro)
	if err != nil {
		return fmt.Errorf("upgrade %s: reopen after the upgrade: %w", dir, err)
	}
	for i := range out.Buffers {
		ub := &out.Buffers[i]
		b, err := s.Buffer(ub.Name)
		if err == nil && len(b.Damage()) > 0 {
			err = fmt.Errorf("verify finds damage: %s", b.Damage()[0])
		}
		if err == nil {
			var d metaDigest
			if d, err = b.metaDigest(); err == nil && d != digests[ub.Name] {
				err = fmt.Errorf("its live rows read as %d rows with digest %016x, %d rows and %016x before", d.rows, d.sum, digests[ub.Name].rows, digests[ub.Name].sum)
			}
		}
		if err != nil {
			return errors.Join(fmt.Errorf("upgrade %s: buffer %q after the upgrade: %w", dir, ub.Name, err), s.Close())
		}
		ub.MetaBytesAfter = fileBytes(metaFile(b.dir)) + b.rlog.files()
		ub.TailBytesAfter = b.tailFileBytes()
		ub.BytesAfter = dirBytes(b.dir)
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("upgrade %s: close: %w", dir, err)
	}
	say("upgraded %d buffers", len(out.Buffers))
	return nil
}

// upgradeMetaFile is where Upgrade writes a buffer's version 2 rows.meta
// before the switch.
func upgradeMetaFile(dir string) string { return metaFile(dir) + ".v2" }

// upgradeBlock is how many slots an upgrade converts at a time: it holds a
// block's records, not the ring's.
const upgradeBlock = 1 << 16

// writeRunFiles writes the version 2 files of a version 1 memmap buffer,
// opened read-only, beside its files, from its live rows, and syncs them:
// rows.meta.v2 (with the same durable watermark: rows the version 1 files
// did not have on stable storage are not claimed) and runs.00000001.rbdr.
// It notes what it wrote in ub.
func (b *Buffer) writeRunFiles(ub *UpgradedBuffer, say func(string, ...any)) error {
	if b.rlog != nil || b.cs != nil || !b.persistent {
		return fmt.Errorf("not a memmap buffer with rows.meta in format version 1")
	}
	if err := removeUpgradeLeftovers(b.dir); err != nil {
		return err
	}
	fail := func(err error) error {
		return errors.Join(err, removeUpgradeLeftovers(b.dir))
	}
	hdr := metaHeader{Version: metaVersionRuns, RecordSize: fileRunRecordSize, UID: b.uid, Capacity: uint64(b.capacity), Name: b.name}.encode()
	putWatermark(hdr, b.sync.durable)
	mf, err := createAllocated(upgradeMetaFile(b.dir), headerSize+b.capacity*fileRunRecordSize, hdr)
	if err != nil {
		return fail(fmt.Errorf("create %s: %w", upgradeMetaFile(b.dir), err))
	}
	// Oldest row first, a block of slots at a time (never across the
	// ring's end), pieces continued from block to block. Files of format
	// versions 1 and 2 have one slot a row (slots = capacity), so file
	// slots and the buffer's are the same.
	var l runLog
	l.reset()
	var recs []record
	data := make([]byte, min(b.capacity, upgradeBlock)*fileRunRecordSize)
	var scratch [runCRCBytes]byte
	recScratch := new([recordSize]byte) // decodeRecord's
	wc := b.writeCount.Load()
	first := max(0, wc-b.capacity)
	blocks := 0
	for lo := first; lo < wc; {
		s0 := lo % b.capacity
		hi := min(wc, lo+upgradeBlock, lo+b.capacity-s0)
		recs = recs[:0]
		for seq := lo; seq < hi; seq++ {
			if b.stamps.Load(seq%b.slots) != seq {
				continue // a hole
			}
			r, ok := decodeRecord(b.rec(seq%b.slots), recScratch)
			if !ok || r.Seq != seq {
				return fail(errors.Join(fmt.Errorf("seq %d: its record no longer checks", seq), mf.Close()))
			}
			recs = append(recs, r)
		}
		rows := l.planMore(recs)
		block := data[:(hi-lo)*fileRunRecordSize]
		clear(block)
		for i := range recs {
			at := (recs[i].Seq - lo) * fileRunRecordSize
			// The version 1 data CRC covers the same bytes in the same
			// order; the version 2 checksum continues it over the record.
			putFileRunRecord(block[at:at+fileRunRecordSize], recs[i].Seq, rows[i], fileRunCRC(recs[i].DataCRC, recs[i].Seq, rows[i], &scratch))
		}
		if _, err := mf.WriteAt(block, headerSize+s0*fileRunRecordSize); err != nil {
			return fail(errors.Join(fmt.Errorf("write %s: %w", upgradeMetaFile(b.dir), err), mf.Close()))
		}
		lo = hi
		if blocks++; blocks%32 == 0 {
			say("buffer %q: %d of %d slots", b.name, lo-first, wc-first)
		}
	}
	if err := errors.Join(mf.Sync(), mf.Close()); err != nil {
		return fail(fmt.Errorf("write %s: %w", upgradeMetaFile(b.dir), err))
	}
	ub.RunRecords = int64(len(l.pieces))

	n := int64(len(l.pieces)) * runLogRecordSize
	path := filepath.Join(b.dir, runSegName(1))
	// Exactly its records: appends go to new segments after any open.
	seg, err := mmapfile.Create(path, segHeaderSize+n)
	if err == nil {
		buf := seg.Bytes()
		copy(buf, segHeader{Magic: runSegMagic, Version: metaVersionRuns, UID: b.uid, Number: 1}.encode())
		for i := range l.pieces {
			l.pieces[i].encode(buf[segHeaderSize+i*runLogRecordSize:])
		}
		err = errors.Join(seg.Sync(), seg.Close())
	}
	if err == nil {
		err = syncDir(b.dir)
	}
	if err != nil {
		return fail(fmt.Errorf("write %s: %w", path, err))
	}
	return nil
}

// metaDigest sums up the metadata of a buffer's live rows: Upgrade
// compares it before and after.
type metaDigest struct {
	rows int64
	sum  uint64
}

// metaDigest reads every live row's metadata (what samples return of it:
// traj_id, step, links, env, flags, version), fields, final observations
// and priority into a digest, in seq order.
func (b *Buffer) metaDigest() (metaDigest, error) {
	var d metaDigest
	h := fnv.New64a()
	var cols []Column
	rowBytes := 0
	for _, c := range slices.Concat(b.cols, b.tails) {
		col, ok := b.Column(c.name)
		if !ok {
			return d, fmt.Errorf("no column %q", c.name)
		}
		cols = append(cols, col)
		rowBytes += c.rowBytes
	}
	// A few MiB of rows at a time (Atari rows are 28 KiB).
	chunk := int64(max(1, min(upgradeBlock, (8<<20)/max(rowBytes, 1))))
	seqs := make([]int64, 0, chunk)
	metas := make([]RowMeta, chunk)
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = make([]byte, chunk*int64(c.RowBytes))
	}
	var w [8 * 8]byte
	le := binary.LittleEndian
	wc := b.writeCount.Load()
	for lo := max(0, wc-b.capacity); lo < wc; lo += chunk {
		seqs = seqs[:0]
		for seq := lo; seq < min(wc, lo+chunk); seq++ {
			seqs = append(seqs, seq)
		}
		ms := metas[:len(seqs)]
		if err := b.ReadIndex(func(ix Index) { ix.Rows(seqs, ms) }); err != nil {
			return d, err
		}
		bufs := make([][]byte, len(cols))
		for i, c := range cols {
			bufs[i] = dst[i][:len(seqs)*c.RowBytes]
		}
		if _, err := b.Gather(seqs, cols, bufs, nil); err != nil {
			return d, err
		}
		for i := range ms {
			m := &ms[i]
			if m.Seq < 0 {
				continue
			}
			var flags int64
			for k, f := range []bool{m.Done, m.Terminated, m.Truncated, m.HasTail} {
				if f {
					flags |= 1 << k
				}
			}
			for k, v := range []int64{m.Seq, m.TrajID, m.Step, m.PrevSeq, m.NextSeq, m.Env, m.PolicyVersion, flags} {
				le.PutUint64(w[8*k:], uint64(v))
			}
			h.Write(w[:])
			for k, c := range cols {
				h.Write(bufs[k][i*c.RowBytes : (i+1)*c.RowBytes]) // a tail's zeros without a final observation
			}
			if b.prio != nil {
				h.Write(b.prio.col.row(m.Seq % b.slots))
			}
			d.rows++
		}
	}
	d.sum = h.Sum64()
	return d, nil
}

// removeUpgradeLeftovers deletes, from the dir of a buffer in version 1,
// the files of an upgrade that stopped before it switched the catalog.
func removeUpgradeLeftovers(dir string) error {
	var errs []error
	nos, err := runSegmentNumbers(dir)
	errs = append(errs, err)
	for _, no := range nos {
		errs = append(errs, os.Remove(filepath.Join(dir, runSegName(no))))
	}
	if err := os.Remove(upgradeMetaFile(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// finishRunsUpgrade replaces rows.meta by the version 2 file an upgrade
// wrote beside it, once the catalog says version 2 (a rename: a kill
// leaves one file or the other, and Open finishes it).
func finishRunsUpgrade(dir string) error {
	if err := os.Rename(upgradeMetaFile(dir), metaFile(dir)); err != nil {
		return fmt.Errorf("replace rows.meta: %w", err)
	}
	return syncDir(dir)
}

// openUpgradeState handles, as a buffer's files are opened, an upgrade
// that stopped: a version 1 buffer's leftover version 2 files are removed
// (writable), and a version 2 buffer whose rows.meta.v2 is still beside
// rows.meta gets its rename finished (writable) or is read from it. It
// returns the rows.meta path to open.
func (b *Buffer) openUpgradeState(writable bool) (string, error) {
	path := metaFile(b.dir)
	if b.spec.Storage != KindMemmap {
		return path, nil
	}
	if b.blk != nil {
		return path, nil // an upgrade to version 3 replaces the whole dir (openBlocksUpgradeState)
	}
	pending := upgradeMetaFile(b.dir)
	if b.rlog == nil {
		if writable {
			if _, err := os.Stat(pending); err == nil {
				b.log.Warn("removing the files of an upgrade that stopped before it switched the buffer", "dir", b.dir)
			}
			return path, removeUpgradeLeftovers(b.dir)
		}
		return path, nil
	}
	if _, err := os.Stat(pending); err != nil {
		return path, nil
	}
	if !writable {
		return pending, nil
	}
	b.log.Warn("finishing an upgrade to rows.meta version 2 that stopped after it switched the buffer", "dir", b.dir)
	return path, finishRunsUpgrade(b.dir)
}

// The tail files' part of an upgrade: dense tail files written beside the
// version 1 ones (tail.<key>.col.v2), committed by a marker file, put in
// place by renames.

func upgradeTailFile(dir, file string) string { return filepath.Join(dir, file+".v2") }

func tailsUpgradeMarker(dir string) string { return filepath.Join(dir, "tails.upgrade") }

// writeDenseTailFiles writes, beside the version 1 tail files of a
// buffer opened read-only, dense tail files holding the final
// observations of its live rows in seq order (entry k the k-th), and
// syncs them. It notes what it wrote in ub.
func (b *Buffer) writeDenseTailFiles(ub *UpgradedBuffer, say func(string, ...any)) error {
	if err := removeTailsUpgradeLeftovers(b.dir); err != nil {
		return err
	}
	fail := func(err error) error { return errors.Join(err, removeTailsUpgradeLeftovers(b.dir)) }
	// The dense layout of these tails, on copies of the columns.
	dense := make([]*column, len(b.tails))
	for i, c := range b.tails {
		d := *c
		d.makeDense()
		dense[i] = &d
	}
	rows := newTailIndex(b.capacity, dense).rows
	ub.TailBytesBefore = b.tailFileBytes()
	// The live rows with a final observation, oldest first: entry k is
	// the k-th of them in every tail file.
	var withTail []int64
	wc := b.writeCount.Load()
	for seq := max(0, wc-b.capacity); seq < wc; seq++ {
		var r record
		if b.stamps.Load(seq%b.slots) != seq {
			continue // a hole
		}
		if b.loadRecord(seq, &r); r.Flags&flagHasTail != 0 {
			withTail = append(withTail, seq)
		}
	}
	for i, c := range b.tails {
		pitch := dense[i].pitch()
		f, err := createFile(upgradeTailFile(b.dir, c.file), headerSize+rows*pitch, headerSize, b.colHeaderFor(dense[i]).encode())
		if err != nil {
			return fail(err)
		}
		// Entries in blocks of a MiB: they are consecutive, from entry 0.
		var block []byte
		at := int64(0) // the first entry in block
		for k, seq := range withTail {
			block = append(block, c.row(seq%b.slots)...)
			block = binary.LittleEndian.AppendUint64(block, uint64(seq+1))
			if len(block) >= 1<<20 || k == len(withTail)-1 {
				if _, err = f.WriteAt(block, headerSize+at*pitch); err != nil {
					break
				}
				at, block = int64(k+1), block[:0]
			}
		}
		if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
			return fail(fmt.Errorf("write %s: %w", upgradeTailFile(b.dir, c.file), err))
		}
	}
	ub.Tails = int64(len(withTail))
	say("buffer %q: %d final observations in dense tail files", b.name, ub.Tails)
	if err := syncDir(b.dir); err != nil {
		return fail(err)
	}
	return nil
}

// tailFileBytes is the disk space the buffer's tail files take.
func (b *Buffer) tailFileBytes() int64 {
	var n int64
	for _, c := range b.tails {
		n += fileBytes(filepath.Join(b.dir, c.file))
	}
	return n
}

// commitTailsUpgrade commits a buffer's dense tail files written beside
// its version 1 ones: from the marker on, an open finishes the renames.
func commitTailsUpgrade(dir string) error {
	f, err := os.OpenFile(tailsUpgradeMarker(dir), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("commit the tail files: %w", err)
	}
	if err := errors.Join(f.Close(), syncDir(dir)); err != nil {
		return fmt.Errorf("commit the tail files: %w", err)
	}
	return nil
}

// finishTailsUpgrade renames every dense tail file an upgrade committed
// over its version 1 file, then deletes the marker (each step synced: a
// kill leaves the marker until every rename is done).
func finishTailsUpgrade(dir string) error {
	pending, err := filepath.Glob(filepath.Join(dir, "tail.*.col.v2"))
	if err != nil {
		return err
	}
	for _, p := range pending {
		if err := os.Rename(p, strings.TrimSuffix(p, ".v2")); err != nil {
			return fmt.Errorf("replace %s: %w", filepath.Base(p), err)
		}
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	if err := os.Remove(tailsUpgradeMarker(dir)); err != nil {
		return fmt.Errorf("remove %s: %w", tailsUpgradeMarker(dir), err)
	}
	return syncDir(dir)
}

// removeTailsUpgradeLeftovers deletes the dense tail files of an upgrade
// that stopped before it committed them.
func removeTailsUpgradeLeftovers(dir string) error {
	pending, err := filepath.Glob(filepath.Join(dir, "tail.*.col.v2"))
	var errs []error
	errs = append(errs, err)
	for _, p := range pending {
		errs = append(errs, os.Remove(p))
	}
	return errors.Join(errs...)
}

// openTailsUpgradeState handles, before a memmap buffer's tail files are
// opened, an upgrade of them that stopped: committed (the marker), its
// renames are finished (writable) or the dense files read where they are;
// not committed, its files are removed (writable) or ignored.
func (b *Buffer) openTailsUpgradeState(writable bool) error {
	if _, err := os.Stat(tailsUpgradeMarker(b.dir)); err != nil {
		if !writable {
			return nil
		}
		pending, _ := filepath.Glob(filepath.Join(b.dir, "tail.*.col.v2"))
		if len(pending) > 0 {
			b.log.Warn("removing the dense tail files of an upgrade that stopped before it committed them", "dir", b.dir)
		}
		return removeTailsUpgradeLeftovers(b.dir)
	}
	if writable {
		b.log.Warn("finishing an upgrade to dense tail files that stopped after it committed them", "dir", b.dir)
		return finishTailsUpgrade(b.dir)
	}
	for _, c := range b.tails {
		if _, err := os.Stat(upgradeTailFile(b.dir, c.file)); err == nil {
			c.file += ".v2"
		}
	}
	return nil
}
