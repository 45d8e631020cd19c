package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/storage"
)

// apiError is an error with its HTTP status and optional machine code.
type apiError struct {
	status int
	code   string // e.g. "not_ready", "shutting_down"
	msg    string
	cause  error // for errors.Is; not shown
}

func (e *apiError) Error() string { return e.msg }

func (e *apiError) Unwrap() error { return e.cause }

// clientGone is the answer to a request whose client hung up (or whose
// context ended) before it was complete: a 4xx, never counted as the
// server's fault. Nobody reads it, but it is logged and counted.
func clientGone(cause error) error {
	return &apiError{status: http.StatusBadRequest, code: "client_gone", cause: cause,
		msg: fmt.Sprintf("the client went away before the request was complete: %v", cause)}
}

func badRequest(msg string) error { return &apiError{status: http.StatusBadRequest, msg: msg} }

// statusOf maps errors from the layers below to HTTP statuses.
func statusOf(err error) (int, string) {
	var ae *apiError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.code
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, ""
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrClosed):
		return http.StatusNotFound, ""
	case errors.Is(err, storage.ErrSpecConflict):
		return http.StatusConflict, ""
	case errors.Is(err, rbd.ErrStopped):
		return http.StatusServiceUnavailable, "shutting_down"
	case errors.Is(err, ratelimit.ErrRateLimited):
		return http.StatusServiceUnavailable, "rate_limited"
	case errors.Is(err, ratelimit.ErrNeverAdmitted):
		return http.StatusBadRequest, ""
	case errors.Is(err, rbd.ErrNotReady):
		return http.StatusServiceUnavailable, "not_ready"
	case errors.Is(err, rbd.ErrContention):
		return http.StatusServiceUnavailable, "contention"
	case errors.Is(err, storage.ErrInvalidName), errors.Is(err, storage.ErrInvalidSpec),
		errors.Is(err, storage.ErrInvalidBatch), errors.Is(err, rbd.ErrBadRequest),
		errors.Is(err, codec.ErrSafetensors), errors.Is(err, storage.ErrNoPriority):
		return http.StatusBadRequest, ""
	case errors.Is(err, storage.ErrTooManyBuffers):
		return http.StatusInsufficientStorage, "too_many_buffers"
	case errors.Is(err, storage.ErrTooManyStreams):
		return http.StatusTooManyRequests, "too_many_streams"
	case errors.Is(err, storage.ErrSeqsExhausted):
		return http.StatusInsufficientStorage, "seqs_exhausted"
	case errors.Is(err, storage.ErrInsufficientMemory):
		return http.StatusInsufficientStorage, "insufficient_memory"
	case errors.Is(err, storage.ErrInsufficientStorage):
		return http.StatusInsufficientStorage, "insufficient_storage"
	case errors.Is(err, storage.ErrIO):
		// A mapped file faulted (truncated underneath, disk gone): this
		// buffer refuses calls until the store is reopened.
		return http.StatusInternalServerError, "io_error"
	case errors.Is(err, storage.ErrCorrupt):
		// Stored bytes failed their checks: the server's fault, not the
		// request's, and worth a distinct code for alerting.
		return http.StatusInternalServerError, "corrupt"
	}
	return http.StatusInternalServerError, ""
}

type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
	// RateLimit is the limiter's state when a request was rate limited:
	// why it waited, without a second request.
	RateLimit *ratelimit.State `json:"rate_limit,omitempty"`
}

func writeError(w http.ResponseWriter, err error) int {
	status, code := statusOf(err)
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(1))
	}
	body := errorBody{Error: err.Error(), Code: code}
	if be := (*ratelimit.BlockedError)(nil); errors.As(err, &be) {
		body.RateLimit = &be.State
	}
	if sw, ok := w.(*statusWriter); ok {
		sw.failure = &body
	}
	writeJSON(w, status, body)
	return status
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Error: "encode answer: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
