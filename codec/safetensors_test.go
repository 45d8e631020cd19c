package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	all := fixtureAllDTypes()
	cases := []struct {
		name    string
		tensors []Tensor
		meta    map[string]string
	}{
		{"nothing", nil, nil},
		{"metadata only", nil, map[string]string{"epoch": "3"}},
		{"empty metadata", fixtureAllDTypes()[:1], map[string]string{}},
		{"all dtypes", all, nil},
		{"all dtypes with metadata", all, map[string]string{"epoch": "7", "epoch_end": "true", "quote\"and\\": "ü\n\u2028<&>", "": ""}},
		{"scalar only", []Tensor{valuesTensor("s", "int8", []int{}, -5)}, nil},
		{"nil shape is a scalar", []Tensor{{Name: "s", DType: "uint8", Data: []byte{9}}}, nil},
		{"zero-length only", []Tensor{valuesTensor("a", "float32", []int{0}), valuesTensor("b", "float64", []int{0, 5})}, nil},
		{"zero-length first and last", []Tensor{valuesTensor("a", "bool", []int{0}), valuesTensor("b", "int32", nil, 1, 2), valuesTensor("c", "int64", []int{2, 0, 3})}, nil},
		{"odd names", []Tensor{valuesTensor("next.observation", "uint8", nil, 1), valuesTensor("ünï \"q\"", "uint8", nil, 2), valuesTensor("", "uint8", nil, 3)}, nil},
		{"rank 4", []Tensor{valuesTensor("img", "uint8", []int{1, 2, 2, 3}, sampleValues("uint8", 12)...)}, nil},
	}
	for _, dt := range allDTypes {
		cases = append(cases, struct {
			name    string
			tensors []Tensor
			meta    map[string]string
		}{"only " + dt, []Tensor{
			valuesTensor("x", dt, []int{5}, sampleValues(dt, 5)...),
			valuesTensor("scalar", dt, []int{}, sampleValues(dt, 2)[1]),
			valuesTensor("zero", dt, []int{0, 2}),
		}, nil})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr, total, err := SafetensorsHeader(tc.tensors, tc.meta)
			if err != nil {
				t.Fatal(err)
			}
			if len(hdr)%8 != 0 {
				t.Errorf("header+prefix is %d bytes, not a multiple of 8", len(hdr))
			}
			if n := le.Uint64(hdr); n != uint64(len(hdr)-8) {
				t.Errorf("length prefix %d, header is %d bytes", n, len(hdr)-8)
			}
			js := bytes.TrimRight(hdr[8:], " ")
			if js[0] != '{' || js[len(js)-1] != '}' || bytes.ContainsAny(hdr[8+len(js):], "\x00\t\n") {
				t.Errorf("header %q is not an object padded with spaces", hdr[8:])
			}
			var buf bytes.Buffer
			n, err := WriteSafetensors(&buf, tc.tensors, tc.meta)
			if err != nil || n != total || int64(buf.Len()) != total {
				t.Fatalf("WriteSafetensors: %d bytes, %v; header promised %d, buffer has %d", n, err, total, buf.Len())
			}
			enc, err := EncodeSafetensors(tc.tensors, tc.meta)
			if err != nil || !bytes.Equal(enc, buf.Bytes()) || !bytes.HasPrefix(enc, hdr) {
				t.Fatalf("EncodeSafetensors differs from WriteSafetensors (err %v)", err)
			}
			got, meta, err := DecodeSafetensors(enc)
			if err != nil {
				t.Fatalf("decode: %v\n%q", err, enc)
			}
			want := make([]Tensor, len(tc.tensors))
			for i, tt := range tc.tensors {
				if tt.Shape == nil {
					tt.Shape = []int{}
				}
				want[i] = tt
			}
			if !tensorsEqual(got, want) {
				t.Errorf("decoded %v\nwant    %v", got, want)
			}
			if !metaEqual(meta, tc.meta) {
				t.Errorf("metadata %q, want %q", meta, tc.meta)
			}
			// Encoding is deterministic: the decoded tensors encode to the
			// same bytes.
			again, err := EncodeSafetensors(got, meta)
			if err != nil || !bytes.Equal(again, enc) {
				t.Errorf("re-encoding differs (err %v)", err)
			}
		})
	}
}

