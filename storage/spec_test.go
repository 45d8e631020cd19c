package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rbdb/rbd/ratelimit"
)

var updateSpecGolden = flag.Bool("update-spec", false, "rewrite spec golden files in testdata/spec")

// specCartPoleJSON is the design example from the HTTP API documentation.
const specCartPoleJSON = `{"capacity": 100000, "storage": "memmap",
 "fields": {"observation": {"dtype": "float32", "shape": [4]},
            "action": {"dtype": "int64", "shape": []},
            "next.reward": {"dtype": "float32", "shape": []},
            "next.done": {"dtype": "bool", "shape": []},
            "next.terminated": {"dtype": "bool", "shape": []},
            "next.truncated": {"dtype": "bool", "shape": []}},
 "compact_obs": true, "obs_keys": ["observation"],
 "priority": {"alpha": 0.6, "eps": 1e-6},
 "durability": "flush"}`

// specBaseFields is a minimal valid set of fields for building test specs.
const specBaseFields = `"observation": {"dtype": "float32", "shape": [4]},
	"action": {"dtype": "int64"},
	"next.reward": {"dtype": "float32"},
	"next.done": {"dtype": "bool"}`

// specDoc builds a spec document with capacity 1000 (unless extra sets it),
// the given fields and extra top-level members.
func specDoc(fields, extra string) string {
	doc := `{"fields": {` + fields + `}`
	if !strings.Contains(extra, `"capacity"`) {
		doc += `, "capacity": 1000`
	}
	if extra != "" {
		doc += ", " + extra
	}
	return doc + "}"
}

func specMustParse(t *testing.T, doc string) Spec {
	t.Helper()
	s, err := ParseSpec([]byte(doc))
	if err != nil {
		t.Fatalf("ParseSpec(%s): %v", doc, err)
	}
	return s
}

func specMustMarshal(t *testing.T, s Spec) []byte {
	t.Helper()
	b, err := s.MarshalJSON()
	if err != nil {
		t.Fatalf("MarshalJSON: %v", err)
	}
	return b
}

// specErrorsOf flattens an error tree (as built by errors.Join) into the
// *SpecError values it holds, in order.
func specErrorsOf(err error) []*SpecError {
	var out []*SpecError
	var walk func(error)
	walk = func(err error) {
		if se, ok := err.(*SpecError); ok {
			out = append(out, se)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func specErrorPaths(err error) []string {
	var paths []string
	for _, se := range specErrorsOf(err) {
		paths = append(paths, se.Path)
	}
	return paths
}

func TestSpecParseDesignExample(t *testing.T) {
	s := specMustParse(t, specCartPoleJSON)

	if s.Capacity != 100000 || s.Storage != KindMemmap || !s.CompactObs || s.Durability != DurabilityFlush {
		t.Errorf("top level = capacity %d, storage %q, compact_obs %v, durability %q",
			s.Capacity, s.Storage, s.CompactObs, s.Durability)
	}
	if !slices.Equal(s.ObsKeys, []string{"observation"}) {
		t.Errorf("ObsKeys = %q", s.ObsKeys)
	}
	if s.Priority == nil || *s.Priority != (PriorityOptions{Alpha: 0.6, Eps: 1e-6}) {
		t.Errorf("Priority = %+v", s.Priority)
	}
	if s.Compression != nil {
		t.Errorf("Compression = %+v, want nil", s.Compression)
	}
	want := []struct {
		name  string
		dtype DType
		shape []int
	}{
		{"observation", Float32, []int{4}},
		{"action", Int64, []int{}},
		{"next.reward", Float32, []int{}},
		{"next.done", Bool, []int{}},
		{"next.terminated", Bool, []int{}},
		{"next.truncated", Bool, []int{}},
	}
	if len(s.Fields) != len(want) {
		t.Fatalf("got %d fields, want %d", len(s.Fields), len(want))
	}
	for i, w := range want {
		f := s.Fields[i]
		if f.Name != w.name || f.DType != w.dtype || !slices.Equal(f.Shape, w.shape) || f.Shape == nil ||
			f.Compress != nil || f.FrameStack != nil {
			t.Errorf("Fields[%d] = %+v, want %s %s %v", i, f, w.name, w.dtype, w.shape)
		}
	}
	if got := s.Fields[0].RowBytes(); got != 16 {
		t.Errorf("observation RowBytes = %d, want 16", got)
	}
}

// specGolden compares the canonical JSON of s with testdata/spec/name
// (rewritten with -update-spec) and returns the file's contents.
func specGolden(t *testing.T, name string, s Spec) []byte {
	t.Helper()
	got := append(specMustMarshal(t, s), '\n')
	path := filepath.Join("testdata", "spec", name)
	if *updateSpecGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-spec to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("canonical JSON differs from %s (run with -update-spec if the change is intended)\ngot:  %s\nwant: %s", path, got, want)
	}
	return want
}

func TestSpecGolden(t *testing.T) {
	s := specMustParse(t, specCartPoleJSON)
	want := specGolden(t, "cartpole.golden.json", s)
	// The golden file is itself a valid spec that describes the same buffer.
	if g := specMustParse(t, string(want)); !g.Equal(s) {
		t.Errorf("golden file parses to a different spec")
	}
}

func TestSpecRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		doc  string
	}{
		{"design example", specCartPoleJSON},
		{"defaults only", specDoc(specBaseFields, "")},
		{"memory", specDoc(specBaseFields, `"storage": "memory"`)},
		{"memory with run records", specDoc(specBaseFields, `"storage": "memory", "row_meta": "runs"`)},
		{"uniform priority", specDoc(specBaseFields, `"priority": {"alpha": 0, "eps": 0}`)},
		{"awkward floats", specDoc(specBaseFields, `"priority": {"alpha": 0.1, "eps": 1.2345678901234567e-300}`)},
		{"large priority", specDoc(specBaseFields, `"priority": {"alpha": 1e300, "eps": 123456789012345678901234567890}`)},
		{"partial priority", specDoc(specBaseFields, `"priority": {"eps": 0.5}`)},
		{"images", specDoc(`"pixels": {"dtype": "uint8", "shape": [3, 84, 84]},
			"state": {"dtype": "bfloat16", "shape": [2, 3, 1, 1, 1, 1, 1, 1]},
			"action": {"dtype": "int16", "shape": [1]},
			"next.done": {"dtype": "bool", "shape": []}`,
			`"capacity": 1099511627776, "obs_keys": ["pixels", "state"], "compact_obs": true, "durability": "fsync"`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s1 := specMustParse(t, tt.doc)
			b1 := specMustMarshal(t, s1)
			s2 := specMustParse(t, string(b1))
			if !s1.Equal(s2) || !s2.Equal(s1) {
				t.Fatalf("round trip changed the spec:\nbefore: %+v\nafter:  %+v", s1, s2)
			}
			b2 := specMustMarshal(t, s2)
			if !bytes.Equal(b1, b2) {
				t.Errorf("marshal is not canonical:\nfirst:  %s\nsecond: %s", b1, b2)
			}
			// encoding/json must use the same encoding, since that is how
			// specs embedded in other documents are written.
			b3, err := json.Marshal(s2)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b1, b3) {
				t.Errorf("json.Marshal differs from MarshalJSON:\n%s\n%s", b3, b1)
			}
		})
	}
}

