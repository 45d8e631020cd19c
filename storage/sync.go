package storage

import (
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
)

// syncState coordinates group commits: one goroutine syncs the files while
// extends that arrive meanwhile wait and are covered by the next sync.
type syncState struct {
	mu      sync.Mutex
	cond    *sync.Cond
	durable int64 // every written row with a smaller seq is on stable storage
	syncing bool
	rounds  int64 // syncFiles calls: what an idle buffer must not make
	// written is the largest watermark a sync began to write to disk,
	// whether or not the sync then succeeded (durable moves only when it
	// does): what a power loss may find, which a lap reservation must
	// not pass (lapFloor).
	written atomic.Int64
}

func (s *syncState) init() { s.cond = sync.NewCond(&s.mu) }

// Durable returns the durable watermark: every row written with a smaller
// seq is on stable storage.
func (b *Buffer) Durable() int64 {
	b.sync.mu.Lock()
	defer b.sync.mu.Unlock()
	return b.sync.durable
}

// syncTo returns once every row below target is durable, syncing the files
// itself or waiting for a sync in flight (group commit).
func (b *Buffer) syncTo(target int64) error {
	if !b.persistent {
		return nil
	}
	s := &b.sync
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.durable < target {
		if s.syncing {
			s.cond.Wait()
			continue
		}
		s.syncing = true
		goal := b.writeCount.Load()
		s.mu.Unlock()
		b.store.crash.at("before-sync")
		goal, err := b.syncFiles(goal)
		b.store.crash.at("after-sync")
		s.mu.Lock()
		s.rounds++
		s.syncing = false
		s.cond.Broadcast()
		if err != nil {
			return err
		}
		s.durable = max(s.durable, goal)
	}
	return nil
}

// syncFiles makes every row below goal durable, then records goal as the
// watermark, and returns it. Rows go first: a watermark must never claim
// rows the disk does not hold. A version 3 buffer syncs the write count
// it captures with its tip under the writer's lock instead, which is at
// least goal.
func (b *Buffer) syncFiles(goal int64) (_ int64, err error) {
	// Recovered here, not by the caller: syncTo drops its lock around
	// this call, and a panic through it would unlock twice.
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	if h := b.store.hooks.beforeSync; h != nil {
		if err := h(b.name); err != nil {
			return 0, err
		}
	}
	if b.blk != nil {
		return b.syncBlocks()
	}
	var errs []error
	var sealed int64
	if b.cs != nil {
		// Chunk records before row records: a durable row needs both.
		sealed = b.cs.sealed.Load()
		errs = append(errs, b.cs.syncSegments())
	}
	if b.rlog != nil {
		// Run records before row records, as chunks.
		errs = append(errs, b.rlog.sync())
	}
	for _, c := range b.allColumns() {
		errs = append(errs, c.region.Sync())
	}
	errs = append(errs, b.meta.Sync())
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	b.sync.raiseWritten(goal)
	if cur, ok := readWatermark(b.hdr); !ok || cur != goal {
		// One write, not two stores into the mapping: a writer killed
		// between storing the seq and its checksum left the block torn
		// (recovery fell back to the catalog's count, and verify called
		// it damage).
		if _, err := b.meta.WriteAt(watermarkBlock(goal), watermarkOff); err != nil {
			return 0, fmt.Errorf("write the durable watermark: %w", err)
		}
		if err := b.meta.SyncRange(0, headerSize); err != nil {
			return 0, err
		}
	}
	if h := b.store.hooks.afterWatermark; h != nil {
		if err := h(b.name); err != nil {
			return 0, err
		}
	}
	if b.rlog != nil {
		// Rows below goal-capacity are now durably overwritten.
		if err := b.rlog.collect(goal - b.capacity); err != nil {
			return 0, err
		}
	}
	if b.cs != nil {
		// Everything below goal-capacity is now durably overwritten and
		// every seal counted before the sync is on disk.
		return goal, b.cs.collect(goal-b.capacity, sealed)
	}
	return goal, nil
}

