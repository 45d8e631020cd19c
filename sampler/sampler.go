package sampler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/rbdb/rbd/sampler/internal/perm"
	"github.com/rbdb/rbd/storage"
)

// Sampler kinds.
const (
	Uniform                 = "uniform"
	WithoutReplacement      = "without_replacement"
	Prioritized             = "prioritized"
	Slice                   = "slice"
	SliceWithoutReplacement = "slice_without_replacement"
	PrioritizedSlice        = "prioritized_slice"
)

// Kinds lists every sampler kind.
var Kinds = []string{Uniform, WithoutReplacement, Prioritized, Slice, SliceWithoutReplacement, PrioritizedSlice}

// IsSlice reports whether kind returns [num_slices, slice_len] batches.
func IsSlice(kind string) bool {
	return kind == Slice || kind == SliceWithoutReplacement || kind == PrioritizedSlice
}

// IsPrioritized reports whether kind draws by priority (and returns weights).
func IsPrioritized(kind string) bool { return kind == Prioritized || kind == PrioritizedSlice }

// ErrNotReady is returned when the current data cannot satisfy a draw yet
// (an empty buffer, no trajectory long enough for a strict slice, no row
// whose next observation is known). More writes may fix it.
var ErrNotReady = errors.New("sampler: not enough data yet")

// Params describes one draw.
type Params struct {
	Kind string
	// BatchSize is the number of rows of a transition batch.
	BatchSize int
	// NumSlices and SliceLen shape slice batches.
	NumSlices, SliceLen int
	// StrictLength draws slices only from trajectories with at least
	// SliceLen live rows; otherwise shorter ones give padded slices.
	StrictLength bool
	// Beta is the importance-weight exponent of prioritised kinds.
	Beta float64
	// DropLast drops the short last batch of a without-replacement epoch.
	DropLast bool
	// Consumer names the epoch state of without-replacement kinds.
	Consumer string
	// NextKnown makes transition samplers return only rows whose next
	// observation is known (storage.Index.NextKnown). The index answers it
	// without reading the row, so it costs far less than the same test in
	// Eligible. Slice samplers ignore it: they flag such positions instead.
	NextKnown bool
	// Eligible reports whether a transition sampler may return a row that
	// passed NextKnown (for instance, whether its policy version is recent
	// enough). Nil admits every such row. It reads the row's record, so it
	// is for what the index cannot answer. Slice samplers ignore it.
	Eligible func(storage.Index, storage.RowMeta) bool
	// MinPolicyVersion makes slice samplers start slices only at rows whose
	// policy version is at least this (0 admits every row); they draw among
	// those starts with the distribution they have without it. Transition
	// samplers take the bound through Eligible.
	MinPolicyVersion int64
	// Reuse, when set, is a selection the caller is done with: the draw
	// returns it, refilled, reusing its arrays (a sampling loop then
	// allocates nothing per draw). Nil allocates a new one.
	Reuse *Selection
}

// Selection is what a sampler chose.
type Selection struct {
	// Seqs has BatchSize entries for transition kinds and
	// NumSlices*SliceLen for slice kinds (slice after slice, time
	// ascending); -1 marks padding.
	Seqs []int64
	// Weights are importance weights (prioritised kinds), one per entry;
	// 0 on padding.
	Weights []float32
	// NumSlices and SliceLen are set for slice kinds.
	NumSlices, SliceLen int
	// SliceEnd is true at the last real row of each slice.
	SliceEnd []bool
	// Mask is true on real rows; set for slices when StrictLength is false.
	Mask []bool
	// Epoch and EpochEnd report without-replacement progress: EpochEnd is
	// true on the last batch of an epoch.
	HasEpoch bool
	Epoch    int64
	EpochEnd bool

	// spare keeps the arrays of fields this draw leaves nil (Weights of a
	// uniform draw, say) for the next draw that reuses the selection, and
	// the samplers' own scratch (tree descents, permutation blocks).
	spare struct {
		weights        []float32
		sliceEnd, mask []bool
		masses         []float64
		leaves         []int
		found          []int64
		slots          []uint64
		trajs          []*storage.Trajectory
	}
}

