package storage

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime/debug"
	"unsafe"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// Trajectory is the index entry of one live trajectory: the seqs of its live
// rows in time order. Only the newest rows of a trajectory survive the
// ring's overwrites, so its live rows are always a contiguous run of steps,
// starting at FirstStep.
//
// The seqs are kept as runs of evenly spaced seqs (seqRun), not one by
// one: the rows of one env come at a fixed distance from each other while
// the batches around them keep their shape (1 for a lone env, N for N
// envs written step by step), so a trajectory usually costs one run, not
// 8 bytes a row. Irregular arrivals (actors sending a step or a few at a
// time, interleaved as their requests arrive) pack 5 to 11 rows'
// distances into one run instead (packedWidths): 24 bytes for 8 rows from
// 64 actors where evenly spaced runs took 24 for 2 at worst.
//
// A *Trajectory is only valid inside the ReadIndex callback that produced it.
type Trajectory struct {
	id        int64
	runs      []seqRun // runs[hr:] hold the live rows
	hr        int
	base      int64 // position of the oldest live row: rows before it were evicted
	n         int64 // rows ever appended
	last      int64 // seq of the newest row (while n > 0)
	firstStep int64 // step of the oldest live row
	open      bool  // a (stream, env) may still append to it
	ended     bool  // its last row carries done
	pos       int   // position in index.list
	lenPos    int   // position in its length bucket
	filed     int   // the length it is filed under in index.byLen (0: not filed)
	unsettled bool  // in index.unsettled
}

// ID returns the trajectory id.
func (t *Trajectory) ID() int64 { return t.id }

// seqRun holds rows pos, pos+1, ... of a trajectory (positions count every
// row ever appended), whose seqs are first, first+stride, ...; it ends
// where the next run starts. A packed run (stride < 0, packedRun set)
// holds rows at any distances up to its width's: bits 61-62 of stride
// say which of packedWidths its distances take (packedCode), and the
// distance of its row k+1 from row k is the width's bits from k × width.
type seqRun struct {
	pos, first, stride int64
}

const (
	packedRun = math.MinInt64 // the bit of a packed run's stride
	// packedCodeShift is where a packed run's width code starts: the
	// distances use the 61 bits below it.
	packedCodeShift = 61
)

// packedWidths are the distance widths a packed run can take, by code,
// and packedRowsOf how many rows a run of each holds (its distances fill
// 61 bits as far as whole ones go): 5 rows up to 32,767 seqs apart, 7 up
// to 1,023, 8 up to 255, 11 up to 63. A run takes the narrowest width
// that holds the distances it has (repack), and moves to a wider one when
// a row comes farther: it ends only when no width holds one more row, so
// every packed run holds at least 5 rows, as when every run took 15 bits,
// and rows from 64 actors drawn at random (distances around 64) pack 8.
var (
	packedWidths = [4]uint{15, 10, 8, 6}
	packedRowsOf = [4]int64{5, 7, 8, packedMaxRows}
)

// packedMaxRows is the most rows a packed run holds (6-bit distances).
const packedMaxRows = 11

// packedCode returns the width code of a packed run's stride.
func packedCode(stride int64) int { return int(uint64(stride)>>packedCodeShift) & 3 }

// repack makes r, a run of count >= 2 rows, a packed run that also holds
// a row d seqs after its last, in the narrowest width that holds every
// distance and count+1 rows, and reports whether one does (r is left
// alone when none does: the row starts a run).
func (r *seqRun) repack(count, d int64) bool {
	n := count - 1 // the distances r holds
	if n+1 >= packedMaxRows {
		return false
	}
	var dists [packedMaxRows - 1]int64
	maxd := d
	if r.stride >= 0 {
		for j := range n {
			dists[j] = r.stride
		}
		maxd = max(maxd, r.stride)
	} else {
		w := packedWidths[packedCode(r.stride)]
		x := uint64(r.stride)
		for j := range n {
			dists[j] = int64(x & (1<<w - 1))
			maxd = max(maxd, dists[j])
			x >>= w
		}
	}
	dists[n] = d
	for c := len(packedWidths) - 1; c >= 0; c-- {
		w := packedWidths[c]
		if maxd > 1<<w-1 || count >= packedRowsOf[c] {
			continue
		}
		stride := int64(packedRun) | int64(c)<<packedCodeShift
		for j := range n + 1 {
			stride |= dists[j] << (w * uint(j))
		}
		r.stride = stride
		return true
	}
	return false
}

// at returns the seq of the run's row k (0 = its first).
func (r *seqRun) at(k int64) int64 {
	if r.stride >= 0 {
		return r.first + k*r.stride
	}
	return r.packedAt(k)
}

