"""rbd_client against a real `rbd serve`: every method, the errors, prefetch,
compact final observations, and the Go codec cross-check."""

import os
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

import rbdserver  # first: puts the checkout's rbd_client on the path if needed
from rbd_client import (BadRequest, Client, Conflict, ConnectionFailed, NotFound, NotReady, RateLimited,
                        RbdError, Unauthorized, safetensors)

try:
    import torch
except ImportError:
    torch = None


def spec(capacity=1000, compact=True, priority=False, storage="memory"):
    s = {"capacity": capacity, "storage": storage,
         "fields": {"observation": {"dtype": "float32", "shape": [4]},
                    "action": {"dtype": "int64", "shape": []},
                    "next.reward": {"dtype": "float32", "shape": []},
                    "next.done": {"dtype": "bool", "shape": []},
                    "next.terminated": {"dtype": "bool", "shape": []},
                    "next.truncated": {"dtype": "bool", "shape": []}},
         "compact_obs": compact}
    if not compact:
        s["fields"]["next.observation"] = {"dtype": "float32", "shape": [4]}
    if priority:
        s["priority"] = {"alpha": 0.6, "eps": 1e-6}
    return s


def episode(start, length, final=True, truncated=False, obs_offset=0.0):
    """Rows of one episode whose observation at step t is start + t (all 4
    components), with its final observation start + length."""
    t = np.arange(length, dtype=np.float32)
    done = t == length - 1
    rows = {"observation": np.repeat((start + t + obs_offset)[:, None], 4, axis=1),
            "action": (np.arange(length) % 2).astype(np.int64),
            "next.reward": np.ones(length, np.float32),
            "next.done": done, "next.terminated": done & (not truncated), "next.truncated": done & truncated}
    if final:
        rows["next.observation"] = np.full((1, 4), start + length + obs_offset, np.float32)
    return rows


