// Package resident checks how much memory a full buffer holds per row, in
// a process of its own built without the race detector (whose shadow
// memory would be counted too).
package resident

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// TestResidentBytesPerCartPoleRow fills a compact CartPole memory buffer of
// 10^6 rows (twice over, so the ring has wrapped) with bench/compare's
// in-process program and checks the growth of its resident set, garbage
// collected and returned to the OS before both readings, against a bound
// in bytes per row, for each row metadata layout.
//
// The bounds are today's figures with room for noise, not the issue's
// target: issue 11 asks for at most 47 B per row (floor 70 B). The default
// layout ("row") holds 67.0 B (2026-11-29; 68.7-69.5 on 2026-11-26, when
// the next distances were an array of their own, 2 B a row; 143 B with
// 64-byte records, heap stamps, per-row seq lists and final observations
// at the slot): the row group's 64 B (a 32-byte memory record, seq stamp
// and next distance included, and 31 bytes of fields: one cache line),
// the dense tails (about 0.1 B a row) and the trajectories; its bound is
// the floor. Run
// records ("runs") hold 51.3 B (2026-11-29; 53.7-54.0 on 2026-11-27,
// before the next distance moved into the row's padding byte): a 48-byte
// row group (a 16-byte record) and a 64-byte run record per episode.
// Strided runs ("strided") hold 43.3 B (2026-11-29; 45.5-46.0 before): a
// 40-byte row group (an 8-byte record: run word and 32-bit pass stamp,
// the next distance in the padding); their bound is the target
// itself. Written by 64 actors a step at a time (each a stream of its
// own), so that a trajectory's rows are irregular distances apart, a
// strided buffer holds 57.2 B (2026-11-29; 59.3-59.4 on 2026-11-28,
// 96.4-96.6 before irregular runs and packed seq runs): 4 bytes a row of
// side table and 4.8 of packed seq runs (24 bytes for five rows) on top.
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
		actors         int // 0: one collector, 8 envs in lockstep
		maxBytesPerRow float64
	}{
		{"row", 0, 70},
		{"runs", 0, 57},
		{"strided", 0, 47},
		// 64 actors, one step an extend: rows at irregular distances,
		// in irregular runs and packed seq runs (96.4-96.6 B a row
		// before those, 2026-11-28; 57.1 before seq runs packed 8 such
		// rows, 52.0-52.3 after, 2026-11-29). The default layout:
		// 76.0-76.1 before, 71.0-71.2 after.
		{"strided", 64, 56},
		{"row", 64, 75},
	} {
		name := tc.rowMeta
		if tc.actors > 0 {
			name += fmt.Sprintf("/actors=%d", tc.actors)
		}
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(bin, "--workload", "cartpole", "--capacity", "1000000", "--seconds", "0", "--settle", "--row-meta", tc.rowMeta, "--actors", fmt.Sprint(tc.actors)).Output()
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
				t.Errorf("a full 10^6-row compact CartPole buffer (row_meta %s, %d actors) holds %.1f B per row, more than %.0f", tc.rowMeta, tc.actors, got.RSS, tc.maxBytesPerRow)
			}
		})
	}
}