func TestSpecEmbeddedInDocument(t *testing.T) {
	var req struct {
		Name string `json:"name"`
		Spec Spec   `json:"spec"`
	}
	doc := `{"name": "cartpole", "spec": ` + specCartPoleJSON + `}`
	if err := json.Unmarshal([]byte(doc), &req); err != nil {
		t.Fatal(err)
	}
	if !req.Spec.Equal(specMustParse(t, specCartPoleJSON)) {
		t.Errorf("embedded spec decoded as %+v", req.Spec)
	}

	bad := `{"name": "x", "spec": {"capacity": 1, "colour": "red"}}`
	err := json.Unmarshal([]byte(bad), &req)
	if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "colour") {
		t.Errorf("embedded bad spec: err = %v, want an ErrInvalidSpec naming colour", err)
	}
}

func TestSpecFieldOrderPreserved(t *testing.T) {
	names := []string{"zeta", "next.done", "alpha", "observation", "mid.part", "b"}
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%q: {\"dtype\": \"float32\"}", n))
	}
	doc := specDoc(strings.Join(parts, ", "), "")
	// next.done must be bool; fix it up after generating.
	doc = strings.Replace(doc, `"next.done": {"dtype": "float32"}`, `"next.done": {"dtype": "bool"}`, 1)

	s := specMustParse(t, doc)
	var got []string
	for _, f := range s.Fields {
		got = append(got, f.Name)
	}
	if !slices.Equal(got, names) {
		t.Errorf("field order = %q, want %q", got, names)
	}

	b := specMustMarshal(t, s)
	var idx []int
	for _, n := range names {
		idx = append(idx, bytes.Index(b, []byte(`"`+n+`":{`)))
	}
	if !slices.IsSorted(idx) || idx[0] < 0 {
		t.Errorf("marshaled field order is wrong (offsets %v): %s", idx, b)
	}
}

func TestSpecEqual(t *testing.T) {
	base := specMustParse(t, specCartPoleJSON)
	tests := []struct {
		name   string
		modify func(*Spec)
		equal  bool
	}{
		{"identical", func(*Spec) {}, true},
		{"fields reordered", func(s *Spec) { slices.Reverse(s.Fields) }, true},
		{"nil shape vs empty", func(s *Spec) { s.Fields[1].Shape = nil }, true},
		{"defaults left implicit", func(s *Spec) {
			s.Storage, s.Durability, s.ObsKeys = "", "", nil
		}, true},
		{"capacity", func(s *Spec) { s.Capacity++ }, false},
		{"storage", func(s *Spec) { s.Storage = KindMemory }, false},
		{"dtype", func(s *Spec) { s.Fields[0].DType = Float64 }, false},
		{"shape", func(s *Spec) { s.Fields[0].Shape = []int{2, 2} }, false},
		{"scalar vs one-element", func(s *Spec) { s.Fields[1].Shape = []int{1} }, false},
		{"field renamed", func(s *Spec) { s.Fields[1].Name = "act" }, false},
		{"field dropped", func(s *Spec) { s.Fields = s.Fields[:5] }, false},
		{"field added", func(s *Spec) { s.Fields = append(s.Fields, Field{Name: "x", DType: Int8}) }, false},
		{"compress set", func(s *Spec) { s.Fields[0].Compress = new(false) }, false},
		{"frame stack set", func(s *Spec) { s.Fields[0].FrameStack = &FrameStack{K: 4} }, false},
		{"compact_obs", func(s *Spec) { s.CompactObs = false }, false},
		{"obs_keys", func(s *Spec) { s.ObsKeys = []string{"observation", "action"} }, false},
		{"priority off", func(s *Spec) { s.Priority = nil }, false},
		{"priority alpha", func(s *Spec) { s.Priority.Alpha = 0.7 }, false},
		{"priority eps", func(s *Spec) { s.Priority.Eps = 1e-5 }, false},
		{"durability", func(s *Spec) { s.Durability = DurabilityFsync }, false},
		{"compression", func(s *Spec) { s.Compression = &CompressionOptions{Codec: "zstd", Level: 1} }, false},
		{"row_meta spelt out", func(s *Spec) { s.RowMetaLayout = RowMetaPerRow }, true},
		{"row_meta runs", func(s *Spec) { s.RowMetaLayout = RowMetaRuns }, false},
		{"row_meta strided", func(s *Spec) { s.RowMetaLayout = RowMetaStrided }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			other := base.Clone()
			tt.modify(&other)
			if got := base.Equal(other); got != tt.equal {
				t.Errorf("base.Equal(modified) = %v, want %v", got, tt.equal)
			}
			if got := other.Equal(base); got != tt.equal {
				t.Errorf("modified.Equal(base) = %v, want %v", got, tt.equal)
			}
		})
	}

	// Equal sorts internally; it must not reorder the caller's fields.
	reordered := base.Clone()
	slices.Reverse(reordered.Fields)
	first := reordered.Fields[0].Name
	base.Equal(reordered)
	if reordered.Fields[0].Name != first || base.Fields[0].Name != "observation" {
		t.Errorf("Equal reordered its arguments' fields")
	}
}

func TestSpecDefaults(t *testing.T) {
	t.Run("memmap", func(t *testing.T) {
		s := specMustParse(t, specDoc(specBaseFields, ""))
		if s.Storage != KindMemmap {
			t.Errorf("Storage = %q, want memmap", s.Storage)
		}
		if !slices.Equal(s.ObsKeys, []string{"observation"}) {
			t.Errorf("ObsKeys = %q, want [observation]", s.ObsKeys)
		}
		if s.Durability != DurabilityFlush {
			t.Errorf("Durability = %q, want flush", s.Durability)
		}
		if s.Compression != nil || s.Priority != nil || s.CompactObs {
			t.Errorf("Compression %v, Priority %v, CompactObs %v: want unset", s.Compression, s.Priority, s.CompactObs)
		}
		for _, f := range s.Fields {
			if f.Shape == nil {
				t.Errorf("field %s: Shape is nil, want []int{}", f.Name)
			}
		}
	})
	t.Run("memory keeps no durability", func(t *testing.T) {
		s := specMustParse(t, specDoc(specBaseFields, `"storage": "memory"`))
		if s.Durability != "" {
			t.Errorf("Durability = %q, want empty", s.Durability)
		}
	})
	t.Run("compressed", func(t *testing.T) {
		s := Spec{Storage: KindCompressed}.WithDefaults()
		if s.Compression == nil || *s.Compression != (CompressionOptions{Codec: "zstd", Level: 1, ChunkLen: 32, CacheMiB: 64}) {
			t.Errorf("Compression = %+v, want zstd level 1, chunks of 32, 64 MiB cache", s.Compression)
		}
		if s.Durability != DurabilityFlush {
			t.Errorf("Durability = %q, want flush", s.Durability)
		}
	})
	t.Run("explicit values kept", func(t *testing.T) {
		in := Spec{
			Storage:     KindMemmap,
			ObsKeys:     []string{"pixels"},
			Durability:  DurabilityNone,
			Compression: &CompressionOptions{Codec: "zstd", Level: 9},
		}
		s := in.WithDefaults()
		if s.Durability != DurabilityNone || !slices.Equal(s.ObsKeys, []string{"pixels"}) || s.Compression.Level != 9 {
			t.Errorf("WithDefaults overrode explicit settings: %+v", s)
		}
	})
	t.Run("empty obs_keys", func(t *testing.T) {
		s := Spec{ObsKeys: []string{}}.WithDefaults()
		if !slices.Equal(s.ObsKeys, []string{"observation"}) {
			t.Errorf("ObsKeys = %q, want [observation]", s.ObsKeys)
		}
	})
	t.Run("priority keys filled at decode", func(t *testing.T) {
		for doc, want := range map[string]PriorityOptions{
			`{}`:                     DefaultPriority(),
			`{"alpha": 0}`:           {Alpha: 0, Eps: 1e-6},
			`{"eps": 0.01}`:          {Alpha: 0.6, Eps: 0.01},
			`{"alpha": null}`:        DefaultPriority(),
			`{"alpha": 1, "eps": 0}`: {Alpha: 1, Eps: 0},
		} {
			s := specMustParse(t, specDoc(specBaseFields, `"priority": `+doc))
			if s.Priority == nil || *s.Priority != want {
				t.Errorf("priority %s decoded as %+v, want %+v", doc, s.Priority, want)
			}
		}
		for _, doc := range []string{`"priority": null`, `"compact_obs": false`} {
			if s := specMustParse(t, specDoc(specBaseFields, doc)); s.Priority != nil {
				t.Errorf("%s: Priority = %+v, want nil", doc, s.Priority)
			}
		}
	})
	t.Run("deep copy", func(t *testing.T) {
		in := Spec{
			Fields:   []Field{{Name: "observation", DType: Float32, Shape: []int{4}, FrameStack: &FrameStack{K: 4}}},
			ObsKeys:  []string{"observation"},
			Priority: &PriorityOptions{Alpha: 0.5},
		}
		out := in.WithDefaults()
		out.Fields[0].Shape[0] = 99
		out.Fields[0].FrameStack.K = 99
		out.ObsKeys[0] = "changed"
		out.Priority.Alpha = 99
		if in.Fields[0].Shape[0] != 4 || in.Fields[0].FrameStack.K != 4 || in.ObsKeys[0] != "observation" || in.Priority.Alpha != 0.5 {
			t.Errorf("WithDefaults result shares memory with its receiver: %+v", in)
		}
	})
}

