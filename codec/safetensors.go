package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
)

// MaxHeaderBytes caps a safetensors header, as the reference readers do.
const MaxHeaderBytes = 100_000_000

// ErrSafetensors is wrapped by every safetensors decoding error.
var ErrSafetensors = errors.New("safetensors")

func stErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSafetensors, fmt.Sprintf(format, args...))
}

type stEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// SafetensorsHeader returns the 8-byte length prefix plus the JSON header
// for tensors (in the given order) and metadata, padded with spaces to a
// multiple of 8 bytes, and the total size of the encoding.
func SafetensorsHeader(tensors []Tensor, meta map[string]string) ([]byte, int64, error) {
	var buf bytes.Buffer
	buf.WriteString("{")
	first := true
	if len(meta) > 0 {
		m, err := json.Marshal(meta)
		if err != nil {
			return nil, 0, err
		}
		buf.WriteString(`"__metadata__":`)
		buf.Write(m)
		first = false
	}
	var off int64
	for _, t := range tensors {
		st, ok := dtypeToST[t.DType]
		if !ok {
			return nil, 0, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if err := checkShape(t.Name, t.Shape, dtypeSize[t.DType], len(t.Data)); err != nil {
			return nil, 0, err
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		name, _ := json.Marshal(t.Name)
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		e, _ := json.Marshal(stEntry{DType: st, Shape: shape, DataOffsets: [2]int64{off, off + int64(len(t.Data))}})
		buf.Write(name)
		buf.WriteByte(':')
		buf.Write(e)
		off += int64(len(t.Data))
	}
	buf.WriteString("}")
	for (8+buf.Len())%8 != 0 {
		buf.WriteByte(' ')
	}
	out := make([]byte, 8, 8+buf.Len())
	binary.LittleEndian.PutUint64(out, uint64(buf.Len()))
	out = append(out, buf.Bytes()...)
	return out, int64(len(out)) + off, nil
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
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if err := dec.Decode(&raw); err != nil {
		return nil, nil, stErr("header: %v", err)
	}
	if dec.More() {
		return nil, nil, stErr("header: data after the JSON object")
	}
	data := b[8+n:]
	var meta map[string]string
	type located struct {
		t  Tensor
		lo int64
	}
	var ts []located
	for name, v := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(v, &meta); err != nil {
				return nil, nil, stErr("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var e stEntry
		d := json.NewDecoder(bytes.NewReader(v))
		d.DisallowUnknownFields()
		if err := d.Decode(&e); err != nil {
			return nil, nil, stErr("tensor %q: %v", name, err)
		}
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
