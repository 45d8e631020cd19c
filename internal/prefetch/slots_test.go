package prefetch

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// TestSlots runs Slots over lists with negative slots, a last slot at the
// end of the memory, one slot and none: it returns, and neither the list
// nor the memory it prefetched changed (a prefetch reads nothing into
// registers and writes nothing).
func TestSlots(t *testing.T) {
	const pitch = 24
	mem := make([]byte, 1000*pitch)
	for i := range mem {
		mem[i] = byte(i * 31)
	}
	want := slices.Clone(mem)
	cases := map[string][]int64{
		"none":         {},
		"one":          {7},
		"negatives":    {-1, 3, -1, -1, 999, 0, -5},
		"all negative": {-1, -1},
		"every slot":   nil, // filled below
	}
	for i := range int64(1000) {
		cases["every slot"] = append(cases["every slot"], i)
	}
	for name, slots := range cases {
		t.Run(name, func(t *testing.T) {
			before := slices.Clone(slots)
			Slots(unsafe.Pointer(&mem[0]), slots, pitch)
			if !slices.Equal(slots, before) {
				t.Errorf("slots changed: %v, was %v", slots, before)
			}
			if !slices.Equal(mem, want) {
				t.Error("memory changed")
			}
		})
	}
}

// BenchmarkSlots is a prefetch pass over 256 random rows of a 64 MiB
// region, 64 bytes apart: a Line call per row, or one Slots call. The
// same rows every time, so after the first pass their lines are in cache:
// it measures what the pass itself costs.
func BenchmarkSlots(b *testing.B) {
	const rows, pitch = 1 << 20, 64
	mem := make([]byte, rows*pitch)
	rng := rand.New(rand.NewPCG(1, 2))
	slots := make([]int64, 256)
	for i := range slots {
		slots[i] = rng.Int64N(rows)
	}
	base := unsafe.Pointer(&mem[0])
	b.Run("call=Line", func(b *testing.B) {
		for b.Loop() {
			for _, s := range slots {
				Line(unsafe.Add(base, s*pitch))
			}
		}
	})
	b.Run("call=Slots", func(b *testing.B) {
		for b.Loop() {
			Slots(base, slots, pitch)
		}
	})
}