// trajScratch returns n entries of sel's scratch for trajectories (their
// contents arbitrary); keepTrajScratch gives them back.
func (sel *Selection) trajScratch(n int) []*storage.Trajectory { return sized(sel.spare.trajs, n) }

// keepTrajScratch keeps ts for the next draw, cleared: a pooled selection
// keeps no trajectory alive.
func (sel *Selection) keepTrajScratch(ts []*storage.Trajectory) {
	clear(ts)
	sel.spare.trajs = ts[:0]
}

// sized returns s with length n, reusing its array when it is large
// enough (its contents are then arbitrary).
func sized[T any](s []T, n int) []T { return slices.Grow(s[:0], n)[:n] }

// selection returns an empty selection with room for n entries and the
// optional arrays asked for (nil otherwise), from p.Reuse when set.
func (p Params) selection(n int, weights, sliceEnd, mask bool) *Selection {
	sel := p.Reuse
	if sel == nil {
		sel = &Selection{}
	}
	seqs, sp := sel.Seqs, sel.spare
	if sel.Weights != nil {
		sp.weights = sel.Weights
	}
	if sel.SliceEnd != nil {
		sp.sliceEnd = sel.SliceEnd
	}
	if sel.Mask != nil {
		sp.mask = sel.Mask
	}
	*sel = Selection{Seqs: slices.Grow(seqs[:0], n)}
	sel.spare = sp
	if weights {
		sel.Weights, sel.spare.weights = slices.Grow(sp.weights[:0], n), nil
	}
	if sliceEnd {
		sel.SliceEnd, sel.spare.sliceEnd = slices.Grow(sp.sliceEnd[:0], n), nil
	}
	if mask {
		sel.Mask, sel.spare.mask = slices.Grow(sp.mask[:0], n), nil
	}
	return sel
}

// State is the sampling state of one buffer: the epochs of
// without-replacement consumers. It starts afresh when the process starts.
type State struct {
	mu        sync.Mutex
	consumers map[string]*epoch
}

// NewState returns empty sampling state.
func NewState() *State { return &State{consumers: map[string]*epoch{}} }

type epoch struct {
	number   int64
	perm     perm.Perm
	cursor   uint64
	size     int64   // live rows (or trajectories) when the epoch started
	trajIDs  []int64 // slice epochs: the trajectories of the epoch
	finished bool
}

// Draw chooses rows. It must be called inside ReadIndex with that view;
// rng supplies every random choice.
func (s *State) Draw(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	if ix.LiveRows() == 0 {
		return nil, fmt.Errorf("%w: the buffer is empty", ErrNotReady)
	}
	switch p.Kind {
	case Uniform:
		return drawUniform(ix, p, rng)
	case Prioritized:
		return drawPrioritized(ix, p, rng)
	case WithoutReplacement:
		return s.drawWithoutReplacement(ix, p, rng)
	case Slice:
		return drawSlices(ix, p, rng)
	case SliceWithoutReplacement:
		return s.drawSlicesWithoutReplacement(ix, p, rng)
	case PrioritizedSlice:
		return drawPrioritizedSlices(ix, p, rng)
	}
	return nil, fmt.Errorf("sampler: unknown kind %q", p.Kind)
}

// admits reports whether a transition sampler may return seq: live (and
// with a known next observation under NextKnown), then Eligible. The index
// answers the first test alone; only Eligible reads the row's record.
func admits(ix storage.Index, p Params, seq int64) bool {
	if p.NextKnown {
		if !ix.NextKnown(seq) {
			return false
		}
	} else if !ix.Live(seq) {
		return false
	}
	if p.Eligible == nil {
		return true
	}
	m, ok := ix.Row(seq)
	return ok && p.Eligible(ix, m)
}

// admitAll appends to dst the seqs among cands that admits would take, in
// cands' order (seqs < 0 never): without an Eligible function, in one call
// into the index for the whole block.
func admitAll(ix storage.Index, p Params, dst, cands []int64) []int64 {
	if p.Eligible == nil {
		return ix.AppendLive(dst, cands, p.NextKnown)
	}
	for _, seq := range cands {
		if seq >= 0 && admits(ix, p, seq) {
			dst = append(dst, seq)
		}
	}
	return dst
}

