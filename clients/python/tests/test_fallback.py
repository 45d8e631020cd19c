"""iter_samples(transport="auto") against a server older than sample
streams: it falls back to one request per batch, and says so."""

import http.server
import json
import threading
import unittest

import numpy as np

import rbdserver  # noqa: F401 - puts the checkout's rbd_client on the path if needed
from rbd_client import BadRequest, Client, safetensors

_KEYS = {"batch_size", "sampler", "seed", "keys", "next_state", "n_step", "num_slices", "slice_len",
         "strict_length", "beta", "consumer", "include_incomplete", "drop_last", "fill", "timeout_ms"}


class _OldServer(http.server.BaseHTTPRequestHandler):
    """What a server from before sample streams answers: the stream's keys
    are unknown keys (400), a plain sample request gets a batch."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        unknown = sorted(set(body) - _KEYS)
        if unknown:
            msg = json.dumps({"error": "%s: unknown key (want one of %s)" % (unknown[0], ", ".join(sorted(_KEYS)))}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        n = body.get("batch_size", 1)
        seed = body.get("seed", 0)
        header, parts, _ = safetensors.encode({"seq": np.arange(seed, seed + n, dtype=np.int64),
                                               "observation": np.zeros((n, 4), np.float32)})
        data = bytes(header) + b"".join(bytes(safetensors.byte_view(p)) for p in parts)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FallbackTest(unittest.TestCase):
    def setUp(self):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OldServer)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.c = Client("http://127.0.0.1:%d" % self.httpd.server_address[1])

    def tearDown(self):
        self.c.close()
        self.httpd.shutdown()
        self.httpd.server_close()

    def test_auto_falls_back_to_requests(self):
        # Loopback: auto tries shared memory, whose stream request the old
        # server refuses like any stream; the batches then come from
        # requests, seed + i as always.
        with self.c.iter_samples("x", 8, batches=3, seed=100) as it:
            got = [b["seq"][0] for b in it]
            self.assertEqual(it.transport, "requests")
        self.assertEqual(got, [100, 101, 102])

    def test_forced_stream_does_not_fall_back(self):
        with self.c.iter_samples("x", 8, batches=3, transport="stream") as it:
            with self.assertRaises(BadRequest) as cm:
                next(it)
        self.assertIn("unknown key", cm.exception.message)


if __name__ == "__main__":
    unittest.main()
