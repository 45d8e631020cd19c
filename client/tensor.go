package client

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/rbdb/rbd/codec"
)

// Batch is a decoded tensor answer (Sample, Rows). Its tensors alias one
// buffer holding the whole answer, in the order the server sent them.
type Batch struct {
	Tensors []codec.Tensor
	// Metadata is the safetensors __metadata__: "epoch" and "epoch_end" for
	// without-replacement samplers; nil when the server sent none.
	Metadata map[string]string

	release func() // shared-memory batches: hands the slot back
}

// Release hands a shared-memory batch's slot back to the server
// (StreamOptions.SharedMemory); its tensors must not be used after it. It
// does nothing for other batches, whose memory is the garbage collector's.
func (b *Batch) Release() {
	if b.release != nil {
		b.release()
		b.release = nil
		b.Tensors = nil
	}
}

// Tensor returns the named tensor.
func (b *Batch) Tensor(name string) (*codec.Tensor, bool) {
	for i := range b.Tensors {
		if b.Tensors[i].Name == name {
			return &b.Tensors[i], true
		}
	}
	return nil, false
}

// Rows returns the leading dimension of the batch's tensors (B for
// transition samples, num_slices for slices, n for Rows), or 0 for an
// empty batch.
func (b *Batch) Rows() int {
	for _, t := range b.Tensors {
		if len(t.Shape) > 0 {
			return t.Shape[0]
		}
	}
	return 0
}

// Elem is an element type the typed tensor helpers convert to and from;
// float16 and bfloat16 tensors are read from Data with codec's converters.
type Elem interface {
	bool | uint8 | int8 | int16 | int32 | int64 | float32 | float64
}

// dtypeOf returns the rbd dtype name of T.
func dtypeOf[T Elem]() string {
	var z T
	switch any(z).(type) {
	case bool:
		return "bool"
	case uint8:
		return "uint8"
	case int8:
		return "int8"
	case int16:
		return "int16"
	case int32:
		return "int32"
	case int64:
		return "int64"
	case float32:
		return "float32"
	default:
		return "float64"
	}
}

// NewTensor returns a tensor of values, little-endian, in C order. A nil
// shape means one dimension of len(values). The shape is not checked
// here: Extend reports a shape that does not match len(values).
func NewTensor[T Elem](name string, shape []int, values []T) codec.Tensor {
	if shape == nil {
		shape = []int{len(values)}
	}
	data, _ := binary.Append(make([]byte, 0, len(values)*codec.DTypeSize(dtypeOf[T]())), binary.LittleEndian, values)
	return codec.Tensor{Name: name, DType: dtypeOf[T](), Shape: slices.Clone(shape), Data: data}
}

// Values returns t's elements, flattened in C order, as a new slice. T
// must match t's dtype exactly.
func Values[T Elem](t *codec.Tensor) ([]T, error) {
	if want := dtypeOf[T](); t.DType != want {
		return nil, fmt.Errorf("tensor %q: dtype %s, not %s", t.Name, t.DType, want)
	}
	size := codec.DTypeSize(t.DType)
	if len(t.Data)%size != 0 {
		return nil, fmt.Errorf("tensor %q: %d bytes is not a whole number of %s", t.Name, len(t.Data), t.DType)
	}
	out := make([]T, len(t.Data)/size)
	if _, err := binary.Decode(t.Data, binary.LittleEndian, out); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return out, nil
}

// Column returns the named tensor of b as a flat slice of T (see Values).
func Column[T Elem](b *Batch, name string) ([]T, error) {
	t, ok := b.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("batch has no tensor %q", name)
	}
	return Values[T](t)
}
