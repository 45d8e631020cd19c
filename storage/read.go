package storage

import (
	"github.com/rbdb/rbd/ratelimit"
	"runtime/debug"

	"encoding/binary"
	"fmt"
	"math"
	"os"
	"syscall"
	"unsafe"
)

// RowMeta is the metadata of one row. Links name seqs, so a reference to a
// row that was overwritten since is detected, never followed into the
// slot's new contents: check liveness with Buffer.Live.
type RowMeta struct {
	Seq     int64 // -1 when the row is not live
	TrajID  int64
	Step    int64 // index of the row within its trajectory
	PrevSeq int64 // previous row of the trajectory, -1 at its start
	NextSeq int64 // next row of the trajectory, -1 if none or not written yet
	Env     int64
	// Done = Terminated || Truncated ends the trajectory.
	Done, Terminated, Truncated bool
	// HasTail is set on done rows of compact buffers whose writer sent the
	// final observation.
	HasTail bool
	// PolicyVersion is the version of the policy that produced the row,
	// as its writer gave it (0 when it gave none).
	PolicyVersion int64
}

// Column describes one readable column: a field of the spec or, in
// compact_obs buffers, the tail store "next.<k>" of an obs key (final
// observations, present only on done rows with HasTail). It is bound to
// the buffer whose Column method returned it: Gather and CopyIndexed
// refuse a column of another buffer, or of a buffer closed since (the
// same name reopened is a new buffer: ask it for its columns).
type Column struct {
	Name  string
	DType DType
	Shape []int
	// RowBytes is the size of one row of the column.
	RowBytes int
	// Tail is true for final-observation columns.
	Tail bool
	c    *column
	b    *Buffer // the buffer whose Column returned it
}

// Column looks up a column by name.
func (b *Buffer) Column(name string) (Column, bool) {
	if i, ok := b.colOf[name]; ok {
		c := b.cols[i]
		return Column{Name: c.name, DType: c.field.DType, Shape: c.field.Shape, RowBytes: c.rowBytes, c: c, b: b}, true
	}
	if i, ok := b.tailOf[name]; ok {
		c := b.tails[i]
		return Column{Name: c.name, DType: c.field.DType, Shape: c.field.Shape, RowBytes: c.rowBytes, Tail: true, c: c, b: b}, true
	}
	return Column{}, false
}

// Live reports whether seq names a row that is live now.
func (b *Buffer) Live(seq int64) bool {
	wc := b.writeCount.Load()
	if seq < 0 || seq >= wc || seq < wc-b.capacity {
		return false
	}
	return b.stamps.Load(seq%b.slots) == seq
}

