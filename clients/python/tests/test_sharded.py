"""ShardedClient against real `rbd serve` shards: placement (the same as the
Go client's), specs checked before a create, merged samples equal to one
buffer holding the same rows, a shard going down."""

import math
import socket
import threading
import time
import unittest

import numpy as np

import rbdserver  # first: puts the checkout's rbd_client on the path if needed
from rbd_client import BadRequest, Client, ShardedClient

from test_client import spec

try:
    import dns.message
    import dns.rdatatype
    import dns.rrset
except ImportError:
    dns = None


def rows_of(tokens, done_every=7, open_last=True):
    """Rows whose observation (all 4 components) and action are the
    token; an episode ends every ``done_every`` rows, the last left open."""
    n = len(tokens)
    tok = np.asarray(tokens, dtype=np.int64)
    done = (np.arange(n) % done_every) == done_every - 1
    if not open_last:
        done[-1] = True
    rows = {"observation": np.repeat(tok[:, None].astype(np.float32), 4, axis=1),
            "action": tok,
            "next.reward": np.ones(n, np.float32),
            "next.done": done, "next.terminated": done, "next.truncated": np.zeros(n, bool),
            "next.observation": np.repeat((tok[done] + 1)[:, None].astype(np.float32), 4, axis=1)}
    return rows


