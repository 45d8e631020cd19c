package storage

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Store. The zero value (or nil) gives the defaults.
type Options struct {
	// LockTimeout bounds the wait for the data dir's lock, held by any other
	// process that has it open. Zero means 1s. (bbolt itself would wait
	// forever on zero; rbd never passes zero through.)
	LockTimeout time.Duration
	// CheckpointInterval is how often flush-mode buffers are synced to disk
	// and their counters committed to the catalog. Zero means 1s.
	CheckpointInterval time.Duration
	// ReadOnly opens the data dir without changing anything: recovery runs
	// in memory only and every write fails with ErrReadOnly.
	ReadOnly bool
	// Logger receives operational events. Nil discards them.
	Logger *slog.Logger
	// MemoryLimit bounds what all buffers together may hold in memory once
	// full (rows of memory buffers, per-row structures of every kind; see
	// Store.MemoryUse): a create past it fails with ErrInsufficientMemory.
	// Zero means three quarters of the machine's memory or of the
	// process's cgroup limit, whichever is smaller; negative means no
	// limit.
	MemoryLimit int64
	// MaxBuffers bounds the buffers of the data dir (a create past it is
	// ErrTooManyBuffers). Zero means 1024.
	MaxBuffers int
	// MaxStreams bounds, per buffer, the streams that hold an open
	// trajectory (an extend that would add one past it is
	// ErrTooManyStreams). Zero means 65536.
	MaxStreams int
	// StreamIdleTimeout closes a stream that has not extended for this
	// long, as DELETE .../streams/{stream} would: its open trajectories
	// end (as truncated) and its state is forgotten; when it returns it
	// starts new trajectories. Zero means 1 hour; negative means never.
	StreamIdleTimeout time.Duration

	// afterSnapshotRead, for tests, runs when a read-only open has read
	// the catalog snapshot of a running store, before it reads the files.
	afterSnapshotRead func()
}

func (o *Options) maxBuffers() int { return cmp.Or(max(o.MaxBuffers, 0), 1024) }

func (o *Options) maxStreams() int { return cmp.Or(max(o.MaxStreams, 0), 65536) }

func (o *Options) streamIdle() time.Duration {
	if o.StreamIdleTimeout == 0 {
		return time.Hour
	}
	return o.StreamIdleTimeout
}

func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = time.Second
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// trajIDBlock is how many trajectory ids are reserved in the catalog at a
// time: ids are never reused, and one catalog commit per block keeps the
// cost of that promise small.
const trajIDBlock = 4096

// Store is an open data dir: a catalog and the buffers it lists.
type Store struct {
	dir      string
	opts     Options
	log      *slog.Logger
	cat      *catalog
	readOnly bool
	crash    *crasher  // nil unless RBD_CRASH_AT is set
	snapAt   time.Time // set when opened read-only from a running store's snapshot
	// boot is the running kernel's boot id (seq witnesses name it).
	boot string

	mu      sync.Mutex // guards buffers and closed
	buffers map[string]*Buffer
	closed  bool

	traj struct {
		sync.Mutex
		next     int64 // next trajectory id to hand out
		reserved int64 // ids below this are reserved in the catalog
	}

	stop chan struct{}
	done chan struct{}
	// trash empties <data>/trash in the background (see delete.go).
	trash trashWorker
	hooks storeHooks // tests make delete steps fail, or write during checkpoints
	// slotTails, set by tests, gives new memmap buffers tail files of
	// format version 1 (a final observation at its row's slot, sparse for
	// rows of a page or more), as builds before dense tail files made
	// them: stores keep opening those.
	slotTails bool
	// snapMu orders snapshot writes; snapSeq numbers them; instance
	// names this open of a writable store in them.
	snapMu     sync.Mutex
	snapSeq    uint64
	snapFailed bool // the last publish failed
	instance   string
	// restored lists the memory buffers loaded from checkpoint files at
	// open; the files go once the catalog has recorded the load.
	restored []string
	// stateChanged is set by every catalog commit of a buffer's state; the
	// checkpoint loop publishes the snapshot only when it is set, so idle
	// buffers cost no disk write.
	stateChanged atomic.Bool
}