// Gather copies the rows named by seqs into dst: dst[i] receives column
// cols[i] and must be len(seqs)*cols[i].RowBytes long. meta, if not nil,
// must be len(seqs) long and receives each row's metadata. Rows that are not
// live (never written, overwritten, a hole, or overwritten while being
// copied) are zero-filled, get Seq -1 in meta and are listed in missing.
// Tail columns are zero for rows without HasTail.
//
// Rows are copied without holding any lock: a per-slot stamp is checked
// before and after each row's copy, so a row is either returned whole or
// reported missing, never torn.
func (b *Buffer) Gather(seqs []int64, cols []Column, dst [][]byte, meta []RowMeta) (missing []int, err error) {
	if len(dst) != len(cols) || (meta != nil && len(meta) != len(seqs)) {
		return nil, fmt.Errorf("gather %q: %d columns, %d destinations, %d seqs, %d metas", b.name, len(cols), len(dst), len(seqs), len(meta))
	}
	for i, c := range cols {
		if c.c == nil || c.b != b {
			// A column of another buffer, or of this buffer's name
			// before a close, would be read with this buffer's slots.
			return nil, fmt.Errorf("gather %q: column %d (%q) is not from this buffer", b.name, i, c.Name)
		}
		if len(dst[i]) != len(seqs)*c.RowBytes {
			return nil, fmt.Errorf("gather %q: destination for %q has %d bytes, want %d", b.name, c.Name, len(dst[i]), len(seqs)*c.RowBytes)
		}
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.leave()
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	// Three passes instead of one per row: check every stamp, copy column
	// by column (one tight loop per field width), then re-check every
	// stamp. A row whose stamp changed in between was overwritten while we
	// copied it and is reported missing.
	wc := b.writeCount.Load()
	lo := wc - b.capacity
	ring := newRingSlots(wc, b.slots)
	b.touchStamps(seqs, ring)
	slots := make([]int64, len(seqs))
	for j, seq := range seqs {
		slots[j] = -1
		if seq >= 0 && seq < wc && seq >= lo {
			if slot := ring.of(seq); b.stamps.Load(slot) == seq {
				slots[j] = slot
			}
		}
	}
	var recs []record
	if meta != nil || hasTail(cols) {
		recs = make([]record, len(seqs))
		for j, slot := range slots {
			if slot >= 0 {
				b.loadRecord(seqs[j], &recs[j])
			}
		}
	}
	var chunkErrs map[int]error // compressed columns: rows that could not be read
	for i, c := range cols {
		if c.c.cz >= 0 {
			for j, err := range b.cs.gather(dst[i], c.c.cz, c.Tail, c.RowBytes, seqs, slots, recs) {
				if chunkErrs == nil {
					chunkErrs = map[int]error{}
				}
				if chunkErrs[j] == nil || err == errSlotMoving {
					chunkErrs[j] = err
				}
			}
			continue
		}
		if c.c.field.Mutable {
			b.readMutable(func() { gatherColumn(dst[i], c, slots, recs) })
			continue
		}
		if c.Tail {
			gatherColumn(dst[i], c, b.tailSlots(seqs, slots, recs, nil), recs)
			continue
		}
		gatherColumn(dst[i], c, slots, recs)
	}
	var damaged []error
	for j, slot := range slots {
		// stillHolds orders the check after the copies above, also on
		// weakly ordered CPUs.
		if slot < 0 || !b.stamps.stillHolds(slot, seqs[j]) || (chunkErrs != nil && chunkErrs[j] == errSlotMoving) {
			missing = append(missing, j)
			for i, c := range cols {
				clear(dst[i][j*c.RowBytes : (j+1)*c.RowBytes])
			}
			if meta != nil {
				meta[j] = RowMeta{Seq: -1, TrajID: -1, Step: -1, PrevSeq: -1, NextSeq: -1}
			}
			continue
		}
		if chunkErrs != nil && chunkErrs[j] != nil {
			// Still live, so the stored bytes are at fault.
			damaged = append(damaged, chunkErrs[j])
			continue
		}
		if meta != nil {
			recs[j].Seq = seqs[j]
			meta[j] = metaOf(&recs[j])
		}
	}
	if len(damaged) > 0 {
		return nil, fmt.Errorf("gather %q: %d rows unreadable: %w", b.name, len(damaged), damaged[0])
	}
	if meta != nil {
		b.imu.RLock()
		for j := range meta {
			if seq := meta[j].Seq; seq >= 0 {
				if b.Live(seq) { // still indexed: the quick way
					meta[j].NextSeq = b.ix.nextOf(seq, meta[j].TrajID, meta[j].Step, meta[j].Done)
				} else { // overwritten since it was copied: its trajectory may still know
					meta[j].NextSeq = b.ix.next(meta[j].TrajID, meta[j].Step)
				}
			}
		}
		b.imu.RUnlock()
	}
	return missing, nil
}

// CopyIndexed is Gather for a caller inside ReadIndex, for rows the index
// holds: a writer evicts a row from the index, under the lock ReadIndex
// holds, before it touches the row's slot, so an indexed row cannot change
// while it is copied and no stamp has to be checked twice. Rows that are
// not indexed (padding seqs < 0 included) are zero-filled and their
// positions appended to missing (the caller's scratch, possibly nil),
// which is returned. A sample of small rows copies this way, in the same
// critical section as its draw: for a few kilobytes the stamp checks of
// Gather cost more than the copy. Compressed columns are refused (their reads may
// decompress a chunk: too long to make writers wait).
func (v Index) CopyIndexed(seqs []int64, cols []Column, dst [][]byte, missing []int) ([]int, error) {
	b := v.b
	if len(dst) != len(cols) {
		return nil, fmt.Errorf("copy %q: %d columns, %d destinations", b.name, len(cols), len(dst))
	}
	for i, c := range cols {
		if c.c == nil || c.b != b || c.c.cz >= 0 {
			return nil, fmt.Errorf("copy %q: column %q is not a plain column of this buffer", b.name, c.Name)
		}
		if len(dst[i]) != len(seqs)*c.RowBytes {
			return nil, fmt.Errorf("copy %q: destination for %q has %d bytes, want %d", b.name, c.Name, len(dst[i]), len(seqs)*c.RowBytes)
		}
	}
	given := len(missing)
	var small [256]int64
	slots := small[:0]
	if len(seqs) > len(small) {
		slots = make([]int64, 0, len(seqs))
	}
	wc := b.writeCount.Load()
	lo := wc - b.capacity
	if b.stamps.inGroup() {
		// In a memory buffer the stamps share the rows' lines: one touch
		// pass brings in both, and the stamps are then checked from cache
		// (a touch pass of their own cost 3-4% of a CartPole sample).
		for _, seq := range seqs {
			slot := int64(-1)
			if seq >= 0 && seq < wc && seq >= lo {
				slot = v.ix.ring.of(seq)
			}
			slots = append(slots, slot)
		}
		b.touchColumns(cols, slots)
		for j, slot := range slots {
			if slot >= 0 && b.stamps.Load(slot) != seqs[j] {
				slots[j], slot = -1, -1
			}
			if slot < 0 {
				missing = append(missing, j)
			}
		}
	} else {
		// A memmap buffer's stamps are a table apart: checked before the
		// columns' prefetches, their misses do not queue behind them
		// (checked after, or in a loop of their own, gathers were 4-6%
		// slower).
		for j, seq := range seqs {
			slot := int64(-1)
			if seq >= 0 && seq < wc && seq >= lo {
				if s := v.ix.ring.of(seq); b.stamps.Load(s) == seq {
					slot = s
				}
			}
			if slot < 0 {
				missing = append(missing, j)
			}
			slots = append(slots, slot)
		}
		b.touchColumns(cols, slots)
	}
	var recs []record
	if hasTail(cols) {
		// Tails are gathered for the few done rows of a batch: records
		// for up to 32 of them live on the stack.
		var rsmall [32]record
		if len(seqs) <= len(rsmall) {
			recs = rsmall[:len(seqs)]
		} else {
			recs = make([]record, len(seqs))
		}
		for j, slot := range slots {
			if slot >= 0 {
				b.loadRecord(seqs[j], &recs[j])
			}
		}
	}
	var tsmall [256]int64
	for i, c := range cols {
		switch {
		case c.c.field.Mutable:
			b.readMutable(func() { gatherColumn(dst[i], c, slots, recs) })
		case c.Tail:
			gatherColumn(dst[i], c, b.tailSlots(seqs, slots, recs, tsmall[:0]), recs)
		default:
			gatherColumn(dst[i], c, slots, recs)
		}
		for _, j := range missing[given:] {
			clear(dst[i][j*c.RowBytes : (j+1)*c.RowBytes])
		}
	}
	return missing, nil
}

// touchStamps brings the stamps of seqs into cache ahead of the loop that
// checks them, when they are in a memory buffer's row group: there each
// is a cache miss of its own (in the row's line, which the copy needs
// next anyway), and a short loop overlaps them (see touchRows).
func (b *Buffer) touchStamps(seqs []int64, ring ringSlots) {
	if b.stamps.inGroup() {
		keepLoads(touchRows(b.recs, seqs, ring, b.recPitch, 8))
	}
}

// touchColumns brings the rows at slots of the small columns among cols
// into cache ahead of the stamp check and the copy (see prefetch.go): in a
// memory buffer the stamps and the columns in the row group in one touch
// pass over the span they share (Index.Rows asked for those lines
// already), each other column in a prefetch pass of its own (their first
// reach: in a memmap buffer of 10^7 rows uniform samples went from 56-58
// to 30 µs with it). Large rows are long copies that the hardware
// prefetcher follows on its own.
func (b *Buffer) touchColumns(cols []Column, slots []int64) {
	var sum int64
	lo, hi := int64(math.MaxInt64), int64(0) // the row group's span
	if b.stamps.inGroup() {
		lo, hi = 0, 8 // the stamp word starts the row
	}
	for _, c := range cols {
		switch {
		case c.Tail && b.tailIx != nil:
			// Tails are not at the slots (tailIndex), and few rows have one.
		case c.c.stride != 0:
			lo, hi = min(lo, c.c.groupOff), max(hi, c.c.groupOff+int64(c.RowBytes))
		case c.c.cz < 0 && c.RowBytes <= rowGroupMaxField:
			prefetchSlots(c.c.data, slots, c.c.pitch(), int64(c.RowBytes))
		}
	}
	if hi > 0 {
		sum += touchSlots(b.recs[lo:], slots, b.recPitch, hi-lo)
	}
	keepLoads(sum)
}

// tailSlots returns where the tail columns hold the tails of the rows at
// slots (the rows of seqs, recs their records), appended to dst: the
// tailIndex of a memory buffer or of dense tail files places them
// densely, other buffers keep them at the slot. A
// row without a tail keeps its slot, which gatherColumn does not read.
func (b *Buffer) tailSlots(seqs, slots []int64, recs []record, dst []int64) []int64 {
	if b.tailIx == nil {
		return slots
	}
	for j, slot := range slots {
		if slot >= 0 && recs[j].Flags&flagHasTail != 0 {
			slot = b.tailIx.pos(seqs[j])
		}
		dst = append(dst, slot)
	}
	return dst
}

func hasTail(cols []Column) bool {
	for _, c := range cols {
		if c.Tail {
			return true
		}
	}
	return false
}

func readRecord(rb []byte, rec *record) {
	le := binary.LittleEndian
	rec.TrajID = int64(le.Uint64(rb[recTraj:]))
	rec.Step = int64(le.Uint64(rb[recStep:]))
	rec.PrevSeq = int64(le.Uint64(rb[recPrev:]))
	rec.Env = int64(le.Uint64(rb[recEnv:]))
	rec.Flags = le.Uint32(rb[recFlags:])
	rec.PolicyVersion = int64(le.Uint64(rb[recVersion:]))
}

// gatherColumn copies the rows at slots (-1 = skip) of one column into dst.
// Small fixed widths get their own loops (copyFixed): a memmove call per
// 4-byte value costs more than the copy.
func gatherColumn(dst []byte, c Column, slots []int64, recs []record) {
	data, rb, pitch := c.c.data, c.RowBytes, c.c.pitch()
	if !c.Tail && copyFixed(dst, data, slots, pitch, rb) {
		return
	}
	le := binary.LittleEndian
	for j, slot := range slots {
		if slot < 0 {
			continue // zeroed with the other missing rows
		}
		if c.Tail && recs[j].Flags&flagHasTail == 0 {
			clear(dst[j*rb : (j+1)*rb])
			continue
		}
		off := slot * pitch
		switch rb {
		case 1:
			dst[j] = data[off]
		case 4:
			le.PutUint32(dst[4*j:], le.Uint32(data[off:]))
		case 8:
			le.PutUint64(dst[8*j:], le.Uint64(data[off:]))
		case 16:
			le.PutUint64(dst[16*j:], le.Uint64(data[off:]))
			le.PutUint64(dst[16*j+8:], le.Uint64(data[off+8:]))
		default:
			copy(dst[j*rb:(j+1)*rb], data[off:off+int64(rb)])
		}
	}
}

// copyFixed copies the rb bytes at slot × pitch in data of every slot to
// dst, row j at j × rb, skipping slots of -1 (the caller zeroes those
// rows), and reports whether rb is one of the widths it has a loop for.
func copyFixed(dst, data []byte, slots []int64, pitch int64, rb int) bool {
	n := len(slots)
	if n == 0 {
		return true
	}
	if len(dst) < n*rb {
		panic(fmt.Sprintf("rbd: gather of %d rows of %d bytes into %d bytes", n, rb, len(dst)))
	}
	// The rows data holds: every slot is checked against it below.
	var rows uint64
	if len(data) >= rb {
		rows = uint64((int64(len(data))-int64(rb))/pitch + 1)
	}
	to, from := unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(data))
	switch rb {
	case 1:
		copyRows[[1]byte](to, from, slots, pitch, rows)
	case 2:
		copyRows[[2]byte](to, from, slots, pitch, rows)
	case 4:
		copyRows[[4]byte](to, from, slots, pitch, rows)
	case 8:
		copyRows[[8]byte](to, from, slots, pitch, rows)
	case 16:
		copyRows[[16]byte](to, from, slots, pitch, rows)
	case 32:
		copyRows[[32]byte](to, from, slots, pitch, rows)
	default:
		return false
	}
	return true
}

