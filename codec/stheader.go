package codec

import (
	"errors"
	"strconv"
)

// The safetensors header is read with the codec's JSON scanner
// (jsonscan.go), not encoding/json: decoding it into maps of raw messages
// and then each entry into another map cost more than the rest of a small
// batch's decode together (a 256-row CartPole answer's header took 30 µs
// through encoding/json, 4.3 µs here: BenchmarkDecodeSafetensors). The
// rules are the same:
// one JSON object and nothing after it, entries with exactly the keys
// dtype (a string), shape (a list of integers) and data_offsets (two
// integers), __metadata__ mapping strings to strings. A key given twice
// is refused (encoding/json kept the last).

// headerEntry is one tensor entry of a header, in the header's order.
type headerEntry struct {
	name string
	e    stEntry
}

// decodeHeader parses the JSON header hdr (spaces after it already
// trimmed).
func decodeHeader(hdr []byte) ([]headerEntry, map[string]string, error) {
	s := &jscan{b: hdr}
	var entries []headerEntry
	var meta map[string]string
	seen := make(map[string]bool, 16)
	err := scanObject(s, func(key string) error {
		if seen[key] {
			return stErr("header: key %q is given twice", key)
		}
		seen[key] = true
		if key == "__metadata__" {
			m, err := scanMetadata(s)
			meta = m
			return err
		}
		e, err := scanEntry(s, key)
		entries = append(entries, headerEntry{key, e})
		return err
	})
	switch {
	case errors.Is(err, ErrSafetensors):
		return nil, nil, err
	case err != nil:
		return nil, nil, stErr("header: %v", err)
	case s.i != len(hdr):
		return nil, nil, stErr("header: data after the JSON object")
	}
	return entries, meta, nil
}

// scanObject consumes one JSON object, calling fn with each member's key
// while s stands at the member's value, which fn must consume.
func scanObject(s *jscan, fn func(key string) error) error {
	if s.peek() != '{' {
		return s.syntax("want an object")
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.syntax("want a string key")
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.syntax("want : after a key")
		}
		s.i++
		s.ws()
		if err := fn(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.syntax("want , or } in an object")
		}
	}
}

// scanEntry consumes one tensor entry.
func scanEntry(s *jscan, name string) (stEntry, error) {
	var e stEntry
	if s.peek() != '{' {
		return e, stErr("tensor %q: entry must be an object", name)
	}
	const hasDType, hasShape, hasOffsets = 1, 2, 4
	var have int
	err := scanObject(s, func(k string) error {
		var bit int
		switch k {
		case "dtype":
			bit = hasDType
			if s.peek() != '"' {
				return stErr("tensor %q: dtype must be a string", name)
			}
			v, err := s.str()
			if err != nil {
				return err
			}
			e.DType = v
		case "shape":
			bit = hasShape
			dims, err := scanInts(s, 0)
			if err != nil {
				return stErr("tensor %q: missing shape (a list of integers): %v", name, err)
			}
			e.Shape = make([]int, len(dims))
			for i, d := range dims {
				e.Shape[i] = int(d)
			}
		case "data_offsets":
			bit = hasOffsets
			offs, err := scanInts(s, 64)
			if err != nil || len(offs) != 2 {
				return stErr("tensor %q: data_offsets must be [begin, end]", name)
			}
			e.DataOffsets = [2]int64{offs[0], offs[1]}
		default:
			return stErr("tensor %q: unknown key %q", name, k)
		}
		if have&bit != 0 {
			return stErr("tensor %q: key %q is given twice", name, k)
		}
		have |= bit
		return nil
	})
	switch {
	case err != nil:
		return e, err
	case have&hasDType == 0:
		return e, stErr("tensor %q: dtype must be a string", name)
	case have&hasShape == 0:
		return e, stErr("tensor %q: missing shape (a list of integers)", name)
	case have&hasOffsets == 0:
		return e, stErr("tensor %q: data_offsets must be [begin, end]", name)
	}
	return e, nil
}

// scanInts consumes a JSON array of integers that fit bitSize bits (0:
// int), as encoding/json would decode it into a slice of integers: no
// fractions, no exponents. An empty array gives a non-nil empty slice.
func scanInts(s *jscan, bitSize int) ([]int64, error) {
	if s.peek() != '[' {
		return nil, errors.New("not an array")
	}
	s.i++
	out := make([]int64, 0, 4)
	if s.peek() == ']' {
		s.i++
		return out, nil
	}
	for {
		if c := s.peek(); c != '-' && (c < '0' || c > '9') {
			return nil, errors.New("an element is not a number")
		}
		num, err := s.number()
		if err != nil {
			return nil, err
		}
		v, err := strconv.ParseInt(bytesString(num), 10, bitSize)
		if err != nil {
			return nil, errors.New("an element is not an integer in range")
		}
		out = append(out, v)
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return out, nil
		default:
			return nil, s.syntax("want , or ] in an array")
		}
	}
}

// scanMetadata consumes __metadata__: an object of string values.
func scanMetadata(s *jscan) (map[string]string, error) {
	if s.peek() != '{' {
		return nil, stErr("__metadata__ must map strings to strings")
	}
	m := map[string]string{}
	err := scanObject(s, func(k string) error {
		if _, dup := m[k]; dup {
			return stErr("__metadata__: key %q is given twice", k)
		}
		if s.peek() != '"' {
			return stErr("__metadata__[%q] must be a string", k)
		}
		v, err := s.str()
		m[k] = v
		return err
	})
	return m, err
}
