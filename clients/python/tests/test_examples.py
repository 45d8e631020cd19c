"""examples/actor.py, examples/learner.py and examples/r2d2.py against a
real `rbd serve`."""

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


def load_example(name):
    spec = importlib.util.spec_from_file_location(name.replace(".py", "_example"), os.path.join(EXAMPLES, name))
    mod = importlib.util.module_from_spec(spec)
    dont, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no examples/__pycache__
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = dont
    return mod


class ActorTest(unittest.TestCase):
    def test_actor_writes_exact_transitions(self):
        actor = load_example("actor.py")
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
        self.assertRegex(out, r"waited for rbd: [\d.]+% of the time \([\d.]+s; transport shm\)")  # the server is on this machine

    def test_learner_teaches_the_collector(self):
        # The loop closed: pushed networks make the collector's CartPole
        # episodes last from about 10 steps to CartPole's "solved" 195, with
        # the rate limiter pacing the collector to the learner.
        with rbdserver.Server(["--demo", "--demo-spi", "16", "--demo-seed", "1"]) as srv:
            out = run_example("learner.py", "--url", srv.url, "--steps", "15000", "--log-every", "250",
                              "--after", "1", "--seed", "1", "--check-length", timeout=400)
            info = Client(srv.url).collector("demo")
            limit = Client(srv.url).info("demo")["rate_limit"]
        m = re.search(r"collector demo: mean episode length ([\d.]+) before training", out)
        self.assertIsNotNone(m, out)
        self.assertLess(float(m.group(1)), 30, out)
        m = re.search(r"solved: the collector's mean episode length reached ([\d.]+)", out)
        self.assertIsNotNone(m, out)
        self.assertGreaterEqual(float(m.group(1)), 195, out)
        self.assertEqual(info["policy"], "mlp")
        self.assertEqual(info["hidden"], 64)
        self.assertGreater(info["weights_version"], 1)
        # Which side waits depends on which is faster on this machine: the
        # collector (its writes held back) or the learner (its stream's
        # draws held back).
        self.assertGreater(info["rate_limit_wait_seconds"] + limit["sample_wait_seconds"], 0,
                           "the rate limiter paced one side to the other")



class R2D2Test(unittest.TestCase):
    def test_gru_gradients(self):
        # Backpropagation through time against finite differences, in
        # float64, over an unroll whose first steps get no loss (a burn-in).
        r2d2 = load_example("r2d2.py")
        rng = np.random.default_rng(0)
        g = r2d2.GRUQ(rng, 2, 5)
        g.params = [p.astype(np.float64) for p in g.params]
        xs, h0 = rng.standard_normal((3, 6, 2)), 0.5 * rng.standard_normal((3, 5))
        gq = rng.standard_normal((3, 6, 2))
        gq[:, :2] = 0

        def loss():
            return float((g.unroll(xs, h0)[1] * gq).sum())

        grads = g.backward(g.unroll(xs, h0)[2], gq)
        for name, p, grad in zip(r2d2.GRUQ.names, g.params, grads):
            num = np.zeros_like(p)
            for i in np.ndindex(p.shape):
                old = p[i]
                p[i] = old + 1e-6
                up = loss()
                p[i] = old - 1e-6
                num[i] = (up - loss()) / 2e-6
                p[i] = old
            np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-6, err_msg=name)

    def test_eval_env_is_the_servers(self):
        # The learner's numpy masked CartPole follows the Go env: the same
        # start state and pushes give the same positions and ends.
        r2d2 = load_example("r2d2.py")
        env = r2d2.MaskedCartPole(np.random.default_rng(0), 1)
        env.s[:] = [0.0, 0.0, 0.1, 0.0]
        env.step(np.array([1]))
        # One step worked by hand (collector/envs/cartpole_test.go).
        sin, cos = np.sin(0.1), np.cos(0.1)
        th_acc = (9.8 * sin - cos * 10 / 1.1) / (0.5 * (4 / 3 - 0.1 * cos * cos / 1.1))
        np.testing.assert_allclose(env.s[0], [0, 0.02 * (10 / 1.1 - 0.05 * th_acc * cos / 1.1), 0.1, 0.02 * th_acc])
        for _ in range(200):
            env.step(np.array([1]))
        self.assertFalse(env.alive[0], "always pushing right ends the episode")
        self.assertLess(env.length[0], 50)

    def test_recurrent_learner_beats_feed_forward(self):
        # On masked CartPole the GRU learner, trained on slices from rbd,
        # teaches the collector to balance; the MLP trained on the same
        # samples cannot tell which way the pole moves and stays short.
        with rbdserver.Server(["--demo", "--demo-env", "cartpole-masked", "--demo-spi", "8", "--demo-seed", "1"]) as srv:
            out = run_example("r2d2.py", "--url", srv.url, "--steps", "3000", "--eval-every", "250", "--seed", "1",
                              "--target-length", "200",
                              "--check", timeout=300)
            with Client(srv.url) as c:
                info = c.collector("demo")
        m = re.search(r"best greedy episode length: GRU ([\d.]+), MLP ([\d.]+)", out)
        self.assertIsNotNone(m, out)
        gru, mlp = float(m.group(1)), float(m.group(2))
        self.assertGreaterEqual(gru, 150, out)
        self.assertGreaterEqual(gru, 2 * mlp, out)
        self.assertRegex(out, r"curve \(step, GRU, MLP\): (\d+:\d+/\d+ ?)+")
        self.assertRegex(out, r"[1-9]\d* recurrent states written back")
        self.assertEqual(info["policy"], "gru")
        self.assertEqual(info["env"], "cartpole-masked")
        self.assertGreater(info["weights_version"], 1)


if __name__ == "__main__":
    unittest.main()