func TestDecodeSafetensorsAliasesInput(t *testing.T) {
	enc, err := EncodeSafetensors([]Tensor{valuesTensor("a", "uint8", nil, 1, 2), valuesTensor("b", "uint8", nil, 3)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, _, err := DecodeSafetensors(enc)
	if err != nil {
		t.Fatal(err)
	}
	enc[len(enc)-1] = 42
	if ts[1].Data[0] != 42 {
		t.Error("Data does not alias the input buffer")
	}
	// Appending to one tensor's Data must not overwrite its neighbour.
	_ = append(ts[0].Data, 99)
	if ts[1].Data[0] != 42 {
		t.Error("appending to a decoded tensor overwrote the next one (capacity not clipped)")
	}
}

// TestDecodeSafetensorsForeignLayouts feeds files laid out the way other
// writers do: keys in any order, data not in key order, extra padding.
func TestDecodeSafetensorsForeignLayouts(t *testing.T) {
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	cases := []struct {
		name, header string
		want         []string // names in offset order
	}{
		{"reverse key order",
			`{"b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}`,
			[]string{"a", "b"}},
		{"metadata last, spaces inside",
			`{ "a" : { "data_offsets" : [ 0 , 8 ] , "shape" : [ 2 ] , "dtype" : "F32" } , "b" : {"dtype":"I16","shape":[1],"data_offsets":[8,10]}, "__metadata__": {"format":"pt"} }`,
			[]string{"a", "b"}},
		{"padded far beyond 8",
			`{"a":{"dtype":"F64","shape":[],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}}` + strings.Repeat(" ", 61),
			[]string{"a", "b"}},
		{"zero-length tensors at both ends",
			`{"z2":{"dtype":"F16","shape":[0],"data_offsets":[10,10]},"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"z1":{"dtype":"BOOL","shape":[3,0],"data_offsets":[0,0]}}`,
			[]string{"z1", "a", "z2"}},
		{"escaped name", `{"\u0061\"":{"dtype":"U8","shape":[10],"data_offsets":[0,10]}}`, []string{`a"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts, _, err := DecodeSafetensors(stFile(tc.header, data))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			var all []byte
			for _, tt := range ts {
				names = append(names, tt.Name)
				all = append(all, tt.Data...)
			}
			if fmt.Sprint(names) != fmt.Sprint(tc.want) || !bytes.Equal(all, data) {
				t.Errorf("got %v covering %v, want %v", names, all, tc.want)
			}
		})
	}
}

// goldenSmall is the small case whose bytes are checked by hand and kept in
// testdata/small.safetensors.
func goldenSmall() ([]Tensor, map[string]string) {
	h := Tensor{Name: "h", DType: "float16", Shape: []int{3}, Data: []byte{0x00, 0x3c, 0x00, 0x7e, 0x01, 0x80}}
	return []Tensor{
		valuesTensor("obs", "float32", []int{2, 2}, 0, 1, -2.5, math.Inf(1)),
		valuesTensor("act", "int64", nil, -1, 1<<40),
		valuesTensor("flag", "bool", []int{}, 1),
		h,
	}, map[string]string{"name": "golden", "epoch": "3"}
}

func TestGoldenSafetensorsLayout(t *testing.T) {
	ts, meta := goldenSmall()
	got, err := EncodeSafetensors(ts, meta)
	if err != nil {
		t.Fatal(err)
	}
	// Built by hand from the format: u64 LE header length, JSON header
	// (metadata first, keys sorted; tensors in the given order) padded with
	// spaces to a multiple of 8, then the raw little-endian data.
	header := `{"__metadata__":{"epoch":"3","name":"golden"},` +
		`"obs":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},` +
		`"act":{"dtype":"I64","shape":[2],"data_offsets":[16,32]},` +
		`"flag":{"dtype":"BOOL","shape":[],"data_offsets":[32,33]},` +
		`"h":{"dtype":"F16","shape":[3],"data_offsets":[33,39]}}`
	for len(header)%8 != 0 {
		header += " "
	}
	var want bytes.Buffer
	want.Write(le.AppendUint64(nil, uint64(len(header))))
	want.WriteString(header)
	want.Write([]byte{0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0, 0, 0, 0x80, 0x7f})       // 0, 1, -2.5, +Inf
	want.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1, 0, 0}) // -1, 2^40
	want.Write([]byte{1})                                                                      // true
	want.Write([]byte{0x00, 0x3c, 0x00, 0x7e, 0x01, 0x80})                                     // 1, NaN, -2^-24
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("encoding:\ngot  %q\nwant %q", got, want.Bytes())
	}
	if (8+len(header))%8 != 0 || len(got) != 8+len(header)+39 {
		t.Errorf("layout: %d bytes", len(got))
	}
	golden(t, "small.safetensors", got)

	// The same tensors as JSON (an extend body), also golden.
	body := []byte("{")
	for i, tt := range ts {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, fmt.Sprintf("%q:", tt.Name)...)
		if body, err = AppendJSONTensor(body, &tt); err != nil {
			t.Fatal(err)
		}
	}
	body = append(body, "}\n"...)
	wantJSON := `{"obs":[[0,1],[-2.5,"Infinity"]],"act":[-1,1099511627776],"flag":true,"h":[1,"NaN",-5.9604645e-08]}` + "\n"
	if string(body) != wantJSON {
		t.Errorf("JSON:\ngot  %s\nwant %s", body, wantJSON)
	}
	golden(t, "small.json", body)
}

// malformedSafetensors is the table of inputs DecodeSafetensors must reject
// with an error wrapping ErrSafetensors. -update-codec also writes each as
// testdata/malformed/<name>.safetensors, seeding FuzzDecodeSafetensors.
func malformedSafetensors() []struct {
	name string
	b    []byte
} {
	f32 := func(entry string) string { return `{"a":{` + entry + `}}` }
	d4 := []byte{0, 0, 0x80, 0x3f}
	d8 := append(append([]byte{}, d4...), d4...)
	d12 := append(append([]byte{}, d8...), d4...)
	return []struct {
		name string
		b    []byte
	}{
		// Framing.
		{"empty", nil},
		{"seven_bytes", []byte{1, 0, 0, 0, 0, 0, 0}},
		{"header_len_over_max", stPrefix(MaxHeaderBytes+1, "{}")},
		{"header_len_max_uint64", stPrefix(math.MaxUint64, "{}")},
		{"header_len_beyond_buffer", stPrefix(100, `{"a":1}`)},
		{"header_len_one_beyond_buffer", stPrefix(3, "{}")},
		{"header_len_zero", stPrefix(0, "")},
		// Not an object.
		{"header_array", stFile(`[]`, nil)},
		{"header_string", stFile(`"{}"`, nil)},
		{"header_null", stFile(`null`, nil)},
		{"header_number", stFile(`8`, nil)},
		{"header_spaces_only", stFile(`        `, nil)},
		{"header_leading_space", stFile(` {}`, nil)},
		{"header_nul_padding", stFile("{}\x00\x00\x00\x00\x00\x00", nil)},
		// Bad JSON.
		{"bad_json_unterminated", stFile(`{"a":`, nil)},
		{"bad_json_trailing_comma", stFile(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},}`, nil)},
		{"bad_json_single_quotes", stFile(`{'a':1}`, nil)},
		{"bad_json_trailing_garbage", stFile(`{}x`, nil)},
		{"bad_json_two_objects", stFile(`{}{}`, nil)},
		{"bad_json_trailing_brace", stFile(`{}}`, nil)},
		{"bad_json_trailing_bracket", stFile(`{}]`, nil)},
		// Entries.
		{"entry_not_object", stFile(`{"a":5}`, nil)},
		{"entry_array", stFile(`{"a":["F32",[1],[0,4]]}`, d4)},
		{"unknown_dtype", stFile(f32(`"dtype":"F8","shape":[1],"data_offsets":[0,1]`), d4[:1])},
		{"dtype_rbd_name", stFile(f32(`"dtype":"float32","shape":[1],"data_offsets":[0,4]`), d4)},
		{"dtype_lower_case", stFile(f32(`"dtype":"f32","shape":[1],"data_offsets":[0,4]`), d4)},
		{"dtype_missing", stFile(f32(`"shape":[1],"data_offsets":[0,4]`), d4)},
		{"dtype_not_string", stFile(f32(`"dtype":4,"shape":[1],"data_offsets":[0,4]`), d4)},
		{"shape_missing", stFile(f32(`"dtype":"F32","data_offsets":[0,4]`), d4)},
		{"shape_null", stFile(f32(`"dtype":"F32","shape":null,"data_offsets":[0,4]`), d4)},
		{"shape_not_array", stFile(f32(`"dtype":"F32","shape":1,"data_offsets":[0,4]`), d4)},
		{"shape_fraction", stFile(f32(`"dtype":"F32","shape":[1.5],"data_offsets":[0,4]`), d4)},
		{"shape_string", stFile(f32(`"dtype":"F32","shape":["1"],"data_offsets":[0,4]`), d4)},
		{"negative_dim", stFile(f32(`"dtype":"F32","shape":[-1],"data_offsets":[0,0]`), nil)},
		{"negative_dims_positive_product", stFile(f32(`"dtype":"F32","shape":[-1,-1],"data_offsets":[0,4]`), d4)},
		{"negative_dim_with_zero", stFile(f32(`"dtype":"F32","shape":[0,-3],"data_offsets":[0,0]`), nil)},
		{"shape_too_large", stFile(f32(`"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]`), nil)},
		// 2^62 int64 elements are 2^65 bytes: the product must not wrap to 0.
		{"shape_bytes_overflow_i64", stFile(f32(`"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]`), nil)},
		{"shape_bytes_overflow_f32", stFile(f32(`"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]`), nil)},
		{"shape_bytes_overflow_f16", stFile(f32(`"dtype":"F16","shape":[9223372036854775807],"data_offsets":[0,0]`), nil)},
		{"shape_bytes_mismatch_short", stFile(f32(`"dtype":"F32","shape":[3],"data_offsets":[0,8]`), d8)},
		{"shape_bytes_mismatch_long", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[0,8]`), d8)},
		{"shape_bytes_mismatch_scalar", stFile(f32(`"dtype":"F64","shape":[],"data_offsets":[0,4]`), d4)},
		{"unknown_key", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1`), d4)},
		{"unknown_key_null", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[0,4],"offsets":null`), d4)},
		{"key_wrong_case", stFile(f32(`"DType":"F32","Shape":[1],"Data_Offsets":[0,4]`), d4)},
		// Offsets.
		{"offsets_missing", stFile(f32(`"dtype":"F32","shape":[0]`), nil)},
		{"offsets_null", stFile(f32(`"dtype":"F32","shape":[0],"data_offsets":null`), nil)},
		{"offsets_one_value", stFile(f32(`"dtype":"F32","shape":[0],"data_offsets":[0]`), nil)},
		{"offsets_three_values", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[0,4,8]`), d4)},
		{"offsets_strings", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":["0","4"]`), d4)},
		{"offsets_fractions", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[0,4.5]`), d4)},
		{"offsets_beyond_data", stFile(f32(`"dtype":"F32","shape":[2],"data_offsets":[0,8]`), d4)},
		{"offsets_negative", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[-4,0]`), d4)},
		{"offsets_reversed", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[4,0]`), d4)},
		{"offsets_huge", stFile(f32(`"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,9223372036854775807]`), d4)},
		{"offsets_overflow_int64", stFile(f32(`"dtype":"U8","shape":[1],"data_offsets":[0,9223372036854775808]`), d4)},
		{"offsets_not_from_zero", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[4,8]`), d8)},
		{"offsets_overlap", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, d12)},
		{"offsets_same_range", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}`, d4)},
		{"offsets_gap", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, d12)},
		{"zero_length_inside_other", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}`, d8)},
		{"data_not_covered", stFile(f32(`"dtype":"F32","shape":[1],"data_offsets":[0,4]`), d8)},
		{"data_without_tensors", stFile(`{}`, d4)},
		{"data_without_tensors_metadata", stFile(`{"__metadata__":{"a":"b"}}`, d4)},
		// __metadata__ must map strings to strings.
		{"metadata_array", stFile(`{"__metadata__":[]}`, nil)},
		{"metadata_string", stFile(`{"__metadata__":"x"}`, nil)},
		{"metadata_number_value", stFile(`{"__metadata__":{"a":1}}`, nil)},
		{"metadata_bool_value", stFile(`{"__metadata__":{"a":true}}`, nil)},
		{"metadata_object_value", stFile(`{"__metadata__":{"a":{"b":"c"}}}`, nil)},
		{"metadata_array_value", stFile(`{"__metadata__":{"a":["b"]}}`, nil)},
		{"metadata_null_value", stFile(`{"__metadata__":{"a":null}}`, nil)},
	}
}

func TestDecodeSafetensorsMalformed(t *testing.T) {
	for _, tc := range malformedSafetensors() {
		t.Run(tc.name, func(t *testing.T) {
			ts, meta, err := DecodeSafetensors(tc.b)
			if !errors.Is(err, ErrSafetensors) {
				t.Fatalf("DecodeSafetensors(%q) = %v, %v, %v; want an error wrapping ErrSafetensors", tc.b, ts, meta, err)
			}
			if ts != nil || meta != nil {
				t.Errorf("returned %v, %v with the error", ts, meta)
			}
			if !strings.HasPrefix(err.Error(), "safetensors: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestGoldenMalformedFiles(t *testing.T) {
	for _, tc := range malformedSafetensors() {
		golden(t, "malformed/"+tc.name+".safetensors", tc.b)
	}
}

// TestSafetensorsWriterErrors: the encoders refuse what they cannot
// describe, and report a failing writer.
func TestSafetensorsWriterErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Tensor
		want string
	}{
		{"unknown dtype", Tensor{Name: "a", DType: "float8", Shape: []int{1}, Data: []byte{0}}, "unknown dtype"},
		{"safetensors dtype name", Tensor{Name: "a", DType: "F32", Shape: []int{1}, Data: make([]byte, 4)}, "unknown dtype"},
		{"short data", Tensor{Name: "a", DType: "float32", Shape: []int{2}, Data: make([]byte, 4)}, "needs 8 bytes, has 4"},
		{"long data", Tensor{Name: "a", DType: "int16", Shape: []int{}, Data: make([]byte, 4)}, "needs 2 bytes, has 4"},
		{"negative dim", Tensor{Name: "a", DType: "uint8", Shape: []int{-1, -2}, Data: make([]byte, 2)}, "negative"},
		{"overflowing shape", Tensor{Name: "a", DType: "int64", Shape: []int{1 << 62}}, ""}, // 2^65 bytes, not 0
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := SafetensorsHeader([]Tensor{tc.t}, nil); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"a"`) {
				t.Errorf("SafetensorsHeader: %v, want an error naming tensor \"a\" and %q", err, tc.want)
			}
			if b, err := EncodeSafetensors([]Tensor{tc.t}, nil); err == nil {
				t.Errorf("EncodeSafetensors wrote %q", b)
			}
		})
	}
	ts := fixtureAllDTypes()
	enc, _ := EncodeSafetensors(ts, nil)
	for _, limit := range []int{0, 7, 8, 100, len(enc) - 1} {
		w := &limitWriter{n: limit}
		n, err := WriteSafetensors(w, ts, nil)
		if err == nil || n > int64(limit) {
			t.Errorf("writer failing after %d bytes: WriteSafetensors = %d, %v", limit, n, err)
		}
	}
}

