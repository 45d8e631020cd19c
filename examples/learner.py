"""A DQN-style learner on `rbd serve --demo`, in numpy, that teaches the
demo collector to balance CartPole.

    rbd serve --demo --demo-spi 16 &
    python3 examples/learner.py --url http://127.0.0.1:7450

It trains a small MLP Q-function on the demo buffer's CartPole steps with
  - prioritized sampling (rbd's sum tree; importance weights in "weight"),
  - n-step targets computed by rbd at sample time ("next.reward" is the
    n-step return, "gamma" = gamma^k, "next.observation" the observation k
    steps later, "next.terminated" that of the window's last step),
  - priority updates with |TD error| for the sampled seqs,
  - a target network (soft updates), Adam, Huber loss,
  - background prefetch of the next batch while this one trains,
and every --push-every steps sends its network and an exploration rate
(epsilon, decayed from --eps-start to --eps-end) to the demo collector
(PUT /v1/collectors/demo/weights). The collector then acts with what the
learner learned, so the data gets better as the network does: the
actor-learner loop closes. Every --log-every steps it prints the loss, the
sample throughput and the collector's mean episode length over its last 100
episodes (GET /v1/collectors/demo); it stops once that reaches
--target-length (195: CartPole "solved") or after --steps steps.
--check-length exits 1 unless the target was reached.

With `--demo-spi N` the server's rate limiter keeps N sampled rows per
inserted row: the collector waits for the learner, so the ratio of learning
to experience is the same on a fast machine and a slow one. Without it the
collector runs at --demo-rate and the learner at its own speed.

--check exits 1 unless the mean loss of the last 20% of steps is below that
of the first 20%; that only means something without pushes (--push-every
0), since a policy that improves makes longer episodes and larger values.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from rbd_client import Client, NotFound  # noqa: E402  (the checkout's client if not installed)


class MLP:
    """Q(o) = relu(o @ W1 + b1) @ W2 + b2, float32."""

    def __init__(self, rng, n_in, hidden, n_out):
        self.params = [
            (rng.standard_normal((n_in, hidden)) * np.sqrt(2 / n_in)).astype(np.float32),
            np.zeros(hidden, np.float32),
            (rng.standard_normal((hidden, n_out)) * np.sqrt(1 / hidden)).astype(np.float32),
            np.zeros(n_out, np.float32)]

    def copy(self):
        c = MLP.__new__(MLP)
        c.params = [p.copy() for p in self.params]
        return c

    def soft_update(self, other, tau):
        for p, o in zip(self.params, other.params):
            p += tau * (o - p)

    def forward(self, x):
        W1, b1, W2, b2 = self.params
        h = np.maximum(x @ W1 + b1, 0)
        return h @ W2 + b2, (x, h)

    def backward(self, cache, g):
        """Gradients of sum(g * Q) with respect to the parameters."""
        x, h = cache
        W1, b1, W2, b2 = self.params
        gh = (g @ W2.T) * (h > 0)
        return [x.T @ gh, gh.sum(axis=0), h.T @ g, g.sum(axis=0)]


class Adam:
    """Adam; with ``clip``, gradients are first scaled to a global norm of
    at most ``clip`` (examples/r2d2.py's backpropagation through time)."""

    def __init__(self, params, lr, clip=None):
        self.lr, self.t, self.clip = lr, 0, clip
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, params, grads, b1=0.9, b2=0.999, eps=1e-8):
        if self.clip is not None:
            norm = np.sqrt(sum(float((g * g).sum()) for g in grads))
            grads = [g * min(1.0, self.clip / (norm + 1e-12)) for g in grads]
        self.t += 1
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= self.lr * (m / (1 - b1 ** self.t)) / (np.sqrt(v / (1 - b2 ** self.t)) + eps)


def huber(x, delta=1.0):
    a = np.abs(x)
    return np.where(a <= delta, 0.5 * x * x, delta * (a - 0.5 * delta)), np.clip(x, -delta, delta)


def timed(batches, waited):
    """Yield from batches, adding the seconds each next() took to waited[0]:
    the time the learner waits for rbd rather than computes."""
    it = iter(batches)
    while True:
        t = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            return
        waited[0] += time.perf_counter() - t
        yield b


def push(client, collector, q_net, epsilon):
    """Send q_net and the exploration rate to the collector; returns the
    collector name, or "" if the server runs none (not started with --demo)."""
    W1, b1, W2, b2 = q_net.params
    try:
        client.set_weights(collector, {"w1": W1, "b1": b1, "w2": W2, "b2": b2, "epsilon": np.float32(epsilon)})
    except NotFound:
        print("no collector %r on this server: weights not pushed" % collector)
        return ""
    return collector