func TestSpecValidateInvalid(t *testing.T) {
	fields := func(extra string) string { return specBaseFields + ", " + extra }
	tests := []struct {
		name string
		doc  string
		want []string // exact paths, in order
	}{
		{"capacity zero", specDoc(specBaseFields, `"capacity": 0`), []string{"capacity"}},
		{"capacity negative", specDoc(specBaseFields, `"capacity": -5`), []string{"capacity"}},
		{"capacity too large", specDoc(specBaseFields, `"capacity": 1099511627777`), []string{"capacity"}},
		{"capacity missing", `{"fields": {` + specBaseFields + `}}`, []string{"capacity"}},
		{"unknown storage", specDoc(specBaseFields, `"storage": "disk"`), []string{"storage"}},
		{"no fields", specDoc("", ""), []string{"fields"}},
		{"fields null", `{"capacity": 10, "fields": null}`, []string{"fields"}},
		{"next.done missing", specDoc(`"observation": {"dtype": "float32"}`, ""), []string{"fields.next.done"}},
		{"name starts with digit", specDoc(fields(`"1obs": {"dtype": "int8"}`), ""), []string{"fields.1obs"}},
		{"name with dash", specDoc(fields(`"obs-x": {"dtype": "int8"}`), ""), []string{"fields.obs-x"}},
		{"name with empty part", specDoc(fields(`"obs..x": {"dtype": "int8"}`), ""), []string{"fields.obs..x"}},
		{"name with trailing dot", specDoc(fields(`"obs.": {"dtype": "int8"}`), ""), []string{"fields.obs."}},
		{"name with unicode", specDoc(fields(`"obsé": {"dtype": "int8"}`), ""), []string{"fields.obsé"}},
		{"empty name", specDoc(fields(`"": {"dtype": "int8"}`), ""), []string{`fields[""]`}},
		{"name too long", specDoc(fields(`"`+strings.Repeat("a", 129)+`": {"dtype": "int8"}`), ""),
			[]string{"fields." + strings.Repeat("a", 129)}},
		{"dtype missing", specDoc(fields(`"x": {"shape": [2]}`), ""), []string{"fields.x.dtype"}},
		{"dtype null", specDoc(fields(`"x": {"dtype": null}`), ""), []string{"fields.x.dtype"}},
		{"field null", specDoc(fields(`"x": null`), ""), []string{"fields.x.dtype"}},
		{"too many dims", specDoc(fields(`"x": {"dtype": "int8", "shape": [1,1,1,1,1,1,1,1,1]}`), ""), []string{"fields.x.shape"}},
		{"zero dim", specDoc(fields(`"x": {"dtype": "int8", "shape": [4, 0]}`), ""), []string{"fields.x.shape[1]"}},
		{"negative dims", specDoc(fields(`"x": {"dtype": "int8", "shape": [-1, 2, -3]}`), ""),
			[]string{"fields.x.shape[0]", "fields.x.shape[2]"}},
		{"row too large", specDoc(fields(`"x": {"dtype": "float32", "shape": [8192, 8193]}`), ""), []string{"fields.x.shape"}},
		{"row product overflows int", specDoc(fields(`"x": {"dtype": "int8", "shape": [4294967296, 4294967296, 4294967296]}`), ""),
			[]string{"fields.x.shape"}},
		{"capacity times row overflows", specDoc(fields(`"x": {"dtype": "float64", "shape": [1048576]}`), `"capacity": 1099511627776`),
			[]string{"fields.x.shape"}},
		{"next.done not bool", specDoc(`"observation": {"dtype": "float32"}, "next.done": {"dtype": "float32"}`, ""),
			[]string{"fields.next.done.dtype"}},
		{"next.done not scalar", specDoc(`"observation": {"dtype": "float32"}, "next.done": {"dtype": "bool", "shape": [1]}`, ""),
			[]string{"fields.next.done.shape"}},
		{"next.terminated wrong", specDoc(fields(`"next.terminated": {"dtype": "int8", "shape": [2]}`), ""),
			[]string{"fields.next.terminated.dtype", "fields.next.terminated.shape"}},
		{"next.truncated not scalar", specDoc(fields(`"next.truncated": {"dtype": "bool", "shape": [1, 1]}`), ""),
			[]string{"fields.next.truncated.shape"}},
		{"obs key missing", specDoc(specBaseFields, `"obs_keys": ["observation", "pixels"]`), []string{"obs_keys[1]"}},
		{"obs key duplicate", specDoc(specBaseFields, `"obs_keys": ["observation", "action", "observation"]`), []string{"obs_keys[2]"}},
		{"compact_obs declares next obs", specDoc(fields(`"next.observation": {"dtype": "float32", "shape": [4]}`), `"compact_obs": true`),
			[]string{"fields.next.observation"}},
		{"priority alpha negative", specDoc(specBaseFields, `"priority": {"alpha": -0.1}`), []string{"priority.alpha"}},
		{"priority eps negative", specDoc(specBaseFields, `"priority": {"eps": -1e-9}`), []string{"priority.eps"}},
		{"unknown durability", specDoc(specBaseFields, `"durability": "sometimes"`), []string{"durability"}},
		{"memory with flush", specDoc(specBaseFields, `"storage": "memory", "durability": "flush"`), []string{"durability"}},
		{"memory with none", specDoc(specBaseFields, `"storage": "memory", "durability": "none"`), []string{"durability"}},
		{"unknown row_meta", specDoc(specBaseFields, `"storage": "memory", "row_meta": "columns"`), []string{"row_meta"}},
		{"run records on compressed", specDoc(specBaseFields, `"storage": "compressed", "row_meta": "runs"`), []string{"row_meta"}},
		{"strided runs on compressed", specDoc(specBaseFields, `"storage": "compressed", "row_meta": "strided"`), []string{"row_meta"}},
		{"row_meta not a string", specDoc(specBaseFields, `"storage": "memory", "row_meta": 1`), []string{"row_meta"}},
		{"compression on memmap", specDoc(specBaseFields, `"compression": {"codec": "zstd", "level": 3}`), []string{"compression"}},
		{"compression on memory", specDoc(specBaseFields, `"storage": "memory", "compression": {}`), []string{"compression"}},
		{"everything at once",
			specDoc(`"observation": {"dtype": "float32", "shape": [-4]}, "seq": {"dtype": "int64"}, "next.done": {"dtype": "bool"}`,
				`"capacity": 0, "storage": "tape", "obs_keys": ["observation", "observation"],
				"priority": {"alpha": -1, "eps": -1}, "durability": "maybe", "compression": {}`),
			[]string{"capacity", "storage", "fields.observation.shape[0]", "fields.seq", "obs_keys[1]",
				"priority.alpha", "priority.eps", "durability", "compression"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tt.doc))
			if err == nil {
				t.Fatalf("ParseSpec accepted %s", tt.doc)
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("errors.Is(err, ErrInvalidSpec) = false for %v", err)
			}
			if errors.Is(err, ErrNotSupported) {
				t.Errorf("errors.Is(err, ErrNotSupported) = true for %v", err)
			}
			var se *SpecError
			if !errors.As(err, &se) || se.Path != tt.want[0] {
				t.Errorf("errors.As gave %v, want first path %q", se, tt.want[0])
			}
			if got := specErrorPaths(err); !slices.Equal(got, tt.want) {
				t.Errorf("paths = %q, want %q\nerror: %v", got, tt.want, err)
			}
			for _, se := range specErrorsOf(err) {
				if prefix := "spec: " + se.Path + ": "; !strings.HasPrefix(se.Error(), prefix) || se.Msg == "" {
					t.Errorf("Error() = %q, want prefix %q and a message", se.Error(), prefix)
				}
			}
		})
	}
}

