package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/rbdb/rbd/codec"
)

// TestMain lets testscript run real processes: scripts call `exec rbd`
// (the real main, signal handling included, so `kill -INT` tests a clean
// shutdown) and `exec rbdload` (the load generator below), and get this
// test binary re-executed under that name.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"rbd":     main,
		"rbdload": loadMain,
	})
}

// TestScripts runs testdata/script/*.txtar. Besides testscript's builtins
// they may use the commands of scriptCmds (see each one's comment).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Cmds:                scriptCmds,
		Setup: func(e *testscript.Env) error {
			e.Values[envKey{}] = slices.Clone(e.Vars)
			return nil
		},
	})
}

// envKey keys the script's initial environment in its Values, for run.
type envKey struct{}

// timeScale stretches the time bounds of run, waitfile and poll: processes
// built with the race detector run several times slower, so bounds meant
// to catch a hang, not to measure speed, are tripled for them.
// $RBD_TEST_TIMESCALE overrides it.
var timeScale = func() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("RBD_TEST_TIMESCALE"), 64); err == nil && v > 0 {
		return v
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				return 3
			}
		}
	}
	return 1
}()

func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * timeScale) }

var scriptCmds = map[string]func(ts *testscript.TestScript, neg bool, args []string){
	"waitfile":   cmdWaitFile,
	"touch":      cmdTouch,
	"http":       cmdHTTP,
	"poll":       cmdPoll,
	"json":       cmdJSON,
	"run":        cmdRun,
	"mkweights":  cmdMkWeights,
	"flipbyte":   cmdFlipByte,
	"seqpattern": cmdSeqPattern,
	"checkacks":  cmdCheckAcks,
	"seturl":     cmdSetURL,
}

// seturl VAR [FILE]
// sets the script variable VAR to the base URL (http://host:port) of the
// server whose address is in FILE (default "addr"), for commands that take
// --url.
func cmdSetURL(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: seturl VAR [FILE]")
	}
	file := "addr"
	if len(args) == 2 {
		file = args[1]
	}
	u, err := baseURL(ts.MkAbs(file))
	ts.Check(err)
	ts.Setenv(args[0], u)
}

// newFlags returns a quiet flag set for a script command; parseFlags
// turns its errors into script failures.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parseFlags(ts *testscript.TestScript, fs *flag.FlagSet, args []string, usage string) []string {
	if err := fs.Parse(args); err != nil {
		ts.Fatalf("usage: %s %s (%v)", fs.Name(), usage, err)
	}
	return fs.Args()
}

