package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rbdb/rbd/storage"
)

// checkpointRequest is the body of POST /v1/buffers/{name}/checkpoint.
type checkpointRequest struct {
	// Dir is where the copy goes, relative to the server's checkpoint
	// root (--checkpoint-root); it must not exist.
	Dir string `json:"dir"`
}

// checkpointProgress is one line of an NDJSON checkpoint answer.
type checkpointProgress struct {
	Done   int64                     `json:"done_bytes,omitempty"`
	Total  int64                     `json:"total_bytes,omitempty"`
	Result *storage.CheckpointResult `json:"result,omitempty"`
	Error  string                    `json:"error,omitempty"`
	Code   string                    `json:"code,omitempty"`
}

// checkpoint writes a hot checkpoint of a buffer (storage.Buffer.Checkpoint)
// under the checkpoint root. The answer is the result as JSON once the
// copy is done or, with Accept: application/x-ndjson, a stream of progress
// lines ending with the result (or an error). A long copy is not cut by
// the server's write timeout; a client that goes away, or a shutdown,
// cancels it and removes what was written.
func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	if s.opts.CheckpointRoot == "" {
		return &apiError{status: http.StatusNotFound, msg: "checkpoints are off: start rbd serve with --checkpoint-root DIR"}
	}
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	var req checkpointRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return badRequest("body: want {\"dir\": \"<path under the checkpoint root>\"}: " + err.Error())
	}
	if req.Dir == "" || !filepath.IsLocal(req.Dir) {
		return badRequest(fmt.Sprintf("dir: %q must be a relative path inside the checkpoint root (no \"..\", not absolute)", req.Dir))
	}
	if err := os.MkdirAll(s.opts.CheckpointRoot, 0o755); err != nil {
		return fmt.Errorf("checkpoint root: %w", err)
	}
	dest := filepath.Join(s.opts.CheckpointRoot, req.Dir)
	if _, err := os.Lstat(dest); err == nil {
		return checkpointError(fmt.Errorf("checkpoint %q to %s: %w", b.Name(), req.Dir, storage.ErrCheckpointExists))
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	// The copy may take longer than the write timeout allows an answer.
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	ctx, cancel := contextUntil(r.Context(), s.stopping)
	defer cancel()
	if !acceptsNDJSON(r) {
		res, err := b.Checkpoint(ctx, dest, nil)
		if err != nil {
			return checkpointError(err)
		}
		res.Dir = req.Dir
		writeJSON(w, http.StatusOK, res)
		return nil
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	last := time.Now()
	line := func(p checkpointProgress) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(p)
		_ = rc.Flush()
	}
	res, err := b.Checkpoint(ctx, dest, &storage.CheckpointOptions{Progress: func(done, total int64) {
		if time.Since(last) >= 200*time.Millisecond || done == total {
			last = time.Now()
			line(checkpointProgress{Done: done, Total: total})
		}
	}})
	if err != nil {
		// The 200 is sent: the error travels in the last line.
		_, code := statusOf(checkpointError(err))
		line(checkpointProgress{Error: err.Error(), Code: code})
		return nil
	}
	res.Dir = req.Dir
	line(checkpointProgress{Result: &res})
	return nil
}

func checkpointError(err error) error {
	if errors.Is(err, storage.ErrCheckpointExists) {
		return &apiError{status: http.StatusConflict, code: "exists", cause: err, msg: err.Error()}
	}
	return err
}

// contextUntil returns a context that ends with parent or when stop is
// closed (the server shutting down), whichever comes first.
func contextUntil(parent context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func acceptsNDJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part)); mt == "application/x-ndjson" {
			return true
		}
	}
	return false
}
