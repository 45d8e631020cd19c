// Command limits runs the real rbd binary under a hostile load for a
// minute and checks that it answers everything with a bounded cost:
//
//	go run ./bench/limits [-duration 60s] [-clients 200] [-max-memory 536870912] [-rbd PATH] [-json]
//
// While a writer extends a memmap buffer with durability fsync (every row
// derived from a token) and a learner samples it, -clients goroutines
// attack the server in a loop: bodies that declare 60 MiB and send 4 KiB,
// JSON bombs (100,000 nested arrays, huge numbers), 20 MiB JSON extends,
// samplers that ask for 27 MiB answers and never read them (safetensors and
// JSON), creates of 10^10-row buffers, and create/extend/delete churn. A
// prober asks /v1/health every 50 ms.
//
// It fails when: the server stops answering health for 2 s, answers a 5xx
// other than 503 busy/shutting_down or 507, holds more than 1.25 x
// --max-memory of anonymous memory beyond what it held idle, loses or
// tears an acknowledged row, does not exit 0 on SIGTERM, or `rbd verify`
// finds damage. The figures go to docs/reliability.md ("Hostile load").
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rbdb/rbd/internal/loadgen"
	"github.com/rbdb/rbd/internal/testbin"
)

const learnCapacity = 50_000

type stats struct {
	mu     sync.Mutex
	counts map[string]map[string]int // attack -> status -> n
	fails  []string
	nfail  int
}

func (s *stats) count(attack, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts[attack] == nil {
		s.counts[attack] = map[string]int{}
	}
	s.counts[attack][status]++
}

func (s *stats) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nfail++
	if len(s.fails) < 20 {
		s.fails = append(s.fails, fmt.Sprintf(format, args...))
	}
}

type run struct {
	srv   *testbin.Server
	hc    *http.Client
	st    *stats
	acked sync.Map // seq -> token
	next  atomic.Int64
}

