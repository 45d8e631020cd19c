package storage

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// bufferNameRule is the documented rule (docs/http-api.md) as a regular
// expression: validBufferName must agree with it on every string.
var bufferNameRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func ruleAccepts(name string) bool {
	return bufferNameRule.MatchString(name) && !strings.Contains(name, "..")
}

func TestValidateBufferName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"cartpole", true},
		{"a", true},
		{"A9_b-c.d", true},
		{"v1.2", true},
		{strings.Repeat("x", 64), true},
		{strings.Repeat("x", 65), false},
		{"", false},
		{".hidden", false},
		{"_x", false},
		{"-x", false},
		{"a..b", false},
		{"a.", true},
		{"a/b", false},
		{"a b", false},
		{"ü", false},
		{"a\x00", false},
	} {
		err := ValidateBufferName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateBufferName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateBufferName(%q): %v is not ErrInvalidName", tc.name, err)
		}
		if ruleAccepts(tc.name) != tc.ok {
			t.Errorf("the rule and the table disagree on %q", tc.name)
		}
	}
}

// FuzzValidBufferName checks the byte loop against the rule.
func FuzzValidBufferName(f *testing.F) {
	for _, s := range []string{"cartpole", "a..b", ".x", "a.b.c", strings.Repeat("y", 64), "x-_.", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := validBufferName(name), ruleAccepts(name); got != want {
			t.Fatalf("validBufferName(%q) = %v, the rule says %v", name, got, want)
		}
	})
}
