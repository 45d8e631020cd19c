"""Read a safetensors file with plain json + numpy and check it against a
JSON sidecar: python3 read_safetensors.py FILE EXPECTED.json; prints OK."""
import json, struct, sys
import numpy as np

NP = {"BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
      "F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}

raw = open(sys.argv[1], "rb").read()
want = json.load(open(sys.argv[2]))
(n,) = struct.unpack("<Q", raw[:8])
assert (8 + n) % 8 == 0 and raw[8:9] == b"{", "header not padded to 8 or not an object"
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
assert header.pop("__metadata__", {}) == want["metadata"], "metadata differs"
assert sorted(header) == sorted(want["tensors"]), "tensor names differ"
got = {}
for name, info in header.items():
    exp = want["tensors"][name]
    assert info["dtype"] == exp["st_dtype"], (name, info["dtype"])
    begin, end = info["data_offsets"]
    a = np.frombuffer(data[begin:end], dtype=NP[info["dtype"]]).reshape(info["shape"])
    assert list(a.shape) == exp["shape"], (name, a.shape)
    got[name] = a
    if "values" not in exp:  # checked below
        continue
    if info["dtype"] == "BF16":  # no numpy bfloat16: widen the bits
        a = (a.astype("<u4").ravel() << 16).view("<f4").reshape(a.shape)
    if a.dtype.kind == "f":
        e = np.array([float(v) for v in exp["values"]], dtype=np.float64).reshape(exp["shape"])
        with np.errstate(invalid="ignore"):  # signalling NaNs
            ok = np.array_equal(a.astype(np.float64), e, equal_nan=True)
        ok = ok and np.array_equal(np.signbit(a)[~np.isnan(e)], np.signbit(e)[~np.isnan(e)])
    else:
        ok = np.array_equal(a, np.array(exp["values"], dtype=a.dtype).reshape(exp["shape"]))
    assert ok, (name, a.ravel()[:10], exp["values"][:10])
for src, dst in want.get("f16_from_f32", []):  # numpy's own float32 -> float16 rounding
    with np.errstate(invalid="ignore", over="ignore"):
        bits = got[src].astype(np.float16).view("<u2")
    mine = got[dst].view("<u2")
    bad = (bits != mine) & ~np.isnan(got[src])
    assert not bad.any(), (dst, got[src][bad][:5], bits[bad][:5], mine[bad][:5])
print("OK")
