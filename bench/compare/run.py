"""Side by side: the same replay workload through
  (a) an SB3-style numpy ring buffer in-process (bench/numpy_ring.py),
  (b) rbd's Python client against `rbd serve` (a memory buffer, compact_obs),
  (c) rbd in-process from Go (bench/compare/inproc),
printing rows/s, batches/s and bytes held per transition for each, in one run.
CartPole runs in-process seven times: a memory buffer with the default row
metadata, with run records ("row_meta": "runs") and with strided run
records ("row_meta": "strided", 8-byte records), and a memmap buffer
(durability none, files in a temporary dir) with rows.meta format version 1
and 2 (the same two row_meta values; 1 what builds before 2026-11-27 made,
2 the default from then to 2026-11-29), with "strided" (the files of
"runs", 8-byte memory records) and with version 3 ("blocks", the default of
new memmap buffers since 2026-11-29: block checksums, no record a row);
"disk/row" is a memmap buffer's files over its rows. Two more CartPole legs write the memory buffer (default
and strided) as 64 actors do, each extend one step of one actor, a stream of
its own ("64 actors": a trajectory's rows come at irregular distances; adds
are then rows/s of one-row extends).

The in-process legs (numpy, Go) run --rounds times, alternating (numpy, Go,
Go with run records, numpy, ...), and the table prints each figure's median
over the rounds; "x numpy" is the in-process sample rate divided by the
numpy ring's of the same round, median [lowest, highest]. On a shared VM a
single run of either leg swings by 10-20%; pairing the rounds keeps a slow
minute from deciding the ratio. The Python client runs once (it is slow,
and its table cells are not ratios).

    /usr/bin/python3 bench/compare/run.py                 # both workloads, ~2 minutes
    /usr/bin/python3 bench/compare/run.py --workloads cartpole --seconds 1

Workloads: "cartpole" (observation float32[4], capacity 100,000) and "atari"
(observation uint8[84,84,4], capacity 20,000 by default; --atari-capacity).
Every row also has an int64 action, a float32 reward and done flags. 8 envs
step together; episodes have a fixed length (200 / 1000 steps) with
staggered starts; observations come from a pool of random frames and the
next observation of a row is its env's observation one tick later.

Adds are batches of 256 rows (32 ticks x 8 envs), timed around the add call
only, in two passes: "fill" (the first pass over an empty ring: first-touch
page faults) and "add" (the second pass, overwriting: the steady state).
Samples are uniform batches of 256 rows for --seconds: numpy returns obs,
action, next_obs, done, reward; rbd returns every field plus the rebuilt
next observation and seq/traj_id/step. "held/row" is the growth of the
resident set of the process that holds the data (the server for (b)) while
the ring fills, divided by the rows (for (c) read after a collection that
returns freed memory to the OS, inproc --settle, so that the fill's garbage
is not counted; the server of (b) is read as it is, then in brackets again
once, quiet, it has returned its freed heap to the OS: its log says so 2 s
after the last request); "layout/row" is what the arrays or
columns take by construction (rbd: fields + final observations + the row
metadata, the info's row_meta_bytes: 64 for a file record, a memory buffer's
32-byte record, 16 with run records or 8 strided, plus its row group's padding).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in bench/ or clients/
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))

N_ENVS, BATCH = 8, 256
TICKS = BATCH // N_ENVS
WORKLOADS = {
    "cartpole": dict(obs_shape=(4,), obs_dtype=np.float32, episode=200, pool=4096),
    "atari": dict(obs_shape=(84, 84, 4), obs_dtype=np.uint8, episode=1000, pool=512),
}


def rss(pid="self"):
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Workload:
    def __init__(self, name):
        w = WORKLOADS[name]
        self.name, self.obs_shape, self.obs_dtype, self.episode = name, w["obs_shape"], w["obs_dtype"], w["episode"]
        rng = np.random.default_rng(1)
        if self.obs_dtype == np.uint8:
            self.pool = rng.integers(0, 256, (w["pool"],) + self.obs_shape, dtype=np.uint8)
        else:
            self.pool = rng.standard_normal((w["pool"],) + self.obs_shape).astype(self.obs_dtype)
        self.env = np.arange(N_ENVS)

    def ticks(self, tick0):
        """Ticks [tick0, tick0 + TICKS) of every env: arrays [TICKS, N_ENVS, ...]."""
        t = np.arange(tick0, tick0 + TICKS)[:, None]
        idx = (self.env[None, :] * 7919 + t) % len(self.pool)
        done = (t + self.env[None, :] * self.episode // N_ENVS) % self.episode == self.episode - 1
        return dict(obs=self.pool[idx], next_obs=self.pool[(idx + 1) % len(self.pool)],
                    action=((self.env[None, :] + t) % 2).astype(np.int64),
                    reward=np.ones((TICKS, N_ENVS), np.float32), done=done)

    def rbd_rows(self, tick0):
        """The same ticks as rbd rows: [TICKS * N_ENVS, ...], tick-major, an
        env column and one final observation per done row."""
        s = self.ticks(tick0)
        n = TICKS * N_ENVS
        done = s["done"].reshape(n)
        return {"observation": s["obs"].reshape((n,) + self.obs_shape), "action": s["action"].reshape(n),
                "next.reward": s["reward"].reshape(n), "next.done": done, "next.terminated": done,
                "next.truncated": np.zeros(n, bool), "env": np.tile(self.env, TICKS),
                "next.observation": s["next_obs"].reshape((n,) + self.obs_shape)[done]}

    def spec(self, capacity):
        return {"capacity": capacity, "storage": "memory", "compact_obs": True,
                "fields": {"observation": {"dtype": np.dtype(self.obs_dtype).name, "shape": list(self.obs_shape)},
                           "action": {"dtype": "int64", "shape": []},
                           "next.reward": {"dtype": "float32", "shape": []},
                           "next.done": {"dtype": "bool", "shape": []},
                           "next.terminated": {"dtype": "bool", "shape": []},
                           "next.truncated": {"dtype": "bool", "shape": []}}}


def sample_for(seconds, draw):
    n, nbytes, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        nbytes += sum(a.nbytes for a in draw())
        n += 1
    dt = time.perf_counter() - t0
    return n / dt, nbytes / dt / 1e9


# -- (a) numpy -------------------------------------------------------------------
def child_numpy(a):
    from numpy_ring import NumpyRing
    w = Workload(a.workload)
    rss0 = rss()
    buf = NumpyRing(a.capacity, w.obs_shape, w.obs_dtype, n_envs=N_ENVS, seed=0)
    fill, steady = _timed_passes(a.capacity, w.ticks, lambda s: buf.extend(
        s["obs"], s["next_obs"], s["action"], s["reward"], s["done"], np.zeros_like(s["reward"])))
    held = rss() - rss0
    bps, gbps = sample_for(a.seconds, lambda: buf.sample(BATCH))
    return dict(impl="numpy ring (SB3-style), in-process", fill_rows_per_s=a.capacity / fill,
                add_rows_per_s=a.capacity / steady, sample_batches_per_s=bps, sample_gb_per_s=gbps,
                bytes_per_transition_rss=held / buf.size(), bytes_per_transition_layout=buf.nbytes() / buf.size())


def _timed_passes(capacity, make, add):
    """Two passes of capacity rows: make(tick) builds a batch (not timed),
    add(batch) stores it (timed). Returns the seconds of each pass."""
    out, tick = [], 0
    for _ in range(2):
        spent, rows = 0.0, 0
        while rows < capacity:
            batch = make(tick)
            t0 = time.perf_counter()
            add(batch)
            spent += time.perf_counter() - t0
            tick += TICKS
            rows += BATCH
        out.append(spent)
    return out


# -- (b) Python client against rbd serve ------------------------------------------
# The line rbd serve logs when, quiet, it returns its freed heap (server/gctune.go).
RELEASE_LINE = '"msg":"quiet: returned freed heap to the OS"'


def _count_lines(path, needle):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace").count(needle)


def child_client(a):
    from rbd_client import Client
    w = Workload(a.workload)
    c = Client(a.url)
    rss0 = rss(a.server_pid)
    c.create_buffer("bench", w.spec(a.capacity))
    fill, steady = _timed_passes(a.capacity, w.rbd_rows, lambda rows: c.extend("bench", rows, stream="bench"))
    info = c.info("bench")
    held = rss(a.server_pid) - rss0
    held_quiet = None
    if a.server_log:
        # Again once the server, quiet, has returned its freed heap to the
        # OS (its log says so 2 s after the last request): what the buffer
        # itself costs.
        releases = _count_lines(a.server_log, RELEASE_LINE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if _count_lines(a.server_log, RELEASE_LINE) > releases:
                held_quiet = rss(a.server_pid) - rss0
                break
            time.sleep(0.1)
    layout = sum(v["stored"] for v in info["bytes"].values()) / info["size"] + info.get("row_meta_bytes", 64)
    bps, gbps = sample_for(a.seconds, lambda: c.sample("bench", BATCH).values())
    it = c.iter_samples("bench", BATCH, depth=2, transport="requests")
    pbps, pgbps = sample_for(a.seconds, lambda: next(it).values())
    it.close()
    it = c.iter_samples("bench", BATCH, depth=2, transport="stream")
    sbps, sgbps = sample_for(a.seconds, lambda: next(it).values())
    it.close()
    it = c.iter_samples("bench", BATCH, depth=2, transport="shm")
    mbps, mgbps = sample_for(a.seconds, lambda: next(it).values())
    it.close()
    c.close()
    return dict(impl="rbd Python client -> rbd serve", fill_rows_per_s=a.capacity / fill,
                add_rows_per_s=a.capacity / steady, sample_batches_per_s=bps, sample_gb_per_s=gbps,
                prefetch_batches_per_s=pbps, prefetch_gb_per_s=pgbps,
                stream_batches_per_s=sbps, stream_gb_per_s=sgbps,
                shm_batches_per_s=mbps, shm_gb_per_s=mgbps,
                bytes_per_transition_rss=held / info["size"], bytes_per_transition_layout=layout,
                bytes_per_transition_rss_quiet=held_quiet / info["size"] if held_quiet is not None else None)


# -- the driver ------------------------------------------------------------------
def go_build(out, pkg):
    subprocess.run(["go", "build", "-o", out, pkg], cwd=ROOT, check=True)
    return out


def run_child(mode, workload, capacity, seconds, extra=()):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--workload", workload,
           "--capacity", str(capacity), "--seconds", str(seconds)] + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(v, unit=""):
    if v is None:
        return "-"
    for lim, div, suf in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e3, 1e3, "k")):
        if abs(v) >= lim:
            return "%.3g%s%s" % (v / div, suf, unit)
    return "%.3g%s" % (v, unit)


def held_cell(r):
    cell = fmt(r["bytes_per_transition_rss"], "B")
    if r.get("bytes_per_transition_rss_quiet") is not None:
        cell += " (%s quiet)" % fmt(r["bytes_per_transition_rss_quiet"], "B")
    return cell


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def combine(rounds):
    """One result from the same leg's rounds: the median of every number
    (each column on its own), the rounds kept under "rounds"."""
    out = dict(rounds[0])
    for k, v in rounds[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = median([r[k] for r in rounds])
    out["rounds"] = rounds
    return out


def ratio_cell(r):
    xs = r.get("x_numpy")
    if not xs:
        return "-"
    return "%.2fx [%.2f, %.2f]" % (median(xs), min(xs), max(xs))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="cartpole,atari")
    p.add_argument("--cartpole-capacity", type=int, default=100_000)
    p.add_argument("--atari-capacity", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=3.0, help="sampling time per measurement")
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of the in-process legs (medians are printed)")
    p.add_argument("--json", action="store_true", help="print the results as JSON lines too")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--capacity", type=int, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", help=argparse.SUPPRESS)
    p.add_argument("--server-log", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        res = {"numpy": child_numpy, "client": child_client}[a.child](a)
        res.update(workload=a.workload, rows=a.capacity)
        print(json.dumps(res))
        return

    import rbdserver
    tmp = tempfile.mkdtemp(prefix="rbd-compare-")
    rbd_bin = go_build(os.path.join(tmp, "rbd"), "./cmd/rbd")
    inproc = go_build(os.path.join(tmp, "inproc"), "./bench/compare/inproc")
    os.environ["RBD_BIN"] = rbd_bin
    print("bench/compare, %s, %d CPUs, numpy %s, Python %s" % (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.cpu_count(), np.__version__, sys.version.split()[0]))
    results = []
    for wl in a.workloads.split(","):
        cap = a.cartpole_capacity if wl == "cartpole" else a.atari_capacity
        # Small rows also with run records (row_meta "runs", "strided"):
        # less memory a row, slower samples; images have no use for them.
        metas = [("memory", "row", 0), ("memory", "runs", 0), ("memory", "strided", 0), ("memmap", "row", 0), ("memmap", "runs", 0),
                 ("memmap", "strided", 0), ("memmap", "blocks", 0), ("memory", "row", 64), ("memory", "strided", 64)]
        if wl != "cartpole":
            metas = metas[:1]
        legs = {"numpy": []}
        legs.update((m, []) for m in metas)
        for rnd in range(max(a.rounds, 1)):
            legs["numpy"].append(run_child("numpy", wl, cap, a.seconds))
            for storage, row_meta, actors in metas:
                out = subprocess.run([inproc, "--workload", wl, "--capacity", str(cap), "--seconds", str(a.seconds),
                                      "--storage", storage, "--row-meta", row_meta, "--settle", "--actors", str(actors)],
                                     check=True, capture_output=True, text=True)
                r = json.loads(out.stdout)
                r["x_numpy"] = [r["sample_batches_per_s"] / legs["numpy"][rnd]["sample_batches_per_s"]]
                legs[storage, row_meta, actors].append(r)
        results.append(combine(legs["numpy"]))
        with rbdserver.Server() as srv:
            results.append(run_child("client", wl, cap, a.seconds, ["--url", srv.url, "--server-pid", str(srv.proc.pid), "--server-log", srv.stderr_path]))
        for leg in metas:
            r = combine(legs[leg])
            r["x_numpy"] = [x["x_numpy"][0] for x in legs[leg]]
            results.append(r)
    print()
    print("In-process legs: medians of %d alternating rounds." % max(a.rounds, 1))
    print()
    print("| workload | implementation | add rows/s (fill) | sample batches/s (prefetch thread; stream; shm) | x numpy | sample GB/s (shm) | held/row | layout/row | disk/row |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        pre, st, sh = r.get("prefetch_batches_per_s"), r.get("stream_batches_per_s"), r.get("shm_batches_per_s")
        gb = "%.2f" % r["sample_gb_per_s"] + (" (%.2f)" % r["shm_gb_per_s"] if sh else "")
        print("| %s | %s | %s (%s) | %s%s | %s | %s | %s | %s | %s |" % (
            r["workload"], r["impl"], fmt(r["add_rows_per_s"]), fmt(r["fill_rows_per_s"]),
            fmt(r["sample_batches_per_s"]), " (%s; %s; %s)" % (fmt(pre), fmt(st), fmt(sh)) if pre else "",
            ratio_cell(r), gb, held_cell(r), fmt(r["bytes_per_transition_layout"], "B"),
            fmt(r.get("disk_bytes_per_transition"), "B")))
    if a.rounds > 1:
        print()
        print("Rounds (sample batches/s, in order):")
        for r in results:
            if "rounds" in r:
                print("  %s, %s: %s" % (r["workload"], r["impl"],
                                       ", ".join(fmt(x["sample_batches_per_s"]) for x in r["rounds"])))
    if a.json:
        for r in results:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
