package storage

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// upEditStates rewrites the catalog state of each named buffer of the
// stopped store in dir.
func upEditStates(t testing.TB, dir string, edit func(name string, st *bufferState)) {
	t.Helper()
	cat, err := openCatalog(filepath.Join(dir, "catalog.db"), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cat.close()
	entries, err := cat.entries()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		st := e.state
		edit(e.name, &st)
		if err := cat.putState(e.name, st, nil, false); err != nil {
			t.Fatal(err)
		}
	}
}

// upLeftovers lists what an upgrade to version 3 may leave behind: stages
// and old dirs in the trash.
func upLeftovers(t testing.TB, dir string) []string {
	t.Helper()
	stages, _ := filepath.Glob(filepath.Join(dir, "buffers", upgradeStagePrefix+"*"))
	old, _ := filepath.Glob(filepath.Join(dir, trashDir, "*.before-v3"))
	return append(stages, old...)
}

// upServedAll checks that every buffer of the store serves exactly want.
func upServedAll(t testing.TB, s *Store, want map[string]map[int64]servedRow, when string) {
	t.Helper()
	for _, b := range s.Buffers() {
		if got := checkServed(t, b, want[b.Name()]); len(got) != len(want[b.Name()]) {
			t.Errorf("buffer %q serves %d rows %s, %d before", b.Name(), len(got), when, len(want[b.Name()]))
		}
	}
}

