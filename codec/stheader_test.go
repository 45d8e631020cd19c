package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"sort"
	"testing"
)

// refDecodeSafetensors is DecodeSafetensors with the header read as it
// was before the scanner (stheader.go): through encoding/json, into maps
// of raw messages. FuzzHeaderScannerMatchesEncodingJSON holds the two to
// the same answers.
func refDecodeSafetensors(b []byte) ([]Tensor, map[string]string, error) {
	return decodeSafetensorsWith(b, refDecodeHeader)
}

func refDecodeHeader(hdr []byte) ([]headerEntry, map[string]string, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if err := dec.Decode(&raw); err != nil {
		return nil, nil, stErr("header: %v", err)
	}
	if dec.InputOffset() != int64(len(hdr)) {
		return nil, nil, stErr("header: data after the JSON object")
	}
	var entries []headerEntry
	var meta map[string]string
	for name, v := range raw {
		if name == "__metadata__" {
			m, err := refDecodeMetadata(v)
			if err != nil {
				return nil, nil, err
			}
			meta = m
			continue
		}
		e, err := refDecodeEntry(name, v)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, headerEntry{name, e})
	}
	return entries, meta, nil
}

func refDecodeEntry(name string, v json.RawMessage) (stEntry, error) {
	var e stEntry
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(v, &fields); err != nil || fields == nil {
		return e, stErr("tensor %q: entry must be an object", name)
	}
	for k := range fields {
		if k != "dtype" && k != "shape" && k != "data_offsets" {
			return e, stErr("tensor %q: unknown key %q", name, k)
		}
	}
	if err := json.Unmarshal(fields["dtype"], &e.DType); err != nil || fields["dtype"] == nil {
		return e, stErr("tensor %q: dtype must be a string", name)
	}
	if err := json.Unmarshal(fields["shape"], &e.Shape); err != nil || fields["shape"] == nil || e.Shape == nil {
		return e, stErr("tensor %q: missing shape (a list of integers)", name)
	}
	var offs []int64
	if err := json.Unmarshal(fields["data_offsets"], &offs); err != nil || len(offs) != 2 {
		return e, stErr("tensor %q: data_offsets must be [begin, end]", name)
	}
	e.DataOffsets = [2]int64{offs[0], offs[1]}
	return e, nil
}

func refDecodeMetadata(v json.RawMessage) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil || raw == nil {
		return nil, stErr("__metadata__ must map strings to strings")
	}
	m := make(map[string]string, len(raw))
	for k, x := range raw {
		var s string
		if len(x) == 0 || x[0] != '"' || json.Unmarshal(x, &s) != nil {
			return nil, stErr("__metadata__[%q] must be a string", k)
		}
		m[k] = s
	}
	return m, nil
}

// go test ./codec -run '^$' -fuzz FuzzHeaderScannerMatchesEncodingJSON -fuzztime 60s
func FuzzHeaderScannerMatchesEncodingJSON(f *testing.F) {
	for _, b := range readTestdata(f, "") {
		f.Add(b)
	}
	for _, tc := range malformedSafetensors() {
		f.Add(tc.b)
	}
	ts, meta := goldenSmall()
	for _, seed := range [][]Tensor{fixtureAllDTypes(), ts, nil} {
		b, err := EncodeSafetensors(seed, meta)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(stFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}))
	f.Add(stFile(`{ "a" : { "shape" : [ 1 ] , "dtype" : "U\u0038" , "data_offsets" : [ 0 , 1 ] } , "__metadata__" : { "k\n" : "v\u00e9" } }`, []byte{1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotMeta, err := DecodeSafetensors(b)
		want, wantMeta, refErr := refDecodeSafetensors(b)
		switch {
		case err == nil && refErr != nil:
			t.Fatalf("the scanner accepts what encoding/json refused (%v): %q", refErr, b)
		case err != nil && refErr == nil:
			// Only a header with a key given twice may be refused now
			// (encoding/json kept the last).
			if !hasDuplicateKey(b[8 : 8+binary.LittleEndian.Uint64(b)]) {
				t.Fatalf("the scanner refuses (%v) what encoding/json accepted: %q", err, b)
			}
		case err == nil:
			sort.Slice(got, func(i, j int) bool { return got[i].Name < got[j].Name })
			sort.Slice(want, func(i, j int) bool { return want[i].Name < want[j].Name })
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotMeta, wantMeta) {
				t.Fatalf("decoded differently:\n%+v %v\n%+v %v", got, gotMeta, want, wantMeta)
			}
		}
	})
}