def collector_length(client, collector):
    """The collector's mean episode length over its last 100 episodes."""
    return client.collector(collector)["mean_episode_length"] if collector else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7450")
    p.add_argument("--token", default=os.environ.get("RBD_TOKEN"))
    p.add_argument("--buffer", default="demo")
    p.add_argument("--collector", default="demo", help="collector to push weights to ('' for none)")
    p.add_argument("--steps", type=int, default=20000, help="stop after this many steps at most")
    p.add_argument("--target-length", type=float, default=195,
                   help="stop once the collector's mean episode length reaches this (0: never)")
    p.add_argument("--check-length", action="store_true", help="exit 1 unless --target-length was reached")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--beta", type=float, default=0.4)
    p.add_argument("--tau", type=float, default=0.01, help="target network: soft update rate per step")
    p.add_argument("--push-every", type=int, default=50, help="push weights every N steps (0: at the end only)")
    p.add_argument("--eps-start", type=float, default=1.0, help="collector exploration rate at the first push")
    p.add_argument("--eps-end", type=float, default=0.02, help="... decayed linearly to this")
    p.add_argument("--eps-steps", type=int, default=1000, help="... over this many steps")
    p.add_argument("--after", type=float, default=2.0, help="seconds to watch the collector after the final push")
    p.add_argument("--min-rows", type=int, default=2000,
                   help="wait for this many rows first (unless the buffer has a rate limit: its min_size holds)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="exit 1 unless the loss went down")
    a = p.parse_args(argv)

    # A rate-limited buffer holds samples back while the collector catches
    # up: wait for it (Retry-After) rather than fail.
    client = Client(a.url, token=a.token, retry_rate_limited=60)
    # Without a rate limit, wait for --min-rows rows; with one, its
    # min_size holds the first samples back and the collector may be held
    # back before --min-rows.
    deadline = time.monotonic() + 60
    while "rate_limit" not in client.info(a.buffer) and client.info(a.buffer)["size"] < a.min_rows:
        if time.monotonic() > deadline:
            sys.exit("buffer %s has fewer than %d rows after 60s" % (a.buffer, a.min_rows))
        time.sleep(0.1)

    rng = np.random.default_rng(a.seed)
    q_net = MLP(rng, 4, a.hidden, 2)
    target = q_net.copy()
    opt = Adam(q_net.params, a.lr)
    losses, rows, stale = [], 0, 0
    length0 = collector_length(client, a.collector) if a.collector else float("nan")
    if a.collector:
        print("collector %s: mean episode length %.1f before training" % (a.collector, length0), flush=True)
    reached = None
    t0 = t_log = time.perf_counter()
    batches = client.iter_samples(a.buffer, a.batch, "prioritized", depth=2, batches=a.steps,
                                  n_step={"n": a.n_step, "gamma": a.gamma}, beta=a.beta, seed=a.seed,
                                  timeout_ms=2000,
                                  keys=["observation", "action", "next.reward", "next.terminated",
                                        "next.observation"])
    waited = [0.0]  # seconds the loop spent waiting for rbd's next batch
    with batches:
        for step, bt in enumerate(timed(batches, waited), 1):
            obs, act = bt["observation"], bt["action"]
            n = len(act)
            # Bootstrap from the observation k steps ahead unless the episode
            # terminated in the window (a truncation still bootstraps).
            q_next = target.forward(bt["next.observation"])[0]
            y = bt["next.reward"] + bt["gamma"] * ~bt["next.terminated"] * q_next.max(axis=1)
            q, cache = q_net.forward(obs)
            td = q[np.arange(n), act] - y
            loss_i, dloss = huber(td)
            # Importance weights undo the bias of prioritized draws: the
            # gradient uses w / max(w) (as in the PER paper), the reported
            # loss the self-normalised estimate of the mean loss under
            # uniform draws, which stays comparable while priorities change.
            w = bt["weight"]
            losses.append(float(np.sum(w * loss_i) / np.sum(w)))
            g = np.zeros((n, 2), np.float32)
            g[np.arange(n), act] = (w / w.max()) * dloss / n
            opt.step(q_net.params, q_net.backward(cache, g))
            target.soft_update(q_net, a.tau)
            res = client.update_priorities(a.buffer, bt["seq"], np.abs(td) + 1e-3)
            stale += res["stale"]
            rows += n
            eps = a.eps_end + (a.eps_start - a.eps_end) * max(0.0, 1 - step / max(1, a.eps_steps))
            if a.collector and a.push_every and step % a.push_every == 0:
                a.collector = push(client, a.collector, q_net, eps)
            if step % a.log_every == 0:
                now = time.perf_counter()
                length = collector_length(client, a.collector)
                print("step %5d  loss %.4f  mean Q %6.2f  %4.0f batches/s  %6.0f rows/s  epsilon %.2f  "
                      "collector episode length %.1f"
                      % (step, np.mean(losses[-a.log_every:]), q.mean(), a.log_every / (now - t_log),
                         a.log_every * n / (now - t_log), eps, length), flush=True)
                t_log = now
                if a.target_length and length >= a.target_length and eps <= a.eps_end:
                    reached = (step, now - t0, length)
                    break
    dt = time.perf_counter() - t0
    k = max(1, len(losses) // 5)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    print("%d steps in %.1fs: %.0f batches/s, %.0f rows/s sampled, trained and re-prioritised (%d stale updates)"
          % (len(losses), dt, len(losses) / dt, rows / dt, stale))
    print("waited for rbd: %.1f%% of the time (%.2fs; transport %s)"
          % (100 * waited[0] / dt, waited[0], batches.transport))
    print("loss: first 20%% %.4f, last 20%% %.4f: %s%s" % (
        first, last, "down" if last < first else "NOT down",
        " (the pushed policy kept changing the data: longer episodes, larger values and TD errors)"
        if a.collector and a.push_every else ""))
    if a.collector:
        if push(client, a.collector, q_net, a.eps_end):
            time.sleep(a.after)
            print("demo collector episodes: mean length %.1f before training, %.1f after"
                  % (length0, collector_length(client, a.collector)))
    if reached:
        print("solved: the collector's mean episode length reached %.1f (target %g) after %d steps, %.0fs"
              % (reached[2], a.target_length, reached[0], reached[1]))
    elif a.target_length and a.collector:
        print("not solved: the collector's mean episode length stayed below %g" % a.target_length)
    client.close()
    if a.check and not last < first:
        sys.exit(1)
    if a.check_length and not reached:
        sys.exit(1)


if __name__ == "__main__":
    main()
