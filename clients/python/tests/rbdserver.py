"""Start a real `rbd serve` for tests, examples and benchmarks.

The binary is $RBD_BIN when set (the Go test that runs these suites builds
it once), else it is built here with `go build` from the checkout this file
belongs to, once per process.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# The tests use the installed rbd_client if there is one, else the
# checkout's. RBD_CLIENT_INSTALLED=1 insists on the installed one (the venv
# test checks that `pip install` really installed it).
try:
    import rbd_client  # noqa: F401
except ImportError:
    if os.environ.get("RBD_CLIENT_INSTALLED"):
        raise
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

_built = None
_build_lock = threading.Lock()


def rbd_binary():
    """Path of an rbd binary: $RBD_BIN, or one built from this checkout."""
    global _built
    env = os.environ.get("RBD_BIN")
    if env:
        return env
    with _build_lock:
        if _built is None:
            out = os.path.join(tempfile.mkdtemp(prefix="rbd-bin-"), "rbd")
            go = shutil.which("go") or "go"
            subprocess.run([go, "build", "-o", out, "./cmd/rbd"], cwd=ROOT, check=True)
            _built = out
    return _built


class Server:
    """`rbd serve` on a free loopback port with its own data dir.

    Use as a context manager; ``url`` is ``http://127.0.0.1:PORT``.
    ``args`` are extra flags (e.g. ``["--demo", "--demo-rate", "20000"]``);
    ``data`` reuses a data dir instead of a fresh one.
    """

    def __init__(self, args=(), data=None, token=None):
        self.args = list(args)
        self.tmp = tempfile.mkdtemp(prefix="rbd-test-")
        self.data = data or os.path.join(self.tmp, "d")
        self.token = token
        self.proc = None
        self.url = None
        self.stderr_path = os.path.join(self.tmp, "stderr.log")

    def start(self, timeout=30):
        addr_file = os.path.join(self.tmp, "addr")
        if os.path.exists(addr_file):
            os.remove(addr_file)
        cmd = [rbd_binary(), "serve", "--addr", "127.0.0.1:0", "--addr-file", addr_file,
               "--data", self.data] + self.args
        if self.token:
            cmd += ["--token", self.token]
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._stderr, stderr=self._stderr)
        deadline = time.monotonic() + timeout
        while not os.path.exists(addr_file):
            if self.proc.poll() is not None:
                raise RuntimeError("rbd serve exited with %d:\n%s" % (self.proc.returncode, self.log()))
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("rbd serve did not start in %ss:\n%s" % (timeout, self.log()))
            time.sleep(0.02)
        with open(addr_file) as f:
            self.url = "http://" + f.read().strip()
        return self

    def log(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout=30):
        """SIGINT (a clean shutdown), then SIGKILL if it does not exit."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        rc, self.proc = self.proc.returncode, None
        return rc

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


def wait_for_rows(client, name, rows, timeout=30):
    """Poll info until the buffer holds at least ``rows`` live rows."""
    deadline = time.monotonic() + timeout
    while True:
        info = client.info(name)
        if info["size"] >= rows:
            return info
        if time.monotonic() > deadline:
            raise TimeoutError("buffer %r has %d rows after %ss, want %d" % (name, info["size"], timeout, rows))
        time.sleep(0.05)


if __name__ == "__main__":  # python3 rbdserver.py [serve flags]: run one until Ctrl-C
    with Server(sys.argv[1:]) as s:
        print(s.url, flush=True)
        try:
            s.proc.wait()
        except KeyboardInterrupt:
            pass