// Open opens (creating if needed) the data dir. It recovers every buffer
// from its files: rows a crash left half-written are dropped, links and the
// trajectory index are rebuilt, and open trajectories are continued only
// after a clean close.
func Open(dir string, opts *Options) (*Store, error) {
	return readSettled(func() (*Store, error) { return openOnce(dir, opts) })
}

func openOnce(dir string, opts *Options) (_ *Store, retErr error) {
	o := opts.withDefaults()
	if err := checkComplete(dir); err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	s := &Store{dir: dir, opts: o, log: o.Logger, readOnly: o.ReadOnly, buffers: map[string]*Buffer{}, crash: newCrasher(), boot: currentBoot()}
	if !o.ReadOnly {
		if err := os.MkdirAll(filepath.Join(dir, "buffers"), 0o755); err != nil {
			return nil, fmt.Errorf("open %s: %w", dir, err)
		}
	} else if _, err := os.Stat(filepath.Join(dir, "catalog.db")); err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	var entries []catalogEntry
	var next int64
	var snap *snapshot
	if o.ReadOnly {
		cat, es, sn, err := readOnlyEntries(dir, o.LockTimeout)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dir, err)
		}
		s.cat, entries, snap = cat, es, sn
		if snap != nil {
			s.snapAt = snap.WrittenAt
			if o.afterSnapshotRead != nil {
				o.afterSnapshotRead()
			}
		}
	} else {
		s.instance = rand.Text()
		cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, o.LockTimeout)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dir, err)
		}
		s.cat = cat
		if entries, err = cat.entries(); err != nil {
			return nil, errors.Join(fmt.Errorf("open %s: %w", dir, err), cat.close())
		}
	}
	defer func() {
		if retErr != nil && snap != nil && !errors.Is(retErr, errStoreRestarted) && restartedSince(dir, snap.Instance) {
			// A buffer that failed to open may have been caught
			// between a restarted store's writes: read again.
			retErr = fmt.Errorf("open %s: %w (tried %d times; last: %w)", dir, errStoreRestarted, snapshotTries, retErr)
		}
		if retErr != nil {
			for _, b := range s.buffers {
				retErr = errors.Join(retErr, b.unmap())
			}
			if s.cat != nil {
				retErr = errors.Join(retErr, s.cat.close())
			}
		}
	}()
	if s.cat != nil {
		var err error
		if next, err = s.cat.trajNext(); err != nil {
			return nil, fmt.Errorf("open %s: %w", dir, err)
		}
	}
	for _, e := range entries {
		b, maxTraj, err := s.openBuffer(e)
		if err != nil {
			return nil, fmt.Errorf("open %s: buffer %q: %w", dir, e.name, err)
		}
		// The limiter's counters restart at the window's centre (or
		// mid-fill): restored counters deadlocked Reverb's users.
		b.limiter.Set(b.spec.RateLimit, b.liveRows())
		b.snapRateLimit = e.rateLimit
		s.buffers[e.name] = b
		next = max(next, maxTraj+1)
	}
	if snap != nil && restartedSince(dir, snap.Instance) {
		return nil, fmt.Errorf("open %s: %w (tried %d times)", dir, errStoreRestarted, snapshotTries)
	}
	s.traj.next, s.traj.reserved = next, next
	if !o.ReadOnly {
		if err := s.commitRecovery(); err != nil {
			return nil, fmt.Errorf("open %s: %w", dir, err)
		}
		s.dropRestoredFiles()
		s.dropOrphanWitnesses()
		removeSnapshotTemps(dir, s.log)
		s.publishFirstSnapshot()
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.checkpointLoop()
		s.startTrash()
	}
	return s, nil
}

