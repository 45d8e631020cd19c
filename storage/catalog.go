package storage

import (
	"github.com/rbdb/rbd/ratelimit"

	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// The catalog is catalog.db (bbolt) at the root of a data dir. Layout (see
// docs/format.md):
//
//	rbd/format       uint32 LE  catalog format version
//	rbd/traj_next    uint64 LE  trajectory ids below this may have been handed out
//	buffers/<name>/spec      canonical spec JSON
//	buffers/<name>/state     bufferState JSON
//	buffers/<name>/streams/<stream>  JSON {env: streamPos}, written on clean close only
var (
	bucketRBD     = []byte("rbd")
	bucketBuffers = []byte("buffers")
	bucketStreams = []byte("streams")
	keyFormat     = []byte("format")
	keyTrajNext   = []byte("traj_next")
	keySpec       = []byte("spec")
	keyState      = []byte("state")
)

// bufferState is the small mutable state of a buffer kept in the catalog.
type bufferState struct {
	UID        uint64 `json:"uid"`
	WriteCount int64  `json:"write_count"`
	// SeqReserved bounds every seq ever handed out: memory buffers lose
	// their rows on restart and resume their write_count here, so seqs are
	// never reused.
	SeqReserved int64 `json:"seq_reserved"`
	// Clean is true only between a clean close and the next open; then the
	// streams bucket holds the open trajectories to continue.
	Clean bool `json:"clean"`
	// MaxPriority is the largest raw priority ever set (1.0 before any).
	MaxPriority float64 `json:"max_priority,omitempty"`
	// Holes lists seq ranges [from, to) found missing by recovery (rows
	// that a crash or power loss left unwritten). verify does not count
	// them as damage; ranges that fall out of the ring are dropped.
	Holes     [][2]int64 `json:"holes,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
}

// streamPos is where an open trajectory of one (stream, env) stands.
type streamPos struct {
	TrajID  int64 `json:"traj_id"`
	Step    int64 `json:"step"`
	LastSeq int64 `json:"last_seq"`
}

type catalog struct {
	db   *bolt.DB
	path string
}

// guardCorrupt turns a panic or memory fault raised by bbolt while it reads
// a damaged file into a corruption error: bbolt trusts its pages, and a
// flipped bit in one can make it index out of range or touch unmapped
// memory. Use as: defer guardCorrupt(path, &err)().
func guardCorrupt(path string, err *error) func() {
	old := debug.SetPanicOnFault(true)
	return func() {
		debug.SetPanicOnFault(old)
		if p := recover(); p != nil {
			*err = corruptf(path, -1, "catalog unreadable: %v", p)
		}
	}
}

func openCatalog(path string, readOnly bool, timeout time.Duration) (c *catalog, err error) {
	defer guardCorrupt(path, &err)()
	st, statErr := os.Stat(path)
	existed := statErr == nil
	if existed && st.Size() == 0 {
		// bbolt would silently make a new empty catalog over it, and the
		// buffers' files would be forgotten.
		return nil, corruptf(path, 0, "catalog is empty (truncated?)")
	}
	db, err := bolt.Open(path, 0o644, &bolt.Options{Timeout: timeout, ReadOnly: readOnly})
	if err != nil {
		switch {
		case errors.Is(err, bolterrors.ErrTimeout):
			return nil, fmt.Errorf("open catalog %s: waited %v: %w", path, timeout, ErrLocked)
		case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch):
			return nil, &CorruptionError{Path: path, Offset: -1, Err: err}
		}
		return nil, fmt.Errorf("open catalog %s: %w", path, err)
	}
	c = &catalog{db: db, path: path}
	done := false
	defer func() {
		if !done {
			db.Close() // a panic on a damaged page: release the file lock
		}
	}()
	if readOnly {
		err = db.View(func(tx *bolt.Tx) error { return checkFormat(tx, path) })
	} else {
		err = db.Update(func(tx *bolt.Tx) error {
			if existed && tx.Bucket(bucketRBD) == nil {
				// A bbolt file of some other program: never adopt it.
				return corruptf(path, -1, "not an rbd catalog (no rbd bucket)")
			}
			b, err := tx.CreateBucketIfNotExists(bucketRBD)
			if err != nil {
				return err
			}
			if b.Get(keyFormat) == nil {
				if err := b.Put(keyFormat, binary.LittleEndian.AppendUint32(nil, FormatVersion)); err != nil {
					return err
				}
			}
			if _, err := tx.CreateBucketIfNotExists(bucketBuffers); err != nil {
				return err
			}
			return checkFormat(tx, path)
		})
	}
	done = true
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return c, nil
}

func checkFormat(tx *bolt.Tx, path string) error {
	b := tx.Bucket(bucketRBD)
	if b == nil || b.Get(keyFormat) == nil || tx.Bucket(bucketBuffers) == nil {
		return corruptf(path, -1, "not an rbd catalog (missing rbd/format)")
	}
	v := b.Get(keyFormat)
	if len(v) != 4 {
		return corruptf(path, -1, "rbd/format is %d bytes", len(v))
	}
	if got := binary.LittleEndian.Uint32(v); got != FormatVersion {
		return fmt.Errorf("catalog %s has format version %d, this build reads %d: %w", path, got, FormatVersion, ErrVersionMismatch)
	}
	return nil
}

func (c *catalog) close() error { return c.db.Close() }

func (c *catalog) trajNext() (int64, error) {
	var n int64
	err := c.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketRBD).Get(keyTrajNext); len(v) == 8 {
			n = int64(binary.LittleEndian.Uint64(v))
		}
		return nil
	})
	return n, err
}

func (c *catalog) putTrajNext(n int64) error {
	return c.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRBD).Put(keyTrajNext, binary.LittleEndian.AppendUint64(nil, uint64(n)))
	})
}

type catalogEntry struct {
	name    string
	spec    Spec
	state   bufferState
	streams map[string]map[int64]streamPos
	// rateLimit is the live limiter state a snapshot recorded (nil when
	// read from the catalog itself).
	rateLimit *ratelimit.State
}

func (c *catalog) entries() (out []catalogEntry, err error) {
	defer guardCorrupt(c.path, &err)()
	err = c.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBuffers).ForEachBucket(func(k []byte) error {
			e, err := readEntry(tx.Bucket(bucketBuffers).Bucket(k), string(k), c.path)
			if err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}

func readEntry(b *bolt.Bucket, name, path string) (catalogEntry, error) {
	e := catalogEntry{name: name, streams: map[string]map[int64]streamPos{}}
	if err := e.spec.UnmarshalJSON(b.Get(keySpec)); err != nil {
		return e, corruptf(path, -1, "buffer %q spec: %v", name, err)
	}
	e.spec = e.spec.WithDefaults()
	if err := json.Unmarshal(b.Get(keyState), &e.state); err != nil {
		return e, corruptf(path, -1, "buffer %q state: %v", name, err)
	}
	if sb := b.Bucket(bucketStreams); sb != nil {
		err := sb.ForEach(func(k, v []byte) error {
			var envs map[int64]streamPos
			if err := json.Unmarshal(v, &envs); err != nil {
				return corruptf(path, -1, "buffer %q stream %q: %v", name, k, err)
			}
			e.streams[string(k)] = envs
			return nil
		})
		if err != nil {
			return e, err
		}
	}
	return e, nil
}

// createBuffer stores a new buffer's spec and state. It fails if the name
// is taken (the caller checks specs first).
func (c *catalog) createBuffer(name string, spec Spec, st bufferState) error {
	return c.putEntry(name, spec, st, true, false)
}

// putEntry stores a buffer's spec and state in one transaction, in a new
// bucket (create: it fails if the name is taken) or its own, whose saved
// streams it deletes with dropStreams.
func (c *catalog) putEntry(name string, spec Spec, st bufferState, create, dropStreams bool) error {
	specJSON, err := spec.MarshalJSON()
	if err != nil {
		return err
	}
	stJSON, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		var b *bolt.Bucket
		var err error
		if create {
			if b, err = tx.Bucket(bucketBuffers).CreateBucket([]byte(name)); err != nil {
				return fmt.Errorf("catalog: create buffer %q: %w", name, err)
			}
		} else if b, err = bufferBucket(tx, name); err != nil {
			return err
		}
		if err := b.Put(keySpec, specJSON); err != nil {
			return err
		}
		if dropStreams && b.Bucket(bucketStreams) != nil {
			if err := b.DeleteBucket(bucketStreams); err != nil {
				return err
			}
		}
		return b.Put(keyState, stJSON)
	})
}

func bufferBucket(tx *bolt.Tx, name string) (*bolt.Bucket, error) {
	b := tx.Bucket(bucketBuffers).Bucket([]byte(name))
	if b == nil {
		return nil, fmt.Errorf("catalog: buffer %q: %w", name, ErrNotFound)
	}
	return b, nil
}

// putSpec replaces a buffer's spec (a live setting changed).
func (c *catalog) putSpec(name string, spec Spec) error {
	specJSON, err := spec.MarshalJSON()
	if err != nil {
		return err
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		b, err := bufferBucket(tx, name)
		if err != nil {
			return err
		}
		return b.Put(keySpec, specJSON)
	})
}

// putState replaces a buffer's state and, when setStreams is true, its saved
// streams (an empty map leaves nothing to continue).
func (c *catalog) putState(name string, st bufferState, streams map[string]map[int64]streamPos, setStreams bool) error {
	stJSON, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		b, err := bufferBucket(tx, name)
		if err != nil {
			return err
		}
		if err := b.Put(keyState, stJSON); err != nil {
			return err
		}
		if !setStreams {
			return nil
		}
		if b.Bucket(bucketStreams) != nil {
			if err := b.DeleteBucket(bucketStreams); err != nil {
				return err
			}
		}
		if len(streams) == 0 {
			return nil
		}
		sb, err := b.CreateBucket(bucketStreams)
		if err != nil {
			return err
		}
		for name, envs := range streams {
			v, err := json.Marshal(envs)
			if err != nil {
				return err
			}
			if err := sb.Put([]byte(name), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// switchBuffer replaces a buffer's spec and state in one transaction (an
// upgrade's switch to another format version: a kill leaves both old or
// both new).
func (c *catalog) switchBuffer(name string, spec Spec, st bufferState, dropStreams bool) error {
	return c.putEntry(name, spec, st, false, dropStreams)
}

func (c *catalog) deleteBuffer(name string) error {
	return c.db.Update(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketBuffers).DeleteBucket([]byte(name))
		if errors.Is(err, bolterrors.ErrBucketNotFound) {
			return nil
		}
		return err
	})
}