def root_buffer(a):
    """The object an array's memory finally belongs to."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


class ServerTest(unittest.TestCase):
    """One `rbd serve` (no demo) for the class; each test uses its own buffers."""

    server_args = []
    token = None

    @classmethod
    def setUpClass(cls):
        cls.server = rbdserver.Server(cls.server_args, token=cls.token).start()
        cls.c = Client(cls.server.url, token=cls.token)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        rc = cls.server.stop()
        log = cls.server.log()
        cls.server.cleanup()
        assert rc == 0 and "stopped cleanly" in log, "rbd serve exited with %s:\n%s" % (rc, log)

    def buffer(self, suffix="", **kw):
        name = self.id().rsplit(".", 1)[-1].replace("test_", "")[:60] + suffix
        self.c.create_buffer(name, spec(**kw))
        self.addCleanup(lambda: self._delete(name))
        return name

    def _delete(self, name):
        try:
            self.c.delete_buffer(name)
        except NotFound:
            pass


class ClientTest(ServerTest):
    def test_health_and_list(self):
        health = self.c.health()
        self.assertEqual(health["status"], "ok")
        # The memory section is what an operator watches under --max-memory.
        for key in ("budget_bytes", "in_flight_bytes", "buffers_bytes", "buffers_limit_bytes", "refused_total"):
            self.assertIsInstance(health["memory"][key], int, key)
        name = self.buffer()
        self.assertIn(name, [b["name"] for b in self.c.buffers()])
        self.assertIn("rbd_http_requests_total", self.c.metrics())

    def test_create_identical_and_conflict(self):
        name = self.buffer(capacity=100)
        info = self.c.create_buffer(name, spec(capacity=100))  # identical: 200, same buffer
        self.assertEqual(info["spec"]["capacity"], 100)
        self.assertEqual(info["spec"]["fields"]["observation"], {"dtype": "float32", "shape": [4]})
        with self.assertRaises(Conflict) as cm:
            self.c.create_buffer(name, spec(capacity=200))
        self.assertEqual(cm.exception.status, 409)

    def test_run_records_same_rows(self):
        """Buffers with run records ("row_meta": "runs"; in memory, and in
        a memmap buffer's rows.meta format version 2) answer the same rows,
        metadata and next observations as the default layout, over many
        episodes of several streams (runs that continue across extends,
        end, and are written over when the ring wraps)."""
        answers = {}
        layouts = (("memory", "row", 64 - 31), ("memory", "runs", 48 - 31), ("memmap", "runs", 16))
        for storage, row_meta, meta_bytes in layouts:
            name = self.buffer(suffix="_%s_%s" % (storage, row_meta))
            self._delete(name)
            s = spec(capacity=40)
            s["storage"], s["row_meta"] = storage, row_meta
            self.c.create_buffer(name, s)
            for k in range(12):
                self.c.extend(name, episode(100 * k, 3 + k % 5), stream="s%d" % (k % 3))
            info = self.c.info(name)
            self.assertEqual(info["spec"].get("row_meta", "row"), row_meta)
            self.assertEqual(info["row_meta_bytes"], meta_bytes)
            if row_meta == "runs":  # a run per live episode or piece of one
                self.assertTrue(0 < info["run_records"] < info["size"], info)
            else:
                self.assertNotIn("run_records", info)
            answers[storage, row_meta] = self.c.sample(name, 64, sampler="uniform", seed=5)
        a = answers["memory", "row"]
        for n, layout in enumerate(layouts[1:], 1):
            b = answers[layout[:2]]
            for key in ("seq", "step", "observation", "next.observation", "next.done"):
                np.testing.assert_array_equal(a[key], b[key], err_msg="%s %s" % (layout, key))
            # Trajectory ids are the store's: each buffer's are 12 after the last one's.
            np.testing.assert_array_equal(b["traj_id"] - a["traj_id"], np.full(64, 12 * n))
            np.testing.assert_array_equal(b["next.observation"][:, 0], b["observation"][:, 0] + 1)
        s = spec()
        s["row_meta"] = "runs"
        s["storage"] = "compressed"
        with self.assertRaises(BadRequest) as cm:
            self.c.create_buffer("run_records_on_compressed", s)
        self.assertIn("row_meta", cm.exception.message)

    def test_create_bad_spec_names_the_field(self):
        s = spec()
        s["fields"]["observation"]["dtype"] = "float31"
        with self.assertRaises(BadRequest) as cm:
            self.c.create_buffer("bad", s)
        e = cm.exception
        self.assertEqual(e.status, 400)
        self.assertIn("fields.observation.dtype", e.message)
        self.assertIn("float31", str(e))
        self.assertIsInstance(e, RbdError)

    def test_extend_and_rows_round_trip(self):
        name = self.buffer()
        a, b = episode(0, 3), episode(100, 2)
        res = self.c.extend(name, a, stream="s", env=0)
        self.assertEqual(res, {"first_seq": 0, "rows": 3, "write_count": 3})
        res = self.c.extend(name, b, stream="s", env=1)
        self.assertEqual(res["first_seq"], 3)
        rows = self.c.rows(name, 0, 10)
        np.testing.assert_array_equal(rows["seq"], np.arange(5))
        np.testing.assert_array_equal(rows["observation"][:3], a["observation"])
        np.testing.assert_array_equal(rows["action"], np.r_[a["action"], b["action"]])
        np.testing.assert_array_equal(rows["next.done"], [False, False, True, False, True])
        np.testing.assert_array_equal(rows["step"], [0, 1, 2, 0, 1])
        np.testing.assert_array_equal(rows["prev_seq"], [-1, 0, 1, -1, 3])
        np.testing.assert_array_equal(rows["next_seq"], [1, 2, -1, 4, -1])
        self.assertEqual(len(set(rows["traj_id"][:3])), 1)
        self.assertNotEqual(rows["traj_id"][0], rows["traj_id"][3])
        info = self.c.info(name)
        self.assertEqual((info["size"], info["write_count"], info["trajectories"]), (5, 5, 2))
        # Paging: every row exactly once.
        pages = list(self.c.iter_rows(name, 0, page=2))
        self.assertEqual([len(p["seq"]) for p in pages], [2, 2, 1])

    def test_streams_continue_and_close(self):
        name = self.buffer()
        ep = episode(0, 4, final=False)
        first = {k: v[:2] for k, v in ep.items()}
        # Two envs of one stream, steps interleaved across two requests.
        both = {k: np.repeat(v, 2, axis=0) for k, v in first.items()}
        self.c.extend(name, both, stream="actor", env=[0, 1, 0, 1])
        self.c.extend(name, both, stream="actor", env=[0, 1, 0, 1])
        rows = self.c.rows(name)
        np.testing.assert_array_equal(rows["step"], [0, 0, 1, 1, 2, 2, 3, 3])
        self.assertEqual(len(set(rows["traj_id"])), 2)
        self.assertEqual(self.c.info(name)["open_trajectories"], 2)
        self.assertEqual(self.c.close_stream(name, "actor"), 2)
        self.assertEqual(self.c.info(name)["open_trajectories"], 0)
        self.c.extend(name, first, stream="actor")  # a new trajectory after the close
        self.assertEqual(self.c.rows(name, 8)["step"].tolist(), [0, 1])

    def test_without_stream_each_request_is_its_own_trajectory(self):
        # The "slices are all length 1" symptom of docs/debugging.md.
        name = self.buffer()
        ep = episode(0, 5, final=False)
        for t in range(5):
            self.c.extend(name, {k: v[t:t + 1] for k, v in ep.items()})
        rows = self.c.rows(name)
        self.assertEqual(len(set(rows["traj_id"])), 5)
        np.testing.assert_array_equal(rows["step"], 0)
        with self.assertRaises(NotReady):  # no row has a known next observation
            self.c.sample(name, 1)

    def test_missing_env_chains_envs_into_one_trajectory(self):
        # docs/debugging.md: without env, the steps of all envs of a stream
        # are taken as one env's steps in time order.
        name = self.buffer()
        a, b = episode(0, 3, final=False), episode(100, 3, final=False)
        mixed = {k: np.stack([a[k], b[k]], axis=1).reshape((6,) + a[k].shape[1:]) for k in a}
        self.c.extend(name, mixed, stream="s")  # a0 b0 a1 b1 a2(done) b2(done)
        rows = self.c.rows(name)
        self.assertEqual(len(set(rows["traj_id"][:5].tolist())), 1)
        np.testing.assert_array_equal(rows["next_seq"][:4], [1, 2, 3, 4])
        s = self.c.sample(name, 64, seed=1)
        # Row 0 (env a, observation 0) gets env b's observation 100 as its next.
        self.assertIn(0, s["seq"].tolist())
        self.assertEqual(s["next.observation"][s["seq"] == 0][0, 0], 100)
        # With env, each env is its own trajectory and next is right.
        name2 = name + "-env"
        self.c.create_buffer(name2, spec())
        self.addCleanup(self._delete, name2)
        self.c.extend(name2, mixed, stream="s", env=[0, 1] * 3)
        s = self.c.sample(name2, 64, seed=1)
        np.testing.assert_array_equal(s["next.observation"], s["observation"] + 1)

    def test_compact_final_observations(self):
        for form in ("D", "N"):
            with self.subTest(form=form):
                name = self.buffer()
                self._delete(name)
                self.c.create_buffer(name, spec())
                a = episode(0, 3)                       # terminated
                b = episode(10, 2, truncated=True)      # time limit: still exact
                if form == "N":  # [N, 4]: values on rows that are not done are ignored
                    for ep in (a, b):
                        n = len(ep["action"])
                        full = np.full((n, 4), -1, np.float32)
                        full[-1] = ep["next.observation"][0]
                        ep["next.observation"] = full
                self.c.extend(name, a, stream="s")
                self.c.extend(name, b, stream="s")
                batch = self.c.sample(name, 64, sampler="uniform", seed=3)
                obs, nxt = batch["observation"][:, 0], batch["next.observation"][:, 0]
                np.testing.assert_array_equal(nxt, obs + 1)  # exact, done rows included
                self.assertTrue(batch["next.done"].any())
                self.assertEqual(set(batch["seq"].tolist()), set(range(5)))

    def test_compressed_frame_stack_round_trip(self):
        # A compressed buffer with frame dedup hands back exactly the stacks
        # the actor wrote: zero-padded start, shifted stacks, final observation.
        name = self.buffer()
        self._delete(name)
        sp = {
            "capacity": 100, "storage": "compressed", "compact_obs": True,
            "compression": {"codec": "zstd", "level": 3, "chunk_len": 4},
            "fields": {
                "observation": {"dtype": "uint8", "shape": [4, 6, 6], "frame_stack": {"k": 4, "axis": 0}},
                "action": {"dtype": "int64", "shape": []},
                "next.done": {"dtype": "bool", "shape": []},
            },
        }
        self.c.create_buffer(name, sp)
        rng = np.random.default_rng(5)
        frames = rng.integers(0, 255, size=(12, 6, 6), dtype=np.uint8)
        padded = np.concatenate([np.zeros((3, 6, 6), np.uint8), frames])
        stacks = np.stack([padded[t:t + 4] for t in range(10)])  # steps 0..9
        done = np.zeros(9, bool)
        done[-1] = True
        self.c.extend(name, {"observation": stacks[:5], "action": np.arange(5), "next.done": done[:5]}, stream="a")
        self.c.extend(name, {"observation": stacks[5:9], "action": np.arange(5, 9), "next.done": done[5:],
                             "next.observation": stacks[9:10]}, stream="a")
        info = self.c.info(name)
        self.assertEqual(info["spec"]["compression"]["chunk_len"], 4)
        self.assertLess(info["bytes"]["observation"]["stored"], info["bytes"]["observation"]["logical"])
        b = self.c.sample(name, 64, seed=2)
        for seq, obs, nxt in zip(b["seq"], b["observation"], b["next.observation"]):
            np.testing.assert_array_equal(obs, stacks[seq])
            np.testing.assert_array_equal(nxt, stacks[seq + 1])
        self.assertEqual(set(b["seq"].tolist()), set(range(9)))

    def test_done_row_without_final_observation(self):
        # "next observation looks like a reset frame" is what other buffers do;
        # rbd instead never samples a done row whose final observation is unknown.
        name = self.buffer()
        self.c.extend(name, episode(0, 3, final=False), stream="s")
        b = self.c.sample(name, 32, seed=1)
        self.assertNotIn(2, b["seq"].tolist())
        b = self.c.sample(name, 32, seed=1, include_incomplete=True)
        valid = b["next.observation_valid"]
        np.testing.assert_array_equal(valid, b["seq"] != 2)
        np.testing.assert_array_equal(b["next.observation"][~valid], 0)

    def test_extend_errors_name_the_field(self):
        name = self.buffer()
        ep = episode(0, 3)
        missing = {k: v for k, v in ep.items() if k != "action"}
        with self.assertRaisesRegex(BadRequest, "action"):
            self.c.extend(name, missing)
        bad_shape = dict(ep, observation=np.zeros((3, 5), np.float32))
        with self.assertRaisesRegex(BadRequest, "observation.*shape"):
            self.c.extend(name, bad_shape)
        bad_flags = dict(ep, **{"next.terminated": np.zeros(3, bool)})
        with self.assertRaises(BadRequest) as cm:
            self.c.extend(name, bad_flags)
        self.assertIn("next.done", cm.exception.message)
        self.assertIn("done must equal terminated || truncated", cm.exception.message)
        with self.assertRaisesRegex(BadRequest, "extra"):
            self.c.extend(name, dict(ep, extra=np.zeros(3)))
        # float64 observations are cast; float actions are refused before sending.
        self.c.extend(name, dict(ep, observation=ep["observation"].astype(np.float64)))
        with self.assertRaisesRegex(TypeError, "action"):
            self.c.extend(name, dict(ep, action=np.zeros(3)))
        with self.assertRaisesRegex(BadRequest, "dtype float64, want float32"):
            self.c.extend(name, dict(ep, observation=ep["observation"].astype(np.float64)), cast=False)
        self.assertEqual(self.c.info(name)["write_count"], 3, "rejected extends write nothing")
        with self.assertRaises(NotFound) as cm:
            self.c.extend("no-such-buffer", ep)
        self.assertEqual(cm.exception.status, 404)

    def test_lists_and_int_flags(self):
        name = self.buffer()
        self.c.extend(name, {"observation": [[0, 0, 0, 0], [1, 1, 1, 1]], "action": [0, 1],
                             "next.reward": [1, 1], "next.done": [0, 1], "next.terminated": [0, 1],
                             "next.truncated": [0, 0], "next.observation": [[2, 2, 2, 2]]}, stream="x")
        np.testing.assert_array_equal(self.c.rows(name)["next.done"], [False, True])

    def test_sample_is_zero_copy(self):
        name = self.buffer(priority=True)
        self.c.extend(name, episode(0, 50), stream="s")
        b = self.c.sample(name, 8, sampler="prioritized", n_step={"n": 3, "gamma": 0.9}, seed=np.int64(1))
        for k in ("observation", "action", "next.observation", "seq", "weight", "gamma", "steps_to_next_obs"):
            self.assertIn(k, b)
        roots = {id(root_buffer(a)) for a in b.values()}
        self.assertEqual(len(roots), 1, "every array is a view of the one answer buffer")
        self.assertIsInstance(root_buffer(b["seq"]), bytearray)
        self.assertTrue(all(not a.flags.owndata and a.flags.writeable for a in b.values()))
        self.assertEqual(b["observation"].shape, (8, 4))
        np.testing.assert_allclose(b["weight"], 1.0)

    def test_sample_errors(self):
        name = self.buffer()
        with self.assertRaises(NotReady) as cm:  # empty buffer
            self.c.sample(name, 4)
        e = cm.exception
        self.assertEqual((e.status, e.code), (503, "not_ready"))
        self.assertTrue(e.not_ready)
        self.assertEqual(e.retry_after, 1)
        with self.assertRaises(BadRequest) as cm:
            self.c.sample(name, 4, bogus=1)
        self.assertIn("bogus", cm.exception.message)
        with self.assertRaisesRegex(BadRequest, "priorit"):
            self.c.sample(name, 4, sampler="prioritized")
        with self.assertRaises(NotFound):
            self.c.sample("no-such-buffer", 4)

    def test_sample_waits_for_data(self):
        name = self.buffer()
        t0 = time.monotonic()
        with self.assertRaises(NotReady):
            self.c.sample(name, 4, timeout_ms=300)
        self.assertGreater(time.monotonic() - t0, 0.25)
        writer = threading.Timer(0.2, lambda: self.c.extend(name, episode(0, 4), stream="w"))
        writer.start()
        t0 = time.monotonic()
        b = self.c.sample(name, 4, timeout_ms=10000)
        writer.join()
        self.assertLess(time.monotonic() - t0, 5, "the write wakes the waiting sample")
        self.assertEqual(b["seq"].shape, (4,))

    def test_policy_versions(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 10), stream="a", policy_version=1)
        self.c.extend(name, dict(episode(100, 10), policy_version=np.full(10, 3)), stream="b")
        pv = self.c.info(name)["policy_versions"]
        self.assertEqual((pv["newest"], pv["min"], pv["max"]), (3, 1, 3))
        self.assertEqual(pv["rows"], [{"version": 3, "rows": 10}, {"version": 1, "rows": 10}])
        b = self.c.sample(name, 64, min_policy_version=2, seed=1)
        self.assertTrue((b["observation"] >= 100).all(), "only version-3 rows")
        with self.assertRaises(NotReady) as cm:
            self.c.sample(name, 4, min_policy_version=4)
        self.assertIn("newest written is 3", cm.exception.message)
        s = self.c.sample(name, sampler="slice", num_slices=4, slice_len=3, min_policy_version=2, seed=1)
        self.assertTrue((s["observation"] >= 100).all(), "slices start at version-3 rows")
        with self.assertRaises(ValueError):
            self.c.extend(name, dict(episode(200, 2), policy_version=[1, 1]), policy_version=1)

    def test_priorities(self):
        name = self.buffer(priority=True)
        self.c.extend(name, episode(0, 10), stream="s")
        self.assertEqual(self.c.update_priorities(name, [0, 1, 99], [0.5, 2.0, 1.0]), {"updated": 2, "stale": 1})
        self.c.update_priorities(name, np.arange(10), np.r_[np.zeros(9), 100.0])
        b = self.c.sample(name, 64, sampler="prioritized", seed=5)
        self.assertGreater(np.mean(b["seq"] == 9), 0.9)
        with self.assertRaisesRegex(BadRequest, "priorit"):
            self.c.update_priorities(name, [0], [-1.0])
        with self.assertRaises(ValueError):
            self.c.update_priorities(name, [0, 1], [1.0])

    def test_update_mutable_fields(self):
        name = self.id().rsplit(".", 1)[-1].replace("test_", "")
        sp = spec(capacity=8)
        sp["fields"]["recurrent_state"] = {"dtype": "float32", "shape": [3], "mutable": True}
        self.c.create_buffer(name, sp)
        self.addCleanup(lambda: self._delete(name))
        rows = episode(0, 10)
        rows["recurrent_state"] = np.zeros((10, 3), np.float32)
        self.c.extend(name, rows, stream="s")  # 10 rows into 8 slots: 0 and 1 are gone
        new = np.arange(9, dtype=np.float64).reshape(3, 3)  # cast to float32
        self.assertEqual(self.c.update(name, [1, 4, 9], {"recurrent_state": new}), {"updated": 2, "stale": 1})
        b = self.c.rows(name, 0, 100)
        got = dict(zip(b["seq"].tolist(), b["recurrent_state"].tolist()))
        self.assertEqual(got[4], [3.0, 4.0, 5.0])
        self.assertEqual(got[9], [6.0, 7.0, 8.0])
        self.assertEqual(got[5], [0.0, 0.0, 0.0])
        # Slices carry the stored state of every row, shaped [slices, len, H].
        s = self.c.sample(name, sampler="slice", num_slices=2, slice_len=4, seed=3)
        self.assertEqual(s["recurrent_state"].shape, (2, 4, 3))
        # ... as a view of the answer, like every other array: no copy.
        self.assertIs(root_buffer(s["recurrent_state"]), root_buffer(s["observation"]))
        self.assertFalse(s["recurrent_state"].flags.owndata)
        with self.assertRaisesRegex(BadRequest, "not mutable"):
            self.c.update(name, [4], {"action": [1]})
        with self.assertRaisesRegex(BadRequest, "recurrent_state"):
            self.c.update(name, [4], {"recurrent_state": np.zeros((1, 2), np.float32)})
        with self.assertRaises(ValueError):
            self.c.update(name, [4, 5], {"recurrent_state": np.zeros((1, 3), np.float32)})

    def test_slices_and_epochs(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 20), stream="s")
        b = self.c.sample(name, sampler="slice", num_slices=2, slice_len=5, seed=1)
        self.assertEqual(b["observation"].shape, (2, 5, 4))
        np.testing.assert_array_equal(np.diff(b["step"], axis=1), 1)
        seen = []
        for batch in self.c.iter_samples(name, 8, "without_replacement", consumer="c", stop_at_epoch_end=True):
            seen += batch["seq"].tolist()
            self.assertEqual(batch.epoch, 0)
        self.assertTrue(batch.epoch_end)
        self.assertEqual(sorted(seen), list(range(20)))

    def test_delete_buffer(self):
        name = self.buffer()
        self.c.delete_buffer(name)
        with self.assertRaises(NotFound):
            self.c.info(name)
        with self.assertRaises(NotFound):
            self.c.delete_buffer(name)

    def test_set_weights_without_demo_is_404(self):
        with self.assertRaisesRegex(NotFound, "demo"):
            self.c.set_weights("demo", {"w": np.zeros((4, 2)), "b": np.zeros(2)})

    def test_keep_alive(self):
        c = Client(self.server.url)
        for _ in range(30):
            c.health()
        with self.assertRaises(NotFound):
            c.info("no-such-buffer")  # an error answer keeps the connection too
        c.health()
        self.assertEqual(c.connections_opened, 1)
        c.close()

    def test_connection_refused(self):
        with self.assertRaises(ConnectionFailed) as cm:
            Client("http://127.0.0.1:1").health()
        self.assertEqual(cm.exception.status, 0)

    @unittest.skipIf(torch is None, "PyTorch is not installed (optional: apt-get install python3-torch)")
    def test_as_torch(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 10), stream="s")
        b = self.c.sample(name, 4, as_torch=True)
        self.assertIsInstance(b["observation"], torch.Tensor)
        self.assertEqual(b["observation"].dtype, torch.float32)
        self.assertEqual(b["next.done"].dtype, torch.bool)


class PrefetchTest(ServerTest):
    def test_yields_batches_then_stops(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 50), stream="s")
        before = threading.active_count()
        it = self.c.iter_samples(name, 4, batches=5, seed=7, transport="requests")
        got = [b["seq"].copy() for b in it]
        self.assertEqual(len(got), 5)
        it._thread.join(5)
        self.assertEqual(threading.active_count(), before)
        # seed + i per batch: batches differ, and a rerun on the same data repeats them.
        self.assertFalse(all(np.array_equal(got[0], g) for g in got[1:]))
        again = [b["seq"].copy() for b in self.c.iter_samples(name, 4, batches=5, seed=7, transport="requests")]
        for x, y in zip(got, again):
            np.testing.assert_array_equal(x, y)

    def test_prefetches_ahead(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 50), stream="s")
        with self.c.iter_samples(name, 4, depth=3, transport="requests") as it:
            next(it)
            deadline = time.monotonic() + 5
            while it._q.qsize() < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(it._q.qsize(), 3, "three batches wait while the consumer works")
        self.assertFalse(it._thread.is_alive(), "close() stops the thread")

    def test_error_reaches_the_consumer(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 50), stream="s")
        it = self.c.iter_samples(name, 4, depth=1, transport="requests")
        next(it)
        self.c.delete_buffer(name)
        with self.assertRaises(NotFound):
            for _ in range(10):
                next(it)
        with self.assertRaises(StopIteration):
            next(it)
        it.close()

    def test_waits_for_data_when_asked(self):
        for transport in ("requests", "stream"):
            with self.subTest(transport=transport):
                name = self.buffer(suffix="-" + transport)
                with self.assertRaises(NotReady):  # by default a 503 is handed on at once
                    list(self.c.iter_samples(name, 2, transport=transport))
                threading.Timer(0.3, lambda: self.c.extend(name, episode(0, 10), stream="w")).start()
                with self.c.iter_samples(name, 2, batches=1, retry_not_ready=10, transport=transport) as it:
                    self.assertEqual(len(list(it)), 1)


class StreamTest(ServerTest):
    """iter_samples over a sample stream (what auto picks for a server on
    another machine); ShmTest runs the same tests over shared memory."""

    transport = "stream"

    def streams_open(self):
        for line in self.c.metrics().splitlines():
            if line.startswith("rbd_sample_streams "):
                return float(line.split()[1])
        self.fail("no rbd_sample_streams in /metrics")

    def wait_streams_closed(self):
        deadline = time.monotonic() + 15
        while self.streams_open() != 0:
            self.assertLess(time.monotonic(), deadline, "the server still holds a stream")
            time.sleep(0.01)

    def test_matches_single_requests(self):
        name = self.buffer(priority=True)
        self.c.extend(name, episode(0, 60), stream="s")
        for sampler in ("uniform", "prioritized", "slice"):
            with self.subTest(sampler=sampler):
                opts = {"num_slices": 2, "slice_len": 4} if sampler == "slice" else {}
                bs = None if sampler == "slice" else 8
                it = self.c.iter_samples(name, bs, sampler, batches=6, seed=11, transport=self.transport, **opts)
                got = list(it)
                self.assertEqual(it.transport, self.transport)
                self.assertEqual(len(got), 6)
                for i, b in enumerate(got):
                    want = self.c.sample(name, bs, sampler, seed=11 + i, **opts)
                    self.assertEqual(sorted(b), sorted(want))
                    for k in want:
                        np.testing.assert_array_equal(b[k], want[k], err_msg="batch %d, %s" % (i, k))
        self.wait_streams_closed()

    def test_epoch_end_stops_the_server_too(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 20), stream="s")
        seen = []
        for b in self.c.iter_samples(name, 6, "without_replacement", consumer="c", stop_at_epoch_end=True,
                                     transport=self.transport):
            seen += b["seq"].tolist()
        self.assertTrue(b.epoch_end)
        self.assertEqual(sorted(seen), list(range(20)))
        # No batch of the next epoch was drawn and thrown away.
        nxt = self.c.sample(name, 6, "without_replacement", consumer="c")
        self.assertEqual(nxt.epoch, 1)
        self.assertEqual(len(set(nxt["seq"].tolist())), 6)

    def test_error_reaches_the_consumer(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 50), stream="s")
        it = self.c.iter_samples(name, 4, depth=1, transport=self.transport)
        next(it)
        self.c.delete_buffer(name)
        with self.assertRaises(NotFound):
            for _ in range(100000):  # the batches the sockets hold arrive first
                next(it)
        with self.assertRaises(StopIteration):
            next(it)
        self.wait_streams_closed()

    def test_close_frees_the_server(self):
        self.wait_streams_closed()  # earlier tests' streams end asynchronously
        name = self.buffer()
        self.c.extend(name, episode(0, 50), stream="s")
        with self.c.iter_samples(name, 4, transport=self.transport) as it:
            next(it)
            self.assertEqual(self.streams_open(), 1)
        self.wait_streams_closed()

    def test_killed_client_frees_the_server(self):
        self.wait_streams_closed()
        name = self.buffer()
        self.c.extend(name, episode(0, 50), stream="s")
        code = ("import sys, rbd_client\n"
                "it = rbd_client.Client(sys.argv[1]).iter_samples(sys.argv[2], 4, transport=sys.argv[3])\n"
                "next(it)\nprint('reading', flush=True)\nsys.stdin.read()\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(rbdserver.ROOT, "clients", "python"))
        p = subprocess.Popen([sys.executable, "-c", code, self.server.url, name, self.transport], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env)
        try:
            self.assertEqual(p.stdout.readline().strip(), b"reading")
            self.assertEqual(self.streams_open(), 1)
            p.kill()
            p.wait(10)
        finally:
            p.kill()
            p.stdout.close()
            p.stdin.close()
        self.wait_streams_closed()

    def test_rows_never_torn_under_writers(self):
        # Every row's 4 observation components are equal and its next
        # observation is one more: a row mixed from two writes shows.
        name = self.buffer(capacity=256)
        self.c.extend(name, episode(0, 300), stream="seed")
        stop, errs = threading.Event(), []

        def writer(w):
            c = Client(self.server.url)
            try:
                k = 0
                while not stop.is_set():
                    c.extend(name, episode(1000 * (w + 1) + 20 * k, 7), stream="w%d" % w)
                    k = (k + 1) % 40
            except Exception as e:  # reported below
                errs.append(e)
            finally:
                c.close()
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        # Read until the writers have wrapped the ring twice (and at least
        # 150 batches), however slow or fast either side is.
        written, deadline = 0, time.monotonic() + 60
        try:
            with self.c.iter_samples(name, 32, transport=self.transport) as it:
                for i, b in enumerate(it):
                    obs, nxt = b["observation"], b["next.observation"]
                    self.assertTrue((obs == obs[:, :1]).all(), "batch %d: a torn observation: %s" % (i, obs))
                    np.testing.assert_array_equal(nxt, obs + 1, err_msg="batch %d: next observation" % i)
                    if i % 20 == 0:
                        written = self.c.info(name)["write_count"]
                    if (i >= 150 and written > 300 + 2 * 256) or errs or time.monotonic() > deadline:
                        break
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        self.assertEqual(errs, [])
        self.assertGreater(written, 300 + 2 * 256, "the writers did not wrap the ring within a minute")

    def test_bad_options(self):
        name = self.buffer()
        with self.assertRaisesRegex(ValueError, "transport"):
            self.c.iter_samples(name, 4, transport="carrier-pigeon")
        with self.assertRaisesRegex(ValueError, "depth"):
            self.c.iter_samples(name, 4, depth=0)
        self.c.extend(name, episode(0, 10), stream="s")
        with self.assertRaises(BadRequest) as cm:
            next(self.c.iter_samples(name, 4, samplr="x", transport=self.transport))
        self.assertIn("samplr", cm.exception.message)

    @unittest.skipIf(torch is None, "PyTorch is not installed (optional: apt-get install python3-torch)")
    def test_as_torch(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 10), stream="s")
        b = next(self.c.iter_samples(name, 4, as_torch=True, batches=1, transport=self.transport))
        self.assertIsInstance(b["observation"], torch.Tensor)


class ShmTest(StreamTest):
    """iter_samples over shared memory: what auto picks on the server's machine."""

    transport = "shm"

    def server_fds(self):
        return len(os.listdir("/proc/%d/fd" % self.server.proc.pid))

    def test_auto_picks_shm_here(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 20), stream="s")
        it = self.c.iter_samples(name, 4, batches=2)
        self.assertEqual(len(list(it)), 2)
        self.assertEqual(it.transport, "shm")
        self.assertEqual(it.arena_version, 2, "this server announces batches in the arena")

    def test_arena_version_1_where_loads_may_reorder(self):
        # On a CPU that may reorder loads (ARM) the client asks for
        # version 1 arenas, whose batches are announced on the socket; the
        # batches are the same as version 2's and a single request's.
        import rbd_client.client as cm
        name = self.buffer()
        self.c.extend(name, episode(0, 20), stream="s")
        want = [self.c.sample(name, 4, seed=9 + i) for i in range(3)]
        saved = cm._RING_LOADS_ORDERED
        cm._RING_LOADS_ORDERED = False
        try:
            it = self.c.iter_samples(name, 4, batches=3, seed=9, transport="shm")
            got = list(it)
        finally:
            cm._RING_LOADS_ORDERED = saved
        self.assertEqual(it.arena_version, 1)
        self.assertEqual(len(got), 3)
        for g, w in zip(got, want):
            for k in w:
                np.testing.assert_array_equal(g[k], w[k], err_msg=k)

    def test_a_waiting_learner_is_woken(self):
        # A rate limiter holds every draw until a writer inserts, so the
        # learner finds the ring empty each time and sleeps on the socket
        # until the server announces the batch and wakes it.
        name = self.id().rsplit(".", 1)[-1].replace("test_", "")
        s = spec()
        s["rate_limit"] = {"samples_per_insert": 1, "min_size": 8, "error_buffer": 8}
        self.c.create_buffer(name, s)
        self.addCleanup(lambda: self._delete(name))
        self.c.extend(name, episode(0, 8, final=False), stream="w")
        self.c.extend(name, episode(50, 8, final=False), stream="w0")
        stop = threading.Event()

        def writer():
            c, k = Client(self.server.url), 1
            while not stop.wait(0.02):  # 8 rows per 20 ms: one batch through
                c.extend(name, episode(100 * k, 8, final=False), stream="w%d" % k)
                k += 1
            c.close()
        t = threading.Thread(target=writer)
        t.start()
        try:
            with self.c.iter_samples(name, 8, transport="shm", depth=1, batches=10, timeout_ms=20000) as it:
                got = [b["seq"].copy() for b in it]
                self.assertEqual(it.arena_version, 2)
        finally:
            stop.set()
            t.join(30)
        self.assertEqual(len(got), 10)

    def test_a_kept_batch_is_never_overwritten(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 200), stream="s")
        with self.c.iter_samples(name, 16, transport="shm", depth=2) as it:
            kept = next(it)
            kept_torch = _torch_view(next(it))
            copy = {k: v.copy() for k, v in kept.items()}
            torch_copy = kept_torch.clone() if kept_torch is not None else None
            for _ in range(200):  # many times the arena's slots
                next(it)
            for k, v in copy.items():
                np.testing.assert_array_equal(kept[k], v, err_msg=k)
            if kept_torch is not None:
                self.assertTrue(torch.equal(kept_torch, torch_copy))

    def test_two_learners_at_once(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 100), stream="s")
        out, errs = {}, []

        def learner(seed):
            try:
                c = Client(self.server.url)
                out[seed] = [b["seq"].copy() for b in c.iter_samples(name, 8, transport="shm", batches=50, seed=seed)]
                c.close()
            except Exception as e:  # reported below
                errs.append(e)
        threads = [threading.Thread(target=learner, args=(s,)) for s in (100, 200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errs, [])
        for seed, batches in out.items():
            self.assertEqual(len(batches), 50)
            for i in (0, 49):
                np.testing.assert_array_equal(batches[i], self.c.sample(name, 8, seed=seed + i)["seq"])

    def test_killed_client_frees_the_server(self):
        fds = self.server_fds()
        super().test_killed_client_frees_the_server()
        deadline = time.monotonic() + 15
        while self.server_fds() > fds:  # the arena's memfd and the connection
            self.assertLess(time.monotonic(), deadline, "the server kept the dead client's arena open")
            time.sleep(0.01)


class ShmStallTest(ServerTest):
    server_args = ["--stream-stall-timeout", "300ms"]

    def test_a_client_that_keeps_every_batch_loses_its_stream(self):
        name = self.buffer()
        self.c.extend(name, episode(0, 100), stream="s")
        fds = len(os.listdir("/proc/%d/fd" % self.server.proc.pid))
        kept = []
        with self.assertRaises(ConnectionFailed):
            with self.c.iter_samples(name, 4, transport="shm", depth=1) as it:
                for b in it:  # never dropped: the server runs out of slots
                    kept.append(b)
        self.assertEqual(len(kept), 1 + 1 + 4, "depth 1 + 1 drawn + 4 held slots")
        del kept
        deadline = time.monotonic() + 15
        while len(os.listdir("/proc/%d/fd" % self.server.proc.pid)) > fds:
            self.assertLess(time.monotonic(), deadline, "the server kept the stalled client's arena")
            time.sleep(0.01)


def _torch_view(batch):
    return torch.from_numpy(batch["observation"]) if torch is not None else None


class StreamRestartTest(unittest.TestCase):
    transport = "stream"

    def test_restart_is_a_clear_error_then_a_new_stream_works(self):
        srv = rbdserver.Server().start()
        try:
            c = Client(srv.url)
            self.addCleanup(c.close)
            c.create_buffer("b", spec(storage="memmap"))
            c.extend("b", episode(0, 30), stream="s")
            it = c.iter_samples("b", 4, transport=self.transport)
            next(it)
            addr = srv.url[len("http://"):]
            srv.stop()
            # Batches drawn before the stop arrive first; then the stream
            # ends with the server's shutdown frame, or is cut.
            with self.assertRaises((ConnectionFailed, RbdError)) as cm:
                for _ in range(100000):
                    next(it)
            e = cm.exception
            self.assertTrue(isinstance(e, ConnectionFailed) or e.code == "shutting_down", repr(e))
            srv.args = ["--addr", addr]
            srv.start()
            self.assertEqual(len(list(c.iter_samples("b", 4, batches=3, transport=self.transport))), 3)
        finally:
            srv.cleanup()


class ShmRestartTest(StreamRestartTest):
    transport = "shm"


class RateLimitTest(ServerTest):
    """A buffer's rate limiter seen from Python: refusals carry the state,
    timeouts hold requests, retries wait for the other side."""

    def limited(self, suffix="", **limit):
        name = self.id().rsplit(".", 1)[-1].replace("test_", "")[:60] + suffix
        s = spec()
        # min_diff = 1*10 - 20 = -10, max_diff = 1*10 + 20 = 30 unless given.
        s["rate_limit"] = dict({"samples_per_insert": 1, "min_size": 10, "error_buffer": 20}, **limit)
        info = self.c.create_buffer(name, s)
        self.assertEqual(info["spec"]["rate_limit"], s["rate_limit"])
        self.addCleanup(lambda: self._delete(name))
        return name

    def test_refusals_carry_the_state(self):
        name = self.limited()
        with self.assertRaises(RateLimited) as cm:
            self.c.sample(name, 2)
        e = cm.exception
        self.assertTrue(e.rate_limited)
        self.assertEqual((e.status, e.code, e.retry_after), (503, "rate_limited", 1.0))
        self.assertEqual(e.rate_limit["blocked"], "samples")
        self.assertEqual(e.rate_limit["size"], 0)
        self.c.extend(name, episode(0, 10), stream="a")
        self.c.extend(name, episode(100, 20), stream="a")
        t0 = time.monotonic()
        with self.assertRaises(RateLimited) as cm:
            self.c.extend(name, episode(200, 1), stream="a", timeout_ms=150)
        self.assertGreaterEqual(time.monotonic() - t0, 0.14)
        self.assertEqual(cm.exception.rate_limit["diff"], 30)
        self.assertEqual(cm.exception.rate_limit["blocked"], "extends")
        with self.assertRaises(BadRequest) as cm:  # more than error_buffer (20 rows): never admitted
            self.c.extend(name, episode(300, 41), stream="a", timeout_ms=5000)
        self.assertIn("send at most 20 rows", cm.exception.message)
        self.assertEqual(self.c.info(name)["rate_limit"]["inserts"], 30)

    def test_retry_waits_for_the_learner(self):
        name = self.limited()
        self.c.extend(name, episode(0, 10), stream="a")
        self.c.extend(name, episode(100, 20), stream="a")  # diff 30 = max_diff
        patient = Client(self.server.url, retry_rate_limited=20)
        self.addCleanup(patient.close)
        out = {}
        t = threading.Thread(target=lambda: out.update(patient.extend(name, episode(100, 5), stream="b")))
        t.start()
        t.join(0.3)
        self.assertTrue(t.is_alive(), "the extend is held back before any sample")
        self.c.sample(name, 8)
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertEqual(out["rows"], 5)

    def test_iter_samples_waits_for_min_size(self):
        for transport in ("requests", "stream"):
            with self.subTest(transport=transport):
                name = self.limited(suffix="-" + transport)
                with self.assertRaises(RateLimited):  # by default the refusal is handed on at once
                    list(self.c.iter_samples(name, 2, transport=transport))
                threading.Timer(0.3, lambda: self.c.extend(name, episode(0, 10), stream="w")).start()
                with self.c.iter_samples(name, 2, batches=1, retry_rate_limited=10, transport=transport) as it:
                    self.assertEqual(len(list(it)), 1)

    def test_set_rate_limit(self):
        name = self.limited()
        self.c.extend(name, episode(0, 10), stream="a")
        st = self.c.set_rate_limit(name, {"samples_per_insert": 2, "min_size": 5, "error_buffer": 10})
        self.assertEqual((st["min_diff"], st["max_diff"], st["diff"]), (0, 20, 10))
        self.assertEqual(self.c.info(name)["spec"]["rate_limit"]["samples_per_insert"], 2)
        with self.assertRaises(BadRequest) as cm:
            self.c.set_rate_limit(name, {"samples_per_insert": 2, "min_size": 5})
        self.assertIn("error_buffer", cm.exception.message)
        self.assertIsNone(self.c.set_rate_limit(name, None))
        self.assertNotIn("rate_limit", self.c.info(name))
        self.c.extend(name, episode(100, 200), stream="a")  # nothing holds it back now


class CrossCheckTest(ServerTest):
    """The client's writer decoded by the Go codec, the Go encoder read by
    the client, byte for byte, for every dtype rbd stores."""

    def test_every_dtype_through_the_server(self):
        arrays = {
            "f.bool": np.array([[True, False], [False, True], [True, True]]),
            "f.uint8": np.arange(6, dtype=np.uint8).reshape(3, 2) * 40,
            "f.int8": np.array([-128, 0, 127], np.int8),
            "f.int16": np.array([-32768, 1, 32767], np.int16),
            "f.int32": np.array([-2 ** 31, 7, 2 ** 31 - 1], np.int32),
            "f.int64": np.array([-2 ** 63, -1, 2 ** 63 - 1], np.int64),
            "f.float16": np.array([-0.0, 65504, np.inf], np.float16),
            "f.bfloat16": np.array([1.0, -2.5, 3.140625], np.float32),
            "f.float32": np.array([np.nan, -np.inf, 1e-45], np.float32),
            "f.float64": np.array([[np.pi], [-0.0], [5e-324]]),
            "next.done": np.array([False, False, True]),
        }
        fields = {k: {"dtype": ("bfloat16" if k == "f.bfloat16" else
                                safetensors.rbd_dtype(v) if k != "next.done" else "bool"),
                      "shape": list(v.shape[1:])} for k, v in arrays.items()}
        name = "dtypes"
        self.c.create_buffer(name, {"capacity": 8, "storage": "memory", "fields": fields})
        self.addCleanup(self._delete, name)
        self.c.extend(name, arrays, stream="x")
        # Read back: Go's encoder, the client's decoder.
        _, _, raw = self.c._request("GET", self.c._path("v1", "buffers", name, "rows", query={"count": 10}),
                                    headers={"Accept": "application/octet-stream"})
        rows, meta = safetensors.loads(raw, bfloat16="bits")
        for k, v in arrays.items():
            want = safetensors.to_bfloat16_bits(v) if k == "f.bfloat16" else v
            np.testing.assert_array_equal(rows[k], want, k)
            self.assertEqual(rows[k].dtype, want.dtype, k)
        # The client's encoder lays the same tensors out byte for byte as Go did.
        dtypes = {k: "bfloat16" for k in rows if k == "f.bfloat16"}
        self.assertEqual(safetensors.dumps(rows, meta, dtypes), bytes(raw))
        # And the JSON answer agrees with the binary one.
        js = self.c._json("GET", self.c._path("v1", "buffers", name, "rows", query={"count": 10}))
        np.testing.assert_array_equal(np.array(js["f.int64"], dtype=np.int64), arrays["f.int64"])
        self.assertEqual(js["f.float32"][:2], ["NaN", "-Infinity"])

    def test_sample_answer_layout(self):
        name = self.buffer(priority=True)
        self.c.extend(name, episode(0, 30), stream="s")
        _, _, raw = self.c._request("POST", self.c._path("v1", "buffers", name, "sample"),
                                    b'{"batch_size": 5, "sampler": "without_replacement", "seed": 1}',
                                    {"Accept": "application/octet-stream"})
        t, meta = safetensors.loads(raw)
        self.assertEqual(meta, {"epoch": "0", "epoch_end": "false"})
        self.assertEqual(safetensors.dumps(t, meta), bytes(raw))


class TokenTest(ServerTest):
    token = "s3cret"

    def test_token(self):
        with Client(self.server.url) as anon, Client(self.server.url, token="wrong") as wrong:
            self.assertEqual(anon.health()["status"], "ok")  # health needs no token
            with self.assertRaises(Unauthorized) as cm:
                anon.buffers()
            self.assertEqual(cm.exception.status, 401)
            with self.assertRaises(Unauthorized):
                wrong.buffers()
        self.assertIsInstance(self.c.buffers(), list)


class RestartTest(unittest.TestCase):
    def test_reconnects_after_the_server_restarts(self):
        srv = rbdserver.Server().start()
        try:
            c = Client(srv.url)
            self.addCleanup(c.close)
            c.create_buffer("b", spec(storage="memmap"))
            c.extend("b", episode(0, 3), stream="s")
            addr = srv.url[len("http://"):]
            srv.stop()
            srv.args = ["--addr", addr]  # the same port: the old keep-alive connection is dead
            srv.start()
            self.assertEqual(c.info("b")["size"], 3)  # memmap rows survive a restart
            self.assertEqual(c.connections_opened, 2)
        finally:
            srv.cleanup()


class DemoTest(ServerTest):
    server_args = ["--demo", "--demo-rate", "20000"]

    def test_demo_weights(self):
        rbdserver.wait_for_rows(self.c, "demo", 256)
        info = self.c.info("demo")
        self.assertTrue(info["spec"]["compact_obs"])
        before = self.c.collector("demo")
        self.assertEqual((before["policy"], before["env"], before["buffer"]), ("linear", "cartpole", "demo"))
        res = self.c.set_weights("demo", {"w": np.ones((4, 2)), "b": [0.0, 1.0]})
        self.assertEqual(res, {"collector": "demo", "updated": True,
                               "weights_version": before["weights_version"] + 1})
        # The learner's layout: an MLP of any hidden width, with epsilon.
        rng = np.random.default_rng(0)
        self.c.set_weights("demo", {"w1": rng.standard_normal((4, 16)), "b1": np.zeros(16),
                                    "w2": rng.standard_normal((16, 2)), "b2": np.zeros(2), "epsilon": 0.25})
        info = self.c.collector("demo")
        self.assertEqual((info["policy"], info["hidden"], info["epsilon"]), ("mlp", 16, 0.25))
        self.c.set_weights("demo", {"epsilon": 0.5})  # exploration alone keeps the network
        info = self.c.collector("demo")
        self.assertEqual((info["policy"], info["hidden"], info["epsilon"]), ("mlp", 16, 0.5))
        self.assertEqual(info["weights_version"], before["weights_version"] + 3)
        with self.assertRaises(BadRequest) as cm:
            self.c.set_weights("demo", {"epsilon": 1.5})
        self.assertIn("epsilon", cm.exception.message)
        with self.assertRaises(NotFound):
            self.c.collector("other")
        with self.assertRaises(BadRequest) as cm:
            self.c.set_weights("demo", {"w": np.ones((2, 4)), "b": np.zeros(2)})
        self.assertIn("w: shape [2 4], want [4 2]", cm.exception.message)
        with self.assertRaises(NotFound):
            self.c.set_weights("other", {"w": np.ones((4, 2)), "b": np.zeros(2)})
        b = self.c.sample("demo", 32, sampler="prioritized", n_step={"n": 3, "gamma": 0.99})
        self.assertEqual(b["next.observation"].shape, (32, 4))
        self.assertTrue((b["steps_to_next_obs"] >= 1).all() and (b["steps_to_next_obs"] <= 3).all())


if __name__ == "__main__":
    unittest.main()