func (s *Store) openBuffer(e catalogEntry) (*Buffer, int64, error) {
	if err := e.spec.Validate(); err != nil {
		return nil, 0, corruptf(s.cat.path, -1, "stored spec is invalid: %v", err)
	}
	// A memory buffer with checkpoint files is restored from them.
	restore := e.spec.Storage == KindMemory && fileExists(metaFile(bufferDir(s.dir, e.name)))
	b, err := newBuffer(s, e.name, e.spec, e.state.UID, ringSlotCount(e.spec, restore))
	if err != nil {
		return nil, 0, err
	}
	b.createdAt = e.state.CreatedAt
	if b.prio != nil && e.state.MaxPriority > 0 {
		b.prio.max = e.state.MaxPriority
	}
	if restore {
		return s.restoreMemory(b, e)
	}
	if !b.persistent {
		if err := b.mapMemory(); err != nil {
			return nil, 0, err
		}
		// The rows are gone; seqs continue past every one ever reserved
		// (read next to a running server, its last checkpoint's count).
		wc := max(e.state.WriteCount, e.state.SeqReserved)
		if !s.snapAt.IsZero() {
			wc = e.state.WriteCount
		}
		b.setWriteCount(wc)
		b.seqRes.Store(wc)
		b.sync.durable = wc
		return b, -1, nil
	}
	if e.spec.Storage == KindMemmap {
		if err := s.openBlocksUpgradeState(b); err != nil {
			return nil, 0, errors.Join(err, b.unmap())
		}
	}
	if !fileExists(b.dir) {
		s.restoreFromTrash(b)
	}
	if err := b.openFiles(!s.readOnly); err != nil {
		return nil, 0, err
	}
	if e.spec.Storage == KindMemmap && s.snapAt.IsZero() {
		b.witnessEnd, b.witnessed = readWitness(defaultWitnessDir, b.witnessKey(), b.uid, s.boot)
	}
	maxTraj, err := b.recover(e.state, e.streams)
	if err == nil && e.spec.Storage == KindMemmap && !s.readOnly {
		b.startWitness(b.writeCount.Load())
	}
	if err != nil {
		return nil, 0, errors.Join(err, b.unmap())
	}
	return b, maxTraj, nil
}

// commitRecovery records in the catalog that every buffer is open: Clean
// stays false until the next clean close, so a crash before then is
// detected, and the saved streams are consumed.
func (s *Store) commitRecovery() error {
	for _, b := range s.buffers {
		if err := b.commitState(false, nil, true); err != nil {
			return err
		}
	}
	return nil
}

// Dir returns the data dir.
func (s *Store) Dir() string { return s.dir }

// ValidateBufferName reports whether name can name a buffer. Names become
// directory names, so the rule keeps every path inside the data dir. It
// runs on every request that names a buffer, so it is a loop over the
// bytes rather than a regular expression (which cost 0.5 µs a request).
func ValidateBufferName(name string) error {
	if !validBufferName(name) {
		return fmt.Errorf("%w: %q must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ and not contain \"..\"", ErrInvalidName, name)
	}
	return nil
}

// validBufferName: 1 to 64 bytes of [A-Za-z0-9_.-], the first a letter or
// digit, no "..".
func validBufferName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '-'):
		case i > 0 && c == '.':
			if name[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// smallBlocksRing is the capacity below which a new memmap buffer that
// leaves row_meta out gets version 2: an open after a power loss (or a
// crash with no seq witness) leaves the block being filled, evicting up to 63 of the oldest rows (blockRows -
// 1), 6% of a ring of this size, every row of one under 64.
const smallBlocksRing = 1024

// defaultMemmapRowMeta is the row_meta a new memmap buffer of spec gets
// when it leaves it out: RowMetaBlocks (format version 3), except for an
// fsync buffer or a ring under smallBlocksRing rows, which get
// RowMetaRuns (version 2): version 3's open after a power loss evicts up to 63
// of the oldest rows as it leaves the block being filled, where version 2
// keeps every row an fsync writer acknowledged (and a flush or none ring
// loses no more than its seq reservation after a power loss, at most
// capacity/16 or capacity/2 of the oldest synced rows, which small rings
// already pay; after a kill of the process alone, nothing).
func defaultMemmapRowMeta(spec Spec) RowMetaLayout {
	if spec.Durability == DurabilityFsync || spec.Capacity < smallBlocksRing {
		return RowMetaRuns
	}
	return RowMetaBlocks
}

// CreateBuffer creates a buffer, or returns the existing one (created =
// false) when its spec is identical after defaults. A different spec under
// the same name is ErrSpecConflict. A memmap spec that leaves RowMetaLayout
// out creates a buffer with RowMetaBlocks, or RowMetaRuns for an fsync
// buffer or a ring under 1,024 rows (defaultMemmapRowMeta; the buffer's
// Spec says which); asked
// of an existing buffer, a spec that leaves it out matches the layout the
// buffer has.
func (s *Store) CreateBuffer(name string, spec Spec) (b *Buffer, created bool, err error) {
	if err := ValidateBufferName(name); err != nil {
		return nil, false, err
	}
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return nil, false, fmt.Errorf("create buffer %q: %w", name, err)
	}
	if s.readOnly {
		return nil, false, fmt.Errorf("create buffer %q: %w", name, ErrReadOnly)
	}
	b, created, err = s.createLocked(name, spec)
	if created {
		s.publishSnapshot()
	}
	return b, created, err
}

