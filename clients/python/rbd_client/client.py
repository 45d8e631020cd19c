"""HTTP client for an rbd server (docs/http-api.md), on the standard library and numpy."""

import http.client
import ipaddress
import json
import mmap
import os
import platform
import queue
import socket
import ssl
import struct
import threading
import time
import urllib.parse
import weakref

import numpy as np

from . import safetensors
from .errors import ConnectionFailed, RbdError, error_for

__all__ = ["Client", "Batch", "Prefetcher", "SampleStream", "ShmStream"]

# Bodies up to this size are joined and sent with the headers in one write;
# larger ones are sent tensor by tensor, straight from the arrays.
_JOIN_BELOW = 256 << 10

_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                     ConnectionAbortedError, http.client.CannotSendRequest)


class Batch(dict):
    """A dict of numpy arrays (or torch tensors) plus the answer's metadata.

    ``metadata`` holds the safetensors ``__metadata__`` strings; without-
    replacement samplers put ``epoch`` and ``epoch_end`` there, also
    available parsed as ``batch.epoch`` (int or None) and ``batch.epoch_end``
    (bool).
    """

    metadata = {}

    @property
    def epoch(self):
        v = self.metadata.get("epoch")
        return None if v is None else int(v)

    @property
    def epoch_end(self):
        return self.metadata.get("epoch_end") == "true"


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError("%r is not JSON serialisable" % (o,))


def _to_torch(batch, device):
    try:
        import torch
    except ImportError as e:  # torch stays optional
        raise ImportError("as_torch=True needs PyTorch (pip install torch or apt-get install python3-torch)") from e
    out = Batch()
    out.metadata = batch.metadata
    for k, a in batch.items():
        if not a.flags.aligned or not a.flags.writeable:
            a = a.copy()
        t = torch.from_numpy(a)
        out[k] = t.to(device) if device is not None else t
    return out


