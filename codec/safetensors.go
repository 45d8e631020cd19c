package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
)

// MaxHeaderBytes caps a safetensors header, as the reference readers do.
const MaxHeaderBytes = 100_000_000

// ErrSafetensors is wrapped by every safetensors decoding error.
var ErrSafetensors = errors.New("safetensors")

func stErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSafetensors, fmt.Sprintf(format, args...))
}

// SafetensorsHeader returns the 8-byte length prefix plus the JSON header
// for tensors (in the given order) and metadata, padded with spaces to a
// multiple of 8 bytes, and the total size of the encoding.
func SafetensorsHeader(tensors []Tensor, meta map[string]string) ([]byte, int64, error) {
	// Room for a typical entry per tensor, so the header is one allocation.
	return AppendSafetensorsHeader(make([]byte, 0, 64+80*len(tensors)+32*len(meta)), tensors, meta)
}

// AppendSafetensorsHeader is SafetensorsHeader appending to dst. Every
// sample answer starts with one, so it is written by hand rather than
// through encoding/json (a dozen allocations a tensor); its bytes are the
// same as encoding/json's, which the tests check against a reference.
func AppendSafetensorsHeader(dst []byte, tensors []Tensor, meta map[string]string) ([]byte, int64, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, '{')
	first := true
	if len(meta) > 0 {
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		sort.Strings(keys) // encoding/json's order for maps
		dst = append(dst, `"__metadata__":{`...)
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			dst = appendJSONString(dst, meta[k])
		}
		dst = append(dst, '}')
		first = false
	}
	var off int64
	// Names are checked for repeats by a scan (answers have a dozen
	// tensors: cheaper than a map), or a map for many.
	var seen map[string]bool
	if len(tensors) > 32 {
		seen = make(map[string]bool, len(tensors))
	}
	for i, t := range tensors {
		used := seen[t.Name]
		if seen != nil {
			seen[t.Name] = true
		} else {
			used = slices.ContainsFunc(tensors[:i], func(u Tensor) bool { return u.Name == t.Name })
		}
		if t.Name == "__metadata__" || used {
			return nil, 0, fmt.Errorf("tensor %q: name is reserved or used twice", t.Name)
		}
		st, ok := dtypeToST[t.DType]
		if !ok {
			return nil, 0, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if err := checkShape(t.Name, t.Shape, dtypeSize[t.DType], len(t.Data)); err != nil {
			return nil, 0, err
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, t.Name)
		dst = append(dst, `:{"dtype":"`...)
		dst = append(dst, st...)
		dst = append(dst, `","shape":[`...)
		for j, d := range t.Shape {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(d), 10)
		}
		dst = append(dst, `],"data_offsets":[`...)
		dst = strconv.AppendInt(dst, off, 10)
		dst = append(dst, ',')
		off += int64(len(t.Data))
		dst = strconv.AppendInt(dst, off, 10)
		dst = append(dst, "]}"...)
	}
	dst = append(dst, '}')
	for (len(dst)-start)%8 != 0 {
		dst = append(dst, ' ')
	}
	binary.LittleEndian.PutUint64(dst[start:], uint64(len(dst)-start-8))
	return dst, int64(len(dst)-start) + off, nil
}

type stEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// appendJSONString appends s as encoding/json writes a string: names of
// plain ASCII are copied between quotes; anything encoding/json escapes
// (quotes, backslashes, control bytes, <, >, &, non-ASCII) goes through it.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(dst, q...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// WriteSafetensors streams tensors to w: the header, then each tensor's
// bytes straight from its Data, with no staging copy of the batch.
func WriteSafetensors(w io.Writer, tensors []Tensor, meta map[string]string) (int64, error) {
	hdr, total, err := SafetensorsHeader(tensors, meta)
	if err != nil {
		return 0, err
	}
	n, err := w.Write(hdr)
	written := int64(n)
	if err != nil {
		return written, err
	}
	for _, t := range tensors {
		n, err := w.Write(t.Data)
		written += int64(n)
		if err != nil {
			return written, err
		}
	}
	if written != total {
		return written, fmt.Errorf("wrote %d bytes, header promised %d", written, total)
	}
	return written, nil
}

// EncodeSafetensors returns the whole encoding in one slice.
func EncodeSafetensors(tensors []Tensor, meta map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := WriteSafetensors(&buf, tensors, meta); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// DecodeSafetensors parses a complete safetensors file. Tensors come back in
// the order of their data offsets, their Data aliasing b. It checks that the
// header is at most MaxHeaderBytes, is a JSON object, names known dtypes,
// and that offsets are non-overlapping, contiguous from 0, match each
// tensor's shape and cover the data exactly.
func DecodeSafetensors(b []byte) ([]Tensor, map[string]string, error) {
	return decodeSafetensorsWith(b, decodeHeader)
}

// decodeSafetensorsWith is DecodeSafetensors with the header reader given
// (tests hold the scanner to the encoding/json reader it replaced).
func decodeSafetensorsWith(b []byte, readHeader func([]byte) ([]headerEntry, map[string]string, error)) ([]Tensor, map[string]string, error) {
	if len(b) < 8 {
		return nil, nil, stErr("%d bytes is shorter than the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderBytes {
		return nil, nil, stErr("header length %d exceeds %d", n, MaxHeaderBytes)
	}
	if n > uint64(len(b)-8) {
		return nil, nil, stErr("header length %d exceeds the %d bytes that follow", n, len(b)-8)
	}
	hdr := bytes.TrimRight(b[8:8+n], " ")
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, nil, stErr("header is not a JSON object")
	}
	entries, meta, err := readHeader(hdr)
	if err != nil {
		return nil, nil, err
	}
	data := b[8+n:]
	type located struct {
		t  Tensor
		lo int64
	}
	ts := make([]located, 0, len(entries))
	for _, he := range entries {
		name, e := he.name, he.e
		dt, ok := stToDType[e.DType]
		if !ok {
			return nil, nil, stErr("tensor %q: unknown dtype %q", name, e.DType)
		}
		if e.Shape == nil {
			return nil, nil, stErr("tensor %q: missing shape", name)
		}
		lo, hi := e.DataOffsets[0], e.DataOffsets[1]
		if lo < 0 || hi < lo || hi > int64(len(data)) {
			return nil, nil, stErr("tensor %q: data_offsets [%d, %d] outside the %d data bytes", name, lo, hi, len(data))
		}
		if err := checkShape(name, e.Shape, dtypeSize[dt], int(hi-lo)); err != nil {
			return nil, nil, stErr("%v", err)
		}
		ts = append(ts, located{Tensor{Name: name, DType: dt, Shape: e.Shape, Data: data[lo:hi:hi]}, lo})
	}
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].lo != ts[j].lo {
			return ts[i].lo < ts[j].lo
		}
		// Zero-length tensors share an offset with their neighbour.
		if len(ts[i].t.Data) != len(ts[j].t.Data) {
			return len(ts[i].t.Data) < len(ts[j].t.Data)
		}
		return ts[i].t.Name < ts[j].t.Name
	})
	var pos int64
	out := make([]Tensor, 0, len(ts))
	for _, l := range ts {
		if l.lo != pos {
			return nil, nil, stErr("tensor %q starts at %d, want %d (offsets must be contiguous and not overlap)", l.t.Name, l.lo, pos)
		}
		pos += int64(len(l.t.Data))
		out = append(out, l.t)
	}
	if pos != int64(len(data)) {
		return nil, nil, stErr("tensors cover %d of the %d data bytes", pos, len(data))
	}
	return out, meta, nil
}
