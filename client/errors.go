package client

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rbdb/rbd/ratelimit"
)

// These errors classify an *APIError by its status (and code). Match them
// with errors.Is; the *APIError itself carries the server's message.
var (
	// ErrBadRequest matches a 400: a request the server can never satisfy
	// (bad field, unknown key, wrong shape); the message names the field.
	ErrBadRequest = errors.New("client: bad request")
	// ErrUnauthorized matches a 401: the server wants a bearer token and
	// got none or a wrong one (Options.Token).
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrNotFound matches a 404: no such buffer, collector or endpoint.
	ErrNotFound = errors.New("client: not found")
	// ErrConflict matches a 409: a buffer of that name exists with a
	// different spec.
	ErrConflict = errors.New("client: conflict")
	// ErrTooLarge matches a 413: the request body exceeds the server's
	// --max-body.
	ErrTooLarge = errors.New("client: request too large")
	// ErrNotReady matches a 503 with code "not_ready": the current data
	// cannot satisfy a sample request yet (e.g. an empty buffer); retry
	// after RetryAfter(err), or give the request a timeout_ms.
	ErrNotReady = errors.New("client: not ready")
	// ErrShuttingDown matches a 503 with code "shutting_down".
	ErrShuttingDown = errors.New("client: server is shutting down")
	// ErrContention matches a 503 with code "contention": the rows a sample
	// chose kept being overwritten while they were copied (a ring small
	// for its write rate); retrying usually succeeds.
	ErrContention = errors.New("client: sampled rows were overwritten while copied")
	// ErrRateLimited matches a 503 with code "rate_limited": the buffer's
	// rate limiter did not admit the request within its timeout_ms
	// (APIError.RateLimit says why). It is ratelimit.ErrRateLimited, so
	// code that writes both in process and over HTTP checks one error.
	ErrRateLimited = ratelimit.ErrRateLimited
)

// APIError is an answer with a status outside 2xx.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the server's machine-readable code ("not_ready",
	// "shutting_down", "contention"), empty for most errors.
	Code string
	// Message is the server's "error" text, or the raw body (trimmed and
	// capped) when it is not the JSON error shape, or the status text when
	// the body is empty.
	Message string
	// RetryAfter is the server's Retry-After hint (whole seconds or an
	// HTTP date), zero if it sent none.
	RetryAfter time.Duration
	// RateLimit is the rate limiter's state of a "rate_limited" answer.
	RateLimit *ratelimit.State
}

// Error returns "rbd server: <status> [(<code>)]: <message>".
func (e *APIError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("rbd server: %d (%s): %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("rbd server: %d: %s", e.Status, e.Message)
}

// Is matches the sentinel errors of this package by status and code.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Status == http.StatusBadRequest
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrTooLarge:
		return e.Status == http.StatusRequestEntityTooLarge
	case ErrNotReady:
		return e.Status == http.StatusServiceUnavailable && e.Code == "not_ready"
	case ErrShuttingDown:
		return e.Status == http.StatusServiceUnavailable && e.Code == "shutting_down"
	case ErrContention:
		return e.Status == http.StatusServiceUnavailable && e.Code == "contention"
	case ErrRateLimited:
		return e.Status == http.StatusServiceUnavailable && e.Code == "rate_limited"
	}
	return false
}

// IsNotFound reports whether err is (or wraps) a 404 answer.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsNotReady reports whether err is (or wraps) a 503 "not_ready" answer.
func IsNotReady(err error) bool { return errors.Is(err, ErrNotReady) }

// RetryAfter returns how long the server asked the client to wait before
// retrying: the Retry-After of a 429 or 503 answer (one second if it sent
// none). ok is false for every other error.
func RetryAfter(err error) (d time.Duration, ok bool) {
	ae, isAPI := errors.AsType[*APIError](err)
	if !isAPI || (ae.Status != http.StatusTooManyRequests && ae.Status != http.StatusServiceUnavailable) {
		return 0, false
	}
	if ae.RetryAfter > 0 {
		return ae.RetryAfter, true
	}
	return time.Second, true
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an
// HTTP-date (RFC 9110 §10.2.3). Anything else, or a date in the past, is 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, 24*3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
