package storage

import (
	"encoding/json"
	"fmt"
	"strings"
)

// DType is the element type of a field. The zero value is invalid, so a
// field whose dtype was never set is caught by validation rather than being
// silently stored as some default type.
type DType uint8

// The supported element types. Their numeric values are not part of any
// wire format (specs carry dtypes by name), but they are persisted inside
// on-disk metadata, so never reorder or reuse them; append new ones.
const (
	Bool DType = iota + 1
	Uint8
	Int8
	Int16
	Int32
	Int64
	Float16
	BFloat16
	Float32
	Float64

	// dtypeEnd is one past the last valid DType; keep it last.
	dtypeEnd
)

// ParseDType returns the DType with the given name. Names are the lowercase
// NumPy/PyTorch spellings that clients already use, and matching is exact so
// that a spec means the same thing to every client.
func ParseDType(s string) (DType, error) {
	for d := Bool; d < dtypeEnd; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("storage: unknown dtype %q (valid dtypes: %s)", s, validDTypeNames())
}

// validDTypeNames lists every valid name, for error messages that tell the
// caller what they could have written instead.
func validDTypeNames() string {
	names := make([]string, 0, int(dtypeEnd-Bool))
	for d := Bool; d < dtypeEnd; d++ {
		names = append(names, d.String())
	}
	return strings.Join(names, ", ")
}

// String returns the dtype's name as accepted by ParseDType. Invalid values
// print as "dtype(N)" so that a corrupt value is visible in logs instead of
// masquerading as a real type.
func (d DType) String() string {
	switch d {
	case Bool:
		return "bool"
	case Uint8:
		return "uint8"
	case Int8:
		return "int8"
	case Int16:
		return "int16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	default:
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
}

// Size returns the number of bytes one element occupies in a column. Bools
// take a whole byte so that every element is addressable without bit
// twiddling. Invalid dtypes have size 0.
func (d DType) Size() int {
	switch d {
	case Bool, Uint8, Int8:
		return 1
	case Int16, Float16, BFloat16:
		return 2
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	default:
		return 0
	}
}

// IsFloat reports whether d is a floating-point type, i.e. one for which
// NaN and infinities exist and reductions such as means make sense.
func (d DType) IsFloat() bool {
	switch d {
	case Float16, BFloat16, Float32, Float64:
		return true
	default:
		return false
	}
}

// Valid reports whether d is one of the defined dtypes.
func (d DType) Valid() bool {
	return d >= Bool && d < dtypeEnd
}

// MarshalJSON encodes d by name, because names are stable across versions
// and languages while the numeric values are an implementation detail.
func (d DType) MarshalJSON() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("storage: cannot marshal invalid %s", d)
	}
	return json.Marshal(d.String())
}

// UnmarshalJSON decodes a dtype name. JSON null leaves d unchanged, as
// encoding/json does for built-in types.
func (d *DType) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("storage: dtype must be a JSON string: %w", err)
	}
	v, err := ParseDType(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}