// rejectionBudget bounds the random tries before a sampler falls back to an
// exact scan, so a store that is mostly ineligible costs O(n) once instead
// of an unbounded loop.
func rejectionBudget(n int) int { return 64*n + 256 }

func drawUniform(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	lo, hi := ix.Window()
	sel := p.selection(p.BatchSize, false, false, false)
	// Candidates are drawn a block at a time, as many as are still
	// needed, so the rng gives exactly what one at a time would; a test
	// that reads a row (Live: the stamp, in a memory buffer's row line)
	// then finds the block's lines loaded by one short pass.
	var small [256]int64
	prefetch := !p.NextKnown || p.Eligible != nil
	for tries := rejectionBudget(p.BatchSize); len(sel.Seqs) < p.BatchSize && tries > 0; {
		cand := small[:0]
		for range min(p.BatchSize-len(sel.Seqs), tries, len(small)) {
			cand = append(cand, lo+rng.Int64N(hi-lo))
		}
		if prefetch {
			ix.Prefetch(cand)
		}
		tries -= len(cand)
		sel.Seqs = admitAll(ix, p, sel.Seqs, cand)
	}
	if len(sel.Seqs) == p.BatchSize {
		return sel, nil
	}
	// Few rows qualify: list them once and draw exactly.
	all := eligibleRows(ix, p)
	if len(all) == 0 {
		return nil, fmt.Errorf("%w: no live row is eligible (for compact buffers: no row whose next observation is known yet)", ErrNotReady)
	}
	for len(sel.Seqs) < p.BatchSize {
		sel.Seqs = append(sel.Seqs, all[rng.IntN(len(all))])
	}
	return sel, nil
}

func eligibleRows(ix storage.Index, p Params) []int64 {
	if p.NextKnown {
		// The index lists them from its bits; only Eligible reads rows.
		all := ix.AppendNextKnown(nil)
		if p.Eligible == nil {
			return all
		}
		return slices.DeleteFunc(all, func(seq int64) bool {
			m, ok := ix.Row(seq)
			return !ok || !p.Eligible(ix, m)
		})
	}
	lo, hi := ix.Window()
	var out []int64
	for seq := lo; seq < hi; seq++ {
		if admits(ix, p, seq) {
			out = append(out, seq)
		}
	}
	return out
}

// weight is the importance weight (q / q_min)^-beta: the rarest live row
// gets 1, more likely rows less. It is computed as exp(-beta ln(q/q_min)):
// math.Pow's care for exact powers and extreme arguments cost 1.5-2 µs of
// a 256-row prioritized sample (BenchmarkSample), and the two agree to far
// below the float32 the weight is answered in (TestWeightMatchesPow).
func weight(q, qmin, beta float64) float32 {
	return float32(math.Exp(-beta * math.Log(q/qmin)))
}