class Client:
    """A client for one rbd server, e.g. ``Client("http://127.0.0.1:7450")``.

    Each thread gets its own keep-alive connection, so one Client can be
    shared by an actor loop and a prefetch thread. ``token`` is sent as
    ``Authorization: Bearer <token>``. ``timeout`` (seconds) bounds each
    socket operation; a sample with ``timeout_ms`` gets that much more.
    For an ``https://`` URL the server's certificate is verified against
    ``ca`` (a PEM file of CA certificates; default: the system's), and
    ``cert``/``key`` (PEM files) are presented to servers that require a
    client certificate (mutual TLS).

    ``retry_rate_limited`` (seconds, default 0) makes ``extend`` and
    ``sample`` try again after a 503 "rate_limited" answer (the buffer's
    rate limiter held them back), sleeping the server's Retry-After between
    tries, for up to that long per call before raising :class:`RateLimited`.

    Every non-2xx answer raises :class:`RbdError` (a subclass per status:
    BadRequest, NotFound, NotReady, ...) carrying ``status``, ``code`` and
    the server's ``message``.
    """

    def __init__(self, url="http://127.0.0.1:7450", token=None, timeout=60.0, ca=None, cert=None, key=None,
                 retry_rate_limited=0.0):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url %r: want http://host:port" % url)
        if token is not None and ("\r" in token or "\n" in token):
            raise ValueError("token must not contain line breaks")
        if (ca or cert or key) and u.scheme != "https":
            raise ValueError("ca, cert and key apply to https:// URLs")
        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs both cert and key")
        if not retry_rate_limited >= 0:
            raise ValueError("retry_rate_limited must be a number of seconds >= 0")
        self.retry_rate_limited = float(retry_rate_limited)
        self._tls = None
        if u.scheme == "https":
            # Server certificates are verified (against ca, a PEM file, or
            # the system's CAs); cert and key are a client certificate for
            # servers that require one (mutual TLS).
            self._tls = ssl.create_default_context(cafile=ca)
            self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
            if cert:
                self._tls.load_cert_chain(cert, key)
        self.url = "%s://%s%s" % (u.scheme, u.netloc, u.path.rstrip("/"))
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns = []
        self._specs = {}
        self.connections_opened = 0  # for tests and the curious: keep-alive works when this stays small

    # -- plumbing -----------------------------------------------------------

    def _new_connection(self, timeout=None):
        t = timeout or self.timeout
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=t, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=t)

    def _headers(self, extra=None):
        hdrs = {"User-Agent": "rbd-python-client/1"}
        if self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        if extra:
            hdrs.update(extra)
        return hdrs

    def _connection(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._new_connection()
            c._rbd_used = False
            self._local.conn = c
            with self._lock:
                self._conns.append(c)
        return c

    def _drop_connection(self):
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None
            with self._lock:
                if c in self._conns:
                    self._conns.remove(c)

    def close(self):
        """Close every connection this client opened (any thread)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()
        self._local = threading.local()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _path(self, *parts, query=None):
        p = self._prefix + "/" + "/".join(urllib.parse.quote(str(x), safe="") if i else x
                                          for i, x in enumerate(parts))
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                p += "?" + urllib.parse.urlencode(q)
        return p

    def _request(self, method, path, body=None, headers=None, timeout=None):
        """Send one request; return (status, headers, body as bytearray).

        ``body`` is bytes or a list of bytes-like parts. A request that fails
        on a reused keep-alive connection before any answer arrived (the
        server closed it while idle) is sent once more on a new one.
        """
        hdrs = self._headers(headers)
        if isinstance(body, list):
            total = sum(memoryview(p).nbytes for p in body)
            if total < _JOIN_BELOW:
                body = b"".join(body)
            hdrs["Content-Length"] = str(total)
        elif body is not None:
            hdrs["Content-Length"] = str(len(body))
        for attempt in (0, 1):
            conn = self._connection()
            reused = conn._rbd_used
            if conn.sock is None:
                try:
                    conn.connect()
                except OSError as e:
                    self._drop_connection()
                    raise ConnectionFailed(0, "cannot reach %s: %s" % (self.url, e), method=method, path=path) from e
                with self._lock:
                    self.connections_opened += 1
                reused = False
            conn.timeout = timeout or self.timeout
            conn.sock.settimeout(conn.timeout)
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = self._read(resp)
            except _STALE_CONNECTION as e:
                self._drop_connection()
                if reused and attempt == 0:
                    continue
                raise ConnectionFailed(0, "connection to %s lost: %s" % (self.url, e), method=method, path=path) from e
            except BaseException:
                self._drop_connection()
                raise
            conn._rbd_used = True
            if resp.will_close:
                self._drop_connection()
            if not 200 <= resp.status < 300:
                raise self._error(resp, data, method, path)
            return resp.status, resp.headers, data
        raise AssertionError("unreachable")

    @staticmethod
    def _read(resp):
        n = resp.getheader("Content-Length")
        if n is None:
            return bytearray(resp.read())
        buf = bytearray(int(n))
        view = memoryview(buf)
        pos = 0
        while pos < len(buf):
            got = resp.readinto(view[pos:])
            if not got:
                raise http.client.IncompleteRead(bytes(view[:pos]), len(buf) - pos)
            pos += got
        return buf

    @staticmethod
    def _error(resp, data, method, path):
        message, code, rate_limit = None, None, None
        try:
            obj = json.loads(bytes(data))
            if isinstance(obj, dict):
                message, code, rate_limit = obj.get("error"), obj.get("code"), obj.get("rate_limit")
        except ValueError:
            pass
        if message is None:
            message = bytes(data[:4096]).decode("utf-8", "replace").strip() or resp.reason
        retry_after = resp.getheader("Retry-After")
        try:
            retry_after = float(retry_after) if retry_after is not None else None
        except ValueError:
            retry_after = None
        return error_for(resp.status, message, code, retry_after, method, path, rate_limit)

    def _json(self, method, path, obj=None, timeout=None):
        body = None if obj is None else json.dumps(obj, default=_json_default).encode()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        status, _, data = self._request(method, path, body, headers, timeout)
        return json.loads(bytes(data)) if data else None

    def _tensors(self, method, path, obj=None, timeout=None):
        body = None if obj is None else json.dumps(obj, default=_json_default).encode()
        headers = {"Accept": "application/octet-stream"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        _, _, data = self._request(method, path, body, headers, timeout)
        tensors, meta = safetensors.loads(data)
        b = Batch(tensors)
        b.metadata = meta
        return b

    def _retrying(self, call, retry):
        """call(), tried again after "rate_limited" answers for up to retry
        seconds, sleeping Retry-After (capped by what is left) between tries."""
        deadline = time.monotonic() + retry
        while True:
            try:
                return call()
            except RbdError as e:
                left = deadline - time.monotonic()
                if not e.rate_limited or left <= 0:
                    raise
                time.sleep(min(e.retry_after or 1.0, left))

    # -- buffers ------------------------------------------------------------

    def health(self):
        """``{"status": "ok", "memory": {...}}`` when the server is up (memory: the budgets in use)."""
        return self._json("GET", self._path("v1", "health"))

    def buffers(self):
        """Info of every buffer."""
        return self._json("GET", self._path("v1", "buffers"))["buffers"]

    def create_buffer(self, name, spec):
        """Create a buffer (or find an identical one); returns its info.

        ``spec`` is a dict as in docs/http-api.md (or a JSON string). A
        buffer of that name with a different spec raises Conflict (409).
        """
        body = spec if isinstance(spec, (str, bytes)) else json.dumps(spec, default=_json_default)
        if isinstance(body, str):
            body = body.encode()
        _, _, data = self._request("PUT", self._path("v1", "buffers", name), body,
                                   {"Content-Type": "application/json", "Accept": "application/json"})
        info = json.loads(bytes(data))
        self._specs[name] = info["spec"]
        return info

    def info(self, name, slice_len=None):
        """A buffer's info: spec, size, write_count, trajectories, bytes, ...
        With ``slice_len``, ``info["sampling"]["slices"]`` counts the
        trajectories slices of that length are drawn among."""
        query = None if slice_len is None else {"slice_len": int(slice_len)}
        info = self._json("GET", self._path("v1", "buffers", name, query=query))
        self._specs[name] = info["spec"]
        return info

    def delete_buffer(self, name):
        """Delete a buffer with all its rows."""
        self._specs.pop(name, None)
        self._request("DELETE", self._path("v1", "buffers", name))

    def _spec(self, name):
        s = self._specs.get(name)
        if s is None:
            s = self.info(name)["spec"]
        return s

    # -- writing ------------------------------------------------------------

    def _target_dtypes(self, name):
        spec = self._spec(name)
        out = {k: f["dtype"] for k, f in spec["fields"].items()}
        if spec.get("compact_obs"):
            for k in spec.get("obs_keys") or ["observation"]:
                if k in out:
                    out["next." + k] = out[k]
        return out

    def extend(self, name, rows, stream=None, env=None, cast=True, timeout_ms=None, policy_version=None):
        """Append rows: ``rows`` maps every field of the spec to an array
        ``[N, *shape]``; returns ``{"first_seq", "rows", "write_count"}``.

        ``stream`` names the writer (e.g. an actor id): rows of one (stream,
        env) continue that pair's open trajectory across calls, and a done
        row ends it. Without a stream, the request is its own stream and its
        open trajectories are closed (truncated) when it ends. ``env`` is an
        int for every row or an array ``[N]`` (or put ``"env"`` in rows);
        envs of one stream interleave freely. In a compact buffer send the
        final observation ``next.<k>`` either ``[N, ...]`` or one row per
        done row ``[D, ...]``.

        With ``cast`` (default), arrays are converted to the field's dtype
        when numpy calls that a same-kind cast (float64 -> float32, lists of
        ints -> int64; 0/1 integers -> bool); anything else raises TypeError
        naming the field before a byte is sent.

        ``policy_version`` is the version of the policy that produced the
        rows, an int for every row or an array ``[N]`` (or put
        ``"policy_version"`` in rows); samples can then ask for
        ``min_policy_version``.

        ``timeout_ms`` is how long the server may hold the request while the
        buffer's rate limiter makes actors wait for learners (default 0:
        answer at once); past it :class:`RateLimited` is raised, unless the
        client retries (``retry_rate_limited``).
        """
        want = self._target_dtypes(name) if cast else {}
        tensors, dtypes = {}, {}
        for k, v in rows.items():
            if k == "env" or (k == "policy_version" and k not in want):
                continue
            a = np.asarray(v)
            dt = want.get(k)
            if dt is not None:
                if dt == "bfloat16":
                    dtypes[k] = "bfloat16"
                else:
                    a = self._cast(k, a, dt)
            tensors[k] = a
        if "env" in rows:
            if env is not None:
                raise ValueError("env given both in rows and as an argument")
            env = rows["env"]
        if "policy_version" in rows and "policy_version" not in want:
            if policy_version is not None:
                raise ValueError("policy_version given both in rows and as an argument")
            policy_version = rows["policy_version"]
        n = len(np.asarray(rows["next.done"])) if "next.done" in rows else 0
        for key, per_row in (("env", env), ("policy_version", policy_version)):
            if per_row is not None:
                if np.isscalar(per_row):
                    per_row = np.full(n, int(per_row), dtype=np.int64)
                tensors[key] = np.asarray(per_row, dtype=np.int64)
        header, parts, _ = safetensors.encode(tensors, dtypes=dtypes)
        body = [header] + [safetensors.byte_view(p) for p in parts]
        path = self._path("v1", "buffers", name, "extend",
                          query={"stream": stream, "timeout_ms": None if timeout_ms is None else int(timeout_ms)})
        timeout = self.timeout + float(timeout_ms or 0) / 1000
        headers = {"Content-Type": "application/octet-stream", "Accept": "application/json"}
        try:
            _, _, data = self._retrying(lambda: self._request("POST", path, body, headers, timeout),
                                        self.retry_rate_limited)
        except RbdError as e:
            if e.status in (400, 404):
                self._specs.pop(name, None)  # the buffer may have been re-created
            raise
        return json.loads(bytes(data))

    @staticmethod
    def _cast(field, a, dt):
        target = np.dtype(safetensors.DTYPES[dt][1])
        if a.dtype == target:
            return a
        if a.dtype.kind in "iu" and target.kind == "b" and np.isin(a, (0, 1)).all():
            return a.astype(target)
        if a.size == 0 or np.can_cast(a.dtype, target, casting="same_kind"):
            return a.astype(target)
        raise TypeError("field %r: cannot send %s as %s (cast it yourself, or pass cast=False to let "
                        "the server reject it)" % (field, a.dtype, dt))

    def close_stream(self, name, stream):
        """Close a stream's open trajectories (as truncated); returns how many."""
        return self._json("DELETE", self._path("v1", "buffers", name, "streams", stream))["closed"]

    # -- reading ------------------------------------------------------------

    def sample(self, name, batch_size=None, sampler="uniform", as_torch=False, device=None, **options):
        """Draw a batch; returns a :class:`Batch` of numpy arrays.

        ``options`` are the other keys of a sample request
        (docs/sampling.md): ``seed``, ``keys``, ``n_step={"n": 3, "gamma":
        0.99}``, ``num_slices``, ``slice_len``, ``beta``, ``consumer``,
        ``timeout_ms`` (how long the server may wait for data and for the
        buffer's rate limiter), ... The arrays are zero-copy views over the answer
        (one buffer per batch, writable). ``as_torch=True`` returns torch
        tensors sharing that memory (moved to ``device`` if given); BF16
        fields come back as float32 in numpy.
        """
        return self._sample(name, batch_size, sampler, as_torch, device, self.retry_rate_limited, options)

    def _sample(self, name, batch_size, sampler, as_torch, device, retry, options):
        req = {"sampler": sampler}
        if batch_size is not None:
            req["batch_size"] = batch_size
        req.update(options)
        timeout = self.timeout + float(options.get("timeout_ms") or 0) / 1000
        path = self._path("v1", "buffers", name, "sample")
        batch = self._retrying(lambda: self._tensors("POST", path, req, timeout), retry)
        return _to_torch(batch, device) if as_torch else batch

    def update_priorities(self, name, seq, priority):
        """Set raw priorities of rows named by seq (e.g. |TD error| + eps).

        Returns ``{"updated": u, "stale": k}``; rows overwritten since they
        were sampled are stale and skipped.
        """
        seq = np.asarray(seq, dtype=np.int64).reshape(-1)
        priority = np.asarray(priority, dtype=np.float64).reshape(-1)
        if seq.shape != priority.shape:
            raise ValueError("%d seqs but %d priorities" % (seq.size, priority.size))
        return self._json("POST", self._path("v1", "buffers", name, "priorities"),
                          {"seq": seq.tolist(), "priority": priority.tolist()})

    def update(self, name, seq, fields, cast=True):
        """Set mutable fields of live rows named by seq: ``fields`` maps each
        field the spec marks ``"mutable": true`` to an array ``[N, *shape]``
        (e.g. recurrent states a learner recomputed, R2D2-style).

        Returns ``{"updated": u, "stale": k}``; rows overwritten since they
        were sampled are stale and skipped. With ``cast`` arrays are
        converted to the field's dtype as in :meth:`extend`.
        """
        seq = np.asarray(seq, dtype=np.int64).reshape(-1)
        want = self._target_dtypes(name) if cast else {}
        tensors, dtypes = {"seq": seq}, {}
        for k, v in fields.items():
            if k == "seq":
                raise ValueError("seq is given as its own argument, not a field")
            a = np.asarray(v)
            dt = want.get(k)
            if dt == "bfloat16":
                dtypes[k] = "bfloat16"
            elif dt is not None:
                a = self._cast(k, a, dt)
            if a.ndim == 0 or a.shape[0] != seq.size:
                raise ValueError("field %r: %s rows for %d seqs" % (k, a.shape[0] if a.ndim else "no", seq.size))
            tensors[k] = a
        header, parts, _ = safetensors.encode(tensors, dtypes=dtypes)
        body = [header] + [safetensors.byte_view(p) for p in parts]
        headers = {"Content-Type": "application/octet-stream", "Accept": "application/json"}
        try:
            _, _, data = self._request("POST", self._path("v1", "buffers", name, "update"), body, headers, self.timeout)
        except RbdError as e:
            if e.status in (400, 404):
                self._specs.pop(name, None)  # the buffer may have been re-created
            raise
        return json.loads(bytes(data))

    def rows(self, name, from_seq=0, count=100):
        """Live rows with seq >= from_seq, in seq order: every stored field
        plus seq, traj_id, step, prev_seq, next_seq. May hold fewer than
        ``count`` rows (answers are capped); page with ``iter_rows``."""
        return self._tensors("GET", self._path("v1", "buffers", name, "rows",
                                               query={"from_seq": int(from_seq), "count": int(count)}))

    def iter_rows(self, name, from_seq=0, page=4096):
        """Yield pages (Batch) of live rows from ``from_seq`` to the newest."""
        while True:
            b = self.rows(name, from_seq, page)
            if len(b["seq"]) == 0:
                return
            yield b
            from_seq = int(b["seq"][-1]) + 1

    def iter_samples(self, name, batch_size=None, sampler="uniform", depth=2, batches=None,
                     stop_at_epoch_end=False, transport="auto", **options):
        """Iterate over batches drawn ``depth`` batches ahead of the consumer.

        ``transport`` says how the batches travel: ``"stream"`` (one sample
        stream, the server draws ahead: :class:`SampleStream`),
        ``"requests"`` (one request per batch from a background thread:
        :class:`Prefetcher`) or ``"auto"`` (the default: the fastest that
        works, a stream today). The iterator's ``transport`` attribute says
        which one is used; against a server older than sample streams,
        ``"auto"`` falls back to ``"requests"`` at the first ``next()``.
        Both retry "not_ready" for ``retry_not_ready``
        seconds and "rate_limited" for ``retry_rate_limited`` seconds (by
        default the client's), and give batch i the seed ``seed + i``."""
        if transport == "auto" and self._colocated():
            return ShmStream(self, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options, auto=True)
        if transport == "shm":
            return ShmStream(self, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options)
        if transport in ("auto", "stream"):
            return SampleStream(self, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options,
                                auto=transport == "auto")
        if transport == "requests":
            return Prefetcher(self, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options)
        raise ValueError("transport %r: want \"auto\", \"shm\", \"stream\" or \"requests\"" % (transport,))

    def _colocated(self):
        """Whether the server may be on this machine: its host is a loopback
        address or one of this machine's (the arena check decides)."""
        try:
            addrs = {ai[4][0] for ai in socket.getaddrinfo(self._host, self._port, proto=socket.IPPROTO_TCP)}
        except OSError:
            return False
        if any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
            return True
        try:
            mine = set(socket.gethostbyname_ex(socket.gethostname())[2])
        except OSError:
            return False
        return bool(addrs & mine)

    def set_rate_limit(self, name, limit):
        """Replace a buffer's rate limit, e.g. ``{"samples_per_insert": 8,
        "min_size": 1000, "error_buffer": 4000}``, or remove it with None.

        Returns the limiter's state after the change (None once removed).
        The change is durable; the counters restart at the new window's
        centre and waiting requests are judged again (docs/flow-control.md).
        """
        body = json.dumps(limit).encode()
        _, _, data = self._request("PUT", self._path("v1", "buffers", name, "rate_limit"), body,
                                   {"Content-Type": "application/json", "Accept": "application/json"})
        return json.loads(bytes(data))["rate_limit"]

    # -- collectors -----------------------------------------------------------

    def collector(self, name):
        """A server-run collector's live state (``rbd serve --demo``):
        ``policy``, ``weights_version``, ``frames``, ``episodes``,
        ``mean_episode_length`` of the last 100 episodes, ``rate_limited``,
        ..."""
        return self._json("GET", self._path("v1", "collectors", name))

    def set_weights(self, collector, tensors):
        """Replace a collector's policy weights (``rbd serve --demo``: an MLP
        Q-network ``{"w1": [4, H], "b1": [H], "w2": [H, 2], "b2": [2]}`` or a
        linear one ``{"w": [4, 2], "b": [2]}``, float32, either optionally
        with ``"epsilon"``, the probability of a random action)."""
        t = {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}
        header, parts, _ = safetensors.encode(t)
        body = [header] + [safetensors.byte_view(p) for p in parts]
        _, _, data = self._request("PUT", self._path("v1", "collectors", collector, "weights"), body,
                                   {"Content-Type": "application/octet-stream", "Accept": "application/json"})
        return json.loads(bytes(data))

    def metrics(self):
        """The Prometheus text of /metrics."""
        _, _, data = self._request("GET", self._path("metrics"))
        return bytes(data).decode()


