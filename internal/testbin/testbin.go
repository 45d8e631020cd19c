// Package testbin builds the rbd binary for tests that run it as a real
// process (a server whose memory, signals and exit code are checked from
// outside), and reads what such a process uses.
package testbin

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Root returns the repository root (where go.mod is), found from this
// source file.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BuildRbd builds ./cmd/rbd into dir and returns the binary's path. It is
// built without the race detector: the process under test is measured, not
// checked for races (its packages' own tests do that).
func BuildRbd(dir string) (string, error) {
	bin := filepath.Join(dir, "rbd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rbd")
	cmd.Dir = Root()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/rbd: %v\n%s", err, out)
	}
	return bin, nil
}

// ProcStatus returns a field of /proc/PID/status in bytes (e.g. "RssAnon",
// "RssFile", "VmHWM").
func ProcStatus(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", key, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
}

// MountTmpfs mounts a tmpfs of size bytes on a new directory for a
// disk-full test and unmounts it at the end, or skips the test where
// mounting is impossible (not root).
func MountTmpfs(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs for a disk-full test (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// FillDisk writes a file in dir until its filesystem has not one byte
// left, and returns the file's path (remove it to give the space back).
func FillDisk(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range []int{64 << 10, 4096, 512, 1} {
		chunk := make([]byte, n)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	return path
}
