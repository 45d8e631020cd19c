package limits

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbdb/rbd/internal/testbin"
)

// TestServeDiskFull runs rbd serve on a 24 MiB tmpfs. A create that does
// not fit is a 507 leaving nothing behind; on a full disk a compressed
// buffer's extends are 507 while a memmap buffer (its files reserved at
// create) keeps taking rows and the server stays up; freed space lets the
// compressed buffer take rows again without a restart; after a restart
// every acknowledged row is there and rbd verify is clean. This server
// once died with SIGBUS when the disk filled, and could not open the dir
// again.
func TestServeDiskFull(t *testing.T) {
	data := filepath.Join(testbin.MountTmpfs(t, 24<<20), "data")
	s := startServer(t, data, "--checkpoint-interval", "100ms")
	st, body := s.do("PUT", "/v1/buffers/big", "application/json", spec(2_000_000, "memmap", ""))
	if msg, code := errorCode(t, body); st != 507 || code != "insufficient_storage" || !strings.Contains(msg, "bytes of disk space") {
		t.Fatalf("create too big: %d %s %s", st, code, msg)
	}
	if _, err := os.Stat(filepath.Join(data, "buffers", "big")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused create left files: %v", err)
	}
	if st, body := s.do("PUT", "/v1/buffers/m", "application/json", spec(20000, "memmap", `, "durability": "fsync"`)); st != 201 {
		t.Fatalf("create m: %d %s", st, body)
	}
	cspec := `{"capacity": 4000, "storage": "compressed", "compression": {"codec": "none", "chunk_len": 4},
		"fields": {"observation": {"dtype": "uint8", "shape": [1024]}, "next.done": {"dtype": "bool", "shape": []}}}`
	if st, body := s.do("PUT", "/v1/buffers/c", "application/json", []byte(cspec)); st != 201 {
		t.Fatalf("create c: %d %s", st, body)
	}
	filler := testbin.FillDisk(t, filepath.Dir(data))
	ackM, ackC := 0, 0
	for i := range 20 {
		if st, body := s.do("POST", "/v1/buffers/m/extend?stream=a", "application/json", rows(50)); st == 200 {
			ackM += 50
		} else if msg, code := errorCode(t, body); st != 507 || code != "insufficient_storage" {
			t.Fatalf("memmap extend %d on a full disk: %d %s %s", i, st, code, msg)
		}
	}
	refused := 0
	obs := strings.Repeat("7,", 1023) + "7"
	cbody := []byte(fmt.Sprintf(`{"observation": [%s], "next.done": [%s]}`,
		strings.TrimSuffix(strings.Repeat("["+obs+"],", 8), ","), "false,false,false,false,false,false,false,true"))
	for range 40 {
		st, body := s.do("POST", "/v1/buffers/c/extend?stream=x", "application/json", cbody)
		if st == 200 {
			ackC += 8
			continue
		}
		msg, code := errorCode(t, body)
		if st != 507 || code != "insufficient_storage" {
			t.Fatalf("compressed extend on a full disk: %d %s %s", st, code, msg)
		}
		refused++
	}
	s.healthy()
	if refused == 0 {
		t.Fatal("the compressed buffer never ran out of space")
	}
	// Space returns: the compressed buffer takes rows again, no restart.
	os.Remove(filler)
	if st, body := s.do("POST", "/v1/buffers/c/extend?stream=x", "application/json", cbody); st != 200 {
		t.Fatalf("compressed extend after space returned: %d %s", st, body)
	}
	ackC += 8
	t.Logf("full disk: memmap took %d rows, compressed %d (refused %d times)", ackM, ackC, refused)
	if code := s.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s = startServer(t, data)
	for name, want := range map[string]int{"m": ackM, "c": ackC} {
		_, body := s.do("GET", "/v1/buffers/"+name, "", nil)
		var info struct {
			Size int64 `json:"size"`
		}
		json.Unmarshal(body, &info)
		if info.Size != int64(want) {
			t.Fatalf("%s after restart: size %d, want every acknowledged row (%d): %s", name, info.Size, want, body)
		}
	}
	if code := s.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if out, err := exec.Command(rbdBin, "verify", data).CombinedOutput(); err != nil {
		t.Fatalf("rbd verify: %v\n%s", err, out)
	}
}

// TestServeTruncatedFile truncates a column file under a running server:
// that buffer answers 500 io_error, the others and the server go on.
func TestServeTruncatedFile(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	s := startServer(t, data)
	for _, name := range []string{"a", "b"} {
		if st, body := s.do("PUT", "/v1/buffers/"+name, "application/json", spec(1000, "memmap", "")); st != 201 {
			t.Fatalf("create %s: %d %s", name, st, body)
		}
		if st, body := s.do("POST", "/v1/buffers/"+name+"/extend?stream=s", "application/json", rows(100)); st != 200 {
			t.Fatalf("extend %s: %d %s", name, st, body)
		}
	}
	if err := os.Truncate(filepath.Join(data, "buffers", "a", "f.observation.col"), 4096); err != nil {
		t.Fatal(err)
	}
	st, body := s.do("POST", "/v1/buffers/a/sample", "application/json", []byte(`{"batch_size": 32}`))
	if msg, code := errorCode(t, body); st != 500 || code != "io_error" {
		t.Fatalf("sample from the truncated buffer: %d %s %s", st, code, msg)
	}
	if st, _ := s.do("POST", "/v1/buffers/a/extend?stream=s", "application/json", rows(10)); st != 500 {
		t.Fatalf("extend after the fault: %d, want 500", st)
	}
	if st, body := s.do("POST", "/v1/buffers/b/sample", "application/json", []byte(`{"batch_size": 32}`)); st != 200 {
		t.Fatalf("the other buffer: %d %s", st, body)
	}
	s.healthy()
	if !s.waitLog("buffer failed") {
		t.Error("no log line for the failed buffer")
	}
}