class _AheadIterator:
    """What Prefetcher and SampleStream share: the request they repeat, the
    ``seed + i`` rule, and how long to keep retrying not_ready and
    rate_limited answers."""

    def __init__(self, client, name, batch_size, sampler, batches, stop_at_epoch_end, options):
        self._client = client
        self._name = name
        self._batch_size, self._sampler = batch_size, sampler
        self._as_torch, self._device = options.pop("as_torch", False), options.pop("device", None)
        self._retry = float(options.pop("retry_not_ready", 0) or 0)
        self._retry_limited = float(options.pop("retry_rate_limited", client.retry_rate_limited) or 0)
        self._options = options
        self._batches = batches
        self._stop_at_epoch_end = stop_at_epoch_end
        self._waiting_since = None

    def _options_for(self, i):
        """The request options of batch i: a fixed seed becomes seed + i."""
        opts = dict(self._options)
        if opts.get("seed") is not None:
            opts["seed"] = int(opts["seed"]) + i
        return opts

    def _retry_wait(self, e):
        """Seconds to wait before trying again after the error e, or None to
        hand it on (not a retried code, or retried long enough)."""
        if e.not_ready:
            retry, pause = self._retry, min(0.05, e.retry_after or 0.05)
        elif e.rate_limited:
            retry, pause = self._retry_limited, e.retry_after or 1.0
        else:
            return None
        self._waiting_since = self._waiting_since or time.monotonic()
        left = self._waiting_since + retry - time.monotonic()
        return min(pause, left) if left > 0 else None

    def __iter__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Prefetcher(_AheadIterator):
    """Batches sampled by a background thread while the consumer works.

    A daemon thread calls ``client.sample(...)`` on its own connection and
    keeps up to ``depth`` batches queued. Iterating yields them in order;
    an error in the thread (e.g. the buffer was deleted) is raised by the
    ``next()`` that would have returned the failed batch. It stops after
    ``batches`` batches (None: never), after an ``epoch_end`` batch when
    ``stop_at_epoch_end``, or on :meth:`close` (also a context manager).

    A fixed ``seed`` option is turned into ``seed + i`` for the i-th batch,
    so batches differ yet a run is reproducible for the same store state.
    Prefetched batches were drawn before the priorities of the batches
    before them were updated (one or ``depth`` batches of staleness).
    With ``retry_not_ready=S`` (seconds) the thread keeps retrying a 503
    not_ready for up to S seconds before handing the error on (default 0);
    ``retry_rate_limited=S`` does the same for 503 rate_limited (default:
    the client's ``retry_rate_limited``). Each retry waits at most the
    server's Retry-After, and :meth:`close` interrupts it.
    """

    transport = "requests"

    def __init__(self, client, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options):
        if depth < 1:
            raise ValueError("depth must be at least 1")
        super().__init__(client, name, batch_size, sampler, batches, stop_at_epoch_end, options)
        self._q = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="rbd-prefetch-" + name, daemon=True)
        self._thread.start()

    def _put(self, item):
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self):
        i = 0
        try:
            while not self._stop.is_set() and (self._batches is None or i < self._batches):
                try:
                    b = self._client._sample(self._name, self._batch_size, self._sampler,
                                             self._as_torch, self._device, 0, self._options_for(i))
                except RbdError as e:
                    wait = self._retry_wait(e)
                    if wait is None:
                        raise
                    self._stop.wait(wait)
                    continue
                self._waiting_since = None
                i += 1
                if not self._put(("batch", b)):
                    return
                if self._stop_at_epoch_end and b.epoch_end:
                    break
            self._put(("end", None))
        except BaseException as e:  # handed to the consumer
            self._put(("error", e))
        finally:
            self._client._drop_connection()  # this thread's connection

    def __next__(self):
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, v = self._q.get(timeout=0.1)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    self._done = True
                    raise StopIteration
        if kind == "batch":
            return v
        self._done = True
        self._stop.set()
        if kind == "error":
            raise v
        raise StopIteration

    def close(self):
        """Stop the thread and wait for it (at most one request's time)."""
        self._stop.set()
        self._done = True
        self._thread.join()

    def __del__(self):
        self._stop.set()


