package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/storage"
)

func (s *Server) buffer(r *http.Request) (*rbd.Buffer, error) {
	name := r.PathValue("name")
	if err := storage.ValidateBufferName(name); err != nil {
		return nil, err
	}
	return s.db.Buffer(name)
}

// readBody reads the whole body into memory reserved from the budget as
// the bytes arrive: a declared Content-Length reserves nothing, so a
// client cannot make the server hold memory it does not send.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return readBodyInto(w, r, nil)
}

// bodyStartCap is the first buffer size of a body read (it then doubles):
// small, so that many slow uploads hold little of the memory budget.
const bodyStartCap = 4 << 10

// readBodyInto is readBody appending to buf[:0], so that callers can reuse
// memory across requests; buf's capacity counts against the request's
// lease for as long as the request runs.
func readBodyInto(w http.ResponseWriter, r *http.Request, buf []byte) ([]byte, error) {
	l := leaseOf(w)
	ctx := r.Context()
	if err := l.grow(ctx, int64(cap(buf)), "the request body"); err != nil {
		return nil, err
	}
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			old := int64(cap(buf))
			next := max(bodyStartCap, 2*old)
			if err := l.grow(ctx, next, "the request body"); err != nil {
				return nil, err
			}
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			buf = nb
			l.shrink(old) // the old buffer is garbage now
		}
		m, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, bodyError(ctx, err)
		}
	}
}

// bodyPool keeps request body buffers for reuse (readBodyInto appends to
// one), up to max bytes of capacity each: larger ones are dropped, since an
// idle pool must not hold what the memory budget no longer counts.
type bodyPool struct {
	pool sync.Pool // of *[]byte
	max  int
}

// get returns a buffer to read a body into (*bp, possibly empty).
func (p *bodyPool) get() *[]byte {
	if bp, _ := p.pool.Get().(*[]byte); bp != nil {
		return bp
	}
	return new([]byte)
}

// put keeps body (read into *bp) for the next get, unless it grew past max.
func (p *bodyPool) put(bp *[]byte, body []byte) {
	if cap(body) <= p.max {
		*bp = body[:0]
		p.pool.Put(bp)
	}
}

// bodyError classifies a failed body read: too large (413), too slow
// (408), or the client gone (400 client_gone). None of them is the
// server's fault, and none is counted as a 5xx.
func bodyError(ctx context.Context, err error) error {
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return err
	case errors.As(err, &ne) && ne.Timeout():
		return &apiError{status: http.StatusRequestTimeout, code: "body_timeout", cause: err,
			msg: "read body: the body did not arrive within the server's read timeout"}
	case ctx.Err() != nil:
		return clientGone(ctx.Err())
	}
	return clientGone(fmt.Errorf("read body: %w", err))
}

// mediaType returns the request's content type without parameters.
func mediaType(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	switch ct {
	case "", "application/json", "application/octet-stream":
		return ct // what clients send: no parse, no allocation
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Type")))
	}
	return mt
}

// isJSONBody reports whether a control body should be parsed as JSON: it
// is, unless it says it is something else we know (curl -d sends
// application/x-www-form-urlencoded).
func isJSONBody(r *http.Request) error {
	switch mediaType(r) {
	case "", "application/json", "application/x-www-form-urlencoded", "text/plain":
		return nil
	}
	return &apiError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("Content-Type %q: this endpoint takes JSON", mediaType(r))}
}

// readJSONBody reads a control body, refusing content types that are not
// JSON (415).
func (s *Server) readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if err := isJSONBody(r); err != nil {
		return nil, err
	}
	return readBody(w, r)
}

func wantsJSON(r *http.Request) bool {
	accept := r.Header.Get("Accept")
	if !strings.Contains(strings.ToLower(accept), "json") {
		return false // most requests: no parse, no allocation
	}
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part))
		if mt == "application/json" {
			return true
		}
	}
	return false
}

func (s *Server) listBuffers(w http.ResponseWriter, _ *http.Request) error {
	infos := []storage.Info{}
	for _, b := range s.db.Buffers() {
		if info, err := b.Info(); err == nil {
			infos = append(infos, info)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"buffers": infos})
	return nil
}

func (s *Server) createBuffer(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := storage.ValidateBufferName(name); err != nil {
		return err
	}
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	spec, err := storage.ParseSpec(body)
	if err != nil {
		return err
	}
	b, created, err := s.db.CreateBuffer(name, spec)
	if err != nil {
		return err
	}
	info, err := b.Info()
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, info)
	return nil
}

func (s *Server) getBuffer(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	info, err := b.Info()
	if err != nil {
		return err
	}
	if v := r.URL.Query().Get("slice_len"); v != "" {
		l, err := intParam(v, 0, "slice_len")
		if err != nil {
			return err
		}
		if l < 1 || l > info.Spec.Capacity {
			return badRequest(fmt.Sprintf("slice_len: %d is outside 1..%d (the capacity)", l, info.Spec.Capacity))
		}
		sl, err := b.SliceFigures(int(l))
		if err != nil {
			return err
		}
		info.Sampling.Slices = &sl
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

// rateLimitAnswer is the answer of PUT .../rate_limit: the limiter's state
// after the change (null once removed).
type rateLimitAnswer struct {
	RateLimit *ratelimit.State `json:"rate_limit"`
}

// setRateLimit replaces a buffer's rate limit (a JSON object like the
// spec's "rate_limit", or null to remove it); waiters are judged again.
func (s *Server) setRateLimit(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	p, err := storage.ParseRateLimit(body)
	if err != nil {
		return err
	}
	if err := b.SetRateLimit(p); err != nil {
		return err
	}
	var ans rateLimitAnswer
	if st, on := b.RateLimit(); on {
		ans.RateLimit = &st
	}
	writeJSON(w, http.StatusOK, ans)
	return nil
}

func (s *Server) deleteBuffer(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := storage.ValidateBufferName(name); err != nil {
		return err
	}
	if err := s.db.DeleteBuffer(name); err != nil {
		return err
	}
	s.errs.forget(name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) closeStream(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	n, err := b.CloseStream(r.PathValue("stream"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]int{"closed": n})
	return nil
}

func (s *Server) priorities(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	// seq and priority decode to 8 bytes per value each, twice (bytes,
	// then typed slices), from at least 2 bytes of JSON per value.
	if err := leaseOf(w).grow(r.Context(), 8*int64(len(body)), "decoding the priorities"); err != nil {
		return err
	}
	raw := map[string][]byte{}
	err = codec.ScanJSONObject(body, func(k string, v []byte) error {
		if k != "seq" && k != "priority" {
			return badRequest(fmt.Sprintf("%s: unknown key (want seq and priority)", k))
		}
		raw[k] = v
		return nil
	})
	if err != nil {
		if _, ok := errors.AsType[*apiError](err); ok {
			return err
		}
		return badRequest("body: not a JSON object: " + err.Error())
	}
	if raw["seq"] == nil || raw["priority"] == nil {
		return badRequest("seq and priority are required")
	}
	seqB, n, err := codec.DecodeJSONTensor(raw["seq"], "int64", nil)
	if err != nil {
		return badRequest("seq: " + err.Error())
	}
	prioB, m, err := codec.DecodeJSONTensor(raw["priority"], "float64", nil)
	if err != nil {
		return badRequest("priority: " + err.Error())
	}
	if n != m {
		return badRequest(fmt.Sprintf("priority: %d values for %d seqs", m, n))
	}
	seqs, prios := int64s(seqB), float64s(prioB)
	updated, stale, err := b.UpdatePriorities(seqs, prios)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]int{"updated": updated, "stale": stale})
	return nil
}
