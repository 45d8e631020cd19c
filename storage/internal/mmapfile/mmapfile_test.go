package mmapfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCreateOpenRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	r, err := Create(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes()[4096:], "hello")
	if err := r.SyncRange(4096, 5); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, 1<<20); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Create over an existing file: got %v, want ErrExist", err)
	}
	r, err = Open(path, 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := string(r.Bytes()[4096:4101]); got != "hello" {
		t.Fatalf("read back %q", got)
	}
}

func TestOpenWrongSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, 4096, true)
	var se *SizeError
	if !errors.As(err, &se) || se.Got != 100 || se.Want != 4096 {
		t.Fatalf("got %v, want SizeError 100 vs 4096", err)
	}
}

func TestAnonymousIsZeroed(t *testing.T) {
	r, err := Anonymous(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i, b := range r.Bytes() {
		if b != 0 {
			t.Fatalf("byte %d = %d", i, b)
		}
	}
	if err := r.Sync(); err != nil {
		t.Fatalf("Sync on anonymous memory: %v", err)
	}
	if _, err := Anonymous(0); err == nil {
		t.Fatal("Anonymous(0) succeeded")
	}
}
