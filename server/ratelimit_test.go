package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rbdb/rbd"
)

// limitedSpec is cartpoleSpec with a rate limit: spi 2, min_size 10,
// error_buffer 6 (window [14, 26]; at most 3 rows an extend, 6 a sample).
var limitedSpec = strings.Replace(cartpoleSpec, `"compact_obs": true`,
	`"rate_limit": {"samples_per_insert": 2, "min_size": 10, "error_buffer": 6}, "compact_obs": true`, 1)

// rowsJSON is an extend body of n rows that do not end their trajectory.
func rowsJSON(n int) string {
	var obs, act, rew, fls []string
	for i := range n {
		obs = append(obs, fmt.Sprintf("[%d,0,0,0]", i))
		act, rew, fls = append(act, "1"), append(rew, "1"), append(fls, "false")
	}
	j := func(v []string) string { return "[" + strings.Join(v, ",") + "]" }
	return fmt.Sprintf(`{"observation": %s, "action": %s, "next.reward": %s, "next.done": %s, "next.terminated": %s, "next.truncated": %s}`,
		j(obs), j(act), j(rew), j(fls), j(fls), j(fls))
}

type rlServer struct {
	t   *testing.T
	srv *Server
	url string
	db  *rbd.DB
}

func newRLServer(t *testing.T) *rlServer {
	t.Helper()
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(db, nil)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); db.Close() })
	s := &rlServer{t: t, srv: srv, url: ts.URL, db: db}
	if code, body := do(t, "PUT", ts.URL+"/v1/buffers/rl", "application/json", limitedSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	return s
}

func (s *rlServer) extend(n int, query string) (int, []byte) {
	return do(s.t, "POST", s.url+"/v1/buffers/rl/extend?stream=a"+query, "application/json", rowsJSON(n))
}

func (s *rlServer) sample(body string) (int, []byte) {
	return do(s.t, "POST", s.url+"/v1/buffers/rl/sample", "application/json", body)
}

