"""Several rbd servers (shards) used as one buffer (docs/scale-out.md).

The Python twin of the Go client's ``client.Sharded``: streams are placed
on shards by the same rendezvous hash, and uniform and prioritized samples
are split across shards and merged so that a batch is drawn, and weighted,
as if one buffer held every row.
"""

import json
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .client import Batch, Client, _to_torch
from .errors import BadRequest, ConnectionFailed, NotFound, RbdError

__all__ = ["ShardedClient", "NoShards"]

_MASK = (1 << 64) - 1


class NoShards(RbdError):
    """No shard could take the request: every shard failed a write, or none
    answered a sample."""

    def __init__(self, message):
        super().__init__(0, message)


def _fnv64a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & _MASK
    return h


def _mix64(x):
    # splitmix64's finaliser, as client/sharded.go mix64.
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & _MASK
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & _MASK
    return x ^ (x >> 31)


def _shard_failed(e):
    """A shard's failure (unreachable, a 5xx but flow control, shutting
    down), as opposed to an answer about the request."""
    if isinstance(e, ConnectionFailed) or not isinstance(e, RbdError):
        return True
    if e.status == 503 and e.code == "shutting_down":
        return True
    if e.status in (503, 429):
        return False
    return e.status >= 500


class ShardedClient:
    """Several ``rbd serve`` processes as one buffer.

    ``urls`` lists the shards (order does not matter: shards are numbered
    in the sorted order of their URLs, the numbers answers carry as
    ``shard``). ``stats_ttl`` is how long each shard's sampling figures are
    reused to split batches, ``shard_timeout`` bounds a shard's part of a
    sample (a shard that misses it is left out of that draw) and each
    request to a shard (the clients' timeout), ``down_for``
    is how long a shard that failed a write is passed over. Other keyword
    arguments go to each shard's :class:`Client` (``token``, ``ca``, ...).
    Safe to use from several threads.
    """

    @classmethod
    def from_srv(cls, name, **kwargs):
        """A client of the shards named by the DNS SRV records of ``name``
        (what a Kubernetes headless Service publishes, e.g.
        ``"_http._tcp.rbd.default.svc.cluster.local"``): each target and
        port becomes ``http://target:port`` (``https`` with ``ca``). Needs
        dnspython (Debian: python3-dnspython); ``nameservers`` (a list of
        "host" or "host:port") replaces the system's resolvers."""
        try:
            import dns.resolver
        except ImportError as e:
            raise ImportError("ShardedClient.from_srv needs dnspython (apt-get install python3-dnspython, "
                              "or pip install dnspython); or pass the shards' URLs") from e
        nameservers = kwargs.pop("nameservers", None)
        r = dns.resolver.Resolver(configure=nameservers is None)
        if nameservers is not None:
            r.nameservers = [ns.rsplit(":", 1)[0] for ns in nameservers]
            ports = {int(ns.rsplit(":", 1)[1]) for ns in nameservers if ":" in ns}
            if ports:
                r.port = ports.pop()
        try:
            answer = r.resolve(name, "SRV")
        except Exception as e:  # noqa: BLE001 - dnspython's NXDOMAIN, NoAnswer, Timeout, ...
            raise ValueError("sharded client: look up SRV %r: %s" % (name, e)) from e
        scheme = "https" if kwargs.get("ca") else "http"
        urls = ["%s://%s:%d" % (scheme, str(a.target).rstrip("."), a.port) for a in answer]
        if not urls:
            raise ValueError("sharded client: SRV %r names no shard" % name)
        return cls(urls, **kwargs)

    def __init__(self, urls, stats_ttl=1.0, shard_timeout=5.0, down_for=10.0, seed=None, **client_args):
        urls = sorted(u.strip().rstrip("/") for u in (urls or []))
        if not urls:
            raise ValueError("sharded client: the shard list is empty")
        for a, b in zip(urls, urls[1:]):
            if a == b:
                raise ValueError("sharded client: shard %r is listed twice" % a)
        self.urls = urls
        self._clients = []  # every Client made, for close
        self._local = threading.local()
        self._client_args = dict(client_args, timeout=shard_timeout)
        self.stats_ttl = stats_ttl
        self.shard_timeout = shard_timeout
        self.down_for = down_for
        self._down = [0.0] * len(urls)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._stats = {}
        self._homes = {}
        self._visited = {}
        self._pool = ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="rbd-shard")

    def close(self):
        self._pool.shutdown(wait=True)
        with self._lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def shard(self, i):
        """A :class:`Client` of shard ``i`` for this thread (a Client's
        connection is not shared between threads)."""
        cs = getattr(self._local, "clients", None)
        if cs is None:
            cs = self._local.clients = [None] * len(self.urls)
        if cs[i] is None:
            cs[i] = Client(self.urls[i], **self._client_args)
            with self._lock:
                self._clients.append(cs[i])
        return cs[i]

    def _each(self, fn):
        """fn(i, client) for every shard in parallel; returns (results, errors)."""
        futs = [self._pool.submit(lambda i=i: fn(i, self.shard(i))) for i in range(len(self.urls))]
        out, errs = [], []
        for f in futs:
            try:
                out.append(f.result())
                errs.append(None)
            except Exception as e:  # noqa: BLE001 - reported per shard
                out.append(None)
                errs.append(e)
        return out, errs

    # -- placement ----------------------------------------------------------

    def hash_order(self, stream):
        """Shards in the rendezvous order of ``stream`` (the same as the Go
        client's): a stream writes to the first healthy one."""
        key = ("" if stream is None else str(stream)).encode()
        scores = [(_mix64(_fnv64a(u.encode() + b"\0" + key)), i) for i, u in enumerate(self.urls)]
        scores.sort(key=lambda s: (-s[0], s[1]))
        return [i for _, i in scores]

    # -- buffers ------------------------------------------------------------

    def create_buffer(self, name, spec):
        """Create the buffer on every shard; refuses (Conflict-like
        ValueError), creating nothing, when shards already hold it with
        different specs. Returns each shard's info."""

        def existing(i, c):
            try:
                return c.info(name)["spec"]
            except NotFound:
                return None

        specs, errs = self._each(existing)
        for i, e in enumerate(errs):
            if e is not None:
                raise e
        held = [(i, s) for i, s in enumerate(specs) if s is not None]
        for (i, a), (j, b) in zip(held, held[1:]):
            if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
                raise ValueError("create %s: shards %s and %s hold it with different specs" % (name, self.urls[i], self.urls[j]))
        infos, errs = self._each(lambda i, c: c.create_buffer(name, spec))
        for e in errs:
            if e is not None:
                raise e
        return infos

    def info(self, name):
        """Every shard's info of the buffer (None where a shard failed)."""
        return self._each(lambda i, c: c.info(name))[0]

    # -- writing ------------------------------------------------------------

    def extend(self, name, rows, stream=None, **options):
        """Write rows of ``stream`` to its shard (the first healthy one in
        its rendezvous order), failing over to the next when that shard is
        unreachable or answers a server error; the stream's open
        trajectories on the failed shard end there. Returns the shard's
        answer plus ``"shard"``. Options are those of :meth:`Client.extend`."""
        now = time.monotonic()
        order = self.hash_order(stream)
        healthy = [i for i in order if self._down[i] <= now]
        down = [i for i in order if self._down[i] > now]
        failures = []
        key = (name, stream)
        for i in healthy + down:
            with self._lock:
                home = self._homes.get(key, -1)
                back = home >= 0 and home != i and i in self._visited.get(key, ())
            try:
                if back:
                    # The stream left this shard with trajectories open
                    # there: end them, or they would join rows across the
                    # time it wrote elsewhere.
                    self.shard(i).close_stream(name, stream)
                res = self.shard(i).extend(name, rows, stream=stream, **options)
            except Exception as e:  # noqa: BLE001 - classified below
                if not _shard_failed(e):
                    raise
                self._down[i] = time.monotonic() + self.down_for
                failures.append("shard %d (%s): %s" % (i, self.urls[i], e))
                continue
            with self._lock:
                self._homes[key] = i
                self._visited.setdefault(key, set()).add(i)
            res = dict(res)
            res["shard"] = i
            return res
        raise NoShards("extend %s: no shard took the rows: %s" % (name, "; ".join(failures)))

    def close_stream(self, name, stream):
        """Close ``stream`` on the shard it last wrote to through this client
        (on every shard when none); returns how many trajectories closed."""
        i = self.stream_shard(name, stream)
        if i >= 0:
            return self.shard(i).close_stream(name, stream)
        res, errs = self._each(lambda i, c: c.close_stream(name, stream))
        for e in errs:
            if e is not None:
                raise e
        return sum(res)

    def delete_buffer(self, name):
        """Delete the buffer on every shard (a shard without it is fine)."""

        def delete(i, c):
            try:
                c.delete_buffer(name)
            except NotFound:
                pass

        _, errs = self._each(delete)
        with self._lock:
            for k in [k for k in self._stats if k[0] == name]:
                del self._stats[k]
        for e in errs:
            if e is not None:
                raise e

    def stream_shard(self, name, stream):
        """The shard ``stream`` last wrote to through this client, or -1."""
        with self._lock:
            return self._homes.get((name, stream), -1)

    # -- sampling -----------------------------------------------------------

    def _figures(self, name, slice_len=None):
        key = (name, slice_len)
        with self._lock:
            st = self._stats.get(key)
        if st is not None and time.monotonic() - st[0] < self.stats_ttl:
            return st[1]
        infos, _ = self._each(lambda i, c: c.info(name, slice_len=slice_len))
        with self._lock:
            self._stats[key] = (time.monotonic(), infos)
        return infos

    @staticmethod
    def _mass(info, sampler, options):
        next_known = (info["spec"].get("compact_obs") and options.get("next_state", True)
                      and not options.get("include_incomplete"))
        sm = info["sampling"]
        if sampler == "slice":
            sl = sm.get("slices") or {}
            return sl.get("trajectories_at_least", 0) if options.get("strict_length", True) else sl.get("trajectories", 0)
        if sampler == "prioritized":
            return sm["next_known_priority_total"] if next_known else sm["priority_total"]
        return sm["next_known_rows"] if next_known else sm["rows"]

    def _split(self, n, weights, missing, rng=None):
        live = [(i, w) for i, w in enumerate(weights) if i not in missing and w > 0]
        total = sum(w for _, w in live)
        if not live or not total > 0:
            return None
        counts = [0] * len(weights)
        with self._lock:
            rng = rng or self._rng
            for _ in range(n):
                x = rng.random() * total
                pick = live[-1][0]
                for i, w in live:
                    if x < w:
                        pick = i
                        break
                    x -= w
                counts[pick] += 1
        return counts

    def sample(self, name, batch_size, sampler="uniform", as_torch=False, device=None, beta=0.4, **options):
        """Draw a batch from the shards as if one buffer held all their rows
        (uniform, prioritized and slice samplers; slices take ``num_slices``
        and ``slice_len`` as options, or one of them with ``batch_size``).

        Returns a :class:`Batch` with the single answer's arrays
        concatenated shard after shard plus ``shard`` (int64), ``prob`` (each
        row's probability under the merged draw) and, for prioritized,
        ``weight`` = (q / min q)^-beta over the shards that took part. Its
        metadata lists ``shards_used`` and ``shards_missing``.
        """
        if sampler not in ("uniform", "prioritized", "slice"):
            raise BadRequest(400, "sampler %r: a sharded client samples with uniform, prioritized and slice only" % sampler)
        slice_len = None
        units = batch_size
        if sampler == "slice":
            S, L = options.pop("num_slices", None), options.pop("slice_len", None)
            if S is None and L and batch_size and batch_size % L == 0:
                S = batch_size // L
            if L is None and S and batch_size and batch_size % S == 0:
                L = batch_size // S
            if not S or not L or (batch_size and batch_size != S * L):
                raise BadRequest(400, "slices need two of batch_size, num_slices and slice_len")
            units, slice_len = S, L
        elif batch_size is None or batch_size < 1:
            raise BadRequest(400, "batch_size must be at least 1")
        infos = self._figures(name, slice_len)
        missing = {i for i, info in enumerate(infos) if info is None}
        if len(missing) == len(infos):
            raise NoShards("sample %s: no shard answered" % name)
        weights = [0.0 if info is None else float(self._mass(info, sampler, options)) for info in infos]
        parts = [[] for _ in infos]
        # A seeded request splits with a generator of its own: the same seed
        # over the same shard contents gives the same batch.
        split_rng = random.Random(int(options["seed"])) if options.get("seed") is not None else None
        need, rounds = units, 0
        while need > 0:
            counts = self._split(need, weights, missing, split_rng)
            if counts is None:
                raise NoShards("sample %s: no shard that answered holds a row to draw" % name)
            futs = {}
            for i, k in enumerate(counts):
                if k == 0:
                    continue
                opts = dict(options, return_prob=True, beta=beta)
                if slice_len is not None:
                    opts.update(num_slices=k, slice_len=slice_len)
                if "seed" in opts:
                    opts["seed"] = (int(opts["seed"]) + (i + 1) * 0x9e3779b97f4a7c15 + len(missing)) & _MASK
                bs = None if slice_len is not None else k
                futs[i] = (k, self._pool.submit(lambda i=i, bs=bs, o=opts: self.shard(i).sample(name, bs, sampler, **o)))
            for i, (k, f) in futs.items():
                try:
                    b = f.result()
                except Exception as e:  # noqa: BLE001 - a shard that fails is left out
                    if not _shard_failed(e):
                        raise
                    missing.add(i)
                    continue
                parts[i].append(b)
                need -= k
            rounds += 1
            if rounds > len(infos) + 1:
                raise NoShards("sample %s: shards keep failing" % name)
        batch = self._merge(parts, missing, sampler, beta)
        return _to_torch(batch, device) if as_torch else batch

    @staticmethod
    def _merge(parts, missing, sampler, beta):
        used = [i for i, p in enumerate(parts) if p and i not in missing]
        # The draw's mass: the sum of each used shard's figures at its last
        # draw; q_min: the smallest over every part.
        mass, qmin = 0.0, float("inf")
        for i in used:
            md = parts[i][-1].metadata
            mass += float(md["priority_total"]) if sampler == "prioritized" else int(md["size"])
            for b in parts[i]:
                if float(b.metadata["priority_min"]) > 0:
                    qmin = min(qmin, float(b.metadata["priority_min"]))
        keys = list(parts[used[0]][0].keys())
        out = Batch()
        for k in keys:
            out[k] = np.concatenate([b[k] for i in used for b in parts[i]])
        shard, prob = [], []
        for i in used:
            for b in parts[i]:
                shard.append(np.full(b["prob"].shape, i, dtype=np.int64))
                if sampler == "prioritized":
                    prob.append(b["prob"] * float(b.metadata["priority_total"]) / mass)
                elif sampler == "slice":
                    # 1/(T_s * starts) in the shard, which is drawn with T_s / T.
                    prob.append(b["prob"] * int(b.metadata["size"]) / mass)
                else:
                    prob.append(np.full(b["prob"].shape, 1.0 / mass))
        out["shard"] = np.concatenate(shard)
        out["prob"] = np.concatenate(prob)
        if sampler == "prioritized":
            q = out["prob"] * mass
            out["weight"] = np.power(q / qmin, -beta).astype(np.float32)
        out.metadata = {"shards_used": ",".join(str(i) for i in used),
                        "shards_missing": ",".join(str(i) for i in sorted(missing))}
        return out

    def health(self):
        """Every shard's health answer, or the exception it raised."""
        res, errs = self._each(lambda i, c: c.health())
        return [e if e is not None else r for r, e in zip(res, errs)]

    def set_rate_limit(self, name, limit):
        """Set the same rate limit on every shard: each shard's limiter
        counts its own inserts and samples, so with writes and samples
        spread in proportion every shard, and the whole, holds the ratio."""
        res, errs = self._each(lambda i, c: c.set_rate_limit(name, limit))
        for e in errs:
            if e is not None:
                raise e
        return res

    def update(self, name, shard, seq, fields, cast=True):
        """Set mutable fields of rows named by (shard, seq) (e.g. recurrent
        states a learner recomputed); each shard's rows go to it in
        parallel. Returns ``{"updated": u, "stale": k}``."""
        shard = np.asarray(shard, dtype=np.int64).reshape(-1)
        seq = np.asarray(seq, dtype=np.int64).reshape(-1)
        if shard.shape != seq.shape:
            raise ValueError("%d shards, %d seqs" % (shard.size, seq.size))
        if shard.size and (shard.min() < 0 or shard.max() >= len(self.urls)):
            raise ValueError("shard numbers must be in 0..%d" % (len(self.urls) - 1))
        arrays = {k: np.asarray(v) for k, v in fields.items()}

        def part(i, c):
            m = shard == i
            if not m.any():
                return {"updated": 0, "stale": 0}
            return c.update(name, seq[m], {k: a[m] for k, a in arrays.items()}, cast=cast)

        res, errs = self._each(part)
        for e in errs:
            if e is not None:
                raise e
        return {"updated": sum(r["updated"] for r in res), "stale": sum(r["stale"] for r in res)}

    def iter_samples(self, name, batch_size, sampler="uniform", depth=2, batches=None, **options):
        """Iterate over sharded batches drawn ``depth`` ahead by a
        background thread, so the learner does not wait for the shards'
        round trips. Batch i of a request with ``seed`` is what
        ``sample(..., seed=seed + i)`` returns for the same shard contents.
        Stops after ``batches`` (None: until :meth:`close` of the
        iterator); an error is raised by the ``next()`` that would have
        returned its batch."""
        return _ShardedPrefetcher(self, name, batch_size, sampler, depth, batches, options)

    def update_priorities(self, name, shard, seq, priority):
        """Set priorities of rows named by (shard, seq), each shard's part
        sent to it in parallel. Returns ``{"updated": u, "stale": k}``."""
        shard = np.asarray(shard, dtype=np.int64).reshape(-1)
        seq = np.asarray(seq, dtype=np.int64).reshape(-1)
        priority = np.asarray(priority, dtype=np.float64).reshape(-1)
        if not (shard.shape == seq.shape == priority.shape):
            raise ValueError("%d shards, %d seqs, %d priorities" % (shard.size, seq.size, priority.size))
        if shard.size and (shard.min() < 0 or shard.max() >= len(self.urls)):
            raise ValueError("shard numbers must be in 0..%d" % (len(self.urls) - 1))

        def part(i, c):
            m = shard == i
            if not m.any():
                return {"updated": 0, "stale": 0}
            return c.update_priorities(name, seq[m], priority[m])

        res, errs = self._each(part)
        for e in errs:
            if e is not None:
                raise e
        return {"updated": sum(r["updated"] for r in res), "stale": sum(r["stale"] for r in res)}


