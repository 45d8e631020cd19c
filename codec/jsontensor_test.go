package codec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// sameValues compares two encodings of n elements of dtype bit for bit,
// except that any NaN equals any NaN.
func sameValues(dtype string, a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	size := DTypeSize(dtype)
	for i := 0; i+size <= len(a); i += size {
		x, y := a[i:i+size], b[i:i+size]
		if bytes.Equal(x, y) {
			continue
		}
		var nx, ny bool
		switch dtype {
		case "float16":
			nx, ny = isNaN16(le.Uint16(x)), isNaN16(le.Uint16(y))
		case "bfloat16":
			nx, ny = isNaNbf(le.Uint16(x)), isNaNbf(le.Uint16(y))
		case "float32":
			nx, ny = math.IsNaN(float64(f32(le.Uint32(x)))), math.IsNaN(float64(f32(le.Uint32(y))))
		case "float64":
			nx, ny = math.IsNaN(math.Float64frombits(le.Uint64(x))), math.IsNaN(math.Float64frombits(le.Uint64(y)))
		}
		if !nx || !ny {
			return false
		}
	}
	return true
}

func TestJSONTensorRoundTrip(t *testing.T) {
	shapes := [][]int{{}, {0}, {1}, {7}, {2, 3}, {3, 0}, {0, 4}, {2, 2, 3}, {1, 1, 1, 2}}
	for _, dt := range allDTypes {
		for _, shape := range shapes {
			t.Run(fmt.Sprintf("%s%v", dt, shape), func(t *testing.T) {
				n := 1
				for _, d := range shape {
					n *= d
				}
				in := valuesTensor("x", dt, shape, sampleValues(dt, n)...)
				text, err := AppendJSONTensor([]byte("prefix:"), &in)
				if err != nil {
					t.Fatal(err)
				}
				text, ok := bytes.CutPrefix(text, []byte("prefix:"))
				if !ok || !json.Valid(text) {
					t.Fatalf("not JSON appended to dst: %s", text)
				}
				if len(shape) == 0 {
					// A scalar is a bare value; decode it as one row.
					text = append(append([]byte("["), text...), ']')
					shape = []int{1}
				}
				data, rows, err := DecodeJSONTensor(text, dt, shape[1:])
				if err != nil {
					t.Fatalf("decode %s: %v", text, err)
				}
				if rows != shape[0] || !sameValues(dt, data, in.Data) {
					t.Errorf("%s decoded to %d rows %x, want %d rows %x", text, rows, data, shape[0], in.Data)
				}
			})
		}
	}
}

func TestAppendJSONTensorText(t *testing.T) {
	for _, c := range []struct {
		t    Tensor
		want string
	}{
		{valuesTensor("", "float32", []int{2, 2}, 1.5, math.NaN(), math.Inf(1), math.Inf(-1)), `[[1.5,"NaN"],["Infinity","-Infinity"]]`},
		{valuesTensor("", "float64", nil, 0.1, math.Copysign(0, -1), 1e300, 5e-324), `[0.1,-0,1e+300,5e-324]`},
		{valuesTensor("", "float32", nil, float64(float32(0.1)), 1e6, 16777216), `[0.1,1e+06,1.6777216e+07]`},
		{valuesTensor("", "float16", nil, 0.1, 65504, 0x1p-24, math.NaN(), math.Inf(-1)), `[0.099975586,65504,5.9604645e-08,"NaN","-Infinity"]`},
		{valuesTensor("", "bfloat16", nil, 0.1, math.Pi, math.Inf(1)), `[0.100097656,3.140625,"Infinity"]`},
		{valuesTensor("", "bool", []int{3, 1}, 1, 0, 1), `[[true],[false],[true]]`},
		{valuesTensor("", "uint8", nil, 0, 255), `[0,255]`},
		{valuesTensor("", "int8", nil, -128, 127), `[-128,127]`},
		{valuesTensor("", "int16", nil, -32768, 32767), `[-32768,32767]`},
		{valuesTensor("", "int32", nil, math.MinInt32, math.MaxInt32), `[-2147483648,2147483647]`},
		{valuesTensor("", "int64", nil, math.MinInt64, 1<<62), `[-9223372036854775808,4611686018427387904]`},
		{Tensor{DType: "int64", Shape: []int{}, Data: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}}, `9223372036854775807`},
		{valuesTensor("", "uint8", []int{}, 7), `7`},
		{valuesTensor("", "uint8", []int{0}), `[]`},
		{valuesTensor("", "uint8", []int{2, 0}), `[[],[]]`},
		{valuesTensor("", "uint8", []int{0, 2}), `[]`},
		{valuesTensor("", "int16", []int{2, 1, 2}, 1, 2, 3, 4), `[[[1,2]],[[3,4]]]`},
	} {
		got, err := AppendJSONTensor(nil, &c.t)
		if err != nil || string(got) != c.want {
			t.Errorf("AppendJSONTensor(%s %v) = %s, %v; want %s", c.t.DType, c.t.Shape, got, err, c.want)
		}
	}
}

func TestAppendJSONTensorErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		t    Tensor
	}{
		{"unknown dtype", Tensor{Name: "a", DType: "complex64", Shape: []int{1}, Data: make([]byte, 8)}},
		{"short data", Tensor{Name: "a", DType: "int32", Shape: []int{2}, Data: make([]byte, 4)}},
		{"negative dim", Tensor{Name: "a", DType: "uint8", Shape: []int{-1}}},
		// 2^62 eight-byte elements: the byte count wraps to 0 in int64.
		{"overflowing shape", Tensor{Name: "a", DType: "int64", Shape: []int{1 << 62}}},
		{"overflowing 2-d shape", Tensor{Name: "a", DType: "float32", Shape: []int{1 << 31, 1 << 31}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("AppendJSONTensor(%s %v, %d bytes) panicked: %v; want an error", c.t.DType, c.t.Shape, len(c.t.Data), p)
				}
			}()
			if got, err := AppendJSONTensor(nil, &c.t); err == nil || !strings.Contains(err.Error(), `"a"`) {
				t.Errorf("AppendJSONTensor = %q, %v; want an error naming tensor \"a\"", got, err)
			}
		})
	}
}

func TestDecodeJSONTensorValues(t *testing.T) {
	h := func(v ...uint16) []byte {
		var b []byte
		for _, x := range v {
			b = le.AppendUint16(b, x)
		}
		return b
	}
	for _, c := range []struct {
		raw, dtype string
		inner      []int
		want       []byte
		rows       int
	}{
		{`[true,false,1,0]`, "bool", nil, []byte{1, 0, 1, 0}, 4},
		{`[[0,255]]`, "uint8", []int{2}, []byte{0, 255}, 1},
		{`[-128,127,-0]`, "int8", nil, []byte{0x80, 0x7f, 0}, 3},
		{`[-32768, 32767]`, "int16", nil, h(0x8000, 0x7fff), 2},
		{`[-2147483648]`, "int32", nil, []byte{0, 0, 0, 0x80}, 1},
		{`[9223372036854775807,-9223372036854775808]`, "int64", nil, append(le.AppendUint64(nil, math.MaxInt64), le.AppendUint64(nil, 1<<63)...), 2},
		{`["NaN","Infinity","-Infinity",-0,1e-8,65504,65519,65520,1e9,0.1]`, "float16", nil, h(0x7e00, 0x7c00, 0xfc00, 0x8000, 0x0000, 0x7bff, 0x7bff, 0x7c00, 0x7c00, 0x2e66), 10},
		// 1 + 2^-11 is halfway between two float16s: to even.
		{`[1.00048828125, 1.00146484375, 5.960464477539063e-08, 2.9802322387695312e-08]`, "float16", nil, h(0x3c00, 0x3c02, 0x0001, 0x0000), 4},
		// Decimal input is rounded to float16 once, as numpy does:
		// 1.0004882822 is above the halfway point 1.00048828125, so it
		// rounds up to 0x3c01, even though float32(1.0004882822) is that
		// halfway point exactly.
		{`[1.0004882822, 0.99975585938, -1.0004882822]`, "float16", nil, h(0x3c01, 0x3c00, 0xbc01), 3},
		{`["NaN", 3.140625, 1.00390625, 1e39, -1e39]`, "bfloat16", nil, h(0x7fc0, 0x4049, 0x3f80, 0x7f80, 0xff80), 5},
		{`[[1.5, "NaN"], ["Infinity", 1e39]]`, "float32", []int{2}, []byte{0, 0, 0xc0, 0x3f, 0, 0, 0xc0, 0x7f, 0, 0, 0x80, 0x7f, 0, 0, 0x80, 0x7f}, 2},
		{`[0.1, -0, 1E2, 5e-324]`, "float64", nil, slices.Concat(le.AppendUint64(nil, math.Float64bits(0.1)), le.AppendUint64(nil, 1<<63), le.AppendUint64(nil, math.Float64bits(100)), le.AppendUint64(nil, 1)), 4},
		{`[]`, "float32", []int{3}, []byte{}, 0},
		{`[[],[]]`, "int32", []int{0}, []byte{}, 2},
		{` [ [ [ 1 ] , [ 2 ] ] ] `, "uint8", []int{2, 1}, []byte{1, 2}, 1},
	} {
		got, rows, err := DecodeJSONTensor(json.RawMessage(c.raw), c.dtype, c.inner)
		if err != nil || rows != c.rows || !bytes.Equal(got, c.want) {
			t.Errorf("DecodeJSONTensor(%s, %s, %v) = %x, %d, %v; want %x, %d", c.raw, c.dtype, c.inner, got, rows, err, c.want, c.rows)
		}
	}
}

