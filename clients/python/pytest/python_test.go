package pytest

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbdb/rbd/internal/testbin"
)

// systemPython is Debian's python3: a pyenv python3 earlier on PATH has no
// numpy.
const systemPython = "/usr/bin/python3"

// root is the module root, three levels up from this package.
var root = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Join(wd, "..", "..", "..")
}()

func needNumpy(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(systemPython); err != nil {
		t.Skipf("skipping the Python client tests: %s not found (apt-get install -y python3 python3-numpy)", systemPython)
	}
	if out, err := exec.Command(systemPython, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Skipf("skipping the Python client tests: %s cannot import numpy (apt-get install -y python3-numpy): %v\n%s", systemPython, err, out)
	}
}

// watchInputs stats every file the Python suite and the rbd binary are made
// of, so go test's cache reruns this test when any of them changes (it
// only sees files the test process itself touches).
func watchInputs(t *testing.T) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (strings.HasPrefix(name, ".") || name == "__pycache__" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".py", ".toml", ".safetensors", ".json", ".mod", ".sum":
			_, err := os.Stat(p)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// buildRbd builds cmd/rbd once per test binary.
func buildRbd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rbd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rbd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rbd: %v\n%s", err, out)
	}
	return bin
}

// pythonEnv is the environment of a Python run: no bytecode written into
// the checkout, the rbd binary given.
func pythonEnv(t *testing.T, bin string, extra ...string) []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PYTHONPATH=") && !strings.HasPrefix(kv, "RBD_") {
			env = append(env, kv)
		}
	}
	return append(env, append([]string{"RBD_BIN=" + bin, "PYTHONDONTWRITEBYTECODE=1",
		"PYTHONPYCACHEPREFIX=" + t.TempDir(), "PYTHONUNBUFFERED=1"}, extra...)...)
}

func run(t *testing.T, dir string, env []string, timeout time.Duration, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s (%.1fs):\n%s", name, strings.Join(args, " "), time.Since(start).Seconds(), out)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
}

// TestPythonClient runs every test of clients/python/tests (client methods,
// errors, prefetch, compact final observations, the safetensors cross-check
// with the Go codec, examples/actor.py, examples/learner.py and
// examples/r2d2.py) with the checkout's rbd_client on PYTHONPATH. The
// timeout only guards against a hang: the two learners that must learn take
// 30 s idle and about 2 minutes next to the race-enabled Go packages on 2
// cores.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	needNumpy(t)
	watchInputs(t)
	bin := buildRbd(t)
	env := pythonEnv(t, bin, "PYTHONPATH="+filepath.Join(root, "clients", "python"))
	run(t, root, env, 6*time.Minute, systemPython, "-W", "error::ResourceWarning", "-m", "unittest",
		"discover", "-v", "-s", filepath.Join(root, "clients", "python", "tests"))
}

// TestPipInstall installs the package as design.md says CI does (a venv with
// system site packages, pip without network or build isolation) and runs
// the offline tests and one server round trip with the installed copy.
func TestPipInstall(t *testing.T) {
	t.Parallel()
	needNumpy(t)
	if testing.Short() {
		t.Skip("skipping the pip install test in -short mode")
	}
	watchInputs(t)
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(systemPython, "-m", "venv", "--system-site-packages", venv).CombinedOutput(); err != nil {
		t.Skipf("skipping: %s -m venv failed (apt-get install -y python3-venv python3-setuptools): %v\n%s", systemPython, err, out)
	}
	if out, err := exec.Command(systemPython, "-c", "import setuptools").CombinedOutput(); err != nil {
		t.Skipf("skipping: no setuptools for %s (apt-get install -y python3-setuptools): %v\n%s", systemPython, err, out)
	}
	// Build from a copy: pip builds in the source tree (build/, *.egg-info).
	src := filepath.Join(t.TempDir(), "python")
	if err := os.CopyFS(src, os.DirFS(filepath.Join(root, "clients", "python"))); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(venv, "bin", "python")
	bin := buildRbd(t)
	env := pythonEnv(t, bin, "RBD_CLIENT_INSTALLED=1")
	run(t, t.TempDir(), env, 2*time.Minute, py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
		"--disable-pip-version-check", "-q", src)
	tests := filepath.Join(root, "clients", "python", "tests")
	run(t, t.TempDir(), env, time.Minute, py, "-c", `import rbd_client, sys
assert rbd_client.__file__.startswith(sys.prefix), rbd_client.__file__
print("installed:", rbd_client.__file__, rbd_client.__version__)`)
	run(t, tests, env, 2*time.Minute, py, "-m", "unittest", "-v", "test_safetensors",
		"test_client.ClientTest.test_extend_and_rows_round_trip", "test_client.PrefetchTest.test_yields_batches_then_stops")
}