// waitfile [-timeout D] [-lines N] [-match REGEXP] FILE
// waits until FILE exists and holds at least N complete lines (default 1),
// counting only lines that match REGEXP if given.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "[-timeout D] [-lines N] [-match REGEXP] FILE"
	fs := newFlags("waitfile")
	timeout := fs.Duration("timeout", 30*time.Second, "")
	lines := fs.Int("lines", 1, "")
	match := fs.String("match", "", "")
	args = parseFlags(ts, fs, args, usage)
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile %s", usage)
	}
	re, err := regexp.Compile(*match)
	ts.Check(err)
	count := func(data []byte) int {
		n := 0
		for len(data) > 0 {
			line, rest, ok := bytes.Cut(data, []byte("\n"))
			if !ok {
				break // not complete yet
			}
			if re.Match(line) {
				n++
			}
			data = rest
		}
		return n
	}
	file := ts.MkAbs(args[0])
	start := time.Now()
	for {
		data, err := os.ReadFile(file)
		if n := count(data); err == nil && n >= *lines {
			ts.Logf("%s has %d lines after %v", args[0], n, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > scaled(*timeout) {
			ts.Fatalf("%s: not %d lines after %v (err %v, %d matching lines)", args[0], *lines, scaled(*timeout), err, count(data))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// touch FILE creates FILE (or updates its time).
func cmdTouch(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: touch FILE")
	}
	f, err := os.OpenFile(ts.MkAbs(args[0]), os.O_CREATE|os.O_WRONLY, 0o644)
	ts.Check(err)
	ts.Check(f.Close())
	now := time.Now()
	ts.Check(os.Chtimes(ts.MkAbs(args[0]), now, now))
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

// baseURL reads the host:port a server wrote with --addr-file. An
// unspecified host (0.0.0.0, ::) is dialled on loopback.
func baseURL(addrFile string) (string, error) {
	data, err := os.ReadFile(addrFile)
	if err != nil {
		return "", err
	}
	host, port, err := net.SplitHostPort(strings.TrimSpace(string(data)))
	if err != nil {
		return "", fmt.Errorf("%s: %w", addrFile, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

type httpResult struct {
	status int
	ctype  string
	header http.Header
	body   []byte
}

func doHTTP(method, url, token, ctype, accept string, body []byte) (*httpResult, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			err = fmt.Errorf("%w (is the server still running? `wait` for it to see its output)", err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	return &httpResult{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), header: resp.Header, body: data}, nil
}

// http [-addr FILE] [-token T] [-json] [-ctype TYPE] [-status N] [-o FILE] METHOD PATH [BODY | @FILE]
// sends a request to the server whose address is in FILE (default
// "addr"); the answer's body goes to stdout (or to the -o file), its
// status ("status 200") and headers to stderr. Without -status the answer must be 2xx. Every 4xx and
// 5xx answer must be a JSON object with a non-empty "error". -json sends
// "Accept: application/json". A body is sent as JSON unless -ctype says
// otherwise.
func cmdHTTP(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "[-addr FILE] [-token T] [-json] [-ctype TYPE] [-status N] [-o FILE] METHOD PATH [BODY | @FILE]"
	fs := newFlags("http")
	addrFile := fs.String("addr", "addr", "")
	token := fs.String("token", "", "")
	acceptJSON := fs.Bool("json", false, "")
	ctype := fs.String("ctype", "application/json", "")
	wantStatus := fs.Int("status", 0, "")
	outFile := fs.String("o", "", "")
	args = parseFlags(ts, fs, args, usage)
	if neg || len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: http %s", usage)
	}
	base, err := baseURL(ts.MkAbs(*addrFile))
	ts.Check(err)
	var body []byte
	if len(args) == 3 {
		if f, ok := strings.CutPrefix(args[2], "@"); ok {
			body = []byte(ts.ReadFile(f))
		} else {
			body = []byte(args[2])
		}
	}
	accept := ""
	if *acceptJSON {
		accept = "application/json"
	}
	res, err := doHTTP(args[0], base+args[1], *token, *ctype, accept, body)
	if err != nil {
		ts.Fatalf("%s %s: %v", args[0], args[1], err)
	}
	if *outFile != "" {
		ts.Check(os.WriteFile(ts.MkAbs(*outFile), res.body, 0o644))
	} else {
		ts.Stdout().Write(res.body)
	}
	fmt.Fprintf(ts.Stderr(), "status %d\n", res.status)
	res.header.Del("Date")
	res.header.Write(ts.Stderr())
	if res.status >= 400 {
		var e struct {
			Error *string `json:"error"`
		}
		if !strings.HasPrefix(res.ctype, "application/json") || json.Unmarshal(res.body, &e) != nil || e.Error == nil || *e.Error == "" {
			ts.Fatalf("%s %s: status %d answer is not a JSON error (Content-Type %q): %q", args[0], args[1], res.status, res.ctype, res.body)
		}
	}
	switch {
	case *wantStatus != 0 && res.status != *wantStatus:
		ts.Fatalf("%s %s: status %d, want %d: %s", args[0], args[1], res.status, *wantStatus, res.body)
	case *wantStatus == 0 && (res.status < 200 || res.status > 299):
		ts.Fatalf("%s %s: status %d, want 2xx: %s", args[0], args[1], res.status, res.body)
	}
}

// poll [-addr FILE] [-token T] [-timeout D] PATH JSONPATH OP VALUE
// GETs PATH until the JSON answer's value at JSONPATH satisfies OP VALUE
// (see json).
func cmdPoll(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "[-addr FILE] [-token T] [-timeout D] PATH JSONPATH OP VALUE"
	fs := newFlags("poll")
	addrFile := fs.String("addr", "addr", "")
	token := fs.String("token", "", "")
	timeout := fs.Duration("timeout", 30*time.Second, "")
	args = parseFlags(ts, fs, args, usage)
	if neg || len(args) != 4 {
		ts.Fatalf("usage: poll %s", usage)
	}
	base, err := baseURL(ts.MkAbs(*addrFile))
	ts.Check(err)
	start := time.Now()
	var last string
	for {
		res, err := doHTTP("GET", base+args[0], *token, "", "", nil)
		if err == nil && res.status == 200 {
			v, err := jsonAt(res.body, args[1])
			if err == nil {
				ok, err := compare(v, args[2], args[3])
				if err != nil {
					ts.Fatalf("%v", err)
				}
				if ok {
					ts.Logf("%s %s = %s after %v", args[0], args[1], render(v), time.Since(start).Round(time.Millisecond))
					return
				}
				last = render(v)
			} else {
				last = err.Error()
			}
		} else if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("status %d: %s", res.status, res.body)
		}
		if time.Since(start) > scaled(*timeout) {
			ts.Fatalf("poll %s: %s %s %s not reached after %v; last: %s", args[0], args[1], args[2], args[3], scaled(*timeout), last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// jsonAt returns the value at a "/"-separated path: object keys (which
// may contain dots, as in next.observation), array indices (negative ones
// count from the end) and "@len" for the length of an array or object. The
// empty path is the whole document.
func jsonAt(doc []byte, path string) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	if path == "" || path == "/" {
		return v, nil
	}
	for _, p := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		switch x := v.(type) {
		case map[string]any:
			if p == "@len" {
				v = json.Number(strconv.Itoa(len(x)))
				continue
			}
			e, ok := x[p]
			if !ok {
				return nil, fmt.Errorf("%s: no key %q", path, p)
			}
			v = e
		case []any:
			if p == "@len" {
				v = json.Number(strconv.Itoa(len(x)))
				continue
			}
			i, err := strconv.Atoi(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is not an index of an array", path, p)
			}
			if i < 0 {
				i += len(x)
			}
			if i < 0 || i >= len(x) {
				return nil, fmt.Errorf("%s: index %s out of range (%d elements)", path, p, len(x))
			}
			v = x[i]
		default:
			return nil, fmt.Errorf("%s: %q: not an object or array", path, p)
		}
	}
	return v, nil
}

// render prints a JSON value: strings bare, everything else as JSON.
func render(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func compare(v any, op, want string) (bool, error) {
	got := render(v)
	gf, gerr := strconv.ParseFloat(got, 64)
	wf, werr := strconv.ParseFloat(want, 64)
	numeric := gerr == nil && werr == nil
	if _, isStr := v.(string); isStr {
		numeric = false
	}
	switch op {
	case "==":
		if numeric {
			return gf == wf, nil
		}
		return got == want, nil
	case "!=":
		if numeric {
			return gf != wf, nil
		}
		return got != want, nil
	case "<", "<=", ">", ">=":
		if !numeric {
			return false, fmt.Errorf("%s %s %s: not numbers", got, op, want)
		}
		switch op {
		case "<":
			return gf < wf, nil
		case "<=":
			return gf <= wf, nil
		case ">":
			return gf > wf, nil
		}
		return gf >= wf, nil
	}
	return false, fmt.Errorf("unknown operator %q (want == != < <= > >=)", op)
}

// json [-set VAR] FILE JSONPATH [OP VALUE]
// checks a JSON document (FILE may be stdout or stderr): the value at
// JSONPATH exists (! json: does not), or satisfies OP VALUE (! json: does
// not). -set VAR stores the value in $VAR. Paths are "/"-separated (see
// jsonAt); OP is one of == != < <= > >=, numeric when both sides are
// numbers.
func cmdJSON(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "[-set VAR] FILE JSONPATH [OP VALUE]"
	fs := newFlags("json")
	set := fs.String("set", "", "")
	args = parseFlags(ts, fs, args, usage)
	if len(args) != 2 && len(args) != 4 {
		ts.Fatalf("usage: json %s", usage)
	}
	v, err := jsonAt([]byte(ts.ReadFile(args[0])), args[1])
	if len(args) == 2 {
		switch {
		case err != nil && !neg:
			ts.Fatalf("%v", err)
		case err == nil && neg:
			ts.Fatalf("%s: present (%s), want absent", args[1], render(v))
		}
	} else {
		if err != nil {
			ts.Fatalf("%v", err)
		}
		ok, err := compare(v, args[2], args[3])
		if err != nil {
			ts.Fatalf("%v", err)
		}
		if ok == neg {
			ts.Fatalf("%s = %s; want %s%s %s", args[1], render(v), map[bool]string{true: "not ", false: ""}[neg], args[2], args[3])
		}
	}
	if err == nil {
		ts.Logf("%s = %.200s", args[1], render(v))
		if *set != "" {
			ts.Setenv(*set, render(v))
		}
	}
}

// run [-max D] [-n N] [-code C] [-interrupt-on REGEXP] PROG [ARGS...]
// runs PROG (found in the script's PATH) N times (default 1) in the
// script's directory and environment. Every run must end within D
// (default 10s, times timeScale; 5s later it gets SIGQUIT, which makes a
// Go program print its goroutines) and exit with code C (default 0; with
// `!`, any non-zero code). stdout and stderr are those of the last run.
// With -interrupt-on, each run gets SIGINT as soon as a line of its stderr
// matches REGEXP (an event, not a fixed time: a slow start under -race or
// a busy machine only delays it); a run that exits without such a line
// fails.
func cmdRun(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "[-max D] [-n N] [-code C] [-interrupt-on REGEXP] PROG [ARGS...]"
	fs := newFlags("run")
	maxDur := fs.Duration("max", 10*time.Second, "")
	n := fs.Int("n", 1, "")
	code := fs.Int("code", -1, "")
	interruptOn := fs.String("interrupt-on", "", "")
	args = parseFlags(ts, fs, args, usage)
	var interruptRE *regexp.Regexp
	if *interruptOn != "" {
		re, err := regexp.Compile(*interruptOn)
		if err != nil {
			ts.Fatalf("run: -interrupt-on: %v", err)
		}
		interruptRE = re
	}
	if len(args) < 1 || (neg && *code >= 0) {
		ts.Fatalf("usage: [!] run %s (! and -code exclude each other)", usage)
	}
	*maxDur = scaled(*maxDur)
	prog := lookPath(ts, args[0])
	var env []string
	vars, _ := ts.Value(envKey{}).([]string)
	seen := map[string]bool{}
	for _, kv := range append(vars, "RBD_TOKEN=") {
		k, _, _ := strings.Cut(kv, "=")
		if !seen[k] {
			seen[k] = true
			env = append(env, k+"="+ts.Getenv(k))
		}
	}
	var lastOut, lastErr []byte
	for i := range *n {
		ctx, cancel := context.WithTimeout(context.Background(), *maxDur+5*time.Second)
		cmd := exec.CommandContext(ctx, prog, args[1:]...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
		cmd.WaitDelay = 5 * time.Second
		cmd.Dir = ts.MkAbs(".")
		cmd.Env = env
		var stdout bytes.Buffer
		stderr := &lineWatcher{re: interruptRE}
		cmd.Stdout, cmd.Stderr = &stdout, stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			cancel()
			ts.Fatalf("start %s: %v", args[0], err)
		}
		if interruptRE != nil {
			go func() {
				select {
				case <-stderr.matched():
					cmd.Process.Signal(os.Interrupt)
				case <-ctx.Done():
				}
			}()
		}
		err := cmd.Wait()
		took := time.Since(start)
		cancel()
		lastOut, lastErr = stdout.Bytes(), stderr.bytes()
		if interruptRE != nil && !stderr.sawMatch() {
			ts.Fatalf("%s exited (%s) before a line of its stderr matched %q\nstdout:\n%s\nstderr:\n%s", args[0], exitDesc(err), *interruptOn, lastOut, lastErr)
		}
		ts.Logf("run %d/%d: %s %s: %s in %v (bound %v)", i+1, *n, args[0], strings.Join(args[1:], " "), exitDesc(err), took.Round(time.Millisecond), *maxDur)
		got := 0
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee) && ee.Exited():
			got = ee.ExitCode()
		default:
			ts.Fatalf("%s did not exit normally: %v\nstdout:\n%s\nstderr:\n%s", args[0], err, lastOut, lastErr)
		}
		switch {
		case took > *maxDur:
			ts.Fatalf("%s took %v, more than %v\nstdout:\n%s\nstderr:\n%s", args[0], took.Round(time.Millisecond), *maxDur, lastOut, lastErr)
		case neg && got == 0:
			ts.Fatalf("%s succeeded, want a failure\nstdout:\n%s\nstderr:\n%s", args[0], lastOut, lastErr)
		case !neg && *code < 0 && got != 0:
			ts.Fatalf("%s exited %d, want 0\nstdout:\n%s\nstderr:\n%s", args[0], got, lastOut, lastErr)
		case *code >= 0 && got != *code:
			ts.Fatalf("%s exited %d, want %d\nstdout:\n%s\nstderr:\n%s", args[0], got, *code, lastOut, lastErr)
		}
	}
	ts.Stdout().Write(lastOut)
	ts.Stderr().Write(lastErr)
}

// lineWatcher collects a process's output and closes a channel when a
// complete line first matches re (nil: never).
type lineWatcher struct {
	re   *regexp.Regexp
	mu   sync.Mutex
	buf  bytes.Buffer
	scan int // start of the first line not yet matched
	hit  chan struct{}
	done bool
}

func (w *lineWatcher) matched() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hit == nil {
		w.hit = make(chan struct{})
	}
	return w.hit
}

func (w *lineWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for w.re != nil && !w.done {
		rest := w.buf.Bytes()[w.scan:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		w.scan += i + 1
		if w.re.Match(rest[:i]) {
			w.done = true
			if w.hit == nil {
				w.hit = make(chan struct{})
			}
			close(w.hit)
		}
	}
	return len(p), nil
}

func (w *lineWatcher) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Bytes()
}

func (w *lineWatcher) sawMatch() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}

func exitDesc(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

func lookPath(ts *testscript.TestScript, prog string) string {
	if strings.Contains(prog, "/") {
		return ts.MkAbs(prog)
	}
	for _, dir := range filepath.SplitList(ts.Getenv("PATH")) {
		p := filepath.Join(dir, prog)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	ts.Fatalf("%s: not found in PATH", prog)
	return ""
}

// mkweights FILE WSHAPE BSHAPE
// writes a safetensors file with float32 tensors w and b of the given
// shapes (comma-separated, e.g. 4,2 and 2).
func cmdMkWeights(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: mkweights FILE NAME=SHAPE[@VALUE]... (e.g. w=4,2 b=2 epsilon=1@0.2)")
	}
	var tensors []codec.Tensor
	for _, arg := range args[1:] {
		name, rest, ok := strings.Cut(arg, "=")
		if !ok {
			ts.Fatalf("mkweights: %q is not NAME=SHAPE", arg)
		}
		dims, fill, constant := strings.Cut(rest, "@")
		var shape []int
		n := 1
		for _, d := range strings.Split(dims, ",") {
			v, err := strconv.Atoi(d)
			ts.Check(err)
			shape = append(shape, v)
			n *= v
		}
		c, err := strconv.ParseFloat(fill, 32)
		if constant {
			ts.Check(err)
		}
		data := make([]byte, 0, 4*n)
		for k := range n {
			v := 0.25*float32(k) - 0.5 // a pattern, so a transposed tensor differs
			if constant {
				v = float32(c)
			}
			data = appendFloat32(data, v)
		}
		tensors = append(tensors, codec.Tensor{Name: name, DType: "float32", Shape: shape, Data: data})
	}
	b, err := codec.EncodeSafetensors(tensors, nil)
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), b, 0o644))
}

func appendFloat32(b []byte, f float32) []byte {
	u := math.Float32bits(f)
	return append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
}

// flipbyte FILE OFFSET
// inverts the byte at OFFSET, which may be a sum of products of integers
// (4096+16*500).
func cmdFlipByte(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: flipbyte FILE OFFSET")
	}
	var off int64
	for _, term := range strings.Split(args[1], "+") {
		p := int64(1)
		for _, f := range strings.Split(term, "*") {
			v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil {
				ts.Fatalf("offset %q: %v", args[1], err)
			}
			p *= v
		}
		off += p
	}
	f, err := os.OpenFile(ts.MkAbs(args[0]), os.O_RDWR, 0)
	ts.Check(err)
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		ts.Fatalf("read %s at %d: %v", args[0], off, err)
	}
	ts.Logf("%s[%d]: %#02x -> %#02x", args[0], off, b[0], ^b[0])
	b[0] = ^b[0]
	_, err = f.WriteAt(b, off)
	ts.Check(err)
	ts.Check(f.Close())
}

