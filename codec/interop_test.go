package codec

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The interop tests run Debian's python3 with numpy (CI: apt-get install -y
// python3-numpy). A pyenv python3 earlier on PATH has no numpy, so the path
// is fixed.
const systemPython = "/usr/bin/python3"

func needNumpy(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(systemPython); err != nil {
		t.Skipf("skipping numpy interop: %s not found (install python3-numpy)", systemPython)
	}
	if out, err := exec.Command(systemPython, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Skipf("skipping numpy interop: %s cannot import numpy (apt-get install -y python3-numpy): %v\n%s", systemPython, err, out)
	}
}

func runPython(t *testing.T, script string, args ...string) string {
	t.Helper()
	path := filepath.Join("..", "tests", "python", script)
	if _, err := os.ReadFile(path); err != nil { // also tells go test's cache to watch it
		t.Fatal(err)
	}
	cmd := exec.Command(systemPython, append([]string{path}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// floatString is a float64 that Python's float() reads back exactly,
// including "nan", "inf", "-inf" and "-0".
func floatString(v float64) string {
	switch {
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// tensorValues lists t's elements for the sidecar: floats as exact strings,
// integers as JSON numbers, bools as booleans.
func tensorValues(t Tensor) []any {
	size := DTypeSize(t.DType)
	out := []any{}
	for i := 0; i+size <= len(t.Data); i += size {
		b := t.Data[i : i+size]
		var v any
		switch t.DType {
		case "bool":
			v = b[0] != 0
		case "uint8":
			v = b[0]
		case "int8":
			v = int8(b[0])
		case "int16":
			v = int16(le.Uint16(b))
		case "int32":
			v = int32(le.Uint32(b))
		case "int64":
			v = int64(le.Uint64(b))
		case "float16":
			v = floatString(float64(Float16ToFloat32(le.Uint16(b))))
		case "bfloat16":
			v = floatString(float64(BFloat16ToFloat32(le.Uint16(b))))
		case "float32":
			v = floatString(float64(f32(le.Uint32(b))))
		case "float64":
			v = floatString(math.Float64frombits(le.Uint64(b)))
		}
		out = append(out, v)
	}
	return out
}

// float16Halfways returns, for every finite float16 and both signs, the
// float32 halfway to its upper neighbour and the float32s one ulp either
// side, plus float32 NaNs with payloads.
func float16Halfways() []float32 {
	var out []float32
	for h := uint16(0); h < 0x7c00; h++ {
		next := 65536.0
		if h < 0x7bff {
			next = f16Value(h + 1)
		}
		half := float32((f16Value(h) + next) / 2)
		for _, x := range []float32{half, math.Nextafter32(half, 0), math.Nextafter32(half, math.MaxFloat32), float32(f16Value(h))} {
			out = append(out, x, -x)
		}
	}
	return append(out, f32(0x7f800001), f32(0xffc00000), float32(math.Inf(1)), 1e-45, math.MaxFloat32)
}

// TestNumpyReadsGo: tensors written by EncodeSafetensors, read by a plain
// numpy reader that checks dtype, shape and values, and checks our float16
// rounding against numpy's.
func TestNumpyReadsGo(t *testing.T) {
	needNumpy(t)
	dir := t.TempDir()
	var ts []Tensor
	for _, dt := range allDTypes {
		ts = append(ts,
			valuesTensor(dt, dt, []int{2, 3}, sampleValues(dt, 6)...),
			valuesTensor(dt+".scalar", dt, []int{}, sampleValues(dt, 3)[2]),
			valuesTensor(dt+".empty", dt, []int{0, 2}),
			valuesTensor(dt+".long", dt, []int{3, 1, 4}, sampleValues(dt, 12)...),
		)
	}
	src := float16Halfways()
	srcT := Tensor{Name: "f16_src", DType: "float32", Shape: []int{len(src)}}
	dstT := Tensor{Name: "f16_from_src", DType: "float16", Shape: []int{len(src)}}
	for _, x := range src {
		srcT.Data = le.AppendUint32(srcT.Data, math.Float32bits(x))
		dstT.Data = le.AppendUint16(dstT.Data, Float32ToFloat16(x))
	}
	ts = append(ts, srcT, dstT)
	meta := map[string]string{"epoch": "3", "note": "ü \"quoted\" \\ <&>"}
	enc, err := EncodeSafetensors(ts, meta)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{}
	for _, tt := range ts {
		w := map[string]any{"st_dtype": dtypeToST[tt.DType], "shape": tt.Shape}
		if tt.Name != srcT.Name && tt.Name != dstT.Name {
			w["values"] = tensorValues(tt)
		}
		want[tt.Name] = w
	}
	file := filepath.Join(dir, "go.safetensors")
	if err := os.WriteFile(file, enc, 0o644); err != nil {
		t.Fatal(err)
	}
	sidecar := filepath.Join(dir, "go.json")
	writeJSONFile(t, sidecar, map[string]any{"metadata": meta, "tensors": want, "f16_from_f32": [][2]string{{"f16_src", "f16_from_src"}}})
	if out := runPython(t, "read_safetensors.py", file, sidecar); strings.TrimSpace(out) != "OK" {
		t.Fatalf("reader said %q", out)
	}
}

// TestGoReadsNumpy: a file written by a plain numpy writer (data in reverse
// order of the header keys, header padded like Hugging Face's) decodes to
// the expected tensors.
func TestGoReadsNumpy(t *testing.T) {
	needNumpy(t)
	dir := t.TempDir()
	var want []Tensor
	for _, dt := range allDTypes {
		want = append(want,
			valuesTensor(dt, dt, []int{2, 3}, sampleValues(dt, 6)...),
			valuesTensor(dt+".scalar", dt, []int{}, sampleValues(dt, 2)[1]),
			valuesTensor(dt+".empty", dt, []int{2, 0}),
		)
	}
	var spec []map[string]any
	for _, tt := range want {
		spec = append(spec, map[string]any{"name": tt.Name, "dtype": tt.DType, "shape": tt.Shape, "values": tensorValues(tt)})
	}
	meta := map[string]string{"format": "np", "ü": "ß"}
	specFile, out := filepath.Join(dir, "spec.json"), filepath.Join(dir, "np.safetensors")
	writeJSONFile(t, specFile, map[string]any{"metadata": meta, "tensors": spec})
	runPython(t, "write_safetensors.py", specFile, out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, gotMeta, err := DecodeSafetensors(b)
	if err != nil {
		t.Fatalf("decode numpy's file: %v\n%q", err, b[:min(len(b), 400)])
	}
	if !metaEqual(gotMeta, meta) {
		t.Errorf("metadata %q, want %q", gotMeta, meta)
	}
	// The writer put the data in reverse order; decoding returns offset
	// order (zero-length tensors first among equal offsets).
	if len(got) != len(want) {
		t.Fatalf("%d tensors, want %d", len(got), len(want))
	}
	byName := map[string]Tensor{}
	for _, g := range got {
		byName[g.Name] = g
	}
	for _, w := range want {
		g, ok := byName[w.Name]
		if !ok || g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) || !sameValues(w.DType, g.Data, w.Data) {
			t.Errorf("%s: got %s %v %x, want %s %v %x", w.Name, g.DType, g.Shape, g.Data, w.DType, w.Shape, w.Data)
		}
	}
	if last := got[len(got)-1].Name; last != "bool" {
		t.Errorf("last tensor by offset is %q, want %q (the writer reversed the data)", last, "bool")
	}
}

// TestJSONFloat16MatchesNumpy: JSON numbers for a float16 field must round
// like numpy's float64 -> float16 conversion (to nearest even, once).
func TestJSONFloat16MatchesNumpy(t *testing.T) {
	needNumpy(t)
	dir := t.TempDir()
	// Float64 values just either side of float16 halfway points, where
	// rounding to float32 first would land exactly on the halfway point,
	// plus values spread over the range.
	var vals []string
	for h := uint16(0x0001); h < 0x7bff; h += 37 {
		half := (f16Value(h) + f16Value(h+1)) / 2
		for _, x := range []float64{half * (1 + 0x1p-30), half * (1 - 0x1p-30), half, -half * (1 + 0x1p-40)} {
			vals = append(vals, floatString(x))
		}
	}
	for i := range 2000 {
		vals = append(vals, floatString(math.Sin(float64(i))*math.Pow(2, float64(i%30-15))))
	}
	specFile, out := filepath.Join(dir, "spec.json"), filepath.Join(dir, "f16.safetensors")
	writeJSONFile(t, specFile, map[string]any{"metadata": map[string]string{}, "tensors": []map[string]any{
		{"name": "x", "dtype": "float16", "shape": []int{len(vals)}, "values": vals}}})
	runPython(t, "write_safetensors.py", specFile, out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ts, _, err := DecodeSafetensors(b)
	if err != nil || len(ts) != 1 {
		t.Fatalf("decode: %v", err)
	}
	mine, n, err := DecodeJSONTensor([]byte("["+strings.Join(vals, ",")+"]"), "float16", nil)
	if err != nil || n != len(vals) {
		t.Fatalf("DecodeJSONTensor: %d, %v", n, err)
	}
	var bad []string
	spread := 0 // mismatches among the last 2000, which are not constructed
	for i := range vals {
		np, got := le.Uint16(ts[0].Data[2*i:]), le.Uint16(mine[2*i:])
		if np != got {
			bad = append(bad, fmt.Sprintf("%s: numpy %#04x, DecodeJSONTensor %#04x", vals[i], np, got))
			if i >= len(vals)-2000 {
				spread++
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d float16 values (%d of the 2000 not built near halfway points) differ from numpy, e.g.\n%s",
			len(bad), len(vals), spread, strings.Join(bad[:min(len(bad), 5)], "\n"))
	}
}