type limitWriter struct{ n int }

func (w *limitWriter) Write(p []byte) (int, error) {
	if len(p) <= w.n {
		w.n -= len(p)
		return len(p), nil
	}
	n := w.n
	w.n = 0
	return n, errors.New("disk full")
}

// TestSafetensorsEncoderOutputDecodes: whatever the encoder accepts, the
// decoder must read back. Duplicate names and a tensor called
// "__metadata__" make headers that no reader can take.
func TestSafetensorsEncoderOutputDecodes(t *testing.T) {
	u8 := func(name string) Tensor { return valuesTensor(name, "uint8", nil, 1) }
	for _, tc := range []struct {
		name    string
		tensors []Tensor
		meta    map[string]string
	}{
		{"duplicate names", []Tensor{u8("a"), u8("a")}, nil},
		{"tensor named __metadata__", []Tensor{u8("__metadata__")}, nil},
		{"tensor named __metadata__ next to metadata", []Tensor{u8("__metadata__")}, map[string]string{"k": "v"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := EncodeSafetensors(tc.tensors, tc.meta)
			if err != nil {
				return // refusing is right
			}
			if _, _, err := DecodeSafetensors(enc); err != nil {
				t.Errorf("EncodeSafetensors accepted %v but wrote a file DecodeSafetensors rejects: %v\n%q", tc.tensors, err, enc)
			}
		})
	}
}