func (r *seqRun) packedAt(k int64) int64 {
	w := packedWidths[packedCode(r.stride)]
	mask := uint64(1)<<w - 1
	seq, d := r.first, uint64(r.stride)
	for ; k > 0; k-- {
		seq += int64(d & mask)
		d >>= w
	}
	return seq
}

// Len returns the number of live rows.
func (t *Trajectory) Len() int { return int(t.n - t.base) }

// Seq returns the seq of the i-th live row (0 = oldest live).
func (t *Trajectory) Seq(i int) int64 {
	k := t.hr // one live run, the usual case: no search
	if k != len(t.runs)-1 || uint64(i) >= uint64(t.n-t.base) {
		k = t.runIndex(i)
	}
	return t.runs[k].at(t.base + int64(i) - t.runs[k].pos)
}

// runIndex returns the index in t.runs of the run holding the i-th live
// row (a binary search over the live runs).
func (t *Trajectory) runIndex(i int) int {
	p := t.base + int64(i)
	if i < 0 || p >= t.n {
		panic(fmt.Sprintf("rbd: trajectory %d has %d live rows, no row %d", t.id, t.Len(), i))
	}
	// The last run whose pos <= p (runs[hr].pos <= base <= p).
	lo, hi := t.hr, len(t.runs)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if t.runs[mid].pos <= p {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// AppendSeqs appends the seqs of live rows i, i+1, ..., i+n-1 to dst: one
// search for the first, then a walk along the runs (a slice sampler's
// stretch of a trajectory costs O(log runs + n), not a search per row).
func (t *Trajectory) AppendSeqs(dst []int64, i, n int) []int64 {
	if n <= 0 {
		return dst
	}
	if i+n > t.Len() {
		panic(fmt.Sprintf("rbd: trajectory %d has %d live rows, no rows %d to %d", t.id, t.Len(), i, i+n-1))
	}
	k := t.runIndex(i)
	for p, end := t.base+int64(i), t.base+int64(i+n); p < end; k++ {
		r := &t.runs[k]
		stop := end
		if k+1 < len(t.runs) {
			stop = min(end, t.runs[k+1].pos)
		}
		if r.stride < 0 {
			for ; p < stop; p++ {
				dst = append(dst, r.packedAt(p-r.pos))
			}
			continue
		}
		for seq := r.first + (p-r.pos)*r.stride; p < stop; p++ {
			dst = append(dst, seq)
			seq += r.stride
		}
	}
	return dst
}

// lastSeq returns the seq of the newest row (the trajectory has one).
func (t *Trajectory) lastSeq() int64 { return t.last }

// push appends the row seq, which is above every seq of the trajectory.
func (t *Trajectory) push(seq int64) {
	if !t.joinLastRun(seq) {
		t.runs = append(t.runs, seqRun{pos: t.n, first: seq})
	}
	t.last = seq
	t.n++
}

// joinLastRun makes seq the next row of the trajectory's newest live run
// and reports whether it could (t.n is not yet counted).
func (t *Trajectory) joinLastRun(seq int64) bool {
	k := len(t.runs)
	if k == t.hr {
		return false
	}
	r := &t.runs[k-1]
	count, last := t.n-r.pos, t.last
	switch {
	case r.stride < 0:
		c := packedCode(r.stride)
		if w := packedWidths[c]; count < packedRowsOf[c] && seq-last <= 1<<w-1 {
			r.stride |= (seq - last) << (w * uint(count-1))
			return true
		}
		return r.repack(count, seq-last) // a wider width holds it
	case count == 1:
		r.stride = seq - r.first
		return true
	case seq == last+r.stride:
		return true
	}
	// The first row off the stride of a short run: the run's rows become
	// a packed run's distances, and this one too.
	return r.repack(count, seq-last)
}

// popOldest drops the oldest live row.
func (t *Trajectory) popOldest() {
	t.base++
	for t.hr+1 < len(t.runs) && t.runs[t.hr+1].pos <= t.base {
		t.hr++
	}
	// Reclaim the dropped runs once they dominate, so memory stays
	// proportional to live runs while each run is moved O(1) times.
	if t.hr >= 16 && t.hr*2 >= len(t.runs) {
		n := copy(t.runs, t.runs[t.hr:])
		clear(t.runs[n:])
		t.runs = t.runs[:n]
		t.hr = 0
	}
}

// FirstStep returns the step of the oldest live row; it is above 0 when the
// trajectory's first rows were overwritten.
func (t *Trajectory) FirstStep() int64 { return t.firstStep }

// Open reports whether a stream may still append rows to the trajectory.
func (t *Trajectory) Open() bool { return t.open }

// Ended reports whether the trajectory's last row has done set. A closed
// trajectory that is not Ended was cut short: by closing its stream, or by
// a crash.
func (t *Trajectory) Ended() bool { return t.ended }

// index maps trajectory ids to their live rows. It is kept up to date on
// every write, so samplers never scan rows to find trajectory boundaries.
type index struct {
	byID  map[int64]*Trajectory
	list  []*Trajectory // dense, for O(1) uniform choice
	rows  int64         // live rows
	tails int64         // live rows that carry a final observation
	open  int           // open trajectories
	byLen *lenIndex
	// unsettled are the trajectories whose length changed since byLen last
	// filed them. A batch of rows moves each trajectory once (settle), not
	// once per row: refiling is a Fenwick update of the length buckets.
	unsettled []*Trajectory
	// versions counts live rows by policy version (kept by the write
	// path, rebuilt after recovery).
	versions versionCounts
	// known has a bit per ring slot, set while the slot holds an indexed
	// row whose next observation is known in compact_obs terms: the row
	// has an indexed successor in its trajectory, or is done and carries
	// its final observation. Transition samplers of compact buffers test
	// it instead of reading the row's record: one bit per row keeps the
	// test in cache where a record read is a cache miss.
	known slotBits
	// nextDelta holds, per slot whose row has an indexed successor, the
	// successor's seq minus the row's (0: too far for 16 bits; ask the
	// trajectory). A sample needs each drawn row's next seq; reading it
	// here costs one load where the trajectory costs a map lookup and two
	// pointer chases. 16 bits cover any interleaving of up to 65,535
	// envs, at 2 bytes a row (a row of CartPole data is 31). Large rings
	// keep it off the Go heap (growNextDeltas).
	nextDelta []uint16
	// deltas holds nextDelta's memory when it is mapped, not allocated.
	deltas *mmapfile.Region
	// deltaRows, when not nil, is where the next distances are instead
	// of nextDelta: the deltaBytes (2, or 1) little-endian bytes at
	// deltaRows + slot x deltaPitch, in the row itself (deltasInRows):
	// the top of the row layout's traj_id word (memrecord.go, mrecNext),
	// or the padding after the small fields of a runs or strided row
	// group (a compact CartPole row has one byte there: distances up to
	// 255, further ones 0, which the trajectory answers). A sample reads
	// that line anyway, where nextDelta is a line of its own a row in a
	// large ring and 2 bytes a row more.
	deltaRows  unsafe.Pointer
	deltaPitch int64
	deltaBytes int
	// recent caches the write path's trajectory lookups (writerLookup).
	recent [recentTrajs]*Trajectory
	// slots maps seqs to slots (the buffer's slots).
	slots int64
	// ring maps seqs to slots without a division (ringSlots), for the
	// write count (setWriteCount): it changes with the write count, under
	// imu, so a reader holding imu sees the two agree.
	ring ringSlots
}

func (ix *index) init(slots int64) {
	ix.byID = map[int64]*Trajectory{}
	ix.list = nil
	ix.rows, ix.tails, ix.open = 0, 0, 0
	ix.byLen = &lenIndex{}
	ix.unsettled = nil
	ix.versions.init()
	ix.known = slotBits{}
	ix.nextDelta, ix.deltas = nil, nil
	ix.deltaRows, ix.deltaPitch, ix.deltaBytes = nil, 0, 0
	ix.recent = [recentTrajs]*Trajectory{}
	ix.slots = slots
	ix.ring = newRingSlots(0, slots)
}

// recentTrajs is the size of the write path's lookup cache (a power of 2).
const recentTrajs = 16

// writerLookup is byID[id] for the write path (add, evict), through a
// small direct-mapped cache: a batch's rows come from a few envs, so
// consecutive rows mostly belong to the last few trajectories, and ids are
// consecutive. Only writers use it (they hold imu exclusively).
func (ix *index) writerLookup(id int64) *Trajectory {
	e := &ix.recent[id&(recentTrajs-1)]
	if t := *e; t != nil && t.id == id {
		return t
	}
	t := ix.byID[id]
	*e = t
	return t
}

// add appends a newly written row to its trajectory.
func (ix *index) add(id, step, seq int64, done, hasTail bool) error {
	t := ix.writerLookup(id)
	if t == nil {
		t = &Trajectory{id: id, firstStep: step, open: true, pos: len(ix.list)}
		ix.byID[id] = t
		ix.recent[id&(recentTrajs-1)] = t
		ix.list = append(ix.list, t)
		ix.open++
	} else if want := t.firstStep + int64(t.Len()); step != want || !t.open {
		return fmt.Errorf("trajectory %d: row seq %d has step %d, want %d (open=%v)", id, seq, step, want, t.open)
	} else if t.Len() > 0 {
		prev := t.lastSeq()
		ps := ix.ring.of(prev)
		ix.known.set(ps) // its successor arrived
		ix.setNextDelta(ps, seq-prev)
	}
	// Slots through the ring map, not seq % capacity: three divisions a
	// row had been 6-8% of a memory extend (the map covers the seqs an
	// extend adds and evicts, near the write count; others divide).
	ix.known.put(ix.ring.of(seq), done && hasTail)
	t.push(seq)
	ix.lengthChanged(t)
	ix.rows++
	if hasTail {
		ix.tails++
	}
	if done {
		t.ended = true
		ix.setClosed(t)
	}
	return nil
}

func (ix *index) setNextDelta(slot, delta int64) {
	if delta > math.MaxUint16 {
		delta = 0
	}
	if ix.deltaRows != nil {
		ix.putDist(slot, delta)
		return
	}
	if int64(len(ix.nextDelta)) <= slot {
		ix.growNextDeltas(slot)
	}
	ix.nextDelta[slot] = uint16(delta)
}

// putDist stores slot's next distance in its row (deltaRows): 0 when it
// does not fit.
func (ix *index) putDist(slot, delta int64) {
	q := unsafe.Add(ix.deltaRows, slot*ix.deltaPitch)
	if ix.deltaBytes == 1 {
		if delta > math.MaxUint8 {
			delta = 0
		}
		*(*byte)(q) = byte(delta) // maybe the mapping's last byte
		return
	}
	p := (*[2]byte)(q)
	p[0], p[1] = byte(delta), byte(delta>>8) // any alignment
}

// nextDist returns the next distance of slot, whose known bit is set.
func (ix *index) nextDist(slot int64) uint16 {
	if ix.deltaRows != nil {
		q := unsafe.Add(ix.deltaRows, slot*ix.deltaPitch)
		if ix.deltaBytes == 1 {
			return uint16(*(*byte)(q))
		}
		p := (*[2]byte)(q)
		return uint16(p[0]) | uint16(p[1])<<8
	}
	return ix.nextDelta[slot]
}

// deltasInRows moves the next distances into the rows: the width bytes
// (2, or 1) at rows[slot x pitch] of each slot, which nothing else uses.
// The distances held so far are copied there (those too far for the width
// become 0) and their array given back. Called with the index to the
// caller alone (a buffer being created or restored).
func (ix *index) deltasInRows(rows []byte, pitch int64, width int) error {
	if (width != 1 && width != 2) || int64(len(rows)) < (ix.slots-1)*pitch+int64(width) {
		panic("rbd: next distance rows too short, or a width not 1 or 2")
	}
	ix.deltaRows, ix.deltaPitch, ix.deltaBytes = unsafe.Pointer(unsafe.SliceData(rows)), pitch, width
	for slot, d := range ix.nextDelta {
		ix.putDist(int64(slot), int64(d))
	}
	var err error
	if ix.deltas != nil {
		err = ix.deltas.Close()
	}
	ix.nextDelta, ix.deltas = nil, nil
	return err
}

// mappedDeltaBytes is the size from which next distances are mapped, not
// allocated: below it the Go heap is the cheaper home.
const mappedDeltaBytes = 64 << 10

// growNextDeltas makes slot a valid index of nextDelta. A large ring maps
// a distance for every slot at its first distance: anonymous memory, which
// the kernel backs page by page as slots are written. On the Go heap, 2
// bytes a row count towards the collector's goal, and a server holds up to
// twice its live heap between collections (GOGC), so a million rows'
// distances cost 2-4 MB more than their 2 MB (tests/resident, the rbd
// serve reading). Small rings, and rings whose mapping the OS refuses (a
// capacity of 10^11 is 200 GB of address space), grow a heap slice as the
// ring first fills.
func (ix *index) growNextDeltas(slot int64) {
	if ix.nextDelta == nil && ix.slots*2 >= mappedDeltaBytes {
		if r, err := mmapfile.Anonymous(ix.slots * 2); err == nil {
			// Huge pages as for the row group: draws read distances
			// at random slots.
			_ = r.AdviseHugePages()
			ix.nextDelta = unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(r.Bytes()))), ix.slots)
			ix.deltas = r
			return
		}
	}
	// Slots fill in order while the ring first goes round. Grown by
	// doubling but never past the slots (append would round the last
	// growth up by as much as a quarter).
	n := int64(len(ix.nextDelta))
	if int64(cap(ix.nextDelta)) <= slot {
		grown := make([]uint16, n, min(ix.slots, max(slot+1, 2*n)))
		copy(grown, ix.nextDelta)
		ix.nextDelta = grown
	}
	ix.nextDelta = ix.nextDelta[:slot+1]
}