// copyRows is copyFixed's loop for rows of one fixed size, T's (a byte
// array). Its row address is unsafe.Add, checked by one unsigned compare
// of the slot against rows (which also catches -1, the skip): indexing
// data[slot*pitch:] as a slice cost two bounds checks and the slice's
// length and capacity a row: without them, 256-row CartPole gathers take
// 13-18% less time (docs/performance.md). dst holds len(slots) values of T.
func copyRows[T any](dst, data unsafe.Pointer, slots []int64, pitch int64, rows uint64) {
	out := unsafe.Slice((*T)(dst), len(slots))
	for j, slot := range slots {
		if uint64(slot) >= rows {
			if slot < 0 {
				continue
			}
			panic(fmt.Sprintf("rbd: gather of slot %d, past the %d rows of its column", slot, rows))
		}
		out[j] = *(*T)(unsafe.Add(data, slot*pitch))
	}
}

func metaOf(r *record) RowMeta {
	return RowMeta{
		Seq: r.Seq, TrajID: r.TrajID, Step: r.Step, PrevSeq: r.PrevSeq, NextSeq: -1, Env: r.Env,
		Done:       r.Flags&flagDone != 0,
		Terminated: r.Flags&flagTerminated != 0,
		Truncated:  r.Flags&flagTruncated != 0,
		HasTail:    r.Flags&flagHasTail != 0,

		PolicyVersion: r.PolicyVersion,
	}
}

