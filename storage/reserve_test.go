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

// TestNoneReservesALapOnlyPastItsSyncedRows: a none memmap buffer reserves
// seqs a lap at a time once its window holds no row a sync made durable,
// and a block at a time while it does: after a clean close and a reopen,
// or an explicit checkpoint, a power loss that makes the next open resume
// at the reservation takes no more of the synced rows than a flush
// buffer's block (a lap reservation took them all).
func TestNoneReservesALapOnlyPastItsSyncedRows(t *testing.T) {
	for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaBlocks} {
		for _, how := range []string{"reopened", "checkpoint"} {
			t.Run(fmt.Sprintf("%s/%s", layout, how), func(t *testing.T) {
				const capacity = 4096
				dir := t.TempDir()
				s := openStore(t, dir)
				spec := testSpec(KindMemmap, capacity, false)
				spec.Durability, spec.RowMetaLayout = DurabilityNone, layout
				b := mustCreate(t, s, "n", spec)
				write := func(n int) {
					rows := make([]row, n)
					for i := range rows {
						rows[i] = row{env: int64(i % 4), val: float32(i)}
					}
					mustExtend(t, b, "s", makeBatch(spec, rows, false))
				}
				for range 2 * capacity / 256 {
					write(256)
				}
				settle := func() {
					for deadline := time.Now().Add(10 * time.Second); b.reservingAhead.Load(); time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatal("a reservation ahead never finished")
						}
					}
				}
				settle()
				if ahead := b.seqRes.Load() - b.WriteCount(); ahead <= b.seqBlock() {
					t.Fatalf("two laps past its durable watermark (0), the buffer reserves %d seqs ahead, not a lap", ahead)
				}
				switch how {
				case "reopened":
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					s = openStore(t, dir)
					b = mustBuffer(t, s, "n")
				case "checkpoint":
					if err := s.Checkpoint(); err != nil {
						t.Fatal(err)
					}
				}
				synced := b.Durable()
				write(1)
				settle()
				res := b.seqRes.Load()
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				// The power loss: the files as the close left them (so
				// every row is there), the catalog as the last commit
				// before it, under another boot.
				upEditStates(t, dir, func(_ string, st *bufferState) {
					st.Clean, st.SeqReserved = false, res
				})
				powerLossReboot(t, dir)
				s = openStore(t, dir)
				defer s.Close()
				b = mustBuffer(t, s, "n")
				lost := 0
				for seq := max(0, synced-capacity); seq < synced; seq++ {
					if !b.Live(seq) {
						lost++
					}
				}
				if limit := int(b.seqBlock()) + 64; lost > limit {
					t.Fatalf("a power loss took %d of the %d rows synced (reservation %d, write count %d): more than a block (%d)", lost, capacity, res, synced+1, limit)
				}
			})
		}
	}
}