// TestPythonClientTLS runs the Python client against an https:// server
// with a CA, a role token file and then mutual TLS: it works with the CA
// (and the client certificate), and fails the handshake without them.
func TestPythonClientTLS(t *testing.T) {
	t.Parallel()
	needNumpy(t)
	watchInputs(t)
	bin := buildRbd(t)
	dir := t.TempDir()
	ca, err := testbin.NewCA("python test CA")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, _, err := ca.Issue("rbd", false)
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, _, err := ca.Issue("learner", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := testbin.WriteFiles(dir, map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": srvCert, "tls.key": srvKey,
		"client.crt": cliCert, "client.key": cliKey, "tokens": []byte("write py-write-token-0123\nadmin py-admin-token-0123\n")}); err != nil {
		t.Fatal(err)
	}
	f := func(n string) string { return filepath.Join(dir, n) }
	script := `
import sys, ssl
import numpy as np
import rbd_client
url, ca, cert, key, mtls = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
kw = {"cert": cert, "key": key} if mtls else {}
c = rbd_client.Client(url, token="py-admin-token-0123", ca=ca, **kw)
c.create_buffer("b", {"capacity": 100, "storage": "memory", "fields": {
    "observation": {"dtype": "float32", "shape": [2]}, "next.done": {"dtype": "bool", "shape": []}}})
w = rbd_client.Client(url, token="py-write-token-0123", ca=ca, **kw)
w.extend("b", {"observation": np.ones((4, 2), np.float32), "next.done": np.array([0, 0, 0, 1], bool)}, stream="s")
b = w.sample("b", batch_size=4)
assert b["observation"].shape == (4, 2), b["observation"].shape
try:
    w.delete_buffer("b")
    raise SystemExit("a write token deleted a buffer")
except rbd_client.RbdError as e:
    assert e.status == 403, e
for bad in ([{}] if not mtls else [{}, {"ca": ca}]):
    try:
        rbd_client.Client(url, token="py-write-token-0123", **bad).buffers()
        raise SystemExit("an untrusted or certificate-less client got in: %r" % (bad,))
    except (ssl.SSLError, rbd_client.ConnectionFailed, OSError):
        pass
print("tls ok", "mtls" if mtls else "")
`
	for _, mtls := range []bool{false, true} {
		args := []string{"--tls-cert", f("tls.crt"), "--tls-key", f("tls.key"), "--token-file", f("tokens")}
		if mtls {
			args = append(args, "--tls-client-ca", f("ca.crt"))
		}
		srv, err := testbin.StartServer(bin, filepath.Join(t.TempDir(), "d"), time.Minute, args...)
		if err != nil {
			t.Fatal(err)
		}
		url := "https://" + strings.TrimPrefix(srv.URL, "http://")
		flag := "0"
		if mtls {
			flag = "1"
		}
		env := pythonEnv(t, bin, "PYTHONPATH="+filepath.Join(root, "clients", "python"))
		run(t, root, env, time.Minute, systemPython, "-c", script, url, f("ca.crt"), f("client.crt"), f("client.key"), flag)
		srv.Stop(syscall.SIGTERM, time.Minute)
	}
}