// release returns the mapped next distances: only once no reader can use
// the index (Buffer.unmap). Next bits are cleared with them, so that an
// index used again answers "next unknown" until rows are added.
func (ix *index) release() error {
	if ix.deltaRows != nil {
		// In the rows, which the buffer unmaps.
		ix.deltaRows, ix.deltaPitch, ix.deltaBytes = nil, 0, 0
		ix.known = slotBits{}
		return nil
	}
	if ix.deltas == nil {
		return nil // the heap's: the collector frees it
	}
	err := ix.deltas.Close()
	ix.nextDelta, ix.deltas = nil, nil
	ix.known = slotBits{}
	return err
}

// nextOf returns the seq of the row after the indexed row seq (trajectory
// id, step, done flag as recorded), or -1.
func (ix *index) nextOf(seq, id, step int64, done bool) int64 {
	return ix.nextOfSlot(seq, seq%ix.slots, id, step, done)
}

// nextOfSlot is nextOf for a caller that knows seq's slot.
func (ix *index) nextOfSlot(seq, slot, id, step int64, done bool) int64 {
	// A row that is not done has its next-known bit set exactly when its
	// successor is indexed (a done row's bit says it has a final
	// observation instead).
	if done || !ix.known.get(slot) {
		return -1
	}
	if d := ix.nextDist(slot); d != 0 {
		return seq + int64(d)
	}
	return ix.next(id, step)
}