func (r *run) do(method, path, ctype string, body []byte, hdr ...string) (int, []byte, error) {
	req, err := http.NewRequest(method, r.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// allowed reports whether an answer's status is one a bounded server may
// give under this load (the attack's own expected status aside).
func allowed(status int, body []byte) bool {
	switch {
	case status < 500:
		return true
	case status == 507:
		return true
	case status == 503:
		return bytes.Contains(body, []byte(`"busy"`)) || bytes.Contains(body, []byte(`"shutting_down"`)) || bytes.Contains(body, []byte(`"not_ready"`))
	}
	return false
}

func (r *run) record(attack string, status int, body []byte, err error) {
	switch {
	case err != nil:
		r.st.count(attack, "conn error")
	default:
		r.st.count(attack, fmt.Sprint(status))
		if !allowed(status, body) {
			r.st.fail("%s: %d %.200s", attack, status, body)
		}
	}
}

func (r *run) writer(ctx context.Context) {
	for ctx.Err() == nil {
		i := r.next.Load()
		first := loadgen.Token(1, i)
		st, body, err := r.do("POST", "/v1/buffers/learn/extend?stream=writer", "application/octet-stream", loadgen.Body(first, 64))
		r.record("writer (fsync extend)", st, body, err)
		if err != nil || st != 200 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var res struct {
			FirstSeq int64 `json:"first_seq"`
		}
		if err := json.Unmarshal(body, &res); err != nil {
			r.st.fail("writer: %v", err)
			return
		}
		for k := range int64(64) {
			r.acked.Store(res.FirstSeq+k, first+k)
		}
		r.next.Add(64)
	}
}

func (r *run) learner(ctx context.Context) {
	for ctx.Err() == nil {
		st, body, err := r.do("POST", "/v1/buffers/learn/sample", "application/json", []byte(`{"batch_size": 256}`))
		r.record("learner (sample 256)", st, body, err)
		if err != nil || st != 200 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		rows, err := loadgen.Check(body)
		if err != nil {
			r.st.fail("learner: %v", err)
		}
		for _, row := range rows {
			if v, ok := r.acked.Load(row.Seq); ok && v.(int64) != row.Token {
				r.st.fail("learner: seq %d holds token %d, acknowledged %d", row.Seq, row.Token, v)
			}
		}
	}
}

// prober asks for health every 50 ms; it returns the failures and the
// worst latency.
func (r *run) prober(ctx context.Context) (probes, failures int, worst time.Duration) {
	hc := &http.Client{Timeout: 2 * time.Second}
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := hc.Get(r.srv.URL + "/v1/health")
		d := time.Since(start)
		probes++
		worst = max(worst, d)
		if err != nil {
			failures++
			r.st.fail("health: no answer within 2s: %v", err)
		} else {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failures++
				r.st.fail("health: %d", resp.StatusCode)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return probes, failures, worst
}

// raw sends a request head (declaring contentLength) and body on a new
// connection, and returns the connection.
func (r *run) raw(method, path string, contentLength int, body []byte, hdr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(r.srv.URL, "http://"), 5*time.Second)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: rbd\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n", method, path, hdr, contentLength)
	_, err = c.Write(body)
	return c, err
}

var bigJSON = func() []byte {
	var b bytes.Buffer
	const n = 500_000 // ~20 MiB
	b.WriteString(`{"observation": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "[%d.5,0.25,0.5,0.75]", i%997)
	}
	ones := strings.TrimSuffix(strings.Repeat("1,", n), ",")
	b.WriteString(`], "action": [` + ones + `], "next.reward": [` + ones + `], "next.done": [` + strings.TrimSuffix(strings.Repeat("0,", n), ",") + `]}`)
	return b.Bytes()
}()

func (r *run) attacker(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(uint64(id), 9))
	scratch := fmt.Sprintf("scratch-%d", id)
	r.do("PUT", "/v1/buffers/"+scratch, "application/json", loadgen.Spec(1000, "memory", ""))
	for k := 0; ctx.Err() == nil; k++ {
		switch a := rng.IntN(8); a {
		case 0: // a body that declares 60 MiB and sends 4 KiB
			c, err := r.raw("POST", "/v1/buffers/learn/extend?stream=x", 60<<20, bytes.Repeat([]byte(" "), 4096), "")
			r.st.count("declared 60 MiB, sent 4 KiB", "held")
			if err == nil {
				sleepCtx(ctx, time.Duration(1000+rng.IntN(2000))*time.Millisecond)
				c.Close()
			}
		case 1: // a JSON bomb: 100,000 nested arrays
			st, body, err := r.do("POST", "/v1/buffers/"+scratch+"/extend", "application/json", []byte(`{"observation": `+strings.Repeat("[", 100_000)+`}`))
			r.record("JSON bomb (100k nested [)", st, body, err)
		case 2: // numbers that overflow
			st, body, err := r.do("POST", "/v1/buffers/learn/sample", "application/json",
				[]byte(`{"sampler": "slice", "num_slices": 4611686018427387905, "slice_len": 4, "keys": [`+strings.Repeat(`"x",`, 10000)+`"y"]}`))
			r.record("overflowing numbers", st, body, err)
		case 3: // a 20 MiB JSON extend
			st, body, err := r.do("POST", "/v1/buffers/"+scratch+"/extend", "application/json", bigJSON)
			r.record("20 MiB JSON extend", st, body, err)
		case 4, 5: // a 27 MiB answer never read
			hdr := ""
			name := "unread 27 MiB answer"
			if a == 5 {
				hdr, name = "Accept: application/json\r\n", "unread JSON answer"
			}
			req := `{"batch_size": 1000}`
			c, err := r.raw("POST", "/v1/buffers/img/sample", len(req), []byte(req), hdr)
			if err != nil {
				r.st.count(name, "conn error")
				continue
			}
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			line := make([]byte, 12)
			if _, err := io.ReadFull(c, line); err != nil {
				r.st.count(name, "conn error")
			} else {
				r.st.count(name, string(line[9:12]))
				if line[9] == '5' && string(line[9:12]) != "503" {
					r.st.fail("%s: status %s", name, line)
				}
			}
			sleepCtx(ctx, 2*time.Second)
			c.Close()
		case 6: // a huge capacity
			st, body, err := r.do("PUT", fmt.Sprintf("/v1/buffers/huge-%d", id), "application/json", loadgen.Spec(10_000_000_000, "memmap", ""))
			r.record("capacity 1e10", st, body, err)
			if st != 507 && st != 503 && err == nil {
				r.st.fail("capacity 1e10 answered %d %.200s", st, body)
			}
		case 7: // create, extend, delete
			name := fmt.Sprintf("churn-%d-%d", id, k)
			st, body, err := r.do("PUT", "/v1/buffers/"+name, "application/json", loadgen.Spec(500, "memmap", ""))
			r.record("create/extend/delete", st, body, err)
			if st == 201 {
				st, body, err = r.do("POST", "/v1/buffers/"+name+"/extend", "application/octet-stream", loadgen.Body(loadgen.Token(9, 0), 100))
				r.record("create/extend/delete", st, body, err)
				st, body, err = r.do("DELETE", "/v1/buffers/"+name, "", nil)
				r.record("create/extend/delete", st, body, err)
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// checkAcked reads every live row of "learn" and checks that each
// acknowledged seq in the window holds its token.
func (r *run) checkAcked() (checked, lost int) {
	lo, seen, err := loadgen.ReadWindow(func(path string) (int, []byte, error) { return r.do("GET", path, "", nil) }, "learn", learnCapacity)
	if err != nil {
		r.st.fail("read back: %v", err)
	}
	r.acked.Range(func(k, v any) bool {
		s := k.(int64)
		if s < lo {
			return true
		}
		checked++
		if got, ok := seen[s]; !ok || got != v.(int64) {
			lost++
			if lost <= 5 {
				r.st.fail("acknowledged seq %d (token %d): read back %d (present %v)", s, v, got, ok)
			}
		}
		return true
	})
	return checked, lost
}

type result struct {
	Duration       float64                   `json:"seconds"`
	Clients        int                       `json:"clients"`
	MaxMemory      int64                     `json:"max_memory"`
	Answers        map[string]map[string]int `json:"answers"`
	HealthProbes   int                       `json:"health_probes"`
	HealthFailures int                       `json:"health_failures"`
	HealthWorstMS  float64                   `json:"health_worst_ms"`
	IdleAnonMiB    float64                   `json:"idle_rss_anon_mib"`
	PeakAnonMiB    float64                   `json:"peak_rss_anon_mib"`
	PeakVmRSSMiB   float64                   `json:"peak_vm_rss_mib"`
	RowsAcked      int64                     `json:"rows_acknowledged"`
	RowsChecked    int                       `json:"rows_checked"`
	RowsLost       int                       `json:"rows_lost"`
	ExitCode       int                       `json:"exit_code"`
	VerifyOK       bool                      `json:"verify_ok"`
	Failures       []string                  `json:"failures,omitempty"`
}

func main() {
	dur := flag.Duration("duration", 60*time.Second, "how long the attack lasts")
	clients := flag.Int("clients", 200, "hostile clients")
	maxMemory := flag.Int64("max-memory", 512<<20, "the server's --max-memory")
	bin := flag.String("rbd", "", "rbd binary (default: build ./cmd/rbd)")
	jsonOut := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	res, err := attack(*dur, *clients, *maxMemory, *bin)
	if err == nil {
		report(res, *jsonOut)
	}
	if err != nil || len(res.Failures) > 0 {
		for _, f := range res.Failures {
			fmt.Fprintln(os.Stderr, "FAIL:", f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "limits:", err)
		}
		os.Exit(1)
	}
}

func attack(dur time.Duration, clients int, maxMemory int64, bin string) (result, error) {
	res := result{Duration: dur.Seconds(), Clients: clients, MaxMemory: maxMemory}
	tmp, err := os.MkdirTemp("", "rbd-limits-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	if bin == "" {
		if bin, err = testbin.BuildRbd(tmp); err != nil {
			return res, err
		}
	}
	data := filepath.Join(tmp, "data")
	srv, err := testbin.StartServer(bin, data, time.Minute, "--max-memory", fmt.Sprint(maxMemory))
	if err != nil {
		return res, err
	}
	defer func() {
		if !srv.Exited() {
			srv.Kill()
		}
	}()
	r := &run{srv: srv, st: &stats{counts: map[string]map[string]int{}},
		hc: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: clients + 8}}}
	if st, body, err := r.do("PUT", "/v1/buffers/learn", "application/json", loadgen.Spec(learnCapacity, "memmap", `, "durability": "fsync"`)); err != nil || st != 201 {
		return res, fmt.Errorf("create learn: %d %s %v", st, body, err)
	}
	if err := fillImages(r); err != nil {
		return res, err
	}
	time.Sleep(500 * time.Millisecond)
	idle, _, _ := srv.Memory()
	res.IdleAnonMiB = float64(idle) / (1 << 20)

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { r.writer(ctx) })
	wg.Go(func() { r.learner(ctx) })
	wg.Go(func() {
		p, f, w := r.prober(ctx)
		res.HealthProbes, res.HealthFailures, res.HealthWorstMS = p, f, float64(w.Microseconds())/1000
	})
	for id := range clients {
		wg.Go(func() { r.attacker(ctx, id) })
	}
	var peakAnon, peakTotal int64
	tick := time.NewTicker(20 * time.Millisecond)
	for done := false; !done; {
		select {
		case <-tick.C:
			if a, t, err := srv.Memory(); err == nil {
				peakAnon, peakTotal = max(peakAnon, a), max(peakTotal, t)
			}
		case <-ctx.Done():
			done = true
		}
	}
	tick.Stop()
	wg.Wait()
	res.PeakAnonMiB, res.PeakVmRSSMiB = float64(peakAnon)/(1<<20), float64(peakTotal)/(1<<20)
	if bound := idle + maxMemory + maxMemory/4; peakAnon > bound {
		r.st.fail("peak RssAnon %d MiB is more than idle %d MiB + 1.25 x --max-memory (%d MiB)", peakAnon>>20, idle>>20, (maxMemory+maxMemory/4)>>20)
	}
	r.acked.Range(func(any, any) bool { res.RowsAcked++; return true })
	res.RowsChecked, res.RowsLost = r.checkAcked()
	code, err := srv.Stop(syscall.SIGTERM, time.Minute)
	res.ExitCode = code
	if err != nil || code != 0 {
		r.st.fail("SIGTERM: exit %d %v\n%s", code, err, tail(srv.Stderr.String()))
	}
	out, err := exec.Command(bin, "verify", data).CombinedOutput()
	res.VerifyOK = err == nil
	if err != nil {
		r.st.fail("rbd verify: %v\n%s", err, out)
	}
	r.st.mu.Lock()
	res.Answers, res.Failures = r.st.counts, r.st.fails
	if r.st.nfail > len(r.st.fails) {
		res.Failures = append(res.Failures, fmt.Sprintf("... %d failures in all", r.st.nfail))
	}
	r.st.mu.Unlock()
	return res, nil
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// fillImages creates "img" (memory, 84x84x4 uint8) and fills it, so that
// 1000-row answers (27 MiB) exist.
func fillImages(r *run) error {
	spec := `{"capacity": 3000, "storage": "memory", "fields": {"observation": {"dtype": "uint8", "shape": [84, 84, 4]}, "next.done": {"dtype": "bool", "shape": []}}}`
	if st, body, err := r.do("PUT", "/v1/buffers/img", "application/json", []byte(spec)); err != nil || st != 201 {
		return fmt.Errorf("create img: %d %s %v", st, body, err)
	}
	for range 6 {
		const n = 500
		obs := bytes.Repeat([]byte{7}, n*84*84*4)
		done := make([]byte, n)
		done[n-1] = 1
		hdr := fmt.Sprintf(`{"observation":{"dtype":"U8","shape":[%d,84,84,4],"data_offsets":[0,%d]},"next.done":{"dtype":"BOOL","shape":[%d],"data_offsets":[%d,%d]}}`,
			n, len(obs), n, len(obs), len(obs)+n)
		for len(hdr)%8 != 0 {
			hdr += " "
		}
		body := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		body = append(append(append(body, hdr...), obs...), done...)
		if st, b, err := r.do("POST", "/v1/buffers/img/extend?stream=fill", "application/octet-stream", body); err != nil || st != 200 {
			return fmt.Errorf("fill img: %d %s %v", st, b, err)
		}
	}
	return nil
}

func report(res result, jsonOut bool) {
	if jsonOut {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Printf("%d hostile clients for %.0fs against rbd serve --max-memory %d MiB\n\n", res.Clients, res.Duration, res.MaxMemory>>20)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "attack\tanswers")
	var names []string
	for n := range res.Answers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		var parts []string
		var codes []string
		for c := range res.Answers[n] {
			codes = append(codes, c)
		}
		slices.Sort(codes)
		for _, c := range codes {
			parts = append(parts, fmt.Sprintf("%s x%d", c, res.Answers[n][c]))
		}
		fmt.Fprintf(tw, "%s\t%s\n", n, strings.Join(parts, ", "))
	}
	tw.Flush()
	fmt.Printf("\nhealth: %d probes, %d without an answer in 2s, worst %.0f ms\n", res.HealthProbes, res.HealthFailures, res.HealthWorstMS)
	fmt.Printf("memory: RssAnon idle %.0f MiB, peak %.0f MiB (bound idle + 1.25 x %d MiB); peak VmRSS %.0f MiB\n",
		res.IdleAnonMiB, res.PeakAnonMiB, res.MaxMemory>>20, res.PeakVmRSSMiB)
	fmt.Printf("rows: %d acknowledged under fsync, %d still live checked byte for byte, %d lost\n", res.RowsAcked, res.RowsChecked, res.RowsLost)
	fmt.Printf("SIGTERM: exit %d; rbd verify: %v\n", res.ExitCode, map[bool]string{true: "clean", false: "DAMAGE"}[res.VerifyOK])

}