func TestDecodeSafetensorsHeaderCap(t *testing.T) {
	// A header of exactly MaxHeaderBytes is allowed when it is there.
	if testing.Short() {
		t.Skip("allocates 100 MB")
	}
	b := bytes.Repeat([]byte{' '}, 8+MaxHeaderBytes)
	le.PutUint64(b, MaxHeaderBytes)
	copy(b[8:], `{"__metadata__":{"k":"v"}}`)
	_, meta, err := DecodeSafetensors(b)
	if err != nil || meta["k"] != "v" {
		t.Errorf("header of exactly MaxHeaderBytes: %v %v", meta, err)
	}
}

// The header JSON the encoder writes is plain JSON any reader accepts.
func TestSafetensorsHeaderIsStrictJSON(t *testing.T) {
	ts, meta := goldenSmall()
	hdr, _, err := SafetensorsHeader(ts, meta)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]map[string]any
	if err := json.Unmarshal(hdr[8:], &v); err != nil {
		t.Fatal(err)
	}
	for name, e := range v {
		if name == "__metadata__" {
			continue
		}
		if len(e) != 3 || e["dtype"] == nil || e["shape"] == nil || e["data_offsets"] == nil {
			t.Errorf("entry %q = %v, want exactly dtype, shape, data_offsets", name, e)
		}
	}
}

