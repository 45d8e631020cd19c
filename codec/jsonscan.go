package codec

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// A JSON scanner for tensors: it walks nested arrays of numbers in place
// and appends each value, converted to its dtype, to the output. Nothing
// is allocated per element (encoding/json into `any` boxes every number:
// 38 bytes of memory per byte of body were measured), and the memory is
// the output plus the nesting depth. It accepts exactly RFC 8259 JSON.

// maxSkipDepth bounds the nesting of a value the scanner steps over (an
// object or array where a number belongs, or a whole body member): deeper
// is refused rather than walked.
const maxSkipDepth = 512

type jscan struct {
	b []byte
	i int
}

// errJSON wraps syntax errors, which read "not JSON: ...".
var errJSON = errors.New("not JSON")

func (s *jscan) syntax(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", errJSON, fmt.Sprintf(format, args...), s.i)
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// atEnd reports whether only whitespace is left.
func (s *jscan) atEnd() bool {
	s.ws()
	return s.i >= len(s.b)
}

// peek returns the next byte after whitespace, or 0 at the end (a NUL byte
// in the input reads as 0 too: it is never valid where peek is used, and
// atEnd tells the two apart).
func (s *jscan) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// literal consumes word (true, false, null).
func (s *jscan) literal(word string) error {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return s.syntax("invalid literal")
	}
	s.i += len(word)
	return nil
}

// number consumes a number token and returns its text:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func (s *jscan) number() ([]byte, error) {
	start := s.i
	b := s.b
	digits := func() int {
		n := 0
		for s.i < len(b) && b[s.i] >= '0' && b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(b) && b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(b) && b[s.i] == '0':
		s.i++
	case digits() == 0:
		return nil, s.syntax("invalid number")
	}
	if s.i < len(b) && b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return nil, s.syntax("invalid number")
		}
	}
	if s.i < len(b) && (b[s.i] == 'e' || b[s.i] == 'E') {
		s.i++
		if s.i < len(b) && (b[s.i] == '+' || b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return nil, s.syntax("invalid number")
		}
	}
	return b[start:s.i], nil
}

// str consumes a string token and returns its value. Strings without
// escapes are not copied into a new representation beyond the conversion.
func (s *jscan) str() (string, error) {
	start := s.i
	s.i++ // the opening quote
	escaped := false
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			if raw := s.b[start+1 : s.i-1]; !escaped && utf8.Valid(raw) {
				return string(raw), nil
			}
			// Escapes, or bytes that are not UTF-8 (which, as
			// encoding/json does, become U+FFFD).
			var v string
			if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
				return "", s.syntax("invalid string")
			}
			return v, nil
		case c == '\\':
			escaped = true
			s.i += 2
		case c < 0x20:
			return "", s.syntax("control character in string")
		default:
			s.i++
		}
	}
	return "", s.syntax("unterminated string")
}

// skip consumes one value of any kind, checking its syntax, and returns
// what it was: "a number", "an array of N", ...
func (s *jscan) skip(depth int) (string, error) {
	if depth > maxSkipDepth {
		return "", s.syntax("nested deeper than %d", maxSkipDepth)
	}
	switch c := s.peek(); {
	case c == '[':
		s.i++
		n := 0
		if s.peek() == ']' {
			s.i++
			return "an array of 0", nil
		}
		for {
			if _, err := s.skip(depth + 1); err != nil {
				return "", err
			}
			n++
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return fmt.Sprintf("an array of %d", n), nil
			default:
				return "", s.syntax("want , or ] in an array")
			}
		}
	case c == '{':
		s.i++
		if s.peek() == '}' {
			s.i++
			return "an object", nil
		}
		for {
			if s.peek() != '"' {
				return "", s.syntax("want a string key")
			}
			if _, err := s.str(); err != nil {
				return "", err
			}
			if s.peek() != ':' {
				return "", s.syntax("want : after a key")
			}
			s.i++
			if _, err := s.skip(depth + 1); err != nil {
				return "", err
			}
			switch s.peek() {
			case ',':
				s.i++
			case '}':
				s.i++
				return "an object", nil
			default:
				return "", s.syntax("want , or } in an object")
			}
		}
	case c == '"':
		_, err := s.str()
		return "a string", err
	case c == 't':
		return "a boolean", s.literal("true")
	case c == 'f':
		return "a boolean", s.literal("false")
	case c == 'n':
		return "null", s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return "a number", err
	case s.atEnd():
		return "", s.syntax("unexpected end")
	default:
		return "", s.syntax("unexpected %q", c)
	}
}

// tensorDecoder appends the values of nested arrays to out.
type tensorDecoder struct {
	s     jscan
	dtype string
	size  int
	inner []int
	out   []byte
	at    []int // the element being read: row, then one index per dim
}

// path names the element at d.at[:n], "[3][1]"; built only for errors.
func (d *tensorDecoder) path(n int) string {
	var b []byte
	for _, i := range d.at[:n] {
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, ']')
	}
	return string(b)
}

// DecodeJSONTensor parses nested arrays of shape [N, inner...] into
// little-endian bytes of dtype and returns N. Errors name the element path.
func DecodeJSONTensor(raw []byte, dtype string, inner []int) ([]byte, int, error) {
	size := dtypeSize[dtype]
	if size == 0 {
		return nil, 0, fmt.Errorf("unknown dtype %q", dtype)
	}
	// A quarter of the text's length is a good first guess at the
	// values' bytes (a float32 written out takes about 10 characters);
	// append grows it from there.
	d := &tensorDecoder{s: jscan{b: raw}, dtype: dtype, size: size, inner: inner, out: make([]byte, 0, len(raw)/4)}
	rows, err := d.rows()
	if err != nil {
		return nil, 0, err
	}
	if !d.s.atEnd() {
		return nil, 0, errors.New("data after the array")
	}
	if d.out == nil {
		d.out = []byte{}
	}
	return d.out, rows, nil
}

