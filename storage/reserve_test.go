package storage

import (
	"fmt"
	"testing"
	"time"
)

// TestSeqsAreReservedAheadOfWriters: no seq is handed out before a
// catalog commit covers it, and a writer that keeps writing finds the next
// block already reserved (maybeReserveAhead), whether its batches are
// small or larger than a block.
func TestSeqsAreReservedAheadOfWriters(t *testing.T) {
	for _, kind := range kinds {
		for _, rows := range []int{64, 700} { // a block is 512 seqs at capacity 1024
			t.Run(fmt.Sprintf("%s/rows=%d", kind, rows), func(t *testing.T) {
				s := openStore(t, t.TempDir())
				defer s.Close()
				spec := testSpec(kind, 1024, true)
				b := mustCreate(t, s, "r", spec)
				block := b.seqBlock()
				batch := make([]row, rows)
				for k := 0; k < 40; k++ {
					for i := range batch {
						batch[i] = row{env: int64(i % 4), val: float32(k*rows + i)}
					}
					mustExtend(t, b, "s", makeBatch(spec, batch, false))
					b.catMu.Lock()
					committed, wc := b.committed, b.writeCount.Load()
					b.catMu.Unlock()
					if committed == nil || committed.SeqReserved < wc {
						t.Fatalf("batch %d: seqs up to %d handed out, catalog reserves %v", k, wc, committed)
					}
					// Once a reservation ahead lands, the writer has at
					// least half a block left: it never runs out between
					// two batches smaller than that.
					for deadline := time.Now().Add(10 * time.Second); b.reservingAhead.Load(); time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatal("a reservation ahead never finished")
						}
					}
					if res := b.seqRes.Load(); res-wc < block/2 {
						t.Fatalf("batch %d: reserved up to %d with %d written: less than half a block (%d) ahead", k, res, wc, block)
					}
				}
				if b.seqResNext.Load() != 0 {
					t.Fatalf("seqResNext %d left behind", b.seqResNext.Load())
				}
				entries, err := s.cat.entries()
				if err != nil {
					t.Fatal(err)
				}
				if got := entries[0].state.SeqReserved; got != b.seqRes.Load() {
					t.Fatalf("catalog reserves %d, buffer %d", got, b.seqRes.Load())
				}
			})
		}
	}
}