// TestUpgradeBlocks converts upBuild's store (memmap buffers in version 1
// and in version 2 with final observations at the slot) to version 3: a
// store closed cleanly, one whose buffers were not (the state a crash
// leaves), and one with holes in its windows. Every buffer then serves
// the same rows, fields, metadata, final observations and priorities,
// verify finds nothing, writers go on (a clean store's streams continue),
// and a second upgrade finds nothing to do.
func TestUpgradeBlocks(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(name string, st *bufferState)
	}{
		{"clean", nil},
		// After a power loss (another boot): the reopen resumes at the
		// reservation, so the windows end in holes.
		{"unclean", func(_ string, st *bufferState) { st.Clean = false }},
		// Reopened after that crash and written to: holes inside the
		// windows, rows after them, the store closed cleanly; and a hole
		// range of the catalog over rows that are there (recovery keeps
		// them: version 3 must not take them for holes).
		{"holes", func(name string, st *bufferState) { st.Clean = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			upBuild(t, dir)
			if tc.edit != nil {
				upEditStates(t, dir, tc.edit)
				powerLossReboot(t, dir) // no witness (a clean close removed them anyway)
			}
			if tc.name == "holes" {
				s := openStore(t, dir)
				for _, name := range []string{"a", "b", "c"} {
					b := mustBuffer(t, s, name)
					rows := make([]row, 12)
					for j := range rows {
						rows[j] = row{env: int64(j % 2), val: float32(900 + j), terminated: j == 5}
					}
					mustExtend(t, b, "h", makeBatch(b.Spec(), rows, true))
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				upEditStates(t, dir, func(name string, st *bufferState) {
					if name == "b" {
						st.Holes = append(st.Holes, [2]int64{st.WriteCount - 4, st.WriteCount - 2})
					}
				})
			}
			want := upRows(t, dir)
			before, err := Verify(dir, nil)
			if err != nil || !before.OK() {
				t.Fatalf("verify before: %v %+v", err, before)
			}
			if tc.name != "clean" && before.Buffers[0].Holes+before.Buffers[1].Holes+before.Buffers[2].Holes == 0 {
				t.Fatalf("no holes in the windows after the power loss: %+v", before.Buffers)
			}
			var said []string
			rep, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaBlocks, Progress: func(m string) { said = append(said, m) }})
			if err != nil {
				t.Fatal(err)
			}
			if names := []string{rep.Buffers[0].Name, rep.Buffers[1].Name, rep.Buffers[2].Name}; len(rep.Buffers) != 3 || !slices.Equal(names, []string{"a", "b", "c"}) || len(said) < 3 {
				t.Fatalf("report %+v, progress %q", rep, said)
			}
			for _, ub := range rep.Buffers {
				compact := ub.Name != "b"
				if ub.FormatVersion != 3 || ub.Rows != int64(len(want[ub.Name])) || ub.RunRecords == 0 || (ub.Tails > 0) != compact ||
					ub.BytesBefore == 0 || ub.BytesAfter == 0 || ub.MetaBytesAfter == 0 {
					t.Errorf("buffer %q: %+v (%d live rows)", ub.Name, ub, len(want[ub.Name]))
				}
			}
			if got := upLayouts(t, dir); got["a"] != RowMetaBlocks || got["b"] != RowMetaBlocks || got["c"] != RowMetaBlocks {
				t.Fatalf("layouts after the upgrade: %v", got)
			}
			if left := upLeftovers(t, dir); len(left) > 0 {
				t.Fatalf("left behind: %q", left)
			}
			// The last store's snapshot described the old layouts: a
			// read-only open next to a store starting must not use it.
			if _, err := os.Stat(filepath.Join(dir, snapshotFile)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the old catalog snapshot is still there: %v", err)
			}
			after, err := Verify(dir, nil)
			if err != nil || !after.OK() {
				t.Fatalf("verify after: %v %+v", err, after)
			}
			for i, br := range after.Buffers {
				holes := before.Buffers[i].Holes
				if tc.name == "holes" && br.Name == "b" {
					holes -= 2 // the catalog's range over live rows
				}
				if bb := before.Buffers[i]; br.LiveRows != bb.LiveRows || br.WriteCount != bb.WriteCount || br.Holes != holes {
					t.Errorf("buffer %q: verify says %d live rows, write count %d, %d holes; before the upgrade %d, %d, %d",
						br.Name, br.LiveRows, br.WriteCount, br.Holes, bb.LiveRows, bb.WriteCount, bb.Holes)
				}
			}

			s := openStore(t, dir)
			upServedAll(t, s, want, "after the upgrade")
			a := mustBuffer(t, s, "a")
			if a.WriteCount() != before.Buffers[0].WriteCount {
				t.Errorf("a writable open moved the write count from %d to %d", before.Buffers[0].WriteCount, a.WriteCount())
			}
			// The stream that wrote the last row continues its open
			// trajectory, unless the store was not closed cleanly.
			stream := map[string]string{"holes": "h"}[tc.name]
			if stream == "" {
				stream = "s"
			}
			var last RowMeta // the last live row (an unclean open skipped seqs past it)
			for seq, r := range want["a"] {
				if seq > last.Seq {
					last = r.meta
				}
			}
			res := mustExtend(t, a, stream, makeBatch(a.Spec(), []row{{env: last.Env, val: 7}}, true))
			m := metas(t, a, res.FirstSeq)[0]
			if continued := m.TrajID == last.TrajID && m.PrevSeq == last.Seq && m.Step == last.Step+1; last.Done || continued != (tc.name != "unclean") {
				t.Errorf("after the upgrade stream %s env %d wrote %+v after %+v: continued %v", stream, last.Env, m, last, continued)
			}
			// Writers go on through the ring's end and a reopen.
			for _, b := range s.Buffers() {
				if b.Spec().Storage != KindMemmap {
					continue
				}
				rows := make([]row, 90)
				for j := range rows {
					rows[j] = row{env: int64(j % 3), val: float32(5000 + j), terminated: j%9 == 8, final: float32(-j)}
				}
				mustExtend(t, b, "t", makeBatch(b.Spec(), rows, true))
			}
			live := map[string]map[int64]servedRow{}
			for _, b := range s.Buffers() {
				live[b.Name()] = servedRows(t, b)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir)
			upServedAll(t, s, live, "after writes and a reopen")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
				t.Fatalf("verify after writes: %v %+v", err, rep)
			}
			if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaBlocks}); !errors.Is(err, ErrNothingToUpgrade) {
				t.Fatalf("a second upgrade: %v, want ErrNothingToUpgrade", err)
			}
		})
	}
}