func (d *tensorDecoder) rows() (int, error) {
	s := &d.s
	if s.peek() != '[' {
		what, err := s.skip(0)
		if err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("want an array of rows, got %s", what)
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return 0, nil
	}
	d.at = make([]int, 1, len(d.inner)+1)
	for r := 0; ; r++ {
		d.at[0] = r
		if err := d.value(0); err != nil {
			return 0, err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return r + 1, nil
		default:
			return 0, s.syntax("want , or ] after row %d", r)
		}
	}
}

// value reads the value at depth dim (a row when 0), at d.at.
func (d *tensorDecoder) value(dim int) error {
	s := &d.s
	if dim == len(d.inner) {
		if err := d.scalar(); err != nil {
			if errors.Is(err, errJSON) {
				return err
			}
			return fmt.Errorf("element %s: %v", d.path(len(d.at)), err)
		}
		return nil
	}
	want := d.inner[dim]
	start := s.i
	if s.peek() != '[' {
		what, err := s.skip(0)
		if err != nil {
			return err
		}
		return fmt.Errorf("element %s: want an array of %d, got %s", d.path(dim+1), want, what)
	}
	s.i++
	wrongCount := func() error {
		s.i = start
		what, err := s.skip(0)
		if err != nil {
			return err
		}
		return fmt.Errorf("element %s: want an array of %d, got %s", d.path(dim+1), want, what)
	}
	if s.peek() == ']' {
		if want != 0 {
			return wrongCount()
		}
		s.i++
		return nil
	}
	d.at = append(d.at, 0)
	defer func() { d.at = d.at[:len(d.at)-1] }()
	for k := 0; ; k++ {
		if k == want {
			return wrongCount()
		}
		d.at[len(d.at)-1] = k
		if err := d.value(dim + 1); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			if k+1 != want {
				return wrongCount()
			}
			return nil
		default:
			return s.syntax("want , or ] in an array")
		}
	}
}

// scalar reads one element and appends it in the dtype's encoding.
func (d *tensorDecoder) scalar() error {
	s := &d.s
	c := s.peek()
	switch d.dtype {
	case "bool":
		switch {
		case c == 't' || c == 'f':
			v := c == 't'
			if err := s.literal(map[bool]string{true: "true", false: "false"}[v]); err != nil {
				return err
			}
			d.out = append(d.out, b2u(v))
			return nil
		case c == '-' || (c >= '0' && c <= '9'):
			tok, err := s.number()
			if err != nil {
				return err
			}
			if string(tok) == "0" || string(tok) == "1" {
				d.out = append(d.out, tok[0]-'0')
				return nil
			}
			return errors.New("want true, false, 0 or 1, got a number")
		}
		what, err := s.skip(0)
		if err != nil {
			return err
		}
		return fmt.Errorf("want true, false, 0 or 1, got %s", what)
	case "float16", "bfloat16", "float32", "float64":
		var f float64
		switch {
		case c == '-' || (c >= '0' && c <= '9'):
			tok, err := s.number()
			if err != nil {
				return err
			}
			if f, err = strconv.ParseFloat(bytesString(tok), 64); err != nil {
				return fmt.Errorf("bad number %s", tok)
			}
		case c == '"':
			v, err := s.str()
			if err != nil {
				return err
			}
			if f, err = nonFinite(v); err != nil {
				return err
			}
		default:
			what, err := s.skip(0)
			if err != nil {
				return err
			}
			return fmt.Errorf("want a number, got %s", what)
		}
		d.out = appendFloatAs(d.out, d.dtype, f)
		return nil
	}
	// Integers.
	switch {
	case c == '-' || (c >= '0' && c <= '9'):
		tok, err := s.number()
		if err != nil {
			return err
		}
		i, err := strconv.ParseInt(bytesString(tok), 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer, got %s", tok)
		}
		if d.out, err = appendIntAs(d.out, d.dtype, i); err != nil {
			return err
		}
		return nil
	case c == '"':
		v, err := s.str()
		if err != nil {
			return err
		}
		return fmt.Errorf("want an integer, got string %q", v)
	}
	what, err := s.skip(0)
	if err != nil {
		return err
	}
	return fmt.Errorf("want a number, got %s", what)
}

// ScanJSONObject calls fn with every member of the JSON object in data:
// its key and its value's bytes, a sub-slice of data (nothing is copied).
// A key given twice, or anything but one object, is an error.
func ScanJSONObject(data []byte, fn func(key string, value []byte) error) error {
	s := &jscan{b: data}
	if s.peek() != '{' {
		what, err := s.skip(0)
		if err != nil {
			return err
		}
		return fmt.Errorf("want a JSON object, got %s", what)
	}
	seen := map[string]bool{}
	err := scanObject(s, func(key string) error {
		if seen[key] {
			return fmt.Errorf("key %q is given twice", key)
		}
		seen[key] = true
		start := s.i
		if _, err := s.skip(1); err != nil {
			return err
		}
		return fn(key, data[start:s.i])
	})
	if err != nil {
		return err
	}
	if !s.atEnd() {
		return s.syntax("data after the object")
	}
	return nil
}

// bytesString views b as a string without copying it, for strconv's
// parsers: the string must not outlive the call (their errors, which hold
// it, are never kept).
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