// LiveSeqs returns up to count live seqs from fromSeq on, in seq order,
// skipping rows that are not live (holes, overwritten). A negative fromSeq
// counts back from the write count.
func (b *Buffer) LiveSeqs(fromSeq int64, count int) []int64 {
	wc := b.writeCount.Load()
	if fromSeq < 0 {
		fromSeq += wc
	}
	fromSeq = max(fromSeq, wc-b.capacity, 0)
	var out []int64
	for s := fromSeq; s < wc && len(out) < count; s++ {
		if b.stamps.Load(s%b.slots) == s {
			out = append(out, s)
		}
	}
	return out
}

// FieldBytes compares what a field would take stored plainly with what it
// takes here.
type FieldBytes struct {
	Logical int64 `json:"logical"`
	Stored  int64 `json:"stored"`
}

// Info is a snapshot of a buffer's state.
type Info struct {
	Name             string                `json:"name"`
	Spec             Spec                  `json:"spec"`
	Size             int64                 `json:"size"`
	WriteCount       int64                 `json:"write_count"`
	Trajectories     int                   `json:"trajectories"`
	OpenTrajectories int                   `json:"open_trajectories"`
	Bytes            map[string]FieldBytes `json:"bytes"`
	SamplesServed    int64                 `json:"samples_served"`
	Durable          int64                 `json:"durable_seq"`
	Streams          int                   `json:"streams"`
	Holes            int64                 `json:"holes"`
	Damaged          int                   `json:"damaged_rows"`
	// DiskBytes is the space the buffer's files take on disk (0 for memory
	// buffers).
	DiskBytes int64 `json:"disk_bytes"`
	// RowMetaBytes is what one slot's row metadata takes: the 64-byte
	// record of a file (16 in rows.meta format version 2, the default of
	// new memmap buffers, with row_meta "runs" or "strided", whose run log
	// DiskBytes counts), or a memory buffer's 32-byte record (16 with run
	// records, 8 strided) plus the padding of its row group (the stamp,
	// index structures and run records are not counted).
	RowMetaBytes int64 `json:"row_meta_bytes"`
	// RunRecords is how many run records a buffer with "row_meta": "runs"
	// or "strided" holds in memory (0 for other buffers): Size / RunRecords rows share
	// each 64-byte record on average, and a workload whose runs are a few
	// rows long is better served by the default layout.
	RunRecords int64 `json:"run_records,omitempty"`
	// TailLayout says where a compact_obs buffer keeps its final
	// observations: "dense" (memory buffers, and memmap buffers' dense tail
	// files), "slot" (a tail file with each at its row's slot: compressed
	// buffers' plain obs keys, and memmap buffers of builds before dense
	// tail files, which rbd upgrade converts) or "chunks" (a compressed
	// obs key); empty for other buffers.
	TailLayout string `json:"tail_layout,omitempty"`
	// Cache counts lookups in the decoded-chunk cache of compressed
	// buffers (nil for other kinds).
	Cache *CacheStats `json:"chunk_cache,omitempty"`
	// RateLimit is the limiter's live state (nil without a rate limit).
	RateLimit *ratelimit.State `json:"rate_limit,omitempty"`
	// PolicyVersions says which policy versions produced the live rows.
	PolicyVersions PolicyVersions `json:"policy_versions"`
	// Sampling is what uniform and prioritized draws are taken over (see
	// Index.Eligibility): sharded clients split a batch across shards by it.
	Sampling SamplingInfo `json:"sampling"`
}

