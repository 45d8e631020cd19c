// Package resident checks how much memory a full buffer holds per row, in
// a process of its own built without the race detector (whose shadow
// memory would be counted too).
package resident

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// TestResidentBytesPerCartPoleRow fills a compact CartPole memory buffer of
// 10^6 rows (twice over, so the ring has wrapped) with bench/compare's
// in-process program and checks the growth of its resident set, garbage
// collected and returned to the OS before both readings, against a bound
// in bytes per row, for both row metadata layouts.
//
// The bounds are today's figures with room for noise, not the issue's
// target: issue 11 asks for at most 47 B per row (floor 70 B). The default
// layout ("row") holds 68.7-69.5 B (2026-11-26; 143 B with 64-byte
// records, heap stamps, per-row seq lists and final observations at the
// slot): the row group's 64 B (a 32-byte memory record, seq stamp
// included, and 31 bytes of fields: one cache line), next distances
// (2 B), the dense tails (about 0.1 B a row) and the trajectories. Run
// records ("runs") hold 53.7-54.0 B (2026-11-27): a 48-byte row group (a
// 16-byte record) and a 64-byte run record per episode. Strided runs
// ("strided") hold 45.5-46.0 B (2026-11-27): a 40-byte row group (an
// 8-byte record: run word and 32-bit pass stamp); their bound is the
// issue's target itself.
//
// TestServeResidentBytesPerCartPoleRow (serve_test.go) reads the same for
// the real server.
func TestResidentBytesPerCartPoleRow(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills 10^6 rows in a child process")
	}
	bin := filepath.Join(t.TempDir(), "inproc")
	build := exec.Command("go", "build", "-o", bin, "./bench/compare/inproc")
	build.Dir = testbin.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./bench/compare/inproc: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		rowMeta        string
		maxBytesPerRow float64
	}{
		{"row", 75},
		{"runs", 59},
		{"strided", 47},
	} {
		t.Run(tc.rowMeta, func(t *testing.T) {
			out, err := exec.Command(bin, "--workload", "cartpole", "--capacity", "1000000", "--seconds", "0", "--settle", "--row-meta", tc.rowMeta).Output()
			if err != nil {
				t.Fatalf("inproc: %v", err)
			}
			var got struct {
				Rows   int64   `json:"rows"`
				RSS    float64 `json:"bytes_per_transition_rss"`
				Layout float64 `json:"bytes_per_transition_layout"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("inproc printed %q: %v", out, err)
			}
			if got.Rows != 1_000_000 {
				t.Fatalf("the buffer holds %d rows, want 10^6", got.Rows)
			}
			t.Logf("resident %.1f B per row (fields and row record: %.1f B)", got.RSS, got.Layout)
			if got.RSS < got.Layout {
				t.Errorf("resident %.1f B per row is less than the row group alone (%.1f B): the reading is wrong", got.RSS, got.Layout)
			}
			if got.RSS > tc.maxBytesPerRow {
				t.Errorf("a full 10^6-row compact CartPole buffer (row_meta %s) holds %.1f B per row, more than %.0f", tc.rowMeta, got.RSS, tc.maxBytesPerRow)
			}
		})
	}
}
