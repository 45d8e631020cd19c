package rbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/sampler"
	"github.com/rbdb/rbd/storage"
	"github.com/rbdb/rbd/transforms"
)

// ErrNotReady is returned when the current data cannot satisfy a sample
// request within its timeout (HTTP 503, "not_ready").
var ErrNotReady = sampler.ErrNotReady

// ErrContention is returned when the rows a sample chose kept being
// overwritten while they were copied (a ring far too small for its write
// rate); retrying usually succeeds.
var ErrContention = errors.New("rbd: sampled rows were overwritten while being copied")

// ErrStopped is returned by a sample that was waiting for data when its
// caller's Stop channel closed (the server shutting down: HTTP 503,
// "shutting_down").
var ErrStopped = storage.ErrStopped

// Tensor is one named array of a batch, little-endian, C order.
type Tensor struct {
	Name  string
	DType storage.DType
	Shape []int
	Data  []byte
}

// Batch is the answer to a sample request.
type Batch struct {
	Tensors []Tensor
	// Metadata carries epoch and epoch_end for without-replacement
	// samplers.
	Metadata map[string]string
	// PolicyAgeMean and PolicyAgeMax say how many policy versions the
	// batch's rows are behind the newest row written to the buffer when
	// they were drawn (0 when writers give no versions).
	PolicyAgeMean float64
	PolicyAgeMax  int64

	pool *bytePool
	bufs []*[]byte
	dims []int // every tensor's Shape is a piece of it
}

// Release hands the batch's memory back for reuse by later samples. The
// batch (its tensors, their data and shapes) must not be used afterwards,
// and Release must be called at most once: the Batch value itself is
// reused by a later sample. Calling it is optional (unreleased batches are
// garbage collected).
func (b *Batch) Release() {
	if b.pool == nil {
		return
	}
	pool := b.pool
	for _, buf := range b.bufs {
		pool.put(buf)
	}
	clear(b.bufs)
	clear(b.Tensors)
	*b = Batch{Tensors: b.Tensors[:0], bufs: b.bufs[:0], dims: b.dims[:0]}
	pool.batches.Put(b)
}

// Tensor returns the named tensor.
func (b *Batch) Tensor(name string) (*Tensor, bool) {
	for i := range b.Tensors {
		if b.Tensors[i].Name == name {
			return &b.Tensors[i], true
		}
	}
	return nil, false
}

// SampleOptions are per-call limits set by the caller (e.g. the server).
type SampleOptions struct {
	// MaxResponseBytes rejects requests whose answer would be larger
	// (0: no limit).
	MaxResponseBytes int64
	// MaxTimeout caps the request's timeout_ms (0: no cap).
	MaxTimeout time.Duration
	// Reserve, when set, is called once per sample with the bytes the
	// answer will take, after the draw and before that memory is taken
	// (the server counts it against its memory budget); its error is
	// returned as is and nothing is allocated.
	Reserve func(bytes int64) error
	// Stop, when closed, ends a sample waiting for data with ErrStopped
	// (a server shutting down answers its waiters at once).
	Stop <-chan struct{}
}

// drawn is a selection resolved against the index: every row's metadata,
// where its next observation comes from, and its n-step window.
type drawn struct {
	sel *sampler.Selection
	// newest is the newest policy version written when the rows were drawn.
	newest  int64
	metas   []storage.RowMeta
	next    []transforms.NextSource
	windows [][]storage.RowMeta // n-step only
	// winRows holds the rows of every window, one array for the batch
	// (windows are slices of it).
	winRows []storage.RowMeta
	// elig and prob are set for return_prob: what the draw was taken over,
	// and each row's probability of being drawn.
	elig *storage.Eligibility
	prob []float64
	// g is set when the rows were copied in the draw's critical section
	// (plan.gatherLocked).
	g *gathered
	// selStore is the selection the sampler fills (sel points to it), kept
	// with its arrays across draws.
	selStore sampler.Selection
}

