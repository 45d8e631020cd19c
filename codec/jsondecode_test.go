package codec

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// jsonFloatRows returns a JSON array of n float32 rows of 4, as a
// CartPole extend body's observation field looks.
func jsonFloatRows(n int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	out := []byte{'['}
	for i := range n {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '[')
		for k := range 4 {
			if k > 0 {
				out = append(out, ',')
			}
			out = strconv.AppendFloat(out, float64(float32(rng.NormFloat64())), 'g', -1, 32)
		}
		out = append(out, ']')
	}
	return append(out, ']')
}

// TestDecodeJSONTensorMemory: decoding costs the output and little else.
// encoding/json into any took ~38 bytes per byte of body.
func TestDecodeJSONTensorMemory(t *testing.T) {
	raw := jsonFloatRows(200_000) // ~8 MiB of JSON, 3.2 MB of float32
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	data, n, err := DecodeJSONTensor(raw, "float32", []int{4})
	runtime.ReadMemStats(&after)
	if err != nil || n != 200_000 {
		t.Fatal(n, err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes of JSON -> %d bytes of float32: %d bytes allocated (%.2f per input byte)", len(raw), len(data), alloc, float64(alloc)/float64(len(raw)))
	// The output is sized from the text and grows as append does: a few
	// times its size in all, and nothing per element.
	if bound := 3*uint64(len(data)) + 1<<20; alloc > bound {
		t.Fatalf("decoding allocated %d bytes for a %d-byte output (bound %d)", alloc, len(data), bound)
	}
}

// go test ./codec -run '^$' -bench JSONDecode -benchmem
func BenchmarkJSONDecode(b *testing.B) {
	raw := jsonFloatRows(20_000)
	for _, impl := range []struct {
		name string
		fn   func([]byte, string, []int) ([]byte, int, error)
	}{{"streaming", DecodeJSONTensor}, {"encoding-json-any", decodeJSONTensorBoxed}} {
		b.Run(impl.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				if _, _, err := impl.fn(raw, "float32", []int{4}); err != nil {
					b.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/float64(len(raw)), "alloc-bytes/input-byte")
			b.ReportMetric(float64(20_000*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}

}

// TestJSONTensorSizeAndWrite: the size pass and the streaming writer give
// exactly the text AppendJSONTensor makes.
func TestJSONTensorSizeAndWrite(t *testing.T) {
	for _, dt := range allDTypes {
		for _, inner := range fuzzShapes {
			n := 3
			for _, d := range inner {
				n *= d
			}
			tt := valuesTensor("x", dt, append([]int{3}, inner...), sampleValues(dt, n)...)
			want, err := AppendJSONTensor(nil, &tt)
			if err != nil {
				t.Fatal(err)
			}
			size, err := JSONTensorSize(&tt)
			var buf bytes.Buffer
			werr := WriteJSONTensor(&buf, &tt)
			if err != nil || werr != nil || size != int64(len(want)) || !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("%s %v: size %d (%v), wrote %q (%v); want %d bytes %q", dt, inner, size, err, buf.Bytes(), werr, len(want), want)
			}
		}
	}
}
