package storage

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"
)

// testdata/v1/compressed-datadir holds a compressed buffer written by a
// format-version-1 build (testdata/gen_golden_compressed.go; never
// regenerate it): sealed chunks and fragments of open chunks, zstd with
// delta, a frame-stacked observation with final observations. Every later
// build must open it and read exactly the rows below (or refuse it on
// purpose with ErrVersionMismatch).
const goldenCompressedDir = "testdata/v1/compressed-datadir"

// The rows, computed as the generator wrote them: row i is env i%2, its
// frame is 6 bytes 10*i+k, observations stack the trajectory's last 4
// frames zero-padded, rows 6 and 9 are done with final observation the
// stack shifted by frame 100+i+k, features[k] = i + k/16.
func gcFrame(i int) []byte {
	out := make([]byte, 6)
	for k := range out {
		out[k] = byte(10*i + k)
	}
	return out
}

func gcStack(i int) []byte {
	var rows []int
	for j := i; j >= 0; j -= 2 {
		if j != i && (j == 6 || j == 9) {
			break
		}
		rows = append([]int{j}, rows...)
	}
	out := make([]byte, 0, 24)
	for k := 0; k < 4; k++ {
		if idx := len(rows) - 4 + k; idx < 0 {
			out = append(out, make([]byte, 6)...)
		} else {
			out = append(out, gcFrame(rows[idx])...)
		}
	}
	return out
}

func gcFinal(i int) []byte {
	out := append([]byte(nil), gcStack(i)[6:]...)
	for k := 0; k < 6; k++ {
		out = append(out, byte(100+i+k))
	}
	return out
}

func gcFeatures(i int) []byte {
	var out []byte
	for k := 0; k < 16; k++ {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(i)+float32(k)/16))
	}
	return out
}

func TestGoldenV1Compressed(t *testing.T) {
	files := readTree(t, goldenCompressedDir)
	if len(files) == 0 {
		t.Fatalf("%s is empty: run go run ./storage/testdata/gen_golden_compressed.go from the repository root", goldenCompressedDir)
	}
	dir := t.TempDir()
	writeTree(t, dir, files)
	rep, err := Verify(dir, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	s := openStore(t, dir)
	defer s.Close()
	b, err := s.Buffer("pixels")
	if err != nil {
		t.Fatal(err)
	}
	check := func(seqs []int64) {
		t.Helper()
		names := []string{"observation", "features", "next.observation", "next.done"}
		cols := make([]Column, len(names))
		dst := make([][]byte, len(names))
		for i, n := range names {
			cols[i], _ = b.Column(n)
			dst[i] = make([]byte, len(seqs)*cols[i].RowBytes)
		}
		meta := make([]RowMeta, len(seqs))
		missing, err := b.Gather(seqs, cols, dst, meta)
		if err != nil || len(missing) > 0 {
			t.Fatalf("gather %v: missing %v, %v", seqs, missing, err)
		}
		for j, seq := range seqs {
			i := int(seq)
			final := make([]byte, 24)
			if i == 6 || i == 9 {
				final = gcFinal(i)
			}
			for c, want := range [][]byte{gcStack(i), gcFeatures(i), final, {b2byte(i == 6 || i == 9)}} {
				rb := cols[c].RowBytes
				if got := dst[c][j*rb : (j+1)*rb]; !bytes.Equal(got, want) {
					t.Errorf("seq %d %s = %v, want %v", seq, names[c], got, want)
				}
			}
			if meta[j].Env != int64(i%2) {
				t.Errorf("seq %d env %d", seq, meta[j].Env)
			}
		}
	}
	if got := b.LiveSeqs(0, 100); len(got) != 8 || got[0] != 4 {
		t.Fatalf("live seqs %v, want 4..11", got)
	}
	check([]int64{4, 5, 6, 7, 8, 9, 10, 11})
	// The open trajectories (rows 8, 10 of env 0 and 11 of env 1, held in
	// fragments) continue on stream "gen".
	m := metas(t, b, 10, 11)
	batch := &Batch{Rows: 1, Env: []int64{0}, Fields: map[string][]byte{
		"observation": gcStack(12), "features": gcFeatures(12), "next.done": {0}}}
	mustExtend(t, b, "gen", batch)
	got := metas(t, b, 12)[0]
	if got.TrajID != m[0].TrajID || got.Step != m[0].Step+1 || got.PrevSeq != 10 {
		t.Fatalf("row 12 = %+v, want trajectory %d step %d after 10", got, m[0].TrajID, m[0].Step+1)
	}
	check([]int64{5, 6, 7, 8, 9, 10, 11, 12})
	// Dedup continued across the restart: row 12 keeps only its newest
	// frame, as it would have without one.
	if l := b.cs.loc[12%8]; l.c == nil || l.c.f[0].modes[l.i] != modeNewest {
		t.Errorf("row 12 is not stored as its newest frame after the reopen")
	}
}