// SamplingInfo is Eligibility for both kinds of draw: over every live row
// (Rows, PriorityTotal), and over the rows whose next observation is known
// (NextKnownRows, NextKnownPriorityTotal: what compact_obs samples with
// next_state draw among; equal to the former in other buffers).
// PriorityMin is the smallest sampling priority q of the live rows; the
// priority figures are 0 without priorities.
type SamplingInfo struct {
	Rows                   int64   `json:"rows"`
	NextKnownRows          int64   `json:"next_known_rows"`
	PriorityTotal          float64 `json:"priority_total"`
	NextKnownPriorityTotal float64 `json:"next_known_priority_total"`
	PriorityMin            float64 `json:"priority_min"`
	// Slices is set when asked for a slice length (GET
	// /v1/buffers/{name}?slice_len=L): what the slice sampler draws among.
	Slices *SliceFigures `json:"slices,omitempty"`
}

// SliceFigures is what the slice sampler draws a trajectory among for
// slices of SliceLen rows: every live trajectory (Trajectories,
// strict_length false) or those with at least SliceLen live rows
// (AtLeast, strict_length true).
type SliceFigures struct {
	SliceLen     int   `json:"slice_len"`
	Trajectories int64 `json:"trajectories"`
	AtLeast      int64 `json:"trajectories_at_least"`
}

