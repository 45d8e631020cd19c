package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/storage"
)

// maxPooledBody is the largest extend body buffer kept for reuse.
const maxPooledBody = 8 << 20

func (s *Server) extend(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	timeout, err := timeoutParam(r)
	if err != nil {
		return err
	}
	// The whole body is read and validated before anything is written, so
	// a client that disconnects mid-body leaves the store unchanged.
	bp := s.bodies.get()
	body, err := readBodyInto(w, r, *bp)
	// Safetensors tensors alias the body until Extend has copied them.
	defer func() { s.bodies.put(bp, body) }()
	if err != nil {
		return err
	}
	var batch *storage.Batch
	switch mt := mediaType(r); mt {
	case "application/octet-stream", "application/vnd.safetensors":
		batch, err = safetensorsBatch(b, body)
	default:
		if err := isJSONBody(r); err != nil {
			return &apiError{status: http.StatusUnsupportedMediaType,
				msg: fmt.Sprintf("Content-Type %q: extend takes application/octet-stream (safetensors) or application/json", mt)}
		}
		// Decoded values take at most 4x the body: the shortest JSON
		// element ("0,") is 2 bytes and the widest dtype 8.
		if err := leaseOf(w).grow(r.Context(), 4*int64(len(body)), "decoding the JSON body"); err != nil {
			return err
		}
		batch, err = jsonBatch(b, body)
	}
	if err != nil {
		return err
	}
	opts := &storage.ExtendOptions{Timeout: timeout, Stop: s.stopping}
	if timeout > 0 {
		done, err := s.mayWait()
		if err != nil {
			return err
		}
		defer done()
		if s.opts.MaxWait > 0 {
			opts.Timeout = min(timeout, s.opts.MaxWait)
		}
	}
	res, err := b.ExtendContext(r.Context(), r.URL.Query().Get("stream"), batch, opts)
	if err != nil {
		if r.Context().Err() != nil {
			return clientGone(r.Context().Err())
		}
		return err
	}
	s.metrics.written.WithLabelValues(b.Name()).Add(float64(res.Rows))
	writeJSON(w, http.StatusOK, res)
	return nil
}

// timeoutParam reads the query parameter timeout_ms (absent: 0): how long
// an extend may wait for the rate limiter.
func timeoutParam(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("timeout_ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, badRequest(fmt.Sprintf("query parameter timeout_ms: want milliseconds, an integer between 0 and %d, got %q", math.MaxInt64/int64(time.Millisecond), v))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// column looks up an extend tensor's column: a spec field, or a final
// observation next.<k> of a compact buffer.
func column(b *rbd.Buffer, name string) (storage.Column, error) {
	c, ok := b.Column(name)
	if !ok {
		return c, badRequest(fmt.Sprintf("field %q: not a field of buffer %q", name, b.Name()))
	}
	return c, nil
}

func safetensorsBatch(b *rbd.Buffer, body []byte) (*storage.Batch, error) {
	tensors, _, err := codec.DecodeSafetensors(body)
	if err != nil {
		return nil, err
	}
	batch := &storage.Batch{Fields: map[string][]byte{}, Rows: -1}
	rows := map[string]int{}
	for _, t := range tensors {
		if len(t.Shape) == 0 {
			return nil, badRequest(fmt.Sprintf("field %q: shape [] has no row dimension", t.Name))
		}
		if t.Name == "env" || isVersionTensor(b, t.Name) {
			v, err := perRowInts(t.Name, t.DType, t.Shape, t.Data)
			if err != nil {
				return nil, err
			}
			if t.Name == "env" {
				batch.Env = v
			} else {
				batch.PolicyVersion = v
			}
			rows[t.Name] = t.Shape[0]
			continue
		}
		c, err := column(b, t.Name)
		if err != nil {
			return nil, err
		}
		if t.DType != c.DType.String() {
			return nil, badRequest(fmt.Sprintf("field %q: dtype %s, want %s", t.Name, t.DType, c.DType))
		}
		if !slices.Equal(t.Shape[1:], c.Shape) {
			return nil, badRequest(fmt.Sprintf("field %q: shape %v, want [N %v]", t.Name, t.Shape, c.Shape))
		}
		batch.Fields[t.Name] = t.Data
		rows[t.Name] = t.Shape[0]
	}
	return batch, setRows(b, batch, rows)
}

// setRows takes N from next.done and checks every other field against it
// (final observations of compact buffers may have N or one row per done
// row; storage checks which).
func setRows(b *rbd.Buffer, batch *storage.Batch, rows map[string]int) error {
	n, ok := rows["next.done"]
	if !ok {
		return badRequest(`field "next.done": missing`)
	}
	batch.Rows = n
	for name, r := range rows {
		if c, _ := b.Column(name); c.Tail {
			continue
		}
		if r != n {
			return badRequest(fmt.Sprintf("field %q: %d rows, but next.done has %d", name, r, n))
		}
	}
	return nil
}

// isVersionTensor reports whether an extend tensor gives the rows' policy
// versions: "policy_version", unless the buffer has a field of that name
// (created before versions existed), which keeps it.
func isVersionTensor(b *rbd.Buffer, name string) bool {
	if name != "policy_version" {
		return false
	}
	_, isField := b.Column(name)
	return !isField
}

// perRowInts decodes a per-row integer tensor (env, policy_version).
func perRowInts(name, dtype string, shape []int, data []byte) ([]int64, error) {
	if len(shape) != 1 {
		return nil, badRequest(fmt.Sprintf("field %q: shape %v, want [N]", name, shape))
	}
	switch dtype {
	case "int64":
		return int64s(data), nil
	case "int32":
		out := make([]int64, len(data)/4)
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(data[4*i:])))
		}
		return out, nil
	}
	return nil, badRequest(fmt.Sprintf("field %q: dtype %s, want int32 or int64", name, dtype))
}

// jsonBatch decodes a JSON extend body field by field, each straight
// into its column's bytes (codec.ScanJSONObject hands out the fields'
// text in place; nothing is boxed).
func jsonBatch(b *rbd.Buffer, body []byte) (*storage.Batch, error) {
	batch := &storage.Batch{Fields: map[string][]byte{}}
	rows := map[string]int{}
	err := codec.ScanJSONObject(body, func(name string, v []byte) error {
		if name == "env" || isVersionTensor(b, name) {
			data, n, err := codec.DecodeJSONTensor(v, "int64", nil)
			if err != nil {
				return badRequest(fmt.Sprintf("field %q: %v", name, err))
			}
			if name == "env" {
				batch.Env = int64s(data)
			} else {
				batch.PolicyVersion = int64s(data)
			}
			rows[name] = n
			return nil
		}
		c, err := column(b, name)
		if err != nil {
			return err
		}
		data, n, err := codec.DecodeJSONTensor(v, c.DType.String(), c.Shape)
		if err != nil {
			return badRequest(fmt.Sprintf("field %q (%s %v per row): %v", name, c.DType, c.Shape, err))
		}
		batch.Fields[name] = data
		rows[name] = n
		return nil
	})
	if err != nil {
		if _, ok := errors.AsType[*apiError](err); ok {
			return nil, err
		}
		return nil, badRequest("body: not a JSON object of fields: " + err.Error())
	}
	return batch, setRows(b, batch, rows)
}

func int64s(b []byte) []int64 {
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func float64s(b []byte) []float64 {
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}