class _ShardedPrefetcher:
    """ShardedClient.iter_samples: a thread calling sample() ahead."""

    transport = "sharded-requests"

    def __init__(self, client, name, batch_size, sampler, depth, batches, options):
        if not 1 <= depth <= 64:
            raise ValueError("depth must be in [1, 64]")
        if batches is not None and batches < 1:
            raise ValueError("batches must be at least 1 (None: until close)")
        self._q = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._args = (client, name, batch_size, sampler, batches, options)
        self._done = False
        self._thread = threading.Thread(target=self._run, name="rbd-sharded-prefetch", daemon=True)
        self._thread.start()

    def _run(self):
        client, name, batch_size, sampler, batches, options = self._args
        i = 0
        while not self._stop.is_set() and (batches is None or i < batches):
            opts = dict(options)
            if opts.get("seed") is not None:
                opts["seed"] = int(opts["seed"]) + i
            try:
                item = client.sample(name, batch_size, sampler, **opts)
            except Exception as e:  # noqa: BLE001 - handed to next()
                item = e
            while not self._stop.is_set():
                try:
                    self._q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, Exception):
                return
            i += 1
        self._put_end()

    def _put_end(self):
        while not self._stop.is_set():
            try:
                self._q.put(StopIteration, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is StopIteration:
            self.close()
            raise StopIteration
        if isinstance(item, Exception):
            self.close()
            raise item
        return item

    def close(self):
        self._done = True
        self._stop.set()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