# The top bit of a stream frame's length word marks an error frame, the
# next one a frame naming a slot of a shared-memory arena.
_FRAME_ERROR = 1 << 63
_FRAME_ARENA = 1 << 62
_STREAM_TYPE = "application/vnd.rbd.sample-stream"


class SampleStream(_AheadIterator):
    """Batches from one sample stream (``POST .../sample?stream=1``).

    One request on a connection of its own; the server draws up to
    ``depth`` batches ahead and TCP paces it, so the learner pays no round
    trip per batch and runs no thread. Batch i of a request with ``seed``
    is what ``sample(..., seed=seed + i)`` returns for the same store
    state. It ends after ``batches`` batches (None: never), after an
    ``epoch_end`` batch when ``stop_at_epoch_end`` (the server stops there
    too), or on :meth:`close` (also a context manager). An error the server
    meets mid-stream (the buffer was deleted, it shuts down) is raised by
    the ``next()`` that would have returned the batch. "not_ready" and
    "rate_limited" are retried for ``retry_not_ready`` /
    ``retry_rate_limited`` seconds by opening the stream again where it
    stopped. Prefetched batches were drawn before the priorities of the
    batches before them were updated (up to ``depth + 1`` batches of
    staleness). Closing a stream early discards the batches drawn ahead;
    for without-replacement samplers their rows count as drawn.
    """

    transport = "stream"
    _stream = "1"  # the query's stream value

    def __init__(self, client, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options, auto=False):
        if not 1 <= depth <= 64:
            raise ValueError("depth must be in [1, 64]")
        if batches is not None and batches < 1:
            raise ValueError("batches must be at least 1 (None: until close)")
        # What a fallback to plain requests would be made from ("auto"
        # against a server older than streams).
        self._auto = auto
        self._fallback = None
        self._args = (client, name, batch_size, sampler, depth, batches, stop_at_epoch_end, dict(options))
        super().__init__(client, name, batch_size, sampler, batches, stop_at_epoch_end, options)
        self._depth = depth
        self._path = client._path("v1", "buffers", name, "sample", query={"stream": self._stream})
        self._conn = self._resp = None
        self._got = 0
        self._done = False

    def _open(self):
        req = {"sampler": self._sampler, "depth": self._depth}
        if self._batch_size is not None:
            req["batch_size"] = self._batch_size
        req.update(self._options_for(self._got))
        if self._batches is not None:
            req["batches"] = self._batches - self._got
        if self._stop_at_epoch_end:
            req["stop_at_epoch_end"] = True
        body = json.dumps(req, default=_json_default).encode()
        c = self._client
        conn = c._new_connection(c.timeout + float(self._options.get("timeout_ms") or 0) / 1000)
        with c._lock:
            c.connections_opened += 1
        hdrs = c._headers({"Content-Type": "application/json", "Accept": "application/octet-stream",
                           "Content-Length": str(len(body))})
        try:
            conn.request("POST", self._path, body=body, headers=hdrs)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise ConnectionFailed(0, "cannot open a sample stream on %s: %s" % (c.url, e),
                                   method="POST", path=self._path) from e
        if resp.status != 200:
            data = c._read(resp)
            conn.close()
            raise c._error(resp, data, "POST", self._path)
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        if ctype != _STREAM_TYPE:
            conn.close()
            raise ConnectionFailed(0, "sample stream: content type %r, want %s (a server older than streams?)"
                                   % (ctype, _STREAM_TYPE), method="POST", path=self._path)
        try:
            self._opened(resp)
        except BaseException:
            conn.close()
            raise
        self._conn, self._resp = conn, resp

    def _opened(self, resp):
        """Called with the stream's answer before the first frame."""

    def _read_exact(self, buf):
        view = memoryview(buf)
        pos = 0
        while pos < len(buf):
            try:
                got = self._resp.readinto(view[pos:])
            except (OSError, http.client.HTTPException) as e:
                raise ConnectionFailed(0, "sample stream on %s lost after %d batches: %s" % (self._client.url, self._got, e),
                                       method="POST", path=self._path) from e
            if not got:
                raise ConnectionFailed(0, "sample stream on %s cut short after %d batches" % (self._client.url, self._got),
                                       method="POST", path=self._path)
            pos += got

    def _frame(self):
        word = bytearray(8)
        self._read_exact(word)
        n = int.from_bytes(word, "little")
        if n & _FRAME_ERROR:
            self._raise_error_frame(n)
        if n & _FRAME_ARENA:
            ref = bytearray(n & ~_FRAME_ARENA)
            self._read_exact(ref)
            buf = self._arena_batch(ref)
        else:
            buf = bytearray(n)
            self._read_exact(buf)
        return self._batch(buf)

    def _raise_error_frame(self, n):
        payload = bytearray(n & ~_FRAME_ERROR)
        self._read_exact(payload)
        obj = json.loads(bytes(payload))
        raise error_for(obj.get("status", 500), obj.get("error", "error frame"), obj.get("code"), None,
                        "POST", self._path, obj.get("rate_limit"))

    @staticmethod
    def _batch(buf):
        tensors, meta = safetensors.loads(buf)
        b = Batch(tensors)
        b.metadata = meta
        return b

    def _arena_batch(self, ref):
        raise ConnectionFailed(0, "sample stream: the server sent a shared-memory frame on a socket stream",
                               method="POST", path=self._path)

    def _drop(self):
        if getattr(self, "_conn", None) is not None:
            self._conn.close()
        self._conn = self._resp = None

    @staticmethod
    def _older_server(e):
        """Whether opening a stream failed because the server has no
        sample streams: it refused the stream's keys, or answered a plain
        batch."""
        if isinstance(e, ConnectionFailed):
            return "older than streams" in e.message
        return e.status == 400 and "unknown key" in e.message and any(
            e.message.startswith(k + ":") or '"%s"' % k in e.message for k in ("depth", "batches", "stop_at_epoch_end"))

    def __next__(self):
        if self._fallback is not None:
            return next(self._fallback)
        if self._done or (self._batches is not None and self._got >= self._batches):
            self.close()
            raise StopIteration
        while True:
            try:
                if self._resp is None:
                    self._open()
                b = self._frame()
                break
            except RbdError as e:
                self._drop()
                if self._auto and self._got == 0 and self._older_server(e):
                    # A server older than streams: one request per batch
                    # from a thread, as transport="requests".
                    client, name, batch_size, sampler, depth, batches, stop, options = self._args
                    self._fallback = Prefetcher(client, name, batch_size, sampler, depth, batches, stop, options)
                    self.transport = "requests"
                    return next(self._fallback)
                wait = self._retry_wait(e)
                if wait is None:
                    self._done = True
                    raise
                time.sleep(wait)
            except BaseException:
                self.close()
                raise
        self._waiting_since = None
        self._got += 1
        if self._stop_at_epoch_end and b.epoch_end:
            self._done = True
        return _to_torch(b, self._device) if self._as_torch else b

    def close(self):
        """End the stream; the server stops drawing and frees what it held."""
        self._done = True
        self._drop()
        if self._fallback is not None:
            self._fallback.close()

    def __del__(self):
        self._drop()


