// Package tests holds tests that span the whole repository. TestDocs runs
// the commands and code blocks of README.md and docs/*.md, so the docs
// cannot drift from the code.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// How TestDocs runs a document:
//
//   - It starts `rbd serve --demo --data ./rbd-data` on a free port in a
//     scratch directory that links every top-level entry of the repository
//     (so `examples/learner.py` and `./rbd-data` both resolve), waits for
//     the demo buffer to fill, and gives the demo collector a balancing
//     policy so trajectories long enough for the slice examples exist.
//   - Every address 127.0.0.1:7450 / localhost:7450 in a block becomes the
//     server's.
//   - sh/bash blocks are split into commands (line continuations and
//     multi-line quotes joined). Each command is run with bash, by kind:
//     curl, rbd (also `./rbd`, `go run ./cmd/rbd`), python3 (Debian's, with
//     the checkout's rbd_client importable) and export are run; `rbd serve`
//     is stood in for by the test's server (its flags are checked with
//     --help); Go toolchain and pip commands are not run (the suite itself
//     and clients/python/pytest cover them). Scripts that take minutes get
//     flags that make them small (sizeFlags). A comment line `# {...}`
//     right after a command is its expected JSON answer: every key given
//     must match ("..." in a string matches anything).
//   - python blocks run as scripts; json blocks that are sample requests
//     are POSTed to the demo buffer and specs (with "fields") are PUT as a
//     new buffer; both must succeed.
//   - A block preceded by `<!-- not run: reason -->` is skipped, with its
//     reason logged. Untagged blocks are text (diagrams, layouts).
//
// A command the runner does not know is an error: teach it here or mark
// the block.

// systemPython is Debian's python3 (a pyenv python3 earlier on PATH has no
// numpy).
const systemPython = "/usr/bin/python3"

var root = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(wd)
}()

// sizeFlags are appended to commands that would run for minutes, so the
// docs test runs them at a small size (argparse: the last value wins).
var sizeFlags = map[string]string{
	"examples/learner.py":  "--steps 60 --after 0.2 --min-rows 1000 --log-every 20",
	"examples/actor.py":    "--steps 400",
	"bench/compare/run.py": "--seconds 0.2 --workloads cartpole --cartpole-capacity 4096",
}

// notRun are command prefixes that are never run here, with the reason.
var notRun = []struct{ prefix, why string }{
	{"go test", "Go tests and benchmarks: go test and CI run them"},
	{"go tool", "Go toolchain (profiles, benchstat)"},
	{"go build", "the test builds rbd itself"},
	{"go install", "the test builds rbd itself"},
	{"go vet", "CI runs it"},
	{"pip install", "clients/python/pytest TestPipInstall installs the package into a venv"},
	{"python3 -m pip install", "clients/python/pytest TestPipInstall installs the package into a venv"},
	{"python3 -m venv", "clients/python/pytest TestPipInstall installs the package into a venv"},
	{".venv/bin/pip install", "clients/python/pytest TestPipInstall installs the package into a venv"},
	{"go run ./bench", "benchmark programs: minutes long (bench/compare/run.py drives them)"},
	{"apt-get", "installs system packages"},
	{"sudo ", "needs root"},
}

// knownDrift lists expected outputs in docs owned by others that are known
// not to match, with the reason; they are logged instead of failing. An
// entry whose drift is gone is reported so it can be removed.
var knownDrift = map[string]string{}

type block struct {
	file   string
	line   int // of the opening fence
	lang   string
	text   string
	notRun string
}

var fence = regexp.MustCompile("^( *)(```+|~~~+)\\s*([A-Za-z0-9_+-]*)")
var notRunMark = regexp.MustCompile(`<!--\s*not run:\s*(.*?)\s*-->`)

func parseBlocks(file string, src []byte) []block {
	var out []block
	lines := strings.Split(string(src), "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, marker := m[1], m[2]
		b := block{file: file, line: i + 1, lang: strings.ToLower(m[3])}
		for j := i - 1; j >= 0 && j >= i-2; j-- {
			if mm := notRunMark.FindStringSubmatch(lines[j]); mm != nil {
				b.notRun = mm[1]
				break
			}
			if strings.TrimSpace(lines[j]) != "" {
				break
			}
		}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), marker); i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent)) // blocks inside list items
		}
		b.text = strings.Join(body, "\n")
		out = append(out, b)
	}
	return out
}

// command is one shell command of a block, with the JSON answers the doc
// shows for it.
type command struct {
	line       int
	text       string
	expect     []string // JSON objects the answer must match
	expectText []string // text the output must contain ("..." matches anything)
}

