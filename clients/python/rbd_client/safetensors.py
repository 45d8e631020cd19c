"""A safetensors reader and writer on json + numpy.

The format: an 8-byte little-endian header length N, N bytes of a JSON
object ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}`` padded with spaces, then the raw little-endian
tensor bytes.

The reader is as strict as rbd's Go decoder (``codec/safetensors.go``): the
header is capped, must be one JSON object, entries have exactly the keys
dtype, shape and data_offsets, dtypes are known, shapes match the byte
counts, and the offsets tile the data exactly. The writer lays a file out
as the Go encoder does (``__metadata__`` first with sorted keys, tensors in
the given order, compact JSON, spaces to a multiple of 8 bytes), so the two
can be compared byte for byte.

Arrays returned by :func:`loads` are views over the buffer passed in (no
copy): writable when the buffer is (a ``bytearray``), read-only over
``bytes``.
"""

import json
import struct

import numpy as np

__all__ = [
    "SafetensorsError", "loads", "dumps", "encode", "load", "dump",
    "DTYPES", "to_bfloat16_bits", "from_bfloat16_bits",
]

MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """A malformed safetensors file, or tensors that cannot be written."""


# rbd dtype name -> (safetensors name, numpy dtype or None for bfloat16).
DTYPES = {
    "bool": ("BOOL", np.dtype(np.bool_)),
    "uint8": ("U8", np.dtype(np.uint8)),
    "int8": ("I8", np.dtype(np.int8)),
    "int16": ("I16", np.dtype("<i2")),
    "int32": ("I32", np.dtype("<i4")),
    "int64": ("I64", np.dtype("<i8")),
    "float16": ("F16", np.dtype("<f2")),
    "bfloat16": ("BF16", None),
    "float32": ("F32", np.dtype("<f4")),
    "float64": ("F64", np.dtype("<f8")),
}
_ST_TO_RBD = {st: name for name, (st, _) in DTYPES.items()}
_ITEMSIZE = {name: (2 if dt is None else dt.itemsize) for name, (_, dt) in DTYPES.items()}


def rbd_dtype(a):
    """The rbd dtype name of a numpy array's dtype (ValueError if none)."""
    dt = np.dtype(a.dtype)
    for name, (_, npdt) in DTYPES.items():
        if npdt is not None and dt.kind == npdt.kind and dt.itemsize == npdt.itemsize:
            return name
    raise SafetensorsError("numpy dtype %s has no safetensors equivalent" % dt)


def to_bfloat16_bits(a):
    """float array -> uint16 bfloat16 bits, rounded to nearest even (NaN kept NaN)."""
    f = np.asarray(a, dtype="<f4", order="C")
    u = f.view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(f)
    out = rounded.astype("<u2")
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype("<u2")  # keep sign, quiet NaN
    return out.reshape(f.shape)