func TestSpecValidateBoundaries(t *testing.T) {
	fields := func(extra string) string { return specBaseFields + ", " + extra }
	for name, doc := range map[string]string{
		"capacity 1":               specDoc(specBaseFields, `"capacity": 1`),
		"capacity 1<<40":           specDoc(specBaseFields, `"capacity": 1099511627776`),
		"8 dims":                   specDoc(fields(`"x": {"dtype": "int8", "shape": [1,2,1,2,1,2,1,2]}`), ""),
		"row of exactly 256 MiB":   specDoc(fields(`"x": {"dtype": "float32", "shape": [8192, 8192]}`), ""),
		"capacity x row = 2^62":    specDoc(fields(`"x": {"dtype": "float64", "shape": [524288]}`), `"capacity": 1099511627776`),
		"128 byte name":            specDoc(fields(`"`+strings.Repeat("a.", 63)+`ab": {"dtype": "int8"}`), ""),
		"underscores and digits":   specDoc(fields(`"_a1._": {"dtype": "int8"}, "A_.b2_C": {"dtype": "int8"}`), ""),
		"valid-ish reserved-ish":   specDoc(fields(`"seqs": {"dtype": "int8"}, "next.seq": {"dtype": "int8"}, "valid": {"dtype": "int8"}, "next.original": {"dtype": "int8"}`), ""),
		"alpha zero eps zero":      specDoc(specBaseFields, `"priority": {"alpha": 0, "eps": 0}`),
		"memory, no durability":    specDoc(specBaseFields, `"storage": "memory"`),
		"memory, run records":      specDoc(specBaseFields, `"storage": "memory", "row_meta": "runs"`),
		"memory, strided runs":     specDoc(specBaseFields, `"storage": "memory", "row_meta": "strided"`),
		"row_meta row on memmap":   specDoc(specBaseFields, `"row_meta": "row"`),
		"row_meta runs on memmap":  specDoc(specBaseFields, `"row_meta": "runs"`),
		"memmap with none":         specDoc(specBaseFields, `"durability": "none"`),
		"compact without next":     specDoc(specBaseFields, `"compact_obs": true`),
		"next obs without compact": specDoc(fields(`"next.observation": {"dtype": "float32", "shape": [4]}`), ""),
		"all flags":                specDoc(fields(`"next.terminated": {"dtype": "bool", "shape": []}, "next.truncated": {"dtype": "bool"}`), ""),
	} {
		if _, err := ParseSpec([]byte(doc)); err != nil {
			t.Errorf("%s: ParseSpec: %v", name, err)
		}
	}
}

func TestSpecValidateGoValues(t *testing.T) {
	valid := func() Spec {
		return Spec{
			Capacity: 10,
			Fields: []Field{
				{Name: "observation", DType: Float32, Shape: []int{3}},
				{Name: "next.done", DType: Bool},
			},
		}
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("a spec relying on defaults should be valid: %v", err)
	}
	tests := []struct {
		name   string
		modify func(*Spec)
		want   []string
	}{
		{"duplicate field", func(s *Spec) { s.Fields = append(s.Fields, s.Fields[0]) }, []string{"fields.observation"}},
		{"invalid dtype value", func(s *Spec) { s.Fields[0].DType = 200 }, []string{"fields.observation.dtype"}},
		{"zero dtype", func(s *Spec) { s.Fields[0].DType = 0 }, []string{"fields.observation.dtype"}},
		{"NaN alpha", func(s *Spec) { s.Priority = &PriorityOptions{Alpha: math.NaN()} }, []string{"priority.alpha"}},
		{"infinite alpha", func(s *Spec) { s.Priority = &PriorityOptions{Alpha: math.Inf(1)} }, []string{"priority.alpha"}},
		{"infinite eps", func(s *Spec) { s.Priority = &PriorityOptions{Eps: math.Inf(1)} }, []string{"priority.eps"}},
		{"NaN eps", func(s *Spec) { s.Priority = &PriorityOptions{Eps: math.NaN()} }, []string{"priority.eps"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := valid()
			tt.modify(&s)
			err := s.Validate()
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Validate() = %v, want ErrInvalidSpec", err)
			}
			if got := specErrorPaths(err); !slices.Equal(got, tt.want) {
				t.Errorf("paths = %q, want %q\nerror: %v", got, tt.want, err)
			}
		})
	}
}

func TestSpecReservedNames(t *testing.T) {
	reserved := []string{
		"seq", "traj_id", "step", "prev_seq", "next_seq", "env", "weight", "mask",
		"slice_end", "steps_to_next_obs", "gamma", "epoch",
		"observation_valid", "next.reward_valid", "_valid", "a.b_valid",
		"next.original_observation", "next.original_x.y",
	}
	for _, name := range reserved {
		doc := specDoc(specBaseFields+fmt.Sprintf(", %q: {\"dtype\": \"float32\"}", name), "")
		_, err := ParseSpec([]byte(doc))
		ses := specErrorsOf(err)
		if len(ses) != 1 || ses[0].Path != "fields."+name || !strings.Contains(ses[0].Msg, "reserved") {
			t.Errorf("%s: err = %v, want one reserved-name error at fields.%s", name, err, name)
		}
	}
}

