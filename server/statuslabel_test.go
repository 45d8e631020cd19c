package server

import (
	"strconv"
	"testing"
)

// TestStatusLabelIsItoa: the metrics' status label is the decimal code,
// whichever codes have a label written out.
func TestStatusLabelIsItoa(t *testing.T) {
	for code := 100; code < 600; code++ {
		if got, want := statusLabel(code), strconv.Itoa(code); got != want {
			t.Fatalf("statusLabel(%d) = %q, want %q", code, got, want)
		}
	}
}
