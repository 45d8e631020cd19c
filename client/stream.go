package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"time"

	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/ratelimit"
)

// StreamOptions shapes a sample stream. The zero value asks for batches
// until Close, with the server's default depth.
type StreamOptions struct {
	// Batches is how many batches the stream sends; 0 means until Close.
	Batches int64
	// Depth is how many batches the server may draw ahead of the one it
	// sends (1 to 64); 0 means the server's default, 2. Drawn-ahead
	// batches were drawn before the priorities of the batches before them
	// were updated.
	Depth int
	// StopAtEpochEnd ends the stream after the batch that ends an epoch of
	// a without-replacement sampler.
	StopAtEpochEnd bool
	// SharedMemory asks for the batches in shared memory (?stream=shm), for
	// a client on the server's machine: each batch's tensors alias a slot
	// the server filled, with no copy, until Batch.Release hands the slot
	// back. Release every batch: with 4 unreleased (beyond Depth) the
	// server waits, and after --stream-stall-timeout ends the stream.
	// SampleStream returns ErrNotColocated if the arena cannot be mapped.
	SharedMemory bool
	// ArenaVersion picks the shared-memory protocol (docs/format.md,
	// "Sample arenas"): 0 or 2, batches announced in the arena (a batch
	// that is ready costs no system call); 1, each batch named by a frame
	// on the socket (what servers before version 2 speak; for tests).
	ArenaVersion int
}

// streamContentType is server.StreamContentType (the client does not
// import the server).
const streamContentType = "application/vnd.rbd.sample-stream"

// frameError and frameArena are the length word's flags of an error frame
// and of a frame naming a shared-memory slot (StreamOptions.SharedMemory).
const (
	frameError = uint64(1) << 63
	frameArena = uint64(1) << 62
)

// SampleStream is an open sample stream (SampleStream): batches arrive in
// order, drawn by the server ahead of the reader. It is not safe for
// concurrent use; Close it when done (it frees the server's side too;
// shared-memory batches stay readable until released).
type SampleStream struct {
	name        string
	resp        *http.Response
	r           *bufio.Reader
	maxResponse int64
	want, got   int64
	err         error  // sticky: the stream is over
	arena       *arena // SharedMemory streams
}

// SampleStream opens a sample stream (POST /v1/buffers/{name}/sample?stream=1):
// one request, many batches, for a remote learner that would otherwise pay
// a round trip per batch. Batch i of a request with a seed is the batch a
// single Sample with seed+i returns for the same store state. Errors the
// first batch meets (a bad request, data not ready within TimeoutMS) are
// returned here, as Sample returns them; later ones by Next.
func (c *Client) SampleStream(ctx context.Context, name string, req *SampleRequest, opts *StreamOptions) (*SampleStream, error) {
	path, err := bufferPath(name, "/sample")
	if err != nil {
		return nil, fmt.Errorf("sample stream: %w", err)
	}
	if req == nil {
		req = &SampleRequest{}
	}
	var o StreamOptions
	if opts != nil {
		o = *opts
	}
	if o.Batches < 0 {
		return nil, fmt.Errorf("sample stream %s: batches %d is negative (0 means until Close)", name, o.Batches)
	}
	b, err := jsonBody(struct {
		*SampleRequest
		Batches        int64 `json:"batches,omitempty"`
		Depth          int   `json:"depth,omitempty"`
		StopAtEpochEnd bool  `json:"stop_at_epoch_end,omitempty"`
	}{req, o.Batches, o.Depth, o.StopAtEpochEnd})
	if err != nil {
		return nil, fmt.Errorf("sample stream %s: %w", name, err)
	}
	q := url.Values{"stream": {"1"}}
	if o.SharedMemory {
		switch o.ArenaVersion {
		case 0, 2:
			q = url.Values{"stream": {"shm"}, "arena": {"2"}}
		case 1:
			q = url.Values{"stream": {"shm"}}
		default:
			return nil, fmt.Errorf("sample stream %s: arena version %d is not 1 or 2", name, o.ArenaVersion)
		}
	}
	resp, err := c.sendRetrying(ctx, http.MethodPost, path, q, b, acceptTensors)
	if err != nil {
		return nil, fmt.Errorf("sample stream %s: %w", name, err)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != streamContentType {
		resp.Body.Close()
		return nil, fmt.Errorf("sample stream %s: content type %q, want %s (a server older than streams?)", name, resp.Header.Get("Content-Type"), streamContentType)
	}
	s := &SampleStream{name: name, resp: resp, r: bufio.NewReaderSize(resp.Body, 64<<10), maxResponse: c.maxResponse, want: o.Batches}
	if o.SharedMemory {
		if s.arena, err = openArena(resp.Header.Get("X-Rbd-Arena"), resp.Header.Get("X-Rbd-Arena-Nonce")); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("sample stream %s: %w", name, err)
		}
	}
	return s, nil
}

// Next returns the stream's next batch. After the last batch of a stream
// of StreamOptions.Batches it returns io.EOF; an error the server met
// (the buffer was deleted, the server is shutting down, data not ready in
// time) is an *APIError, as a single request's would be; a stream cut
// short is io.ErrUnexpectedEOF. Any error ends the stream.
func (s *SampleStream) Next() (*Batch, error) {
	if s.err != nil {
		return nil, s.err
	}
	b, err := s.next()
	if err != nil {
		s.err = err
		s.resp.Body.Close()
		return nil, err
	}
	s.got++
	return b, nil
}

