package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// go test ./codec -run '^$' -fuzz FuzzDecodeSafetensors -fuzztime 60s
func FuzzDecodeSafetensors(f *testing.F) {
	seen := map[string]bool{}
	for _, b := range readTestdata(f, "") {
		seen[string(b)] = true
		f.Add(b)
	}
	for _, tc := range malformedSafetensors() {
		if !seen[string(tc.b)] {
			f.Add(tc.b)
		}
	}
	ts, meta := goldenSmall()
	for _, seed := range []struct {
		ts   []Tensor
		meta map[string]string
	}{
		{fixtureAllDTypes(), nil},
		{fixtureAllDTypes()[:3], map[string]string{"epoch": "1"}},
		{ts, meta},
		{nil, nil},
	} {
		b, err := EncodeSafetensors(seed.ts, seed.meta)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := bytes.Clone(b)
		ts, meta, err := DecodeSafetensors(b)
		if !bytes.Equal(b, orig) {
			t.Fatal("DecodeSafetensors modified its input")
		}
		if err != nil {
			return // rejecting is fine
		}
		var covered int
		for _, tt := range ts {
			n, ok := elemsExact(tt.Shape)
			size := uint64(DTypeSize(tt.DType))
			if !ok || size == 0 || n > uint64(len(tt.Data)) || n*size != uint64(len(tt.Data)) {
				t.Fatalf("accepted tensor %q: %s %v with %d bytes", tt.Name, tt.DType, tt.Shape, len(tt.Data))
			}
			covered += len(tt.Data)
		}
		if problem := strictHeaderProblem(b); problem != "" {
			t.Fatalf("accepted a header a strict reader rejects (%s): %q", problem, b)
		}
		hdrLen := int(le.Uint64(b))
		if 8+hdrLen+covered != len(b) {
			t.Fatalf("accepted tensors cover %d bytes of %d after an %d-byte header", covered, len(b), hdrLen)
		}
		enc, err := EncodeSafetensors(ts, meta)
		if err != nil {
			t.Fatalf("re-encoding accepted tensors: %v", err)
		}
		ts2, meta2, err := DecodeSafetensors(enc)
		if err != nil {
			t.Fatalf("re-encoded file does not decode: %v\n%q", err, enc)
		}
		if !tensorsEqual(ts, ts2) || !metaEqual(meta, meta2) {
			t.Fatalf("round trip changed the tensors:\n%v %q\n%v %q", ts, meta, ts2, meta2)
		}
		if enc2, err := EncodeSafetensors(ts2, meta2); err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not deterministic (err %v)", err)
		}
	})
}

// strictHeaderProblem re-reads the header of an accepted file the way the
// format describes it, independently of DecodeSafetensors: one JSON object
// (then only space padding), entries with exactly the keys dtype, shape and
// data_offsets (two integers), and __metadata__ mapping strings to strings.
func strictHeaderProblem(b []byte) string {
	hdr := bytes.TrimRight(b[8:8+le.Uint64(b)], " ")
	if !json.Valid(hdr) {
		return "header is not exactly one JSON value"
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &top); err != nil || top == nil {
		return "header is not an object"
	}
	for name, raw := range top {
		if name == "__metadata__" {
			var meta map[string]any
			if err := json.Unmarshal(raw, &meta); err != nil {
				return "__metadata__ is not an object"
			}
			for _, v := range meta {
				if _, ok := v.(string); !ok {
					return "__metadata__ value is not a string"
				}
			}
			continue
		}
		var e map[string]json.RawMessage
		if err := json.Unmarshal(raw, &e); err != nil {
			return "entry is not an object"
		}
		for k := range e {
			if k != "dtype" && k != "shape" && k != "data_offsets" {
				return "entry has key " + strconv.Quote(k)
			}
		}
		var offs []json.Number
		if err := json.Unmarshal(e["data_offsets"], &offs); err != nil || len(offs) != 2 {
			return "data_offsets is not two numbers"
		}
	}
	return ""
}

// fuzzShapes are the inner (per-row) shapes FuzzDecodeJSONTensor tries.
var fuzzShapes = [][]int{nil, {0}, {1}, {2}, {3}, {2, 2}, {1, 3}, {2, 0, 2}, {4}}