// Sample draws a batch. It validates the request against the buffer
// (ErrBadRequest, naming the field), waits up to the request's timeout for
// the buffer's rate limiter to admit it (ratelimit.ErrRateLimited after
// that) and for data that can satisfy it (ErrNotReady), gathers the rows
// and derives next observations and n-step returns. A sample that fails
// counts nothing against the rate limit.
//
// The path reads in order: plan (planSample: the request against the
// spec), draw (the sampler picks rows under the index lock, waiting for the
// limiter and for data), gather (copy the rows out: still under the index
// lock for answers of at most gatherLockedMaxBytes, where no row can be
// overwritten; lock-free with stamp checks for larger ones), transform
// (n-step returns) and encode (the answer's tensors). A lock-free gather
// that finds a drawn row overwritten meanwhile draws again, at most 5
// times.
func (b *Buffer) Sample(ctx context.Context, req *SampleRequest, opts *SampleOptions) (_ *Batch, retErr error) {
	var o SampleOptions
	if opts != nil {
		o = *opts
	}
	p, err := b.plan(req, o.MaxResponseBytes)
	if err != nil {
		return nil, fmt.Errorf("sample %q: %w", b.Name(), err)
	}
	sr, _ := b.rngs.Get().(*sampleRNG)
	if sr == nil {
		sr = &sampleRNG{}
		sr.r = rand.New(&sr.pcg)
	}
	defer b.rngs.Put(sr)
	if req.Seed != nil {
		sr.pcg.Seed(*req.Seed, 0x72626473616d706c) // "rbdsampl"
	} else {
		sr.pcg.Seed(rand.Uint64(), rand.Uint64())
	}
	rng := sr.r
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if o.MaxTimeout > 0 {
		timeout = min(timeout, o.MaxTimeout)
	}
	deadline := time.Now().Add(timeout)
	if p.gatherLocked && o.Reserve != nil {
		// The copy happens in the draw's critical section, where waiting
		// for memory is not allowed: take it first.
		if err := o.Reserve(p.answerBytes); err != nil {
			return nil, err
		}
		o.Reserve = nil
	}
	var grant ratelimit.Grant
	defer func() {
		if retErr != nil {
			grant.Refund(grant.Rows())
		}
	}()
	for attempt := 0; ; attempt++ {
		var d *drawn
		grant, d, err = b.draw(ctx, p, rng, deadline, o.Stop, grant)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return nil, err
			}
			return nil, fmt.Errorf("sample %q: %w", b.Name(), err)
		}
		if o.Reserve != nil {
			if err := o.Reserve(p.answerBytes); err != nil {
				return nil, err
			}
			o.Reserve = nil // once: retries reuse the same amount
		}
		g, ok := d.g, d.g != nil
		if !ok {
			g, ok, err = b.gather(p, d, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("sample %q: %w", b.Name(), err)
		}
		if ok {
			transform(p, d, g)
			grant.Refund(int64(p.rows - len(d.sel.Seqs)))
			batch := b.encode(p, d, g)
			b.recycleGathered(g)
			b.recycle(d)
			return batch, nil
		}
		b.recycle(d)
		if attempt >= 4 {
			return nil, fmt.Errorf("sample %q: %w", b.Name(), ErrContention)
		}
	}
}

// sized returns s with length n, reusing its array when it is large
// enough (its contents are then arbitrary).
func sized[T any](s []T, n int) []T { return slices.Grow(s[:0], n)[:n] }

// sampleRNG is a sample's random source, pooled: a rand.Rand over a PCG
// costs two allocations to make, and a PCG is as good as new once seeded.
type sampleRNG struct {
	pcg rand.PCG
	r   *rand.Rand
}

