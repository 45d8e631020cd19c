"""examples/actor.py and examples/learner.py against a real `rbd serve`."""

import importlib.util
import os
import re
import subprocess
import sys
import unittest

import numpy as np

import rbdserver  # first: puts the checkout's rbd_client on the path if needed
from rbd_client import Client

EXAMPLES = os.path.join(rbdserver.ROOT, "examples")


def run_example(name, *args, timeout=120):
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)] + list(args),
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("%s %s exited %d:\n%s\n%s" % (name, " ".join(args), p.returncode, p.stdout, p.stderr))
    return p.stdout


def load_actor():
    spec = importlib.util.spec_from_file_location("actor_example", os.path.join(EXAMPLES, "actor.py"))
    mod = importlib.util.module_from_spec(spec)
    dont, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no examples/__pycache__
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = dont
    return mod


class ActorTest(unittest.TestCase):
    def test_actor_writes_exact_transitions(self):
        actor = load_actor()
        with rbdserver.Server() as srv, Client(srv.url) as c:
            out = run_example("actor.py", "--url", srv.url, "--buffer", "cp", "--actors", "2", "--envs", "3",
                              "--steps", "3000", "--ticks-per-write", "50", "--seed", "3")
            self.assertIn("wrote 6000 steps", out)
            info = c.info("cp")
            self.assertEqual((info["size"], info["write_count"]), (6000, 6000))
            self.assertEqual(info["open_trajectories"], 0, "the actors closed their streams")
            # Every row whose next observation is known, once.
            b = c.sample("cp", 6000, sampler="without_replacement", consumer="check")
            n = len(b["seq"])
            # Not eligible: the last row of each env's unfinished episode (at
            # most 2 actors x 3 envs): not done, and no next row.
            rows = list(c.iter_rows("cp"))
            cut = sum(int(((r["next_seq"] == -1) & ~r["next.done"]).sum()) for r in rows)
            self.assertLessEqual(cut, 6)
            self.assertEqual(n, 6000 - cut)
            # Each next observation is the physics of (observation, action),
            # also on done rows: the final observation, never a reset frame.
            want, terminated = actor.step(b["observation"], b["action"])
            np.testing.assert_array_equal(b["next.observation"], want)
            np.testing.assert_array_equal(b["next.terminated"], terminated)
            done = b["next.done"]
            self.assertGreater(done.sum(), 5)
            self.assertTrue(b["next.truncated"].any(), "some episodes reach the 500-step limit")
            np.testing.assert_array_equal(done, b["next.terminated"] | b["next.truncated"])
            # Trajectories are per (stream, env): slices follow one episode.
            s = c.sample("cp", sampler="slice", num_slices=16, slice_len=32, seed=1)
            np.testing.assert_array_equal(np.diff(s["step"], axis=1), 1)
            self.assertTrue((s["traj_id"] == s["traj_id"][:, :1]).all())
            np.testing.assert_array_equal(s["next.observation"][:, :-1], s["observation"][:, 1:])


class LearnerTest(unittest.TestCase):
    def test_learner_loss_goes_down(self):
        # Without pushes the data's policy stays fixed, so the loss measures
        # how well the network fits it.
        with rbdserver.Server(["--demo", "--demo-rate", "20000"]) as srv:
            out = run_example("learner.py", "--url", srv.url, "--steps", "600", "--log-every", "200",
                              "--push-every", "0", "--target-length", "0",
                              "--min-rows", "4000", "--after", "1", "--seed", "1", "--check")
        m = re.search(r"loss: first 20% ([\d.]+), last 20% ([\d.]+): down", out)
        self.assertIsNotNone(m, out)
        first, last = float(m.group(1)), float(m.group(2))
        self.assertLess(last, first, out)
        self.assertRegex(out, r"step +600 +loss [\d.]+ .* batches/s +\d+ rows/s .*collector episode length [\d.]+")
        self.assertIn("demo collector episodes: mean length", out)

    def test_learner_teaches_the_collector(self):
        # The loop closed: pushed networks make the collector's CartPole
        # episodes last from about 10 steps to CartPole's "solved" 195, with
        # the rate limiter pacing the collector to the learner.
        with rbdserver.Server(["--demo", "--demo-spi", "16", "--demo-seed", "1"]) as srv:
            out = run_example("learner.py", "--url", srv.url, "--steps", "15000", "--log-every", "250",
                              "--after", "1", "--seed", "1", "--check-length", timeout=400)
            info = Client(srv.url).collector("demo")
        m = re.search(r"collector demo: mean episode length ([\d.]+) before training", out)
        self.assertIsNotNone(m, out)
        self.assertLess(float(m.group(1)), 30, out)
        m = re.search(r"solved: the collector's mean episode length reached ([\d.]+)", out)
        self.assertIsNotNone(m, out)
        self.assertGreaterEqual(float(m.group(1)), 195, out)
        self.assertEqual(info["policy"], "mlp")
        self.assertEqual(info["hidden"], 64)
        self.assertGreater(info["weights_version"], 1)
        self.assertGreater(info["rate_limit_wait_seconds"], 0, "the rate limiter paced the collector")


if __name__ == "__main__":
    unittest.main()
