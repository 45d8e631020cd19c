package storage

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"
)

// TestRingSlotCount holds ringSlotCount to its rule: the capacity, or in
// builds with the rbd_spareslots tag the capacity of a new memory buffer
// rounded up to a block, plus a block.
func TestRingSlotCount(t *testing.T) {
	for _, tc := range []struct {
		kind      Kind
		capacity  int64
		fromFiles bool
		spare     int64 // the slots with a spare block
	}{
		{KindMemory, 1, false, 128},
		{KindMemory, 64, false, 128},
		{KindMemory, 65, false, 192},
		{KindMemory, 100_000, false, 100_032 + 64},
		{KindMemory, 100, true, 100},
		{KindMemmap, 100, false, 100},
		{KindCompressed, 100, false, 100},
	} {
		want := tc.capacity
		if spareSlotsInMemory {
			want = tc.spare
		}
		if got := ringSlotCount(Spec{Storage: tc.kind, Capacity: tc.capacity}, tc.fromFiles); got != want {
			t.Errorf("%s capacity %d (from files %v): %d slots, want %d", tc.kind, tc.capacity, tc.fromFiles, got, want)
		}
	}
}

// TestSlotsBeyondTheWindow wraps a ring many times and checks that rows
// that left the window are gone from every reader, whether or not their
// slots were written again (in a ring with a spare block, the last block
// of them were not): SlotSeq over every slot names each live row once,
// Live, LiveSeqs, Row and Gather refuse the rest, and the priority mass is
// the live rows' alone. Memory buffers keep that layout through a
// checkpoint and its restore (one slot a row there). In the default build
// every ring has as many slots as rows, and this is the same check.
func TestSlotsBeyondTheWindow(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			const capacity = 100
			dir := t.TempDir()
			s := openStore(t, dir)
			defer func() { s.Close() }()
			spec := testSpec(kind, capacity, true)
			spec.Priority = &PriorityOptions{Alpha: 1, Eps: 0}
			b := mustCreate(t, s, "b", spec)
			if want := ringSlotCount(b.Spec(), false); b.slots != want {
				t.Fatalf("%d slots, want %d", b.slots, want)
			}
			var rows []row
			for i := range 7 * capacity / 2 {
				rows = append(rows, row{env: int64(i % 3), val: float32(i), terminated: i%17 == 16})
				if len(rows) == 30 {
					mustExtend(t, b, "w", makeBatch(spec, rows, true))
					rows = rows[:0]
				}
			}
			mustExtend(t, b, "w", makeBatch(spec, rows, true))
			checkWindow(t, b)
			if kind != KindMemory {
				return
			}
			dest := filepath.Join(t.TempDir(), "cp")
			if _, err := b.Checkpoint(context.Background(), dest, nil); err != nil {
				t.Fatal(err)
			}
			want := b.LiveSeqs(0, capacity)
			wantMeta := metas(t, b, want...)
			r := openStore(t, dest)
			defer r.Close()
			rb, err := r.Buffer("b")
			if err != nil {
				t.Fatal(err)
			}
			if rb.slots != capacity {
				t.Fatalf("restored from files: %d slots, want %d", rb.slots, capacity)
			}
			if got := rb.LiveSeqs(0, capacity); !slices.Equal(got, want) {
				t.Fatalf("restored live seqs %v, want %v", got, want)
			}
			if got := metas(t, rb, want...); !slices.Equal(got, wantMeta) {
				t.Fatalf("restored rows' metadata differs:\n%v\nwant\n%v", got, wantMeta)
			}
			checkWindow(t, rb)
		})
	}
}

// checkWindow checks b's readers against its window (see
// TestSlotsBeyondTheWindow).
func checkWindow(t *testing.T, b *Buffer) {
	t.Helper()
	wc := b.WriteCount()
	lo := max(0, wc-b.capacity)
	var fromSlots []int64
	var mass float64
	if err := b.ReadIndex(func(ix Index) {
		for slot := range ix.Slots() {
			if seq := ix.SlotSeq(slot); seq >= 0 {
				fromSlots = append(fromSlots, seq)
			}
		}
		mass = ix.PriorityTotal()
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(fromSlots)
	live := b.LiveSeqs(0, int(b.capacity))
	if !slices.Equal(fromSlots, live) || len(live) != int(b.capacity) || live[0] != lo {
		t.Fatalf("write count %d: slots name %v, live seqs %v", wc, fromSlots, live)
	}
	// Every live row has priority 1 (alpha 1, eps 0): the mass is the
	// live rows' count.
	if math.Abs(mass-float64(len(live))) > 1e-9 {
		t.Fatalf("priority mass %v for %d live rows", mass, len(live))
	}
	col, _ := b.Column("observation")
	for _, seq := range []int64{lo - 1, lo - b.capacity/2, lo - (b.slots - b.capacity), 0} {
		if seq < 0 || seq >= lo {
			continue
		}
		if b.Live(seq) {
			t.Errorf("seq %d (below the window at %d) is live", seq, lo)
		}
		if m := metas(t, b, seq)[0]; m.Seq != -1 {
			t.Errorf("seq %d (below the window): row %+v", seq, m)
		}
		missing, err := b.Gather([]int64{seq}, []Column{col}, [][]byte{make([]byte, col.RowBytes)}, nil)
		if err != nil || len(missing) != 1 {
			t.Errorf("gather of seq %d (below the window): missing %v, %v", seq, missing, err)
		}
	}
}

// TestDropScannedClearsPriorities: a snapshot open that finds a
// trajectory's rows overwritten behind its scan drops them from the index
// (dropScanned), and their priorities from the trees with them, so the
// priority mass it reports is the live rows'. Called here on a buffer
// whose rows recovery would have accepted.
func TestDropScannedClearsPriorities(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemmap, 64, true)
	spec.Priority = &PriorityOptions{Alpha: 1, Eps: 0}
	b := mustCreate(t, s, "b", spec)
	var rows []row
	for i := range 30 {
		rows = append(rows, row{env: int64(i % 2), val: float32(i)})
	}
	mustExtend(t, b, "w", makeBatch(spec, rows, true))
	traj := metas(t, b, 0)[0].TrajID
	b.imu.Lock()
	b.dropScanned(traj)
	b.imu.Unlock()
	var mass float64
	if err := b.ReadIndex(func(ix Index) { mass = ix.PriorityTotal() }); err != nil {
		t.Fatal(err)
	}
	// Env 0's 15 rows are gone; env 1's 15 keep priority 1 each.
	if live := len(b.LiveSeqs(0, 64)); live != 15 || math.Abs(mass-15) > 1e-9 {
		t.Fatalf("after dropping a trajectory: %d live rows, priority mass %v (want 15 and 15)", live, mass)
	}
}