func TestSpecCompression(t *testing.T) {
	obs := func(opts string) string {
		return `"observation": {"dtype": "uint8", "shape": [4, 84, 84]` + opts + `}, "next.done": {"dtype": "bool"}`
	}
	tests := []struct {
		name  string
		doc   string
		paths []string // nil: valid
	}{
		{"compressed storage", specDoc(specBaseFields, `"storage": "compressed"`), nil},
		{"options", specDoc(specBaseFields, `"storage": "compressed", "compression": {"codec": "none", "chunk_len": 8, "delta": true, "cache_mib": 1}`), nil},
		{"frame stack", specDoc(obs(`, "frame_stack": {"k": 4, "axis": 0}`), `"storage": "compressed"`), nil},
		{"frame stack on memmap", specDoc(obs(`, "frame_stack": {"k": 4, "axis": 0}`), ""), []string{"fields.observation.frame_stack"}},
		{"compress on memmap", specDoc(obs(`, "compress": false`), ""), []string{"fields.observation.compress"}},
		{"compress on a flag", specDoc(`"next.done": {"dtype": "bool", "compress": true}`, `"storage": "compressed"`), []string{"fields.next.done.compress"}},
		{"frame stack k mismatch", specDoc(obs(`, "frame_stack": {"k": 3, "axis": 0}`), `"storage": "compressed"`), []string{"fields.observation.frame_stack.k"}},
		{"frame stack k 1", specDoc(obs(`, "frame_stack": {"k": 1, "axis": 0}`), `"storage": "compressed"`), []string{"fields.observation.frame_stack.k"}},
		{"frame stack axis", specDoc(obs(`, "frame_stack": {"k": 4, "axis": 3}`), `"storage": "compressed"`), []string{"fields.observation.frame_stack.axis"}},
		{"frame stack uncompressed", specDoc(obs(`, "compress": false, "frame_stack": {"k": 4, "axis": 0}`), `"storage": "compressed"`), []string{"fields.observation.frame_stack"}},
		{"frame stack longer than chunk", specDoc(obs(`, "frame_stack": {"k": 4, "axis": 0}`), `"storage": "compressed", "compression": {"chunk_len": 3}`), []string{"fields.observation.frame_stack.k"}},
		{"level", specDoc(specBaseFields, `"storage": "compressed", "compression": {"level": 23}`), []string{"compression.level"}},
		{"codec", specDoc(specBaseFields, `"storage": "compressed", "compression": {"codec": "lz4"}`), []string{"compression.codec"}},
		{"chunk_len", specDoc(specBaseFields, `"storage": "compressed", "compression": {"chunk_len": 5000}`), []string{"compression.chunk_len"}},
		{"cache_mib", specDoc(specBaseFields, `"storage": "compressed", "compression": {"cache_mib": -1}`), []string{"compression.cache_mib"}},
		{"options on memmap", specDoc(specBaseFields, `"compression": {"level": 3}`), []string{"compression"}},
		{"chunk over 1 GiB", specDoc(`"observation": {"dtype": "float64", "shape": [4096, 4096]}, "next.done": {"dtype": "bool"}`, `"storage": "compressed"`), []string{"fields.observation"}},
		{"big field kept plain", specDoc(`"observation": {"dtype": "float64", "shape": [4096, 4096], "compress": false}, "next.done": {"dtype": "bool"}`, `"storage": "compressed"`), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tt.doc))
			if tt.paths == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("err = %v, want ErrInvalidSpec", err)
			}
			if got := specErrorPaths(err); !slices.Equal(got, tt.paths) {
				t.Errorf("paths = %q, want %q (%v)", got, tt.paths, err)
			}
		})
	}
}

func TestSpecDecodeErrors(t *testing.T) {
	field := func(body string) string {
		return specDoc(`"observation": `+body+`, "next.done": {"dtype": "bool"}`, "")
	}
	tests := []struct {
		name     string
		doc      string
		path     string
		contains []string // substrings of Error()
	}{
		{"unknown top-level key", specDoc(specBaseFields, `"colour": "red"`), "colour", []string{"colour", "unknown key"}},
		{"misspelt top-level key", specDoc(specBaseFields, `"obs_key": ["observation"]`), "obs_key", []string{"obs_key"}},
		{"unknown field key", field(`{"dtype": "float32", "dims": [4]}`), "fields.observation.dims", []string{"dims", "unknown key"}},
		{"unknown priority key", specDoc(specBaseFields, `"priority": {"beta": 0.4}`), "priority.beta", []string{"beta"}},
		{"unknown frame_stack key", field(`{"dtype": "uint8", "frame_stack": {"k": 4, "dim": 0}}`), "fields.observation.frame_stack.dim", []string{"dim"}},
		{"unknown compression key", specDoc(specBaseFields, `"compression": {"codec": "zstd", "lvl": 3}`), "compression.lvl", []string{"lvl"}},
		{"duplicate field name", `{"capacity": 10, "fields": {"next.done": {"dtype": "bool"}, "next.done": {"dtype": "bool"}}}`,
			"fields.next.done", []string{"duplicate field name"}},
		{"duplicate top-level key", `{"capacity": 10, "capacity": 20}`, "capacity", []string{"duplicate key"}},
		{"duplicate field key", field(`{"dtype": "float32", "dtype": "int8"}`), "fields.observation.dtype", []string{"duplicate key"}},
		{"unknown dtype", field(`{"dtype": "float8"}`), "fields.observation.dtype", []string{`"float8"`, "float32", "bfloat16"}},
		{"dtype not a string", field(`{"dtype": 4}`), "fields.observation.dtype", []string{"must be a string"}},
		{"capacity a string", specDoc(specBaseFields, `"capacity": "big"`), "capacity", []string{"must be an integer"}},
		{"capacity fractional", specDoc(specBaseFields, `"capacity": 1.5`), "capacity", []string{"must be an integer"}},
		{"capacity huge", specDoc(specBaseFields, `"capacity": 1e30`), "capacity", []string{"must be an integer"}},
		{"shape a number", field(`{"dtype": "float32", "shape": 4}`), "fields.observation.shape", []string{"array of integers"}},
		{"shape of floats", field(`{"dtype": "float32", "shape": [4.5]}`), "fields.observation.shape", []string{"array of integers"}},
		{"compress not bool", field(`{"dtype": "float32", "compress": "yes"}`), "fields.observation.compress", []string{"boolean"}},
		{"field not an object", field(`"float32"`), "fields.observation", []string{"must be a JSON object, not a string"}},
		{"fields an array", `{"capacity": 10, "fields": [{"name": "x"}]}`, "fields", []string{"must be a JSON object, not an array"}},
		{"priority a number", specDoc(specBaseFields, `"priority": 0.6`), "priority", []string{"must be a JSON object, not a number"}},
		{"obs_keys a string", specDoc(specBaseFields, `"obs_keys": "observation"`), "obs_keys", []string{"array of strings"}},
		{"top level an array", `[]`, "", []string{"must be a JSON object"}},
		{"top level a number", `7`, "", []string{"must be a JSON object"}},
		{"empty input", ``, "", []string{"unexpected end"}},
		{"truncated", `{"capacity": 10, "fields": {"observation": {"dtype"`, "fields.observation.dtype", []string{"unexpected end"}},
		{"trailing data", specDoc(specBaseFields, "") + ` {}`, "", []string{"after the spec"}},
		{"malformed", `{"capacity": 10,, }`, "", []string{"malformed JSON"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Spec
			err := s.UnmarshalJSON([]byte(tt.doc))
			if err == nil {
				t.Fatalf("UnmarshalJSON accepted %s", tt.doc)
			}
			if _, perr := ParseSpec([]byte(tt.doc)); perr == nil || perr.Error() != err.Error() {
				t.Errorf("ParseSpec error %v differs from UnmarshalJSON error %v", perr, err)
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("errors.Is(err, ErrInvalidSpec) = false for %v", err)
			}
			var se *SpecError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SpecError", err)
			}
			if se.Path != tt.path {
				t.Errorf("Path = %q, want %q (error: %v)", se.Path, tt.path, err)
			}
			for _, sub := range tt.contains {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("error %q does not contain %q", err, sub)
				}
			}
		})
	}
}

