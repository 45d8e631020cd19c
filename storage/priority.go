package storage

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime/debug"

	"github.com/rbdb/rbd/internal/segtree"
)

// priorities is the prioritised-replay state of a buffer: the raw priority
// of every slot in a float64 column (persisted like the rows), and sum and
// min trees over q = (p + eps)^alpha for sampling and importance weights.
// Guarded by Buffer.imu.
type priorities struct {
	alpha, eps float64
	max        float64 // largest raw priority ever set; new rows get it (1 before any)
	col        *column
	// The trees cover the slots written so far, not the ring: they grow
	// by doubling (up to slots) as the ring first fills, so an empty
	// buffer of a billion rows costs nothing here.
	slots int64
	sum   *segtree.SumTree
	min   *segtree.MinTree
}

// prioTreeMin is the smallest tree allocated: below it, doubling would
// rebuild too often for nothing.
const prioTreeMin = 1024

func newPriorities(alpha, eps float64, slots int64, col *column) *priorities {
	n := int(min(slots, prioTreeMin))
	return &priorities{alpha: alpha, eps: eps, max: 1, col: col, slots: slots,
		sum: segtree.NewSumTree(n), min: segtree.NewMinTree(n)}
}

// cover grows the trees so that slot is a leaf.
func (p *priorities) cover(slot int64) {
	if int(slot) < p.sum.Len() {
		return
	}
	n := int(min(p.slots, max(2*int64(p.sum.Len()), slot+1)))
	p.sum.Grow(n)
	p.min.Grow(n)
}

func (p *priorities) q(raw float64) float64 { return math.Pow(raw+p.eps, p.alpha) }

func (p *priorities) raw(slot int64) float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64(p.col.row(slot)))
}

// set stores a raw priority for a live slot.
func (p *priorities) set(slot int64, raw float64) {
	binary.LittleEndian.PutUint64(p.col.row(slot), math.Float64bits(raw))
	p.setTrees(slot, raw)
}

// setTrees updates the trees only (read-only stores must not write the
// mapping).
func (p *priorities) setTrees(slot int64, raw float64) {
	p.cover(slot)
	q := p.q(raw)
	p.sum.Set(int(slot), q)
	if q > 0 {
		p.min.Set(int(slot), q)
	} else {
		// A row with q = 0 (priority 0 and eps 0) is never drawn; keeping
		// it out of the minimum keeps weights (q_i / q_min)^-beta finite.
		p.min.Clear(int(slot))
	}
}

func (p *priorities) clear(slot int64) {
	if int(slot) >= p.sum.Len() {
		return // never set
	}
	p.sum.Set(int(slot), 0)
	p.min.Clear(int(slot))
}

// validPriority reports whether a priority can be stored.
func validPriority(v float64) bool { return v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }

// ErrNoPriority is returned by priority calls on a buffer created without
// spec.Priority.
var ErrNoPriority = fmt.Errorf("storage: buffer has no priorities (create it with \"priority\" in its spec)")

// UpdatePriorities sets the raw priorities of rows named by seq (TD errors,
// typically). Rows that are no longer live (overwritten since they were
// sampled) are skipped and counted as stale, never applied to the slot's new
// row. A negative, NaN or infinite priority fails the whole call before
// anything changes. With duplicate seqs the last value wins.
func (b *Buffer) UpdatePriorities(seqs []int64, prios []float64) (updated, stale int, err error) {
	if b.prio == nil {
		return 0, 0, fmt.Errorf("update priorities %q: %w", b.name, ErrNoPriority)
	}
	if len(seqs) != len(prios) {
		return 0, 0, batchErr("priority", -1, "has %d values for %d seqs", len(prios), len(seqs))
	}
	for i, v := range prios {
		if !validPriority(v) {
			return 0, 0, batchErr("priority", i, "%v is not a finite non-negative number", v)
		}
	}
	if err := b.enter(); err != nil {
		return 0, 0, err
	}
	defer b.leave()
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	if b.store.readOnly {
		return 0, 0, fmt.Errorf("update priorities %q: %w", b.name, ErrReadOnly)
	}
	b.imu.Lock()
	defer b.imu.Unlock()
	wc := b.writeCount.Load()
	for i, seq := range seqs {
		if seq < 0 || seq >= wc || seq < wc-b.capacity || b.stamps.Load(seq%b.slots) != seq {
			stale++
			continue
		}
		b.prio.set(seq%b.slots, prios[i])
		b.prio.max = max(b.prio.max, prios[i])
		updated++
	}
	if updated > 0 {
		b.dirty.Store(true)
	}
	return updated, stale, nil
}