// draw picks the batch's rows: it takes the rate limiter's grant (unless
// held from an earlier attempt), runs the sampler under the index lock and
// resolves the rows' metadata, and waits for writes while the data cannot
// satisfy the request. The limiter counts the rows asked for (padding
// included); the grant is given back while waiting for data, since extends
// admitted against a sample that then fails would leave the counters
// outside the window.
func (b *Buffer) draw(ctx context.Context, p *plan, rng *rand.Rand, deadline time.Time, stop <-chan struct{}, grant ratelimit.Grant) (ratelimit.Grant, *drawn, error) {
	held := grant.Rows() > 0
	for {
		if !held {
			g, err := b.AcquireSamples(ctx, int64(p.rows), deadline, stop)
			if err != nil {
				return grant, nil, err
			}
			grant, held = g, true
		}
		changed := b.Changed()
		var d *drawn
		var drawErr error
		err := b.ReadIndex(func(ix storage.Index) {
			if p.minVersion >= 0 && ix.CountAtLeastVersion(p.minVersion) == 0 {
				drawErr = fmt.Errorf("%w: no live row has policy_version >= %d (the newest written is %d)",
					ErrNotReady, p.minVersion, ix.NewestPolicyVersion())
				return
			}
			d = b.newDrawn()
			params := p.params
			params.Reuse = &d.selStore
			var sel *sampler.Selection
			if sel, drawErr = b.state.Draw(ix, params, rng); drawErr != nil {
				b.recycle(d)
				d = nil
			} else {
				d = p.resolve(ix, sel, d)
				if p.req.ReturnProb {
					d.probabilities(ix, p)
				}
				if p.gatherLocked {
					var ok bool
					if d.g, ok, drawErr = b.gather(p, d, &ix); !ok {
						d.g = nil // a row not indexed: copy again the lock-free way
					}
				}
			}
		})
		if err == nil {
			err = drawErr
		}
		if !errors.Is(err, ErrNotReady) {
			return grant, d, err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return grant, nil, err
		}
		grant.Refund(grant.Rows())
		grant, held = ratelimit.Grant{}, false
		if b.onDataWait != nil {
			b.onDataWait()
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return grant, nil, ctx.Err()
		case <-stop:
			t.Stop()
			return grant, nil, ErrStopped
		}
		t.Stop()
	}
}

// newDrawn takes a drawn from the buffer's pool; resolve sizes it.
func (b *Buffer) newDrawn() *drawn {
	if d, _ := b.drawns.Get().(*drawn); d != nil {
		return d
	}
	return &drawn{}
}

// recycle hands d back to the pool once nothing reads it any more (the
// batch encode made holds copies, never d's slices or its selection). d's
// gathered memory is not touched: the batch owns it, or gather released
// it.
func (b *Buffer) recycle(d *drawn) {
	if d == nil {
		return
	}
	*d = drawn{metas: d.metas[:0], next: d.next[:0], windows: d.windows[:0], winRows: d.winRows[:0], selStore: d.selStore}
	b.drawns.Put(d)
}

// resolve reads, under the index lock, everything the gather needs into d.
func (p *plan) resolve(ix storage.Index, sel *sampler.Selection, d *drawn) *drawn {
	n := len(sel.Seqs)
	d.sel, d.newest = sel, ix.NewestPolicyVersion()
	d.metas, d.next = sized(d.metas, n), sized(d.next, n)
	if p.nstep != nil {
		d.windows = sized(d.windows, n)
		clear(d.windows) // a reused array holds the last draw's windows
		// Room for every window at its longest, so that appending never
		// moves the array under the windows already cut from it.
		d.winRows = slices.Grow(d.winRows[:0], n*p.nstep.N)
	}
	ix.Rows(sel.Seqs, d.metas) // Seq -1 for padding
	for i := range d.metas {
		m := &d.metas[i] // not by value: a RowMeta copy per row
		if p.nstep != nil {
			var w transforms.Window
			var ok bool
			if w, d.winRows, ok = transforms.NStepAppend(ix, *m, p.nstep.N, p.compact, d.winRows); ok {
				d.windows[i] = w.Rows
				d.next[i] = w.Next
				continue
			}
		}
		d.next[i] = transforms.NextOf(*m, p.compact)
	}
	return d
}

// probabilities records, under the index lock of the draw, what the draw
// was taken over and each drawn row's probability: 1/rows for uniform
// draws, q/priority_total for prioritised ones (the samplers' rejection of
// ineligible rows makes exactly these).
func (d *drawn) probabilities(ix storage.Index, p *plan) {
	if p.slices {
		d.sliceProbabilities(ix, p)
		return
	}
	e := ix.Eligibility(p.params.NextKnown)
	d.elig = &e
	d.prob = make([]float64, len(d.sel.Seqs))
	for i, seq := range d.sel.Seqs {
		switch {
		case seq < 0:
		case p.params.Kind == sampler.Prioritized:
			d.prob[i] = ix.PriorityQ(seq) / e.PriorityTotal
		default:
			d.prob[i] = 1 / float64(e.Rows)
		}
	}
}

