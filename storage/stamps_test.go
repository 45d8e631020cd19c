package storage

import (
	"encoding/binary"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// TestStampTableModes runs the same operations on a table of its own (on
// the Go heap, or mapped when larger than stampHeapSlots) and on one moved
// into a row group (stamps stored as seq+1 in each row's first 8 bytes, or
// as 32-bit pass stamps at byte 4 beside a run word that they must leave
// alone), and checks that the move keeps the stamps already set and gives
// the table's own memory back, and that never-written rows read as -1 in
// all four.
func TestStampTableModes(t *testing.T) {
	const pitch = 40
	for _, mode := range []string{"heap", "mapped", "rows", "passes"} {
		t.Run(mode, func(t *testing.T) {
			capacity := int64(100)
			if mode == "mapped" {
				capacity = stampHeapSlots + 100
			}
			st, err := newStampTable(capacity)
			if err != nil {
				t.Fatal(err)
			}
			defer st.close()
			if (st.own != nil) != (mode == "mapped") || st.inGroup() {
				t.Fatalf("a table of %d slots: mapped %v, in a row group %v", capacity, st.own != nil, st.inGroup())
			}
			st.Store(7, capacity*10+7)
			var rows []byte
			if mode == "rows" || mode == "passes" {
				r, err := mmapfile.Anonymous(capacity * pitch)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				rows = r.Bytes()
				for slot := range capacity { // run words the pass stamps must keep
					if mode == "passes" {
						binary.LittleEndian.PutUint32(rows[slot*pitch:], uint32(0xa5000000+slot))
					}
				}
				if err := st.inRows(rows, pitch, mode == "passes"); err != nil {
					t.Fatal(err)
				}
				if st.own != nil || st.heap != nil || !st.inGroup() {
					t.Errorf("a table moved into the row group keeps memory of its own, or is not in the group")
				}
			}
			if got := st.Load(7); got != capacity*10+7 {
				t.Errorf("stamp set before the move: %d, want %d", got, capacity*10+7)
			}
			for _, slot := range []int64{0, 6, 8, capacity - 1} {
				if got := st.Load(slot); got != -1 {
					t.Errorf("slot %d never written reads %d, want -1", slot, got)
				}
			}
			last := capacity - 1
			steps := []struct {
				op               string
				slot, old, seq   int64
				want             int64 // Load afterwards
				wantOld, wantCAS int64 // Swap's result; CompareAndSwap's as 0/1
			}{
				{op: "store", slot: 0, seq: 0, want: 0},
				{op: "swap", slot: 0, seq: -1, want: -1, wantOld: 0},
				{op: "cas", slot: 0, old: 5, seq: 9, want: -1, wantCAS: 0},
				{op: "cas", slot: 0, old: -1, seq: capacity, want: capacity, wantCAS: 1},
				{op: "cas", slot: last, old: -1, seq: 2*capacity - 1, want: 2*capacity - 1, wantCAS: 1},
				{op: "swap", slot: last, seq: 3*capacity - 1, want: 3*capacity - 1, wantOld: 2*capacity - 1},
				{op: "cas", slot: 7, old: capacity*10 + 7, seq: -1, want: -1, wantCAS: 1},
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
				if got := st.Load(s.slot); got != s.want {
					t.Errorf("after %s on slot %d: %d, want %d", s.op, s.slot, got, s.want)
				}
			}
			for slot := range capacity {
				if mode == "passes" && binary.LittleEndian.Uint32(rows[slot*pitch:]) != uint32(0xa5000000+slot) {
					t.Fatalf("slot %d: the stamps changed the run word to %#x", slot, binary.LittleEndian.Uint32(rows[slot*pitch:]))
				}
			}
		})
	}
}

// TestPassStampsWrap: a pass stamp keeps a pass's low 31 bits, and rows
// of passes on both sides of every boundary where those bits wrap (and
// around the bound of the stamps before them, (2^32 - 1) x capacity) read
// back exactly, a pass behind the last one stored as well as the last;
// slots never written or voided read -1; a CompareAndSwap naming a seq
// 2^31 passes away, whose stamp has the same bits, changes nothing; and
// readers whose ref lags or leads the writers' by a pass still decode.
func TestPassStampsWrap(t *testing.T) {
	for _, capacity := range []int64{1, 3, 100_000} {
		r, err := mmapfile.Anonymous(capacity * 8)
		if err != nil {
			t.Fatal(err)
		}
		st, err := newStampTable(capacity)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.inRows(r.Bytes(), 8, true); err != nil {
			t.Fatal(err)
		}
		for _, pass := range []int64{1, 1<<30 - 1, 1 << 30, 1<<31 - 1, 1 << 31, 1<<32 - 2, 1<<32 - 1, 1 << 32, 1<<33 + 1, 1<<62/capacity - 2} {
			older, newer := (pass-1)*capacity, pass*capacity // the first slot of each pass
			last := newer + capacity - 1
			st.Store(0, older) // the slot's row of the pass before
			if capacity > 1 {
				st.Store(capacity-1, last) // the last slot of the pass, stored last: ref is pass
			}
			for seq, slot := range map[int64]int64{older: 0, last: capacity - 1} {
				if capacity == 1 && seq == last {
					continue
				}
				if got := st.Load(slot); got != seq {
					t.Errorf("capacity %d, pass %d: seq %d stored in slot %d reads %d", capacity, pass, seq, slot, got)
				}
				if !st.stillHolds(slot, seq) {
					t.Errorf("capacity %d, pass %d: slot %d does not still hold %d", capacity, pass, slot, seq)
				}
				for _, lag := range []int64{-1, 1} { // a reader's ref a pass off
					ref := st.ref
					st.ref += lag
					if got := st.Load(slot); got != seq {
						t.Errorf("capacity %d, pass %d, ref off by %d: slot %d reads %d, want %d", capacity, pass, lag, slot, got, seq)
					}
					st.ref = ref
				}
			}
			alias := older + (1<<31)*capacity // same low bits of the pass
			if st.CompareAndSwap(0, alias, -1) || st.Load(0) != older {
				t.Errorf("capacity %d, pass %d: a swap naming seq %d, 2^31 passes on, went through", capacity, pass, alias)
			}
			if pass > 1<<31 {
				alias = older - (1<<31)*capacity
				if st.CompareAndSwap(0, alias, -1) || st.Load(0) != older {
					t.Errorf("capacity %d, pass %d: a swap naming seq %d, 2^31 passes back, went through", capacity, pass, alias)
				}
			}
			if capacity > 1 && (st.CompareAndSwap(0, older, older+1) || st.Load(0) != older) {
				t.Errorf("capacity %d, pass %d: a swap to another slot's seq went through", capacity, pass)
			}
			if !st.CompareAndSwap(0, older, newer) || st.Load(0) != newer {
				t.Errorf("capacity %d, pass %d: slot 0 did not move from %d to %d", capacity, pass, older, newer)
			}
			if old := st.Swap(0, -1); old != newer || st.Load(0) != -1 {
				t.Errorf("capacity %d, pass %d: voiding slot 0 returned %d and left %d", capacity, pass, old, st.Load(0))
			}
		}
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
