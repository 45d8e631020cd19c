package storage

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// Two costs behind choices on the hot paths, measured alone so that the
// figures the code's comments and docs/performance.md quote can be
// reproduced:
//
//	go test ./storage -run '^$' -bench 'BenchmarkRowChecksum|BenchmarkSlotOf' -benchtime 1s

// BenchmarkRowChecksum is a CartPole row's data checksum (fields of 16,
// 16, 8, 4, 1, 1 and 1 bytes) as one crc32.Update call per field, and as
// writeRow takes it: the fields staged side by side, one call.
func BenchmarkRowChecksum(b *testing.B) {
	widths := []int{16, 16, 8, 4, 1, 1, 1}
	row := make([]byte, 64)
	for i := range row {
		row[i] = byte(i * 7)
	}
	var sink uint32
	b.Run("calls=per-field", func(b *testing.B) {
		for b.Loop() {
			var crc uint32
			off := 0
			for _, w := range widths {
				crc = crc32.Update(crc, castagnoli, row[off:off+w])
				off += w
			}
			sink += crc
		}
	})
	b.Run("calls=staged", func(b *testing.B) {
		var scratch [crcScratchSize]byte
		for b.Loop() {
			staged := 0
			for _, w := range widths {
				copyField(scratch[staged:], row[staged:staged+w])
				staged += w
			}
			sink += crc32.Update(0, castagnoli, scratch[:staged])
		}
	})
	if sink == 1 {
		b.Log(sink)
	}
}

// BenchmarkSlotOf maps 256 seqs of a 10^5-row ring's live window to slots
// with a division each (way=mod) and through ringSlots (way=ring).
func BenchmarkSlotOf(b *testing.B) {
	const capacity, wc = 100_000, 5_123_456
	rng := rand.New(rand.NewPCG(1, 2))
	seqs := make([]int64, 256)
	for i := range seqs {
		seqs[i] = wc - 1 - rng.Int64N(capacity)
	}
	ring := newRingSlots(wc, capacity)
	capVar := int64(capacity) // a variable, as the buffer's capacity is
	var sink int64
	b.Run("way=mod", func(b *testing.B) {
		for b.Loop() {
			for _, s := range seqs {
				sink += s % capVar
			}
		}
	})
	b.Run("way=ring", func(b *testing.B) {
		for b.Loop() {
			for _, s := range seqs {
				sink += ring.of(s)
			}
		}
	})
	if sink == 1 {
		b.Log(sink)
	}
}
