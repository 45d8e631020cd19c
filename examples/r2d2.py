"""An R2D2-style recurrent learner on `rbd serve --demo --demo-env
cartpole-masked`, in numpy: it teaches the demo collector to balance a
CartPole whose observations hold positions only (x, theta), where a policy
must remember earlier steps to know which way the pole moves.

    rbd serve --demo --demo-env cartpole-masked --demo-spi 8 &
    python3 examples/r2d2.py --url http://127.0.0.1:7450

Each step it samples prioritized slices of stored sequences and trains a
GRU Q-network (the layout the demo collector runs, docs/recurrent.md):
  - every slice starts from the recurrent state stored with its first row
    (the state the collector's GRU had there), runs --burn-in steps without
    learning (so the state moves towards what the current network would
    compute: the stored one may come from older weights), then learns on the
    remaining steps by backpropagation through time;
  - n-step targets come from rbd ("next.reward" is the n-step return,
    "gamma" = gamma^k, "steps_to_next_obs" = k); the bootstrap value is the
    target network's Q at step t+k of the same slice (positions whose window
    leaves the slice without the episode ending are left out);
  - priorities: each learned row gets |TD error|, each slice's first row
    the sequence priority 0.9 max + 0.1 mean (what draws the slice);
  - the states the learner computed are written back to the buffer
    (POST .../update, --write-back) so later slices start from fresher ones;
  - every --push-every steps the GRU and an exploration rate go to the demo
    collector (PUT /v1/collectors/demo/weights).

Next to it, on exactly the same samples and targets, a feed-forward MLP
Q-network learns from single observations (what a non-recurrent DQN sees).
Every --eval-every steps both greedy policies play --eval-episodes episodes
of masked CartPole here in numpy, and both curves are printed: the GRU's
episodes get long, the MLP's stay short. --check exits 1 unless the GRU's
best evaluation is at least --check-ratio times the MLP's best and at least
--check-length steps (best, not last: Q-learning on CartPole forgets now
and then, and "how far each got" is the comparison).
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
sys.path.insert(0, HERE)
from rbd_client import Client  # noqa: E402  (the checkout's client if not installed)
from learner import MLP, Adam, huber  # noqa: E402  (examples/learner.py: the feed-forward baseline's pieces)

ACTIONS = 2
# Both networks see observations scaled to about [-1, 1] (x by its limit
# 2.4, theta by its 12 degrees): the pole's angle moves by thousandths of a
# radian per step, too little for a freshly initialised GRU to notice. The
# collector gets the raw observations, so the scale is folded into w_ih when
# the GRU is pushed (x * s @ W == x @ (s[:, None] * W)).
OBS_SCALE = np.array([1 / 2.4, 1 / 0.2095], np.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


class GRUQ:
    """h' = GRU(x, h) with PyTorch's gates (r, z, n), Q = h' @ Wq + bq.
    Matrices are [inputs, outputs] as the demo collector takes them."""

    names = ["w_ih", "w_hh", "b_ih", "b_hh", "w_q", "b_q"]

    def __init__(self, rng, n_in, hidden):
        k = 1 / np.sqrt(hidden)
        u = lambda *s: rng.uniform(-k, k, s).astype(np.float32)  # noqa: E731
        self.H = hidden
        self.params = [u(n_in, 3 * hidden), u(hidden, 3 * hidden), u(3 * hidden), u(3 * hidden),
                       (rng.standard_normal((hidden, ACTIONS)) * np.sqrt(1 / hidden)).astype(np.float32),
                       np.zeros(ACTIONS, np.float32)]

    def copy(self):
        c = GRUQ.__new__(GRUQ)
        c.H, c.params = self.H, [p.copy() for p in self.params]
        return c

    def step(self, x, h):
        """One step for a batch: the new state and Q, plus what backward needs."""
        w_ih, w_hh, b_ih, b_hh, w_q, b_q = self.params
        H = self.H
        gi, gh = x @ w_ih + b_ih, h @ w_hh + b_hh
        r = sigmoid(gi[:, :H] + gh[:, :H])
        z = sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h2 = ((1 - z) * n + z * h).astype(h.dtype, copy=False)
        return h2, h2 @ w_q + b_q, (x, h, r, z, n, gh, h2)

    def unroll(self, xs, h):
        """xs [B, T, D] from states h [B, H]: states before each step
        [B, T, H], Q after each step [B, T, A] and the caches."""
        hs, qs, caches = [], [], []
        for t in range(xs.shape[1]):
            hs.append(h)
            h, q, c = self.step(xs[:, t], h)
            qs.append(q)
            caches.append(c)
        return np.stack(hs, 1), np.stack(qs, 1), caches

    def backward(self, caches, gq):
        """Gradients of sum(gq * Q) over the unrolled steps (backpropagation
        through time; nothing flows into the first state)."""
        w_ih, w_hh, b_ih, b_hh, w_q, b_q = self.params
        H = self.H
        grads = [np.zeros_like(p) for p in self.params]
        dh = np.zeros((gq.shape[0], H), np.float32)
        for t in reversed(range(len(caches))):
            x, h, r, z, n, gh, h2 = caches[t]
            g = gq[:, t]
            grads[4] += h2.T @ g
            grads[5] += g.sum(0)
            dh = dh + g @ w_q.T
            dn = dh * (1 - z) * (1 - n * n)
            dz = dh * (h - n) * z * (1 - z)
            dr = dn * gh[:, 2 * H:] * r * (1 - r)
            dgi = np.concatenate([dr, dz, dn], 1)
            dgh = np.concatenate([dr, dz, dn * r], 1)
            grads[0] += x.T @ dgi
            grads[1] += h.T @ dgh
            grads[2] += dgi.sum(0)
            grads[3] += dgh.sum(0)
            dh = dh * z + dgh @ w_hh.T
        return grads

    def tensors(self):
        """The weights as the collector takes them: raw observations in."""
        t = dict(zip(self.names, self.params))
        t["w_ih"] = OBS_SCALE[:, None] * t["w_ih"]
        return t


def soft_update(target, net, tau):
    for p, o in zip(target.params, net.params):
        p += tau * (o - p)


class MaskedCartPole:
    """CartPole-v1 (gym's equations and limits) for n episodes side by side,
    observing x and theta only: the evaluation env, mirroring the server's
    cartpole-masked."""

    def __init__(self, rng, n):
        self.s = rng.uniform(-0.05, 0.05, (n, 4))
        self.alive = np.ones(n, bool)
        self.length = np.zeros(n, int)

    def obs(self):
        return self.s[:, [0, 2]].astype(np.float32)

    def step(self, action):
        x, x_dot, th, th_dot = self.s.T
        force = np.where(action == 1, 10.0, -10.0)
        cos, sin = np.cos(th), np.sin(th)
        temp = (force + 0.05 * th_dot ** 2 * sin) / 1.1
        th_acc = (9.8 * sin - cos * temp) / (0.5 * (4 / 3 - 0.1 * cos ** 2 / 1.1))
        x_acc = temp - 0.05 * th_acc * cos / 1.1
        self.s = np.stack([x + 0.02 * x_dot, x_dot + 0.02 * x_acc, th + 0.02 * th_dot, th_dot + 0.02 * th_acc], 1)
        self.length += self.alive
        fell = (np.abs(self.s[:, 0]) > 2.4) | (np.abs(self.s[:, 2]) > 12 * 2 * np.pi / 360)
        self.alive &= ~fell & (self.length < 500)


def evaluate(gru, mlp, seed, episodes):
    """Mean greedy episode length of each network on masked CartPole (the
    same start states for both)."""
    out = []
    for policy in ("gru", "mlp"):
        env = MaskedCartPole(np.random.default_rng(seed), episodes)
        h = np.zeros((episodes, gru.H), np.float32)
        while env.alive.any():
            o = env.obs() * OBS_SCALE
            if policy == "gru":
                h, q, _ = gru.step(o, h)
            else:
                q = mlp.forward(o)[0]
            env.step(q.argmax(1))
        out.append(float(env.length.mean()))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7450")
    p.add_argument("--token", default=os.environ.get("RBD_TOKEN"))
    p.add_argument("--buffer", default="demo")
    p.add_argument("--collector", default="demo", help="collector to push the GRU to ('' for none)")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--slices", type=int, default=32, help="sequences per batch")
    p.add_argument("--burn-in", type=int, default=8)
    p.add_argument("--unroll", type=int, default=16, help="learned steps per sequence (after the burn-in)")
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--gamma", type=float, default=0.97)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--reward-scale", type=float, default=0.1)
    p.add_argument("--mlp-hidden", type=int, default=64)
    p.add_argument("--beta", type=float, default=0.4)
    p.add_argument("--tau", type=float, default=0.01)
    p.add_argument("--push-every", type=int, default=25)
    p.add_argument("--eps-start", type=float, default=0.5)
    p.add_argument("--eps-end", type=float, default=0.05)
    p.add_argument("--eps-steps", type=int, default=2000)
    p.add_argument("--write-back", type=int, default=1, help="write the recomputed states back (1) or not (0)")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-episodes", type=int, default=16)
    p.add_argument("--target-length", type=float, default=400,
                   help="stop once the GRU's greedy evaluation reaches this (0: never)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true")
    p.add_argument("--check-ratio", type=float, default=2.0)
    p.add_argument("--check-length", type=float, default=100)
    a = p.parse_args(argv)

    client = Client(a.url, token=a.token, retry_rate_limited=60)
    spec = client.info(a.buffer)["spec"]
    if "recurrent_state" not in spec["fields"]:
        sys.exit("buffer %s stores no recurrent_state: serve --demo --demo-env cartpole-masked" % a.buffer)
    H = spec["fields"]["recurrent_state"]["shape"][0]
    D = spec["fields"]["observation"]["shape"][0]
    L = a.burn_in + a.unroll
    rng = np.random.default_rng(a.seed)
    gru, mlp = GRUQ(rng, D, H), MLP(rng, D, a.mlp_hidden, ACTIONS)
    gru_t, mlp_t = gru.copy(), mlp.copy()
    opt_g, opt_m = Adam(gru.params, a.lr, clip=10.0), Adam(mlp.params, a.lr, clip=10.0)
    request = dict(sampler="prioritized_slice", num_slices=a.slices, slice_len=L, strict_length=False,
                   n_step={"n": a.n_step, "gamma": a.gamma}, beta=a.beta, timeout_ms=5000,
                   keys=["observation", "action", "recurrent_state", "next.reward", "next.terminated",
                         "next.observation"])
    curve, losses, stale, written = [], [], 0, 0
    t0 = time.perf_counter()
    print("GRU %d units vs MLP %d units on %s (slices of %d: burn-in %d, learn %d; %d-step targets)"
          % (H, a.mlp_hidden, a.buffer, L, a.burn_in, a.unroll, a.n_step), flush=True)
    for step in range(1, a.steps + 1):
        b = client.sample(a.buffer, seed=a.seed * 1_000_003 + step, **request)
        obs, act, seq, mask = b["observation"] * OBS_SCALE, b["action"], b["seq"], b["mask"].astype(bool)
        S = obs.shape[0]
        k, gam = b["steps_to_next_obs"], b["gamma"]
        # Rewards scaled down: a GRU's state is bounded, so its linear Q head
        # reaches values near 1/(1-gamma) only with large weights.
        term, ret = b["next.terminated"], b["next.reward"] * a.reward_scale
        w = b["weight"][:, 0]
        w = w / w.max()
        # Learned positions: real, with a next observation, and after the
        # burn-in, except in slices that start a trajectory (step 0): their
        # zero state is exact, not stale, so they learn from the first row.
        pos = np.arange(L)[None, :]
        burn = np.where(b["step"][:, :1] == 0, 0, a.burn_in)
        learn = mask & (k > 0) & (pos >= burn)
        inside = pos + k                                 # where the bootstrap state is in the slice
        boot_in = inside < L
        boot_in &= np.take_along_axis(mask, np.minimum(inside, L - 1), 1)
        learn &= boot_in | term                          # else the window left the slice unfinished

        # GRU: burn-in (no learning) then the learned part, both from the
        # stored state; the target network unrolls the same way.
        h0 = b["recurrent_state"][:, 0]
        hs, q, caches = gru.unroll(obs, h0)
        _, q_t, _ = gru_t.unroll(obs, h0)
        # Double DQN: the online network picks the action at t+k, the
        # target network values it.
        at = np.minimum(inside, L - 1)
        a_next = np.take_along_axis(q.argmax(2), at, 1)
        v_next = np.take_along_axis(np.take_along_axis(q_t, at[:, :, None], 1), a_next[:, :, None], 2)[:, :, 0]
        y = ret + gam * ~term * np.where(boot_in, v_next, 0)
        td = np.take_along_axis(q, act[:, :, None], 2)[:, :, 0] - y
        loss_i, dl = huber(td)
        n_learn = max(1, learn.sum())
        gq = np.zeros_like(q)
        np.put_along_axis(gq, act[:, :, None], (dl * learn * w[:, None] / n_learn)[:, :, None], 2)
        # Gradients flow back through the whole slice; the burn-in rows get
        # no loss of their own (their gq is zero), only the state they pass on.
        opt_g.step(gru.params, gru.backward(caches, gq.astype(np.float32)))
        soft_update(gru_t, gru, a.tau)
        losses.append(float((loss_i * learn).sum() / n_learn))

        # MLP: the same rows and targets, one observation at a time.
        flat = learn.reshape(-1)
        x = obs.reshape(-1, D)[flat]
        qm, cache = mlp.forward(x)
        xn = (b["next.observation"] * OBS_SCALE).reshape(-1, D)[flat]
        vm = mlp_t.forward(xn)[0][np.arange(flat.sum()), mlp.forward(xn)[0].argmax(1)]
        ym = ret.reshape(-1)[flat] + gam.reshape(-1)[flat] * ~term.reshape(-1)[flat] * vm
        am = act.reshape(-1)[flat]
        tdm = qm[np.arange(len(am)), am] - ym
        _, dlm = huber(tdm)
        gm = np.zeros_like(qm)
        gm[np.arange(len(am)), am] = dlm * np.repeat(w, learn.sum(1)) / n_learn
        opt_m.step(mlp.params, mlp.backward(cache, gm))
        soft_update(mlp_t, mlp, a.tau)

        # Priorities: learned rows by |TD|, each slice's first row (what
        # draws a slice) by its sequence priority, written last so it wins.
        a_td = np.abs(td) * learn
        seq_prio = 0.9 * a_td.max(1) + 0.1 * a_td.sum(1) / np.maximum(1, learn.sum(1))
        pseq = np.concatenate([seq[learn], seq[:, 0]])
        prio = np.concatenate([a_td[learn], seq_prio]) + 1e-3
        stale += client.update_priorities(a.buffer, pseq, prio)["stale"]
        if a.write_back:
            real = mask.copy()
            real[:, 0] = False  # the first state is where the burn-in starts: keep it
            res = client.update(a.buffer, seq[real], {"recurrent_state": hs[real]})
            written += res["updated"]

        eps = a.eps_end + (a.eps_start - a.eps_end) * max(0.0, 1 - step / max(1, a.eps_steps))
        if a.collector and a.push_every and step % a.push_every == 0:
            client.set_weights(a.collector, dict(gru.tensors(), epsilon=np.float32(eps)))
        if step % a.eval_every == 0 or step == a.steps:
            g_len, m_len = evaluate(gru, mlp, a.seed + 7, a.eval_episodes)
            coll = client.collector(a.collector)["mean_episode_length"] if a.collector else float("nan")
            curve.append((step, g_len, m_len))
            print("step %5d  loss %.4f  %4.0f steps/s  greedy episode length: GRU %6.1f  MLP %6.1f  "
                  "(collector, epsilon %.2f: %.1f)"
                  % (step, np.mean(losses[-a.eval_every:]), step / (time.perf_counter() - t0),
                     g_len, m_len, eps, coll), flush=True)
            if a.target_length and g_len >= a.target_length:
                break
    dt = time.perf_counter() - t0
    print("%d steps in %.1fs; %d stale priority updates; %d recurrent states written back"
          % (len(losses), dt, stale, written))
    print("curve (step, GRU, MLP): " + " ".join("%d:%.0f/%.0f" % c for c in curve))
    g_len, m_len = max(c[1] for c in curve), max(c[2] for c in curve)
    verdict = g_len >= a.check_ratio * m_len and g_len >= a.check_length
    print("final greedy episode length: GRU %.1f, MLP %.1f" % (curve[-1][1], curve[-1][2]))
    print("best greedy episode length: GRU %.1f, MLP %.1f: %s" % (
        g_len, m_len, "the recurrent network learned what the feed-forward one could not" if verdict
        else "no clear difference"))
    client.close()
    if a.check and not verdict:
        sys.exit(1)


if __name__ == "__main__":
    main()
