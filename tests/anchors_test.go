package tests

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinksReachTheirAnchors checks every relative Markdown link with a
// fragment (file.md#section, or #section in the same file) in README.md,
// docs/ and bench/compare/RESULTS.md against the anchors the target file
// has: its headings as GitHub slugs them, and explicit <a id="...">. A
// heading renamed (dates in headings change often) leaves links that open
// the page at its top; three such links were found by hand on 2026-11-27.
func TestDocLinksReachTheirAnchors(t *testing.T) {
	files := []string{"README.md", "bench/compare/RESULTS.md"}
	for _, pattern := range []string{"docs/*.md", "docs/proposals/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, rel)
		}
	}
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		a, err := docAnchors(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		anchors[filepath.Clean(f)] = a
	}
	link := regexp.MustCompile(`\]\(([^)#\s]*)#([^)\s]+)\)`)
	checked := 0
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(text), -1) {
			target := filepath.Clean(f)
			if m[1] != "" {
				if strings.Contains(m[1], "://") {
					continue
				}
				target = filepath.Clean(filepath.Join(filepath.Dir(f), m[1]))
			}
			a, ok := anchors[target]
			if !ok {
				continue // not a Markdown file of ours (source files, line anchors)
			}
			checked++
			if !a[m[2]] {
				t.Errorf("%s: link to %s#%s: no such heading or anchor", f, target, m[2])
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d links with anchors checked: the pattern no longer finds them", checked)
	}
}

// docAnchors returns the anchors of a Markdown file: each heading's GitHub
// slug (lower case; letters, digits, '-', '_' and spaces kept, spaces
// turned into '-') and explicit <a id="..."> anchors. Headings inside
// code fences are not headings.
func docAnchors(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	id := regexp.MustCompile(`<a id="([^"]+)"`)
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		for _, m := range id.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		out[b.String()] = true
	}
	return out, sc.Err()
}
