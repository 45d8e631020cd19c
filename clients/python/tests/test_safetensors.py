"""The client's safetensors reader and writer, against rbd's Go codec fixtures."""

import glob
import json
import os
import struct
import unittest

import numpy as np

from rbdserver import ROOT  # first: puts the checkout's rbd_client on the path if needed
from rbd_client import safetensors as st  # noqa: E402

CODEC_TESTDATA = os.path.join(ROOT, "codec", "testdata")


def every_dtype(n=3):
    rng = np.random.default_rng(1)
    return {
        "b": rng.integers(0, 2, (n, 2)).astype(bool),
        "u8": rng.integers(0, 256, (n, 2, 2)).astype(np.uint8),
        "i8": rng.integers(-128, 128, n).astype(np.int8),
        "i16": rng.integers(-2 ** 15, 2 ** 15, n).astype(np.int16),
        "i32": rng.integers(-2 ** 31, 2 ** 31, n).astype(np.int32),
        "i64": rng.integers(-2 ** 63, 2 ** 63 - 1, n, dtype=np.int64),
        "f16": rng.standard_normal(n).astype(np.float16),
        "f32": np.array([0.5, -np.inf, np.nan][:n] + [1.0] * (n - 3), np.float32),
        "f64": rng.standard_normal((n, 1)),
        "scalar": np.float32(2.5),
        "empty": np.zeros((0, 4), np.float32),
    }


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_every_dtype(self):
        t = every_dtype()
        buf = st.dumps(t, {"k": "v"})
        (n,) = struct.unpack("<Q", buf[:8])
        self.assertEqual((8 + n) % 8, 0, "header padded to a multiple of 8")
        got, meta = st.loads(buf)
        self.assertEqual(meta, {"k": "v"})
        self.assertEqual(list(got), list(t), "data order is the order given")
        for k, a in t.items():
            a = np.asarray(a)
            self.assertEqual(got[k].dtype, a.dtype, k)
            self.assertEqual(got[k].shape, a.shape, k)
            np.testing.assert_array_equal(got[k], a, k)

    def test_repeated_headers(self):
        # loads remembers checked layouts: the same header over other data
        # gives that data, metadata is the caller's own copy, and a bad file
        # is refused every time.
        a = bytearray(st.dumps({"x": np.arange(4, dtype=np.float32)}, {"epoch": "1"}))
        b = bytearray(st.dumps({"x": np.arange(4, 8, dtype=np.float32)}, {"epoch": "1"}))
        for _ in range(2):
            ta, ma = st.loads(a)
            tb, mb = st.loads(b)
            np.testing.assert_array_equal(ta["x"], [0, 1, 2, 3])
            np.testing.assert_array_equal(tb["x"], [4, 5, 6, 7])
            self.assertEqual(mb, {"epoch": "1"})
            ma["epoch"] = "changed"
        self.assertEqual(st.loads(a)[1], {"epoch": "1"})
        short = a[:-4]  # the same header, 4 data bytes missing
        for _ in range(2):
            with self.assertRaises(st.SafetensorsError):
                st.loads(short)

    def test_views_not_copies(self):
        buf = bytearray(st.dumps({"x": np.arange(6, dtype=np.int64).reshape(2, 3)}))
        got, _ = st.loads(buf)
        self.assertTrue(got["x"].flags.writeable)
        got["x"][0, 0] = 42  # writes through to the buffer
        again, _ = st.loads(buf)
        self.assertEqual(again["x"][0, 0], 42)
        ro, _ = st.loads(bytes(buf))
        self.assertFalse(ro["x"].flags.writeable)

    def test_bfloat16(self):
        x = np.array([1.0, -2.5, 3.140625, 1 + 2 ** -8, 1 + 3 * 2 ** -8, np.inf, np.nan], np.float32)
        bits = st.to_bfloat16_bits(x)
        # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1.0);
        # 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
        want = np.array([1.0, -2.5, 3.140625, 1.0, 1 + 2 ** -6, np.inf, np.nan], np.float32)
        np.testing.assert_array_equal(st.from_bfloat16_bits(bits), want)
        buf = st.dumps({"h": x}, dtypes={"h": "bfloat16"})
        got, _ = st.loads(buf)
        np.testing.assert_array_equal(got["h"], want)
        raw, _ = st.loads(buf, bfloat16="bits")
        np.testing.assert_array_equal(raw["h"], bits)

    def test_go_golden_file(self):
        # codec/testdata/small.safetensors is written by rbd's Go encoder;
        # small.json holds its values (non-finite floats as strings).
        with open(os.path.join(CODEC_TESTDATA, "small.safetensors"), "rb") as f:
            raw = f.read()
        with open(os.path.join(CODEC_TESTDATA, "small.json")) as f:
            want = json.load(f)
        got, meta = st.loads(raw)
        self.assertEqual(sorted(got), sorted(want))
        for k, v in want.items():
            exp = np.array(v, dtype=object)
            if got[k].dtype.kind == "f":
                # JSON holds the shortest decimal that reads back as the value.
                exp = np.array([float(x) for x in np.ravel(exp)]).reshape(exp.shape)
                np.testing.assert_array_equal(got[k], exp.astype(got[k].dtype), k)
            else:
                np.testing.assert_array_equal(got[k], exp.astype(got[k].dtype), k)
        # Laid out like the Go encoder: re-encoding gives the same bytes.
        self.assertEqual(st.dumps(got, meta), raw)

    def test_rejects_what_go_rejects(self):
        files = sorted(glob.glob(os.path.join(CODEC_TESTDATA, "malformed", "*.safetensors")))
        self.assertGreater(len(files), 20, "codec/testdata/malformed is missing")
        for f in files:
            with self.subTest(os.path.basename(f)):
                with self.assertRaises(st.SafetensorsError):
                    st.load(f)

    def test_rejects(self):
        good = st.dumps({"x": np.zeros(2, np.float32)})
        (n,) = struct.unpack("<Q", good[:8])
        header = json.loads(good[8:8 + n])

        def with_header(h, data=b"\0" * 8):
            b = json.dumps(h).encode()
            return struct.pack("<Q", len(b)) + b + data

        cases = {
            "short": b"\0" * 7,
            "header beyond buffer": struct.pack("<Q", 100) + b"{}",
            "shape mismatch": with_header({"x": dict(header["x"], shape=[3])}),
            "gap": with_header({"x": dict(header["x"], data_offsets=[1, 9])}, b"\0" * 9),
            "uncovered": with_header(header, b"\0" * 9),
            "bool shape": with_header({"x": dict(header["x"], shape=[True, 2])}),
            "unknown dtype": with_header({"x": dict(header["x"], dtype="U16")}),
            "trailing": struct.pack("<Q", n + 1) + good[8:8 + n] + b"x" + good[8 + n:],
        }
        for name, buf in cases.items():
            with self.subTest(name), self.assertRaises(st.SafetensorsError):
                st.loads(buf)


if __name__ == "__main__":
    unittest.main()