// go test ./codec -run '^$' -fuzz FuzzDecodeJSONTensor -fuzztime 60s
func FuzzDecodeJSONTensor(f *testing.F) {
	for i, dt := range allDTypes {
		for j, inner := range fuzzShapes {
			n := 1
			for _, d := range inner {
				n *= d
			}
			tt := valuesTensor("x", dt, append([]int{2}, inner...), sampleValues(dt, 2*n)...)
			b, err := AppendJSONTensor(nil, &tt)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(i), uint8(j), b)
		}
	}
	for _, s := range []string{
		`["NaN","Infinity","-Infinity",-0,0.1,1e-8,65504,65520,1.0004882822]`,
		`[1.00048828125,1.0000000596046448,3.4028235e38,1e39,5e-324,4.9e-324]`,
		`[true,false,0,1]`, `[255,-128,32767,-2147483648,9223372036854775807]`,
		`[[1,2],[3]]`, `[1] [2]`, `{"a":[1]}`, `[[[[[[]]]]]]`, `["nan"]`, `[1E+2,-1e-2,0.0]`,
	} {
		for i := range allDTypes {
			f.Add(uint8(i), uint8(0), []byte(s))
			f.Add(uint8(i), uint8(3), []byte(s))
		}
	}
	// The fields of the golden extend body, with their dtypes.
	if b, ok := readTestdata(f, ".json")["testdata/small.json"]; ok {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			f.Fatal(err)
		}
		ts, _ := goldenSmall()
		for _, tt := range ts {
			if raw, ok := fields[tt.Name]; ok && len(tt.Shape) > 0 {
				f.Add(uint8(slices.Index(allDTypes, tt.DType)), uint8(0), []byte(raw))
			}
		}
	}
	f.Fuzz(func(t *testing.T, dt, shape uint8, raw []byte) {
		dtype := allDTypes[int(dt)%len(allDTypes)]
		inner := fuzzShapes[int(shape)%len(fuzzShapes)]
		data, n, err := DecodeJSONTensor(raw, dtype, inner)
		// The streaming decoder accepts exactly what encoding/json (the
		// boxed decoder it replaced) accepts, with the same values.
		ref, refN, refErr := decodeJSONTensorBoxed(raw, dtype, inner)
		if (err == nil) != (refErr == nil) || (err == nil && (n != refN || !bytes.Equal(data, ref))) {
			t.Fatalf("%s %v %q: streaming decoder %x, %d, %v; encoding/json %x, %d, %v", dtype, inner, raw, data, n, err, ref, refN, refErr)
		}
		if err != nil {
			return
		}
		per := DTypeSize(dtype)
		for _, d := range inner {
			per *= d
		}
		if n < 0 || len(data) != n*per {
			t.Fatalf("%d rows of %s %v in %d bytes", n, dtype, inner, len(data))
		}
		tt := Tensor{Name: "x", DType: dtype, Shape: append([]int{n}, inner...), Data: data}
		text, err := AppendJSONTensor(nil, &tt)
		if err != nil {
			t.Fatalf("AppendJSONTensor of accepted input: %v", err)
		}
		data2, n2, err := DecodeJSONTensor(text, dtype, inner)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", text, err)
		}
		if n2 != n || !sameValues(dtype, data, data2) {
			t.Fatalf("%s %q -> %x -> %s -> %x", dtype, raw, data, text, data2)
		}
		tt.Data = data2
		if text2, err := AppendJSONTensor(nil, &tt); err != nil || !bytes.Equal(text, text2) {
			t.Fatalf("second encoding %s differs from the first %s (err %v)", text2, text, err)
		}
	})
}

// go test ./codec -run '^$' -fuzz FuzzScanJSONObject -fuzztime 60s
//
// ScanJSONObject accepts what encoding/json reads as an object (except a
// key given twice, which it refuses), and hands out the same members.
func FuzzScanJSONObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a": [1, 2], "b": {"c": "d"}}`, `{"a":1,"a":2}`, `{"\u0061": true}`,
		`[1]`, `{"a": 1} x`, `{"a" 1}`, `{"a": [1,]}`, ` { "x" : null } `, `{"a": "\"}"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := map[string]string{}
		dup := false
		err := ScanJSONObject(data, func(k string, v []byte) error {
			if _, ok := got[k]; ok {
				t.Fatalf("%q: key %q handed out twice", data, k)
			}
			got[k] = string(v)
			return nil
		})
		var want map[string]json.RawMessage
		refErr := json.Unmarshal(data, &want)
		if refErr == nil && want == nil {
			refErr = errors.New("null")
		}
		if err != nil && refErr == nil {
			// Only a repeated key may be refused that encoding/json takes.
			var keys []string
			_ = ScanJSONObject(data, func(k string, v []byte) error { keys = append(keys, k); return nil })
			dup = len(keys) != len(want) || strings.Contains(err.Error(), "given twice")
			if !dup {
				t.Fatalf("%q: refused (%v), encoding/json reads it", data, err)
			}
			return
		}
		if err == nil && refErr != nil {
			t.Fatalf("%q: accepted, encoding/json says %v", data, refErr)
		}
		if err != nil {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d members, encoding/json %d", data, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != string(v) {
				t.Fatalf("%q: member %q is %q, encoding/json %q", data, k, got[k], v)
			}
		}
	})
}