// hasDuplicateKey reports whether some object of the JSON in hdr gives a
// key twice (hdr is valid JSON: encoding/json accepted it).
func hasDuplicateKey(hdr []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(hdr))
	type level struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token is a key
	}
	var stack []level
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			top := &stack[n-1]
			if top.key {
				if k, ok := tok.(string); ok {
					if top.keys[k] {
						return true
					}
					top.keys[k] = true
					top.key = false
					continue
				}
			} else if d, ok := tok.(json.Delim); !ok || d == '{' || d == '[' {
				top.key = true // a value: the next token is a key again
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{keys: map[string]bool{}, object: true, key: true})
		case json.Delim('['):
			stack = append(stack, level{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if n := len(stack); n > 0 && stack[n-1].object {
				stack[n-1].key = true
			}
		}
	}
}

func TestHasDuplicateKey(t *testing.T) {
	cases := []struct {
		json string
		want bool
	}{
		{`{"a":1,"a":2}`, true},
		{`{"a":{"b":1,"b":2}}`, true},
		{`{"a":{"b":1},"b":2}`, false},
		{`{"a":[{"x":1},{"x":2}]}`, false},
		{`{"a":"a","b":"a"}`, false},
		{`{"a":[1,"a"],"a":0}`, true},
		{`{"__metadata__":{"k":"v","k":"w"}}`, true},
	}
	for _, tc := range cases {
		if got := hasDuplicateKey([]byte(tc.json)); got != tc.want {
			t.Errorf("hasDuplicateKey(%s) = %v, want %v", tc.json, got, tc.want)
		}
	}
}

// BenchmarkDecodeSafetensors decodes a 256-row CartPole sample answer
// (eleven tensors, 18 KB) with the header scanner and, side by side, with
// the encoding/json header reader it replaced.
//
// go test ./codec -run '^$' -bench BenchmarkDecodeSafetensors -benchtime 2s -count 3
func BenchmarkDecodeSafetensors(b *testing.B) {
	const rows = 256
	var ts []Tensor
	for _, f := range []struct {
		name  string
		dtype string
		shape []int
	}{
		{"observation", "float32", []int{rows, 4}}, {"next.observation", "float32", []int{rows, 4}},
		{"next.observation_valid", "bool", []int{rows}}, {"action", "int64", []int{rows}},
		{"next.reward", "float32", []int{rows}}, {"next.done", "bool", []int{rows}},
		{"next.terminated", "bool", []int{rows}}, {"next.truncated", "bool", []int{rows}},
		{"seq", "int64", []int{rows}}, {"traj_id", "int64", []int{rows}}, {"step", "int64", []int{rows}},
	} {
		n := DTypeSize(f.dtype)
		for _, d := range f.shape {
			n *= d
		}
		ts = append(ts, Tensor{Name: f.name, DType: f.dtype, Shape: f.shape, Data: make([]byte, n)})
	}
	body, err := EncodeSafetensors(ts, map[string]string{"sampler": "uniform", "size": "100000"})
	if err != nil {
		b.Fatal(err)
	}
	for _, impl := range []struct {
		name   string
		decode func([]byte) ([]Tensor, map[string]string, error)
	}{{"scanner", DecodeSafetensors}, {"encoding_json", refDecodeSafetensors}} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, _, err := impl.decode(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