// splitCommands joins continued lines and multi-line quotes into commands.
func splitCommands(b block) []command {
	var out []command
	var cur strings.Builder
	start := 0
	var quote rune
	lines := strings.Split(b.text, "\n")
	for i, l := range lines {
		if cur.Len() == 0 {
			t := strings.TrimSpace(l)
			if t == "" {
				continue
			}
			if strings.HasPrefix(t, "#") {
				if txt, ok := strings.CutPrefix(t, "# > "); ok && len(out) > 0 {
					out[len(out)-1].expectText = append(out[len(out)-1].expectText, strings.TrimSpace(txt))
					continue
				}
				if js := strings.TrimSpace(strings.TrimPrefix(t, "#")); len(out) > 0 && strings.HasPrefix(js, "{") {
					if end := strings.LastIndex(js, "}"); end > 0 && json.Valid([]byte(js[:end+1])) {
						out[len(out)-1].expect = append(out[len(out)-1].expect, js[:end+1])
					}
				}
				continue
			}
			start = b.line + 1 + i
		} else {
			cur.WriteByte('\n')
		}
		cur.WriteString(l)
		escaped := false
	scan:
		for j, r := range l {
			switch {
			case escaped:
				escaped = false
			case quote == '\'':
				if r == '\'' {
					quote = 0
				}
			case quote == '"':
				if r == '\\' {
					escaped = true
				} else if r == '"' {
					quote = 0
				}
			case r == '\\':
				escaped = true
			case r == '\'' || r == '"':
				quote = r
			case r == '#' && (j == 0 || l[j-1] == ' ' || l[j-1] == '\t'):
				break scan // a comment: the rest of the line is not shell
			}
		}
		if quote != 0 || strings.HasSuffix(strings.TrimRight(l, " "), "\\") {
			continue
		}
		out = append(out, command{line: start, text: cur.String()})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, command{line: start, text: cur.String()})
	}
	return out
}

// env is one document's scratch directory and server.
type env struct {
	t       *testing.T
	dir     string
	bin     string
	addr    string
	vars    []string
	python  bool
	haveCur bool
}

func (e *env) subst(s string) string {
	s = strings.ReplaceAll(s, "127.0.0.1:7450", e.addr)
	return strings.ReplaceAll(s, "localhost:7450", e.addr)
}

func (e *env) run(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "PATH="+e.bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PYTHONPATH="+filepath.Join(root, "clients", "python"), "PYTHONDONTWRITEBYTECODE=1",
		"RBD_URL=http://"+e.addr)
	cmd.Env = append(cmd.Env, e.vars...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.Bytes(), err
}

var words = regexp.MustCompile(`^\s*(\S+)(?:\s+(\S+))?`)