func (ix *index) lengthChanged(t *Trajectory) {
	if !t.unsettled {
		t.unsettled = true
		ix.unsettled = append(ix.unsettled, t)
	}
}

// settle files every trajectory whose length changed under its new length
// (a trajectory with no live row left leaves byLen). Every writer calls it
// before it lets go of the index lock.
func (ix *index) settle() {
	for i, t := range ix.unsettled {
		ix.byLen.moved(t, t.filed)
		t.filed = t.Len()
		t.unsettled = false
		ix.unsettled[i] = nil
	}
	ix.unsettled = ix.unsettled[:0]
}

func (ix *index) setClosed(t *Trajectory) {
	if t.open {
		t.open = false
		ix.open--
		t.clip()
	}
}

// clip gives back the room t.runs has past its live runs, t being closed:
// no row will be appended, and what append's doubling left (up to half
// the slice: a 200-row trajectory from 64 actors held 25 runs in room for
// 32) would stay as long as the trajectory's rows do. Slices of a run or
// two, a collector's, are left alone.
func (t *Trajectory) clip() {
	live := t.runs[t.hr:]
	if cap(t.runs)-len(live) < 2 {
		return
	}
	t.runs = append(make([]seqRun, 0, len(live)), live...)
	t.hr = 0
}

// evict removes the oldest live row of trajectory id, which must be seq.
func (ix *index) evict(id, seq int64, hasTail bool) error {
	t := ix.writerLookup(id)
	if t == nil || t.Len() == 0 || t.Seq(0) != seq {
		return fmt.Errorf("evict seq %d: not the oldest live row of trajectory %d", seq, id)
	}
	ix.known.put(ix.ring.of(seq), false)
	t.popOldest()
	t.firstStep++
	ix.lengthChanged(t)
	ix.rows--
	if hasTail {
		ix.tails--
	}
	if t.Len() == 0 {
		ix.remove(t)
	}
	return nil
}

