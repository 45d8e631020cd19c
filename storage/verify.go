package storage

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"
)

// BufferReport is what Verify found in one buffer.
type BufferReport struct {
	Name    string `json:"name"`
	Storage Kind   `json:"storage"`
	// RowMeta is the buffer's row metadata layout ("row" or "runs"; for
	// memmap buffers, rows.meta format version 1 or 2).
	RowMeta RowMetaLayout `json:"row_meta"`
	// TailLayout is where a compact_obs buffer keeps its final
	// observations (Info.TailLayout: "dense", "slot" or "chunks").
	TailLayout string `json:"tail_layout,omitempty"`
	WriteCount int64  `json:"write_count"`
	LiveRows   int64  `json:"live_rows"`
	Durable    int64  `json:"durable_seq"`
	Holes      int64  `json:"holes"`
	// LetGo is the rows this open let go under the fsync exception after
	// a crash: rows at the bottom of the window, or final observations,
	// that an unacknowledged write may have been overwriting when power
	// was lost (not damage: such a write would have evicted them).
	LetGo    int64    `json:"let_go,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// VerifyReport is the result of Verify.
type VerifyReport struct {
	Dir string `json:"dir"`
	// SnapshotAt is set when a running store held the catalog and the
	// check used the snapshot it published (rows keep changing meanwhile).
	SnapshotAt time.Time      `json:"snapshot_at,omitzero"`
	Buffers    []BufferReport `json:"buffers"`
	// Problems are the data dir's own (an incomplete checkpoint).
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether no buffer has a problem.
func (r *VerifyReport) OK() bool {
	if len(r.Problems) > 0 {
		return false
	}
	for _, b := range r.Buffers {
		if len(b.Problems) > 0 {
			return false
		}
	}
	return true
}

// Verify checks every buffer of a data dir without changing it: file
// headers against the catalog, every record and data checksum in the live
// window, the links between rows, and the trajectory index rebuilt from
// them. A torn tail above a buffer's durable watermark (what a crash leaves)
// is not a problem; any damage below it, or acknowledged rows that are
// missing, is. The error is non-nil only when the check could not run (no
// catalog, locked, unreadable catalog).
func Verify(dir string, opts *Options) (*VerifyReport, error) {
	return readSettled(func() (*VerifyReport, error) { return verifyOnce(dir, opts) })
}

func verifyOnce(dir string, opts *Options) (*VerifyReport, error) {
	o := opts.withDefaults()
	o.ReadOnly = true
	if err := checkComplete(dir); err != nil {
		// Its files may be anything: a copy cut short is not checked,
		// it is refused.
		return &VerifyReport{Dir: dir, Problems: []string{err.Error()}}, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "catalog.db")); err != nil {
		return nil, fmt.Errorf("verify %s: %w", dir, err)
	}
	cat, entries, snap, err := readOnlyEntries(dir, o.LockTimeout)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", dir, err)
	}
	var snapAt time.Time
	if snap != nil {
		snapAt = snap.WrittenAt
	}
	if cat != nil {
		defer cat.close()
	}
	s := &Store{dir: dir, opts: o, log: o.Logger, cat: cat, readOnly: true, buffers: map[string]*Buffer{}, snapAt: snapAt, boot: currentBoot()}
	rep := &VerifyReport{Dir: dir, SnapshotAt: snapAt}
	for _, e := range entries {
		br := BufferReport{Name: e.name, Storage: e.spec.Storage, RowMeta: cmp.Or(e.spec.RowMetaLayout, RowMetaPerRow), WriteCount: e.state.WriteCount}
		b, _, err := s.openBuffer(e)
		if err != nil {
			br.Problems = append(br.Problems, err.Error())
			rep.Buffers = append(rep.Buffers, br)
			continue
		}
		br.WriteCount = b.writeCount.Load()
		br.TailLayout = b.tailLayout()
		br.LiveRows = b.ix.rows
		br.Durable = b.sync.durable
		for _, h := range b.holes {
			br.Holes += h[1] - max(h[0], br.WriteCount-b.capacity)
		}
		br.LetGo = b.letGo
		br.Problems = append(br.Problems, b.damage...)
		br.Problems = append(br.Problems, b.checkIndex()...)
		if b.cs != nil {
			br.Problems = append(br.Problems, b.cs.checkChunks()...)
		}
		if err := b.unmap(); err != nil {
			br.Problems = append(br.Problems, err.Error())
		}
		rep.Buffers = append(rep.Buffers, br)
	}
	if snap != nil && restartedSince(dir, snap.Instance) {
		return nil, fmt.Errorf("verify %s: %w (tried %d times)", dir, errStoreRestarted, snapshotTries)
	}
	return rep, nil
}

// checkIndex cross-checks the trajectory index against the stored rows.
// Recovery builds the index so that these hold; a failure here is a bug or
// damage that slipped past the checksums.
func (b *Buffer) checkIndex() (probs []string) {
	var err error
	defer func() {
		if err != nil {
			probs = append(probs, err.Error())
		}
	}()
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	var rows int64
	live := !b.store.snapAt.IsZero()
	scratch := new([recordSize]byte) // decodeRecord's
	for _, t := range b.ix.list {
		prev := int64(-1)
		for i := 0; i < t.Len(); i++ {
			seq := t.Seq(i)
			rows++
			slot := seq % b.slots
			if b.stamps.Load(slot) != seq {
				probs = append(probs, fmt.Sprintf("trajectory %d: row %d is indexed but not stored", t.id, seq))
				continue
			}
			r, ok := b.checkedRecord(seq, scratch)
			if !ok && live && b.overwrittenMeanwhile(seq) {
				// The running writer moved past it since the scan. The
				// checksum matters: a read racing the overwrite can see
				// the old seq next to the new row's fields.
				prev = seq
				continue
			}
			if !ok {
				probs = append(probs, fmt.Sprintf("trajectory %d: row %d's record fails its checksum or names another row", t.id, seq))
				prev = seq
				continue
			}
			if r.TrajID != t.id || r.Step != t.firstStep+int64(i) {
				probs = append(probs, fmt.Sprintf("trajectory %d: row %d has trajectory %d step %d, index says step %d", t.id, seq, r.TrajID, r.Step, t.firstStep+int64(i)))
			}
			if i > 0 && r.PrevSeq != prev {
				probs = append(probs, fmt.Sprintf("trajectory %d: row %d links back to %d, index says %d", t.id, seq, r.PrevSeq, prev))
			}
			if i < t.Len()-1 && r.Flags&flagDone != 0 {
				probs = append(probs, fmt.Sprintf("trajectory %d: row %d is done but not last", t.id, seq))
			}
			prev = seq
		}
	}
	if rows != b.ix.rows {
		probs = append(probs, fmt.Sprintf("index counts %d live rows, trajectories hold %d", b.ix.rows, rows))
	}
	return probs
}
