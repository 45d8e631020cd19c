package codec

// The boxed JSON decoder DecodeJSONTensor replaced (encoding/json into
// any), kept as the reference its fuzz target compares against.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// DecodeJSONTensor parses nested arrays of shape [N, inner...] into
// little-endian bytes of dtype and returns N. Errors name the element path.
func decodeJSONTensorBoxed(raw []byte, dtype string, inner []int) ([]byte, int, error) {
	size := dtypeSize[dtype]
	if size == 0 {
		return nil, 0, fmt.Errorf("unknown dtype %q", dtype)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, 0, fmt.Errorf("not JSON: %v", err)
	}
	// (The original trimmed with bytes.TrimSpace, which also takes \f and
	// \v for whitespace; JSON's whitespace is space, tab, LF and CR.)
	if rest := bytes.Trim(raw[dec.InputOffset():], " \t\n\r"); len(rest) > 0 {
		return nil, 0, fmt.Errorf("data after the array")
	}
	top, ok := v.([]any)
	if !ok {
		return nil, 0, fmt.Errorf("want an array of rows, got %s", jsonKind(v))
	}
	out := make([]byte, 0, len(top)*size*prod(inner))
	var walk func(v any, dim int, path string) error
	walk = func(v any, dim int, path string) error {
		if dim == len(inner) {
			b, err := encodeValue(v, dtype)
			if err != nil {
				return fmt.Errorf("element %s: %v", path, err)
			}
			out = append(out, b...)
			return nil
		}
		arr, ok := v.([]any)
		if !ok || len(arr) != inner[dim] {
			return fmt.Errorf("element %s: want an array of %d, got %s", path, inner[dim], describe(v))
		}
		for k, x := range arr {
			if err := walk(x, dim+1, fmt.Sprintf("%s[%d]", path, k)); err != nil {
				return err
			}
		}
		return nil
	}
	for r, row := range top {
		if err := walk(row, 0, fmt.Sprintf("[%d]", r)); err != nil {
			return nil, 0, err
		}
	}
	return out, len(top), nil
}

func prod(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

func describe(v any) string {
	if a, ok := v.([]any); ok {
		return fmt.Sprintf("an array of %d", len(a))
	}
	return jsonKind(v)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

func encodeValue(v any, dtype string) ([]byte, error) {
	le := binary.LittleEndian
	if dtype == "bool" {
		switch x := v.(type) {
		case bool:
			return []byte{b2u(x)}, nil
		case json.Number:
			if x == "0" || x == "1" {
				return []byte{b2u(x == "1")}, nil
			}
		}
		return nil, fmt.Errorf("want true, false, 0 or 1, got %s", describe(v))
	}
	var f float64
	isFloat := dtype == "float16" || dtype == "bfloat16" || dtype == "float32" || dtype == "float64"
	switch x := v.(type) {
	case json.Number:
		if !isFloat {
			i, err := strconv.ParseInt(string(x), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("want an integer, got %s", x)
			}
			return encodeInt(i, dtype)
		}
		var err error
		if f, err = strconv.ParseFloat(string(x), 64); err != nil {
			return nil, fmt.Errorf("bad number %s", x)
		}
	case string:
		switch {
		case !isFloat:
			return nil, fmt.Errorf("want an integer, got string %q", x)
		case x == "NaN":
			f = math.NaN()
		case x == "Infinity":
			f = math.Inf(1)
		case x == "-Infinity":
			f = math.Inf(-1)
		default:
			return nil, fmt.Errorf("the only strings allowed are \"NaN\", \"Infinity\" and \"-Infinity\", got %q", x)
		}
	default:
		return nil, fmt.Errorf("want a number, got %s", describe(v))
	}
	b := make([]byte, dtypeSize[dtype])
	switch dtype {
	case "float16":
		le.PutUint16(b, Float64ToFloat16(f))
	case "bfloat16":
		le.PutUint16(b, Float64ToBFloat16(f))
	case "float32":
		le.PutUint32(b, math.Float32bits(float32(f)))
	case "float64":
		le.PutUint64(b, math.Float64bits(f))
	}
	return b, nil
}

func encodeInt(i int64, dtype string) ([]byte, error) {
	lim := map[string][2]int64{
		"uint8": {0, math.MaxUint8}, "int8": {math.MinInt8, math.MaxInt8},
		"int16": {math.MinInt16, math.MaxInt16}, "int32": {math.MinInt32, math.MaxInt32},
		"int64": {math.MinInt64, math.MaxInt64},
	}[dtype]
	if i < lim[0] || i > lim[1] {
		return nil, fmt.Errorf("%d is out of range for %s", i, dtype)
	}
	b := make([]byte, dtypeSize[dtype])
	switch len(b) {
	case 1:
		b[0] = byte(i)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(i))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(i))
	case 8:
		binary.LittleEndian.PutUint64(b, uint64(i))
	}
	return b, nil
}