func (ix *index) remove(t *Trajectory) {
	last := ix.list[len(ix.list)-1]
	ix.list[t.pos] = last
	last.pos = t.pos
	ix.list = ix.list[:len(ix.list)-1]
	delete(ix.byID, t.id)
	if e := &ix.recent[t.id&(recentTrajs-1)]; *e == t {
		*e = nil
	}
	if t.open {
		ix.open--
	}
}

// next returns the seq after the live row (id, step), or -1.
func (ix *index) next(id, step int64) int64 {
	t := ix.byID[id]
	if t == nil {
		return -1
	}
	i := step - t.firstStep + 1
	if i <= 0 || i >= int64(t.Len()) {
		return -1
	}
	return t.Seq(int(i))
}

// Index is a read-only view of a buffer's trajectory index, valid only
// inside the ReadIndex callback.
type Index struct {
	ix *index
	b  *Buffer
}

// indexOf returns b's Index; the caller holds imu.
func (b *Buffer) indexOf() Index { return Index{&b.ix, b} }

// setWriteCount moves the write count, and the index's slot map with it.
// Callers hold imu, or have the buffer to themselves (opening it).
func (b *Buffer) setWriteCount(wc int64) {
	b.ix.ring = newRingSlots(wc, b.slots)
	b.writeCount.Store(wc)
}

// NumTrajectories returns the number of trajectories with live rows.
func (v Index) NumTrajectories() int { return len(v.ix.list) }

// Trajectory returns the i-th trajectory, 0 <= i < NumTrajectories. The
// order is arbitrary and changes as trajectories come and go.
func (v Index) Trajectory(i int) *Trajectory { return v.ix.list[i] }