// SliceFigures counts the trajectories slices of sliceLen rows are drawn
// from, in O(log) from the length index.
func (b *Buffer) SliceFigures(sliceLen int) (SliceFigures, error) {
	f := SliceFigures{SliceLen: sliceLen}
	err := b.ReadIndex(func(v Index) {
		f.Trajectories = int64(v.NumTrajectories())
		f.AtLeast = int64(v.CountAtLeast(sliceLen))
	})
	return f, err
}

// Info returns the buffer's sizes and counters. For compact_obs buffers the
// "next.<k>" entry compares the next observations a plain layout would store
// (one per live row) with the final observations actually kept.
func (b *Buffer) Info() (Info, error) {
	if err := b.enter(); err != nil {
		return Info{}, err
	}
	defer b.leave()
	info := Info{
		Name:          b.name,
		Spec:          b.Spec(),
		WriteCount:    b.writeCount.Load(),
		SamplesServed: b.sampled.Load(),
		Durable:       b.Durable(),
		Bytes:         map[string]FieldBytes{},
	}
	b.imu.RLock()
	info.Size = b.ix.rows
	info.Trajectories = len(b.ix.list)
	tails := b.ix.tails
	info.PolicyVersions = b.ix.versions.describe()
	v := b.indexOf()
	all, known := v.Eligibility(false), v.Eligibility(true)
	info.Sampling = SamplingInfo{Rows: all.Rows, NextKnownRows: known.Rows, PriorityTotal: all.PriorityTotal,
		NextKnownPriorityTotal: known.PriorityTotal, PriorityMin: all.PriorityMin}
	b.imu.RUnlock()
	b.wmu.Lock()
	info.Streams = len(b.streams)
	if b.runs != nil {
		info.RunRecords = b.runs.live // writers change it under wmu
	}
	// Counted from the streams, not the index: an open trajectory whose
	// rows all left the ring has no index entry, yet its stream still
	// extends it.
	for _, envs := range b.streams {
		info.OpenTrajectories += len(envs)
	}
	b.wmu.Unlock()
	b.stateMu.Lock()
	for _, h := range b.holes {
		info.Holes += h[1] - max(h[0], info.WriteCount-b.capacity)
	}
	info.Damaged = len(b.damage)
	b.stateMu.Unlock()
	if st, on := b.limiter.State(); on {
		info.RateLimit = &st
	}
	if b.snapRateLimit != nil {
		info.RateLimit = b.snapRateLimit
	}
	touched := min(info.WriteCount, b.slots)
	var chunked []int64
	if b.cs != nil {
		var files int64
		chunked, files = b.cs.usage(info.WriteCount - b.capacity)
		info.DiskBytes += files
		st := b.cs.cache.stats()
		info.Cache = &st
	}
	for _, c := range b.cols {
		fb := FieldBytes{Logical: info.Size * int64(c.rowBytes)}
		if c.cz >= 0 {
			// Final observations share the chunk payload; they are
			// counted here, and as 0 under next.<k>.
			fb.Stored = chunked[c.cz]
		} else {
			fb.Stored = b.storedBytes(c, touched*int64(c.rowBytes))
			info.DiskBytes += fb.Stored
		}
		info.Bytes[c.name] = fb
	}
	info.TailLayout = b.tailLayout()
	for _, c := range b.tails {
		fb := FieldBytes{Logical: info.Size * int64(c.rowBytes)}
		if c.cz < 0 {
			fb.Stored = b.storedBytes(c, tails*int64(c.rowBytes))
			info.DiskBytes += fb.Stored
		}
		info.Bytes[c.name] = fb
	}
	info.RowMetaBytes = recordSize
	if b.blk != nil {
		// Version 3: two 32-byte record copies a block of 64 rows.
		info.RowMetaBytes = blockRecordsBytes
	} else if b.rlog != nil {
		// A memmap buffer's file record (its memory records, 16 or 8
		// bytes, are not what the field reports).
		info.RowMetaBytes = fileRunRecordSize
	} else if b.compactRecords() {
		info.RowMetaBytes = b.recPitch
		for _, c := range b.cols {
			if c.stride != 0 {
				info.RowMetaBytes -= int64(c.rowBytes)
			}
		}
	}
	if b.persistent {
		info.DiskBytes += fileBytes(b.meta.Path())
		if b.rlog != nil {
			info.DiskBytes += b.rlog.files()
		}
		if b.prio != nil {
			info.DiskBytes += fileBytes(b.prio.col.region.Path())
		}
	} else {
		info.DiskBytes = 0
	}
	return info, nil
}

// tailLayout is Info.TailLayout: where the buffer keeps its final
// observations ("" for a buffer that keeps none).
func (b *Buffer) tailLayout() string {
	switch {
	case len(b.tails) == 0:
		return ""
	case b.tails[0].cz >= 0:
		return "chunks"
	case b.tailIx != nil:
		return "dense"
	default:
		return "slot"
	}
}

// storedBytes is the disk space a column file takes (sparse regions cost
// nothing) or, for memory buffers, the estimate given.
func (b *Buffer) storedBytes(c *column, memEstimate int64) int64 {
	if !b.persistent {
		return memEstimate
	}
	return fileBytes(c.region.Path())
}

// fileBytes is the disk space a file takes (sparse regions cost nothing),
// 0 if it cannot be read.
func fileBytes(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}

// Damage lists rows that recovery found damaged below the durable watermark
// (and so dropped). Empty for a healthy buffer.
func (b *Buffer) Damage() []string {
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	return append([]string(nil), b.damage...)
}

// NoteSampled adds n to the count of rows served by samples.
func (b *Buffer) NoteSampled(n int) { b.noteSamples(b.sampled.Add(int64(n))) }