// sliceProbabilities does what probabilities does for the slice sampler,
// which draws a trajectory uniformly among those it may cut a slice from
// (with strict_length, the ones with slice_len live rows or more; else
// all) and then a start uniformly among that trajectory's: a slice of
// trajectory t has probability 1 / (trajectories * starts(t)). Every row
// of a slice carries it (padding: 0); size is the trajectories.
func (d *drawn) sliceProbabilities(ix storage.Index, p *plan) {
	L := p.params.SliceLen
	trajs := int64(ix.NumTrajectories())
	if p.params.StrictLength {
		trajs = int64(ix.CountAtLeast(L))
	}
	d.elig = &storage.Eligibility{Rows: trajs}
	d.prob = make([]float64, len(d.sel.Seqs))
	for s := 0; s < d.sel.NumSlices; s++ {
		first := d.metas[s*L]
		t, _ := ix.Position(first)
		if t == nil {
			continue
		}
		starts := t.Len() - min(L, t.Len()) + 1
		pr := 1 / (float64(trajs) * float64(starts))
		for i := s * L; i < (s+1)*L; i++ {
			if d.sel.Seqs[i] >= 0 {
				d.prob[i] = pr
			}
		}
	}
}

// gatherAt gathers columns at seqs (-1 = skip) and reports whether every
// requested row was still there: with ix, inside the draw's critical
// section (storage.Index.CopyIndexed); without, lock-free with stamp
// checks (storage.Buffer.Gather).
func (b *Buffer) gatherAt(ix *storage.Index, seqs []int64, cols []storage.Column, dst [][]byte) (bool, error) {
	var missing []int
	var err error
	var ms [64]int // missing rows (next rows of done rows are -1) without an allocation
	if ix != nil {
		missing, err = ix.CopyIndexed(seqs, cols, dst, ms[:0])
	} else {
		missing, err = b.Gather(seqs, cols, dst, nil)
	}
	if err != nil {
		return false, err
	}
	for _, i := range missing {
		if seqs[i] >= 0 {
			return false, nil
		}
	}
	return true, nil
}

// gathered is the drawn rows' bytes, copied out of the buffer into memory
// from the buffer's pool (bufs, handed to the Batch by encode).
type gathered struct {
	bufs []*[]byte
	// stored holds each stored field gathered at its row (the window's
	// last row for n-step's next.* fields).
	stored map[string][]byte
	// recon holds next.<k> rebuilt for each obs key k, and valid whether
	// each row's next observation is known.
	recon map[string][]byte
	valid []bool
	// n-step: every window's rewards in order (rewards), the 1-step
	// reward (origReward), and after nstepReturns the discounted return
	// (nstepReward), steps to the next observation and gamma^k.
	rewards, origReward, nstepReward []byte
	steps                            []int64
	gammas                           []float32

	// Scratch kept across samples (gathered is pooled): a column group's
	// destinations, the next rows' and final observations' seqs.
	dst               [][]byte
	rowSeqs, tailSeqs []int64
	tailPos           []int
	oneCol            [1]storage.Column
	oneDst            [1][]byte
}

// newGathered takes a gathered for n rows from the buffer's pool.
func (b *Buffer) newGathered(n int) *gathered {
	g, _ := b.gathereds.Get().(*gathered)
	if g == nil {
		g = &gathered{stored: map[string][]byte{}, recon: map[string][]byte{}}
	}
	g.valid = sized(g.valid, n)
	clear(g.valid)
	return g
}

// recycleGathered hands g back to the pool once its memory went to a
// batch (encode) or back to the byte pool (release): it keeps only maps
// and scratch arrays, never bytes a batch still reads.
func (b *Buffer) recycleGathered(g *gathered) {
	clear(g.stored)
	clear(g.recon)
	clear(g.bufs)
	*g = gathered{bufs: g.bufs[:0], stored: g.stored, recon: g.recon, valid: g.valid[:0],
		dst:     g.dst[:0],
		rowSeqs: g.rowSeqs[:0], tailSeqs: g.tailSeqs[:0], tailPos: g.tailPos[:0]}
	b.gathereds.Put(g)
}

