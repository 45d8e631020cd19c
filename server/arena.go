package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edsrzf/mmap-go"

	"github.com/rbdb/rbd/codec"
	"golang.org/x/sys/unix"
)

// A shared-memory sample stream (?stream=shm) is a sample stream whose
// batches do not cross the socket: the server copies each one into a slot
// of an arena, a memfd the client maps through /proc/<pid>/fd/<fd>, and
// sends a 16-byte frame naming the slot. The client reads the batch in
// place (numpy views, no copy, no parse of a socket stream) and frees the
// slot by storing 0 into the slot's state word once nothing refers to the
// batch. The memfd has no name in any file system, so nothing is left
// behind when either side dies; only the server's user (or root) can open
// its /proc fd. The layout is in docs/format.md, "Sample arenas".

const (
	arenaMagic = "RBDARENA"
	// arenaHeader is the fixed part: magic, version, slots, slot bytes,
	// nonce; the slots' state words follow it.
	arenaHeader = 64
	// arenaHold is how many batches the client may keep alive at once
	// beyond the depth the server draws ahead: more and the server waits.
	arenaHold = 4
	// frameArena marks a frame naming an arena slot (bit 62 of the
	// length word).
	frameArena = uint64(1) << 62
	// slot states
	slotFree = 0
	slotHeld = 1

	// Version 2 arenas (?stream=shm&arena=2) announce batches in a ring in
	// the arena; these are the header words the two sides share and the
	// ring's entry size.
	arenaWaiting   = 48 // u32, client: 1 while it waits on the socket
	arenaRingOff   = 52 // u32, where the ring starts
	arenaConsumed  = 56 // u64, client: batches taken from the ring
	ringEntryBytes = 32 // batch number + 1 (u64), length (u64), slot (u32), zero
)

// arena is one stream's shared memory.
type arena struct {
	f         *os.File
	mem       mmap.MMap
	slots     int
	slotBytes int64
	ringOff   int64 // version 2: the announcement ring
	dataOff   int64
	nonce     string
	next      int // round-robin start of the free-slot search
}

// newArena makes an arena of the given layout version (1: batches named by
// socket frames, 2: announced in the arena) with slots slots of slotBytes
// bytes each (rounded up to pages).
func newArena(version, slots int, slotBytes int64) (*arena, error) {
	const page = 4096
	slotBytes = (slotBytes + page - 1) / page * page
	end := int64(arenaHeader + 4*slots)
	var ringOff int64
	if version == 2 {
		ringOff = (end + ringEntryBytes - 1) / ringEntryBytes * ringEntryBytes
		end = ringOff + int64(ringEntryBytes*slots)
	}
	dataOff := (end + page - 1) / page * page
	size := dataOff + int64(slots)*slotBytes
	fd, err := unix.MemfdCreate("rbd-arena", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("arena: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "rbd-arena")
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("arena: size %d: %w", size, err)
	}
	mem, err := mmap.Map(f, mmap.RDWR, 0)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("arena: map: %w", err)
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	a := &arena{f: f, mem: mem, slots: slots, slotBytes: slotBytes, ringOff: ringOff, dataOff: dataOff,
		nonce: hex.EncodeToString(nonce[:])}
	copy(mem, arenaMagic)
	binary.LittleEndian.PutUint32(mem[8:], uint32(version))
	binary.LittleEndian.PutUint32(mem[12:], uint32(slots))
	binary.LittleEndian.PutUint64(mem[16:], uint64(slotBytes))
	copy(mem[24:40], nonce[:])
	binary.LittleEndian.PutUint64(mem[40:], uint64(dataOff))
	binary.LittleEndian.PutUint32(mem[arenaRingOff:], uint32(ringOff))
	return a, nil
}

// path is where a process of the same user on this machine opens the
// arena.
func (a *arena) path() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), a.f.Fd()) }

// size is the arena's memory.
func (a *arena) size() int64 { return int64(len(a.mem)) }

func (a *arena) state(i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&a.mem[arenaHeader+4*i]))
}

func (a *arena) word32(off int) *uint32   { return (*uint32)(unsafe.Pointer(&a.mem[off])) }
func (a *arena) word64(off int64) *uint64 { return (*uint64)(unsafe.Pointer(&a.mem[off])) }