func TestSpecUnmarshalIsDecodeOnly(t *testing.T) {
	var s Spec
	doc := `{"capacity": 0, "fields": {"x": {"dtype": "int8"}}, "priority": {}}`
	if err := s.UnmarshalJSON([]byte(doc)); err != nil {
		t.Fatalf("UnmarshalJSON rejected a decodable spec: %v", err)
	}
	if s.Storage != "" || s.ObsKeys != nil || s.Durability != "" || s.Fields[0].Shape != nil {
		t.Errorf("UnmarshalJSON filled defaults: %+v", s)
	}
	if s.Priority == nil || *s.Priority != DefaultPriority() {
		t.Errorf("Priority = %+v, want the decode-time defaults", s.Priority)
	}

	prev := Spec{Capacity: 5}
	if err := prev.UnmarshalJSON([]byte(" null ")); err != nil || prev.Capacity != 5 {
		t.Errorf("UnmarshalJSON(null) = %v and left %+v, want a no-op", err, prev)
	}
	if err := prev.UnmarshalJSON([]byte(`{"capacity": "x"}`)); err == nil || prev.Capacity != 5 {
		t.Errorf("a failed UnmarshalJSON modified its receiver: %+v", prev)
	}
}

func TestSpecMarshalShape(t *testing.T) {
	s := Spec{
		Capacity: 3,
		Fields: []Field{
			{Name: "o", DType: Uint8, Shape: []int{2, 3}, Compress: new(true), FrameStack: &FrameStack{K: 4, Axis: -1}},
			{Name: "next.done", DType: Bool},
		},
		ObsKeys:     nil,
		Compression: &CompressionOptions{Codec: "zstd", Level: 3},
	}
	want := `{"capacity":3,"storage":"","fields":{"o":{"dtype":"uint8","shape":[2,3],"compress":true,` +
		`"frame_stack":{"k":4,"axis":-1}},"next.done":{"dtype":"bool","shape":[]}},"compact_obs":false,` +
		`"obs_keys":[],"compression":{"codec":"zstd","level":3,"chunk_len":0,"delta":false,"cache_mib":0}}`
	if got := string(specMustMarshal(t, s)); got != want {
		t.Errorf("MarshalJSON =\n%s\nwant\n%s", got, want)
	}
	var back Spec
	if err := json.Unmarshal([]byte(want), &back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(s) {
		t.Errorf("decoded %+v, want %+v", back, s)
	}

	bad := []Spec{
		{Capacity: 1, Fields: []Field{{Name: "x"}}},
		{Capacity: 1, Priority: &PriorityOptions{Alpha: math.NaN()}},
		{Capacity: 1, Priority: &PriorityOptions{Eps: math.Inf(-1)}},
	}
	for _, s := range bad {
		if b, err := s.MarshalJSON(); err == nil {
			t.Errorf("MarshalJSON(%+v) = %s, want an error", s, b)
		}
	}
}

func TestSpecFieldLookup(t *testing.T) {
	s := specMustParse(t, specCartPoleJSON)
	f, ok := s.Field("observation")
	if !ok || f.DType != Float32 || !slices.Equal(f.Shape, []int{4}) {
		t.Fatalf("Field(observation) = %+v, %v", f, ok)
	}
	f.Shape[0] = 100
	if s.Fields[0].Shape[0] != 4 {
		t.Errorf("Field returned a shape aliasing the spec")
	}
	if _, ok := s.Field("pixels"); ok {
		t.Errorf("Field(pixels) found a field")
	}
	if !s.HasField("next.done") || s.HasField("next") || s.HasField("") {
		t.Errorf("HasField gave wrong answers")
	}
}

func TestSpecClone(t *testing.T) {
	s := Spec{
		Capacity: 7,
		Fields: []Field{{Name: "o", DType: Uint8, Shape: []int{2}, Compress: new(true),
			FrameStack: &FrameStack{K: 4}}},
		ObsKeys:     []string{"o"},
		Priority:    &PriorityOptions{Alpha: 1},
		Compression: &CompressionOptions{Codec: "zstd"},
	}
	c := s.Clone()
	if !c.Equal(s) {
		t.Fatalf("clone is not equal to the original")
	}
	c.Fields[0].Name = "p"
	c.Fields[0].Shape[0] = 9
	*c.Fields[0].Compress = false
	c.Fields[0].FrameStack.K = 9
	c.ObsKeys[0] = "p"
	c.Priority.Alpha = 9
	c.Compression.Level = 9
	if s.Fields[0].Name != "o" || s.Fields[0].Shape[0] != 2 || !*s.Fields[0].Compress || s.Fields[0].FrameStack.K != 4 ||
		s.ObsKeys[0] != "o" || s.Priority.Alpha != 1 || s.Compression.Level != 0 {
		t.Errorf("Clone shares memory with the original: %+v", s)
	}

	var empty Spec
	if c := empty.Clone(); c.Fields != nil || c.ObsKeys != nil || c.Priority != nil {
		t.Errorf("Clone of the zero spec = %+v, want nils kept", c)
	}
	if c := (Spec{Fields: []Field{}, ObsKeys: []string{}}).Clone(); c.Fields == nil || c.ObsKeys == nil {
		t.Errorf("Clone turned empty slices into nil")
	}
}

func TestSpecErrorUnwrap(t *testing.T) {
	plain := &SpecError{Path: "capacity", Msg: "bad"}
	if plain.Error() != "spec: capacity: bad" {
		t.Errorf("Error() = %q", plain.Error())
	}
	if !errors.Is(plain, ErrInvalidSpec) || errors.Is(plain, ErrNotSupported) || plain.Unwrap() != ErrInvalidSpec {
		t.Errorf("plain SpecError unwraps wrongly")
	}
	ns := &SpecError{Path: "storage", Msg: "later", Err: ErrNotSupported}
	if !errors.Is(ns, ErrInvalidSpec) || !errors.Is(ns, ErrNotSupported) {
		t.Errorf("not-supported SpecError unwraps wrongly")
	}
	wrapped := fmt.Errorf("create buffer: %w", ns)
	if !errors.Is(wrapped, ErrInvalidSpec) || !errors.Is(wrapped, ErrNotSupported) {
		t.Errorf("wrapped SpecError lost its identity")
	}
	if got := (&SpecError{Msg: "empty"}).Error(); got != "spec: empty" {
		t.Errorf("Error() without path = %q", got)
	}

	// A syntax error stays reachable for callers that want its offset.
	_, err := ParseSpec([]byte(`{"capacity": 1,, }`))
	var syn *json.SyntaxError
	if !errors.As(err, &syn) || !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("err = %v, want a *json.SyntaxError inside an ErrInvalidSpec", err)
	}
}