// state reads rate_limit from the buffer's info.
func (s *rlServer) state() map[string]any {
	s.t.Helper()
	code, body := do(s.t, "GET", s.url+"/v1/buffers/rl", "", "")
	if code != 200 {
		s.t.Fatalf("info: %d %s", code, body)
	}
	var info struct {
		RateLimit map[string]any `json:"rate_limit"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		s.t.Fatal(err)
	}
	return info.RateLimit
}

func (s *rlServer) waitFor(key string, want float64) {
	s.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if v, _ := s.state()[key].(float64); v == want {
			return
		}
	}
	s.t.Fatalf("%s never became %v: %v", key, want, s.state())
}

func (s *rlServer) wantCounters(inserts, samples float64) {
	s.t.Helper()
	st := s.state()
	if st["inserts"] != inserts || st["samples"] != samples {
		s.t.Fatalf("inserts %v samples %v, want %v %v (%v)", st["inserts"], st["samples"], inserts, samples, st)
	}
}

type answer struct {
	code int
	body []byte
}

func TestHTTPRateLimit(t *testing.T) {
	s := newRLServer(t)
	st := s.state()
	if st["samples_per_insert"] != 2.0 || st["min_diff"] != 14.0 || st["max_diff"] != 26.0 || st["blocked"] != "samples" {
		t.Fatalf("info rate_limit of a new buffer: %v", st)
	}

	// Refused at once: 503 rate_limited, Retry-After, the state in the body.
	resp, err := http.Post(s.url+"/v1/buffers/rl/sample", "application/json", strings.NewReader(`{"batch_size": 4}`))
	if err != nil {
		t.Fatal(err)
	}
	var eb struct {
		Error     string         `json:"error"`
		Code      string         `json:"code"`
		RateLimit map[string]any `json:"rate_limit"`
	}
	json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	if resp.StatusCode != 503 || eb.Code != "rate_limited" || resp.Header.Get("Retry-After") == "" ||
		eb.RateLimit["size"] != 0.0 || !strings.Contains(eb.Error, "fewer than min_size 10") {
		t.Fatalf("sample of an empty buffer: %d %+v (Retry-After %q)", resp.StatusCode, eb, resp.Header.Get("Retry-After"))
	}

	for _, n := range []int{3, 3, 3, 1} {
		if code, body := s.extend(n, ""); code != 200 {
			t.Fatalf("extend %d: %d %s", n, code, body)
		}
	}
	if code, body := s.sample(`{"batch_size": 6}`); code != 200 { // 14
		t.Fatalf("sample: %d %s", code, body)
	}
	s.wantCounters(10, 6)

	// Too large for the window: 400 naming the sizes, at once.
	if code, body := s.sample(`{"batch_size": 7, "timeout_ms": 60000}`); code != 400 || !strings.Contains(string(body), "sample at most 6 rows per request") {
		t.Errorf("sample of 7 rows: %d %s", code, body)
	}
	if code, body := s.extend(4, "&timeout_ms=60000"); code != 400 || !strings.Contains(string(body), "send at most 3 rows per request") {
		t.Errorf("extend of 4 rows: %d %s", code, body)
	}

	// A sample that waits, released by an extend.
	got := make(chan answer, 2)
	go func() {
		code, body := s.sample(`{"batch_size": 4, "timeout_ms": 60000}`)
		got <- answer{code, body}
	}()
	s.waitFor("waiting_samples", 1)
	if code, body := s.extend(2, ""); code != 200 { // 18: the sample goes, 14
		t.Fatalf("extend: %d %s", code, body)
	}
	if a := <-got; a.code != 200 {
		t.Fatalf("waiting sample: %d %s", a.code, a.body)
	}
	s.wantCounters(12, 10)

	// An extend that waits (?timeout_ms), released by a live change.
	for range 2 {
		if code, body := s.extend(3, ""); code != 200 { // 20, 26
			t.Fatalf("extend: %d %s", code, body)
		}
	}
	go func() {
		code, body := s.extend(3, "&timeout_ms=60000")
		got <- answer{code, body}
	}()
	s.waitFor("waiting_extends", 1)
	if st := s.state(); st["blocked"] != "extends" {
		t.Fatalf("blocked %v, want extends", st["blocked"])
	}
	code, body := do(t, "PUT", s.url+"/v1/buffers/rl/rate_limit", "application/json", `{"samples_per_insert": 2, "min_size": 10, "error_buffer": 20}`)
	if code != 200 || !strings.Contains(string(body), `"max_diff":40`) {
		t.Fatalf("PUT rate_limit: %d %s", code, body)
	}
	if a := <-got; a.code != 200 { // centre 20 + 6 <= 40
		t.Fatalf("waiting extend after the change: %d %s", a.code, a.body)
	}
	s.wantCounters(13, 0)

	// Bad input: 400 naming the key or the parameter; nothing changes.
	for _, c := range []struct {
		method, path, body, want string
	}{
		{"PUT", "/v1/buffers/rl/rate_limit", `{"samples_per_insert": 2, "error_buffer": 1}`, "rate_limit.error_buffer"},
		{"PUT", "/v1/buffers/rl/rate_limit", `{"samples_per_insert": -1, "error_buffer": 4}`, "rate_limit.samples_per_insert"},
		{"PUT", "/v1/buffers/rl/rate_limit", `{"min_size": 1001}`, "rate_limit.min_size"},
		{"PUT", "/v1/buffers/rl/rate_limit", `{"min_size": 1, "ratio": 3}`, "rate_limit.ratio"},
		{"PUT", "/v1/buffers/rl/rate_limit", `[1]`, "rate_limit"},
		{"POST", "/v1/buffers/rl/extend?stream=a&timeout_ms=soon", rowsJSON(1), "timeout_ms"},
		{"POST", "/v1/buffers/rl/extend?stream=a&timeout_ms=-1", rowsJSON(1), "timeout_ms"},
	} {
		code, body := do(t, c.method, s.url+c.path, "application/json", c.body)
		if code != 400 || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %s %s: %d %s, want 400 naming %s", c.method, c.path, c.body, code, body, c.want)
		}
	}
	if code, _ := do(t, "PUT", s.url+"/v1/buffers/nope/rate_limit", "application/json", `{"min_size": 1}`); code != 404 {
		t.Errorf("PUT rate_limit of a missing buffer: %d", code)
	}
	if st := s.state(); st["error_buffer"] != 20.0 {
		t.Fatalf("a refused change changed the limit: %v", st)
	}

	// Metrics.
	_, m := do(t, "GET", s.url+"/metrics", "", "")
	for _, want := range []string{
		`rbd_rate_limit_diff{buffer="rl"} 26`,
		`rbd_rate_limit_diff_bound{bound="max_diff",buffer="rl"} 40`,
		`rbd_rate_limit_waiting{buffer="rl",side="extends"} 0`,
		`rbd_rate_limit_refused_total{buffer="rl",side="samples"} 1`,
		`rbd_rate_limit_wait_seconds_total{buffer="rl",side="samples"}`,
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// null removes it.
	code, body = do(t, "PUT", s.url+"/v1/buffers/rl/rate_limit", "application/json", `null`)
	if code != 200 || strings.TrimSpace(string(body)) != `{"rate_limit":null}` {
		t.Fatalf("PUT null: %d %s", code, body)
	}
	if st := s.state(); st != nil {
		t.Fatalf("info rate_limit after removing it: %v", st)
	}
}

// TestHTTPRateLimitWaitsEnd: a client that hangs up stops waiting and
// counts nothing; a delete answers waiters 404 and a shutdown 503
// shutting_down, at once.
func TestHTTPRateLimitWaitsEnd(t *testing.T) {
	s := newRLServer(t)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/buffers/rl/sample", strings.NewReader(`{"batch_size": 4, "timeout_ms": 60000}`))
	req.Header.Set("Content-Type", "application/json")
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	s.waitFor("waiting_samples", 1)
	cancel()
	<-gone
	s.waitFor("waiting_samples", 0)
	s.wantCounters(0, 0)

	// An extend waiting (window [14, 26] at diff 26). Both sides cannot
	// wait at once (a request moves diff by at most error_buffer, half the
	// window): a second, empty buffer holds a waiting sample.
	for _, n := range []int{3, 3, 3, 1, 3} {
		if code, body := s.extend(n, ""); code != 200 {
			t.Fatalf("extend: %d %s", code, body)
		}
	}
	if code, body := do(t, "PUT", s.url+"/v1/buffers/rl2", "application/json", limitedSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	got := make(chan answer, 2)
	start := time.Now()
	go func() {
		code, body := s.extend(3, "&timeout_ms=60000")
		got <- answer{code, body}
	}()
	go func() {
		code, body := do(t, "POST", s.url+"/v1/buffers/rl2/sample", "application/json", `{"batch_size": 4, "timeout_ms": 60000}`)
		got <- answer{code, body}
	}()
	s.waitFor("waiting_extends", 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		_, body := do(t, "GET", s.url+"/v1/buffers/rl2", "", "")
		if strings.Contains(string(body), `"waiting_samples":1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sample of rl2 never waited: %s", body)
		}
	}
	for _, name := range []string{"rl", "rl2"} {
		if code, body := do(t, "DELETE", s.url+"/v1/buffers/"+name, "", ""); code != 200 && code != 204 {
			t.Fatalf("delete: %d %s", code, body)
		}
	}
	for range 2 {
		if a := <-got; a.code != 404 || !strings.Contains(string(a.body), "deleted") {
			t.Fatalf("waiter of a deleted buffer: %d %s", a.code, a.body)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("waiters answered after %v", took)
	}

	// Shutdown.
	if code, body := do(t, "PUT", s.url+"/v1/buffers/rl", "application/json", limitedSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	go func() {
		code, body := s.sample(`{"batch_size": 1, "timeout_ms": 60000}`)
		got <- answer{code, body}
	}()
	go func() {
		for _, n := range []int{3, 3, 3, 1, 3, 3, 3} { // the last waits
			code, body := s.extend(n, "&timeout_ms=60000")
			if code != 200 {
				got <- answer{code, body}
				return
			}
		}
	}()
	// The sample goes once 10 rows are in (diff 20 - 1 = 19); then 25,
	// and the last extend waits (25 + 6 > 26).
	if a := <-got; a.code != 200 {
		t.Fatalf("sample: %d %s", a.code, a.body)
	}
	s.waitFor("waiting_extends", 1)
	s.srv.BeginShutdown()
	if a := <-got; a.code != 503 || !strings.Contains(string(a.body), "shutting_down") {
		t.Fatalf("waiting extend at shutdown: %d %s", a.code, a.body)
	}
}