func (s *Store) createLocked(name string, spec Spec) (b *Buffer, created bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, ErrClosed
	}
	if old, ok := s.buffers[name]; ok {
		if spec.RowMetaLayout == "" {
			// Left out, row_meta asks for what a new buffer would get;
			// an existing buffer keeps the layout it was made with
			// (buffers made before memmap's default changed keep "row").
			spec.RowMetaLayout = cmp.Or(old.spec.RowMetaLayout, RowMetaPerRow)
		}
		if old.spec.Equal(spec) {
			return old, false, nil
		}
		return nil, false, fmt.Errorf("create buffer %q: %w", name, ErrSpecConflict)
	}
	if spec.RowMetaLayout == "" && spec.Storage == KindMemmap {
		// New memmap buffers keep rows.meta in format version 3: no
		// record a row, block checksums (RowMetaBlocks says what it
		// costs). The spec in the catalog says so, so that the buffer
		// opens in its layout whatever a later build's default is.
		spec.RowMetaLayout = defaultMemmapRowMeta(spec)
	}
	// policy_version is a column rbd adds; buffers created before it
	// existed may keep a field of that name (and extends then fill that
	// field), new ones may not.
	if _, ok := spec.Field(ReservedNewField); ok {
		return nil, false, fmt.Errorf("create buffer %q: %w", name,
			&SpecError{Path: specFieldPath(ReservedNewField), Msg: fmt.Sprintf("field name %q is reserved for the version of the policy that produced each row", ReservedNewField)})
	}
	for _, k := range ReservedNewSampleKeys {
		if _, ok := spec.Field(k); ok {
			return nil, false, fmt.Errorf("create buffer %q: %w", name,
				&SpecError{Path: specFieldPath(k), Msg: fmt.Sprintf("field name %q is reserved for a key sample answers add (return_prob, sharded clients)", k)})
		}
	}
	if len(s.buffers) >= s.opts.maxBuffers() {
		return nil, false, fmt.Errorf("create buffer %q: %d buffers are open, the most allowed: %w (delete one, or raise the limit)", name, len(s.buffers), ErrTooManyBuffers)
	}
	if err := s.checkFilesLocked(name, spec); err != nil {
		return nil, false, err
	}
	if err := s.checkMemoryLocked(name, spec); err != nil {
		return nil, false, err
	}
	if err := s.checkDiskLocked(name, spec); err != nil {
		return nil, false, err
	}
	var u [8]byte
	if _, err := rand.Read(u[:]); err != nil {
		return nil, false, err
	}
	b, err = newBuffer(s, name, spec, binary.LittleEndian.Uint64(u[:]), ringSlotCount(spec, false))
	if err != nil {
		return nil, false, fmt.Errorf("create buffer %q: %w", name, err)
	}
	b.createdAt = time.Now().UTC()
	if b.persistent {
		err = b.createFiles()
	} else {
		err = b.mapMemory()
	}
	if err == nil && spec.Storage == KindMemmap {
		b.startWitness(0)
	}
	if err != nil {
		return nil, false, s.asNoSpace(fmt.Sprintf("create buffer %q", name), fmt.Errorf("create buffer %q: %w", name, err))
	}
	if err := s.cat.createBuffer(name, spec, b.state(false)); err != nil {
		err = errors.Join(err, b.dropWitness(), b.unmap())
		if b.persistent {
			err = errors.Join(err, os.RemoveAll(b.dir))
		}
		return nil, false, s.asNoSpace(fmt.Sprintf("create buffer %q", name), fmt.Errorf("create buffer %q: %w", name, err))
	}
	s.buffers[name] = b
	s.log.Info("buffer created", "buffer", name, "storage", spec.Storage, "capacity", spec.Capacity)
	return b, true, nil
}

