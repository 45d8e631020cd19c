package server

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edsrzf/mmap-go"
)

// TestArenaSlots: a slot the client holds is never handed out again; the
// client's store of 0 frees it; with every slot held, acquire gives up
// after the stall time; another mapping of the /proc path sees the
// server's bytes and header.
func TestArenaSlots(t *testing.T) {
	a, err := newArena(1, 3, 5000)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	if a.slotBytes != 8192 || a.dataOff != 4096 {
		t.Fatalf("slot bytes %d, data offset %d: want pages", a.slotBytes, a.dataOff)
	}
	ctx := context.Background()
	seen := map[int]bool{}
	for range 3 {
		i, err := a.acquire(ctx, time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		if seen[i] {
			t.Fatalf("slot %d handed out twice while held", i)
		}
		seen[i] = true
		copy(a.slot(i), []byte{byte(i + 1), 42})
		atomic.StoreUint32(a.state(i), slotHeld)
	}
	if _, err := a.acquire(ctx, 20*time.Millisecond, nil); !errors.Is(err, errArenaStalled) {
		t.Fatalf("acquire with every slot held: %v, want errArenaStalled", err)
	}
	if a.idle() {
		t.Fatal("idle while slots are held")
	}
	// Before waiting, acquire lets the stream send what it buffered: here
	// that makes the client free slot 2 at once.
	flushed := 0
	i, err := a.acquire(ctx, time.Second, func() { flushed++; atomic.StoreUint32(a.state(2), slotFree) })
	if err != nil || i != 2 || flushed != 1 {
		t.Fatalf("acquire with every slot held and frames buffered: slot %d, %v, flushed %d times; want slot 2 after one flush", i, err, flushed)
	}
	atomic.StoreUint32(a.state(2), slotHeld)

	// The client's side: map the arena by its /proc path, read a slot,
	// free it.
	f, err := os.OpenFile(a.path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := mmap.Map(f, mmap.RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmap()
	if string(m[:8]) != arenaMagic || m[a.dataOff+a.slotBytes] != 2 || m[a.dataOff+a.slotBytes+1] != 42 {
		t.Fatalf("the client's mapping does not show the server's bytes: %q, %v", m[:8], m[a.dataOff+a.slotBytes:a.dataOff+a.slotBytes+2])
	}
	m[arenaHeader+4*1] = 0 // the client drops the batch in slot 1
	i, err = a.acquire(ctx, time.Second, nil)
	if err != nil || i != 1 {
		t.Fatalf("after the client freed slot 1: slot %d, %v", i, err)
	}
	for k := range 3 {
		m[arenaHeader+4*k] = 0
	}
	if !a.idle() {
		t.Fatal("not idle once the client freed every slot")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	atomic.StoreUint32(a.state(0), slotHeld)
	atomic.StoreUint32(a.state(1), slotHeld)
	atomic.StoreUint32(a.state(2), slotHeld)
	if _, err := a.acquire(cctx, time.Minute, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire after the client went away: %v", err)
	}
}