// TestUpgradeBlocksCrash kills a process upgrading upBuild's store to
// version 3 at each step (RBD_CRASH_AT: after the stages are written,
// after a buffer's catalog switch, after its old dir went to the trash,
// after the stage took its place) and checks that each buffer reads in
// its old version or version 3, never a mix, with every row as it was,
// read-only (a switched buffer from its stage) and writable; that a
// writable open removes or finishes what the upgrade left; and that
// Upgrade then completes.
func TestUpgradeBlocksCrash(t *testing.T) {
	base := t.TempDir()
	upBuild(t, base)
	files := readTree(t, base)
	want := upRows(t, base)
	v1, v2, v3 := RowMetaPerRow, RowMetaRuns, RowMetaBlocks
	for _, tc := range []struct {
		point   string
		after   int
		layouts map[string]RowMetaLayout // before the next open
	}{
		{"upgrade-v3-files", 1, map[string]RowMetaLayout{"a": v1, "b": v1, "c": v2}},
		{"upgrade-v3-commit", 1, map[string]RowMetaLayout{"a": v3, "b": v1, "c": v2}},
		{"upgrade-v3-old-gone", 1, map[string]RowMetaLayout{"a": v3, "b": v1, "c": v2}},
		{"upgrade-v3-rename", 1, map[string]RowMetaLayout{"a": v3, "b": v1, "c": v2}},
		{"upgrade-v3-old-gone", 2, map[string]RowMetaLayout{"a": v3, "b": v3, "c": v2}},
		{"upgrade-v3-commit", 3, map[string]RowMetaLayout{"a": v3, "b": v3, "c": v3}},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.point, tc.after), func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, files)
			killUpgradeChild(t, dir, RowMetaBlocks, tc.point, tc.after)
			// Read-only first: nothing is cleaned up or finished yet.
			if got := upLayouts(t, dir); !maps.Equal(got, tc.layouts) {
				t.Fatalf("layouts after a kill at %s: %v, want %v", tc.point, got, tc.layouts)
			}
			ro, err := Open(dir, &Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			upServedAll(t, ro, want, "read-only after a kill at "+tc.point)
			if err := ro.Close(); err != nil {
				t.Fatal(err)
			}
			s := openStore(t, dir)
			upServedAll(t, s, want, "after a kill at "+tc.point)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if left := upLeftovers(t, dir); len(left) > 0 {
				t.Errorf("after a writable open following a kill at %s: left %q", tc.point, left)
			}
			if got := upLayouts(t, dir); !maps.Equal(got, tc.layouts) {
				t.Fatalf("layouts after an open following a kill at %s: %v, want %v", tc.point, got, tc.layouts)
			}
			done := !slices.ContainsFunc(slices.Collect(maps.Values(tc.layouts)), func(l RowMetaLayout) bool { return l != v3 })
			if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaBlocks}); err != nil && !(done && errors.Is(err, ErrNothingToUpgrade)) {
				t.Fatalf("upgrade after the kill: %v", err)
			}
			if got := upLayouts(t, dir); got["a"] != v3 || got["b"] != v3 || got["c"] != v3 {
				t.Fatalf("layouts after the upgrade: %v", got)
			}
			s = openStore(t, dir)
			defer s.Close()
			upServedAll(t, s, want, "after the upgrade")
		})
	}
}

// TestUpgradeBlocksAgainAfterKill: a second upgrade run after a kill that
// left stages (before and after a switch) finishes or removes them itself,
// under the store's lock, without a writable store open.
func TestUpgradeBlocksAgainAfterKill(t *testing.T) {
	base := t.TempDir()
	upBuild(t, base)
	files := readTree(t, base)
	want := upRows(t, base)
	for _, point := range []string{"upgrade-v3-files", "upgrade-v3-old-gone"} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, files)
			killUpgradeChild(t, dir, RowMetaBlocks, point, 1)
			if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaBlocks}); err != nil {
				t.Fatal(err)
			}
			if left := upLeftovers(t, dir); len(left) > 0 {
				t.Errorf("left %q", left)
			}
			s := openStore(t, dir)
			defer s.Close()
			upServedAll(t, s, want, "after the second upgrade")
		})
	}
}

