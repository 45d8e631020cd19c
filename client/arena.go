package client

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edsrzf/mmap-go"
)

// ErrNotColocated is returned by SampleStream with
// StreamOptions.SharedMemory when the server's arena cannot be mapped
// here: the server runs on another machine, or as another user. Open a
// socket stream instead.
var ErrNotColocated = errors.New("client: the server's shared memory cannot be mapped here")

// arena is the client's mapping of a shared-memory stream's slots
// (docs/format.md, "Sample arenas").
type arena struct {
	mem       mmap.MMap
	slots     int
	slotBytes int64
	dataOff   int64

	// ring: a version 2 arena, whose batches are announced in the ring at
	// ringOff; taken counts the batches taken from it.
	ring    bool
	ringOff int64
	taken   uint64

	mu          sync.Mutex
	outstanding int  // batches not released yet
	closed      bool // the stream is closed: unmap once outstanding is 0
}

func openArena(path, nonce string) (*arena, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %v", ErrNotColocated, path, err)
	}
	defer f.Close()
	mem, err := mmap.Map(f, mmap.RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: map %s: %v", ErrNotColocated, path, err)
	}
	bad := func(why string) (*arena, error) {
		_ = mem.Unmap()
		return nil, fmt.Errorf("%w: %s %s", ErrNotColocated, path, why)
	}
	version := uint32(0)
	if len(mem) >= 64 {
		version = binary.LittleEndian.Uint32(mem[8:])
	}
	if len(mem) < 64 || string(mem[:8]) != "RBDARENA" || (version != 1 && version != 2) {
		return bad("is not an rbd arena (version 1 or 2)")
	}
	if hex.EncodeToString(mem[24:40]) != nonce {
		return bad("is not this stream's arena (another machine's process?)")
	}
	a := &arena{mem: mem, slots: int(binary.LittleEndian.Uint32(mem[12:])),
		slotBytes: int64(binary.LittleEndian.Uint64(mem[16:])), dataOff: int64(binary.LittleEndian.Uint64(mem[40:]))}
	if a.dataOff < int64(64+4*a.slots) || a.dataOff+int64(a.slots)*a.slotBytes > int64(len(mem)) {
		return bad("has slots outside its size")
	}
	if version == 2 {
		a.ring = true
		a.ringOff = int64(binary.LittleEndian.Uint32(mem[arenaRingOff:]))
		if a.ringOff < int64(64+4*a.slots) || a.ringOff%8 != 0 || a.ringOff+int64(ringEntryBytes*a.slots) > a.dataOff {
			return bad("has its ring outside its header")
		}
	}
	return a, nil
}

// A version 2 arena's shared words and ring entries (docs/format.md).
const (
	arenaWaiting   = 48
	arenaRingOff   = 52
	arenaConsumed  = 56
	ringEntryBytes = 32
	// ringSpin is how long Next polls the ring for a batch that is not
	// there yet before it sleeps on the socket: a wake-up costs both sides
	// a system call.
	ringSpin = 100 * time.Microsecond
)

func (a *arena) word64(off int64) *uint64 { return (*uint64)(unsafe.Pointer(&a.mem[off])) }

// announced reports whether the ring announces the next batch to take.
func (a *arena) announced() bool {
	e := a.ringOff + int64(a.taken%uint64(a.slots))*ringEntryBytes
	return atomic.LoadUint64(a.word64(e)) == a.taken+1
}

// take takes the announced batch: its slot and length, and tells the
// server it was taken.
func (a *arena) take() (slot int, n uint64) {
	e := a.ringOff + int64(a.taken%uint64(a.slots))*ringEntryBytes
	n = binary.LittleEndian.Uint64(a.mem[e+8:])
	slot = int(binary.LittleEndian.Uint32(a.mem[e+16:]))
	a.taken++
	atomic.StoreUint64(a.word64(arenaConsumed), a.taken)
	return slot, n
}

// setWaiting says whether the client sleeps on the socket.
func (a *arena) setWaiting(on bool) {
	v := uint32(0)
	if on {
		v = 1
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&a.mem[arenaWaiting])), v)
}

// batch returns slot i's first n bytes and the function that hands the
// slot back (once).
func (a *arena) batch(i int, n uint64) ([]byte, func(), error) {
	if i >= a.slots || n > uint64(a.slotBytes) {
		return nil, nil, fmt.Errorf("slot %d of %d bytes is outside the arena (%d slots of %d bytes)", i, n, a.slots, a.slotBytes)
	}
	off := a.dataOff + int64(i)*a.slotBytes
	a.mu.Lock()
	a.outstanding++
	a.mu.Unlock()
	var once sync.Once
	return a.mem[off : off+int64(n)], func() {
		once.Do(func() {
			atomic.StoreUint32((*uint32)(unsafe.Pointer(&a.mem[64+4*i])), 0)
			a.mu.Lock()
			a.outstanding--
			done := a.closed && a.outstanding == 0
			a.mu.Unlock()
			if done {
				_ = a.mem.Unmap()
			}
		})
	}, nil
}

// close unmaps the arena now, or once the last batch is released.
func (a *arena) close() {
	a.mu.Lock()
	a.closed = true
	done := a.outstanding == 0
	a.mu.Unlock()
	if done {
		_ = a.mem.Unmap()
	}
}