def chi2_bound(df, z=3.72):
    """The chi-squared quantile of p = 1e-4 (z = 3.72), Wilson-Hilferty."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


class HashOrderTest(unittest.TestCase):
    def test_same_as_go(self):
        # The orders client.Sharded (Go) gives for these URLs and streams.
        urls = ["http://10.0.0.1:7450", "http://10.0.0.2:7450", "http://10.0.0.3:7450", "http://rbd-3.rbd:7450"]
        want = {"": [0, 1, 2, 3], "actor-0": [1, 3, 2, 0], "actor-1": [3, 0, 2, 1], "actor-17": [3, 0, 2, 1],
                "learner": [2, 1, 0, 3], "ünïcode": [3, 2, 1, 0]}
        with ShardedClient(list(reversed(urls))) as s:
            for stream, order in want.items():
                self.assertEqual(s.hash_order(stream), order, stream)

    def test_bad_lists(self):
        with self.assertRaisesRegex(ValueError, "empty"):
            ShardedClient([])
        with self.assertRaisesRegex(ValueError, "twice"):
            ShardedClient(["http://a:1", "http://a:1/"])


class ShardedTest(unittest.TestCase):
    def setUp(self):
        self.servers = [rbdserver.Server().start() for _ in range(3)]
        self.ref_server = rbdserver.Server().start()
        self.s = ShardedClient([srv.url for srv in self.servers], seed=1)
        self.ref = Client(self.ref_server.url)
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        self.s.close()
        self.ref.close()
        for srv in self.servers + [self.ref_server]:
            srv.cleanup()

    def shard_of(self, server):
        return self.s.urls.index(server.url)

    def test_spec_conflict_creates_nothing(self):
        a = Client(self.servers[0].url)
        b = Client(self.servers[1].url)
        try:
            a.create_buffer("x", spec(capacity=100))
            b.create_buffer("x", spec(capacity=200))
        finally:
            a.close()
            b.close()
        with self.assertRaisesRegex(ValueError, "different specs"):
            self.s.create_buffer("x", spec(capacity=100))
        infos = self.s.info("x")
        self.assertIsNone(infos[self.shard_of(self.servers[2])], "the third shard got the buffer anyway")

    def fill(self):
        """Shards of 30, 75 and 150 rows (tokens unique over all), priorities
        1 + token % 5 set by (shard, seq); the reference holds them all."""
        sp = spec(capacity=1000, priority=True)
        self.s.create_buffer("b", sp)
        self.ref.create_buffer("b", sp)
        tok = 0
        for k, n in enumerate([30, 75, 150]):
            shard = self.shard_of(self.servers[k])
            toks = np.arange(tok, tok + n)
            tok += n
            c = self.s.shard(shard)
            res = c.extend("b", rows_of(toks), stream="s%d" % k)
            rres = self.ref.extend("b", rows_of(toks), stream="s%d" % k)
            prio = 1.0 + toks % 5
            self.s.update_priorities("b", np.full(n, shard), res["first_seq"] + np.arange(n), prio)
            self.ref.update_priorities("b", rres["first_seq"] + np.arange(n), prio)

    def test_merged_sample_is_one_buffer(self):
        self.fill()
        for sampler in ("uniform", "prioritized"):
            with self.subTest(sampler=sampler):
                rb = self.ref.sample("b", 20000, sampler, return_prob=True, beta=0.6, seed=3)
                want_prob = dict(zip(rb["action"].tolist(), rb["prob"].tolist()))
                want_w = dict(zip(rb["action"].tolist(), rb["weight"].tolist())) if sampler == "prioritized" else {}
                self.assertEqual(len(want_prob), 255 - 3)
                counts = {}
                for k in range(60):
                    b = self.s.sample("b", 256, sampler, beta=0.6, seed=k)
                    self.assertEqual(len(b["seq"]), 256)
                    self.assertEqual(b.metadata["shards_missing"], "")
                    for i, t in enumerate(b["action"].tolist()):
                        self.assertIn(t, want_prob)
                        self.assertAlmostEqual(b["prob"][i], want_prob[t], delta=1e-12 * want_prob[t])
                        if want_w:
                            self.assertAlmostEqual(float(b["weight"][i]), want_w[t], delta=1e-6 * want_w[t])
                        counts[t] = counts.get(t, 0) + 1
                n = 60 * 256
                chi2 = sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in want_prob.items())
                self.assertLess(chi2, chi2_bound(len(want_prob) - 1), "merged draws differ from one buffer's")

    def test_merged_slices_are_one_buffer(self):
        self.fill()
        rb = self.ref.sample("b", None, "slice", num_slices=5000, slice_len=3, return_prob=True, seed=4)
        want = dict(zip(rb["action"][:, 0].tolist(), rb["prob"][:, 0].tolist()))
        self.assertAlmostEqual(sum(want.values()), 1.0, delta=1e-9)
        counts = {}
        for k in range(60):
            b = self.s.sample("b", None, "slice", num_slices=64, slice_len=3, seed=k)
            self.assertEqual(b["action"].shape, (64, 3))
            self.assertEqual(b["shard"].shape, (64, 3))
            for first, p in zip(b["action"][:, 0].tolist(), b["prob"][:, 0].tolist()):
                self.assertIn(first, want)
                self.assertAlmostEqual(p, want[first], delta=1e-12)
                counts[first] = counts.get(first, 0) + 1
        n = 60 * 64
        chi2 = sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in want.items())
        self.assertLess(chi2, chi2_bound(len(want) - 1))

    def test_stream_back_on_a_shard_starts_a_new_trajectory(self):
        self.s.create_buffer("b", spec(capacity=1000))
        st = "actor-7"
        first, second = self.s.hash_order(st)[:2]
        res = self.s.extend("b", rows_of(np.arange(0, 5)), stream=st)  # open trajectory on `first`
        self.assertEqual(res["shard"], first)
        self.s._down[first] = time.monotonic() + 60  # as after a failed write
        res = self.s.extend("b", rows_of(np.arange(5, 10)), stream=st)
        self.assertEqual(res["shard"], second)
        self.s._down[first] = 0.0  # DownFor has passed
        res = self.s.extend("b", rows_of(np.arange(10, 15)), stream=st)
        self.assertEqual(res["shard"], first)
        back = self.s.shard(first).rows("b", res["first_seq"], 1)
        self.assertEqual(int(back["step"][0]), 0, "the stream continued the trajectory it left open")

    def test_update_limits_health(self):
        sp = spec(capacity=1000)
        sp["fields"]["h"] = {"dtype": "float32", "shape": [2], "mutable": True}
        self.s.create_buffer("b", sp)
        for k in range(9):
            rows = rows_of(np.arange(20 * k, 20 * k + 20), open_last=False)
            rows["h"] = np.zeros((20, 2), np.float32)
            self.s.extend("b", rows, stream="actor-%d" % k)
        b = self.s.sample("b", 64, keys=["action"])
        h = np.stack([b["action"], -b["action"]], axis=1).astype(np.float32)
        res = self.s.update("b", b["shard"], b["seq"], {"h": h})
        self.assertEqual(res["stale"], 0)
        for sh, seq, tok in zip(b["shard"].tolist(), b["seq"].tolist(), b["action"].tolist()):
            r = self.s.shard(sh).rows("b", seq, 1)
            self.assertEqual(r["action"][0], tok)
            self.assertEqual(r["h"][0].tolist(), [tok, -tok])
        self.s.set_rate_limit("b", {"min_size": 5})
        for info in self.s.info("b"):
            self.assertEqual(info["rate_limit"]["min_size"], 5)
        self.assertTrue(all(isinstance(h, dict) for h in self.s.health()))

    def test_seeds_and_iter_samples(self):
        self.fill()
        for sampler in ("uniform", "prioritized"):
            a = self.s.sample("b", 128, sampler, seed=42)
            b = self.s.sample("b", 128, sampler, seed=42)
            c = self.s.sample("b", 128, sampler, seed=43)
            self.assertEqual(a["action"].tolist(), b["action"].tolist())
            self.assertNotEqual(a["action"].tolist(), c["action"].tolist())
            with self.s.iter_samples("b", 128, sampler, batches=3, seed=42) as it:
                got = [x["action"].tolist() for x in it]
            self.assertEqual(got, [self.s.sample("b", 128, sampler, seed=42 + i)["action"].tolist() for i in range(3)])
        with self.s.iter_samples("nope", 8) as it:
            with self.assertRaises(Exception):
                next(it)

    def test_delete_and_close(self):
        self.s.create_buffer("b", spec(capacity=1000))
        self.s.extend("b", rows_of(np.arange(0, 5)), stream="a")
        self.assertEqual(self.s.close_stream("b", "a"), 1)
        self.s.delete_buffer("b")
        self.assertEqual([i for i in self.s.info("b") if i is not None], [])

    def test_shard_down(self):
        self.s.create_buffer("b", spec(capacity=1000))
        streams = {}
        k = 0
        while len(streams) < 3:
            st = "actor-%d" % k
            streams.setdefault(self.s.hash_order(st)[0], st)
            k += 1
        tok = 0
        for shard, st in streams.items():
            res = self.s.extend("b", rows_of(np.arange(tok, tok + 14), open_last=False), stream=st)
            tok += 14
            self.assertEqual(res["shard"], shard)
        dead = self.shard_of(self.servers[1])
        self.servers[1].stop()
        self.s.stats_ttl = 0
        b = self.s.sample("b", 64)
        self.assertEqual(len(b["seq"]), 64)
        self.assertEqual(b.metadata["shards_missing"], str(dead))
        self.assertNotIn(dead, b["shard"].tolist())
        res = self.s.extend("b", rows_of(np.arange(tok, tok + 7)), stream=streams[dead])
        self.assertEqual(res["shard"], self.s.hash_order(streams[dead])[1])
        with self.assertRaises(BadRequest):
            self.s.sample("b", 4, "prioritized_slice")


class FakeDNS:
    """SRV records for one name on a UDP port of loopback, as a headless
    Service's DNS would serve them (targets: localhost)."""

    def __init__(self, name, ports):
        self.name, self.ports = name, ports
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                data, addr = self.sock.recvfrom(1500)
            except OSError:
                return
            q = dns.message.from_wire(data)
            r = dns.message.make_response(q)
            qn = q.question[0]
            if str(qn.name) == self.name + "." and qn.rdtype == dns.rdatatype.SRV:
                r.answer.append(dns.rrset.from_text(qn.name, 5, "IN", "SRV",
                                                    *["0 10 %d localhost." % p for p in self.ports]))
            else:
                r.set_rcode(3)  # NXDOMAIN
            self.sock.sendto(r.to_wire(), addr)

    def close(self):
        self.sock.close()


@unittest.skipIf(dns is None, "needs dnspython (apt-get install python3-dnspython)")
class SRVTest(unittest.TestCase):
    def test_from_srv(self):
        servers = [rbdserver.Server().start() for _ in range(2)]
        ports = [int(srv.url.rsplit(":", 1)[1]) for srv in servers]
        fake = FakeDNS("_http._tcp.rbd.test", ports)
        try:
            with ShardedClient.from_srv("_http._tcp.rbd.test", nameservers=["127.0.0.1:%d" % fake.port]) as s:
                self.assertEqual(s.urls, sorted("http://localhost:%d" % p for p in ports))
                s.create_buffer("b", spec(capacity=100))
                s.extend("b", rows_of(np.arange(0, 20), open_last=False), stream="x")
                self.assertEqual(len(s.sample("b", 8)["seq"]), 8)
            with self.assertRaisesRegex(ValueError, "SRV"):
                ShardedClient.from_srv("_http._tcp.nothing.test", nameservers=["127.0.0.1:%d" % fake.port])
        finally:
            fake.close()
            for srv in servers:
                srv.cleanup()


if __name__ == "__main__":
    unittest.main()