// ByID returns the live trajectory with that id, or nil.
func (v Index) ByID(id int64) *Trajectory { return v.ix.byID[id] }

// CountAtLeast returns how many trajectories have at least n live rows.
func (v Index) CountAtLeast(n int) int {
	v.ix.mustBeSettled()
	return v.ix.byLen.countAtLeast(n)
}

// PickAtLeast draws a trajectory uniformly among those with at least n live
// rows in O(log) time, or returns nil when there is none.
func (v Index) PickAtLeast(n int, rng *rand.Rand) *Trajectory {
	v.ix.mustBeSettled()
	return v.ix.byLen.pickAtLeast(n, rng)
}

// mustBeSettled catches a write path that forgot settle: byLen would give
// wrong trajectories, silently.
func (ix *index) mustBeSettled() {
	if len(ix.unsettled) > 0 {
		panic(fmt.Sprintf("rbd: trajectory length index read with %d trajectories unsettled", len(ix.unsettled)))
	}
}

// LiveRows returns the number of live rows.
func (v Index) LiveRows() int64 { return v.ix.rows }

// OpenTrajectories returns how many live trajectories may still grow. An
// open trajectory whose rows all left the ring is not among them (Info
// counts those too, from the streams).
func (v Index) OpenTrajectories() int { return v.ix.open }

// ReadIndex calls fn with a consistent view of the trajectory index. Writers
// wait while fn runs, so fn should only choose rows, not copy them.
func (b *Buffer) ReadIndex(fn func(Index)) (err error) {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.leave()
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	b.imu.RLock()
	defer b.imu.RUnlock()
	fn(b.indexOf())
	return nil
}

// Row returns the metadata of an indexed (live, published) row. Inside
// ReadIndex such a row cannot be overwritten: writers evict rows from the
// index, under the lock ReadIndex holds, before touching their slots.
func (v Index) Row(seq int64) (RowMeta, bool) {
	var m RowMeta
	ok := v.rowInto(seq, v.b.writeCount.Load(), &m)
	return m, ok
}

// rowInto is Row into *m, with the write count read once by the caller.
func (v Index) rowInto(seq, wc int64, m *RowMeta) bool {
	b := v.b
	// One slot per row serves the stamp, the record and the next link (a
	// division each had cost a 256-row sample about 0.5 µs).
	slot := int64(-1)
	if seq >= 0 && seq < wc && seq >= wc-b.capacity {
		slot = v.ix.ring.of(seq)
	}
	if slot < 0 || b.stamps.Load(slot) != seq {
		*m = RowMeta{Seq: -1, TrajID: -1, Step: -1, PrevSeq: -1, NextSeq: -1}
		return false
	}
	// No checksum here: an indexed row's record was checked when it was
	// written or recovered, and cannot change while the index is held.
	var flags uint32
	if b.compactRecords() {
		m.TrajID, m.Step, m.PrevSeq, m.Env, m.PolicyVersion, flags = b.memFields(slot, seq)
	} else {
		rb := b.rec(slot)
		le := binary.LittleEndian
		flags = le.Uint32(rb[recFlags:])
		m.TrajID, m.Step = int64(le.Uint64(rb[recTraj:])), int64(le.Uint64(rb[recStep:]))
		m.PrevSeq, m.Env = int64(le.Uint64(rb[recPrev:])), int64(le.Uint64(rb[recEnv:]))
		m.PolicyVersion = int64(le.Uint64(rb[recVersion:]))
	}
	m.Seq = seq
	m.setFlags(flags)
	m.NextSeq = v.ix.nextOfSlot(seq, slot, m.TrajID, m.Step, m.Done)
	return true
}

// setFlags sets the flag fields of m from a record's flags. rowInto sets
// every field of a RowMeta one by one: a composite literal assigned
// through the pointer is built aside and copied whole, which cost a 256-row
// sample 1-2 µs (7%).
func (m *RowMeta) setFlags(flags uint32) {
	m.Done = flags&flagDone != 0
	m.Terminated = flags&flagTerminated != 0
	m.Truncated = flags&flagTruncated != 0
	m.HasTail = flags&flagHasTail != 0
}

// Prefetch loads what Live and Row will read for seqs into cache in one
// short pass, so that their misses overlap (a draw that tests candidates
// one by one would take them one after another). It only helps where the
// stamps are in the rows (memory buffers); elsewhere it does nothing.
func (v Index) Prefetch(seqs []int64) { v.b.touchStamps(seqs, v.ix.ring) }