// TestReservationsAheadLand: a writer whose extends leave it time finds
// every next block reserved in the background, for every memmap layout
// and durability, with batches that end between multiples of 64 (version
// 3 rounds reservations up to a block of rows: a reservation ahead once
// gave up on every such target, and the writer committed each one itself,
// two fdatasyncs long); a none buffer's blocks are laps once it is a lap
// past its durable watermark, or from its first lap when it never synced.
func TestReservationsAheadLand(t *testing.T) {
	for _, dur := range []Durability{DurabilityNone, DurabilityFlush} {
		for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaBlocks} {
			t.Run(fmt.Sprintf("%s/%s", dur, layout), func(t *testing.T) {
				const capacity = 4096
				// Rows in 37s, or 7 × 37 for a none buffer, which must
				// write past several lap blocks (65536 seqs) for the
				// reservations ahead to be tried at all.
				n, total := 37, 3*capacity
				if dur == DurabilityNone {
					n, total = 7*37, 3*int(lapBlock(capacity))
				}
				s := openStore(t, t.TempDir())
				defer s.Close()
				spec := testSpec(KindMemmap, capacity, false)
				spec.Durability, spec.RowMetaLayout = dur, layout
				b := mustCreate(t, s, "r", spec)
				rows := make([]row, n)
				for i := range rows {
					rows[i] = row{env: int64(i % 4), val: float32(i)}
				}
				byWriter := 0
				maxAhead, firstLap := int64(0), int64(0)
				reservations, lastRes := 0, int64(0)
				for k := 0; k < total/n; k++ {
					if b.WriteCount()+int64(n) > b.seqRes.Load() {
						byWriter++ // this extend must commit a reservation itself
					}
					mustExtend(t, b, "s", makeBatch(spec, rows, false))
					for deadline := time.Now().Add(10 * time.Second); b.reservingAhead.Load(); time.Sleep(100 * time.Microsecond) {
						if time.Now().After(deadline) {
							t.Fatal("a reservation ahead never finished")
						}
					}
					if r := b.seqRes.Load(); r != lastRes {
						reservations++
						lastRes = r
					}
					maxAhead = max(maxAhead, b.seqRes.Load()-b.WriteCount())
					if b.WriteCount() < capacity {
						firstLap = maxAhead
					}
				}
				if byWriter > 1 { // the first extend of a new buffer reserves for itself
					t.Errorf("the writer committed %d reservations itself: the reservations ahead did not land", byWriter)
				}
				if reservations < 4 {
					t.Errorf("%d reservations in all: too few to have tried the ones ahead", reservations)
				}
				if lap := dur == DurabilityNone; lap != (maxAhead > 2*b.seqBlock()) || lap != (firstLap > 2*b.seqBlock()) {
					t.Errorf("reserved at most %d seqs ahead, %d in the first lap (a block is %d, a lap %d): want a lap %v", maxAhead, firstLap, b.seqBlock(), lapBlock(capacity), lap)
				}
			})
		}
	}
}

// TestNoneCheckpointCutsTheLapBeforeItsSync: a checkpoint of a none
// buffer that holds a lap reservation commits the cut reservation before
// its sync makes the window's rows durable: a power loss between the sync
// and the checkpoint's own commit must not find a lap in the catalog (the
// next open would resume there and drop every row the sync kept); and no
// lap is reserved while the sync runs.
func TestNoneCheckpointCutsTheLapBeforeItsSync(t *testing.T) {
	for _, layout := range []RowMetaLayout{RowMetaRuns, RowMetaBlocks} {
		t.Run(string(layout), func(t *testing.T) {
			const capacity = 4096
			s := openStore(t, t.TempDir())
			defer s.Close()
			spec := testSpec(KindMemmap, capacity, false)
			spec.Durability, spec.RowMetaLayout = DurabilityNone, layout
			b := mustCreate(t, s, "n", spec)
			rows := make([]row, 256)
			for i := range rows {
				rows[i] = row{env: int64(i % 4), val: float32(i)}
			}
			for range 3 * capacity / len(rows) {
				mustExtend(t, b, "s", makeBatch(spec, rows, false))
			}
			for deadline := time.Now().Add(10 * time.Second); b.reservingAhead.Load(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("a reservation ahead never finished")
				}
			}
			if ahead := b.seqRes.Load() - b.WriteCount(); ahead <= 2*b.seqBlock() {
				t.Fatalf("three laps in, %d seqs reserved ahead: no lap to cut", ahead)
			}
			var inSync []string
			s.hooks.beforeSync = func(string) error {
				entries, err := s.cat.entries()
				if err != nil {
					return err
				}
				wc := b.WriteCount()
				if res := entries[0].state.SeqReserved; res > wc+b.seqBlock()+blockRows {
					inSync = append(inSync, fmt.Sprintf("the catalog reserves %d with %d written", res, wc))
				}
				if b.seqBlockTo(wc) != b.seqBlock() {
					inSync = append(inSync, "a lap may be reserved during the sync")
				}
				return nil
			}
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			s.hooks.beforeSync = nil
			if len(inSync) > 0 {
				t.Fatalf("while the checkpoint synced: %q", inSync)
			}
		})
	}
}
