package storage

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// upBuild writes the store the upgrade tests convert, as the builds before
// dense tail files wrote it: two memmap buffers in rows.meta version 1
// (one compact with priorities, both wrapped, with open trajectories on a
// stream), a compact memmap buffer in version 2 whose final observations
// are at the slot, a memory buffer and a compressed one, which Upgrade
// leaves as they are.
func upBuild(t testing.TB, dir string) {
	t.Helper()
	s := openStore(t, dir)
	s.slotTails = true
	for i, name := range []string{"a", "b", "c"} {
		spec := testSpec(KindMemmap, 48+int64(16*i), i != 1)
		spec.RowMetaLayout = RowMetaPerRow
		if i == 2 {
			spec.RowMetaLayout = RowMetaRuns
		}
		if i == 0 {
			spec.Priority = &PriorityOptions{Alpha: 0.6, Eps: 1e-6}
		}
		b := mustCreate(t, s, name, spec)
		rows := make([]row, 30)
		for k := range 4 {
			for j := range rows {
				v := k*len(rows) + j
				rows[j] = row{env: int64(v % 3), val: float32(v), terminated: v%7 == 6, truncated: v%11 == 10 && v%7 != 6, final: float32(1000 + v)}
			}
			mustExtend(t, b, "s", makeBatch(spec, rows, true))
		}
	}
	mem := mustCreate(t, s, "m", testSpec(KindMemory, 32, true))
	mustExtend(t, mem, "s", makeBatch(mem.Spec(), []row{{val: 1}, {val: 2}}, true))
	cz := mustCreate(t, s, "z", testSpec(KindCompressed, 32, true))
	mustExtend(t, cz, "s", makeBatch(cz.Spec(), []row{{val: 1}, {val: 2, terminated: true, final: 3}}, true))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// upRows reads every buffer's live rows (all columns and metadata).
func upRows(t testing.TB, dir string) map[string]map[int64]servedRow {
	t.Helper()
	s, err := Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := map[string]map[int64]servedRow{}
	for _, b := range s.Buffers() {
		out[b.Name()] = servedRows(t, b)
	}
	return out
}

// upTails returns, for each compact memmap buffer, whether its tail files
// are dense, as an open would read them (a committed upgrade's files
// where they are).
func upTails(t testing.TB, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, name := range []string{"a", "c"} {
		bdir := bufferDir(dir, name)
		path := tailFile(bdir, "observation")
		if _, err := os.Stat(tailsUpgradeMarker(bdir)); err == nil {
			if _, err := os.Stat(upgradeTailFile(bdir, tailFileName("observation"))); err == nil {
				path = upgradeTailFile(bdir, tailFileName("observation"))
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := decodeColHeader(path, data)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = h.Version == tailVersionDense
	}
	return out
}

// upLayouts returns each memmap buffer's layout as the catalog says it,
// checking that the rows.meta an open reads has that version (a switched
// buffer's rows.meta.v2, or its stage, while it is there).
func upLayouts(t testing.TB, dir string) map[string]RowMetaLayout {
	t.Helper()
	rep, err := Verify(dir, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	out := map[string]RowMetaLayout{}
	for _, br := range rep.Buffers {
		if br.Storage != KindMemmap {
			continue
		}
		out[br.Name] = br.RowMeta
		path := metaFile(bufferDir(dir, br.Name))
		if _, err := os.Stat(upgradeMetaFile(bufferDir(dir, br.Name))); err == nil && br.RowMeta == RowMetaRuns {
			path = upgradeMetaFile(bufferDir(dir, br.Name)) // switched, not yet renamed
		}
		if _, err := os.Stat(upgradeStage(dir, br.Name)); err == nil && br.RowMeta == RowMetaBlocks {
			path = metaFile(upgradeStage(dir, br.Name))
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := decodeMetaHeader("rows.meta", data)
		if err != nil {
			t.Fatal(err)
		}
		want := map[RowMetaLayout]uint32{RowMetaPerRow: FormatVersion, RowMetaRuns: metaVersionRuns, RowMetaBlocks: metaVersionBlocks}[br.RowMeta]
		if h.Version != want {
			t.Fatalf("buffer %q: the catalog says row_meta %q, the rows.meta an open reads (%s) is version %d", br.Name, br.RowMeta, path, h.Version)
		}
	}
	return out
}

// TestUpgrade converts a store and checks that every buffer reads the
// same, that the memmap buffers are version 2 and the others untouched,
// that streams continue, and that a second Upgrade finds nothing to do.
func TestUpgrade(t *testing.T) {
	dir := t.TempDir()
	upBuild(t, dir)
	want := upRows(t, dir)
	var said []string
	rep, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaRuns, Progress: func(m string) { said = append(said, m) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Buffers) != 3 || rep.Buffers[0].Name != "a" || rep.Buffers[1].Name != "b" || rep.Buffers[2].Name != "c" || len(said) < 3 {
		t.Fatalf("report %+v, progress %q", rep, said)
	}
	for _, ub := range rep.Buffers {
		tails := ub.Name != "b" // compact
		meta := ub.Name != "c"  // rows.meta version 1
		if ub.Rows != int64(len(want[ub.Name])) || (ub.RunRecords > 0) != meta || ub.MetaBytesAfter == 0 ||
			(ub.Tails > 0) != tails || (tails && (ub.TailBytesBefore == 0 || ub.TailBytesAfter == 0)) {
			t.Errorf("buffer %q: %+v (%d live rows)", ub.Name, ub, len(want[ub.Name]))
		}
	}
	if got := upLayouts(t, dir); got["a"] != RowMetaRuns || got["b"] != RowMetaRuns || got["c"] != RowMetaRuns {
		t.Fatalf("layouts after the upgrade: %v", got)
	}
	if got := upTails(t, dir); !got["a"] || !got["c"] {
		t.Fatalf("dense tail files after the upgrade: %v", got)
	}
	if vr, err := Verify(dir, nil); err != nil {
		t.Fatal(err)
	} else {
		for _, br := range vr.Buffers {
			if want := map[string]string{"a": "dense", "c": "dense", "z": "chunks", "m": "dense"}[br.Name]; br.TailLayout != want {
				t.Errorf("verify: buffer %q tail_layout %q after the upgrade, want %q", br.Name, br.TailLayout, want)
			}
		}
	}
	s := openStore(t, dir)
	for _, b := range s.Buffers() {
		if got := checkServed(t, b, want[b.Name()]); len(got) != len(want[b.Name()]) {
			t.Errorf("buffer %q serves %d rows, %d before the upgrade", b.Name(), len(got), len(want[b.Name()]))
		}
	}
	// The stream's open trajectory continues after the upgrade.
	a, _ := s.Buffer("a")
	last := want["a"][a.WriteCount()-1].meta
	if last.Done {
		t.Fatal("fixture: the last row of a is done")
	}
	res := mustExtend(t, a, "s", makeBatch(a.Spec(), []row{{env: last.Env, val: 7}}, true))
	if m := metas(t, a, res.FirstSeq)[0]; m.TrajID != last.TrajID || m.PrevSeq != last.Seq || m.Step != last.Step+1 {
		t.Errorf("after the upgrade stream s env %d wrote %+v, want trajectory %d continued after seq %d", last.Env, m, last.TrajID, last.Seq)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaRuns}); !errors.Is(err, ErrNothingToUpgrade) {
		t.Fatalf("a second upgrade: %v, want ErrNothingToUpgrade", err)
	}
}

// TestUpgradeRefuses: a dir a running store holds, a damaged one, one of a
// newer format and one with nothing to upgrade are refused with an error
// that says so, and left exactly as they were.
func TestUpgradeRefuses(t *testing.T) {
	base := t.TempDir()
	upBuild(t, base)
	files := readTree(t, base)
	for _, to := range []RowMetaLayout{RowMetaRuns, RowMetaBlocks} {
		cases := []struct {
			name    string
			prepare func(t *testing.T, dir string) func() // returns what ends it, or nil
			want    error
			says    string
		}{
			{"locked by a running store", func(t *testing.T, dir string) func() {
				s := openStore(t, dir)
				return func() { s.Close() }
			}, ErrLocked, "running store"},
			{"damaged", func(t *testing.T, dir string) func() {
				path := colFile(bufferDir(dir, "b"), "action")
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				b[headerSize+8*5] ^= 0x01
				if err := os.WriteFile(path, b, 0o644); err != nil {
					t.Fatal(err)
				}
				return nil
			}, nil, "verify found problems"},
			{"newer format", func(t *testing.T, dir string) func() {
				db, err := bolt.Open(filepath.Join(dir, "catalog.db"), 0o644, nil)
				if err != nil {
					t.Fatal(err)
				}
				err = db.Update(func(tx *bolt.Tx) error {
					return tx.Bucket(bucketRBD).Put(keyFormat, []byte{byte(FormatVersion + 1), 0, 0, 0})
				})
				if err := errors.Join(err, db.Close()); err != nil {
					t.Fatal(err)
				}
				return nil
			}, ErrVersionMismatch, "version"},
			{"already upgraded", func(t *testing.T, dir string) func() {
				if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: to}); err != nil {
					t.Fatal(err)
				}
				return nil
			}, ErrNothingToUpgrade, map[RowMetaLayout]string{RowMetaRuns: "version 2 or 3 already", RowMetaBlocks: "version 3 already"}[to]},
			{"incomplete checkpoint", func(t *testing.T, dir string) func() {
				if err := os.WriteFile(filepath.Join(dir, checkpointIncomplete), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				return nil
			}, ErrIncompleteCheckpoint, "incomplete checkpoint"},
		}
		for _, tc := range cases {
			t.Run(string(to)+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				writeTree(t, dir, files)
				done := tc.prepare(t, dir)
				before := readTree(t, dir)
				var beforeCat map[string]string
				if done == nil { // a running store holds the catalog
					beforeCat = catalogContents(t, filepath.Join(dir, "catalog.db"))
				}
				_, err := Upgrade(dir, &UpgradeOptions{RowMeta: to, Store: &Options{LockTimeout: 50e6}})
				if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("upgrade: %v; want an error matching %v that says %q", err, tc.want, tc.says)
				}
				if done != nil {
					done()
					return // the store changed the files itself
				}
				after := readTree(t, dir)
				for _, rel := range slices.Sorted(maps.Keys(before)) {
					if strings.HasPrefix(rel, "buffers/") && string(after[rel]) != string(before[rel]) {
						t.Errorf("%s changed", rel)
					}
				}
				for rel := range after {
					if _, ok := before[rel]; !ok {
						t.Errorf("%s was created", rel)
					}
				}
				if got := catalogContents(t, filepath.Join(dir, "catalog.db")); beforeCat != nil && !maps.Equal(got, beforeCat) {
					t.Errorf("the catalog changed:\n%s", diffMaps(beforeCat, got))
				}
			})
		}
	}
}

// killUpgradeChild runs Upgrade to layout to on dir in a child process
// (TestUpgradeCrash's) that kills itself at the after-th pass of crash
// point, and fails the test if the child was not killed there.
func killUpgradeChild(t *testing.T, dir string, to RowMetaLayout, point string, after int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestUpgradeCrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RBD_TEST_UPGRADE_CHILD="+dir, "RBD_TEST_UPGRADE_TO="+string(to),
		"RBD_CRASH_AT="+point, fmt.Sprintf("RBD_CRASH_AFTER=%d", after))
	out, err := cmd.CombinedOutput()
	if err == nil || strings.Contains(string(out), "rbd-child upgrade") {
		t.Fatalf("the child was not killed at %s (pass %d): %v\n%s", point, after, err, out)
	}
}