func TestDecodeJSONTensorErrors(t *testing.T) {
	for _, c := range []struct {
		raw, dtype string
		inner      []int
		want       []string // all must appear in the error
	}{
		{`{"a":1}`, "float32", nil, []string{"want an array of rows, got an object"}},
		{`5`, "float32", nil, []string{"want an array of rows, got a number"}},
		{`null`, "float32", nil, []string{"got null"}},
		{`"NaN"`, "float32", nil, []string{"got a string"}},
		{`[1,`, "float32", nil, []string{"not JSON"}},
		{``, "float32", nil, []string{"not JSON"}},
		{`[1]`, "float8", nil, []string{`unknown dtype "float8"`}},
		// Wrong nesting.
		{`[[1,2],5]`, "float32", []int{2}, []string{"element [1]:", "want an array of 2, got a number"}},
		{`[1]`, "float32", []int{1}, []string{"element [0]:", "want an array of 1, got a number"}},
		{`[[1]]`, "float32", nil, []string{"element [0]:", "want a number, got an array of 1"}},
		{`[[[1,2]],[[1,2],[3,4]]]`, "int16", []int{1, 2}, []string{"element [1]:", "want an array of 1, got an array of 2"}},
		{`[[[1,2]],[[1,[2]]]]`, "int16", []int{1, 2}, []string{"element [1][0][1]:", "want a number, got an array of 1"}},
		{`[[[1,2]],[{"a":1}]]`, "int16", []int{1, 2}, []string{"element [1][0]:", "got an object"}},
		// Wrong count.
		{`[[1,2],[3]]`, "float32", []int{2}, []string{"element [1]:", "want an array of 2, got an array of 1"}},
		{`[[1,2],[3,4,5]]`, "uint8", []int{2}, []string{"element [1]:", "want an array of 2, got an array of 3"}},
		{`[[[1,2,3]],[[4,5]]]`, "float64", []int{1, 3}, []string{"element [1][0]:", "want an array of 3, got an array of 2"}},
		// Out-of-range ints.
		{`[0,256]`, "uint8", nil, []string{"element [1]:", "256 is out of range for uint8"}},
		{`[-1]`, "uint8", nil, []string{"element [0]:", "out of range for uint8"}},
		{`[[127,128]]`, "int8", []int{2}, []string{"element [0][1]:", "128 is out of range for int8"}},
		{`[-129]`, "int8", nil, []string{"element [0]:", "out of range for int8"}},
		{`[32768]`, "int16", nil, []string{"element [0]:", "out of range for int16"}},
		{`[-2147483649]`, "int32", nil, []string{"element [0]:", "out of range for int32"}},
		{`[9223372036854775808]`, "int64", nil, []string{"element [0]:", "9223372036854775808"}},
		{`[-9223372036854775809]`, "int64", nil, []string{"element [0]:", "-9223372036854775809"}},
		// Not integers.
		{`[1.5]`, "int32", nil, []string{"element [0]:", "want an integer, got 1.5"}},
		{`[1.0]`, "int64", nil, []string{"element [0]:", "want an integer, got 1.0"}},
		{`[1e3]`, "int16", nil, []string{"element [0]:", "want an integer, got 1e3"}},
		{`["NaN"]`, "int32", nil, []string{"element [0]:", `want an integer, got string "NaN"`}},
		{`[2]`, "bool", nil, []string{"element [0]:", "want true, false, 0 or 1, got a number"}},
		{`["true"]`, "bool", nil, []string{"element [0]:", "got a string"}},
		{`[null]`, "bool", nil, []string{"element [0]:", "got null"}},
		// Strings other than the three.
		{`[1,"nan"]`, "float32", nil, []string{"element [1]:", `"NaN", "Infinity" and "-Infinity"`, `got "nan"`}},
		{`["inf"]`, "float64", nil, []string{"element [0]:", `got "inf"`}},
		{`["+Infinity"]`, "float16", nil, []string{"element [0]:", `got "+Infinity"`}},
		{`["1.5"]`, "bfloat16", nil, []string{"element [0]:", `got "1.5"`}},
		{`[""]`, "float32", nil, []string{"element [0]:", `got ""`}},
		// Non-numbers.
		{`[true]`, "float32", nil, []string{"element [0]:", "want a number, got a boolean"}},
		{`[null]`, "float64", nil, []string{"element [0]:", "want a number, got null"}},
		{`[{}]`, "int8", nil, []string{"element [0]:", "want a number, got an object"}},
		{`[[1,2],[3,true]]`, "int64", []int{2}, []string{"element [1][1]:", "want a number, got a boolean"}},
		{`[1e400]`, "float64", nil, []string{"element [0]:", "1e400"}},
	} {
		got, rows, err := DecodeJSONTensor(json.RawMessage(c.raw), c.dtype, c.inner)
		if err == nil {
			t.Errorf("DecodeJSONTensor(%s, %s, %v) = %x, %d; want an error", c.raw, c.dtype, c.inner, got, rows)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("DecodeJSONTensor(%s, %s, %v): error %q lacks %q", c.raw, c.dtype, c.inner, err, w)
			}
		}
	}
}
