package server

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
)

// update sets mutable fields of live rows by seq (POST
// /v1/buffers/{name}/update): a safetensors body with "seq" int64 [N] and
// one tensor [N, shape...] per field, or the same as a JSON object. Rows
// overwritten since they were sampled are skipped and counted as stale.
func (s *Server) update(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	var seqs []int64
	var fields map[string][]byte
	switch mt := mediaType(r); mt {
	case "application/octet-stream", "application/vnd.safetensors":
		seqs, fields, err = safetensorsUpdate(b, body)
	default:
		if err := isJSONBody(r); err != nil {
			return &apiError{status: http.StatusUnsupportedMediaType,
				msg: fmt.Sprintf("Content-Type %q: update takes application/octet-stream (safetensors) or application/json", mt)}
		}
		// As for extend: decoded values take at most 4x the body.
		if err := leaseOf(w).grow(r.Context(), 4*int64(len(body)), "decoding the JSON body"); err != nil {
			return err
		}
		seqs, fields, err = jsonUpdate(b, body)
	}
	if err != nil {
		return err
	}
	updated, stale, err := b.UpdateFields(seqs, fields)
	if err != nil {
		return err
	}
	s.metrics.updated.WithLabelValues(b.Name(), "updated").Add(float64(updated))
	s.metrics.updated.WithLabelValues(b.Name(), "stale").Add(float64(stale))
	writeJSON(w, http.StatusOK, map[string]int{"updated": updated, "stale": stale})
	return nil
}

// updateColumn checks that name is a mutable field of b and returns its
// dtype and row shape.
func updateColumn(b *rbd.Buffer, name string) (dtype string, shape []int, err error) {
	f, ok := b.Spec().Field(name)
	if !ok {
		return "", nil, badRequest(fmt.Sprintf("field %q: not a field of buffer %q (mutable fields: %v)", name, b.Name(), b.MutableFields()))
	}
	if !f.Mutable {
		return "", nil, badRequest(fmt.Sprintf("field %q: not mutable; only fields the spec marks \"mutable\": true can be updated (mutable fields: %v)", name, b.MutableFields()))
	}
	return f.DType.String(), f.Shape, nil
}

func safetensorsUpdate(b *rbd.Buffer, body []byte) ([]int64, map[string][]byte, error) {
	tensors, _, err := codec.DecodeSafetensors(body)
	if err != nil {
		return nil, nil, err
	}
	var seqs []int64
	fields := map[string][]byte{}
	rows := map[string]int{}
	for _, t := range tensors {
		if t.Name == "seq" {
			if seqs, err = perRowInts("seq", t.DType, t.Shape, t.Data); err != nil {
				return nil, nil, err
			}
			continue
		}
		dtype, shape, err := updateColumn(b, t.Name)
		if err != nil {
			return nil, nil, err
		}
		if t.DType != dtype {
			return nil, nil, badRequest(fmt.Sprintf("field %q: dtype %s, want %s", t.Name, t.DType, dtype))
		}
		if len(t.Shape) == 0 || !slices.Equal(t.Shape[1:], shape) {
			return nil, nil, badRequest(fmt.Sprintf("field %q: shape %v, want [N %v]", t.Name, t.Shape, shape))
		}
		fields[t.Name], rows[t.Name] = t.Data, t.Shape[0]
	}
	return seqs, fields, checkUpdateRows(seqs, fields, rows)
}

func jsonUpdate(b *rbd.Buffer, body []byte) ([]int64, map[string][]byte, error) {
	var seqs []int64
	fields := map[string][]byte{}
	rows := map[string]int{}
	err := codec.ScanJSONObject(body, func(name string, v []byte) error {
		if name == "seq" {
			data, _, err := codec.DecodeJSONTensor(v, "int64", nil)
			if err != nil {
				return badRequest("seq: " + err.Error())
			}
			seqs = int64s(data)
			return nil
		}
		dtype, shape, err := updateColumn(b, name)
		if err != nil {
			return err
		}
		data, n, err := codec.DecodeJSONTensor(v, dtype, shape)
		if err != nil {
			return badRequest(fmt.Sprintf("field %q (%s %v per row): %v", name, dtype, shape, err))
		}
		fields[name], rows[name] = data, n
		return nil
	})
	if err != nil {
		if _, ok := errors.AsType[*apiError](err); ok {
			return nil, nil, err
		}
		return nil, nil, badRequest("body: not a JSON object: " + err.Error())
	}
	return seqs, fields, checkUpdateRows(seqs, fields, rows)
}

// checkUpdateRows checks that seq is there and every field has a row per
// seq.
func checkUpdateRows(seqs []int64, fields map[string][]byte, rows map[string]int) error {
	if seqs == nil {
		return badRequest(`seq: missing (want the rows' seqs, int64 [N])`)
	}
	if len(fields) == 0 {
		return badRequest("fields: none given (want at least one mutable field next to seq)")
	}
	for _, name := range slices.Sorted(maps.Keys(rows)) {
		if rows[name] != len(seqs) {
			return badRequest(fmt.Sprintf("field %q: %d rows for %d seqs", name, rows[name], len(seqs)))
		}
	}
	return nil
}