// seqpattern FILE
// checks a JSON tensor answer (sample or rows) whose rows were written
// with observation = [seq, seq+0.5] and action = seq % 2: every returned
// row must hold its own seq's values.
func cmdSeqPattern(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: seqpattern FILE")
	}
	var ans struct {
		Seq         []int64      `json:"seq"`
		Observation [][2]float64 `json:"observation"`
		Action      []int64      `json:"action"`
	}
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &ans); err != nil {
		ts.Fatalf("%s: %v", args[0], err)
	}
	if len(ans.Seq) == 0 || len(ans.Observation) != len(ans.Seq) || len(ans.Action) != len(ans.Seq) {
		ts.Fatalf("%s: %d seqs, %d observations, %d actions", args[0], len(ans.Seq), len(ans.Observation), len(ans.Action))
	}
	for i, s := range ans.Seq {
		if ans.Observation[i] != [2]float64{float64(s), float64(s) + 0.5} || ans.Action[i] != s%2 {
			ts.Fatalf("row %d (seq %d): observation %v action %d, want [%d %d.5] %d", i, s, ans.Observation[i], ans.Action[i], s, s, s%2)
		}
	}
	ts.Logf("%d rows match their seqs", len(ans.Seq))
}

// loadRowOK reports whether a row written by rbdload is whole. rbdload
// writes to buffers with the fields "observation" (int64 [4]) and
// "next.done" (bool []); row i of an extend with token base holds
// observation = base+8i+k for k in 0..3 and done = i%5 == 4, so a reader
// can tell a whole row from a torn one, and the ack file (one line per
// acknowledged extend: "buffer first_seq rows base") says exactly which
// values each seq must hold.
func loadRowOK(obs [4]int64, done bool) bool {
	for k := range obs {
		if obs[k] != obs[0]+int64(k) {
			return false
		}
	}
	i := (obs[0] & 4095) / 8
	return obs[0]&7 == 0 && done == (i%5 == 4)
}

