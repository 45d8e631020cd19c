package storage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// TestWitnessReadsOnlyItsOwn: a witness names the end its writer raised
// it to, for its own buffer (uid and dir) under the running kernel, and
// nothing else: a file of another buffer, dir or boot, a cut or scrambled
// file, or one outside a tmpfs (which would outlive a reboot) is no
// witness.
func TestWitnessReadsOnlyItsOwn(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here (a boot id and a tmpfs at " + defaultWitnessDir + ")")
	}
	dir := filepath.Join(t.TempDir(), "buffers", "b")
	t.Cleanup(func() { removeWitnessesUnder(t, filepath.Dir(dir)) })
	const uid = 0x1234
	boot := currentBoot()
	w, err := openWitness(defaultWitnessDir, dir, uid, boot, 100)
	if err != nil || w == nil {
		t.Fatalf("open a witness: %v %v", w, err)
	}
	w.raise(4242)
	path := witnessFile(defaultWitnessDir, dir, uid)
	t.Cleanup(func() { os.Remove(path) }) // the last case leaves no witness removeWitnessesUnder reads
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.close(false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		edit    func([]byte) []byte
		dir     string
		uid     uint64
		boot    string
		wantEnd int64
		want    bool
	}{
		{name: "its own", wantEnd: 4242, want: true},
		{name: "another uid", uid: uid + 1},
		{name: "another dir", dir: dir + "x"},
		{name: "another boot", boot: "not-this-boot"},
		{name: "no boot id", boot: "-"},
		{name: "cut short", edit: func(b []byte) []byte { return b[:100] }},
		{name: "magic gone", edit: func(b []byte) []byte { b[0] = 0; return b }},
		{name: "path length past the page", edit: func(b []byte) []byte { b[witnessDirOff], b[witnessDirOff+1] = 0xff, 0xff; return b }},
		{name: "negative end", edit: func(b []byte) []byte { b[witnessEndOff+7] = 0x80; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte(nil), good...)
			if tc.edit != nil {
				b = tc.edit(b)
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			d, u, bt := dir, uint64(uid), boot
			if tc.dir != "" {
				d = tc.dir
			}
			if tc.uid != 0 {
				u = tc.uid
			}
			if tc.boot == "-" {
				bt = ""
			} else if tc.boot != "" {
				bt = tc.boot
			}
			// Another dir or uid names another file: read this one there.
			if other := witnessFile(defaultWitnessDir, d, u); other != path {
				if err := os.WriteFile(other, b, 0o600); err != nil {
					t.Fatal(err)
				}
				defer os.Remove(other)
			}
			end, ok := readWitness(defaultWitnessDir, d, u, bt)
			if ok != tc.want || end != tc.wantEnd {
				t.Fatalf("read %d, %v; want %d, %v", end, ok, tc.wantEnd, tc.want)
			}
		})
	}
	// Outside a tmpfs there is no witness, made or read.
	if disk := t.TempDir(); !onTmpfs(disk) {
		if w, err := openWitness(disk, dir, uid, boot, 1); w != nil || err != nil {
			t.Fatalf("a witness on a disk: %v %v", w, err)
		}
		if err := os.WriteFile(witnessFile(disk, dir, uid), good, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, ok := readWitness(disk, dir, uid, boot); ok {
			t.Fatal("a witness file on a disk was read")
		}
	}
}

// TestOrphanWitnessesDropped: the witness of a buffer the data dir no
// longer has (its writer killed while it deleted it), and one whose
// buffer dir is gone (a data dir removed), are removed at the next open;
// a live buffer's, and another data dir's whose dir is there, stay, and a
// clean close keeps its own (a copy restored in place later must find
// it).
func TestOrphanWitnessesDropped(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here (a boot id and a tmpfs at " + defaultWitnessDir + ")")
	}
	dir, other := t.TempDir(), t.TempDir()
	s := openStore(t, dir)
	b := mustCreate(t, s, "live", testSpec(KindMemmap, 100, false))
	liveWitness := witnessFile(defaultWitnessDir, b.witnessKey(), b.uid)
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	gone, err := openWitness(defaultWitnessDir, abs(bufferDir(dir, "deleted")), 77, currentBoot(), 5)
	if err != nil || gone == nil {
		t.Fatal(err)
	}
	gone.close(false)
	if err := os.MkdirAll(bufferDir(other, "there"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"there", "gone"} {
		w, err := openWitness(defaultWitnessDir, abs(bufferDir(other, name)), 78, currentBoot(), 5)
		if err != nil || w == nil {
			t.Fatal(err)
		}
		w.close(false)
	}
	t.Cleanup(func() { removeWitnessesUnder(t, other) })
	s.dropOrphanWitnesses()
	for _, c := range []struct {
		path string
		want bool
	}{
		{liveWitness, true},
		{witnessFile(defaultWitnessDir, abs(bufferDir(dir, "deleted")), 77), false},
		{witnessFile(defaultWitnessDir, abs(bufferDir(other, "there")), 78), true},
		{witnessFile(defaultWitnessDir, abs(bufferDir(other, "gone")), 78), false},
	} {
		if _, err := os.Stat(c.path); (err == nil) != c.want {
			t.Errorf("%s: there %v, want %v", c.path, err == nil, c.want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(liveWitness); err != nil {
		t.Errorf("a clean close removed the buffer's witness: %v", err)
	}
}

// TestWitnessOnAFullTmpfs: a witness that a full tmpfs cannot hold is an
// error, not a SIGBUS at its first store (a mapped page the tmpfs cannot
// give), and leaves no file; a buffer created there still works, without
// a witness.
func TestWitnessOnAFullTmpfs(t *testing.T) {
	if currentBoot() == "" {
		t.Skip("no boot id here: no witness is ever made")
	}
	full := testbin.MountTmpfs(t, 8<<10)
	if err := os.WriteFile(filepath.Join(full, "filler"), make([]byte, 8<<10), 0o600); err != nil {
		t.Logf("filling the tmpfs: %v", err) // full is what is wanted
	}
	dir := filepath.Join(t.TempDir(), "buffers", "b")
	w, err := openWitness(full, dir, 1, currentBoot(), 10)
	if err == nil || w != nil {
		t.Fatalf("a witness on a full tmpfs: %v, %v; want an error", w, err)
	}
	if _, err := os.Stat(witnessFile(full, dir, 1)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed witness left its file: %v", err)
	}
}

// FuzzParseWitness: whatever bytes sit in the tmpfs under a witness's
// name, parsing them never panics, and what it accepts is what a writer
// could have written.
func FuzzParseWitness(f *testing.F) {
	h, _ := witnessHeader(9, "boot", "/data/buffers/b")
	page := make([]byte, witnessSize)
	copy(page, h)
	f.Add(page)
	f.Add([]byte("rbdwit01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, ok := parseWitness(b)
		if !ok {
			return
		}
		if len(b) != witnessSize || w.end < 0 || len(w.dir) > witnessSize-witnessDirOff-2 || len(w.boot) > witnessDirOff-witnessBootOff {
			t.Fatalf("accepted %+v from %d bytes", w, len(b))
		}
	})
}
