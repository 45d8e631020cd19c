package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// ErrNothingToUpgrade is returned by Upgrade for a data dir with no memmap
// buffer in rows.meta format version 1.
var ErrNothingToUpgrade = errors.New("storage: nothing to upgrade")

// UpgradeOptions configures Upgrade. Nil gives the defaults.
type UpgradeOptions struct {
	// Store is passed to the opens Upgrade makes (nil: defaults).
	Store *Options
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
}

// UpgradeReport is the result of Upgrade.
type UpgradeReport struct {
	Dir     string           `json:"dir"`
	Buffers []UpgradedBuffer `json:"buffers"`
}

// Upgrade converts every memmap buffer of the data dir whose rows.meta is
// format version 1 (64-byte records) to version 2 (16-byte records and a
// run log: "row_meta": "runs", docs/format.md), keeping every row, link,
// stream and counter. It refuses, changing nothing, a dir a running store
// holds (ErrLocked), one of a newer format (ErrVersionMismatch), one that
// Verify finds damaged, an incomplete checkpoint, and one with nothing to
// upgrade (ErrNothingToUpgrade).
//
// A kill at any point leaves each buffer in version 1 or in version 2,
// never a mix: the version 2 files are written beside the version 1 ones
// and synced, then the catalog's spec is switched, then rows.meta is
// replaced by a rename. Open removes the files of an upgrade that stopped
// before the switch and finishes the rename of one that stopped after it.
// Upgrade opens the dir again at the end and checks that every row reads
// back with the metadata it had.
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
	rep, err := Verify(dir, o.Store)
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}
	if !rep.SnapshotAt.IsZero() {
		return nil, fmt.Errorf("upgrade %s: %w (a running store holds it: stop it first)", dir, ErrLocked)
	}
	if !rep.OK() {
		return nil, fmt.Errorf("upgrade %s: verify found problems, nothing changed (rbd verify %s lists them): %s", dir, dir, firstProblem(rep))
	}
	var targets []string
	for _, br := range rep.Buffers {
		if br.Storage == KindMemmap && br.RowMeta != RowMetaRuns {
			targets = append(targets, br.Name)
		}
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("upgrade %s: no memmap buffer keeps rows.meta in format version 1 (every one is version 2 already, or there is none): %w", dir, ErrNothingToUpgrade)
	}
	say("verified %s; upgrading %s", dir, strings.Join(targets, ", "))

	// 1. The version 2 files, beside the version 1 ones, synced, from a
	// read-only open: a kill here must not count as a crash of the
	// buffers (a flush buffer reopened after a crash resumes at its seq
	// reservation, and its oldest rows leave the window early).
	ro := Options{ReadOnly: true}
	if o.Store != nil {
		ro = *o.Store
		ro.ReadOnly = true
	}
	s, err := Open(dir, &ro)
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}
	if !s.snapAt.IsZero() {
		return nil, errors.Join(fmt.Errorf("upgrade %s: %w (a running store holds it: stop it first)", dir, ErrLocked), s.Close())
	}
	out := &UpgradeReport{Dir: dir}
	before := map[string][]RowMeta{}
	for _, name := range targets {
		b, err := s.Buffer(name)
		if err == nil {
			var ub UpgradedBuffer
			ub, before[name], err = b.writeRunFiles()
			out.Buffers = append(out.Buffers, ub)
			say("buffer %q: %d rows, %d run records written", name, ub.Rows, ub.RunRecords)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (the buffer is unchanged)", dir, name, err), s.Close())
		}
	}
	crash := s.crash
	crash.at("upgrade-files")
	if err := s.Close(); err != nil {
		return nil, fmt.Errorf("upgrade %s: close: %w", dir, err)
	}

	// 2. Per buffer, the switch: the spec in the catalog, then rows.meta.
	cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, o.Store.withDefaults().LockTimeout)
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w (the buffers are unchanged)", dir, err)
	}
	entries, err := cat.entries()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("upgrade %s: %w", dir, err), cat.close())
	}
	for _, e := range entries {
		if !slices.Contains(targets, e.name) {
			continue
		}
		spec := e.spec
		spec.RowMetaLayout = RowMetaRuns
		if err := cat.putSpec(e.name, spec); err != nil {
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: switch the spec: %w (the buffer is unchanged)", dir, e.name, err), cat.close())
		}
		crash.at("upgrade-commit")
		if err := finishRunsUpgrade(bufferDir(dir, e.name)); err != nil {
			// The catalog says version 2: the next open finishes it.
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q: %w (the next open finishes the upgrade)", dir, e.name, err), cat.close())
		}
		crash.at("upgrade-rename")
	}
	if err := cat.close(); err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", dir, err)
	}

	// 3. Read it back (read-only too: the catalog keeps its state, clean
	// flag and saved streams as the last store left them).
	s, err = Open(dir, &ro)
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: reopen after the upgrade: %w", dir, err)
	}
	for i, name := range targets {
		b, err := s.Buffer(name)
		if err == nil {
			err = b.checkUpgraded(before[name])
		}
		if err == nil {
			out.Buffers[i].MetaBytesAfter = fileBytes(metaFile(b.dir)) + b.rlog.files()
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("upgrade %s: buffer %q after the upgrade: %w", dir, name, err), s.Close())
		}
	}
	if err := s.Close(); err != nil {
		return nil, fmt.Errorf("upgrade %s: close: %w", dir, err)
	}
	say("upgraded %d buffers", len(targets))
	return out, nil
}

