package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/ratelimit"
)

// A sample stream (POST .../sample?stream=1) answers one request with many
// batches, so a remote learner pays one round trip per stream instead of
// one per batch. A producer goroutine draws up to depth batches ahead into
// their own memory; the handler writes them as frames and TCP flow control
// paces it. Neither holds a buffer lock while it waits for the client: a
// stalled reader blocks only its own goroutines, until StreamStallTimeout
// ends the stream. The framing is in docs/http-api.md.

// StreamContentType is the media type of a sample stream's body.
const StreamContentType = "application/vnd.rbd.sample-stream"

const (
	// defaultStreamDepth is how many batches a stream draws ahead of the
	// one being written when the request does not say.
	defaultStreamDepth = 2
	// maxStreamDepth bounds depth: each prepared batch holds its memory.
	maxStreamDepth = 64
	// minStreamSendBuffer and maxStreamSendBuffer bound a stream
	// connection's send buffer (depth frames).
	minStreamSendBuffer = 64 << 10
	maxStreamSendBuffer = 16 << 20
	// frameError marks a frame whose payload is a JSON error that ends the
	// stream (the top bit of the length word).
	frameError = uint64(1) << 63
)

// streamRequest is a sample request plus the stream's own keys.
type streamRequest struct {
	sample *rbd.SampleRequest
	// batches is how many batches to send; 0 means until the client
	// closes the stream.
	batches int64
	// depth is how many batches the server may draw ahead.
	depth int
	// untilEpochEnd ends the stream after the batch that ends an epoch of
	// a without-replacement sampler (no batch of the next epoch is drawn
	// and then thrown away).
	untilEpochEnd bool
}

// parseStreamRequest reads the stream keys ("batches", "depth",
// "stop_at_epoch_end") and hands the rest to rbd.ParseSampleRequest.
func parseStreamRequest(body []byte) (*streamRequest, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		// ParseSampleRequest words the error the same way for both paths.
		_, perr := rbd.ParseSampleRequest(body)
		if perr == nil {
			perr = &rbd.RequestError{Field: "body", Msg: "not a JSON object"}
		}
		return nil, perr
	}
	sr := &streamRequest{depth: defaultStreamDepth}
	if v, ok := raw["batches"]; ok {
		delete(raw, "batches")
		if string(v) != "null" {
			if err := json.Unmarshal(v, &sr.batches); err != nil {
				return nil, &rbd.RequestError{Field: "batches", Msg: "must be an integer (omit it for a stream that lasts until the client closes it)"}
			}
			if sr.batches < 1 {
				return nil, &rbd.RequestError{Field: "batches", Msg: fmt.Sprintf("must be at least 1, got %d (omit it for a stream that lasts until the client closes it)", sr.batches)}
			}
		}
	}
	if v, ok := raw["depth"]; ok {
		delete(raw, "depth")
		if err := json.Unmarshal(v, &sr.depth); err != nil {
			return nil, &rbd.RequestError{Field: "depth", Msg: "must be an integer"}
		}
		if sr.depth < 1 || sr.depth > maxStreamDepth {
			return nil, &rbd.RequestError{Field: "depth", Msg: fmt.Sprintf("must be in [1, %d], got %d", maxStreamDepth, sr.depth)}
		}
	}
	if v, ok := raw["stop_at_epoch_end"]; ok {
		delete(raw, "stop_at_epoch_end")
		if err := json.Unmarshal(v, &sr.untilEpochEnd); err != nil {
			return nil, &rbd.RequestError{Field: "stop_at_epoch_end", Msg: "must be a boolean"}
		}
	}
	rest, err := json.Marshal(raw)
	if err != nil {
		return nil, &rbd.RequestError{Field: "body", Msg: err.Error()}
	}
	if sr.sample, err = rbd.ParseSampleRequest(rest); err != nil {
		return nil, err
	}
	return sr, nil
}

// Transports of a sample answer (the "stream" query parameter).
const (
	transportSingle = ""    // one answer
	transportStream = "tcp" // a sample stream of frames on the socket
	transportArena  = "shm" // a sample stream whose batches are in shared memory
	// transportRing is a shared-memory stream whose batches are announced
	// in the arena itself (version 2): the socket carries only wake-ups
	// and errors.
	transportRing = "shm2"
)

