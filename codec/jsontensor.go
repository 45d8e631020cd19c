package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// JSON tensors are nested arrays; non-finite floats travel as the strings
// "NaN", "Infinity" and "-Infinity" both ways, and float16/bfloat16 values
// are rounded to nearest even on the way in.

// AppendJSONTensor appends t's values as nested JSON arrays.
func AppendJSONTensor(dst []byte, t *Tensor) ([]byte, error) {
	err := walkJSONTensor(t, func(b []byte) { dst = append(dst, b...) })
	return dst, err
}

// JSONTensorSize returns the length of t's JSON text, without making it.
func JSONTensorSize(t *Tensor) (int64, error) {
	var n int64
	err := walkJSONTensor(t, func(b []byte) { n += int64(len(b)) })
	return n, err
}

// WriteJSONTensor writes t's JSON text to w as it is made (w should
// buffer), so a large answer never exists whole in memory.
func WriteJSONTensor(w io.Writer, t *Tensor) error {
	var werr error
	err := walkJSONTensor(t, func(b []byte) {
		if werr == nil {
			_, werr = w.Write(b)
		}
	})
	return errors.Join(err, werr)
}

// walkJSONTensor emits t's JSON text piece by piece; each piece is valid
// only during the call.
func walkJSONTensor(t *Tensor, emit func([]byte)) error {
	size := dtypeSize[t.DType]
	if size == 0 {
		return fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
	}
	if err := checkShape(t.Name, t.Shape, size, len(t.Data)); err != nil {
		return err
	}
	var scratch [48]byte
	i := 0
	open, close, comma := []byte{'['}, []byte{']'}, []byte{','}
	var walk func(dim int)
	walk = func(dim int) {
		if dim == len(t.Shape) {
			emit(appendValue(scratch[:0], t.DType, t.Data[i*size:(i+1)*size]))
			i++
			return
		}
		emit(open)
		for k := 0; k < t.Shape[dim]; k++ {
			if k > 0 {
				emit(comma)
			}
			walk(dim + 1)
		}
		emit(close)
	}
	walk(0)
	return nil
}

func appendFloat(dst []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, bits)
}

func appendValue(dst []byte, dtype string, b []byte) []byte {
	le := binary.LittleEndian
	switch dtype {
	case "bool":
		return strconv.AppendBool(dst, b[0] != 0)
	case "uint8":
		return strconv.AppendUint(dst, uint64(b[0]), 10)
	case "int8":
		return strconv.AppendInt(dst, int64(int8(b[0])), 10)
	case "int16":
		return strconv.AppendInt(dst, int64(int16(le.Uint16(b))), 10)
	case "int32":
		return strconv.AppendInt(dst, int64(int32(le.Uint32(b))), 10)
	case "int64":
		return strconv.AppendInt(dst, int64(le.Uint64(b)), 10)
	case "float16":
		return appendFloat(dst, float64(Float16ToFloat32(le.Uint16(b))), 32)
	case "bfloat16":
		return appendFloat(dst, float64(BFloat16ToFloat32(le.Uint16(b))), 32)
	case "float32":
		return appendFloat(dst, float64(math.Float32frombits(le.Uint32(b))), 32)
	case "float64":
		return appendFloat(dst, math.Float64frombits(le.Uint64(b)), 64)
	}
	return dst
}

// nonFinite reads the strings that stand for non-finite floats.
func nonFinite(v string) (float64, error) {
	switch v {
	case "NaN":
		return math.NaN(), nil
	case "Infinity":
		return math.Inf(1), nil
	case "-Infinity":
		return math.Inf(-1), nil
	}
	return 0, fmt.Errorf("the only strings allowed are \"NaN\", \"Infinity\" and \"-Infinity\", got %q", v)
}

// appendFloatAs appends f in a float dtype (float16 and bfloat16 round to
// nearest even from the float64, as numpy does).
func appendFloatAs(dst []byte, dtype string, f float64) []byte {
	le := binary.LittleEndian
	switch dtype {
	case "float16":
		return le.AppendUint16(dst, Float64ToFloat16(f))
	case "bfloat16":
		return le.AppendUint16(dst, Float64ToBFloat16(f))
	case "float32":
		return le.AppendUint32(dst, math.Float32bits(float32(f)))
	}
	return le.AppendUint64(dst, math.Float64bits(f))
}

// intRange is the range of each integer dtype.
var intRange = map[string][2]int64{
	"uint8": {0, math.MaxUint8}, "int8": {math.MinInt8, math.MaxInt8},
	"int16": {math.MinInt16, math.MaxInt16}, "int32": {math.MinInt32, math.MaxInt32},
	"int64": {math.MinInt64, math.MaxInt64},
}

// appendIntAs appends i in an integer dtype, refusing values out of its
// range.
func appendIntAs(dst []byte, dtype string, i int64) ([]byte, error) {
	lim := intRange[dtype]
	if i < lim[0] || i > lim[1] {
		return dst, fmt.Errorf("%d is out of range for %s", i, dtype)
	}
	le := binary.LittleEndian
	switch dtypeSize[dtype] {
	case 1:
		return append(dst, byte(i)), nil
	case 2:
		return le.AppendUint16(dst, uint16(i)), nil
	case 4:
		return le.AppendUint32(dst, uint32(i)), nil
	}
	return le.AppendUint64(dst, uint64(i)), nil
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}