func firstProblem(rep *VerifyReport) string {
	if len(rep.Problems) > 0 {
		return rep.Problems[0]
	}
	for _, b := range rep.Buffers {
		if len(b.Problems) > 0 {
			return fmt.Sprintf("buffer %q: %s", b.Name, b.Problems[0])
		}
	}
	return ""
}

// upgradeMetaFile is where Upgrade writes a buffer's version 2 rows.meta
// before the switch.
func upgradeMetaFile(dir string) string { return metaFile(dir) + ".v2" }

// writeRunFiles writes the version 2 files of a version 1 memmap buffer,
// opened read-only, beside its files, from its live rows, and syncs them:
// rows.meta.v2 (with the same durable watermark: rows the version 1 files
// did not have on stable storage are not claimed) and runs.00000001.rbdr.
// It returns what it wrote and the live rows' metadata, to check the
// result against.
func (b *Buffer) writeRunFiles() (UpgradedBuffer, []RowMeta, error) {
	ub := UpgradedBuffer{Name: b.name, MetaBytesBefore: fileBytes(metaFile(b.dir))}
	if b.rlog != nil || b.cs != nil || !b.persistent {
		return ub, nil, fmt.Errorf("not a memmap buffer with rows.meta in format version 1")
	}
	if err := removeUpgradeLeftovers(b.dir); err != nil {
		return ub, nil, err
	}
	wc := b.writeCount.Load()
	var recs []record
	var crcs []uint32
	for seq := max(0, wc-b.capacity); seq < wc; seq++ {
		slot := seq % b.capacity
		if b.stamps.Load(slot) != seq {
			continue // a hole
		}
		r, ok := decodeRecord(b.rec(slot))
		if !ok || r.Seq != seq {
			return ub, nil, fmt.Errorf("seq %d: its record no longer checks", seq)
		}
		recs = append(recs, r)
		crcs = append(crcs, r.DataCRC)
	}
	seqs := make([]int64, len(recs))
	for i := range recs {
		seqs[i] = recs[i].Seq
	}
	meta := make([]RowMeta, len(seqs))
	if err := b.ReadIndex(func(ix Index) { ix.Rows(seqs, meta) }); err != nil {
		return ub, nil, err
	}

	var l runLog
	rows := l.plan(recs, 0)
	ub.Rows, ub.RunRecords = int64(len(recs)), int64(len(l.pieces))

	hdr := metaHeader{Version: metaVersionRuns, RecordSize: fileRunRecordSize, UID: b.uid, Capacity: uint64(b.capacity), Name: b.name}.encode()
	putWatermark(hdr, b.sync.durable)
	data := make([]byte, b.capacity*fileRunRecordSize)
	var scratch [12]byte
	for i := range recs {
		slot := recs[i].Seq % b.capacity
		// The version 1 data CRC covers the same bytes in the same
		// order; the version 2 checksum continues it over the record.
		drec := data[slot*fileRunRecordSize : (slot+1)*fileRunRecordSize]
		putFileRunRecord(drec, recs[i].Seq, rows[i], crcs[i], &scratch)
	}
	mf, err := createAllocated(upgradeMetaFile(b.dir), headerSize+int64(len(data)), hdr)
	if err == nil {
		_, err = mf.WriteAt(data, headerSize)
		err = errors.Join(err, mf.Sync(), mf.Close())
	}
	if err != nil {
		return ub, nil, errors.Join(fmt.Errorf("write %s: %w", upgradeMetaFile(b.dir), err), removeUpgradeLeftovers(b.dir))
	}

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
		return ub, nil, errors.Join(fmt.Errorf("write %s: %w", path, err), removeUpgradeLeftovers(b.dir))
	}
	return ub, meta, nil
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

// checkUpgraded compares the live rows' metadata after an upgrade with
// what they were before it.
func (b *Buffer) checkUpgraded(before []RowMeta) error {
	seqs := make([]int64, len(before))
	for i := range before {
		seqs[i] = before[i].Seq
	}
	after := make([]RowMeta, len(seqs))
	if err := b.ReadIndex(func(ix Index) { ix.Rows(seqs, after) }); err != nil {
		return err
	}
	if got := len(b.LiveSeqs(0, int(b.capacity))); got != len(before) {
		return fmt.Errorf("%d live rows, %d before", got, len(before))
	}
	for i := range before {
		if after[i] != before[i] {
			return fmt.Errorf("seq %d reads as %+v, was %+v", seqs[i], after[i], before[i])
		}
	}
	return nil
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