func TestSpecRowSize(t *testing.T) {
	tests := []struct {
		f           Field
		elems, size int
	}{
		{Field{DType: Bool}, 1, 1},
		{Field{DType: Float64, Shape: []int{}}, 1, 8},
		{Field{DType: Float32, Shape: []int{4}}, 4, 16},
		{Field{DType: Uint8, Shape: []int{3, 84, 84}}, 21168, 21168},
		{Field{DType: BFloat16, Shape: []int{2, 5}}, 10, 20},
	}
	for _, tt := range tests {
		if e, b := tt.f.RowElems(), tt.f.RowBytes(); e != tt.elems || b != tt.size {
			t.Errorf("%s%v: RowElems, RowBytes = %d, %d; want %d, %d", tt.f.DType, tt.f.Shape, e, b, tt.elems, tt.size)
		}
	}
}

func TestDTypeTable(t *testing.T) {
	tests := []struct {
		d     DType
		name  string
		size  int
		float bool
	}{
		{Bool, "bool", 1, false},
		{Uint8, "uint8", 1, false},
		{Int8, "int8", 1, false},
		{Int16, "int16", 2, false},
		{Int32, "int32", 4, false},
		{Int64, "int64", 8, false},
		{Float16, "float16", 2, true},
		{BFloat16, "bfloat16", 2, true},
		{Float32, "float32", 4, true},
		{Float64, "float64", 8, true},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.name {
			t.Errorf("DType(%d).String() = %q, want %q", uint8(tt.d), got, tt.name)
		}
		if got, err := ParseDType(tt.name); err != nil || got != tt.d {
			t.Errorf("ParseDType(%q) = %v, %v", tt.name, got, err)
		}
		if got := tt.d.Size(); got != tt.size {
			t.Errorf("%s.Size() = %d, want %d", tt.d, got, tt.size)
		}
		if got := tt.d.IsFloat(); got != tt.float {
			t.Errorf("%s.IsFloat() = %v", tt.d, got)
		}
		if !tt.d.Valid() {
			t.Errorf("%s.Valid() = false", tt.d)
		}
	}
	if len(tests) != int(dtypeEnd-Bool) {
		t.Errorf("table covers %d dtypes, want %d", len(tests), int(dtypeEnd-Bool))
	}

	for _, d := range []DType{0, dtypeEnd, 200, 255} {
		if d.Valid() || d.Size() != 0 || d.IsFloat() {
			t.Errorf("invalid %s reports Valid %v, Size %d, IsFloat %v", d, d.Valid(), d.Size(), d.IsFloat())
		}
		if want := fmt.Sprintf("dtype(%d)", uint8(d)); d.String() != want {
			t.Errorf("String() = %q, want %q", d.String(), want)
		}
	}

	for _, bad := range []string{"", "float", "Float32", "float32 ", "int", "double", "dtype(1)", "torch.float32"} {
		_, err := ParseDType(bad)
		if err == nil {
			t.Errorf("ParseDType(%q) succeeded", bad)
			continue
		}
		for _, sub := range []string{fmt.Sprintf("%q", bad), "bool", "bfloat16", "float64"} {
			if !strings.Contains(err.Error(), sub) {
				t.Errorf("ParseDType(%q) error %q does not mention %s", bad, err, sub)
			}
		}
	}
}

func TestDTypeJSON(t *testing.T) {
	for d := Bool; d < dtypeEnd; d++ {
		b, err := json.Marshal(d)
		if err != nil || string(b) != `"`+d.String()+`"` {
			t.Errorf("json.Marshal(%s) = %s, %v", d, b, err)
		}
		var back DType
		if err := json.Unmarshal(b, &back); err != nil || back != d {
			t.Errorf("json.Unmarshal(%s) = %v, %v", b, back, err)
		}
	}

	type wrapper struct {
		D DType `json:"d"`
	}
	var w wrapper
	if err := json.Unmarshal([]byte(`{"d": "bfloat16"}`), &w); err != nil || w.D != BFloat16 {
		t.Errorf("decode in struct = %v, %v", w.D, err)
	}
	if err := json.Unmarshal([]byte(`{"d": null}`), &w); err != nil || w.D != BFloat16 {
		t.Errorf("null changed the dtype to %v (%v)", w.D, err)
	}
	for _, bad := range []string{`"float8"`, `3`, `true`, `["int8"]`} {
		var d DType
		if err := json.Unmarshal([]byte(bad), &d); err == nil {
			t.Errorf("json.Unmarshal(%s) succeeded with %v", bad, d)
		}
	}
	if b, err := json.Marshal(DType(0)); err == nil {
		t.Errorf("json.Marshal(DType(0)) = %s, want an error", b)
	}
}