// streamParam reads the sample endpoint's "stream" query parameter.
func streamParam(r *http.Request) (string, error) {
	if r.URL.RawQuery == "" {
		return transportSingle, nil
	}
	q := r.URL.Query()
	if a := q.Get("arena"); a != "" && q.Get("stream") != "shm" {
		return "", badRequest(fmt.Sprintf("arena: %q applies to stream=shm only", a))
	}
	switch v := q.Get("stream"); v {
	case "", "0", "false":
		return transportSingle, nil
	case "1", "true":
		return transportStream, nil
	case "shm":
		switch a := q.Get("arena"); a {
		case "", "1":
			return transportArena, nil
		case "2":
			return transportRing, nil
		default:
			return "", badRequest(fmt.Sprintf("arena: %q is not an arena version (want 1 or 2)", a))
		}
	default:
		return "", badRequest(fmt.Sprintf("stream: %q is not a transport option (want 1 for a sample stream, shm for one in shared memory, or 0)", v))
	}
}

// streamBatch is one prepared batch (or the error that ends the stream)
// with the memory it holds against the budget.
type streamBatch struct {
	batch *rbd.Batch
	lease *lease
	err   error
}

func (it *streamBatch) free() {
	if it.batch != nil {
		it.batch.Release()
	}
	if it.lease != nil {
		it.lease.release()
	}
}

