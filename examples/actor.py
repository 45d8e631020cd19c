"""A gym-style actor: several CartPole envs per actor, written into rbd.

    python3 examples/actor.py --url http://127.0.0.1:7450 --buffer cartpole \
        --actors 2 --envs 4 --steps 20000

Each actor (a thread here; a process or a machine in real life) names its
own stream and tags each row with its env index, so rbd keeps the envs'
trajectories apart however their steps interleave. The buffer is compact:
observations are sent once, and next.observation only for done rows (the
final observation), so rbd rebuilds every next observation exactly, at
terminations and at the time limit (truncations) alike.

The CartPole below is gym's CartPole-v1 in numpy, vectorised over envs,
in float32 so that each transition is a pure function of (observation,
action): the test recomputes every stored next observation with step().
"""

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from rbd_client import Client  # noqa: E402  (the checkout's client if not installed)

# --- CartPole-v1 (gym classic_control/cartpole.py, Euler integration) --------
GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_LIMIT = 12 * 2 * np.pi / 360
X_LIMIT = 2.4
MAX_STEPS = 500  # CartPole-v1's time limit: a truncation, not a termination


def step(obs, action):
    """Next observations [N, 4] and terminated flags [N] for obs [N, 4], actions [N]."""
    f = np.float32
    x, x_dot, theta, theta_dot = (obs[:, i].astype(f) for i in range(4))
    force = np.where(np.asarray(action) == 1, f(FORCE_MAG), f(-FORCE_MAG)).astype(f)
    cos, sin = np.cos(theta), np.sin(theta)
    temp = (force + f(POLEMASS_LENGTH) * theta_dot * theta_dot * sin) / f(TOTAL_MASS)
    theta_acc = (f(GRAVITY) * sin - cos * temp) / (
        f(LENGTH) * (f(4.0 / 3.0) - f(MASSPOLE) * cos * cos / f(TOTAL_MASS)))
    x_acc = temp - f(POLEMASS_LENGTH) * theta_acc * cos / f(TOTAL_MASS)
    nxt = np.stack([x + f(TAU) * x_dot, x_dot + f(TAU) * x_acc,
                    theta + f(TAU) * theta_dot, theta_dot + f(TAU) * theta_acc], axis=1).astype(f)
    terminated = (np.abs(nxt[:, 0]) > X_LIMIT) | (np.abs(nxt[:, 2]) > THETA_LIMIT)
    return nxt, terminated


class VecCartPole:
    """n CartPole envs stepped together. step() returns the true next
    observations (the final one where an env is done); reset_done() then
    starts new episodes there."""

    def __init__(self, n, seed):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.obs = self.rng.uniform(-0.05, 0.05, (n, 4)).astype(np.float32)
        self.t = np.zeros(n, np.int64)

    def step(self, actions):
        nxt, terminated = step(self.obs, actions)
        self.t += 1
        truncated = (self.t >= MAX_STEPS) & ~terminated
        self.obs = nxt
        return nxt.copy(), np.ones(self.n, np.float32), terminated, truncated

    def reset_done(self, done):
        k = int(done.sum())
        if k:
            self.obs[done] = self.rng.uniform(-0.05, 0.05, (k, 4)).astype(np.float32)
            self.t[done] = 0
        return self.obs.copy()


# --- the buffer -----------------------------------------------------------------
def cartpole_spec(capacity, storage="memory"):
    return {
        "capacity": capacity, "storage": storage,
        "fields": {"observation": {"dtype": "float32", "shape": [4]},
                   "action": {"dtype": "int64", "shape": []},
                   "next.reward": {"dtype": "float32", "shape": []},
                   "next.done": {"dtype": "bool", "shape": []},
                   "next.terminated": {"dtype": "bool", "shape": []},
                   "next.truncated": {"dtype": "bool", "shape": []}},
        "compact_obs": True, "obs_keys": ["observation"],
    }


def run_actor(client, buffer, stream, n_envs, steps, ticks_per_write, seed, epsilon, stats):
    """Step n_envs envs for `steps` env steps in total, writing every
    ticks_per_write ticks (ticks_per_write * n_envs rows per request)."""
    env = VecCartPole(n_envs, seed)
    rng = np.random.default_rng(seed + 1)
    obs = env.obs.copy()
    env_ids = np.arange(n_envs, dtype=np.int64)
    done_steps = episodes = 0
    rows = []
    while done_steps < steps:
        # A stand-in policy: push the pole back up, with epsilon exploration.
        greedy = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
        action = np.where(rng.random(n_envs) < epsilon, rng.integers(0, 2, n_envs), greedy)
        nxt, reward, terminated, truncated = env.step(action)
        done = terminated | truncated
        rows.append({"observation": obs, "action": action, "next.reward": reward,
                     "next.done": done, "next.terminated": terminated, "next.truncated": truncated,
                     "env": env_ids, "final": nxt[done]})
        episodes += int(done.sum())
        done_steps += n_envs
        obs = env.reset_done(done)
        if len(rows) == ticks_per_write or done_steps >= steps:
            batch = {k: np.concatenate([r[k] for r in rows]) for k in rows[0] if k != "final"}
            # Final observations: one per done row, in row order ([D, 4]).
            batch["next.observation"] = np.concatenate([r["final"] for r in rows])
            client.extend(buffer, batch, stream=stream)
            rows = []
    # The envs stop mid-episode: closing the stream marks those trajectories
    # truncated (their last rows have no known next observation).
    client.close_stream(buffer, stream)
    with stats["lock"]:
        stats["steps"] += done_steps
        stats["episodes"] += episodes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7450")
    p.add_argument("--token", default=os.environ.get("RBD_TOKEN"))
    p.add_argument("--buffer", default="cartpole")
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--storage", default="memory", choices=["memory", "memmap"])
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--envs", type=int, default=4, help="envs per actor")
    p.add_argument("--steps", type=int, default=20_000, help="env steps per actor")
    p.add_argument("--ticks-per-write", type=int, default=64)
    p.add_argument("--epsilon", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    client = Client(a.url, token=a.token)
    client.create_buffer(a.buffer, cartpole_spec(a.capacity, a.storage))
    stats = {"lock": threading.Lock(), "steps": 0, "episodes": 0}
    errors = []

    def actor(i):
        try:
            run_actor(client, a.buffer, "actor-%d" % i, a.envs, a.steps, a.ticks_per_write,
                      a.seed + 1000 * i, a.epsilon, stats)
        except Exception as e:  # reported below
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=actor, args=(i,)) for i in range(a.actors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    info = client.info(a.buffer)
    print("wrote %d steps (%d episodes) from %d actors x %d envs in %.2fs: %.0f rows/s"
          % (stats["steps"], stats["episodes"], a.actors, a.envs, dt, stats["steps"] / dt))
    print("buffer %s: %d live rows, write_count %d, %d trajectories (%d open)"
          % (a.buffer, info["size"], info["write_count"], info["trajectories"], info["open_trajectories"]))
    client.close()


if __name__ == "__main__":
    main()