// PrefetchTrajectories loads what Len and AppendSeqs read of each of ts
// (nil entries skipped) in one pass per level (the trajectory, then its
// live run), so that in a large ring their cache misses overlap.
func (v Index) PrefetchTrajectories(ts []*Trajectory) {
	var sum int64
	for _, t := range ts {
		if t != nil {
			sum += int64(t.hr)
		}
	}
	for _, t := range ts {
		if t != nil && t.hr < len(t.runs) {
			sum += t.runs[t.hr].first
		}
	}
	keepLoads(sum)
}

// PrefetchSlots is Prefetch for the slots SlotSeq will be asked about.
func (v Index) PrefetchSlots(slots []uint64) {
	b := v.b
	if !b.stamps.inGroup() {
		return
	}
	var sum int64
	for _, slot := range slots {
		sum += int64(b.recs[int64(slot)*b.recPitch])
	}
	keepLoads(sum)
}

// Live reports whether seq is an indexed row: live and published. Unlike
// Row it reads no record.
func (v Index) Live(seq int64) bool {
	lo, hi := v.Window()
	return seq >= lo && seq < hi && v.b.stamps.Load(v.ix.ring.of(seq)) == seq
}

// NextKnown reports whether seq is an indexed row whose next observation
// can be given: in a buffer that stores next observations, every indexed
// row; in a compact_obs buffer, a row whose trajectory has an indexed row
// after it, or a done row that carries its final observation (the rule of
// transforms.NextOf). It reads one bit of the index, no record, so
// rejection sampling over it costs no cache miss outside the index.
func (v Index) NextKnown(seq int64) bool {
	if !v.b.spec.CompactObs {
		return v.Live(seq)
	}
	lo, hi := v.Window()
	// Inside the window a slot can only hold that one seq, and a set bit
	// means the slot's row is indexed (evict clears it before the slot
	// is reused, under the lock the caller holds).
	return seq >= lo && seq < hi && v.ix.known.get(v.ix.ring.of(seq))
}

// AppendLive appends to dst the seqs among cands that are Live
// (nextKnown false) or NextKnown (true), in cands' order: one call for a
// block of candidates, where a call per candidate cost a 256-row draw
// about 1 µs.
func (v Index) AppendLive(dst, cands []int64, nextKnown bool) []int64 {
	lo, hi := v.Window()
	ring := v.ix.ring
	if nextKnown && v.b.spec.CompactObs {
		bits := &v.ix.known
		for _, seq := range cands {
			if seq >= lo && seq < hi && bits.get(ring.of(seq)) {
				dst = append(dst, seq)
			}
		}
		return dst
	}
	for _, seq := range cands {
		if seq >= lo && seq < hi && v.b.stamps.Load(ring.of(seq)) == seq {
			dst = append(dst, seq)
		}
	}
	return dst
}

// AppendNextKnown appends to dst, in seq order, every seq for which
// NextKnown is true. In a compact_obs buffer it reads the index's bits a
// 64-slot word at a time, so listing the few eligible rows of a mostly
// ineligible ring costs capacity/64 word reads, not a record per row.
func (v Index) AppendNextKnown(dst []int64) []int64 {
	lo, hi := v.Window()
	if !v.b.spec.CompactObs {
		for seq := lo; seq < hi; seq++ {
			if v.Live(seq) {
				dst = append(dst, seq)
			}
		}
		return dst
	}
	c := v.ix.slots
	for seq := lo; seq < hi; {
		// The window's seqs run from slot lo%c to the ring's end, then
		// wrap to slot 0.
		slot := seq % c
		n := min(hi-seq, c-slot)
		dst = v.ix.known.appendSet(dst, slot, slot+n, seq-slot)
		seq += n
	}
	return dst
}

// Window returns the live seq range [lo, hi): hi is the write count.
func (v Index) Window() (lo, hi int64) {
	hi = v.b.writeCount.Load()
	return max(0, hi-v.b.capacity), hi
}

// Capacity returns the ring size: the window holds the last Capacity seqs.
func (v Index) Capacity() int64 { return v.b.capacity }

// Slots returns how many slots the ring maps seqs onto (SlotSeq's slots
// are below it): the capacity, or more in a ring with a spare block,
// whose slots beyond the window hold no live row.
func (v Index) Slots() int64 { return v.b.slots }

// Position returns the trajectory of an indexed row and the row's position
// in it (0 = oldest live row).
func (v Index) Position(m RowMeta) (*Trajectory, int) {
	t := v.ix.byID[m.TrajID]
	if t == nil {
		return nil, -1
	}
	return t, int(m.Step - t.firstStep)
}

// SlotSeq returns the seq of the indexed row in slot, or -1 when the slot is
// empty, a hole, holds a row not yet published, or one that has left the
// window.
func (v Index) SlotSeq(slot int64) int64 {
	seq := v.b.stamps.Load(slot)
	if wc := v.b.writeCount.Load(); seq < 0 || seq >= wc || seq < wc-v.b.capacity {
		return -1
	}
	return seq
}