type loadAnswer struct {
	Seq         []int64    `json:"seq"`
	Observation [][4]int64 `json:"observation"`
	Done        []bool     `json:"next.done"`
}

// checkacks [-addr FILE] [-buffer NAME] ACKFILE
// checks, against the server in FILE, that every row of every extend
// acknowledged in ACKFILE (written by rbdload -acks) that is still within
// its buffer's capacity is live and holds the values it was written with,
// and that no seq at or above write_count was ever acknowledged.
func cmdCheckAcks(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "[-addr FILE] [-buffer NAME] ACKFILE"
	fs := newFlags("checkacks")
	addrFile := fs.String("addr", "addr", "")
	only := fs.String("buffer", "", "")
	args = parseFlags(ts, fs, args, usage)
	if neg || len(args) != 1 {
		ts.Fatalf("usage: checkacks %s", usage)
	}
	base, err := baseURL(ts.MkAbs(*addrFile))
	ts.Check(err)
	type ack struct{ first, rows, base int64 }
	acks := map[string][]ack{}
	sc := bufio.NewScanner(strings.NewReader(ts.ReadFile(args[0])))
	for sc.Scan() {
		var name string
		var a ack
		if _, err := fmt.Sscan(sc.Text(), &name, &a.first, &a.rows, &a.base); err != nil {
			ts.Fatalf("%s: line %q: %v", args[0], sc.Text(), err)
		}
		if *only == "" || name == *only {
			acks[name] = append(acks[name], a)
		}
	}
	if len(acks) == 0 {
		ts.Fatalf("%s: no acknowledged extends", args[0])
	}
	var checked, gone int64
	var probs []string
	for name, list := range acks {
		res, err := doHTTP("GET", base+"/v1/buffers/"+name, "", "", "", nil)
		if err != nil || res.status != 200 {
			ts.Fatalf("info %s: %v %v", name, err, res)
		}
		var info struct {
			WriteCount int64 `json:"write_count"`
			Spec       struct {
				Capacity int64 `json:"capacity"`
			} `json:"spec"`
		}
		ts.Check(json.Unmarshal(res.body, &info))
		low := max(0, info.WriteCount-info.Spec.Capacity)
		var hi int64
		for _, a := range list {
			hi = max(hi, a.first+a.rows)
		}
		if hi > info.WriteCount {
			probs = append(probs, fmt.Sprintf("%s: seq %d was acknowledged, but write_count is %d", name, hi-1, info.WriteCount))
		}
		type row struct {
			obs  [4]int64
			done bool
		}
		rows := map[int64]row{}
		for from := low; from < hi; {
			res, err := doHTTP("GET", fmt.Sprintf("%s/v1/buffers/%s/rows?from_seq=%d&count=8192", base, name, from), "", "", "application/json", nil)
			if err != nil || res.status != 200 {
				ts.Fatalf("rows %s from %d: %v %v", name, from, err, res)
			}
			var ans loadAnswer
			ts.Check(json.Unmarshal(res.body, &ans))
			if len(ans.Seq) == 0 {
				break
			}
			for i, s := range ans.Seq {
				rows[s] = row{ans.Observation[i], ans.Done[i]}
			}
			from = ans.Seq[len(ans.Seq)-1] + 1
		}
		for _, a := range list {
			for i := range a.rows {
				seq := a.first + i
				if seq < low {
					gone++
					continue
				}
				checked++
				want := row{done: i%5 == 4}
				for k := range want.obs {
					want.obs[k] = a.base + 8*i + int64(k)
				}
				got, ok := rows[seq]
				switch {
				case !ok:
					probs = append(probs, fmt.Sprintf("%s: acknowledged seq %d is missing", name, seq))
				case got != want:
					probs = append(probs, fmt.Sprintf("%s: seq %d holds %v, acknowledged %v", name, seq, got, want))
				}
			}
		}
	}
	if len(probs) > 0 {
		ts.Fatalf("%d problems in %d acknowledged rows, e.g.:\n%s", len(probs), checked, strings.Join(probs[:min(len(probs), 20)], "\n"))
	}
	fmt.Fprintf(ts.Stdout(), "checked %d acknowledged rows in %d buffers (%d overwritten since)\n", checked, len(acks), gone)
}

