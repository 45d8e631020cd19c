package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// blocksSpec is testSpec's compact memmap buffer of capacity rows with
// rows.meta format version 3.
func blocksSpec(capacity int64, d Durability) Spec {
	spec := testSpec(KindMemmap, capacity, true)
	spec.RowMetaLayout = RowMetaBlocks
	spec.Durability = d
	return spec
}

// openStoreV3 is openStore for a store that may create version 3 buffers.
func openStoreV3(t testing.TB, dir string) *Store {
	t.Helper()
	s := openStore(t, dir)
	s.formatV3 = true
	return s
}

// blocksWorkload writes n rows into b in extends of the given shape:
// "collector" (8 envs in lockstep, batches of 64, episodes of 5 to 40
// steps), "actors" (one step a request from 12 streams in turn) or
// "huge" (one extend of more rows than the ring, then small ones).
func blocksWorkload(t testing.TB, b *Buffer, shape string, n, from int) {
	t.Helper()
	spec := b.Spec()
	switch shape {
	case "collector":
		const envs = 8
		for k := from; k < from+n; k += 64 {
			rows := make([]row, min(64, from+n-k))
			for i := range rows {
				v := k + i
				e := v % envs
				rows[i] = row{env: int64(e), val: float32(v), terminated: (v/envs)%(5+e*5) == 4+e*5, final: float32(-v)}
			}
			mustExtend(t, b, "c", makeBatch(spec, rows, true))
		}
	case "actors":
		for k := from; k < from+n; k++ {
			a := k % 12
			r := row{val: float32(k), truncated: k%(7+a) == 0, final: float32(k) + 0.5}
			mustExtend(t, b, fmt.Sprintf("a%d", a), makeBatch(spec, []row{r}, true))
		}
	case "huge":
		rows := make([]row, int(spec.Capacity)+97)
		for i := range rows {
			v := from + i
			rows[i] = row{env: int64(v % 3), val: float32(v), terminated: v%11 == 10, final: float32(v * 2)}
		}
		mustExtend(t, b, "h", makeBatch(spec, rows, true))
		blocksWorkload(t, b, "collector", n, from+len(rows))
	default:
		t.Fatalf("unknown shape %q", shape)
	}
}

// TestBlocksRoundTrip: a version 3 buffer's rows read back the same after
// a clean close and reopen (verify finds the dir clean), extends go on in
// the block they left off in, and the files hold what version 3 says:
// rows.meta of two record copies a block, columns of S slots.
func TestBlocksRoundTrip(t *testing.T) {
	for _, capacity := range []int64{64, 100, 1000} {
		for _, d := range []Durability{DurabilityNone, DurabilityFlush, DurabilityFsync} {
			for _, shape := range []string{"collector", "actors", "huge"} {
				t.Run(fmt.Sprintf("cap%d/%s/%s", capacity, d, shape), func(t *testing.T) {
					dir := t.TempDir()
					s := openStoreV3(t, dir)
					b := mustCreate(t, s, "b", blocksSpec(capacity, d))
					n := int(capacity)*2 + 37
					blocksWorkload(t, b, shape, n, 0)
					want := servedRows(t, b)
					if len(want) == 0 {
						t.Fatal("no rows")
					}
					wc := b.WriteCount()
					s, b = reopenVerified(t, s, dir, "b")
					if b.WriteCount() != wc {
						t.Fatalf("write count %d after a clean reopen, %d before", b.WriteCount(), wc)
					}
					if got := checkServed(t, b, want); len(got) != len(want) {
						t.Fatalf("%d rows after reopening, %d before", len(got), len(want))
					}
					// The block being filled continues: no seq is skipped.
					blocksWorkload(t, b, shape, 50, n+1000)
					want = servedRows(t, b)
					wc = b.WriteCount()
					s, b = reopenVerified(t, s, dir, "b")
					if got := checkServed(t, b, want); len(got) != len(want) || b.WriteCount() != wc {
						t.Fatalf("%d rows and write count %d after the second reopen, %d and %d before", len(got), b.WriteCount(), len(want), wc)
					}
					slots := spareSlots(capacity)
					if got, want := fileSize(t, metaFile(b.dir)), metaV3Size(slots); got != want {
						t.Errorf("rows.meta is %d bytes, want %d", got, want)
					}
					if got, want := fileSize(t, filepath.Join(b.dir, colFileName("observation"))), headerSize+slots*16; got != want {
						t.Errorf("observation column is %d bytes, want %d (%d slots)", got, want, slots)
					}
					info, err := b.Info()
					if err != nil {
						t.Fatal(err)
					}
					if info.RowMetaBytes != 1 {
						t.Errorf("row_meta_bytes %d, want 1", info.RowMetaBytes)
					}
					_ = s
				})
			}
		}
	}
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestBlocksRefusedUntilBuilt: CreateBuffer refuses row_meta "blocks" (a
// spec error that is ErrNotSupported) unless the store allows version 3,
// and on memory and compressed buffers whatever the store.
func TestBlocksRefusedUntilBuilt(t *testing.T) {
	if formatV3Built {
		t.Skip("built with the rbd_blocks tag, which lets every store create version 3 buffers")
	}
	s := openStore(t, t.TempDir())
	defer s.Close()
	_, _, err := s.CreateBuffer("b", blocksSpec(100, DurabilityFlush))
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("create a blocks buffer: %v, want ErrNotSupported and ErrInvalidSpec", err)
	}
	s.formatV3 = true
	for _, kind := range []Kind{KindMemory, KindCompressed} {
		spec := testSpec(kind, 100, true)
		spec.RowMetaLayout = RowMetaBlocks
		if _, _, err := s.CreateBuffer("m", spec); !errors.Is(err, ErrInvalidSpec) || errors.Is(err, ErrNotSupported) {
			t.Errorf("%s buffer with row_meta blocks: %v, want an invalid spec", kind, err)
		}
	}
}
