package collector

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/storage"
)

// Writer receives the collector's batches: an in-process buffer
// (BufferWriter) or an rbd server through the HTTP client (HTTPWriter); the
// rollout code is the same for both. Extend must not keep the batch's
// memory after it returns: the collector reuses it for the next batch.
type Writer interface {
	Extend(ctx context.Context, stream string, batch *storage.Batch) (storage.ExtendResult, error)
	CloseStream(ctx context.Context, stream string) error
}

// BufferWriter writes into an in-process storage.Buffer (an *rbd.Buffer's
// embedded Buffer). A rate-limited buffer makes an extend wait up to Wait
// (0: one second), or until the context ends; Run calls again while the
// limiter holds the rows back.
type BufferWriter struct {
	Buffer *storage.Buffer
	Wait   time.Duration
}

// writerWait is how long one extend of a collector waits for a rate
// limiter before the run gets to report that it waits.
const writerWait = time.Second

// Extend implements Writer.
func (w BufferWriter) Extend(ctx context.Context, stream string, b *storage.Batch) (storage.ExtendResult, error) {
	return w.Buffer.ExtendContext(ctx, stream, b, &storage.ExtendOptions{Timeout: cmp.Or(w.Wait, writerWait)})
}

// BufferSpec returns the buffer's spec, which Run checks before it writes.
func (w BufferWriter) BufferSpec() storage.Spec { return w.Buffer.Spec() }

// CloseStream implements Writer.
func (w BufferWriter) CloseStream(_ context.Context, stream string) error {
	_, err := w.Buffer.CloseStream(stream)
	return err
}

// HTTPWriter writes to a buffer of an rbd server: it turns each
// storage.Batch into safetensors tensors named and shaped by the buffer's
// spec ([N, shape...] per field, "env" int64 [N], and in compact mode the
// final observations next.<k> as [D, shape...]) and sends them with the Go
// client. The tensors point into the batch (no copy); per-call scratch is
// pooled, so concurrent use by several collectors is safe.
type HTTPWriter struct {
	c       *client.Client
	buffer  string
	spec    storage.Spec
	scratch sync.Pool // *httpScratch
}

type httpScratch struct {
	tensors []codec.Tensor
	shapes  [][]int
	env     []byte
	version []byte
}

// NewHTTPWriter returns a writer to buffer on the server c talks to. spec
// is the buffer's spec (as created); it names and shapes the tensors.
func NewHTTPWriter(c *client.Client, buffer string, spec storage.Spec) *HTTPWriter {
	return &HTTPWriter{c: c, buffer: buffer, spec: spec.WithDefaults()}
}

// Tensors converts a batch to the tensors of an extend request, using
// spec for names, dtypes and shapes. Data slices point into b.
func Tensors(spec storage.Spec, b *storage.Batch) ([]codec.Tensor, error) {
	var s httpScratch
	return s.tensorsOf(spec, b)
}

func (s *httpScratch) shape(i, rows int, row []int) []int {
	for len(s.shapes) <= i {
		s.shapes = append(s.shapes, nil)
	}
	s.shapes[i] = append(append(s.shapes[i][:0], rows), row...)
	return s.shapes[i]
}

func (s *httpScratch) tensorsOf(spec storage.Spec, b *storage.Batch) ([]codec.Tensor, error) {
	s.tensors = s.tensors[:0]
	used := 0
	for i, f := range spec.Fields {
		data, ok := b.Fields[f.Name]
		if !ok {
			return nil, fmt.Errorf("batch: field %q missing", f.Name)
		}
		used++
		s.tensors = append(s.tensors, codec.Tensor{Name: f.Name, DType: f.DType.String(), Shape: s.shape(i, b.Rows, f.Shape), Data: data})
	}
	if spec.CompactObs {
		for j, k := range spec.ObsKeys {
			data, ok := b.Fields["next."+k]
			if !ok {
				continue
			}
			f, ok := spec.Field(k)
			if !ok || f.RowBytes() == 0 || len(data)%f.RowBytes() != 0 {
				return nil, fmt.Errorf("batch: final observations next.%s: %d bytes do not hold whole rows", k, len(data))
			}
			used++
			s.tensors = append(s.tensors, codec.Tensor{Name: "next." + k, DType: f.DType.String(),
				Shape: s.shape(len(spec.Fields)+j, len(data)/f.RowBytes(), f.Shape), Data: data})
		}
	}
	if used != len(b.Fields) {
		for name := range b.Fields {
			if !slices.ContainsFunc(s.tensors, func(t codec.Tensor) bool { return t.Name == name }) {
				return nil, fmt.Errorf("batch: field %q is not in the buffer's spec", name)
			}
		}
	}
	if b.Env != nil {
		if len(b.Env) != b.Rows {
			return nil, fmt.Errorf("batch: env has %d values for %d rows", len(b.Env), b.Rows)
		}
		s.env = slices.Grow(s.env[:0], 8*len(b.Env))[:8*len(b.Env)]
		for i, e := range b.Env {
			binary.LittleEndian.PutUint64(s.env[8*i:], uint64(e))
		}
		s.tensors = append(s.tensors, codec.Tensor{Name: "env", DType: "int64",
			Shape: s.shape(len(spec.Fields)+len(spec.ObsKeys), b.Rows, nil), Data: s.env})
	}
	// A buffer from before policy versions may have a field of that name,
	// which the server fills from the tensor: the versions are not sent.
	if _, isField := spec.Field(storage.ReservedNewField); b.PolicyVersion != nil && !isField {
		if len(b.PolicyVersion) != b.Rows {
			return nil, fmt.Errorf("batch: policy_version has %d values for %d rows", len(b.PolicyVersion), b.Rows)
		}
		s.version = slices.Grow(s.version[:0], 8*b.Rows)[:8*b.Rows]
		for i, v := range b.PolicyVersion {
			binary.LittleEndian.PutUint64(s.version[8*i:], uint64(v))
		}
		s.tensors = append(s.tensors, codec.Tensor{Name: "policy_version", DType: "int64",
			Shape: s.shape(len(spec.Fields)+len(spec.ObsKeys)+1, b.Rows, nil), Data: s.version})
	}
	return s.tensors, nil
}

// Extend implements Writer.
func (w *HTTPWriter) Extend(ctx context.Context, stream string, b *storage.Batch) (storage.ExtendResult, error) {
	s, _ := w.scratch.Get().(*httpScratch)
	if s == nil {
		s = &httpScratch{}
	}
	defer w.scratch.Put(s)
	tensors, err := s.tensorsOf(w.spec, b)
	if err != nil {
		return storage.ExtendResult{}, fmt.Errorf("extend %s: %w", w.buffer, err)
	}
	res, err := w.c.ExtendWithOptions(ctx, w.buffer, stream, tensors, &client.ExtendOptions{TimeoutMS: writerWait.Milliseconds()})
	if err != nil {
		return storage.ExtendResult{}, err
	}
	return storage.ExtendResult{FirstSeq: res.FirstSeq, Rows: res.Rows, WriteCount: res.WriteCount}, nil
}

// BufferSpec returns the buffer's spec, which Run checks before it writes.
func (w *HTTPWriter) BufferSpec() storage.Spec { return w.spec }

// CloseStream implements Writer.
func (w *HTTPWriter) CloseStream(ctx context.Context, stream string) error {
	_, err := w.c.CloseStream(ctx, w.buffer, stream)
	return err
}
