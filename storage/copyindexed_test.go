package storage

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"testing"
)

// TestCopyIndexedMatchesGather checks the copy samples of small rows make
// under the index lock against the lock-free Gather: the same bytes for
// live rows (fields, row-group and separate columns, final observations of
// done rows, zeros for rows without one), zeros and a missing entry for
// padding, overwritten and never-written seqs; and Index.Rows against
// Index.Row. Compressed columns are refused.
func TestCopyIndexedMatchesGather(t *testing.T) {
	for _, tc := range []struct {
		kind     Kind
		capacity int64
		rows     int // written, so the ring wraps
		layout   RowMetaLayout
	}{
		{KindMemory, 64, 150, ""},
		{KindMemmap, 64, 150, RowMetaPerRow},
		{KindMemmap, 64, 150, RowMetaRuns},
		{KindMemory, 1000, 300, ""}, // not wrapped
		{KindMemory, 64, 150, RowMetaRuns},
		// More run records than runsInCache: Rows prefetches them.
		{KindMemory, 40_000, 45_000, RowMetaRuns},
		{KindMemory, 64, 150, RowMetaStrided},
		{KindMemory, 40_000, 45_000, RowMetaStrided},
	} {
		t.Run(fmt.Sprintf("%s/cap=%d/row_meta=%s", tc.kind, tc.capacity, cmp.Or(tc.layout, RowMetaPerRow)), func(t *testing.T) {
			s := openStore(t, t.TempDir())
			defer s.Close()
			spec := testSpec(tc.kind, tc.capacity, true)
			spec.RowMetaLayout = tc.layout
			b := mustCreate(t, s, "copy", spec)
			var rows []row
			for i := range tc.rows {
				rows = append(rows, row{env: int64(i % 3), val: float32(i), terminated: i%7 == 6, final: float32(1000 + i)})
			}
			// Final observations for some done rows only, so the tail
			// column has rows with and without one.
			for i := 0; i < len(rows); i += 50 {
				mustExtend(t, b, "s", makeBatch(spec, rows[i:min(i+50, len(rows))], i%100 == 0))
			}
			if tc.capacity > 10_000 && b.runs.handedOut.Load()*runRecordSize <= runsInCache {
				t.Fatalf("%d run records, not more than runsInCache", b.runs.handedOut.Load())
			}
			wc := int64(tc.rows)
			seqs := []int64{-1, 0, 1, wc - tc.capacity - 1, wc + 5}
			for seq := max(0, wc-tc.capacity); seq < wc; seq += 3 {
				seqs = append(seqs, seq)
			}
			seqs = append(seqs, -1, wc-1)
			var cols []Column
			for _, name := range []string{"observation", "action", "next.reward", "next.done", "next.terminated", "next.truncated", "next.observation"} {
				c, ok := b.Column(name)
				if !ok {
					t.Fatalf("no column %q", name)
				}
				cols = append(cols, c)
			}
			dst := func() [][]byte {
				d := make([][]byte, len(cols))
				for i, c := range cols {
					d[i] = bytes.Repeat([]byte{0xAA}, len(seqs)*c.RowBytes) // pooled memory is not zeroed
				}
				return d
			}
			want, got := dst(), dst()
			wantMissing, err := b.Gather(seqs, cols, want, nil)
			if err != nil {
				t.Fatal(err)
			}
			var gotMissing []int
			wantMetas, gotMetas := make([]RowMeta, len(seqs)), make([]RowMeta, len(seqs))
			if err := b.ReadIndex(func(ix Index) {
				gotMissing, err = ix.CopyIndexed(seqs, cols, got, nil)
				for i, seq := range seqs {
					wantMetas[i], _ = ix.Row(seq)
				}
				ix.Rows(seqs, gotMetas)
			}); err != nil {
				t.Fatal(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(gotMissing, wantMissing) {
				t.Errorf("missing: got %v, want %v", gotMissing, wantMissing)
			}
			notLive := 0
			for _, seq := range seqs {
				if seq < max(0, wc-tc.capacity) || seq >= wc {
					notLive++
				}
			}
			if len(wantMissing) != notLive {
				t.Errorf("Gather reports %d missing rows, want %d (the test's seqs are wrong)", len(wantMissing), notLive)
			}
			for i, c := range cols {
				if !bytes.Equal(got[i], want[i]) {
					t.Errorf("column %q: CopyIndexed and Gather differ", c.Name)
				}
			}
			if !slices.Equal(gotMetas, wantMetas) {
				t.Errorf("Rows and Row differ:\n%v\n%v", gotMetas, wantMetas)
			}
			tails := 0
			tail := want[len(cols)-1]
			for j := range seqs {
				if obsOf(tail[16*j:]) != 0 {
					tails++
				}
			}
			if tails == 0 {
				t.Error("no copied row has a final observation: the tail column is not tested")
			}
		})
	}
	t.Run("compressed refused", func(t *testing.T) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(KindCompressed, 64, true)
		b := mustCreate(t, s, "z", spec)
		mustExtend(t, b, "s", makeBatch(spec, []row{{val: 1}, {val: 2}}, false))
		c, _ := b.Column("observation")
		var err error
		if rerr := b.ReadIndex(func(ix Index) {
			_, err = ix.CopyIndexed([]int64{0}, []Column{c}, [][]byte{make([]byte, c.RowBytes)}, nil)
		}); rerr != nil {
			t.Fatal(rerr)
		}
		if err == nil {
			t.Error("CopyIndexed copied a compressed column")
		}
	})
}
