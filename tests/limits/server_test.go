package limits

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rbdb/rbd/internal/testbin"
)

var rbdBin string

func TestMain(m *testing.M) { testbin.RunWithRbd(m, "RBD_LIMITS_BIN", &rbdBin) }

// server is a real `rbd serve` process.
type server struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string
	stderr *syncBuffer
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitLog waits up to 20s for the server's log to contain substr. A log
// line travels through the child's stderr pipe, which os/exec copies on
// its own goroutine: it may arrive after the answer or metric that the
// same request produced, so a test must wait for it, not look once.
func (s *server) waitLog(substr string) bool {
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(s.stderr.String(), substr); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// startServer runs rbd serve on a free loopback port with a fresh data dir
// (or dataDir, if given) and waits until it listens.
func startServer(t *testing.T, dataDir string, args ...string) *server {
	t.Helper()
	dir := t.TempDir()
	if dataDir == "" {
		dataDir = filepath.Join(dir, "data")
	}
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.Command(rbdBin, append([]string{"serve", "--addr", "127.0.0.1:0", "--addr-file", addrFile, "--data", dataDir}, args...)...)
	s := &server{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			t.Logf("server log:\n%s", tail(s.stderr.String(), 4000))
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if data, err := os.ReadFile(addrFile); err == nil && len(data) > 0 {
			s.url = "http://" + strings.TrimSpace(string(data))
			break
		}
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("rbd serve exited before listening: %v\n%s", err, s.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("rbd serve did not listen within 30s:\n%s", s.stderr.String())
		}
	}
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// rss returns the server's anonymous resident memory.
func (s *server) rss() int64 {
	v, err := testbin.ProcStatus(s.cmd.Process.Pid, "RssAnon")
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

// peakRSS samples the server's RssAnon every 10ms until stop is called,
// which returns the largest value seen.
func (s *server) peakRSS() (stop func() int64) {
	var peak int64
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if v, err := testbin.ProcStatus(s.cmd.Process.Pid, "RssAnon"); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(quit)
		<-finished
		return peak
	}
}

// do sends a request and returns the status and body.
func (s *server) do(method, path, ctype string, body []byte) (int, []byte) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: read answer: %v", method, path, err)
	}
	return resp.StatusCode, data
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

// healthy checks that the server still answers.
func (s *server) healthy() {
	s.t.Helper()
	if st, body := s.do("GET", "/v1/health", "", nil); st != 200 {
		s.t.Fatalf("health: %d %s", st, body)
	}
}

// signal sends sig and waits for the exit, returning the exit code.
func (s *server) stop(sig syscall.Signal, within time.Duration) int {
	s.t.Helper()
	s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(within):
		s.cmd.Process.Signal(syscall.SIGQUIT)
		s.t.Fatalf("rbd serve did not exit within %v of %v", within, sig)
	}
	return s.cmd.ProcessState.ExitCode()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// raw opens a connection and sends a request head declaring contentLength
// bytes of body, followed by body (which may be shorter: the rest is
// never sent unless the caller writes it).
func (s *server) raw(method, path string, contentLength int, body []byte) net.Conn {
	s.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		s.t.Fatal(err)
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: rbd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, path, contentLength)
	c.Write(body)
	return c
}