// PriorityTotal returns the sum of q over live rows (0 without priorities).
func (v Index) PriorityTotal() float64 {
	if v.b.prio == nil {
		return 0
	}
	return v.b.prio.sum.Total()
}

// PriorityFind returns the live row whose share of the priority mass
// contains mass, for mass in [0, PriorityTotal()), or -1.
func (v Index) PriorityFind(mass float64) int64 {
	if v.b.prio == nil {
		return -1
	}
	slot := v.b.prio.sum.Find(mass)
	if slot < 0 {
		return -1
	}
	return v.b.stamps.Load(int64(slot))
}

// PriorityFindBatch sets seqs[j] = PriorityFind(masses[j]) for every j,
// overwriting masses: the tree descents of a batch run side by side, which
// keeps many of their cache misses in flight at once (segtree.FindBatch).
// leaves is scratch, as long as masses.
func (v Index) PriorityFindBatch(masses []float64, leaves []int, seqs []int64) {
	if v.b.prio == nil {
		for j := range seqs {
			seqs[j] = -1
		}
		return
	}
	v.b.prio.sum.FindBatch(masses, leaves)
	for j, slot := range leaves {
		seqs[j] = -1
		if slot >= 0 {
			seqs[j] = v.b.stamps.Load(int64(slot))
		}
	}
}

// PriorityQ returns q = (p + eps)^alpha of a live row.
func (v Index) PriorityQ(seq int64) float64 {
	return v.b.prio.sum.Get(int(seq % v.b.slots))
}

// PriorityMinQ returns the smallest positive q over live rows (+Inf when
// there is none).
func (v Index) PriorityMinQ() float64 {
	if v.b.prio == nil {
		return math.Inf(1)
	}
	return v.b.prio.min.Min()
}

// Priority returns the raw priority of a live row.
func (b *Buffer) Priority(seq int64) (float64, bool) {
	if b.prio == nil || !b.Live(seq) {
		return 0, false
	}
	b.imu.RLock()
	defer b.imu.RUnlock()
	return b.prio.raw(seq % b.slots), true
}

// MaxPriority returns the largest raw priority ever set (1 before any).
func (b *Buffer) MaxPriority() float64 {
	if b.prio == nil {
		return 0
	}
	b.imu.RLock()
	defer b.imu.RUnlock()
	return b.prio.max
}

// Eligibility describes the rows a transition sampler draws among: with
// nextKnown (compact_obs samples that need the next observation), the
// indexed rows whose next observation is known; otherwise every indexed
// row. Rows is how many there are and PriorityTotal the sum of their
// sampling priorities q = p^alpha (0 without priorities), so a uniform
// draw picks a row with probability 1/Rows and a prioritised one with
// q/PriorityTotal. PriorityMin is the smallest q among the live rows, as
// importance weights use it.
type Eligibility struct {
	Rows          int64
	PriorityTotal float64
	PriorityMin   float64
}

// Eligibility returns what the draw of a transition sampler is taken
// over. In a compact_obs buffer asked for nextKnown it reads the index's
// next-known bits a word at a time and looks only at rows whose bit is
// clear (the newest row of each open trajectory, mostly): O(window/64)
// plus those rows, no record read.
func (v Index) Eligibility(nextKnown bool) Eligibility {
	e := Eligibility{Rows: v.ix.rows}
	if v.b.prio != nil {
		e.PriorityTotal = v.PriorityTotal()
		if m := v.PriorityMinQ(); !math.IsInf(m, 0) {
			e.PriorityMin = m // +Inf while no row is live
		}
	}
	if !nextKnown || !v.b.spec.CompactObs {
		return e
	}
	lo, hi := v.Window()
	c := v.ix.slots
	for seq := lo; seq < hi; {
		slot := seq % c
		n := min(hi-seq, c-slot)
		v.ix.known.eachClear(slot, slot+n, func(s int64) {
			q := seq + (s - slot)
			if !v.Live(q) {
				return // a hole, or a row not yet published
			}
			e.Rows--
			if v.b.prio != nil {
				e.PriorityTotal -= v.PriorityQ(q)
			}
		})
		seq += n
	}
	e.PriorityTotal = max(e.PriorityTotal, 0)
	return e
}