// syncBlocks is syncFiles for a version 3 buffer (format-v3.md, "Syncs"):
// the write count and the tip captured under the writer's lock; the run
// segments, columns and tail files made durable, then rows.meta (the
// block records extends wrote), and only then the watermark record. It
// writes no block record.
func (b *Buffer) syncBlocks() (int64, error) {
	b.wmu.Lock()
	wr, err := b.tipLocked()
	b.wmu.Unlock()
	if err != nil {
		return 0, err
	}
	errs := []error{b.rlog.sync()}
	for _, c := range b.allColumns() {
		errs = append(errs, c.region.Sync())
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if err := b.meta.Sync(); err != nil {
		return 0, err
	}
	b.sync.raiseWritten(wr.Seq)
	if err := b.writeWatermarkRecord(wr); err != nil {
		return 0, err
	}
	if h := b.store.hooks.afterWatermark; h != nil {
		if err := h(b.name); err != nil {
			return 0, err
		}
	}
	return wr.Seq, b.rlog.collect(wr.Seq - b.capacity)
}

// state is the catalog-side state of the buffer as of now.
func (b *Buffer) state(clean bool) bufferState {
	maxPrio := 0.0
	if b.prio != nil {
		b.imu.RLock()
		maxPrio = b.prio.max
		b.imu.RUnlock()
	}
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	return bufferState{
		UID:         b.uid,
		WriteCount:  b.writeCount.Load(),
		SeqReserved: max(b.seqRes.Load(), b.seqResNext.Load()),
		Clean:       clean,
		MaxPriority: maxPrio,
		Holes:       append([][2]int64(nil), b.holes...),
		CreatedAt:   b.createdAt,
	}
}

// seqBlock is how many seqs one catalog commit reserves. For persistent
// buffers it is also the most a power loss can move the ring forward on
// reopen (the unused part of the reservation becomes holes, and as many
// of the oldest rows leave the window, for flush and none buffers): a
// sixteenth of the ring trades that loss against one catalog commit per
// block. A crash of the process alone moves no memmap ring
// (witness.go). See seqBlockTo for the blocks of a lap.
func (b *Buffer) seqBlock() int64 {
	if !b.persistent {
		return lapBlock(b.capacity)
	}
	// Small rings would commit too often at capacity/16; they reserve up
	// to half the ring (at most 4096) at a time instead.
	return max(b.capacity/16, min(b.capacity/2, 4096), 1)
}

// lapBlock is the reservation block of buffers that lose their rows with
// the process anyway (memory buffers): a lap, at least 65536 seqs.
func lapBlock(capacity int64) int64 { return max(capacity, 1<<16) }

// seqBlockTo is how far past end a reservation for a writer reaching end
// reaches. A none or flush memmap buffer whose window at end holds no row
// a sync made durable (it writes a lap past its durable watermark, which
// a close or a checkpoint raises: for a flush buffer the one every
// checkpoint interval, for a none buffer only an explicit one; or nothing
// was ever synced: a new buffer fills its first lap so) has nothing a
// power loss must keep: it reserves a lap at a time, as memory buffers
// do, a catalog commit (two fdatasyncs) per capacity rows instead of per
// sixteenth, which at 10^5 rows cost none writers a third of their time
// and flush writers 40% more than none ones (docs/performance.md). Until
// then a power loss keeps the window's synced rows but for the block it
// moves the ring (cutLapReservation lowers a lap reservation again
// before a sync raises the watermark).
func (b *Buffer) seqBlockTo(end int64) int64 {
	if b.lapsAhead() && b.lapsHeld.Load() == 0 && max(0, end-b.capacity) >= b.lapFloor() {
		return lapBlock(b.capacity)
	}
	return b.seqBlock()
}

// lapFloor is the watermark a lap reservation must be a lap past: the
// durable one, or a larger one a sync that failed afterwards (collecting
// its segments, say) may have written to disk all the same.
func (b *Buffer) lapFloor() int64 { return max(b.Durable(), b.sync.written.Load()) }

// raiseWritten records that a sync is about to write watermark w.
func (s *syncState) raiseWritten(w int64) {
	for {
		cur := s.written.Load()
		if w <= cur || s.written.CompareAndSwap(cur, w) {
			return
		}
	}
}

// cutLapReservation prepares a sync of a none or flush buffer, which
// makes the rows of its window durable: no lap reservation is taken until the
// returned func runs (seqBlockTo), and one the buffer holds is cut back
// to a block past the write count and committed first, so that a power
// loss after the sync and before the next commit finds no lap in the
// catalog to resume at. Writers wait on wmu meanwhile, so none is past
// the cut; a reservation ahead checks again under catMu before it
// commits. Other buffers: nothing to do.
func (b *Buffer) cutLapReservation() (func(), error) {
	if !b.lapsAhead() || b.store.readOnly {
		return func() {}, nil
	}
	b.lapsHeld.Add(1)
	release := func() { b.lapsHeld.Add(-1) }
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.catMu.Lock()
	defer b.catMu.Unlock()
	lim := b.roundReservation(b.writeCount.Load() + b.seqBlock())
	if b.seqRes.Load() <= lim && b.committed != nil && b.committed.SeqReserved <= lim {
		return release, nil
	}
	// What the catalog holds, not only memory: a cut whose commit failed
	// lowered memory and left the lap in the catalog (b.committed nil:
	// unknown), and a sync must not follow it until a commit lands.
	// Lower in memory even if the commit fails: the catalog's higher
	// reservation still bounds every seq below it.
	b.seqRes.Store(min(b.seqRes.Load(), lim))
	if _, err := b.commitStateLocked(false, nil, false, false); err != nil {
		release()
		return nil, fmt.Errorf("cut the seq reservation back: %w", err)
	}
	return release, nil
}

// resumedReservation is the seq reservation an open resumes with once
// recovery has put the write count wc past every seq ever handed out
// (after a clean close, a crash of the process alone, or a jump to the
// reservation). A none or flush buffer's lap reservation, which a clean
// close keeps, is cut back to a block past wc: until the writer has written a
// lap, the window holds the rows the close synced (seqBlockTo).
func (b *Buffer) resumedReservation(st bufferState, wc int64) int64 {
	if b.lapsAhead() && b.store.snapAt.IsZero() {
		return max(wc, min(st.SeqReserved, b.roundReservation(wc+b.seqBlock())))
	}
	return max(st.SeqReserved, wc)
}

// lapsAhead reports whether the buffer may reserve seqs a lap ahead once
// its window holds no synced row (seqBlockTo): memmap buffers whose every
// sync goes through checkpoint or close, which cut a lap reservation
// first (fsync buffers sync in their extends).
func (b *Buffer) lapsAhead() bool {
	return b.spec.Storage == KindMemmap && (b.spec.Durability == DurabilityNone || b.spec.Durability == DurabilityFlush)
}

// reserveSeqs commits a new seq reservation that covers end, unless one
// that landed meanwhile (reserveAhead) does. Called with wmu held.
func (b *Buffer) reserveSeqs(end int64) error {
	b.catMu.Lock()
	defer b.catMu.Unlock()
	if end <= b.seqRes.Load() {
		return nil
	}
	old := b.seqRes.Load()
	b.seqRes.Store(b.roundReservation(end + b.seqBlockTo(end)))
	if _, err := b.commitStateLocked(false, nil, false, false); err != nil {
		b.seqRes.Store(old)
		return fmt.Errorf("reserve seqs: %w", err)
	}
	return nil
}

// maybeReserveAhead starts a reservation of the next block of seqs in the
// background once a writer has used half of the current one, so that
// writers do not wait for the catalog commit (an fsync; milliseconds on a
// real disk) every seqBlock seqs. The new reservation reaches seqBlock
// beyond end, as a synchronous one would: a crash moves the ring forward
// no further than before. A writer that runs out before it lands commits
// one itself (reserveSeqs), after it. Called with wmu held.
func (b *Buffer) maybeReserveAhead(end int64) {
	left := b.seqRes.Load() - end
	if left >= b.seqBlock()/2 && (!b.lapsAhead() || left >= lapBlock(b.capacity)/2) {
		return // the common case, without the watermark's lock
	}
	block := b.seqBlockTo(end)
	if left >= block/2 || !b.reservingAhead.CompareAndSwap(false, true) {
		return
	}
	go b.reserveAhead(end, b.roundReservation(end+block))
}

// reserveAhead commits a reservation up to target (see maybeReserveAhead).
// A failure is not reported here: the writer that needs the seqs commits
// its own reservation and reports what fails then.
func (b *Buffer) reserveAhead(end, target int64) {
	defer b.reservingAhead.Store(false)
	// Its own enter: Close and Delete wait for the commit, or it sees them
	// and does nothing. (The writer that started it may have left.)
	if b.enter() != nil {
		return
	}
	defer b.leave()
	b.catMu.Lock()
	defer b.catMu.Unlock()
	if target <= b.seqRes.Load() {
		return
	}
	if b.roundReservation(end+b.seqBlockTo(end)) < target {
		// A checkpoint raised the durable watermark since, or is making
		// rows durable: a lap block would let a power loss take them.
		return
	}
	b.seqResNext.Store(target)
	if _, err := b.commitStateLocked(false, nil, false, false); err == nil {
		b.seqRes.Store(target) // durable: writers may hand these out
	}
	b.seqResNext.Store(0)
}

// commitState writes the buffer's state to the catalog. catMu makes the
// snapshot and the commit one step, so a slow checkpoint can never write
// back an older seq reservation over a newer one.
func (b *Buffer) commitState(clean bool, streams map[string]map[int64]streamPos, setStreams bool) error {
	b.catMu.Lock()
	defer b.catMu.Unlock()
	_, err := b.commitStateLocked(clean, streams, setStreams, false)
	return err
}

// commitStateLocked commits the state unless onlyIfChanged and it equals
// the last one committed (an idle buffer costs no catalog transaction),
// and reports whether it committed. Called with catMu held.
func (b *Buffer) commitStateLocked(clean bool, streams map[string]map[int64]streamPos, setStreams, onlyIfChanged bool) (bool, error) {
	st := b.state(clean)
	if clean {
		st.SeqReserved = max(st.SeqReserved, st.WriteCount)
	}
	if onlyIfChanged && !setStreams && b.committed != nil && sameState(*b.committed, st) {
		return false, nil
	}
	var err error
	if h := b.store.hooks.putState; h != nil {
		err = h(b.name)
	}
	if err == nil {
		err = b.store.cat.putState(b.name, st, streams, setStreams)
	}
	if err != nil {
		b.committed = nil // unknown: commit again next time
		return false, err
	}
	b.committed = &st
	b.store.stateChanged.Store(true)
	return true, nil
}

func sameState(a, b bufferState) bool {
	return a.UID == b.UID && a.WriteCount == b.WriteCount && a.SeqReserved == b.SeqReserved &&
		a.Clean == b.Clean && a.MaxPriority == b.MaxPriority && a.CreatedAt.Equal(b.CreatedAt) &&
		slices.Equal(a.Holes, b.Holes)
}

// checkpoint makes the buffer's rows durable and commits its counters.
func (b *Buffer) checkpoint() error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.leave()
	if b.store.readOnly {
		return nil
	}
	release, err := b.cutLapReservation()
	if err != nil {
		return fmt.Errorf("checkpoint %q: %w", b.name, err)
	}
	defer release()
	if err := b.syncTo(b.writeCount.Load()); err != nil {
		return fmt.Errorf("checkpoint %q: %w", b.name, err)
	}
	b.pruneHoles()
	b.store.crash.at("before-commit")
	b.catMu.Lock()
	_, err = b.commitStateLocked(false, nil, false, true)
	b.catMu.Unlock()
	if err != nil {
		return fmt.Errorf("checkpoint %q: %w", b.name, err)
	}
	return nil
}

