package storage

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseSpec checks that ParseSpec never panics, that every rejection is
// an ErrInvalidSpec, and that every accepted spec survives a trip through its
// canonical JSON unchanged — which is what lets a buffer's persisted spec be
// trusted when the buffer is reopened.
func FuzzParseSpec(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "spec", "*"))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, seed := range []string{
		``,
		`null`,
		`{}`,
		specCartPoleJSON,
		specDoc(specBaseFields, ""),
		specDoc(specBaseFields, `"storage": "memory", "priority": {"alpha": 0}`),
		specDoc(specBaseFields, `"storage": "memory", "row_meta": "runs"`),
		specDoc(specBaseFields, `"priority": {"eps": 1e-300}, "obs_keys": ["observation", "action"], "durability": "fsync"`),
		specDoc(`"pixels": {"dtype": "uint8", "shape": [3, 84, 84], "frame_stack": {"k": 4, "axis": 0}}, "next.done": {"dtype": "bool"}`,
			`"storage": "compressed", "compression": {"level": 3}`),
		`{"capacity": 1, "fields": {"next.done": {"dtype": "bool", "shape": null}}, "obs_keys": ["next.done"], "compact_obs": true}`,
		`{"capacity": 1, "fields": {"a": {"dtype": "int8"}, "a": {"dtype": "int8"}}}`,
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		s1, err := ParseSpec(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("rejection is not an ErrInvalidSpec: %v", err)
			}
			return
		}
		if err := s1.Validate(); err != nil {
			t.Fatalf("accepted spec fails Validate: %v", err)
		}
		b1, err := s1.MarshalJSON()
		if err != nil {
			t.Fatalf("MarshalJSON of an accepted spec: %v", err)
		}
		s2, err := ParseSpec(b1)
		if err != nil {
			t.Fatalf("canonical form %s is rejected: %v", b1, err)
		}
		if !s1.Equal(s2) || !s2.Equal(s1) {
			t.Fatalf("round trip changed the spec:\nbefore: %+v\nafter:  %+v", s1, s2)
		}
		b2, err := s2.MarshalJSON()
		if err != nil {
			t.Fatalf("second MarshalJSON: %v", err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("canonical form is not stable:\n%s\n%s", b1, b2)
		}
	})
}
