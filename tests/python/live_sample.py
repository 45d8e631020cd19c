"""Sample from a running rbd server with nothing but urllib, json and numpy,
and print the answer's tensors as JSON.

    python3 live_sample.py URL [REQUEST_JSON]

URL is a buffer's sample endpoint, e.g.
http://127.0.0.1:7450/v1/buffers/demo/sample. REQUEST_JSON defaults to a
seeded request, {"batch_size": 32, "seed": 7}. Prints one JSON object:
{"request": ..., "content_type": ..., "metadata": {...},
 "tensors": {name: {"dtype": "F32", "shape": [...], "values": [flat, C order]}}}.
"""
import json
import struct
import sys
import urllib.request

import numpy as np

NP = {"BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
      "F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}


def read_safetensors(buf):
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype=NP[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], a)
    return out, meta


def plain(v):
    """A JSON-safe Python value; non-finite floats as rbd spells them."""
    if isinstance(v, float) and v != v:
        return "NaN"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def main():
    url = sys.argv[1]
    request = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"batch_size": 32, "seed": 7}
    req = urllib.request.Request(url, data=json.dumps(request).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        ctype = resp.headers.get("Content-Type")
        body = resp.read()
    tensors, meta = read_safetensors(body)
    out = {"request": request, "content_type": ctype, "metadata": meta, "tensors": {}}
    for name, (dtype, a) in tensors.items():
        out["tensors"][name] = {"dtype": dtype, "shape": list(a.shape),
                                "values": [plain(v) for v in a.ravel().tolist()]}
    json.dump(out, sys.stdout, allow_nan=False)
    print()


if __name__ == "__main__":
    main()
