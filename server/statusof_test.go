package server

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// TestStatusOfStorageErrors: storage's sentinel errors, wrapped as the
// storage layer wraps them, map to their documented status and code
// (docs/http-api.md, openapi.yaml).
func TestStatusOfStorageErrors(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{storage.ErrSeqsExhausted, http.StatusInsufficientStorage, "seqs_exhausted"},
		{storage.ErrTooManyStreams, http.StatusTooManyRequests, "too_many_streams"},
		{storage.ErrInsufficientMemory, http.StatusInsufficientStorage, "insufficient_memory"},
		{storage.ErrTooManyBuffers, http.StatusInsufficientStorage, "too_many_buffers"},
		{storage.ErrNotFound, http.StatusNotFound, ""},
	} {
		wrapped := fmt.Errorf("extend %q: %w", "b", tc.err)
		status, code := statusOf(wrapped)
		if status != tc.status || code != tc.code {
			t.Errorf("%v: status %d code %q, want %d %q", tc.err, status, code, tc.status, tc.code)
		}
	}
}