func (e *env) shell(b block, c command) {
	t := e.t
	where := fmt.Sprintf("%s:%d", b.file, c.line)
	text := strings.TrimSpace(c.text)
	for _, n := range notRun {
		if strings.HasPrefix(text, n.prefix) {
			t.Logf("%s: not run (%s): %s", where, n.why, firstLine(text))
			return
		}
	}
	// Normalise the ways docs name the binary.
	for _, p := range []string{"go run ./cmd/rbd", "./rbd "} {
		if strings.HasPrefix(text, p) {
			text = "rbd " + strings.TrimPrefix(strings.TrimPrefix(text, p), " ")
		}
	}
	m := words.FindStringSubmatch(text)
	switch {
	case m[1] == "export":
		// Let bash expand the value ($PWD is the scratch directory).
		name, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(stripComment(text), "export")), "=")
		out, _, err := e.run(context.Background(), "bash", "-c", e.subst(stripComment(text))+`; printf %s "$`+name+`"`)
		if err != nil {
			t.Errorf("%s: %s: %v", where, text, err)
		}
		e.vars = append(e.vars, name+"="+string(out))
		return
	case m[1] == "rbd" && m[2] == "serve" && !strings.ContainsAny(stripComment(text), "|;"):
		text = strings.TrimSuffix(strings.TrimSpace(stripComment(text)), "&")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, stderr, err := e.run(ctx, "bash", "-c", text+" --help"); err != nil {
			t.Errorf("%s: %s: its flags do not parse: %v\n%s", where, firstLine(text), err, stderr)
		} else {
			t.Logf("%s: the test's server stands for: %s", where, firstLine(text))
		}
		return
	case m[1] == "curl" || m[1] == "rbd":
	case m[1] == "python3" || m[1] == "python":
		if !e.python {
			t.Logf("%s: skipped (no numpy for %s): %s", where, systemPython, firstLine(text))
			return
		}
		for script, flags := range sizeFlags {
			if strings.Contains(text, script) {
				text += " " + flags
			}
		}
	default:
		t.Errorf("%s: the docs test does not know how to run %q: teach tests/docs_test.go, or mark the block <!-- not run: reason -->", where, m[1])
		return
	}
	if m[1] == "curl" && !e.haveCur {
		t.Logf("%s: skipped (no curl): %s", where, firstLine(text))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	stdout, stderr, err := e.run(ctx, "bash", "-c", e.subst(text))
	t.Logf("%s: ran in %.2fs: %s", where, time.Since(start).Seconds(), firstLine(text))
	if err != nil {
		t.Errorf("%s: %s\nfailed: %v\nstdout:\n%s\nstderr:\n%s", where, e.subst(text), err, clip(stdout), clip(stderr))
		return
	}
	for _, want := range c.expectText {
		out := string(stdout) + string(stderr)
		re := regexp.MustCompile(strings.ReplaceAll(regexp.QuoteMeta(want), regexp.QuoteMeta("..."), ".*"))
		if !re.MatchString(out) {
			t.Errorf("%s: the doc shows %q after\n%s\nbut the output is:\n%s", where, want, e.subst(text), clip([]byte(out)))
		}
	}
	for _, want := range c.expect {
		if problem := matchJSON(want, stdout); problem != "" {
			key := b.file + ": " + want
			if why, ok := knownDrift[key]; ok {
				t.Logf("%s: known drift in the doc (%s): %s", where, why, problem)
				continue
			}
			t.Errorf("%s: the doc shows %s after\n%s\nbut the answer differs: %s", where, want, e.subst(text), problem)
		} else if _, ok := knownDrift[b.file+": "+want]; ok {
			t.Logf("%s: knownDrift entry for %s is no longer needed: remove it from tests/docs_test.go", where, want)
		}
	}
}

// matchJSON checks that the last JSON object of got has every key of want
// with an equal value ("..." inside a wanted string matches anything).
func matchJSON(want string, got []byte) string {
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		return "expected output is not a JSON object: " + err.Error()
	}
	var g map[string]any
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if json.Unmarshal([]byte(lines[i]), &g) == nil {
			break
		}
	}
	if g == nil {
		return fmt.Sprintf("the output has no JSON object: %s", clip(got))
	}
	for k, wv := range w {
		gv, ok := g[k]
		if !ok {
			return fmt.Sprintf("no key %q in %s", k, clip(got))
		}
		if ws, ok := wv.(string); ok && strings.Contains(ws, "...") {
			gs, _ := gv.(string)
			re := "^" + strings.ReplaceAll(regexp.QuoteMeta(ws), regexp.QuoteMeta("..."), ".*") + "$"
			if !regexp.MustCompile(re).MatchString(gs) {
				return fmt.Sprintf("%q is %q, want %q", k, gs, ws)
			}
			continue
		}
		if fmt.Sprint(gv) != fmt.Sprint(wv) {
			return fmt.Sprintf("%q is %v, want %v", k, gv, wv)
		}
	}
	return ""
}

func (e *env) python3(b block) {
	where := fmt.Sprintf("%s:%d", b.file, b.line)
	if !e.python {
		e.t.Logf("%s: python block skipped (no numpy for %s)", where, systemPython)
		return
	}
	script := filepath.Join(e.t.TempDir(), "block.py")
	if err := os.WriteFile(script, []byte(e.subst(b.text)), 0o644); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	stdout, stderr, err := e.run(ctx, systemPython, script)
	e.t.Logf("%s: python block ran in %.2fs:\n%s", where, time.Since(start).Seconds(), clip(stdout))
	if err != nil {
		e.t.Errorf("%s: python block failed: %v\n%s\n%s", where, err, clip(stdout), clip(stderr))
	}
}