def from_bfloat16_bits(bits):
    """uint16 bfloat16 bits -> float32 array (exact)."""
    b = np.asarray(bits, dtype="<u2")
    return (b.astype("<u4") << 16).view("<f4")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _header(buf):
    if len(buf) < 8:
        raise SafetensorsError("%d bytes is shorter than the 8-byte header length" % len(buf))
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError("header length %d exceeds %d" % (n, MAX_HEADER_BYTES))
    if n > len(buf) - 8:
        raise SafetensorsError("header length %d exceeds the %d bytes that follow" % (n, len(buf) - 8))
    raw = bytes(memoryview(buf)[8:8 + n]).rstrip(b" ")
    if not raw.startswith(b"{"):
        raise SafetensorsError("header is not a JSON object")
    try:
        text = raw.decode("utf-8")
        header, end = json.JSONDecoder().raw_decode(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError("header: %s" % e) from None
    if end != len(text):
        raise SafetensorsError("header: data after the JSON object")
    return n, header


def _entry(name, e):
    if not isinstance(e, dict):
        raise SafetensorsError("tensor %r: entry must be an object" % name)
    for k in e:
        if k not in ("dtype", "shape", "data_offsets"):
            raise SafetensorsError("tensor %r: unknown key %r" % (name, k))
    st = e.get("dtype")
    if not isinstance(st, str):
        raise SafetensorsError("tensor %r: dtype must be a string" % name)
    if st not in _ST_TO_RBD:
        raise SafetensorsError("tensor %r: unknown dtype %r" % (name, st))
    shape = e.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise SafetensorsError("tensor %r: missing shape (a list of integers)" % name)
    if any(d < 0 for d in shape):
        raise SafetensorsError("tensor %r: negative dimension in shape %s" % (name, shape))
    offs = e.get("data_offsets")
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
        raise SafetensorsError("tensor %r: data_offsets must be [begin, end]" % name)
    return _ST_TO_RBD[st], shape, offs[0], offs[1]


# Layouts of recently decoded headers: a learner decodes the same header
# (the same keys and shapes) batch after batch, and checking it costs more
# than making the arrays. Keyed by the header's exact bytes and the file's
# size, so a hit is a header already checked against the same data length.
_LAYOUTS = {}
_LAYOUTS_MAX = 16


def loads(buf, bfloat16="float32"):
    """Decode a safetensors file held in ``buf`` (bytes, bytearray, memoryview).

    Returns ``(tensors, metadata)``: a dict of numpy arrays in data order,
    each a view over ``buf``, and the ``__metadata__`` dict (empty if none).
    ``bfloat16`` says how BF16 tensors come back: ``"float32"`` (widened,
    a copy; numpy has no bfloat16) or ``"bits"`` (uint16 view).
    """
    key = None
    if len(buf) >= 8:
        (n,) = struct.unpack_from("<Q", buf, 0)
        if n <= 4096 and n <= len(buf) - 8:
            key = (bytes(memoryview(buf)[8:8 + n]), len(buf))
            layout = _LAYOUTS.get(key)
            if layout is not None:
                return _arrays(buf, layout, bfloat16)
    layout = _layout(buf)
    if key is not None:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = layout
    return _arrays(buf, layout, bfloat16)


def _arrays(buf, layout, bfloat16):
    meta, tensors = layout
    out = {}
    for name, npdt, shape, offset, count in tensors:
        if npdt is None:
            a = np.frombuffer(buf, dtype="<u2", count=count, offset=offset).reshape(shape)
            if bfloat16 == "float32":
                a = from_bfloat16_bits(a)
        else:
            a = np.frombuffer(buf, dtype=npdt, count=count, offset=offset).reshape(shape)
        out[name] = a
    return out, dict(meta)


def _layout(buf):
    """Check a header against its file; return (metadata, [(name, numpy
    dtype or None for BF16, shape, byte offset, element count)]) in data
    order."""
    n, header = _header(buf)
    data_len = len(buf) - 8 - n
    base = 8 + n
    meta = {}
    located = []
    for name, e in header.items():
        if name == "__metadata__":
            if not isinstance(e, dict) or not all(isinstance(v, str) for v in e.values()):
                raise SafetensorsError("__metadata__ must map strings to strings")
            meta = dict(e)
            continue
        dtype, shape, lo, hi = _entry(name, e)
        if lo < 0 or hi < lo or hi > data_len:
            raise SafetensorsError("tensor %r: data_offsets [%d, %d] outside the %d data bytes"
                                   % (name, lo, hi, data_len))
        count = 1
        for d in shape:
            count *= d
        if count * _ITEMSIZE[dtype] != hi - lo:
            raise SafetensorsError("tensor %r: shape %s of %d-byte elements needs %d bytes, has %d"
                                   % (name, shape, _ITEMSIZE[dtype], count * _ITEMSIZE[dtype], hi - lo))
        located.append((lo, hi - lo, name, dtype, shape, count))
    located.sort()
    pos = 0
    tensors = []
    for lo, size, name, dtype, shape, count in located:
        if lo != pos:
            raise SafetensorsError("tensor %r starts at %d, want %d (offsets must be contiguous and not overlap)"
                                   % (name, lo, pos))
        pos += size
        tensors.append((name, DTYPES[dtype][1], tuple(shape), base + lo, count))
    if pos != data_len:
        raise SafetensorsError("tensors cover %d of the %d data bytes" % (pos, data_len))
    return meta, tensors


def encode(tensors, metadata=None, dtypes=None):
    """Lay out tensors for sending without joining them.

    ``tensors`` maps names to arrays (anything ``np.asarray`` takes), in the
    order they are written. ``dtypes`` optionally maps a name to the rbd
    dtype to write it as (e.g. ``"bfloat16"``: a float array is rounded, a
    uint16 array taken as bits). Returns ``(header, parts, total)``: the
    8-byte length plus JSON header, the data of each tensor as a contiguous
    little-endian array, and the total size in bytes.
    """
    dtypes = dtypes or {}
    parts = []
    entries = []
    off = 0
    for name, v in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError("tensor name %r is reserved or not a string" % (name,))
        want = dtypes.get(name)
        if want == "bfloat16":
            a = np.asarray(v)
            a = np.asarray(a, dtype="<u2", order="C") if a.dtype == np.uint16 else to_bfloat16_bits(a)
            dt = "bfloat16"
        else:
            a = np.asarray(v) if want is None else np.asarray(v, dtype=DTYPES[want][1])
            dt = rbd_dtype(a)
            a = np.asarray(a, dtype=DTYPES[dt][1], order="C")  # little-endian, C order (keeps 0-d)
        entries.append((name, {"dtype": DTYPES[dt][0], "shape": list(a.shape),
                               "data_offsets": [off, off + a.nbytes]}))
        off += a.nbytes
        parts.append(a)
    text = "{"
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError("__metadata__ must map strings to strings")
        text += '"__metadata__":' + json.dumps(dict(sorted(metadata.items())), separators=(",", ":"),
                                                ensure_ascii=False)
        if entries:
            text += ","
    text += ",".join(json.dumps(name, ensure_ascii=False) + ":" + json.dumps(e, separators=(",", ":"))
                     for name, e in entries)
    text += "}"
    h = text.encode("utf-8")
    h += b" " * (-(8 + len(h)) % 8)
    header = struct.pack("<Q", len(h)) + h
    return header, parts, len(header) + off


def dumps(tensors, metadata=None, dtypes=None):
    """Encode tensors (see :func:`encode`) into one bytes object."""
    header, parts, _ = encode(tensors, metadata, dtypes)
    return b"".join([header] + [byte_view(p) for p in parts])


def byte_view(a):
    """A flat uint8 memoryview of a contiguous array (no copy)."""
    return memoryview(a.reshape(-1).view(np.uint8))


def load(path, **kw):
    """Read a safetensors file (arrays are views over a private copy of it)."""
    with open(path, "rb") as f:
        return loads(bytearray(f.read()), **kw)


def dump(path, tensors, metadata=None, dtypes=None):
    """Write tensors to a safetensors file."""
    with open(path, "wb") as f:
        f.write(dumps(tensors, metadata, dtypes))