// Buffer returns the named buffer or ErrNotFound.
func (s *Store) Buffer(name string) (*Buffer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.buffers[name]
	if !ok {
		return nil, fmt.Errorf("buffer %q: %w", name, ErrNotFound)
	}
	return b, nil
}

// Buffers returns every buffer, sorted by name.
func (s *Store) Buffers() []*Buffer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Buffer, 0, len(s.buffers))
	for _, b := range s.buffers {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// allocTrajIDs hands out k consecutive trajectory ids, reserving a new
// block in the catalog first when the current one runs out.
func (s *Store) allocTrajIDs(k int) (int64, error) {
	s.traj.Lock()
	defer s.traj.Unlock()
	first := s.traj.next
	if k == 0 {
		return first, nil
	}
	if end := first + int64(k); end > s.traj.reserved {
		res := end + trajIDBlock
		if err := s.cat.putTrajNext(res); err != nil {
			return 0, fmt.Errorf("reserve trajectory ids: %w", err)
		}
		s.traj.reserved = res
	}
	s.traj.next += int64(k)
	return first, nil
}

// Checkpoint syncs every persistent buffer and commits its counters,
// whatever its durability mode.
func (s *Store) Checkpoint() error {
	var errs []error
	for _, b := range s.Buffers() {
		errs = append(errs, b.checkpoint())
	}
	return errors.Join(errs...)
}

func (s *Store) checkpointLoop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.CheckpointInterval)
	defer t.Stop()
	idle := s.opts.streamIdle()
	sweepEvery := min(10*time.Second, max(idle/4, time.Millisecond))
	lastSweep := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			if idle > 0 && now.Sub(lastSweep) >= sweepEvery {
				lastSweep = now
				s.expireStreams(idle)
			}
			s.mu.Lock()
			bufs := slices.AppendSeq(make([]*Buffer, 0, len(s.buffers)), maps.Values(s.buffers))
			s.mu.Unlock()
			for _, b := range bufs {
				if b.spec.Durability != DurabilityFlush || !b.dirty.Swap(false) {
					continue
				}
				if err := b.checkpoint(); err != nil && !errors.Is(err, ErrClosed) {
					b.dirty.Store(true) // try again next time
					s.log.Error("checkpoint failed", "buffer", b.name, "err", err)
				}
			}
			// A limiter's state is news too: rbd dump shows it from the
			// snapshot while nothing is written (a writer held back).
			limiterNews := false
			for _, b := range bufs {
				if v := b.limiter.Version(); b.rlShown.Swap(v) != v {
					limiterNews = true
				}
			}
			if s.stateChanged.Swap(false) || limiterNews {
				s.publishSnapshot()
			}
		}
	}
}

// Close syncs every buffer, records the open trajectories of its streams
// so they continue after reopening, and releases the data dir.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	bufs := make([]*Buffer, 0, len(s.buffers))
	for _, b := range s.buffers {
		bufs = append(bufs, b)
	}
	s.mu.Unlock()
	if s.stop != nil {
		close(s.stop)
		<-s.done
		s.stopTrash()
	}
	var errs []error
	for _, b := range bufs {
		errs = append(errs, b.close())
	}
	if !s.readOnly {
		s.publishSnapshot()
	}
	if s.cat != nil {
		errs = append(errs, s.cat.close())
	}
	return errors.Join(errs...)
}
