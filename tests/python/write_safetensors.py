"""Write a safetensors file with plain json + numpy, laid out as the Hugging
Face writer does (header padded with spaces to a multiple of 8), but with the
data in reverse order of the header keys: write_safetensors.py SPEC.json OUT.
SPEC: {"metadata": {...}, "tensors": [{"name", "dtype", "shape", "values"}]};
float values are strings for float() ("NaN", "-0", "Infinity", "0.1")."""
import json, struct, sys
import numpy as np

ST = {"bool": ("BOOL", "?"), "uint8": ("U8", "u1"), "int8": ("I8", "i1"), "int16": ("I16", "<i2"),
      "int32": ("I32", "<i4"), "int64": ("I64", "<i8"), "float16": ("F16", "<f2"),
      "bfloat16": ("BF16", "<f4"), "float32": ("F32", "<f4"), "float64": ("F64", "<f8")}

spec = json.load(open(sys.argv[1]))
entries, blobs, offset = {}, [], 0
for t in reversed(spec["tensors"]):
    st, dt = ST[t["dtype"]]
    if "f" in dt:  # numpy rounds float64 -> dt itself (to nearest even)
        a = np.array([float(v) for v in t["values"]], dtype=np.float64).astype(dt)
    else:
        a = np.array(t["values"], dtype=dt)
    if st == "BF16":  # no numpy bfloat16: keep the top half of float32 (values are exact)
        a = (a.view("<u4") >> 16).astype("<u2")
    b = a.reshape(t["shape"]).tobytes()
    entries[t["name"]] = {"dtype": st, "shape": t["shape"], "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
header = {"__metadata__": spec["metadata"]} if spec["metadata"] else {}
header.update((t["name"], entries[t["name"]]) for t in spec["tensors"])
h = json.dumps(header).encode()
h += b" " * (-(8 + len(h)) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
