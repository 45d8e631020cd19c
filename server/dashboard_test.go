package server

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestHistogramOf(t *testing.T) {
	tests := []struct {
		name       string
		vals       []float64
		buckets    int
		wantScale  string
		wantCounts []int
	}{
		{name: "empty", vals: nil, buckets: 4, wantScale: "linear", wantCounts: []int{}},
		{name: "all equal", vals: []float64{2, 2, 2}, buckets: 4, wantScale: "linear", wantCounts: []int{3}},
		{name: "linear", vals: []float64{0, 1, 2, 3, 4, 5, 6, 7}, buckets: 4, wantScale: "linear", wantCounts: []int{2, 2, 2, 2}},
		{name: "max lands in the last bucket", vals: []float64{0, 10}, buckets: 5, wantScale: "linear", wantCounts: []int{1, 0, 0, 0, 1}},
		{name: "log when two decades apart", vals: []float64{0.01, 0.1, 1, 1, 10}, buckets: 3, wantScale: "log", wantCounts: []int{1, 1, 3}},
		{name: "zero keeps it linear", vals: []float64{0, 0.01, 100}, buckets: 2, wantScale: "linear", wantCounts: []int{2, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := histogramOf(tc.vals, tc.buckets)
			if h.Scale != tc.wantScale || !slices.Equal(h.Counts, tc.wantCounts) {
				t.Fatalf("scale %s counts %v (edges %v), want %s %v", h.Scale, h.Counts, h.Edges, tc.wantScale, tc.wantCounts)
			}
			if h.Sampled != len(tc.vals) {
				t.Fatalf("sampled %d, want %d", h.Sampled, len(tc.vals))
			}
			if len(tc.vals) > 0 && (len(h.Edges) != len(h.Counts)+1 || h.Edges[0] != tc.vals[0] || h.Edges[len(h.Edges)-1] != tc.vals[len(tc.vals)-1]) {
				t.Fatalf("edges %v do not run from min to max with one more than the counts", h.Edges)
			}
			sum := 0.0
			for _, v := range tc.vals {
				sum += v
			}
			if len(tc.vals) > 0 && math.Abs(h.Mean-sum/float64(len(tc.vals))) > 1e-12 {
				t.Fatalf("mean %v, want %v", h.Mean, sum/float64(len(tc.vals)))
			}
		})
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, body := do(t, "GET", url, "", "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}

// The stats of a buffer follow what was written through the API: lengths,
// priorities, open trajectories per stream, failed requests.
func TestBufferStats(t *testing.T) {
	ts, _ := newTestServer(t, nil)
	if code, body := do(t, "PUT", ts.URL+"/v1/buffers/cp", "application/json", cartpoleSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	// Episodes of 1, 2 and 3 steps on stream a, then one open trajectory
	// on each of 103 streams.
	ext := func(stream string, dones ...bool) {
		t.Helper()
		n := len(dones)
		obs := strings.TrimSuffix(strings.Repeat("[1,2,3,4],", n), ",")
		flags, _ := json.Marshal(dones)
		zeros := strings.TrimSuffix(strings.Repeat("0,", n), ",")
		body := fmt.Sprintf(`{"observation": [%s], "action": [%s], "next.reward": [%s], "next.done": %s, "next.terminated": %s, "next.truncated": [%s]}`,
			obs, zeros, zeros, flags, flags, strings.TrimSuffix(strings.Repeat("false,", n), ","))
		if code, b := do(t, "POST", ts.URL+"/v1/buffers/cp/extend?stream="+stream, "application/json", body); code != 200 {
			t.Fatalf("extend: %d %s", code, b)
		}
	}
	ext("a", true)
	ext("a", false, true)
	ext("a", false, false, true)
	for i := range 103 {
		ext(fmt.Sprintf("s%03d", i), false)
	}
	ext("s000", false) // still one open trajectory, now 2 rows long
	// A request that fails naming the buffer, with markup in the message,
	// and one naming no buffer that exists (not recorded anywhere).
	evil := `<img src=x onerror=alert(1)>`
	if code, _ := do(t, "POST", ts.URL+"/v1/buffers/cp/extend", "application/json", `{"`+evil+`": [1]}`); code != 400 {
		t.Fatalf("bad extend answered %d, want 400", code)
	}
	if code, _ := do(t, "POST", ts.URL+"/v1/buffers/ghost/extend", "application/json", `{}`); code != 404 {
		t.Fatalf("extend of an unknown buffer answered %d, want 404", code)
	}

	var st statsAnswer
	getJSON(t, ts.URL+"/v1/buffers/cp/stats?buckets=10", &st)
	tl := st.TrajectoryLengths
	// 3 ended (lengths 1, 2, 3) + 103 open (102 of length 1, one of 2).
	if tl.Trajectories != 106 || !slices.Equal(tl.Edges, []int{1, 2, 3, 4}) || !slices.Equal(tl.Counts, []int{103, 2, 1}) {
		t.Fatalf("trajectory lengths %+v, want 106 trajectories in [1,2,3,4) counted 103 2 1", tl)
	}
	if st.Priorities == nil || st.Priorities.Sampled == 0 || st.Priorities.Min != 1 || st.Priorities.Max != 1 {
		t.Fatalf("priorities %+v, want rows at the default priority 1", st.Priorities)
	}
	if len(st.OpenByStream) != maxStatsStreams || st.OpenByStream[0] != (streamOpen{Stream: "s000", Open: 1}) {
		t.Fatalf("%d streams listed, first %+v; want %d, s000 first", len(st.OpenByStream), st.OpenByStream[0], maxStatsStreams)
	}
	if st.OtherStreams == nil || *st.OtherStreams != (otherStreams{Streams: 3, Open: 3}) {
		t.Fatalf("other streams %+v, want 3 streams with 3 open trajectories", st.OtherStreams)
	}
	e := st.Errors
	if e.ByStatus["400"] != 1 || len(e.Recent) != 1 || e.Recent[0].Endpoint != "extend" || !strings.Contains(e.Recent[0].Error, evil) {
		t.Fatalf("errors %+v, want the one bad extend with its message", e)
	}
	if len(e.ByStatus) != 1 {
		t.Fatalf("errors by status %v: the 404 for an unknown buffer must not be counted here", e.ByStatus)
	}

	// Deleting the buffer forgets its errors: a new one starts clean.
	if code, _ := do(t, "DELETE", ts.URL+"/v1/buffers/cp", "", ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if code, body := do(t, "PUT", ts.URL+"/v1/buffers/cp", "application/json", cartpoleSpec); code != 201 {
		t.Fatalf("create again: %d %s", code, body)
	}
	getJSON(t, ts.URL+"/v1/buffers/cp/stats", &st)
	if len(st.Errors.Recent) != 0 || st.TrajectoryLengths.Trajectories != 0 || len(st.OpenByStream) != 0 {
		t.Fatalf("a new buffer of the same name has stats %+v", st)
	}
}

// Only the last recentErrors failures are kept, oldest first.
func TestErrorLogKeepsTheLast(t *testing.T) {
	var l errorLog
	for i := range recentErrors + 5 {
		l.note("b", failedRequest{Status: 400 + i%2, Error: fmt.Sprint(i)})
	}
	s := l.summary("b")
	if len(s.Recent) != recentErrors || s.Recent[0].Error != "5" || s.Recent[recentErrors-1].Error != fmt.Sprint(recentErrors+4) {
		t.Fatalf("recent %v", s.Recent)
	}
	if s.ByStatus["400"]+s.ByStatus["401"] != recentErrors+5 {
		t.Fatalf("by status %v, want %d in all", s.ByStatus, recentErrors+5)
	}
}

func TestActivityEndpoint(t *testing.T) {
	ts, _ := newTestServer(t, nil)
	if code, body := do(t, "PUT", ts.URL+"/v1/buffers/cp", "application/json", cartpoleSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	rows := `{"observation": [[1,2,3,4],[1,2,3,4]], "action": [0,1], "next.reward": [1,1], "next.done": [false,true], "next.terminated": [false,true], "next.truncated": [false,false]}`
	if code, b := do(t, "POST", ts.URL+"/v1/buffers/cp/extend", "application/json", rows); code != 200 {
		t.Fatalf("extend: %d %s", code, b)
	}
	if code, b := do(t, "POST", ts.URL+"/v1/buffers/cp/sample", "application/json", `{"batch_size": 3}`); code != 200 {
		t.Fatalf("sample: %d %s", code, b)
	}
	var a activityAnswer
	getJSON(t, ts.URL+"/v1/activity", &a)
	cp, ok := a.Buffers["cp"]
	if !ok || len(cp.T) == 0 {
		t.Fatalf("activity %+v has no points for cp", a)
	}
	last := len(cp.T) - 1
	if cp.WriteCount[last] != 2 || cp.Size[last] != 2 || cp.SamplesServed[last] != 3 || cp.T[last] > a.Now {
		t.Fatalf("last point t=%d write_count=%v size=%v samples=%v (now %d), want 2 2 3", cp.T[last], cp.WriteCount[last], cp.Size[last], cp.SamplesServed[last], a.Now)
	}
	if len(a.Collectors) != 0 || a.WindowSeconds != 600 {
		t.Fatalf("collectors %v window %d, want none and 600", a.Collectors, a.WindowSeconds)
	}
	getJSON(t, fmt.Sprintf("%s/v1/activity?since=%d", ts.URL, cp.T[last]), &a)
	if got := a.Buffers["cp"]; len(got.T) != 0 {
		t.Fatalf("since the last point: %+v, want nothing newer", got)
	}
}

// The dashboard's files need no token (they hold no data) and come with a
// CSP that allows nothing from elsewhere; the data endpoints still need
// the token.
func TestDashboardFiles(t *testing.T) {
	ts, _ := newTestServer(t, &Options{Token: "secret"})
	for _, c := range []struct {
		path, ctype, contains string
		code                  int
	}{
		{"/", "text/html", `<script type="module" src="/ui/app.js">`, 200},
		{"/ui/", "text/html", "token-dialog", 200},
		{"/ui/app.js", "text/javascript", "parseSafetensors", 200},
		{"/ui/style.css", "text/css", "filmstrip", 200},
		{"/ui/missing.js", "application/json", "no such dashboard file", 404},
		{"/ui/%2e%2e/server.go", "application/json", "no such dashboard file", 404},
	} {
		code, body := do(t, "GET", ts.URL+c.path, "", "")
		if code != c.code || !strings.Contains(string(body), c.contains) {
			t.Errorf("GET %s: %d %.100s; want %d containing %q", c.path, code, body, c.code, c.contains)
		}
	}
	resp, err := ts.Client().Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	for _, p := range []string{"/v1/activity", "/v1/collectors", "/v1/buffers"} {
		if code, _ := do(t, "GET", ts.URL+p, "", ""); code != 401 {
			t.Errorf("GET %s without the token: %d, want 401", p, code)
		}
	}
}