func (e *env) jsonBlock(b block, n int) {
	where := fmt.Sprintf("%s:%d", b.file, b.line)
	var obj map[string]any
	if err := json.Unmarshal([]byte(b.text), &obj); err != nil {
		e.t.Errorf("%s: json block does not parse: %v", where, err)
		return
	}
	var method, path string
	switch {
	case obj["sampler"] != nil || obj["batch_size"] != nil:
		method, path = http.MethodPost, "/v1/buffers/demo/sample"
	case obj["fields"] != nil:
		method, path = http.MethodPut, fmt.Sprintf("/v1/buffers/docs-spec-%d", n)
	default:
		e.t.Logf("%s: json block parsed (not a request)", where)
		return
	}
	req, _ := http.NewRequest(method, "http://"+e.addr+path, strings.NewReader(b.text))
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Errorf("%s: %v", where, err)
		return
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	if resp.StatusCode/100 != 2 {
		e.t.Errorf("%s: %s %s with the block's body: %s\n%s", where, method, path, resp.Status, clip(body.Bytes()))
		return
	}
	e.t.Logf("%s: %s %s: %s", where, method, path, resp.Status)
}

// stripComment drops a trailing shell comment (outside quotes) from each
// line of s.
func stripComment(s string) string {
	lines := strings.Split(s, "\n")
	var quote rune
	for i, l := range lines {
		escaped := false
	scan:
		for j, r := range l {
			switch {
			case escaped:
				escaped = false
			case quote != 0:
				if r == '\\' && quote == '"' {
					escaped = true
				} else if r == quote {
					quote = 0
				}
			case r == '\\':
				escaped = true
			case r == '\'' || r == '"':
				quote = r
			case r == '#' && (j == 0 || l[j-1] == ' ' || l[j-1] == '\t'):
				lines[i] = l[:j]
				break scan
			}
		}
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func clip(b []byte) string {
	if len(b) > 3000 {
		return string(b[:1500]) + "\n...\n" + string(b[len(b)-1500:])
	}
	return string(b)
}

// startServer builds the scratch directory and starts the doc's server.
func startServer(t *testing.T, bin string) *env {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if n := en.Name(); !strings.HasPrefix(n, ".") && n != "rbd-data" {
			if err := os.Symlink(filepath.Join(root, n), filepath.Join(dir, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	e := &env{t: t, dir: dir, bin: bin}
	_, err = exec.LookPath("curl")
	e.haveCur = err == nil
	e.python = exec.Command(systemPython, "-c", "import numpy").Run() == nil
	addrFile := filepath.Join(t.TempDir(), "addr")
	logFile, err := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "rbd"), "serve", "--demo", "--demo-rate", "20000", "--data", "./rbd-data",
		"--addr", "127.0.0.1:0", "--addr-file", addrFile)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("rbd serve: %v\n%s", err, readFile(logFile.Name()))
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("rbd serve did not stop in 30s\n%s", readFile(logFile.Name()))
		}
		logFile.Close()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			e.addr = strings.TrimSpace(string(b))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rbd serve did not start:\n%s", readFile(logFile.Name()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.prepareDemo()
	return e
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return clip(b)
}

// prepareDemo waits for demo rows and gives the collector a policy that
// balances the pole (push towards where it falls), so trajectories of 32
// steps and more exist for the slice examples.
func (e *env) prepareDemo() {
	t := e.t
	w := []float32{0, 0, 0, 0, 0, 0, 0, 0} // [4,2] row-major: Q(o,1) - Q(o,0) = theta + 0.5 theta_dot
	w[2*2+1], w[3*2+1] = 1, 0.5
	body := safetensorsF32(map[string][]int{"w": {4, 2}, "b": {2}}, map[string][]float32{"w": w, "b": {0, 0}})
	req, _ := http.NewRequest(http.MethodPut, "http://"+e.addr+"/v1/collectors/demo/weights", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT demo weights: %s", resp.Status)
	}
	probe := `{"sampler": "slice", "num_slices": 1, "slice_len": 32, "timeout_ms": 20000}`
	resp, err = http.Post("http://"+e.addr+"/v1/buffers/demo/sample", "application/json", strings.NewReader(probe))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("demo buffer has no 32-step trajectory after 20s: %s", resp.Status)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + e.addr + "/v1/buffers/demo")
		if err != nil {
			t.Fatal(err)
		}
		var info struct{ Size int64 }
		json.NewDecoder(resp.Body).Decode(&info)
		resp.Body.Close()
		if info.Size >= 2000 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo buffer has %d rows after 20s", info.Size)
		}
	}
}