// gatherOne is gatherAt for one column, without allocating its slices.
func (b *Buffer) gatherOne(g *gathered, ix *storage.Index, seqs []int64, c storage.Column, dst []byte) (bool, error) {
	g.oneCol[0], g.oneDst[0] = c, dst
	ok, err := b.gatherAt(ix, seqs, g.oneCol[:], g.oneDst[:])
	g.oneDst[0] = nil
	return ok, err
}

// alloc takes a buffer from the pool (not zeroed: every byte is written).
func (g *gathered) alloc(b *Buffer, size int) []byte {
	buf := b.pool.get(size)
	g.bufs = append(g.bufs, buf)
	return *buf
}

// release hands a failed attempt's memory back.
func (g *gathered) release(b *Buffer) {
	for _, buf := range g.bufs {
		b.pool.put(buf)
	}
	g.bufs = nil
}

// isNStepNext reports the next.* fields that n-step takes from the
// window's last row (TorchRL's rule): next observations, not the reward
// or the flags, which the n-step transform derives.
func isNStepNext(name string) bool {
	switch name {
	case "next.reward", "next.done", "next.terminated", "next.truncated":
		return false
	}
	return len(name) > 5 && name[:5] == "next."
}

// gather copies the drawn rows out: stored fields, reconstructed next
// observations and n-step windows' rewards. ok is false when a row was
// overwritten meanwhile (the caller draws again); nothing is kept then.
// ix is set when the caller holds the index (see gatherAt).
func (b *Buffer) gather(p *plan, d *drawn, ix *storage.Index) (_ *gathered, ok bool, _ error) {
	sel := d.sel
	n := len(sel.Seqs)
	g := b.newGathered(n)
	defer func() {
		if !ok {
			g.release(b)
			b.recycleGathered(g)
		}
	}()
	// Stored fields. With n-step, the other next.* fields come from the
	// window's last row, so gather those separately.
	lastSeqs := sel.Seqs
	if p.nstep != nil {
		lastSeqs = make([]int64, n)
		for i, w := range d.windows {
			lastSeqs[i] = sel.Seqs[i]
			if len(w) > 0 {
				lastSeqs[i] = w[len(w)-1].Seq
			}
		}
	}
	for k := range 2 {
		cols, seqs := p.atRow, sel.Seqs
		if k == 1 {
			cols, seqs = p.atLast, lastSeqs
		}
		if len(cols) == 0 {
			continue
		}
		g.dst = g.dst[:0]
		for _, c := range cols {
			g.dst = append(g.dst, g.alloc(b, n*c.RowBytes))
		}
		ok, err := b.gatherAt(ix, seqs, cols, g.dst)
		if err != nil || !ok {
			return nil, ok, err
		}
		for i, c := range cols {
			g.stored[c.Name] = g.dst[i]
		}
	}
	clear(g.dst)
	for _, f := range p.flagCols {
		g.stored[f.col.Name] = f.fromMetas(g.alloc(b, n), d.metas)
	}
	if len(p.recon) > 0 {
		if ok, err := b.gatherNext(p, d, g, ix); err != nil || !ok {
			return nil, ok, err
		}
	}
	if p.nstep != nil {
		if ok, err := b.gatherWindows(d, g, ix); err != nil || !ok {
			return nil, ok, err
		}
	}
	return g, true, nil
}