// loadMain is rbdload, a load generator run as its own process:
//
//	rbdload -addr-file F -buffers a,b [-writers 8] [-rows 16] [-requests N]
//	        [-max 30s] [-until FILE] [-readers 2] [-acks FILE] [-started FILE] [-tolerate]
//
// Writer w extends buffers[w % len] as stream "w<w>" (rows alternating
// between envs 0 and 1, every fifth row done) until it has sent -requests
// extends, -max has passed or the -until file exists. Each acknowledged
// extend is appended to the -acks file. -started is created once every
// writer has had an extend acknowledged. Readers then sample every buffer
// and check each returned row is whole (see loadRowOK). Any answer but a
// 200 (or a 503 to a reader) is an error; so is a request that gets no
// answer, unless -tolerate (the server is killed meanwhile): then that
// writer or reader just stops. It prints a summary and exits 1 on errors,
// torn rows or when nothing was written.
func loadMain() {
	fs := flag.NewFlagSet("rbdload", flag.ExitOnError)
	addrFile := fs.String("addr-file", "addr", "file holding the server's host:port")
	buffers := fs.String("buffers", "", "comma-separated buffer names")
	writers := fs.Int("writers", 8, "concurrent writers")
	rowsPer := fs.Int("rows", 16, "rows per extend (at most 512)")
	requests := fs.Int("requests", 100000, "extends per writer at most")
	maxDur := fs.Duration("max", 30*time.Second, "run at most this long")
	until := fs.String("until", "", "stop once this file exists")
	readers := fs.Int("readers", 0, "concurrent samplers checking rows")
	ackFile := fs.String("acks", "", "append acknowledged extends here")
	startedFile := fs.String("started", "", "create this file once every writer had an extend acknowledged")
	tolerate := fs.Bool("tolerate", false, "a failed request stops its writer without being an error")
	fs.Parse(os.Args[1:])
	names := strings.Split(*buffers, ",")
	if *buffers == "" || *writers < 1 || *rowsPer < 1 || *rowsPer > 512 {
		fmt.Fprintln(os.Stderr, "rbdload: need -buffers, -writers >= 1 and 1 <= -rows <= 512")
		os.Exit(2)
	}
	base, err := baseURL(*addrFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rbdload:", err)
		os.Exit(2)
	}
	var acks *os.File
	if *ackFile != "" {
		if acks, err = os.OpenFile(*ackFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "rbdload:", err)
			os.Exit(2)
		}
	}
	start := time.Now()
	var stop atomic.Bool
	go func() {
		for !stop.Load() {
			if time.Since(start) > *maxDur {
				stop.Store(true)
			}
			if *until != "" {
				if _, err := os.Stat(*until); err == nil {
					stop.Store(true)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var (
		mu                          sync.Mutex
		errs                        []string
		nReq, nRows, nSamples, torn atomic.Int64
		nStarted                    atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	var writersWG, readersWG sync.WaitGroup
	for w := range *writers {
		writersWG.Add(1)
		go func() {
			defer writersWG.Done()
			name := names[w%len(names)]
			url := fmt.Sprintf("%s/v1/buffers/%s/extend?stream=w%d", base, name, w)
			for r := 0; r < *requests && !stop.Load(); r++ {
				tok := int64(w+1)<<32 | int64(r)<<12
				body := loadBody(tok, *rowsPer)
				res, err := doHTTP("POST", url, "", "application/json", "", body)
				if err != nil {
					if !*tolerate {
						fail("writer %d: %v", w, err)
					}
					return
				}
				if res.status != 200 {
					fail("writer %d: status %d: %s", w, res.status, res.body)
					return
				}
				var ans struct {
					FirstSeq int64 `json:"first_seq"`
					Rows     int64 `json:"rows"`
				}
				if err := json.Unmarshal(res.body, &ans); err != nil || ans.Rows != int64(*rowsPer) {
					fail("writer %d: answer %s (%v)", w, res.body, err)
					return
				}
				if acks != nil {
					line := fmt.Sprintf("%s %d %d %d\n", name, ans.FirstSeq, ans.Rows, tok)
					mu.Lock()
					_, err := acks.WriteString(line)
					mu.Unlock()
					if err != nil {
						fail("ack file: %v", err)
						return
					}
				}
				nReq.Add(1)
				nRows.Add(ans.Rows)
				if r == 0 && nStarted.Add(1) == int64(*writers) && *startedFile != "" {
					if err := os.WriteFile(*startedFile, []byte("started\n"), 0o644); err != nil {
						fail("started file: %v", err)
					}
				}
			}
		}()
	}
	for rd := range *readers {
		readersWG.Add(1)
		go func() {
			defer readersWG.Done()
			// Start once every buffer has rows: sampling an empty one
			// is another test's business.
			for nStarted.Load() < int64(*writers) && !stop.Load() {
				time.Sleep(5 * time.Millisecond)
			}
			for i := 0; !stop.Load(); i++ {
				name := names[(rd+i)%len(names)]
				res, err := doHTTP("POST", base+"/v1/buffers/"+name+"/sample", "", "application/json", "application/json",
					[]byte(`{"batch_size": 64, "keys": ["observation", "next.done"]}`))
				if err != nil {
					if !*tolerate {
						fail("reader %d: %v", rd, err)
					}
					return
				}
				if res.status == http.StatusServiceUnavailable { // nothing written yet
					time.Sleep(5 * time.Millisecond)
					continue
				}
				var ans loadAnswer
				if res.status != 200 || json.Unmarshal(res.body, &ans) != nil || len(ans.Seq) != 64 || len(ans.Observation) != 64 || len(ans.Done) != 64 {
					fail("reader %d: status %d: %.300s", rd, res.status, res.body)
					return
				}
				nSamples.Add(1)
				for j := range ans.Seq {
					if !loadRowOK(ans.Observation[j], ans.Done[j]) {
						torn.Add(1)
						fail("reader %d: %s seq %d is torn: observation %v done %v", rd, name, ans.Seq[j], ans.Observation[j], ans.Done[j])
					}
				}
			}
		}()
	}
	writersWG.Wait()
	stop.Store(true)
	readersWG.Wait()
	if acks != nil {
		if err := acks.Close(); err != nil {
			fail("ack file: %v", err)
		}
	}
	fmt.Printf("writers %d: %d extends, %d rows acknowledged in %v; readers %d: %d samples, %d torn rows\n",
		*writers, nReq.Load(), nRows.Load(), time.Since(start).Round(time.Millisecond), *readers, nSamples.Load(), torn.Load())
	for _, e := range errs {
		fmt.Fprintln(os.Stderr, "rbdload:", e)
	}
	if len(errs) > 0 || nRows.Load() == 0 {
		os.Exit(1)
	}
	os.Exit(0)
}

func loadBody(tok int64, n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"observation": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		v := tok + 8*int64(i)
		fmt.Fprintf(&b, "[%d,%d,%d,%d]", v, v+1, v+2, v+3)
	}
	b.WriteString(`], "next.done": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatBool(i%5 == 4))
	}
	b.WriteString(`], "env": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i % 2))
	}
	b.WriteString(`]}`)
	return b.Bytes()
}
