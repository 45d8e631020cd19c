package storage

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestTailIndexRanks checks tailIndex against a plain list of the seqs
// that carry a tail: for every seq of the window, rank is the number of
// tails before it and pos places each tail at its number modulo the rows.
// Seqs skip ahead now and then (holes, some longer than the window), and
// the index goes round many times.
func TestTailIndexRanks(t *testing.T) {
	for _, capacity := range []int64{1, 7, 64, 100, 1000} {
		ti := newTailIndex(capacity, []*column{{rowBytes: 16}})
		if ti.rows < capacity || ti.rows*16%int64(unix.Getpagesize()) != 0 {
			t.Fatalf("capacity %d: %d tail rows, want at least the capacity and whole pages", capacity, ti.rows)
		}
		rng := rand.New(rand.NewPCG(3, uint64(capacity)))
		var tails []int64 // seqs with a tail, in order
		seq := int64(-1)
		for step := range 30*int(capacity) + 300 {
			seq++
			if rng.IntN(20) == 0 {
				seq += rng.Int64N(3 * capacity) // a hole
			}
			ti.begin(seq)
			if rng.IntN(3) == 0 {
				if got, want := ti.add(seq), int64(len(tails))%ti.rows; got != want {
					t.Fatalf("capacity %d: add(%d) = row %d, want %d", capacity, seq, got, want)
				}
				tails = append(tails, seq)
			}
			from := max(0, seq-capacity+1)
			if step%50 != 0 { // the whole window now and then, a few seqs otherwise
				from = max(from, seq-3)
			}
			for s := from; s <= seq; s++ {
				n, has := slices.BinarySearch(tails, s)
				if got := ti.rank(s); got != int64(n) {
					t.Fatalf("capacity %d: rank(%d) = %d, want %d", capacity, s, got, n)
				}
				if has && ti.pos(s) != int64(n)%ti.rows {
					t.Fatalf("capacity %d: pos(%d) = %d, want %d", capacity, s, ti.pos(s), int64(n)%ti.rows)
				}
			}
		}
	}
}

// residentPages counts the pages of b that are in memory (mincore).
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	page := unix.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestTailStoreReleasesDeadPages fills a compact memory buffer four times
// over with trajectories of 20 rows: the live tails fit in 13 pages,
// and the tail column must hold about that many, not the 52 pages the
// 13107 tails written touch (256 for a column indexed by slot). Every
// live done row's final observation reads back exactly.
func TestTailStoreReleasesDeadPages(t *testing.T) {
	const capacity, trajLen = 1 << 16, 20
	s := openStore(t, t.TempDir())
	defer s.Close()
	b := mustCreate(t, s, "b", testSpec(KindMemory, capacity, true))
	val := float32(0)
	for range 4 * capacity / 1024 {
		rows := make([]row, 1024)
		for i := range rows {
			val++
			rows[i] = row{val: val, terminated: int(val)%trajLen == 0, final: -val}
		}
		mustExtend(t, b, "actor", makeBatch(b.spec, rows, true))
	}
	tail := b.tails[0]
	live := b.ix.tails
	page := int64(unix.Getpagesize())
	want := int((live*int64(tail.rowBytes)+page-1)/page) + 2 // and a page at each end of the window
	if got := residentPages(t, tail.data); got > want {
		t.Errorf("%d live tails: the tail column holds %d pages, want at most %d", live, got, want)
	}
	if live < capacity/trajLen-1 {
		t.Fatalf("only %d live tails", live)
	}

	seqs := b.LiveSeqs(0, capacity)
	col, _ := b.Column("next.observation")
	dst := make([]byte, len(seqs)*col.RowBytes)
	meta := make([]RowMeta, len(seqs))
	if missing, err := b.Gather(seqs, []Column{col}, [][]byte{dst}, meta); err != nil || len(missing) > 0 {
		t.Fatalf("gather: %v, %d missing", err, len(missing))
	}
	checked := 0
	for j, m := range meta {
		if !m.HasTail {
			continue
		}
		v := float32(m.Seq + 1) // row seq holds val seq+1
		for k := range 4 {
			if got, want := obsOf(dst[j*16+4*k:]), -v+float32(k); got != want {
				t.Fatalf("seq %d: final observation[%d] = %v, want %v", m.Seq, k, got, want)
			}
		}
		checked++
	}
	if int64(checked) != live {
		t.Errorf("checked %d final observations, the index counts %d", checked, live)
	}
}
