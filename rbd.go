package rbd

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rbdb/rbd/sampler"
	"github.com/rbdb/rbd/storage"
)

// Options configures Open; nil gives the defaults documented on
// storage.Options.
type Options = storage.Options

// DB is an open data dir: its buffers, with their sampling state.
type DB struct {
	store *storage.Store

	mu   sync.Mutex
	bufs map[*storage.Buffer]*Buffer
}

// Buffer is a stored buffer with the sampling state of this process
// (without-replacement epochs per consumer). Its storage methods (Extend,
// Info, Gather, UpdatePriorities, ...) are those of storage.Buffer.
type Buffer struct {
	*storage.Buffer
	state *sampler.State
	pool  bytePool // result memory of released batches
	// drawns recycles the per-sample row metadata (a 256-row batch's is
	// 22 KB, 256 x (64 + 24) bytes: most of what a small sample would
	// otherwise allocate).
	drawns sync.Pool
	// gathereds recycles the per-sample copy state (maps and scratch).
	gathereds sync.Pool
	// rngs recycles samples' random sources (sampleRNG).
	rngs sync.Pool
	// lastPlan is the plan of the last request shape sampled (request.go).
	lastPlan atomic.Pointer[cachedPlan]
	// onDataWait, when set (tests), runs each time a sample starts waiting
	// for data, after it gave its rate-limit admission back.
	onDataWait func()
}

// Open opens (creating if needed) the data dir at dir and recovers its
// buffers.
func Open(dir string, opts *Options) (*DB, error) {
	s, err := storage.Open(dir, opts)
	if err != nil {
		return nil, err
	}
	return &DB{store: s, bufs: map[*storage.Buffer]*Buffer{}}, nil
}

// Store returns the underlying store.
func (db *DB) Store() *storage.Store { return db.store }

func (db *DB) wrap(sb *storage.Buffer) *Buffer {
	db.mu.Lock()
	defer db.mu.Unlock()
	b := db.bufs[sb]
	if b == nil {
		b = &Buffer{Buffer: sb, state: sampler.NewState()}
		db.bufs[sb] = b
	}
	return b
}

// CreateBuffer creates a buffer, or returns the existing one when its spec
// is identical (created = false); a different spec is
// storage.ErrSpecConflict.
func (db *DB) CreateBuffer(name string, spec storage.Spec) (*Buffer, bool, error) {
	sb, created, err := db.store.CreateBuffer(name, spec)
	if err != nil {
		return nil, false, err
	}
	return db.wrap(sb), created, nil
}

// Buffer returns the named buffer or storage.ErrNotFound.
func (db *DB) Buffer(name string) (*Buffer, error) {
	sb, err := db.store.Buffer(name)
	if err != nil {
		return nil, err
	}
	return db.wrap(sb), nil
}

// Buffers returns every buffer, sorted by name.
func (db *DB) Buffers() []*Buffer {
	var out []*Buffer
	for _, sb := range db.store.Buffers() {
		out = append(out, db.wrap(sb))
	}
	return out
}

// DeleteBuffer removes a buffer with its rows and sampling state.
func (db *DB) DeleteBuffer(name string) error {
	sb, err := db.store.Buffer(name)
	if err != nil {
		return err
	}
	if err := db.store.DeleteBuffer(name); err != nil {
		return err
	}
	db.mu.Lock()
	delete(db.bufs, sb)
	db.mu.Unlock()
	return nil
}

// Close closes the data dir (see storage.Store.Close).
func (db *DB) Close() error {
	if err := db.store.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
