package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
)

const cartpoleSpec = `{"capacity": 1000, "storage": "memmap",
 "fields": {"observation": {"dtype": "float32", "shape": [4]},
            "action": {"dtype": "int64", "shape": []},
            "next.reward": {"dtype": "float32", "shape": []},
            "next.done": {"dtype": "bool", "shape": []},
            "next.terminated": {"dtype": "bool", "shape": []},
            "next.truncated": {"dtype": "bool", "shape": []}},
 "compact_obs": true, "obs_keys": ["observation"],
 "priority": {"alpha": 0.6, "eps": 1e-6}}`

func newTestServer(t *testing.T, opts *Options) (*httptest.Server, *rbd.DB) {
	t.Helper()
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(db, opts).Handler())
	t.Cleanup(func() { ts.Close(); db.Close() })
	return ts, db
}

func do(t *testing.T, method, url, ctype, body string, hdr ...string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestSmokeCreateExtendSample(t *testing.T) {
	ts, _ := newTestServer(t, nil)
	if code, body := do(t, "PUT", ts.URL+"/v1/buffers/cp", "application/json", cartpoleSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, _ := do(t, "PUT", ts.URL+"/v1/buffers/cp", "", cartpoleSpec); code != 200 {
		t.Fatalf("identical create: %d", code)
	}
	ext := `{"observation": [[0,0,0,0],[1,1,1,1],[2,2,2,2]], "action": [0,1,0], "next.reward": [1,1,1],
	 "next.done": [false,false,true], "next.terminated": [false,false,true], "next.truncated": [false,false,false],
	 "next.observation": [[3,3,3,3]]}`
	code, body := do(t, "POST", ts.URL+"/v1/buffers/cp/extend?stream=a", "", ext)
	if code != 200 || !strings.Contains(string(body), `"first_seq":0`) {
		t.Fatalf("extend: %d %s", code, body)
	}
	code, body = do(t, "POST", ts.URL+"/v1/buffers/cp/sample", "", `{"batch_size": 4, "seed": 1}`, "Accept", "application/json")
	if code != 200 {
		t.Fatalf("sample json: %d %s", code, body)
	}
	var ans map[string]any
	if err := json.Unmarshal(body, &ans); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	code, body = do(t, "POST", ts.URL+"/v1/buffers/cp/sample", "application/json", `{"batch_size": 4, "seed": 1, "sampler": "prioritized"}`)
	if code != 200 {
		t.Fatalf("sample: %d %s", code, body)
	}
	tensors, _, err := codec.DecodeSafetensors(body)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, tt := range tensors {
		names = append(names, tt.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "weight") {
		t.Fatalf("tensors %v", names)
	}
	for _, tc := range []struct {
		method, path, ctype, body string
		want                      int
		msg                       string
	}{
		{"POST", "/v1/buffers/cp/extend", "", `{"observation": [[0,0,0]]}`, 400, "observation"},
		{"POST", "/v1/buffers/cp/extend", "image/png", `x`, 415, "Content-Type"},
		{"POST", "/v1/buffers/cp/extend", "application/octet-stream", `garbage`, 400, "safetensors"},
		{"POST", "/v1/buffers/nope/sample", "", `{"batch_size": 1}`, 404, "nope"},
		{"POST", "/v1/buffers/cp/sample", "", `{"batch_size": 1, "sampler": "bogus"}`, 400, "sampler"},
		{"POST", "/v1/buffers/cp/sample", "", `{"batch_size": 1, "colour": 1}`, 400, "colour"},
		{"PUT", "/v1/buffers/cp", "", strings.Replace(cartpoleSpec, "1000", "999", 1), 409, "different spec"},
		{"PUT", "/v1/buffers/x", "", `{"capacity": -1}`, 400, "capacity"},
		{"PUT", "/v1/buffers/a..b", "", cartpoleSpec, 400, "name"},
		{"PUT", "/v1/buffers/-x", "", cartpoleSpec, 400, "name"},
		{"POST", "/v1/buffers/cp/priorities", "", `{"seq": [0], "priority": ["NaN"]}`, 400, "priority"},
	} {
		code, body := do(t, tc.method, ts.URL+tc.path, tc.ctype, tc.body)
		var eb errorBody
		if code != tc.want || json.Unmarshal(body, &eb) != nil || !strings.Contains(eb.Error, tc.msg) {
			t.Errorf("%s %s %s: %d %s, want %d naming %q", tc.method, tc.path, tc.body, code, body, tc.want, tc.msg)
		}
	}
	code, body = do(t, "GET", ts.URL+"/v1/buffers/cp/rows?from_seq=0&count=10", "", "", "Accept", "application/json")
	if code != 200 || !bytes.Contains(body, []byte(`"next_seq":[1,2,-1]`)) {
		t.Fatalf("rows: %d %s", code, body)
	}
	code, body = do(t, "GET", ts.URL+"/metrics", "", "")
	if code != 200 || !bytes.Contains(body, []byte(`rbd_buffer_live_rows{buffer="cp"} 3`)) {
		t.Fatalf("metrics: %d %s", code, body)
	}
}

func TestSmokeAuth(t *testing.T) {
	ts, _ := newTestServer(t, &Options{Token: "s3cret"})
	if code, _ := do(t, "GET", ts.URL+"/v1/health", "", ""); code != 200 {
		t.Fatal("health needs no token")
	}
	if code, body := do(t, "GET", ts.URL+"/v1/buffers", "", ""); code != 401 || !strings.Contains(string(body), "token") {
		t.Fatalf("no token: %d %s", code, body)
	}
	if code, _ := do(t, "GET", ts.URL+"/v1/buffers", "", "", "Authorization", "Bearer s3cret"); code != 200 {
		t.Fatal("good token refused")
	}
}

// TestPprof: --pprof serves Go's profiles behind the token; without it
// there is no such endpoint.
func TestPprof(t *testing.T) {
	ts, _ := newTestServer(t, &Options{Token: "k", Pprof: true})
	if code, _ := do(t, "GET", ts.URL+"/debug/pprof/", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("pprof without the token: %d, want 401", code)
	}
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"} {
		if code, body := do(t, "GET", ts.URL+p, "", "", "Authorization", "Bearer k"); code != 200 || len(body) == 0 {
			t.Fatalf("%s: %d (%d bytes)", p, code, len(body))
		}
	}
	off, _ := newTestServer(t, nil)
	if code, body := do(t, "GET", off.URL+"/debug/pprof/", "", ""); code != http.StatusNotFound || !bytes.Contains(body, []byte(`"error"`)) {
		t.Fatalf("pprof off: %d %s", code, body)
	}
}

// TestJSONAnswerLimit: a JSON answer counts against MaxResponse at its
// exact encoded size (JSON is several times the binary size): over it is a
// 400 response_too_large that points to safetensors, and the server goes
// on; an answer that fits carries an exact Content-Length.
func TestJSONAnswerLimit(t *testing.T) {
	const limit = 64 << 10
	ts, _ := newTestServer(t, &Options{MaxResponse: limit})
	if code, body := do(t, "PUT", ts.URL+"/v1/buffers/cp", "application/json", cartpoleSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var rows []string
	for i := range 2000 {
		rows = append(rows, fmt.Sprintf("[%d.123456,0.25,0.5,0.75]", i))
	}
	body := fmt.Sprintf(`{"observation": [%s], "action": [%s], "next.reward": [%s], "next.done": [%s], "next.terminated": [%s], "next.truncated": [%s]}`,
		strings.Join(rows, ","), rep("1", 2000), rep("0.5", 2000), rep("false", 2000), rep("false", 2000), rep("false", 2000))
	if code, b := do(t, "POST", ts.URL+"/v1/buffers/cp/extend?stream=s", "application/json", body); code != 200 {
		t.Fatalf("extend: %d %s", code, b)
	}
	// 800 rows: 57 KB of safetensors (under the limit at plan time),
	// several times that as JSON.
	code, b := do(t, "POST", ts.URL+"/v1/buffers/cp/sample", "application/json", `{"batch_size": 800, "seed": 1, "include_incomplete": true}`, "Accept", "application/json")
	if code != 400 || !bytes.Contains(b, []byte(`"code":"response_too_large"`)) || !bytes.Contains(b, []byte("application/octet-stream")) {
		t.Fatalf("JSON answer over the limit: %d %s", code, b)
	}
	// The same as safetensors fits.
	if code, b := do(t, "POST", ts.URL+"/v1/buffers/cp/sample", "application/json", `{"batch_size": 800, "seed": 1, "include_incomplete": true}`); code != 200 {
		t.Fatalf("safetensors answer: %d %.200s", code, b)
	}
	// A smaller JSON answer: its declared length is its length.
	resp, err := http.Post(ts.URL+"/v1/buffers/cp/sample", "application/json", strings.NewReader(`{"batch_size": 100, "seed": 1, "include_incomplete": true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest("POST", ts.URL+"/v1/buffers/cp/sample", strings.NewReader(`{"batch_size": 100, "seed": 1, "include_incomplete": true}`))
	req.Header.Set("Accept", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || resp.ContentLength != int64(len(got)) || !json.Valid(got) {
		t.Fatalf("JSON answer: %d, Content-Length %d, %d bytes read (%v), valid %v", resp.StatusCode, resp.ContentLength, len(got), err, json.Valid(got))
	}
}

func rep(v string, n int) string { return strings.TrimSuffix(strings.Repeat(v+",", n), ",") }