func drawPrioritized(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	total := ix.PriorityTotal()
	if !(total > 0) {
		return nil, fmt.Errorf("%w: total priority is 0", ErrNotReady)
	}
	qmin := ix.PriorityMinQ()
	sel := p.selection(p.BatchSize, true, false, false)
	// Candidates are found a round at a time (as many as rows are still
	// missing) and taken in the order of their masses, so the rows, and
	// what is left of the random stream, are those of one candidate at a
	// time: a round only lets the tree descents overlap.
	n := min(p.BatchSize, 1024)
	sp := &sel.spare
	sp.masses, sp.leaves, sp.found = sized(sp.masses, n), sized(sp.leaves, n), sized(sp.found, n)
	masses, leaves, found := sp.masses, sp.leaves, sp.found
	for tries := rejectionBudget(p.BatchSize); len(sel.Seqs) < p.BatchSize && tries > 0; {
		k := min(p.BatchSize-len(sel.Seqs), tries, n)
		for j := range k {
			masses[j] = rng.Float64() * total
		}
		ix.PriorityFindBatch(masses[:k], leaves[:k], found[:k])
		if !p.NextKnown || p.Eligible != nil {
			ix.Prefetch(found[:k]) // admits reads the rows (see drawUniform)
		}
		tries -= k
		start := len(sel.Seqs)
		sel.Seqs = admitAll(ix, p, sel.Seqs, found[:k])
		for _, seq := range sel.Seqs[start:] {
			sel.Weights = append(sel.Weights, weight(ix.PriorityQ(seq), qmin, p.Beta))
		}
	}
	if len(sel.Seqs) == p.BatchSize {
		return sel, nil
	}
	// Exact fallback over the eligible rows' priorities.
	all := eligibleRows(ix, p)
	cum := make([]float64, len(all))
	sum := 0.0
	for i, seq := range all {
		sum += ix.PriorityQ(seq)
		cum[i] = sum
	}
	if !(sum > 0) {
		return nil, fmt.Errorf("%w: no eligible row has a positive priority", ErrNotReady)
	}
	for len(sel.Seqs) < p.BatchSize {
		i := searchCum(cum, rng.Float64()*sum)
		sel.Seqs = append(sel.Seqs, all[i])
		sel.Weights = append(sel.Weights, weight(ix.PriorityQ(all[i]), qmin, p.Beta))
	}
	return sel, nil
}

