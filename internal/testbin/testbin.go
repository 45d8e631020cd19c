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
	"sync"
	"syscall"
	"testing"
	"time"
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

// RunWithRbd is a TestMain body for tests of the real binary: it sets *bin
// to the binary named by the environment variable override (when set: to
// run the tests against another build, e.g. an older one, to see them fail
// on the regressions they catch) or to a fresh build, runs the tests and
// exits with their code (2 if the build failed).
func RunWithRbd(m *testing.M, override string, bin *string) {
	dir, err := os.MkdirTemp("", "rbd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *bin = os.Getenv(override); *bin == "" {
		*bin, err = BuildRbd(dir)
	}
	code := 2
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
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

// MetricValue returns the value of the line of a /metrics answer that
// starts with series (a name and its labels), and whether there was one.
func MetricValue(metrics []byte, series string) (string, bool) {
	for line := range strings.Lines(string(metrics)) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
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

// Server is a real `rbd serve` process on a loopback port.
type Server struct {
	Cmd    *exec.Cmd
	URL    string // http://127.0.0.1:port
	Data   string
	Stderr *SyncBuffer
	done   chan struct{}
	err    error
}

// SyncBuffer is a bytes.Buffer safe for a process's output and readers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// StartServer runs `bin serve --addr 127.0.0.1:0 --data data args...` and
// waits (up to timeout) until it listens.
func StartServer(bin, data string, timeout time.Duration, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "rbd-addr-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--addr-file", addrFile, "--data", data}, args...)...)
	s := &Server{Cmd: cmd, Data: data, Stderr: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = s.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			s.URL = "http://" + strings.TrimSpace(string(b))
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("rbd serve exited before listening: %v\n%s", s.err, s.Stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return nil, fmt.Errorf("rbd serve did not listen within %v:\n%s", timeout, s.Stderr.String())
		}
	}
}

// Memory returns the server's RssAnon and VmRSS.
func (s *Server) Memory() (anon, total int64, err error) {
	if anon, err = ProcStatus(s.Cmd.Process.Pid, "RssAnon"); err != nil {
		return 0, 0, err
	}
	total, err = ProcStatus(s.Cmd.Process.Pid, "VmRSS")
	return anon, total, err
}

// Stop sends sig and waits up to timeout for the exit; it returns the exit
// code (-1 when killed by a signal).
func (s *Server) Stop(sig syscall.Signal, timeout time.Duration) (int, error) {
	_ = s.Cmd.Process.Signal(sig)
	select {
	case <-s.done:
		return s.Cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		_ = s.Cmd.Process.Signal(syscall.SIGQUIT)
		<-s.done
		return -1, fmt.Errorf("rbd serve did not exit within %v of %v", timeout, sig)
	}
}

// Kill ends the server with SIGKILL and waits for it.
func (s *Server) Kill() {
	_ = s.Cmd.Process.Kill()
	<-s.done
}

// Exited reports whether the process has ended.
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