// safetensorsF32 encodes float32 tensors (in name order).
func safetensorsF32(shapes map[string][]int, vals map[string][]float32) []byte {
	names := make([]string, 0, len(vals))
	for n := range vals {
		names = append(names, n)
	}
	slices.Sort(names)
	var hdr bytes.Buffer
	var data bytes.Buffer
	hdr.WriteString("{")
	for i, n := range names {
		if i > 0 {
			hdr.WriteString(",")
		}
		shape, _ := json.Marshal(shapes[n])
		fmt.Fprintf(&hdr, `%q:{"dtype":"F32","shape":%s,"data_offsets":[%d,%d]}`, n, shape, data.Len(), data.Len()+4*len(vals[n]))
		for _, v := range vals[n] {
			var b [4]byte
			bits := math.Float32bits(v)
			b[0], b[1], b[2], b[3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
			data.Write(b[:])
		}
	}
	hdr.WriteString("}")
	for (8+hdr.Len())%8 != 0 {
		hdr.WriteByte(' ')
	}
	out := make([]byte, 8, 8+hdr.Len()+data.Len())
	n := uint64(hdr.Len())
	for i := range 8 {
		out[i] = byte(n >> (8 * i))
	}
	return append(append(out, hdr.Bytes()...), data.Bytes()...)
}

func docFiles(t *testing.T) []string {
	files := []string{"README.md", "clients/python/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func buildRbd(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "rbd"), "./cmd/rbd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rbd: %v\n%s", err, out)
	}
	if _, err := os.Stat(systemPython); err == nil {
		os.Symlink(systemPython, filepath.Join(dir, "python3"))
		os.Symlink(systemPython, filepath.Join(dir, "python"))
	}
	return dir
}

// watchInputs stats the repository's files so go test's cache reruns
// TestDocs when a doc, an example or the code changes.
func watchInputs(t *testing.T) {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "__pycache__" || n == "rbd-data") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".py", ".md", ".toml", ".mod", ".sum", ".json", ".safetensors":
			_, err := os.Stat(p)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the docs run in -short mode")
	}
	watchInputs(t)
	bin := buildRbd(t)
	for _, file := range docFiles(t) {
		t.Run(strings.TrimSuffix(file, ".md"), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(root, file))
			if err != nil {
				t.Fatal(err)
			}
			blocks := parseBlocks(file, src)
			runnable := slices.ContainsFunc(blocks, func(b block) bool {
				return b.notRun == "" && slices.Contains([]string{"sh", "bash", "shell", "console", "python", "py", "json"}, b.lang)
			})
			if !runnable {
				t.Logf("%s: nothing to run", file)
				return
			}
			e := startServer(t, bin)
			for n, b := range blocks {
				if b.notRun != "" {
					t.Logf("%s:%d: not run: %s", b.file, b.line, b.notRun)
					continue
				}
				switch b.lang {
				case "sh", "bash", "shell", "console":
					for _, c := range splitCommands(b) {
						e.shell(b, c)
					}
				case "python", "py":
					e.python3(b)
				case "json":
					e.jsonBlock(b, n)
				case "":
					// text: diagrams, layouts, outputs
				default:
					t.Logf("%s:%d: %s block not run (no runner for %s)", b.file, b.line, b.lang, b.lang)
				}
			}
		})
	}
}

// TestSplitCommands pins the shell splitting the docs runner relies on.
func TestSplitCommands(t *testing.T) {
	b := block{file: "x.md", line: 10, text: strings.Join([]string{
		"curl -s -X PUT localhost:7450/v1/buffers/x -d '{",
		`  "capacity": 10}'   # a comment`,
		"# {\"rows\": 2}",
		"# > some text",
		"rbd dump ./rbd-data \\",
		"    --json",
		"",
		"# a plain comment",
		`echo "it's" # quote inside double quotes`,
	}, "\n")}
	got := splitCommands(b)
	if len(got) != 3 {
		t.Fatalf("got %d commands: %+v", len(got), got)
	}
	if got[0].line != 11 || !strings.Contains(got[0].text, `"capacity": 10}'`) || len(got[0].expect) != 1 || got[0].expectText[0] != "some text" {
		t.Errorf("first command: %+v", got[0])
	}
	if !strings.HasSuffix(got[1].text, "--json") || got[1].line != 15 {
		t.Errorf("second command: %+v", got[1])
	}
	if s := stripComment("rbd serve --demo   # a '#' comment\necho '# kept' \"#kept\" # gone"); s != "rbd serve --demo   \necho '# kept' \"#kept\" " {
		t.Errorf("stripComment: %q", s)
	}
	if p := matchJSON(`{"error": "buffer ...: not found", "n": 2}`, []byte("x\n{\"error\":\"buffer \\\"a\\\": not found\",\"n\":2}\n")); p != "" {
		t.Error(p)
	}
	if p := matchJSON(`{"n": 3}`, []byte(`{"n":2}`)); p == "" {
		t.Error("a different value matched")
	}
}