// TestUpgradeBlocksDiskFull: an upgrade that cannot write a stage on a
// full disk fails saying so, removes every stage it wrote (the first
// buffer's fits, the second's does not) and leaves the buffers as they
// were; with the space back it goes through.
func TestUpgradeBlocksDiskFull(t *testing.T) {
	dir := testbin.MountTmpfs(t, 16<<20)
	s := openStore(t, dir)
	for _, bc := range []struct {
		name     string
		capacity int64
	}{{"d1", 2_000}, {"d2", 60_000}} {
		spec := testSpec(KindMemmap, bc.capacity, true)
		spec.RowMetaLayout = RowMetaRuns
		b := mustCreate(t, s, bc.name, spec)
		rows := make([]row, 500)
		for k := range int(bc.capacity)/500 + 2 {
			for j := range rows {
				v := k*len(rows) + j
				rows[j] = row{env: int64(v % 8), val: float32(v), terminated: v%50 == 49, final: float32(-v)}
			}
			mustExtend(t, b, "s", makeBatch(spec, rows, true))
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := upRows(t, dir)
	before := readTree(t, filepath.Join(dir, "buffers"))
	filler := testbin.FillDisk(t, dir)
	st, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	// Room for d1's stage (about 150 KB), not for d2's (about 2.3 MB).
	if err := os.Truncate(filler, st.Size()-600<<10); err != nil {
		t.Fatal(err)
	}
	_, err = Upgrade(dir, nil)
	if err == nil || !strings.Contains(err.Error(), "no space") || !strings.Contains(err.Error(), `"d2"`) || !strings.Contains(err.Error(), "unchanged") {
		t.Fatalf("upgrade on a full disk: %v; want an error that says no space for d2 and that the buffers are unchanged", err)
	}
	if left := upLeftovers(t, dir); len(left) > 0 {
		t.Fatalf("the failed upgrade left %q", left)
	}
	if after := readTree(t, filepath.Join(dir, "buffers")); !maps.EqualFunc(after, before, func(x, y []byte) bool { return string(x) == string(y) }) {
		t.Fatalf("the buffers' files changed: %d files before, %d after", len(before), len(after))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := Upgrade(dir, nil); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	upServedAll(t, s, want, "after the upgrade")
}

// TestUpgradeBlocksStageWithoutMarker: a switched buffer whose stage lacks
// the done marker (what a removal cut short leaves, marker first) is
// never put in place: the open fails naming the marker, and the old dir
// and the stage stay where they are for whoever repairs it. A stage
// missing files but holding the marker was once switched in and served
// an empty buffer, its old dir then emptied from the trash.
func TestUpgradeBlocksStageWithoutMarker(t *testing.T) {
	dir := t.TempDir()
	upBuild(t, dir)
	killUpgradeChild(t, dir, RowMetaBlocks, "upgrade-v3-commit", 1)
	stage := upgradeStage(dir, "a")
	if err := os.Remove(filepath.Join(stage, upgradeStageDone)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, nil); err == nil || !strings.Contains(err.Error(), upgradeStageDone) {
		t.Fatalf("open with a switched buffer's stage without its marker: %v; want an error naming %s", err, upgradeStageDone)
	}
	for _, d := range []string{stage, bufferDir(dir, "a")} {
		if _, err := os.Stat(metaFile(d)); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// TestUpgradeDefaultPerBuffer: left to its default, Upgrade takes each
// memmap buffer to what a new buffer of its spec gets: version 3 for a
// flush ring of 2,048 rows, version 2 for an fsync one and for rings under
// 1,024 rows (from version 1, and its final observations to dense files);
// run again it finds nothing; asked for version 3, it converts the rest.
func TestUpgradeDefaultPerBuffer(t *testing.T) {
	dir := t.TempDir()
	upBuild(t, dir)
	s := openStore(t, dir)
	for _, bc := range []struct {
		name   string
		dur    Durability
		layout RowMetaLayout
	}{{"L", DurabilityFlush, RowMetaRuns}, {"F", DurabilityFsync, RowMetaPerRow}} {
		spec := testSpec(KindMemmap, 2048, true)
		spec.Durability, spec.RowMetaLayout = bc.dur, bc.layout
		b := mustCreate(t, s, bc.name, spec)
		rows := make([]row, 700)
		for j := range rows {
			rows[j] = row{env: int64(j % 4), val: float32(j), terminated: j%30 == 29, final: float32(-j)}
		}
		mustExtend(t, b, "s", makeBatch(spec, rows, true))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := upRows(t, dir)
	rep, err := Upgrade(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]int{}
	for _, ub := range rep.Buffers {
		versions[ub.Name] = ub.FormatVersion
	}
	if !maps.Equal(versions, map[string]int{"F": 2, "L": 3, "a": 2, "b": 2, "c": 2}) {
		t.Fatalf("format versions upgraded to: %v", versions)
	}
	wantLayouts := map[string]RowMetaLayout{"F": RowMetaRuns, "L": RowMetaBlocks, "a": RowMetaRuns, "b": RowMetaRuns, "c": RowMetaRuns}
	if got := upLayouts(t, dir); !maps.Equal(got, wantLayouts) {
		t.Fatalf("layouts after the default upgrade: %v, want %v", got, wantLayouts)
	}
	if _, err := Upgrade(dir, nil); !errors.Is(err, ErrNothingToUpgrade) {
		t.Fatalf("a second default upgrade: %v, want ErrNothingToUpgrade", err)
	}
	if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaBlocks}); err != nil {
		t.Fatal(err)
	}
	for name, l := range upLayouts(t, dir) {
		if l != RowMetaBlocks {
			t.Errorf("buffer %q is %q after an upgrade asked for version 3", name, l)
		}
	}
	s = openStore(t, dir)
	defer s.Close()
	upServedAll(t, s, want, "after the upgrades")
}
