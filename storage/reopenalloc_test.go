package storage

import (
	"fmt"
	"os"
	"runtime"
	"testing"
)

// TestReopenAllocatesLittlePerRow reopens and verifies a full memmap ring
// of each row metadata layout and bounds what the two allocate per live
// row. Recovery and verify read every slot's record; their copy of it (so
// that a record caught mid-write fails as a whole) escaped to the heap
// before it went into a scratch per pass: 64 bytes a row (rows.meta
// version 1) or 16 (version 2) of garbage, on top of what the index keeps
// for the rows. The bound leaves room for the index (per trajectory, not
// per row) and the buffer's fixed costs (a 1 MiB read buffer, a 512 KiB
// page of absent stamps: 8 B a row here), not for a copy a row. On the
// code before the scratch: 153-216 B a row (version 1), 57-58 (version 2);
// after: 26-32.
func TestReopenAllocatesLittlePerRow(t *testing.T) {
	if os.Getenv("RBD_TEST_MEMMAP_ROW_META") != "" {
		t.Skip("names both layouts itself: the default pass runs it")
	}
	const capacity = 200_000
	for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns} {
		t.Run(string(layout), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			spec := testSpec(KindMemmap, capacity, true)
			spec.RowMetaLayout = layout
			spec.Durability = DurabilityNone
			b := mustCreate(t, s, "r", spec)
			rows := make([]row, 2000)
			for i := range rows {
				rows[i] = row{env: int64(i % 4), val: float32(i), terminated: i%100 == 99, final: 1}
			}
			for range 2 * capacity / len(rows) {
				mustExtend(t, b, "w", makeBatch(spec, rows, true))
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			s2 := openStore(t, dir)
			b2, err := s2.Buffer("r")
			if err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&m1)
			if got := int64(len(b2.LiveSeqs(0, capacity+1))); got != capacity {
				t.Fatalf("reopened ring holds %d rows, want %d", got, capacity)
			}
			reopen := float64(m1.TotalAlloc-m0.TotalAlloc) / capacity
			if err := s2.Close(); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&m0)
			rep, err := Verify(dir, nil)
			runtime.ReadMemStats(&m1)
			if err != nil || !rep.OK() {
				t.Fatalf("verify: %v, %+v", err, rep)
			}
			verify := float64(m1.TotalAlloc-m0.TotalAlloc) / capacity
			t.Logf("%s: reopen allocates %.1f B a row, verify %.1f", layout, reopen, verify)
			for _, c := range []struct {
				what string
				got  float64
			}{{"reopen", reopen}, {"verify", verify}} {
				if c.got > 48 {
					t.Errorf("%s of a full %d-row ring (row_meta %s) allocates %s a row, more than 48 B", c.what, capacity, layout, fmt.Sprintf("%.1f B", c.got))
				}
			}
		})
	}
}