// TestUpgradeCrash kills a process upgrading the store at each step
// (RBD_CRASH_AT: after the version 2 files are written, after a buffer's
// spec is switched, after its rows.meta is replaced) and checks that each
// buffer opens in version 1 or 2, never a mix, with every row as it was;
// that an open cleans up or finishes what the upgrade left; and that
// Upgrade then completes.
func TestUpgradeCrash(t *testing.T) {
	if dir := os.Getenv("RBD_TEST_UPGRADE_CHILD"); dir != "" {
		_, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaLayout(os.Getenv("RBD_TEST_UPGRADE_TO"))})
		fmt.Printf("rbd-child upgrade: %v\n", err)
		return
	}
	base := t.TempDir()
	upBuild(t, base)
	files := readTree(t, base)
	want := upRows(t, base)
	v1, v2 := RowMetaPerRow, RowMetaRuns
	for _, tc := range []struct {
		point   string
		after   int
		layouts map[string]RowMetaLayout // before the next open
		dense   map[string]bool          // tail files, before the next open
	}{
		{"upgrade-files", 1, map[string]RowMetaLayout{"a": v1, "b": v1, "c": v2}, map[string]bool{"a": false, "c": false}},
		{"upgrade-commit", 1, map[string]RowMetaLayout{"a": v2, "b": v1, "c": v2}, map[string]bool{"a": false, "c": false}},
		{"upgrade-rename", 1, map[string]RowMetaLayout{"a": v2, "b": v1, "c": v2}, map[string]bool{"a": false, "c": false}},
		{"upgrade-tails-commit", 1, map[string]RowMetaLayout{"a": v2, "b": v1, "c": v2}, map[string]bool{"a": true, "c": false}},
		{"upgrade-tails-rename", 1, map[string]RowMetaLayout{"a": v2, "b": v1, "c": v2}, map[string]bool{"a": true, "c": false}},
		{"upgrade-commit", 2, map[string]RowMetaLayout{"a": v2, "b": v2, "c": v2}, map[string]bool{"a": true, "c": false}},
		{"upgrade-tails-commit", 2, map[string]RowMetaLayout{"a": v2, "b": v2, "c": v2}, map[string]bool{"a": true, "c": true}},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.point, tc.after), func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, files)
			killUpgradeChild(t, dir, RowMetaRuns, tc.point, tc.after)
			// Read-only first: nothing is cleaned up or finished yet.
			if got := upLayouts(t, dir); !maps.Equal(got, tc.layouts) {
				t.Fatalf("layouts after a kill at %s: %v, want %v", tc.point, got, tc.layouts)
			}
			if got := upTails(t, dir); !maps.Equal(got, tc.dense) {
				t.Fatalf("dense tail files after a kill at %s: %v, want %v", tc.point, got, tc.dense)
			}
			if got := upRows(t, dir); !maps.EqualFunc(got, want, func(g, w map[int64]servedRow) bool { return len(g) == len(w) }) {
				t.Fatalf("row counts changed")
			}
			s := openStore(t, dir)
			for _, b := range s.Buffers() {
				if got := checkServed(t, b, want[b.Name()]); len(got) != len(want[b.Name()]) {
					t.Errorf("buffer %q serves %d rows after a kill at %s, %d before", b.Name(), len(got), tc.point, len(want[b.Name()]))
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			for name, layout := range tc.layouts {
				bdir := bufferDir(dir, name)
				_, pending := os.Stat(upgradeMetaFile(bdir))
				nos, _ := runSegmentNumbers(bdir)
				if pending == nil || (layout == RowMetaPerRow && len(nos) > 0) {
					t.Errorf("buffer %q (%s) after an open: rows.meta.v2 left (%v), run segments %v", name, layout, pending == nil, nos)
				}
				left, _ := filepath.Glob(filepath.Join(bdir, "tail.*.col.v2"))
				if _, err := os.Stat(tailsUpgradeMarker(bdir)); err == nil || len(left) > 0 {
					t.Errorf("buffer %q after an open: the tails' upgrade marker (%v) or dense files %q left", name, err == nil, left)
				}
			}
			if got := upTails(t, dir); !maps.Equal(got, tc.dense) {
				t.Fatalf("dense tail files after an open following a kill at %s: %v, want %v", tc.point, got, tc.dense)
			}
			done := tc.layouts["b"] == RowMetaRuns && tc.dense["c"]
			if _, err := Upgrade(dir, &UpgradeOptions{RowMeta: RowMetaRuns}); err != nil && !(done && errors.Is(err, ErrNothingToUpgrade)) {
				t.Fatalf("upgrade after the kill: %v", err)
			}
			if got := upLayouts(t, dir); got["a"] != RowMetaRuns || got["b"] != RowMetaRuns || got["c"] != RowMetaRuns {
				t.Fatalf("layouts after the upgrade: %v", got)
			}
			if got := upTails(t, dir); !got["a"] || !got["c"] {
				t.Fatalf("dense tail files after the upgrade: %v", got)
			}
			s = openStore(t, dir)
			defer s.Close()
			for _, b := range s.Buffers() {
				if got := checkServed(t, b, want[b.Name()]); len(got) != len(want[b.Name()]) {
					t.Errorf("buffer %q serves %d rows after the upgrade, %d before", b.Name(), len(got), len(want[b.Name()]))
				}
			}
		})
	}
}