// gatherNext rebuilds next observations: from the next row's observation,
// or from the tail store for the (few) done rows, gathered compactly and
// placed.
func (b *Buffer) gatherNext(p *plan, d *drawn, g *gathered, ix *storage.Index) (bool, error) {
	n := len(d.next)
	g.rowSeqs = sized(g.rowSeqs, n)
	rowSeqs := g.rowSeqs
	for i, s := range d.next {
		rowSeqs[i] = s.Row
		g.valid[i] = s.Known()
		if s.Tail >= 0 {
			g.tailSeqs = append(g.tailSeqs, s.Tail)
			g.tailPos = append(g.tailPos, i)
		}
	}
	tailSeqs, tailPos := g.tailSeqs, g.tailPos
	for i, k := range p.recon {
		obs, _ := b.Column(k)
		tail, _ := b.Column(p.reconNames[i])
		rb := obs.RowBytes
		a := g.alloc(b, n*rb)
		ok, err := b.gatherOne(g, ix, rowSeqs, obs, a)
		if err != nil || !ok {
			return ok, err
		}
		if len(tailSeqs) > 0 {
			tp := b.pool.get(len(tailSeqs) * rb)
			t := *tp
			ok, err = b.gatherOne(g, ix, tailSeqs, tail, t)
			for j, i := range tailPos {
				copy(a[i*rb:(i+1)*rb], t[j*rb:(j+1)*rb])
			}
			b.pool.put(tp)
			if err != nil || !ok {
				return ok, err
			}
		}
		if p.fillNaN {
			for i, s := range d.next {
				if !s.Known() {
					fillNaN(a[i*rb:(i+1)*rb], obs.DType)
				}
			}
		}
		g.recon[k] = a
	}
	return true, nil
}

// gatherWindows copies the rewards of every n-step window and keeps the
// 1-step rewards as next.original_reward.
func (b *Buffer) gatherWindows(d *drawn, g *gathered, ix *storage.Index) (bool, error) {
	rc, _ := b.Column("next.reward")
	flat := make([]int64, 0, len(d.winRows))
	for _, w := range d.windows {
		for _, m := range w {
			flat = append(flat, m.Seq)
		}
	}
	g.rewards = g.alloc(b, len(flat)*rc.RowBytes)
	ok, err := b.gatherAt(ix, flat, []storage.Column{rc}, [][]byte{g.rewards})
	if err != nil || !ok {
		return ok, err
	}
	orig := g.stored["next.reward"]
	if orig == nil {
		orig = g.alloc(b, len(d.sel.Seqs)*rc.RowBytes)
		if ok, err := b.gatherAt(ix, d.sel.Seqs, []storage.Column{rc}, [][]byte{orig}); err != nil || !ok {
			return ok, err
		}
	}
	g.origReward = append(g.alloc(b, len(orig))[:0], orig...)
	g.nstepReward = append(g.alloc(b, len(orig))[:0], orig...)
	return true, nil
}

// transform applies the sample-time transforms that work on gathered
// rows: n-step returns. (Next-state reconstruction is part of the gather,
// which copies each row's next observation from the row after it.)
func transform(p *plan, d *drawn, g *gathered) {
	if p.nstep != nil {
		nstepReturns(p, d, g)
	}
}

// nstepReturns turns the gathered windows into discounted returns, steps to
// the next observation and gamma^k, and sets each row's done flags to its
// window's last step's.
func nstepReturns(p *plan, d *drawn, g *gathered) {
	rc := p.rewardColumn
	n := len(d.sel.Seqs)
	g.steps, g.gammas = make([]int64, n), make([]float32, n)
	j := 0
	rs := make([]float64, 0, p.nstep.N)
	for i, w := range d.windows {
		rs = rs[:0]
		for range w {
			rs = append(rs, readFloat(g.rewards[j*rc.RowBytes:], rc.DType))
			j++
		}
		if len(w) == 0 {
			continue // next unknown: steps 0, gamma 0, the 1-step reward
		}
		ret, gamma := transforms.Discount(rs, p.nstep.Gamma)
		writeFloat(g.nstepReward[i*rc.RowBytes:], rc.DType, ret)
		g.steps[i], g.gammas[i] = int64(len(w)), float32(gamma)
		// Unlike TorchRL, the done flags are those of the window's last
		// step, so r + gamma^k (1 - terminated) V(next) is right when the
		// episode ends inside the window.
		last := w[len(w)-1]
		setFlag(g.stored["next.done"], i, last.Done)
		setFlag(g.stored["next.terminated"], i, last.Terminated)
		setFlag(g.stored["next.truncated"], i, last.Truncated)
	}
	if g.stored["next.reward"] != nil {
		g.stored["next.reward"] = g.nstepReward
	}
}

