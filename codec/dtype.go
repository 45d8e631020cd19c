package codec

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DTypes maps rbd dtype names to safetensors dtype names.
var dtypeToST = map[string]string{
	"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
	"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
}

var stToDType = func() map[string]string {
	m := map[string]string{}
	for k, v := range dtypeToST {
		m[v] = k
	}
	return m
}()

var dtypeSize = map[string]int{
	"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
	"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}

// DTypeSize returns the element size of an rbd dtype name, or 0 if unknown.
func DTypeSize(dtype string) int { return dtypeSize[dtype] }

// Tensor is one named array: rbd dtype name (e.g. "float32"), shape and
// little-endian C-order bytes.
type Tensor struct {
	Name  string
	DType string
	Shape []int
	Data  []byte
}

// Elems returns the number of elements the shape holds.
func (t *Tensor) Elems() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32Map decodes float32 tensors (policy weights, as collectors take
// them) into values and shapes by name. Any other dtype is an error naming
// the tensor.
func Float32Map(tensors []Tensor) (map[string][]float32, map[string][]int, error) {
	vals, shapes := make(map[string][]float32, len(tensors)), make(map[string][]int, len(tensors))
	for _, t := range tensors {
		if t.DType != "float32" {
			return nil, nil, fmt.Errorf("tensor %q: dtype %s, want float32", t.Name, t.DType)
		}
		v := make([]float32, len(t.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
		vals[t.Name], shapes[t.Name] = v, t.Shape
	}
	return vals, shapes, nil
}

func checkShape(name string, shape []int, size, nbytes int) error {
	const maxBytes = 1 << 62
	n := 1
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("tensor %q: negative dimension in shape %v", name, shape)
		}
		if d != 0 && n > maxBytes/d {
			return fmt.Errorf("tensor %q: shape %v is too large", name, shape)
		}
		n *= d
	}
	if n > maxBytes/size {
		return fmt.Errorf("tensor %q: shape %v is too large", name, shape)
	}
	if n*size != nbytes {
		return fmt.Errorf("tensor %q: shape %v of %d-byte elements needs %d bytes, has %d", name, shape, size, n*size, nbytes)
	}
	return nil
}