func TestSpecRateLimit(t *testing.T) {
	rl := func(obj string) string { return specDoc(specBaseFields, `"rate_limit": `+obj) }
	tests := []struct {
		name  string
		doc   string
		paths []string // nil: valid
		want  *ratelimit.Params
	}{
		{"ratio", rl(`{"samples_per_insert": 8, "min_size": 100, "error_buffer": 400}`), nil, &ratelimit.Params{SamplesPerInsert: 8, MinSize: 100, ErrorBuffer: 400}},
		{"min size only", rl(`{"min_size": 10}`), nil, &ratelimit.Params{MinSize: 10}},
		{"empty object: min size 1", rl(`{}`), nil, &ratelimit.Params{MinSize: 1}},
		{"null: none", rl(`null`), nil, nil},
		{"fraction", rl(`{"samples_per_insert": 0.25, "min_size": 1, "error_buffer": 1.5}`), nil, &ratelimit.Params{SamplesPerInsert: 0.25, MinSize: 1, ErrorBuffer: 1.5}},
		{"ratio 0", rl(`{"samples_per_insert": 0, "error_buffer": 4}`), []string{"rate_limit.samples_per_insert"}, nil},
		{"negative ratio", rl(`{"samples_per_insert": -2, "error_buffer": 4}`), []string{"rate_limit.samples_per_insert"}, nil},
		{"no error buffer", rl(`{"samples_per_insert": 2}`), []string{"rate_limit.error_buffer"}, nil},
		{"window too small", rl(`{"samples_per_insert": 8, "error_buffer": 7}`), []string{"rate_limit.error_buffer"}, nil},
		{"error buffer alone", rl(`{"error_buffer": 7}`), []string{"rate_limit.error_buffer"}, nil},
		{"min size 0", rl(`{"min_size": 0}`), []string{"rate_limit.min_size"}, nil},
		{"min size past capacity", rl(`{"min_size": 1001}`), []string{"rate_limit.min_size"}, nil},
		{"several", rl(`{"samples_per_insert": -1, "min_size": -1, "error_buffer": -1}`), []string{"rate_limit.samples_per_insert", "rate_limit.min_size", "rate_limit.error_buffer"}, nil},
		{"unknown key", rl(`{"min_size": 1, "spi": 3}`), []string{"rate_limit.spi"}, nil},
		{"duplicate key", rl(`{"min_size": 1, "min_size": 2}`), []string{"rate_limit.min_size"}, nil},
		{"string", rl(`{"min_size": "10"}`), []string{"rate_limit.min_size"}, nil},
		{"not an object", rl(`8`), []string{"rate_limit"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseSpec([]byte(tt.doc))
			if tt.paths != nil {
				if !errors.Is(err, ErrInvalidSpec) {
					t.Fatalf("err = %v, want ErrInvalidSpec", err)
				}
				if got := specErrorPaths(err); !slices.Equal(got, tt.paths) {
					t.Errorf("paths = %q, want %q (%v)", got, tt.paths, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (s.RateLimit == nil) != (tt.want == nil) || (s.RateLimit != nil && *s.RateLimit != *tt.want) {
				t.Fatalf("rate limit %+v, want %+v", s.RateLimit, tt.want)
			}
			// Round trip, byte for byte.
			b1 := specMustMarshal(t, s)
			s2 := specMustParse(t, string(b1))
			if (s2.RateLimit == nil) != (s.RateLimit == nil) || (s2.RateLimit != nil && *s2.RateLimit != *s.RateLimit) {
				t.Fatalf("round trip: %s gave %+v", b1, s2.RateLimit)
			}
			if b2 := specMustMarshal(t, s2); !bytes.Equal(b1, b2) {
				t.Errorf("marshal is not canonical:\n%s\n%s", b1, b2)
			}
		})
	}

	// A rate limit is a live setting: it does not make specs differ.
	a := specMustParse(t, rl(`{"samples_per_insert": 8, "min_size": 100, "error_buffer": 400}`))
	b := specMustParse(t, specDoc(specBaseFields, ""))
	if !a.Equal(b) || !b.Equal(a) {
		t.Error("specs that differ only in rate_limit are not Equal")
	}
	if c := a.Clone(); c.RateLimit == a.RateLimit {
		t.Error("Clone shares the rate limit")
	}

	// The canonical form, pinned.
	specGolden(t, "ratelimit.golden.json", a)

	// ParseRateLimit, for PUT .../rate_limit.
	for _, c := range []struct {
		doc  string
		path string
	}{
		{`{"min_size": 5} x`, "rate_limit"},
		{`{"min_sizes": 5}`, "rate_limit.min_sizes"},
		{`{"min_size": 5`, "rate_limit"},
	} {
		_, err := ParseRateLimit([]byte(c.doc))
		if got := specErrorPaths(err); !slices.Equal(got, []string{c.path}) {
			t.Errorf("ParseRateLimit(%s): %v, want path %s", c.doc, err, c.path)
		}
	}
	if p, err := ParseRateLimit([]byte(" null ")); p != nil || err != nil {
		t.Errorf("ParseRateLimit(null) = %v, %v", p, err)
	}
}

// TestCreateBufferRowMetaDefault: a spec that leaves row_meta out gets
// rows.meta format version 2 for a new memmap buffer (written into the
// spec it keeps) and 32-byte records for a memory buffer; asked again, ""
// matches whatever layout the buffer has, including a buffer of an older
// build whose catalog spec leaves it out (version 1), so restarting a
// service with the same spec keeps working on old data dirs.
func TestCreateBufferRowMetaDefault(t *testing.T) {
	cases := []struct {
		name      string
		kind      Kind
		ask       RowMetaLayout
		wantSpec  RowMetaLayout // in the created buffer's spec
		wantBytes int64         // Info.RowMetaBytes (a memory buffer's with row-group padding)
		conflicts RowMetaLayout // a layout the buffer refuses when asked again ("": none to try)
	}{
		{"memmap default", KindMemmap, "", RowMetaBlocks, 1, RowMetaRuns},
		{"memmap default, small ring", KindMemmap, "", RowMetaRuns, 16, RowMetaPerRow},
		{"memmap row", KindMemmap, RowMetaPerRow, RowMetaPerRow, 64, RowMetaRuns},
		{"memmap runs", KindMemmap, RowMetaRuns, RowMetaRuns, 16, RowMetaPerRow},
		{"memory default", KindMemory, "", "", 33, RowMetaRuns},
		{"compressed default", KindCompressed, "", "", 64, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			capacity := int64(64)
			if tc.name == "memmap default" {
				capacity = 1024 // version 3 from 1,024 rows (defaultMemmapRowMeta)
			}
			spec := testSpec(tc.kind, capacity, false)
			spec.RowMetaLayout = tc.ask
			b := mustCreate(t, s, "b", spec)
			if got := b.Spec().RowMetaLayout; got != tc.wantSpec {
				t.Fatalf("created spec's row_meta %q, want %q", got, tc.wantSpec)
			}
			info, err := b.Info()
			if err != nil {
				t.Fatal(err)
			}
			if info.RowMetaBytes != tc.wantBytes {
				t.Errorf("row_meta_bytes %d, want %d", info.RowMetaBytes, tc.wantBytes)
			}
			for _, ask := range []RowMetaLayout{"", tc.wantSpec} {
				again := spec.Clone()
				again.RowMetaLayout = ask
				if got, created, err := s.CreateBuffer("b", again); err != nil || created || got != b {
					t.Errorf("asked again with row_meta %q: created %v, err %v; want the existing buffer", ask, created, err)
				}
			}
			if tc.conflicts != "" {
				again := spec.Clone()
				again.RowMetaLayout = tc.conflicts
				if _, _, err := s.CreateBuffer("b", again); !errors.Is(err, ErrSpecConflict) {
					t.Errorf("asked again with row_meta %q: %v, want ErrSpecConflict", tc.conflicts, err)
				}
			}
			if tc.kind == KindMemory {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			// Reopened (and verified clean), the buffer keeps its layout.
			_, b = reopenVerified(t, s, dir, "b")
			if got := b.Spec().RowMetaLayout; got != tc.wantSpec {
				t.Errorf("reopened: row_meta %q, want %q", got, tc.wantSpec)
			}
		})
	}

	// A data dir of an older build: its memmap spec leaves row_meta out
	// and its rows.meta is version 1. It stays version 1, and the spec it
	// was made with still names it.
	s := openStore(t, goldenCopy(t))
	defer s.Close()
	b, err := s.Buffer("golden")
	if err != nil {
		t.Fatal(err)
	}
	old := b.Spec()
	if old.RowMetaLayout != "" {
		t.Fatalf("golden v1 spec's row_meta %q, want it left out", old.RowMetaLayout)
	}
	if info, err := b.Info(); err != nil || info.RowMetaBytes != 64 {
		t.Fatalf("golden v1 buffer: row_meta_bytes %d (err %v), want 64", info.RowMetaBytes, err)
	}
	for _, ask := range []RowMetaLayout{"", RowMetaPerRow, RowMetaRuns} {
		again := old.Clone()
		again.RowMetaLayout = ask
		got, created, err := s.CreateBuffer("golden", again)
		if ask == RowMetaRuns {
			if !errors.Is(err, ErrSpecConflict) {
				t.Errorf("golden asked with row_meta %q: %v, want ErrSpecConflict", ask, err)
			}
			continue
		}
		if err != nil || created || got != b {
			t.Errorf("golden asked with row_meta %q: created %v, err %v; want the existing buffer", ask, created, err)
		}
	}
}