// pruneHoles forgets holes that have left the ring.
func (b *Buffer) pruneHoles() {
	lo := b.writeCount.Load() - b.capacity
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	kept := b.holes[:0]
	for _, h := range b.holes {
		if h[1] > lo {
			kept = append(kept, h)
		}
	}
	b.holes = kept
}

// close syncs everything, saves the streams' open trajectories and unmaps.
func (b *Buffer) close() error {
	b.closed.Store(true)
	b.limiter.Close(fmt.Errorf("buffer %q: %w", b.name, ErrClosed))
	b.life.Lock()
	defer b.life.Unlock()
	if b.store.readOnly {
		return b.unmap()
	}
	var errs []error
	failed := false
	if b.blk != nil {
		// A version 3 buffer after a fault writes no watermark record
		// and stays unclean: the faulting extend may have left a block's
		// running checksum half updated, which the next open recovers
		// from the files.
		b.wmu.Lock()
		failed = b.blk.faulted || b.failed.Load() != nil
		b.wmu.Unlock()
	}
	if b.persistent && !failed {
		// No sync without the cut: a power loss after it would find the
		// catalog's lap and drop every row the sync made durable.
		if release, err := b.cutLapReservation(); err != nil {
			errs = append(errs, err)
		} else {
			defer release()
			if _, err := b.syncFiles(b.writeCount.Load()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	b.pruneHoles()
	clean := b.persistent && len(errs) == 0 && !failed
	streams := map[string]map[int64]streamPos{}
	if clean {
		b.wmu.Lock()
		for name, envs := range b.streams {
			m := make(map[int64]streamPos, len(envs))
			for e, pos := range envs {
				m[e] = *pos
			}
			streams[name] = m
		}
		b.wmu.Unlock()
	}
	errs = append(errs, b.commitState(clean, streams, true))
	errs = append(errs, b.unmap())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close buffer %q: %w", b.name, err)
	}
	return nil
}