func (s *SampleStream) next() (*Batch, error) {
	if s.want > 0 && s.got == s.want {
		return nil, io.EOF
	}
	if s.arena != nil && s.arena.ring {
		return s.ringBatch()
	}
	var prefix [8]byte
	if _, err := io.ReadFull(s.r, prefix[:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // only an error frame or the last batch ends a stream
		}
		return nil, fmt.Errorf("sample stream %s: after %d batches: %w", s.name, s.got, err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n&frameError != 0 {
		return nil, fmt.Errorf("sample stream %s: after %d batches: %w", s.name, s.got, s.readErrorFrame(n&^frameError))
	}
	if n&frameArena != 0 {
		return s.arenaBatch(n &^ frameArena)
	}
	if n > uint64(s.maxResponse) {
		return nil, fmt.Errorf("sample stream %s: a %d-byte batch exceeds the %d allowed (Options.MaxResponseBytes)", s.name, n, s.maxResponse)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(s.r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("sample stream %s: batch %d: %w", s.name, s.got, err)
	}
	tensors, meta, err := codec.DecodeSafetensors(buf)
	if err != nil {
		return nil, fmt.Errorf("sample stream %s: batch %d: %w", s.name, s.got, err)
	}
	return &Batch{Tensors: tensors, Metadata: meta}, nil
}

// arenaBatch reads a frame naming an arena slot and decodes the batch in
// place.
func (s *SampleStream) arenaBatch(n uint64) (*Batch, error) {
	if s.arena == nil || n != 16 {
		return nil, fmt.Errorf("sample stream %s: a shared-memory frame of %d bytes on a socket stream", s.name, n)
	}
	var ref [16]byte
	if _, err := io.ReadFull(s.r, ref[:]); err != nil {
		return nil, fmt.Errorf("sample stream %s: batch %d: %w", s.name, s.got, err)
	}
	return s.slotBatch(int(binary.LittleEndian.Uint32(ref[0:])), binary.LittleEndian.Uint64(ref[8:]))
}

// slotBatch decodes the n-byte batch in arena slot i in place; releasing
// the batch hands the slot back.
func (s *SampleStream) slotBatch(i int, n uint64) (*Batch, error) {
	data, release, err := s.arena.batch(i, n)
	if err != nil {
		return nil, fmt.Errorf("sample stream %s: batch %d: %w", s.name, s.got, err)
	}
	tensors, meta, err := codec.DecodeSafetensors(data)
	if err != nil {
		release()
		return nil, fmt.Errorf("sample stream %s: batch %d: %w", s.name, s.got, err)
	}
	return &Batch{Tensors: tensors, Metadata: meta, release: release}, nil
}

// ringBatch takes the next batch a version 2 arena announces: it polls the
// ring for ringSpin, then sleeps on the socket, where the server sends a
// wake-up once the batch is there (or an error frame, or ends the stream).
func (s *SampleStream) ringBatch() (*Batch, error) {
	a := s.arena
	for deadline := time.Now().Add(ringSpin); !a.announced() && time.Now().Before(deadline); {
	}
	for !a.announced() {
		a.setWaiting(true)
		if a.announced() {
			a.setWaiting(false)
			break
		}
		var word [8]byte
		if _, err := io.ReadFull(s.r, word[:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("sample stream %s: after %d batches: %w", s.name, s.got, err)
		}
		switch n := binary.LittleEndian.Uint64(word[:]); {
		case n&frameError != 0:
			return nil, fmt.Errorf("sample stream %s: after %d batches: %w", s.name, s.got, s.readErrorFrame(n&^frameError))
		case n != frameArena:
			return nil, fmt.Errorf("sample stream %s: a frame of %#x on a shared-memory stream, want a wake-up", s.name, n)
		}
	}
	return s.slotBatch(a.take())
}

// readErrorFrame reads an error frame's payload into an *APIError.
func (s *SampleStream) readErrorFrame(n uint64) error {
	if n > maxErrorBody {
		return fmt.Errorf("an error frame of %d bytes, more than the %d allowed", n, maxErrorBody)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(s.r, raw); err != nil {
		return fmt.Errorf("error frame: %w", err)
	}
	var eb struct {
		Error     string           `json:"error"`
		Code      string           `json:"code"`
		Status    int              `json:"status"`
		RateLimit *ratelimit.State `json:"rate_limit"`
	}
	if err := json.Unmarshal(raw, &eb); err != nil || eb.Status == 0 {
		return fmt.Errorf("error frame %q: not an error object", raw)
	}
	return &APIError{Status: eb.Status, Code: eb.Code, Message: eb.Error, RateLimit: eb.RateLimit}
}

// Close ends the stream; the server stops drawing and frees what the
// stream held. Batches already returned stay valid.
func (s *SampleStream) Close() error {
	if s.err == nil {
		s.err = errors.New("sample stream: closed")
	}
	err := s.resp.Body.Close()
	if s.arena != nil {
		s.arena.close() // unmapped once the last batch is released
		s.arena = nil
	}
	return err
}