// encode lays the answer out: the requested keys in order, then seq,
// traj_id, step and the samplers' and transforms' extra tensors, the
// epoch metadata and the policy ages. The batch takes over g's memory.
func (b *Buffer) encode(p *plan, d *drawn, g *gathered) *Batch {
	sel := d.sel
	n := len(sel.Seqs)
	out := b.pool.batch()
	out.Tensors = slices.Grow(out.Tensors, len(p.outKeys)+8)
	alloc := func(size int) []byte { return g.alloc(b, size) }
	// Every tensor's shape is carved from one slice (full slice
	// expressions, so no shape can grow into the next).
	dims := slices.Grow(out.dims, 4*(len(p.outKeys)+8))
	shape := func(row []int) []int {
		start := len(dims)
		if p.slices {
			dims = append(dims, sel.NumSlices, sel.SliceLen)
		} else {
			dims = append(dims, n)
		}
		dims = append(dims, row...)
		return dims[start:len(dims):len(dims)]
	}
	for _, k := range p.outKeys {
		if obs, ok := cutNext(k); ok && g.recon[obs] != nil {
			c, _ := b.Column(obs)
			out.Tensors = append(out.Tensors, Tensor{Name: k, DType: c.DType, Shape: shape(c.Shape), Data: g.recon[obs]})
			continue
		}
		c, _ := b.Column(k)
		out.Tensors = append(out.Tensors, Tensor{Name: k, DType: c.DType, Shape: shape(c.Shape), Data: g.stored[k]})
	}
	// One pass over the rows' metadata for the id tensors and the policy
	// ages (through a pointer: ranging by value copied each RowMeta).
	seqB, trajB, stepB := alloc(8*n), alloc(8*n), alloc(8*n)
	real := 0
	var ageSum int64
	for i := range d.metas {
		m := &d.metas[i]
		binary.LittleEndian.PutUint64(seqB[8*i:], uint64(m.Seq))
		binary.LittleEndian.PutUint64(trajB[8*i:], uint64(m.TrajID))
		binary.LittleEndian.PutUint64(stepB[8*i:], uint64(m.Step))
		if sel.Seqs[i] >= 0 {
			real++
			age := max(0, d.newest-m.PolicyVersion)
			ageSum += age
			out.PolicyAgeMax = max(out.PolicyAgeMax, age)
		}
	}
	out.Tensors = append(out.Tensors,
		Tensor{Name: "seq", DType: storage.Int64, Shape: shape(nil), Data: seqB},
		Tensor{Name: "traj_id", DType: storage.Int64, Shape: shape(nil), Data: trajB},
		Tensor{Name: "step", DType: storage.Int64, Shape: shape(nil), Data: stepB})
	if sel.Weights != nil {
		w := alloc(4 * n)
		for i, v := range sel.Weights {
			binary.LittleEndian.PutUint32(w[4*i:], math.Float32bits(v))
		}
		out.Tensors = append(out.Tensors, Tensor{Name: "weight", DType: storage.Float32, Shape: shape(nil), Data: w})
	}
	if p.slices {
		out.Tensors = append(out.Tensors, Tensor{Name: "slice_end", DType: storage.Bool, Shape: shape(nil), Data: boolBytes(alloc(n), sel.SliceEnd)})
		if sel.Mask != nil {
			out.Tensors = append(out.Tensors, Tensor{Name: "mask", DType: storage.Bool, Shape: shape(nil), Data: boolBytes(alloc(n), sel.Mask)})
		}
	}
	if p.slices || p.req.IncludeIncomplete {
		for _, name := range p.validNames {
			out.Tensors = append(out.Tensors, Tensor{Name: name, DType: storage.Bool, Shape: shape(nil), Data: boolBytes(alloc(n), g.valid)})
		}
	}
	if p.nstep != nil {
		sb, gb := alloc(8*n), alloc(4*n)
		for i := range g.steps {
			binary.LittleEndian.PutUint64(sb[8*i:], uint64(g.steps[i]))
			binary.LittleEndian.PutUint32(gb[4*i:], math.Float32bits(g.gammas[i]))
		}
		out.Tensors = append(out.Tensors,
			Tensor{Name: "steps_to_next_obs", DType: storage.Int64, Shape: shape(nil), Data: sb},
			Tensor{Name: "gamma", DType: storage.Float32, Shape: shape(nil), Data: gb},
			Tensor{Name: "next.original_reward", DType: p.rewardColumn.DType, Shape: shape(nil), Data: g.origReward})
	}
	if sel.HasEpoch {
		out.Metadata = map[string]string{"epoch": strconv.FormatInt(sel.Epoch, 10), "epoch_end": strconv.FormatBool(sel.EpochEnd)}
	}
	if d.prob != nil {
		pb := alloc(8 * n)
		for i, v := range d.prob {
			binary.LittleEndian.PutUint64(pb[8*i:], math.Float64bits(v))
		}
		out.Tensors = append(out.Tensors, Tensor{Name: "prob", DType: storage.Float64, Shape: shape(nil), Data: pb})
		if out.Metadata == nil {
			out.Metadata = map[string]string{}
		}
		out.Metadata["size"] = strconv.FormatInt(d.elig.Rows, 10)
		out.Metadata["priority_total"] = strconv.FormatFloat(d.elig.PriorityTotal, 'g', -1, 64)
		out.Metadata["priority_min"] = strconv.FormatFloat(d.elig.PriorityMin, 'g', -1, 64)
	}
	if real > 0 {
		out.PolicyAgeMean = float64(ageSum) / float64(real)
	}
	b.NoteSampled(real)
	out.bufs = append(out.bufs, g.bufs...)
	clear(g.bufs)
	g.bufs = g.bufs[:0]
	out.dims = dims
	return out
}