// sampleStream answers POST .../sample?stream=1. Errors before the first
// batch (a bad request, data not ready in time) are ordinary error
// answers; after it, an error is the stream's last frame.
func (s *Server) sampleStream(w http.ResponseWriter, r *http.Request, b *rbd.Buffer, body []byte, transport string) error {
	if wantsJSON(r) {
		return badRequest("stream: a sample stream is binary frames of safetensors batches (docs/http-api.md); accept application/octet-stream, or drop stream=1 for a JSON answer")
	}
	sr, err := parseStreamRequest(body)
	if err != nil {
		return err
	}
	// A stream holds a goroutine and a connection for as long as it runs,
	// like a request waiting for data, and is counted with them.
	done, err := s.mayWait()
	if err != nil {
		return err
	}
	defer done()
	s.streams.Add(1)
	defer s.streams.Add(-1)
	if transport == transportRing {
		return s.ringStream(w, r, b, sr)
	}
	ctx, cancel := context.WithCancel(r.Context())
	ready := make(chan streamBatch, sr.depth-1) // plus the one the producer holds
	go s.produceStream(ctx, b, sr, ready, 0)
	defer func() {
		cancel()
		for it := range ready { // closed by the producer once it has stopped
			it.free()
		}
	}()

	var it streamBatch
	select {
	case it = <-ready:
	case <-s.stopping:
		return &apiError{status: http.StatusServiceUnavailable, code: "shutting_down", msg: "server is shutting down"}
	}
	if it.err != nil {
		if r.Context().Err() != nil {
			return clientGone(r.Context().Err())
		}
		return it.err
	}
	rc := http.NewResponseController(w)
	// The request is read: a stream must outlive the server's read
	// timeout, which would otherwise end the request's context.
	_ = rc.SetReadDeadline(time.Time{})
	var ar *arena
	if transport == transportArena {
		// Slots for depth batches drawn ahead plus the ones the client
		// holds; each fits the first batch with room for a longer header.
		hdr, total, err := codec.SafetensorsHeader(batchTensors(it.batch), it.batch.Metadata)
		if err != nil {
			it.free()
			return err
		}
		slots := sr.depth + 1 + arenaHold
		slotBytes := total + int64(len(hdr)) + 4096
		if err := leaseOf(w).grow(r.Context(), int64(slots)*slotBytes+4096, "the stream's shared-memory arena"); err != nil {
			it.free()
			return err
		}
		if ar, err = newArena(1, slots, slotBytes); err != nil {
			it.free()
			return err
		}
		defer ar.close()
		w.Header().Set("X-Rbd-Arena", ar.path())
		w.Header().Set("X-Rbd-Arena-Nonce", ar.nonce)
	} else if frame := answerBytes(it.batch); setSendBuffer(r, int(min(max(int64(sr.depth)*frame, minStreamSendBuffer), maxStreamSendBuffer))) {
		// What travels ahead of the reader is depth batches here plus
		// what the socket buffers hold: keep the send buffer to about
		// depth frames. The connection closes after the stream, so no
		// later answer inherits it.
		w.Header().Set("Connection", "close")
	}
	if ar == nil && r.ProtoMajor == 1 {
		// Frames delimit themselves, so the body needs no chunked
		// encoding: without it the connection closes after the stream
		// (as it does anyway), and a reader takes frames straight off
		// the socket (Python's http.client parses chunks a line at a
		// time, in Python).
		w.Header().Set("Transfer-Encoding", "identity")
	}
	w.Header().Set("Content-Type", StreamContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	sent, reason := int64(0), "complete"
	defer func() {
		s.log.Info("sample stream ended", "buffer", b.Name(), "batches", sent, "reason", reason)
	}()
	var sc frameScratch
	for {
		// Flush only when no batch waits: frames drawn ahead go out
		// together, in fewer writes.
		var err error
		if ar != nil {
			err = s.writeArenaFrame(r.Context(), w, rc, ar, b, it.batch, len(ready) == 0)
		} else {
			err = s.writeBatchFrame(w, rc, b, it.batch, len(ready) == 0, &sc)
		}
		it.free()
		if err != nil {
			reason = "client gone: " + err.Error()
			return nil
		}
		sent++
		var ok bool
		select {
		case it, ok = <-ready:
			if !ok {
				if ar != nil {
					// The client maps the arena by the server's fd: keep it
					// until the client has dropped every batch or hung up.
					_ = ar.waitIdle(r.Context(), s.opts.StreamStallTimeout)
				}
				return nil
			}
		case <-s.stopping:
			reason = "server shutting down"
			s.writeErrorFrame(w, rc, &apiError{status: http.StatusServiceUnavailable, code: "shutting_down", msg: "server is shutting down"})
			return nil
		}
		if it.err != nil {
			if r.Context().Err() != nil {
				reason = "client gone"
				return nil
			}
			reason = it.err.Error()
			s.writeErrorFrame(w, rc, it.err)
			return nil
		}
	}
}

// produceStream draws the stream's batches from batch from on into out
// until it has drawn
// them all, a draw fails (the error is sent as the last item) or ctx ends.
// Batch i of a seeded request uses seed+i, so a stream returns what single
// requests with those seeds would.
func (s *Server) produceStream(ctx context.Context, b *rbd.Buffer, sr *streamRequest, out chan<- streamBatch, from int64) {
	defer close(out)
	for i := from; sr.batches == 0 || i < sr.batches; i++ {
		it := s.drawStreamBatch(ctx, b, sr, i)
		// Read before the hand-over: the handler releases the batch, and
		// released batches are reused.
		last := it.err != nil || (sr.untilEpochEnd && it.batch.Metadata["epoch_end"] == "true")
		select {
		case out <- it:
		case <-ctx.Done():
			it.free()
			return
		}
		if last {
			return
		}
	}
}

// drawStreamBatch draws batch i of a stream, with seed+i for a seeded
// request, into memory leased from the server's budget.
func (s *Server) drawStreamBatch(ctx context.Context, b *rbd.Buffer, sr *streamRequest, i int64) streamBatch {
	req := *sr.sample
	if sr.sample.Seed != nil {
		seed := *sr.sample.Seed + uint64(i)
		req.Seed = &seed
	}
	l := &lease{b: s.budget}
	batch, err := b.Sample(ctx, &req, &rbd.SampleOptions{MaxResponseBytes: s.opts.MaxResponse, MaxTimeout: s.opts.MaxWait,
		Reserve: func(n int64) error { return l.grow(ctx, n, "a stream's batch") }, Stop: s.stopping})
	return streamBatch{batch: batch, lease: l, err: err}
}

// writeBatchFrame writes one batch as a frame: its length as a
// little-endian uint64, then the batch exactly as a single sample request
// would answer it.
// The tensor list and header are built in sc, which a stream keeps for
// all its batches.
func (s *Server) writeBatchFrame(w http.ResponseWriter, rc *http.ResponseController, b *rbd.Buffer, batch *rbd.Batch, flush bool, sc *frameScratch) error {
	total, err := s.encodeFrame(sc, b, batch)
	if err != nil {
		return err
	}
	return s.writeFrame(w, rc, sc.hdr, total, sc.tensors, flush)
}

// encodeFrame counts a stream's batch in the metrics and encodes it into
// sc: its tensor list (aliasing the batch) and safetensors header. It
// returns the encoded size.
func (s *Server) encodeFrame(sc *frameScratch, b *rbd.Buffer, batch *rbd.Batch) (int64, error) {
	s.countSampled(b, batch)
	clear(sc.tensors) // no reference to the batch before, which is released
	sc.tensors = appendBatchTensors(sc.tensors[:0], batch)
	var total int64
	var err error
	sc.hdr, total, err = codec.AppendSafetensorsHeader(sc.hdr[:0], sc.tensors, batch.Metadata)
	return total, err
}

// frameScratch is a stream's memory for encoding its batches' frames.
type frameScratch struct {
	tensors []codec.Tensor
	hdr     []byte
}

// writeFrame writes an encoded batch (its safetensors header, total size
// and tensors) as a frame.
func (s *Server) writeFrame(w http.ResponseWriter, rc *http.ResponseController, hdr []byte, total int64, tensors []codec.Tensor, flush bool) error {
	// A client that takes no frame for this long is stalled or gone: its
	// stream ends and frees what it holds.
	_ = rc.SetWriteDeadline(time.Now().Add(s.opts.StreamStallTimeout))
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(total))
	if err := s.writeEncoded(w, prefix[:], hdr, tensors, total); err != nil {
		return err
	}
	if !flush {
		return nil
	}
	return rc.Flush()
}