class _NotColocated(Exception):
    """The server's arena cannot be mapped here: another machine, or user."""


def _release_slot(mm, offset):
    """Hand an arena slot back to the server: its batch is gone."""
    try:
        struct.pack_into("<I", mm, offset, 0)
    except (ValueError, TypeError):  # the arena is closed already
        pass


# A version 2 arena's shared words (docs/format.md, "Sample arenas").
_ARENA_WAITING, _ARENA_RING_OFF, _ARENA_CONSUMED, _RING_ENTRY = 48, 52, 56, 32
_U32, _U64, _RING_REST = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<QI")
# Version 2 arenas are read with plain loads from Python (no acquire
# ordering is available), which is enough where loads are not reordered
# with older loads (x86); elsewhere (ARM) the client asks for version 1,
# whose batches are announced on the socket: the read's system call
# orders the loads that follow it.
_RING_LOADS_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")

# How long a learner that finds no batch ready polls the ring before it
# sleeps on the socket: a wake-up costs both sides a system call, and a
# batch is usually this close.
_RING_SPIN_S = 100e-6


class ShmStream(SampleStream):
    """A sample stream whose batches arrive in shared memory (``?stream=shm``).

    For a learner on the server's machine: the server copies each batch
    into a slot of an arena it shares with this process (a memfd, opened
    through ``/proc/<server pid>/fd/<fd>``, so only the server's user or
    root can map it) and announces it in a ring in the arena, so taking a
    batch that is ready costs no system call; the socket only wakes a
    learner that waits (after polling the ring for 100 µs), and carries
    errors. A batch's arrays are views into the arena, with no copy; its
    slot goes back to the server when the last array (or torch tensor) made
    from the batch is gone. A learner that keeps more than 4 batches alive
    at once makes the server wait for it (copy what you keep). Everything
    else is :class:`SampleStream`'s; errors, seeds and retries behave the
    same. Against a server with only version 1 arenas, each batch is named
    by a frame on the socket instead; ``arena_version`` says which (None
    until the first batch, and after a fall back to a socket stream).
    """

    transport = "shm"
    _stream = "shm"

    def __init__(self, client, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options, auto=False):
        super().__init__(client, name, batch_size, sampler, depth, batches, stop_at_epoch_end, options, auto=auto)
        arena = "2" if _RING_LOADS_ORDERED else "1"
        self._path = client._path("v1", "buffers", name, "sample", query={"stream": "shm", "arena": arena})
        self.arena_version = None

    def _open(self):
        try:
            super()._open()
        except _NotColocated as e:
            if not self._auto:
                raise ConnectionFailed(0, "shared memory: %s" % e, method="POST", path=self._path) from e
            # Not on the server's machine after all: frames on the socket.
            self.transport, self._stream, self.arena_version = "stream", "1", None
            self._path = self._client._path("v1", "buffers", self._name, "sample", query={"stream": "1"})
            super()._open()

    def _opened(self, resp):
        if self._stream != "shm":
            return
        path, nonce = resp.getheader("X-Rbd-Arena"), resp.getheader("X-Rbd-Arena-Nonce")
        if not path or not nonce:
            raise ConnectionFailed(0, "sample stream: the answer names no arena", method="POST", path=self._path)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            raise _NotColocated("cannot open the server's arena %s: %s" % (path, e)) from e
        try:
            mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        magic, version, slots, slot_bytes = struct.unpack_from("<8sIIQ", mm, 0)
        (data_off,) = struct.unpack_from("<Q", mm, 40)
        if magic != b"RBDARENA" or version not in (1, 2) or bytes(mm[24:40]).hex() != nonce:
            mm.close()
            raise _NotColocated("%s is not this stream's arena (another machine's process?)" % path)
        self._mm, self._slots, self._slot_bytes, self._data_off = mm, slots, slot_bytes, data_off
        self.arena_version = version
        self._ring_off = _U32.unpack_from(mm, _ARENA_RING_OFF)[0]
        if version == 2 and not (64 + 4 * slots <= self._ring_off and self._ring_off + _RING_ENTRY * slots <= data_off):
            mm.close()
            raise ConnectionFailed(0, "sample stream: the arena's ring is outside its header", method="POST", path=self._path)
        self._taken = 0  # batches taken from this arena's ring

    def _frame(self):
        if self.arena_version != 2:
            return super()._frame()
        mm, want = self._mm, self._taken + 1
        entry = self._ring_off + (self._taken % self._slots) * _RING_ENTRY
        if _U64.unpack_from(mm, entry)[0] != want:
            self._await(entry, want)
        length, slot = _RING_REST.unpack_from(mm, entry + 8)
        self._taken = want
        _U64.pack_into(mm, _ARENA_CONSUMED, want)
        return self._batch(self._slot_view(slot, length))

    def _await(self, entry, want):
        """Wait until the ring's entry announces batch ``want``: poll it for
        a moment, then sleep on the socket until the server wakes us (or
        sends an error frame)."""
        mm = self._mm
        deadline = time.perf_counter() + _RING_SPIN_S
        while time.perf_counter() < deadline:
            if _U64.unpack_from(mm, entry)[0] == want:
                return
        while True:
            _U32.pack_into(mm, _ARENA_WAITING, 1)
            if _U64.unpack_from(mm, entry)[0] == want:
                _U32.pack_into(mm, _ARENA_WAITING, 0)
                return
            word = bytearray(8)
            self._read_exact(word)
            n = int.from_bytes(word, "little")
            if n & _FRAME_ERROR:
                self._raise_error_frame(n)
            if n != _FRAME_ARENA:
                raise ConnectionFailed(0, "sample stream: a frame of %#x on a shared-memory stream, want a wake-up" % n,
                                       method="POST", path=self._path)
            if _U64.unpack_from(mm, entry)[0] == want:
                return

    def _arena_batch(self, ref):
        return self._slot_view(*struct.unpack_from("<I4xQ", ref, 0))

    def _slot_view(self, slot, length):
        """The batch in an arena slot, as an array that hands the slot back
        when it (and every view of it) is gone."""
        if slot >= self._slots or length > self._slot_bytes:
            raise ConnectionFailed(0, "sample stream: slot %d of %d bytes is outside the arena" % (slot, length),
                                   method="POST", path=self._path)
        owner = np.frombuffer(self._mm, dtype=np.uint8, count=length, offset=self._data_off + slot * self._slot_bytes)
        weakref.finalize(owner, _release_slot, self._mm, 64 + 4 * slot)
        return owner
