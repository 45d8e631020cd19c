package storage

import (
	"testing"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// TestStampTableModes runs the same operations on a heap table and on one
// moved into a row group (stamps stored as seq+1 in each row's first 8
// bytes), and checks that the move keeps the stamps already set and that
// never-written rows read as -1 in both.
func TestStampTableModes(t *testing.T) {
	const capacity, pitch = 100, 40
	for _, mode := range []string{"heap", "rows"} {
		t.Run(mode, func(t *testing.T) {
			st := newStampTable(capacity)
			st.Store(7, 1007)
			if mode == "rows" {
				r, err := mmapfile.Anonymous(capacity * pitch)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				st.inRows(r.Bytes(), pitch)
			}
			if got := st.Load(7); got != 1007 {
				t.Errorf("stamp set before the move: %d, want 1007", got)
			}
			for _, slot := range []int64{0, 6, 8, 99} {
				if got := st.Load(slot); got != -1 {
					t.Errorf("slot %d never written reads %d, want -1", slot, got)
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
				if got := st.Load(s.slot); got != s.want {
					t.Errorf("after %s on slot %d: %d, want %d", s.op, s.slot, got, s.want)
				}
			}
			if mode == "rows" && st.heapBytes() != 0 {
				t.Errorf("a table in the row group holds %d heap bytes", st.heapBytes())
			}
		})
	}
}