// referenceHeader is the header as encoding/json writes it: the encoder
// before AppendSafetensorsHeader, kept as the reference its bytes must
// match.
func referenceHeader(t *testing.T, tensors []Tensor, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("{")
	first := true
	if len(meta) > 0 {
		m, err := json.Marshal(meta)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString(`"__metadata__":`)
		buf.Write(m)
		first = false
	}
	var off int64
	for _, tn := range tensors {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		name, _ := json.Marshal(tn.Name)
		shape := tn.Shape
		if shape == nil {
			shape = []int{}
		}
		e, _ := json.Marshal(stEntry{DType: dtypeToST[tn.DType], Shape: shape, DataOffsets: [2]int64{off, off + int64(len(tn.Data))}})
		buf.Write(name)
		buf.WriteByte(':')
		buf.Write(e)
		off += int64(len(tn.Data))
	}
	buf.WriteString("}")
	for (8+buf.Len())%8 != 0 {
		buf.WriteByte(' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(buf.Len()))
	return append(out, buf.Bytes()...)
}

// TestSafetensorsHeaderMatchesEncodingJSON: the hand-written header is
// byte for byte what encoding/json writes, for names and metadata that
// need escaping too, and appends after what dst holds.
func TestSafetensorsHeaderMatchesEncodingJSON(t *testing.T) {
	names := []string{"observation", "next.observation", "a\"b", `back\slash`, "<tag>&", "a<b", "c>d", "e&f", "tab\there", "ünï", "\u2028", "bad\xffutf8", "", "x"}
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		var tensors []Tensor
		used := map[string]bool{}
		for range 1 + rng.IntN(5) {
			name := names[rng.IntN(len(names))] + strconv.Itoa(rng.IntN(3))
			if used[name] {
				continue
			}
			used[name] = true
			shape := make([]int, rng.IntN(3))
			n := 1
			for i := range shape {
				shape[i] = rng.IntN(4)
				n *= shape[i]
			}
			tensors = append(tensors, Tensor{Name: name, DType: "float32", Shape: shape, Data: make([]byte, 4*n)})
		}
		var meta map[string]string
		if rng.IntN(2) == 0 {
			meta = map[string]string{names[rng.IntN(len(names))]: names[rng.IntN(len(names))], "epoch": "3"}
		}
		want := referenceHeader(t, tensors, meta)
		prefix := []byte("prefix")
		got, total, err := AppendSafetensorsHeader(prefix, tensors, meta)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if !bytes.Equal(got[:len(prefix)], []byte("prefix")) || !bytes.Equal(got[len(prefix):], want) {
			t.Fatalf("trial %d: header\n%q\nwant\n%q", trial, got[len(prefix):], want)
		}
		data := 0
		for _, tn := range tensors {
			data += len(tn.Data)
		}
		if total != int64(len(want)+data) {
			t.Fatalf("trial %d: total %d, want %d", trial, total, len(want)+data)
		}
	}
}
