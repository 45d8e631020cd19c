package codec

import (
	"bytes"
	"encoding/binary"
	"flag"
	"maps"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// go test ./codec -run 'Golden' -update-codec rewrites codec/testdata.
var updateCodec = flag.Bool("update-codec", false, "rewrite the golden files in codec/testdata")

// allDTypes lists every rbd dtype, in the order of the design doc.
var allDTypes = []string{"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"}

var le = binary.LittleEndian

// stFile builds a safetensors file from a raw header (no padding added) and
// data bytes.
func stFile(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	le.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// stPrefix is just an 8-byte header length with whatever follows.
func stPrefix(n uint64, rest string) []byte {
	b := make([]byte, 8, 8+len(rest))
	le.PutUint64(b, n)
	return append(b, rest...)
}

// valuesTensor encodes values (given as float64; ints and bools are
// converted exactly, floats rounded to nearest even) as a tensor.
func valuesTensor(name, dtype string, shape []int, vals ...float64) Tensor {
	size := DTypeSize(dtype)
	data := make([]byte, len(vals)*size)
	for i, v := range vals {
		b := data[i*size : (i+1)*size]
		switch dtype {
		case "bool":
			if v != 0 {
				b[0] = 1
			}
		case "uint8":
			b[0] = uint8(v)
		case "int8":
			b[0] = byte(int8(v))
		case "int16":
			le.PutUint16(b, uint16(int16(v)))
		case "int32":
			le.PutUint32(b, uint32(int32(v)))
		case "int64":
			le.PutUint64(b, uint64(int64(v)))
		case "float16":
			le.PutUint16(b, Float32ToFloat16(float32(v)))
		case "bfloat16":
			le.PutUint16(b, Float32ToBFloat16(float32(v)))
		case "float32":
			le.PutUint32(b, math.Float32bits(float32(v)))
		case "float64":
			le.PutUint64(b, math.Float64bits(v))
		}
	}
	if shape == nil {
		shape = []int{len(vals)}
	}
	return Tensor{Name: name, DType: dtype, Shape: shape, Data: data}
}

// sampleValues returns n values that are exactly representable in dtype,
// covering its extremes and (for floats) -0, subnormals and non-finites.
func sampleValues(dtype string, n int) []float64 {
	var pool []float64
	switch dtype {
	case "bool":
		pool = []float64{0, 1, 1, 0}
	case "uint8":
		pool = []float64{0, 1, 127, 128, 255, 42}
	case "int8":
		pool = []float64{-128, -1, 0, 1, 127, 42}
	case "int16":
		pool = []float64{math.MinInt16, -1, 0, 1, math.MaxInt16, 1234}
	case "int32":
		pool = []float64{math.MinInt32, -1, 0, 1, math.MaxInt32, 123456789}
	case "int64":
		pool = []float64{math.MinInt64, -1, 0, 1, 1 << 53, 1 << 62}
	case "float16":
		pool = []float64{0, math.Copysign(0, -1), 1, -2.5, 65504, 0x1p-24, 0x1p-14, 0.099975586, math.Inf(1), math.Inf(-1), math.NaN()}
	case "bfloat16":
		pool = []float64{0, math.Copysign(0, -1), 1, -2.5, 0x1.fep127, 0x1p-133, 3.140625, math.Inf(1), math.Inf(-1), math.NaN()}
	case "float32":
		pool = []float64{0, math.Copysign(0, -1), 1, -2.5, math.MaxFloat32, math.SmallestNonzeroFloat32, float64(float32(0.1)), math.Inf(1), math.Inf(-1), math.NaN()}
	case "float64":
		pool = []float64{0, math.Copysign(0, -1), 1, -2.5, math.MaxFloat64, math.SmallestNonzeroFloat64, 0.1, math.Inf(1), math.Inf(-1), math.NaN()}
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = pool[i%len(pool)]
	}
	return out
}

// fixtureAllDTypes is one [2,3] tensor per dtype, plus a scalar and two
// zero-length tensors.
func fixtureAllDTypes() []Tensor {
	var ts []Tensor
	for _, dt := range allDTypes {
		ts = append(ts, valuesTensor("t_"+dt, dt, []int{2, 3}, sampleValues(dt, 6)...))
	}
	ts = append(ts,
		valuesTensor("scalar", "float64", []int{}, math.Pi),
		valuesTensor("empty", "float32", []int{0}),
		valuesTensor("empty2d", "int16", []int{3, 0}),
	)
	return ts
}

// tensorsEqual compares name, dtype, shape and bytes, in order.
func tensorsEqual(a, b []Tensor) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Name != y.Name || x.DType != y.DType || !slices.Equal(x.Shape, y.Shape) || !bytes.Equal(x.Data, y.Data) {
			return false
		}
	}
	return true
}

// metaEqual treats nil and empty maps alike: both encode to no
// __metadata__.
func metaEqual(a, b map[string]string) bool { return maps.Equal(a, b) }

// elemsExact multiplies the shape out, reporting overflow or negative dims.
func elemsExact(shape []int) (uint64, bool) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 {
			return 0, false
		}
		n = lo
	}
	return n, true
}

// golden compares got with testdata/name, or rewrites it under
// -update-codec.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateCodec {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./codec -run Golden -update-codec to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\ngot  %q\nwant %q\n(run with -update-codec if the change is intended)", path, got, want)
	}
}

// readTestdata returns every regular file below codec/testdata except the
// fuzz corpus (which go test adds by itself), keyed by path.
func readTestdata(tb testing.TB, ext string) map[string][]byte {
	tb.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir("testdata", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "fuzz" {
				return filepath.SkipDir
			}
			return nil
		}
		if ext != "" && filepath.Ext(path) != ext {
			return nil
		}
		b, err := os.ReadFile(path)
		out[path] = b
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