// searchCum returns the first i with cum[i] > x, skipping zero-width
// entries.
func searchCum(cum []float64, x float64) int {
	lo, hi := 0, len(cum)-1
	for lo < hi {
		mid := (lo + hi) / 2
		if cum[mid] > x {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func (s *State) epochFor(consumer string) *epoch {
	e := s.consumers[consumer]
	if e == nil {
		e = &epoch{number: -1, finished: true}
		s.consumers[consumer] = e
	}
	return e
}

// epochSlots is how many slots a without-replacement epoch permutes: the
// rows written so far while the ring first fills (a write then changes
// the live count, which starts a new epoch), and every slot of a full
// ring, so that an epoch that goes on while rows are overwritten reaches
// the slots they go to. In a ring with a spare block those are slots the
// window did not hold when the epoch began; the slots that hold no live
// row are skipped (SlotSeq).
func epochSlots(ix storage.Index) int64 {
	if _, hi := ix.Window(); hi < ix.Capacity() {
		return hi
	}
	return ix.Slots()
}

func (s *State) drawWithoutReplacement(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.epochFor(p.Consumer)
	n := epochSlots(ix)
	if e.finished || e.size != ix.LiveRows() {
		// A new epoch: when the last ended, or when the number of live
		// rows changed (TorchRL's rule: a full ring keeps its epoch while
		// rows are overwritten in place).
		e.number++
		e.perm = perm.New(uint64(n), rng.Uint64())
		e.cursor = 0
		e.size = ix.LiveRows()
		e.finished = false
	}
	if p.DropLast && int64(p.BatchSize) > e.size {
		return nil, fmt.Errorf("%w: batch size %d is larger than the %d live rows (drop_last)", ErrNotReady, p.BatchSize, e.size)
	}
	sel := p.selection(p.BatchSize, false, false, false)
	sel.HasEpoch, sel.Epoch = true, e.number
	// The permutation is computed a block at a time (as many entries as
	// rows are still missing: every one of them is visited, exactly as
	// one at a time would), which lets its evaluations overlap.
	sel.spare.slots = sized(sel.spare.slots, min(p.BatchSize, 1024))
	slots := sel.spare.slots
	for len(sel.Seqs) < p.BatchSize && e.cursor < e.perm.N() {
		block := slots[:min(uint64(p.BatchSize-len(sel.Seqs)), uint64(len(slots)), e.perm.N()-e.cursor)]
		e.perm.AtBatch(e.cursor, block)
		e.cursor += uint64(len(block))
		ix.PrefetchSlots(block) // SlotSeq reads each slot's stamp
		// Slots, not seqs: a full ring keeps its epoch while rows are
		// overwritten in place, and each slot is visited once.
		for len(block) > 0 {
			var small [256]int64
			seqs := small[:0]
			for _, slot := range block[:min(len(block), len(small))] {
				seqs = append(seqs, ix.SlotSeq(int64(slot)))
			}
			block = block[len(seqs):]
			sel.Seqs = admitAll(ix, p, sel.Seqs, seqs)
		}
	}
	// Skip what cannot be returned ahead, so the batch that takes the
	// epoch's last eligible row is the one flagged epoch_end (each entry
	// is skipped once per epoch: O(n) per epoch in all).
	for e.cursor < e.perm.N() {
		seq := ix.SlotSeq(int64(e.perm.At(e.cursor)))
		if seq >= 0 && admits(ix, p, seq) {
			break
		}
		e.cursor++
	}
	left := e.perm.N() - e.cursor
	if left == 0 || (p.DropLast && left < uint64(p.BatchSize)) {
		e.finished = true
		sel.EpochEnd = true
	}
	if len(sel.Seqs) == 0 {
		return nil, fmt.Errorf("%w: no eligible row left in epoch %d", ErrNotReady, e.number)
	}
	if p.DropLast && len(sel.Seqs) < p.BatchSize {
		return nil, fmt.Errorf("%w: epoch %d ended with a short batch (drop_last)", ErrNotReady, e.number)
	}
	return sel, nil
}

// appendSlice adds one slice of trajectory t starting at position start,
// with length l <= L, padded to L.
func appendSlice(sel *Selection, t *storage.Trajectory, start, l, L int, w float32, padded bool) {
	sel.Seqs = t.AppendSeqs(sel.Seqs, start, l)
	for range L - l {
		sel.Seqs = append(sel.Seqs, -1)
	}
	for i := 0; i < L; i++ {
		sel.SliceEnd = append(sel.SliceEnd, i == l-1)
		if padded {
			sel.Mask = append(sel.Mask, i < l)
		}
		if sel.Weights != nil {
			if i < l {
				sel.Weights = append(sel.Weights, w)
			} else {
				sel.Weights = append(sel.Weights, 0)
			}
		}
	}
	sel.NumSlices++
}

func newSliceSelection(p Params, weighted bool) *Selection {
	n := p.NumSlices * p.SliceLen
	sel := p.selection(n, weighted, true, !p.StrictLength)
	sel.SliceLen = p.SliceLen
	return sel
}

// startOK reports whether a slice may start at position pos of t under
// MinPolicyVersion.
func startOK(ix storage.Index, p Params, t *storage.Trajectory, pos int) bool {
	if p.MinPolicyVersion <= 0 {
		return true
	}
	m, ok := ix.Row(t.Seq(pos))
	return ok && m.PolicyVersion >= p.MinPolicyVersion
}

func drawSlices(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	L := p.SliceLen
	sel := newSliceSelection(p, false)
	if p.MinPolicyVersion <= 0 {
		return drawSlicesPicksFirst(ix, p, rng, sel)
	}
	for tries := rejectionBudget(p.NumSlices); sel.NumSlices < p.NumSlices; {
		var t *storage.Trajectory
		if p.StrictLength {
			t = ix.PickAtLeast(L, rng)
			if t == nil {
				return nil, fmt.Errorf("%w: no live trajectory has %d rows (strict_length)", ErrNotReady, L)
			}
		} else {
			t = ix.Trajectory(rng.IntN(ix.NumTrajectories()))
		}
		l := min(L, t.Len())
		start := rng.IntN(t.Len() - l + 1)
		if !startOK(ix, p, t, start) {
			if tries--; tries <= 0 {
				return drawSlicesExact(ix, p, rng, sel)
			}
			continue
		}
		appendSlice(sel, t, start, l, L, 0, !p.StrictLength)
	}
	return sel, nil
}

// drawSlicesPicksFirst is drawSlices when every start qualifies (no
// MinPolicyVersion), so that no slice is drawn again: it picks every
// slice's trajectory first, brings them into cache in one pass
// (PrefetchTrajectories), then draws each start. In a ring of 10^7 rows each
// trajectory is a cache miss or two, which one slice after another had
// paid in turn. The draws are the same as drawSlices' (a trajectory, then
// a start uniformly), taken from the random source in another order.
func drawSlicesPicksFirst(ix storage.Index, p Params, rng *rand.Rand, sel *Selection) (*Selection, error) {
	L := p.SliceLen
	ts := sel.trajScratch(p.NumSlices)
	defer sel.keepTrajScratch(ts)
	for i := range ts {
		if p.StrictLength {
			if ts[i] = ix.PickAtLeast(L, rng); ts[i] == nil {
				return nil, fmt.Errorf("%w: no live trajectory has %d rows (strict_length)", ErrNotReady, L)
			}
		} else {
			ts[i] = ix.Trajectory(rng.IntN(ix.NumTrajectories()))
		}
	}
	ix.PrefetchTrajectories(ts)
	for _, t := range ts {
		l := min(L, t.Len())
		appendSlice(sel, t, rng.IntN(t.Len()-l+1), l, L, 0, !p.StrictLength)
	}
	return sel, nil
}

// drawSlicesExact fills sel when few slice starts pass MinPolicyVersion:
// it lists every qualifying (trajectory, start) with the probability the
// unfiltered draw gives it (a trajectory uniformly among those long
// enough, then a start uniformly) and draws from that list.
func drawSlicesExact(ix storage.Index, p Params, rng *rand.Rand, sel *Selection) (*Selection, error) {
	L := p.SliceLen
	type start struct {
		t   *storage.Trajectory
		pos int
	}
	var starts []start
	var cum []float64
	sum := 0.0
	for i := range ix.NumTrajectories() {
		t := ix.Trajectory(i)
		if p.StrictLength && t.Len() < L {
			continue
		}
		n := t.Len() - min(L, t.Len()) + 1
		for pos := range n {
			if startOK(ix, p, t, pos) {
				sum += 1 / float64(n)
				starts = append(starts, start{t, pos})
				cum = append(cum, sum)
			}
		}
	}
	if len(starts) == 0 {
		return nil, fmt.Errorf("%w: no slice of %d rows starts at a row with policy_version >= %d", ErrNotReady, L, p.MinPolicyVersion)
	}
	for sel.NumSlices < p.NumSlices {
		s := starts[searchCum(cum, rng.Float64()*sum)]
		appendSlice(sel, s.t, s.pos, min(L, s.t.Len()), L, 0, !p.StrictLength)
	}
	return sel, nil
}

// qualifyingStart draws a start of a slice of t uniformly among those that
// pass MinPolicyVersion, or returns false when none does.
func qualifyingStart(ix storage.Index, p Params, t *storage.Trajectory, l int, rng *rand.Rand) (int, bool) {
	n := t.Len() - l + 1
	if p.MinPolicyVersion <= 0 {
		return rng.IntN(n), true
	}
	var ok []int
	for pos := range n {
		if startOK(ix, p, t, pos) {
			ok = append(ok, pos)
		}
	}
	if len(ok) == 0 {
		return 0, false
	}
	return ok[rng.IntN(len(ok))], true
}

func (s *State) drawSlicesWithoutReplacement(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.epochFor("slice\x00" + p.Consumer)
	if e.finished || e.size != int64(ix.NumTrajectories()) {
		e.number++
		e.trajIDs = e.trajIDs[:0]
		for i := 0; i < ix.NumTrajectories(); i++ {
			e.trajIDs = append(e.trajIDs, ix.Trajectory(i).ID())
		}
		e.perm = perm.New(uint64(len(e.trajIDs)), rng.Uint64())
		e.cursor = 0
		e.size = int64(ix.NumTrajectories())
		e.finished = false
	}
	L := p.SliceLen
	sel := newSliceSelection(p, false)
	sel.HasEpoch, sel.Epoch = true, e.number
	// The next candidates in the permutation, looked up and brought into
	// cache together (see drawSlicesPicksFirst); the loops below take them
	// in the same order, so the draws and the random stream are as if
	// each were looked up when its turn came.
	first := e.cursor
	ts := sel.trajScratch(int(min(uint64(p.NumSlices)+1, e.perm.N()-e.cursor)))
	defer sel.keepTrajScratch(ts)
	for i := range ts {
		ts[i] = ix.ByID(e.trajIDs[e.perm.At(first+uint64(i))])
	}
	ix.PrefetchTrajectories(ts)
	candidate := func(c uint64) *storage.Trajectory {
		if k := c - first; k < uint64(len(ts)) {
			return ts[k]
		}
		return ix.ByID(e.trajIDs[e.perm.At(c)])
	}
	for sel.NumSlices < p.NumSlices && e.cursor < e.perm.N() {
		t := candidate(e.cursor)
		e.cursor++
		if t == nil || (p.StrictLength && t.Len() < L) {
			continue
		}
		l := min(L, t.Len())
		start, ok := qualifyingStart(ix, p, t, l, rng)
		if !ok {
			continue // no slice of it is recent enough: skipped this epoch
		}
		appendSlice(sel, t, start, l, L, 0, !p.StrictLength)
	}
	for e.cursor < e.perm.N() {
		if t := candidate(e.cursor); t != nil && (!p.StrictLength || t.Len() >= L) {
			if _, ok := qualifyingStart(ix, p, t, min(L, t.Len()), rng); ok {
				break
			}
		}
		e.cursor++
	}
	left := e.perm.N() - e.cursor
	if left == 0 || (p.DropLast && left < uint64(p.NumSlices)) {
		e.finished = true
		sel.EpochEnd = true
	}
	if sel.NumSlices == 0 {
		return nil, fmt.Errorf("%w: no trajectory left in epoch %d with %d rows", ErrNotReady, e.number, L)
	}
	if p.DropLast && sel.NumSlices < p.NumSlices {
		return nil, fmt.Errorf("%w: epoch %d ended with a short batch (drop_last)", ErrNotReady, e.number)
	}
	return sel, nil
}

func drawPrioritizedSlices(ix storage.Index, p Params, rng *rand.Rand) (*Selection, error) {
	total := ix.PriorityTotal()
	if !(total > 0) {
		return nil, fmt.Errorf("%w: total priority is 0", ErrNotReady)
	}
	qmin := ix.PriorityMinQ()
	L := p.SliceLen
	sel := newSliceSelection(p, true)
	// validStart gives the slice that would start at seq, if any.
	validStart := func(seq int64) (*storage.Trajectory, int, int, bool) {
		m, ok := ix.Row(seq)
		if !ok {
			return nil, 0, 0, false
		}
		t, pos := ix.Position(m)
		if t == nil {
			return nil, 0, 0, false
		}
		l := min(L, t.Len()-pos)
		if p.StrictLength && l < L {
			return nil, 0, 0, false
		}
		if p.MinPolicyVersion > 0 && m.PolicyVersion < p.MinPolicyVersion {
			return nil, 0, 0, false
		}
		return t, pos, l, true
	}
	for tries := rejectionBudget(p.NumSlices); sel.NumSlices < p.NumSlices && tries > 0; tries-- {
		seq := ix.PriorityFind(rng.Float64() * total)
		if t, pos, l, ok := validStart(seq); ok {
			appendSlice(sel, t, pos, l, L, weight(ix.PriorityQ(seq), qmin, p.Beta), !p.StrictLength)
		}
	}
	if sel.NumSlices == p.NumSlices {
		return sel, nil
	}
	// Few rows can start a slice: list them with their priorities once.
	lo, hi := ix.Window()
	var starts []int64
	var cum []float64
	sum := 0.0
	for seq := lo; seq < hi; seq++ {
		if _, _, _, ok := validStart(seq); ok {
			sum += ix.PriorityQ(seq)
			starts = append(starts, seq)
			cum = append(cum, sum)
		}
	}
	if !(sum > 0) {
		return nil, fmt.Errorf("%w: no live row can start a slice of %d rows", ErrNotReady, L)
	}
	for sel.NumSlices < p.NumSlices {
		seq := starts[searchCum(cum, rng.Float64()*sum)]
		t, pos, l, _ := validStart(seq)
		appendSlice(sel, t, pos, l, L, weight(ix.PriorityQ(seq), qmin, p.Beta), !p.StrictLength)
	}
	return sel, nil
}