// consumed is how many batches the client of a version 2 arena has taken
// from the ring.
func (a *arena) consumed() int64 { return int64(atomic.LoadUint64(a.word64(arenaConsumed))) }

// publish announces batch k (numbered from 0) of length n in slot i: the
// entry's slot and length first, its number last, so a client that sees
// the number sees the rest and the slot's bytes (stores are not reordered
// with older stores on the CPUs rbd runs on, and the atomic store orders
// them for Go).
func (a *arena) publish(k int64, i int, n int64) {
	e := a.ringOff + (k%int64(a.slots))*ringEntryBytes
	binary.LittleEndian.PutUint64(a.mem[e+8:], uint64(n))
	binary.LittleEndian.PutUint32(a.mem[e+16:], uint32(i))
	atomic.StoreUint64(a.word64(e), uint64(k+1))
}

// wantsWake reports whether the client of a version 2 arena waits on the
// socket while a batch it has not taken is published (published batches so
// far), and if so clears its flag: the caller then sends one wake-up.
func (a *arena) wantsWake(published int64) bool {
	w := a.word32(arenaWaiting)
	if atomic.LoadUint32(w) == 0 || a.consumed() >= published {
		return false
	}
	return atomic.CompareAndSwapUint32(w, 1, 0)
}

func (a *arena) slot(i int) []byte {
	off := a.dataOff + int64(i)*a.slotBytes
	return a.mem[off : off+a.slotBytes]
}

// errArenaStalled ends a stream whose client keeps every slot.
var errArenaStalled = errors.New("the client released no arena slot in time")

// acquire waits for a free slot (the client stores 0 into a state word
// when it drops a batch). Before it waits it calls beforeWait once: frames
// not yet sent (the stream's buffered writer) may be what the client needs
// to free a slot.
func (a *arena) acquire(ctx context.Context, stall time.Duration, beforeWait func()) (int, error) {
	slot := -1
	free := func() bool {
		var ok bool
		slot, ok = a.takeFree()
		return ok
	}
	if !free() && beforeWait != nil {
		beforeWait()
	}
	if err := poll(ctx, stall, free); err != nil {
		return -1, err
	}
	return slot, nil
}

// takeFree returns a free slot, searching round-robin from the last one
// taken, or false when the client holds them all.
func (a *arena) takeFree() (int, bool) {
	for k := range a.slots {
		i := (a.next + k) % a.slots
		if atomic.LoadUint32(a.state(i)) == slotFree {
			a.next = (i + 1) % a.slots
			return i, true
		}
	}
	return -1, false
}

// fill copies an encoded batch (its safetensors header and tensors) into
// slot i, which must be free and large enough, and marks the slot held.
func (a *arena) fill(i int, hdr []byte, tensors []codec.Tensor) {
	dst := a.slot(i)
	n := copy(dst, hdr)
	for _, t := range tensors {
		n += copy(dst[n:], t.Data)
	}
	atomic.StoreUint32(a.state(i), slotHeld)
}

// idle reports whether the client holds no slot.
func (a *arena) idle() bool {
	for i := range a.slots {
		if atomic.LoadUint32(a.state(i)) != slotFree {
			return false
		}
	}
	return true
}

// waitIdle waits until the client holds no slot, ctx ends or stall
// passes.
func (a *arena) waitIdle(ctx context.Context, stall time.Duration) error {
	return poll(ctx, stall, a.idle)
}

// poll calls cond until it holds, ctx ends or stall passes
// (errArenaStalled). There is no wake-up across processes, so it sleeps
// between calls, backing off to 200 µs: a longer sleep would leave a fast
// reader waiting on an empty pipeline, and a slow reader's poll costs a few
// µs a time.
func poll(ctx context.Context, stall time.Duration, cond func() bool) error {
	deadline := time.Now().Add(stall)
	pause := 20 * time.Microsecond
	for !cond() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errArenaStalled
		}
		time.Sleep(pause)
		pause = min(2*pause, 200*time.Microsecond)
	}
	return nil
}

func (a *arena) close() {
	_ = a.mem.Unmap()
	_ = a.f.Close()
}
