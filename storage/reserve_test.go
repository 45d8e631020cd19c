package storage

import (
	"errors"
	"fmt"
	"os"
	"sync"
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
					settleReservations(t, b)
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

// openQuiet opens dir with no checkpoint but the test's own (a flush
// buffer's periodic ones would move its durable watermark under it).
func openQuiet(t *testing.T, dir string) *Store {
	t.Helper()
	t.Cleanup(func() { removeWitnessesUnder(t, dir) })
	s, err := Open(dir, &Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLapReservedOnlyPastSyncedRows: a none or flush memmap buffer
// reserves seqs a lap at a time once its window holds no row a sync made
// durable, and a block at a time while it does: after a clean close and a
// reopen, or a checkpoint, a power loss that makes the next open resume
// at the reservation takes no more of the synced rows than a block (a
// lap reservation took them all).
func TestLapReservedOnlyPastSyncedRows(t *testing.T) {
	for _, dur := range []Durability{DurabilityNone, DurabilityFlush} {
		for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaBlocks} {
			for _, how := range []string{"reopened", "checkpoint"} {
				t.Run(fmt.Sprintf("%s/%s/%s", dur, layout, how), func(t *testing.T) {
					const capacity = 4096
					dir, s, b, write := newLapTestBuffer(t, capacity, dur, layout)
					for range 2 * capacity / 256 {
						write(b, 256)
					}
					settleReservations(t, b)
					if ahead := b.seqRes.Load() - b.WriteCount(); ahead <= b.seqBlock() {
						t.Fatalf("two laps past its durable watermark (0), the buffer reserves %d seqs ahead, not a lap", ahead)
					}
					switch how {
					case "reopened":
						if err := s.Close(); err != nil {
							t.Fatal(err)
						}
						s = openQuiet(t, dir)
						b = mustBuffer(t, s, "n")
					case "checkpoint":
						if err := s.Checkpoint(); err != nil {
							t.Fatal(err)
						}
					}
					synced := b.Durable()
					write(b, 1)
					settleReservations(t, b)
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
					s = openQuiet(t, dir)
					defer s.Close()
					b = mustBuffer(t, s, "n")
					if lost, limit := syncedRowsLost(b, synced), int(b.seqBlock())+64; lost > limit {
						t.Fatalf("a power loss took %d of the %d rows synced (reservation %d, write count %d): more than a block (%d)", lost, capacity, res, synced+1, limit)
					}
				})
			}
		}
	}
}

// TestReservationsAheadLand: a writer whose extends leave it time finds
// every next block reserved in the background, for every memmap layout
// and durability, with batches that end between multiples of 64 (version
// 3 rounds reservations up to a block of rows: a reservation ahead once
// gave up on every such target, and the writer committed each one itself,
// two fdatasyncs long); a none or flush buffer's blocks are laps once it
// is a lap past its durable watermark, or from its first lap when it never
// synced, and sixteenths of the ring while its window holds synced rows
// (a flush buffer checkpointed every half lap).
func TestReservationsAheadLand(t *testing.T) {
	const capacity = 4096
	cases := []struct {
		name      string
		dur       Durability
		syncEvery int64 // rows between checkpoints; 0: none
		lap       bool
	}{
		{"none", DurabilityNone, 0, true},
		{"flush", DurabilityFlush, 0, true},
		{"flush/synced", DurabilityFlush, capacity / 2, false},
	}
	for _, tc := range cases {
		for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaBlocks} {
			t.Run(fmt.Sprintf("%s/%s", tc.name, layout), func(t *testing.T) {
				dur := tc.dur
				// Rows in 37s, or 7 × 37 for a buffer that reserves laps,
				// which must write past several lap blocks (65536 seqs)
				// for the reservations ahead to be tried at all.
				n, total := 37, 3*capacity
				if tc.lap {
					n, total = 7*37, 3*int(lapBlock(capacity))
				}
				s := openQuiet(t, t.TempDir())
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
				synced := int64(0)
				for k := 0; k < total/n; k++ {
					if tc.syncEvery > 0 && b.WriteCount()-synced >= tc.syncEvery {
						if err := s.Checkpoint(); err != nil {
							t.Fatal(err)
						}
						synced = b.WriteCount()
					}
					if b.WriteCount()+int64(n) > b.seqRes.Load() {
						byWriter++ // this extend must commit a reservation itself
					}
					mustExtend(t, b, "s", makeBatch(spec, rows, false))
					settleReservations(t, b)
					if r := b.seqRes.Load(); r != lastRes {
						reservations++
						lastRes = r
					}
					ahead := b.seqRes.Load() - b.WriteCount()
					if b.WriteCount() < capacity {
						firstLap = max(firstLap, ahead)
					}
					if tc.syncEvery == 0 || synced > 0 {
						// For a synced buffer, from its first
						// checkpoint on: a new buffer's first lap
						// holds no synced row.
						maxAhead = max(maxAhead, ahead)
					}
				}
				if byWriter > 1 { // the first extend of a new buffer reserves for itself
					t.Errorf("the writer committed %d reservations itself: the reservations ahead did not land", byWriter)
				}
				if reservations < 4 {
					t.Errorf("%d reservations in all: too few to have tried the ones ahead", reservations)
				}
				if maxAhead > 2*b.seqBlock() != tc.lap || firstLap <= 2*b.seqBlock() {
					t.Errorf("reserved at most %d seqs ahead (from the first checkpoint on, if any), %d in the first lap (a block is %d, a lap %d): want a lap %v, and one in the first lap", maxAhead, firstLap, b.seqBlock(), lapBlock(capacity), tc.lap)
				}
			})
		}
	}
}

// TestCheckpointCutsTheLapBeforeItsSync: a checkpoint of a none or flush
// buffer (a flush buffer's come every checkpoint interval) that holds a
// lap reservation commits the cut reservation before its sync makes the
// window's rows durable: a power loss between the sync and the
// checkpoint's own commit must not find a lap in the catalog (the next
// open would resume there and drop every row the sync kept); and no lap
// is reserved while the sync runs.
func TestCheckpointCutsTheLapBeforeItsSync(t *testing.T) {
	for _, dur := range []Durability{DurabilityNone, DurabilityFlush} {
		for _, layout := range []RowMetaLayout{RowMetaRuns, RowMetaBlocks} {
			t.Run(fmt.Sprintf("%s/%s", dur, layout), func(t *testing.T) {
				const capacity = 4096
				dir := t.TempDir()
				t.Cleanup(func() { removeWitnessesUnder(t, dir) })
				s, err := Open(dir, &Options{CheckpointInterval: time.Hour}) // no checkpoint but the test's
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				spec := testSpec(KindMemmap, capacity, false)
				spec.Durability, spec.RowMetaLayout = dur, layout
				b := mustCreate(t, s, "n", spec)
				rows := make([]row, 256)
				for i := range rows {
					rows[i] = row{env: int64(i % 4), val: float32(i)}
				}
				for range 3 * capacity / len(rows) {
					mustExtend(t, b, "s", makeBatch(spec, rows, false))
				}
				settleReservations(t, b)
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
}

// diskWatermark reads the durable watermark of buffer name from its
// rows.meta as a power loss would find it.
func diskWatermark(t *testing.T, dir, name string) int64 {
	t.Helper()
	path := metaFile(bufferDir(dir, name))
	meta, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeMetaHeader(path, meta)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version == metaVersionBlocks {
		wr, why := decodeWatermarkRecord(meta[:headerSize])
		if why != "" {
			return 0
		}
		return wr.Seq
	}
	w, ok := readWatermark(meta[:headerSize])
	if !ok {
		return 0
	}
	return w
}

// TestLapReservationsSurviveFailures: a none or flush buffer holding a
// lap reservation must never let a sync raise the watermark on disk while
// the catalog holds the lap, however its catalog commits and syncs fail:
// a power loss would resume at the lap and drop every row the sync made
// durable. Each case makes something fail, then simulates the power loss
// (the catalog as last committed, no witness) and counts the synced rows
// the reopen lost: at most a block. The cases, each a bug a review found:
// a close whose cut reservation fails to commit (it synced all the same);
// a checkpoint whose sync fails after writing its watermark (the
// watermark in memory stayed behind, and the next reservation took a lap
// past the old one); a checkpoint retried after its cut failed (memory
// said cut, the catalog still held the lap, and the retry synced).
func TestLapReservationsSurviveFailures(t *testing.T) {
	errInjected := errors.New("injected failure")
	cases := []struct {
		name string
		fail func(t *testing.T, s *Store, b *Buffer, write func(int))
	}{
		{"close after a failed cut", func(t *testing.T, s *Store, b *Buffer, _ func(int)) {
			s.hooks.putState = func(string) error { return errInjected }
			if err := s.Close(); err == nil {
				t.Fatal("the close succeeded with every catalog commit failing")
			}
		}},
		{"a sync failing after its watermark", func(t *testing.T, s *Store, b *Buffer, write func(int)) {
			s.hooks.afterWatermark = func(string) error { return errInjected }
			if err := s.Checkpoint(); err == nil {
				t.Fatal("the checkpoint succeeded with its sync failing")
			}
			s.hooks.afterWatermark = nil
			// Less than a lap past the watermark on disk: blocks only.
			write(int(b.Capacity()) / 2)
			settleReservations(t, b)
			s.hooks.putState = func(string) error { return errInjected } // the close commits nothing more
			s.Close()
		}},
		{"a checkpoint retried after a failed cut", func(t *testing.T, s *Store, b *Buffer, _ func(int)) {
			// The catalog keeps failing: the retry must not sync
			// either (a retry that took memory's word for the cut
			// synced, then failed its own commit, and the power loss
			// found the lap).
			s.hooks.putState = func(string) error { return errInjected }
			for range 2 {
				if err := s.Checkpoint(); err == nil {
					t.Fatal("the checkpoint succeeded with every catalog commit failing")
				}
			}
			s.Close()
		}},
	}
	for _, tc := range cases {
		for _, dur := range []Durability{DurabilityNone, DurabilityFlush} {
			for _, layout := range []RowMetaLayout{RowMetaRuns, RowMetaBlocks} {
				t.Run(fmt.Sprintf("%s/%s/%s", tc.name, dur, layout), func(t *testing.T) {
					const capacity = 4096
					dir, s, b, writeTo := newLapTestBuffer(t, capacity, dur, layout)
					write := func(n int) { writeTo(b, n) }
					write(2 * capacity) // never synced: a lap reserved
					settleReservations(t, b)
					if ahead := b.seqRes.Load() - b.WriteCount(); ahead <= 2*b.seqBlock() {
						t.Fatalf("%d seqs reserved ahead: no lap held", ahead)
					}
					tc.fail(t, s, b, write)
					synced := diskWatermark(t, dir, "n")
					upEditStates(t, dir, func(_ string, st *bufferState) { st.Clean = false })
					powerLossReboot(t, dir)
					s = openQuiet(t, dir)
					defer s.Close()
					b = mustBuffer(t, s, "n")
					if lost, limit := syncedRowsLost(b, synced), int(b.seqBlock())+blockRows; lost > limit {
						t.Fatalf("a power loss took %d of the rows synced below %d (write count now %d): more than a block (%d)", lost, synced, b.WriteCount(), limit)
					}
				})
			}
		}
	}
}

// settleReservations waits for the buffer's reservation ahead, if any.
func settleReservations(t *testing.T, b *Buffer) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.reservingAhead.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a reservation ahead never finished")
		}
	}
}

// TestFlushCheckpointLoopCutsLaps: a flush buffer written faster than a
// lap a checkpoint interval takes lap reservations again after each of the
// store's periodic checkpoints (once a lap past what it synced), and every
// one of those checkpoints finds the catalog cut back to a block when its
// sync begins.
func TestFlushCheckpointLoopCutsLaps(t *testing.T) {
	const capacity = 4096
	dir := t.TempDir()
	t.Cleanup(func() { removeWitnessesUnder(t, dir) })
	s, err := Open(dir, &Options{CheckpointInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec(KindMemmap, capacity, false)
	spec.Durability = DurabilityFlush
	b := mustCreate(t, s, "f", spec)
	var mu sync.Mutex
	var inSync []string
	syncs := 0
	// Set once, before any sync of the buffer: the checkpoint loop reads
	// it until the store is closed.
	s.hooks.beforeSync = func(string) error {
		entries, err := s.cat.entries()
		if err != nil {
			return err
		}
		wc := b.WriteCount()
		mu.Lock()
		defer mu.Unlock()
		syncs++
		if res := entries[0].state.SeqReserved; res > wc+b.seqBlock()+blockRows {
			inSync = append(inSync, fmt.Sprintf("the catalog reserves %d with %d written", res, wc))
		}
		return nil
	}
	rows := make([]row, 256)
	for i := range rows {
		rows[i] = row{env: int64(i % 4), val: float32(i)}
	}
	// The durable watermarks past which a lap was seen reserved: one a
	// checkpoint.
	lapsPast := map[int64]bool{}
	for deadline := time.Now().Add(30 * time.Second); ; {
		mustExtend(t, b, "s", makeBatch(spec, rows, false))
		if d := b.Durable(); d > 0 && b.seqRes.Load()-b.WriteCount() > 2*b.seqBlock() && b.WriteCount()-capacity >= d {
			lapsPast[d] = true
		}
		mu.Lock()
		n := syncs
		mu.Unlock()
		if n >= 5 && len(lapsPast) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d periodic syncs, a lap seen reserved past %d of their watermarks", n, len(lapsPast))
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(inSync) > 0 {
		t.Fatalf("while a periodic checkpoint synced: %q", inSync)
	}
}

// syncedRowsLost counts the rows below synced, within a ring of b's
// capacity, that b does not hold.
func syncedRowsLost(b *Buffer, synced int64) int {
	lost := 0
	for seq := max(0, synced-b.Capacity()); seq < synced; seq++ {
		if !b.Live(seq) {
			lost++
		}
	}
	return lost
}

// newLapTestBuffer makes memmap buffer "n" of dur and layout in a store of
// its own with no checkpoint but the test's (openQuiet), and a func that
// writes n rows to it (or to it as reopened) in extends of up to 256.
func newLapTestBuffer(t *testing.T, capacity int64, dur Durability, layout RowMetaLayout) (string, *Store, *Buffer, func(*Buffer, int)) {
	t.Helper()
	dir := t.TempDir()
	s := openQuiet(t, dir)
	spec := testSpec(KindMemmap, capacity, false)
	spec.Durability, spec.RowMetaLayout = dur, layout
	b := mustCreate(t, s, "n", spec)
	write := func(b *Buffer, n int) {
		for n > 0 {
			rows := make([]row, min(n, 256))
			for i := range rows {
				rows[i] = row{env: int64(i % 4), val: float32(i)}
			}
			mustExtend(t, b, "s", makeBatch(spec, rows, false))
			n -= len(rows)
		}
	}
	return dir, s, b, write
}