// slotBits is a bit per ring slot, grown as slots are first used (slots
// fill in order while the ring first goes round), so it costs slots/8
// bytes at most and nothing for slots never written.
type slotBits struct{ words []uint64 }

func (s *slotBits) get(slot int64) bool {
	w := slot >> 6
	return w < int64(len(s.words)) && s.words[w]&(1<<(slot&63)) != 0
}

func (s *slotBits) set(slot int64) { s.put(slot, true) }

// appendSet appends base+slot for every set slot in [from, to).
func (s *slotBits) appendSet(dst []int64, from, to, base int64) []int64 {
	to = min(to, int64(len(s.words))*64)
	for w := from >> 6; w<<6 < to; w++ {
		word := s.words[w]
		if lo := w << 6; lo < from {
			word &^= 1<<(from-lo) - 1
		}
		if hi := (w + 1) << 6; hi > to {
			word &= 1<<(64-(hi-to)) - 1
		}
		for word != 0 {
			dst = append(dst, base+w<<6+int64(bits.TrailingZeros64(word)))
			word &= word - 1
		}
	}
	return dst
}

// eachClear calls fn with every slot in [from, to) whose bit is clear.
func (s *slotBits) eachClear(from, to int64, fn func(slot int64)) {
	for w := from >> 6; w<<6 < to; w++ {
		var word uint64
		if w < int64(len(s.words)) {
			word = s.words[w]
		}
		word = ^word
		if lo := w << 6; lo < from {
			word &^= 1<<(from-lo) - 1
		}
		if hi := (w + 1) << 6; hi > to {
			word &= 1<<(64-(hi-to)) - 1
		}
		for word != 0 {
			fn(w<<6 + int64(bits.TrailingZeros64(word)))
			word &= word - 1
		}
	}
}

func (s *slotBits) put(slot int64, on bool) {
	w := int(slot >> 6)
	if w >= len(s.words) {
		if !on {
			return
		}
		s.words = append(s.words, make([]uint64, w+1-len(s.words))...)
	}
	if on {
		s.words[w] |= 1 << (slot & 63)
	} else {
		s.words[w] &^= 1 << (slot & 63)
	}
}

// Rows is Row for every seq of seqs, into metas (len(seqs) long).
//
// A sample's rows are scattered over the ring, so each record is a cache
// miss: a first pass asks for every row's lines (prefetchRows) and loads
// what nextOf reads of the index (touchNext), so that their misses are
// served together (see prefetch.go), and the second pass reads them. In a
// memory buffer the record shares its row with the small fields (the row
// group), so the gather that follows finds those in cache too, and the
// next row's line (the next observation of compact rows) is asked for as
// soon as its seq is known, so that its miss is served while the rest of
// the sample runs.
func (v Index) Rows(seqs []int64, metas []RowMeta) {
	b := v.b
	span := int64(recordSize)
	if b.group != nil {
		span = b.recPitch
	}
	prefetchRows(b.recs, seqs, v.ix.ring, b.recPitch, span)
	if b.group == nil {
		// The stamps are in a table of their own (in a row group, each is
		// in its row's first line, asked for already).
		for _, seq := range seqs {
			if seq >= 0 {
				b.stamps.prefetch(v.ix.ring.of(seq))
			}
		}
	}
	keepLoads(v.ix.touchNext(seqs))
	if b.runs != nil {
		b.prefetchRuns(seqs, v.ix.ring)
	}
	wc := b.writeCount.Load()
	for i, seq := range seqs {
		m := &metas[i]
		// The copy reads the next row's stamp (in a row group, its line
		// with the next observation): ask for it now. A slice's next row
		// is mostly the slice's next row, asked for already.
		if v.rowInto(seq, wc, m) && m.NextSeq >= 0 && (i+1 == len(seqs) || seqs[i+1] != m.NextSeq) {
			b.stamps.prefetch(v.ix.ring.of(m.NextSeq))
		}
	}
}

// touchNext loads what nextOf reads for seqs (a bit and a next distance
// per row, at random places in arrays of 1/8 and 2 bytes a slot), so that
// in large rings their misses overlap too. Distances in the rows
// (deltaRows) come with the rows' lines, which Rows asks for.
func (ix *index) touchNext(seqs []int64) int64 {
	var sum int64
	nd, kw := ix.nextDelta, ix.known.words
	for _, seq := range seqs {
		if seq < 0 {
			continue
		}
		slot := ix.ring.of(seq)
		if slot < int64(len(nd)) {
			sum += int64(nd[slot])
		}
		if w := slot >> 6; w < int64(len(kw)) {
			sum += int64(kw[w] & 1)
		}
	}
	return sum
}