// writeArenaFrame copies a batch into a free arena slot and writes the
// 16-byte frame naming it: the slot (uint32), 4 zero bytes, the batch's
// length (uint64). A batch larger than a slot (a longer header than the
// first batch's, say) travels inline as an ordinary frame.
func (s *Server) writeArenaFrame(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, ar *arena, b *rbd.Buffer, batch *rbd.Batch, flush bool) error {
	var small [16]codec.Tensor
	tensors := s.answerTensors(b, batch, small[:0])
	hdr, total, err := codec.SafetensorsHeader(tensors, batch.Metadata)
	if err != nil {
		return err
	}
	if total > ar.slotBytes {
		return s.writeFrame(w, rc, hdr, total, tensors, flush)
	}
	i, err := ar.acquire(ctx, s.opts.StreamStallTimeout, func() { _ = rc.Flush() })
	if err != nil {
		return err
	}
	ar.fill(i, hdr, tensors)
	_ = rc.SetWriteDeadline(time.Now().Add(s.opts.StreamStallTimeout))
	var frame [24]byte
	binary.LittleEndian.PutUint64(frame[0:], frameArena|16)
	binary.LittleEndian.PutUint32(frame[8:], uint32(i))
	binary.LittleEndian.PutUint64(frame[16:], uint64(total))
	if _, err := w.Write(frame[:]); err != nil {
		return err
	}
	if !flush {
		return nil
	}
	return rc.Flush()
}

// streamErrorBody is an error frame's payload: the error answer a single
// request would get, with its status.
type streamErrorBody struct {
	errorBody
	Status int `json:"status"`
}

// writeErrorFrame ends a stream with an error frame.
func (s *Server) writeErrorFrame(w http.ResponseWriter, rc *http.ResponseController, err error) {
	status, code := statusOf(err)
	body := streamErrorBody{errorBody: errorBody{Error: err.Error(), Code: code}, Status: status}
	if be := (*ratelimit.BlockedError)(nil); errors.As(err, &be) {
		body.RateLimit = &be.State
	}
	payload, jerr := json.Marshal(body)
	if jerr != nil {
		payload = []byte(`{"error":"encode error frame","status":500}`)
	}
	_ = rc.SetWriteDeadline(time.Now().Add(s.opts.StreamStallTimeout))
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], frameError|uint64(len(payload)))
	if _, err := w.Write(prefix[:]); err == nil {
		_, _ = w.Write(payload)
	}
	_ = rc.Flush()
}

// answerBytes is the size of a batch's tensor data (its frame, less the
// safetensors header).
func answerBytes(b *rbd.Batch) int64 {
	var n int64
	for _, t := range b.Tensors {
		n += int64(len(t.Data))
	}
	return n
}
