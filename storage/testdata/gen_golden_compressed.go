//go:build ignore

// gen_golden_compressed writes storage/testdata/v1/compressed-datadir, a
// tiny data dir with one compressed buffer in format version 1 that
// golden_compressed_test.go opens on every test run. Run it from the
// repository root:
//
//	go run ./storage/testdata/gen_golden_compressed.go
//
// Do not regenerate it once committed (see gen_golden.go): bytes a v1
// build wrote must keep opening in every later build.
//
// The buffer "pixels" (capacity 8, compact_obs, zstd level 1, chunk_len 4,
// delta) has a frame-stacked observation uint8 [4,2,3] and a float32 [16]
// field, both in chunks, so zstd frames this build wrote are read back by
// every later one. 12 rows of
// two envs: the ring has wrapped, chunks were sealed by filling and by done
// rows (with final observations), and one trajectory is still open (held
// in fragments) when the store is closed cleanly.
package main

import (
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/rbdb/rbd/storage"
)

const dir = "storage/testdata/v1/compressed-datadir"

func main() {
	if err := os.RemoveAll(dir); err != nil {
		log.Fatal(err)
	}
	s, err := storage.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	spec := storage.Spec{
		Capacity: 8, Storage: storage.KindCompressed, CompactObs: true, ObsKeys: []string{"observation"},
		Durability:  storage.DurabilityFlush,
		Compression: &storage.CompressionOptions{Codec: "zstd", Level: 1, ChunkLen: 4, Delta: true},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Uint8, Shape: []int{4, 2, 3}, FrameStack: &storage.FrameStack{K: 4, Axis: 0}},
			{Name: "features", DType: storage.Float32, Shape: []int{16}},
			{Name: "next.done", DType: storage.Bool, Shape: []int{}},
		},
	}
	b, _, err := s.CreateBuffer("pixels", spec)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range [][2]int{{0, 5}, {5, 9}, {9, 12}} {
		if _, err := b.Extend("gen", batch(r[0], r[1])); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", dir)
}

// The rows, as golden_compressed_test.go recomputes them: row i is env
// i%2; the env's frame t (t = its step count so far) is 6 bytes
// 10*i+k; the observation stacks the env's last 4 frames, zero-padded at a
// trajectory start; rows 6 and 9 are done and send the next stack as their
// final observation; features[k] = i + k/16.
func batch(from, to int) *storage.Batch {
	le := binary.LittleEndian
	f := map[string][]byte{}
	for i := from; i < to; i++ {
		f["observation"] = append(f["observation"], stackOf(i)...)
		for k := 0; k < 16; k++ {
			f["features"] = le.AppendUint32(f["features"], math.Float32bits(float32(i)+float32(k)/16))
		}
		done := i == 6 || i == 9
		f["next.done"] = append(f["next.done"], b2u(done))
		if done {
			f["next.observation"] = append(f["next.observation"], finalOf(i)...)
		}
	}
	env := make([]int64, 0, to-from)
	for i := from; i < to; i++ {
		env = append(env, int64(i%2))
	}
	return &storage.Batch{Rows: to - from, Fields: f, Env: env}
}

func frame(i int) []byte {
	out := make([]byte, 6)
	for k := range out {
		out[k] = byte(10*i + k)
	}
	return out
}

// stackOf is row i's observation: the frames of the rows of its
// trajectory up to i (env i%2; trajectories end at rows 6 and 9).
func stackOf(i int) []byte {
	var rows []int
	for j := i; j >= 0 && j%2 == i%2; j -= 2 {
		if j != i && (j == 6 || j == 9) {
			break
		}
		rows = append([]int{j}, rows...)
	}
	out := make([]byte, 0, 24)
	for k := 0; k < 4; k++ {
		idx := len(rows) - 4 + k
		if idx < 0 {
			out = append(out, make([]byte, 6)...)
		} else {
			out = append(out, frame(rows[idx])...)
		}
	}
	return out
}

// finalOf is the observation after done row i: its stack shifted by the
// frame 100+i.
func finalOf(i int) []byte {
	s := stackOf(i)
	out := append([]byte(nil), s[6:]...)
	for k := 0; k < 6; k++ {
		out = append(out, byte(100+i+k))
	}
	return out
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}