func cutNext(k string) (string, bool) {
	if len(k) > 5 && k[:5] == "next." {
		return k[5:], true
	}
	return "", false
}

// flagCol is an episode flag field written from the rows' metadata
// (plan.flagCols).
type flagCol struct {
	col  storage.Column
	flag episodeFlag
}

type episodeFlag int

const (
	flagDone episodeFlag = iota
	flagTerminated
	flagTruncated
)

// flagOf names the episode flag a field holds, if it is one.
func flagOf(name string) (episodeFlag, bool) {
	switch name {
	case "next.done":
		return flagDone, true
	case "next.terminated":
		return flagTerminated, true
	case "next.truncated":
		return flagTruncated, true
	}
	return 0, false
}

// fromMetas fills dst with the flag of each row of metas (0 for padding
// rows, whose metadata says no flag, as a gather zeroes them) and
// returns it.
func (f flagCol) fromMetas(dst []byte, metas []storage.RowMeta) []byte {
	dst = dst[:len(metas)]
	// A loop for each flag, not a switch a row.
	switch f.flag {
	case flagDone:
		for i := range metas {
			dst[i] = b2u(metas[i].Done)
		}
	case flagTerminated:
		for i := range metas {
			dst[i] = b2u(metas[i].Terminated)
		}
	default:
		for i := range metas {
			dst[i] = b2u(metas[i].Truncated)
		}
	}
	return dst
}

func boolBytes(dst []byte, v []bool) []byte {
	for i, x := range v {
		dst[i] = b2u(x)
	}
	return dst
}

func setFlag(col []byte, i int, v bool) {
	if col != nil {
		col[i] = b2u(v)
	}
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func readFloat(b []byte, dt storage.DType) float64 {
	if dt == storage.Float64 {
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
}

func writeFloat(b []byte, dt storage.DType, v float64) {
	if dt == storage.Float64 {
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
		return
	}
	binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
}

// fillNaN writes quiet NaNs of dtype dt over b.
func fillNaN(b []byte, dt storage.DType) {
	switch dt {
	case storage.Float16:
		for i := 0; i+1 < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], 0x7e00)
		}
	case storage.BFloat16:
		for i := 0; i+1 < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], 0x7fc0)
		}
	case storage.Float32:
		for i := 0; i+3 < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(math.NaN())))
		}
	case storage.Float64:
		for i := 0; i+7 < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], math.Float64bits(math.NaN()))
		}
	}
}
