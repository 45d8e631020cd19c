package storage

import (
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// TestStampTableModes runs the same operations on a heap table and on one
// moved into a row group (stamps stored as seq+1 in each row's first 8
// bytes, or as 32-bit pass stamps at byte 4 beside a run word that they
// must leave alone), and checks that the move keeps the stamps already set
// and that never-written rows read as -1 in all three.
func TestStampTableModes(t *testing.T) {
	const capacity, pitch = 100, 40
	for _, mode := range []string{"heap", "rows", "passes"} {
		t.Run(mode, func(t *testing.T) {
			st := newStampTable(capacity)
			st.Store(7, 1007)
			var rows []byte
			if mode != "heap" {
				r, err := mmapfile.Anonymous(capacity * pitch)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				rows = r.Bytes()
				for slot := range int64(capacity) { // run words the pass stamps must keep
					if mode == "passes" {
						binary.LittleEndian.PutUint32(rows[slot*pitch:], uint32(0xa5000000+slot))
					}
				}
				st.inRows(rows, pitch, mode == "passes")
			}
			if got := st.Load(7); got != 1007 {
				t.Errorf("stamp set before the move: %d, want 1007", got)
			}
			for _, slot := range []int64{0, 6, 8, 99} {
				if got := st.Load(slot); got != -1 && (mode != "passes" || got != slot-capacity) {
					t.Errorf("slot %d never written reads %d, want -1 (pass stamps: %d)", slot, got, slot-capacity)
				}
			}
			steps := []struct {
				op               string
				slot, old, seq   int64
				want             int64 // Load afterwards
				wantOld, wantCAS int64 // Swap's result; CompareAndSwap's as 0/1
			}{
				{op: "store", slot: 0, seq: 0, want: 0},
				{op: "swap", slot: 0, seq: -1, want: -1, wantOld: 0},
				{op: "cas", slot: 0, old: 5, seq: 9, want: -1, wantCAS: 0},
				{op: "cas", slot: 0, old: -1, seq: 100, want: 100, wantCAS: 1},
				{op: "cas", slot: 99, old: -1, seq: 199, want: 199, wantCAS: 1},
				{op: "swap", slot: 99, seq: 299, want: 299, wantOld: 199},
				{op: "cas", slot: 7, old: 1007, seq: -1, want: -1, wantCAS: 1},
			}
			for _, s := range steps {
				switch s.op {
				case "store":
					st.Store(s.slot, s.seq)
				case "swap":
					if old := st.Swap(s.slot, s.seq); old != s.wantOld {
						t.Errorf("swap(%d, %d) returned %d, want %d", s.slot, s.seq, old, s.wantOld)
					}
				case "cas":
					ok := st.CompareAndSwap(s.slot, s.old, s.seq)
					if ok != (s.wantCAS == 1) {
						t.Errorf("cas(%d, %d, %d) = %v", s.slot, s.old, s.seq, ok)
					}
				}
				got := st.Load(s.slot)
				if mode == "passes" && s.want < 0 && got < 0 && got >= -capacity { // no row: slot - capacity
					got = s.want
				}
				if got != s.want {
					t.Errorf("after %s on slot %d: %d, want %d", s.op, s.slot, got, s.want)
				}
			}
			for slot := range int64(capacity) {
				if mode == "passes" && binary.LittleEndian.Uint32(rows[slot*pitch:]) != uint32(0xa5000000+slot) {
					t.Fatalf("slot %d: the stamps changed the run word to %#x", slot, binary.LittleEndian.Uint32(rows[slot*pitch:]))
				}
			}
			if mode != "heap" && st.heapBytes() != 0 {
				t.Errorf("a table in the row group holds %d heap bytes", st.heapBytes())
			}
		})
	}
}

// TestPassStampLimit: the last seq below maxPassStampSeq round-trips
// through a pass stamp, in the last slot and the first; a CompareAndSwap
// naming a seq at the limit or of another slot changes nothing; a store
// at the limit panics (writers check the limit before they get there).
func TestPassStampLimit(t *testing.T) {
	for _, capacity := range []int64{1, 3, 100_000} {
		limit := maxPassStampSeq(capacity)
		if want := (int64(math.MaxUint32)) * capacity; limit != want {
			t.Fatalf("capacity %d: limit %d, want %d", capacity, limit, want)
		}
		r, err := mmapfile.Anonymous(capacity * 8)
		if err != nil {
			t.Fatal(err)
		}
		st := newStampTable(capacity)
		st.inRows(r.Bytes(), 8, true)
		for _, seq := range []int64{limit - 1, limit - capacity, 0, capacity} {
			slot := seq % capacity
			st.Store(slot, seq)
			if got := st.Load(slot); got != seq {
				t.Errorf("capacity %d: seq %d stored in slot %d reads %d", capacity, seq, slot, got)
			}
			if !st.stillHolds(slot, seq) {
				t.Errorf("capacity %d: slot %d does not still hold %d", capacity, slot, seq)
			}
		}
		slot := (limit - 1) % capacity
		st.Store(slot, limit-1)
		if st.CompareAndSwap(slot, limit-1, limit+slot-(limit%capacity)) || st.Load(slot) != limit-1 {
			t.Errorf("capacity %d: a swap to a seq past the limit went through", capacity)
		}
		if capacity > 1 && (st.CompareAndSwap(slot, limit-1, limit-2) || st.Load(slot) != limit-1) {
			t.Errorf("capacity %d: a swap to another slot's seq went through", capacity)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("capacity %d: storing seq %d did not panic", capacity, limit)
				}
			}()
			st.Store(limit%capacity, limit)
		}()
		r.Close()
	}
}

// TestStampLoadsInlined holds Load and stillHolds to what their comments
// promise: the compiler inlines them (a sample calls them a few times a
// row; when a change to the stamp kinds made Load a call, memory samples
// ran 2-9% slower). It asks the compiler itself, so it fails when the
// inliner's cost of either goes past its budget.
func TestStampLoadsInlined(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: compiles the package once more")
	}
	out, err := exec.Command("go", "build", "-gcflags=-m", "-o", os.DevNull, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -gcflags=-m: %v\n%s", err, out)
	}
	fns := []string{"(*stampTable).Load"}
	if runtime.GOARCH == "amd64" { // elsewhere stillHolds is a CompareAndSwap (stamps_recheck_other.go)
		fns = append(fns, "(*stampTable).stillHolds")
	}
	for _, fn := range fns {
		if !strings.Contains(string(out), "can inline "+fn) {
			t.Errorf("%s is not inlined any more (go build -gcflags=-m=2 ./storage says why)", fn)
		}
	}
}
