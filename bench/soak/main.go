// Command soak runs the real rbd binary through cycles of mixed load and
// kill -9 restarts, and checks after every cycle that nothing acknowledged
// was lost:
//
//	go run ./bench/soak [-cycles 6] [-cycle 30s] [-rbd PATH] [-json]
//
// Each cycle starts `rbd serve` on the data dir, runs for -cycle:
//   - 2 writers extending a memmap buffer with durability fsync, every row
//     derived from a token, every acknowledged seq recorded;
//   - 2 samplers (uniform on it, prioritised on a memory buffer whose
//     priorities they update), checking every row against its token;
//   - stream churn (new stream names, closed again) and create/extend/
//     sample/delete churn of small buffers;
//   - one hot checkpoint of the fsync buffer, which `rbd verify` must find
//     clean;
//
// then kills the server with SIGKILL, runs `rbd verify` on the data dir
// (exit 0: a torn tail is what a crash leaves), restarts it and reads back
// every acknowledged row still in the ring, byte for byte. Resident memory
// is sampled through each cycle; it must not grow from the middle of a
// cycle to its end by more than 20% + 16 MiB.
//
// The figures go to docs/reliability.md ("Soak").
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/loadgen"
	"github.com/rbdb/rbd/internal/testbin"
)

const (
	capacity  = 20000
	batchRows = 64
)

var (
	fsSpec    = loadgen.Spec(capacity, "memmap", `, "durability": "fsync"`)
	memSpec   = loadgen.Spec(5000, "memory", `, "priority": {}`)
	churnSpec = loadgen.Spec(500, "memmap", "")
)

type harness struct {
	bin    string
	data   string
	root   string
	srv    *testbin.Server
	hc     *http.Client
	acked  sync.Map // seq (int64) -> token (int64): rows acknowledged under fsync
	maxAck atomic.Int64
	next   [2]atomic.Int64 // next token index per writer
	fails  atomic.Int64
	logMu  sync.Mutex
	log    []string
}

func (h *harness) failf(format string, args ...any) {
	h.fails.Add(1)
	h.logMu.Lock()
	defer h.logMu.Unlock()
	if len(h.log) < 20 {
		h.log = append(h.log, fmt.Sprintf(format, args...))
	}
}

// request sends one request and returns the status and body; transport
// errors are -1 (the server is being killed at the end of a cycle).
func (h *harness) request(method, path, ctype string, body []byte) (int, []byte) {
	req, err := http.NewRequest(method, h.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return -1, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1, nil
	}
	return resp.StatusCode, data
}

// writer extends "fs" with its tokens until ctx ends, recording every
// acknowledged row.
func (h *harness) writer(ctx context.Context, w int, rows *atomic.Int64) {
	for ctx.Err() == nil {
		i := h.next[w].Load()
		first := loadgen.Token(int64(w), i)
		st, body := h.request("POST", fmt.Sprintf("/v1/buffers/fs/extend?stream=w%d", w), "application/octet-stream", loadgen.Body(first, batchRows))
		switch st {
		case 200:
		case -1, 503:
			continue // killed, or busy: the same rows again
		default:
			h.failf("writer %d: extend answered %d %s", w, st, body)
			return
		}
		var res struct {
			FirstSeq int64 `json:"first_seq"`
		}
		if err := json.Unmarshal(body, &res); err != nil {
			h.failf("writer %d: %v", w, err)
			return
		}
		for k := range int64(batchRows) {
			h.acked.Store(res.FirstSeq+k, first+k)
		}
		for m := h.maxAck.Load(); res.FirstSeq+batchRows-1 > m && !h.maxAck.CompareAndSwap(m, res.FirstSeq+batchRows-1); m = h.maxAck.Load() {
		}
		h.next[w].Add(batchRows)
		rows.Add(batchRows)
	}
}

// checkRows checks rows of a safetensors answer (loadgen.Check) and, for
// rows of "fs", that an acknowledged seq holds the token written there.
// It returns the number of rows checked.
func (h *harness) checkRows(where string, body []byte, fsRows bool) int {
	rows, err := loadgen.Check(body)
	if err != nil {
		h.failf("%s: %v", where, err)
	}
	for _, r := range rows {
		if v, ok := h.acked.Load(r.Seq); fsRows && ok && v.(int64) != r.Token {
			h.failf("%s: seq %d holds token %d, acknowledged as %d", where, r.Seq, r.Token, v)
		}
	}
	return len(rows)
}

func (h *harness) sampler(ctx context.Context, prioritized bool, n *atomic.Int64) {
	for ctx.Err() == nil {
		buf, req := "fs", `{"batch_size": 64}`
		if prioritized {
			buf, req = "mem", `{"batch_size": 64, "sampler": "prioritized"}`
		}
		st, body := h.request("POST", "/v1/buffers/"+buf+"/sample", "application/json", []byte(req))
		switch st {
		case 200:
			n.Add(int64(h.checkRows("sample "+buf, body, !prioritized)))
			if prioritized {
				h.updatePriorities(body)
			}
		case -1, 503:
		default:
			h.failf("sample %s answered %d %s", buf, st, body)
			return
		}
	}
}

func (h *harness) updatePriorities(body []byte) {
	ts, _, err := codec.DecodeSafetensors(body)
	if err != nil {
		return
	}
	for _, t := range ts {
		if t.Name != "seq" {
			continue
		}
		var seqs, prios []string
		for j := 0; j < len(t.Data); j += 8 {
			s := int64(binary.LittleEndian.Uint64(t.Data[j:]))
			seqs = append(seqs, fmt.Sprint(s))
			prios = append(prios, fmt.Sprint(float64(s%5)+0.5))
		}
		st, b := h.request("POST", "/v1/buffers/mem/priorities", "application/json",
			[]byte(`{"seq": [`+strings.Join(seqs, ",")+`], "priority": [`+strings.Join(prios, ",")+`]}`))
		if st != 200 && st != -1 && st != 503 {
			h.failf("priorities answered %d %s", st, b)
		}
	}
}

// churn opens and closes streams and creates, fills and deletes buffers.
func (h *harness) churn(ctx context.Context, cycle int, ops *atomic.Int64) {
	for k := 0; ctx.Err() == nil; k++ {
		stream := fmt.Sprintf("churn-%d-%d", cycle, k)
		name := fmt.Sprintf("tmp-%d-%d", cycle, k)
		steps := []struct {
			method, path, ctype string
			body                []byte
			ok                  []int
		}{
			{"POST", "/v1/buffers/mem/extend?stream=" + stream, "application/octet-stream", loadgen.Body(loadgen.Token(7, int64(k*8)), 8), []int{200}},
			{"DELETE", "/v1/buffers/mem/streams/" + stream, "", nil, []int{200}},
			{"PUT", "/v1/buffers/" + name, "application/json", churnSpec, []int{201}},
			{"POST", "/v1/buffers/" + name + "/extend", "application/octet-stream", loadgen.Body(loadgen.Token(8, 0), 100), []int{200}},
			{"POST", "/v1/buffers/" + name + "/sample", "application/json", []byte(`{"batch_size": 16}`), []int{200}},
			{"DELETE", "/v1/buffers/" + name, "", nil, []int{204}},
		}
		for _, s := range steps {
			st, body := h.request(s.method, s.path, s.ctype, s.body)
			if st == -1 || st == 503 {
				break
			}
			if st != s.ok[0] {
				h.failf("churn %s %s answered %d %s", s.method, s.path, st, body)
				return
			}
			ops.Add(1)
		}
	}
}

// checkpoint takes a hot checkpoint of "fs" and verifies it.
func (h *harness) checkpoint(cycle int) (rows int64, ok bool) {
	dir := fmt.Sprintf("cycle-%d", cycle)
	st, body := h.request("POST", "/v1/buffers/fs/checkpoint", "application/json", []byte(`{"dir": "`+dir+`"}`))
	if st != 200 {
		h.failf("checkpoint answered %d %s", st, body)
		return 0, false
	}
	var res struct {
		Rows int64 `json:"rows"`
	}
	json.Unmarshal(body, &res)
	out, err := exec.Command(h.bin, "verify", filepath.Join(h.root, dir)).CombinedOutput()
	if err != nil {
		h.failf("rbd verify of checkpoint %s: %v\n%s", dir, err, out)
		return res.Rows, false
	}
	return res.Rows, true
}

// readBack reads every live row of "fs" and checks each acknowledged seq
// in the window is there with its token. It returns rows checked and lost.
func (h *harness) readBack() (checked, lost int64) {
	lo, seen, err := loadgen.ReadWindow(func(path string) (int, []byte, error) {
		st, body := h.request("GET", path, "", nil)
		return st, body, nil
	}, "fs", capacity)
	if err != nil {
		h.failf("read back after restart: %v", err)
	}
	for s := lo; s <= h.maxAck.Load(); s++ {
		v, ok := h.acked.Load(s)
		if !ok {
			continue
		}
		checked++
		if got, present := seen[s]; !present || got != v.(int64) {
			lost++
			if lost <= 5 {
				h.failf("acknowledged seq %d (token %d, fsync) read back as %d (present %v) after kill -9 (window from %d)", s, v, got, present, lo)
			}
		}
	}
	return checked, lost
}

type cycleResult struct {
	Cycle         int     `json:"cycle"`
	RowsWritten   int64   `json:"rows_written"`
	RowsSampled   int64   `json:"rows_sampled"`
	ChurnOps      int64   `json:"churn_ops"`
	Checkpoint    int64   `json:"checkpoint_rows"`
	VerifyOK      bool    `json:"verify_ok"`
	RowsChecked   int64   `json:"rows_checked"`
	RowsLost      int64   `json:"rows_lost"`
	RSSMidMiB     float64 `json:"rss_anon_mid_mib"`
	RSSEndMiB     float64 `json:"rss_anon_end_mib"`
	RSSPeakMiB    float64 `json:"rss_anon_peak_mib"`
	VmRSSPeakMiB  float64 `json:"vm_rss_peak_mib"`
	RestartSecond float64 `json:"restart_seconds"`
}

func main() {
	cycles := flag.Int("cycles", 6, "kill -9 / restart cycles")
	cycleDur := flag.Duration("cycle", 30*time.Second, "load per cycle")
	bin := flag.String("rbd", "", "rbd binary (default: build ./cmd/rbd)")
	jsonOut := flag.Bool("json", false, "print the results as JSON")
	flag.Parse()
	if err := run(*cycles, *cycleDur, *bin, *jsonOut); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(cycles int, cycleDur time.Duration, bin string, jsonOut bool) error {
	tmp, err := os.MkdirTemp("", "rbd-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if bin == "" {
		if bin, err = testbin.BuildRbd(tmp); err != nil {
			return err
		}
	}
	h := &harness{bin: bin, data: filepath.Join(tmp, "data"), root: filepath.Join(tmp, "checkpoints"),
		hc: &http.Client{Timeout: 30 * time.Second}}
	var results []cycleResult
	start := time.Now()
	for c := 1; c <= cycles; c++ {
		r, err := h.cycle(c, cycleDur)
		results = append(results, r)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "cycle %d/%d: %d rows written, %d checked after kill -9, %d lost, RssAnon %.0f -> %.0f MiB\n",
			c, cycles, r.RowsWritten, r.RowsChecked, r.RowsLost, r.RSSMidMiB, r.RSSEndMiB)
	}
	// The last kill -9 is checked too, and the server then stops cleanly.
	srv, err := testbin.StartServer(h.bin, h.data, time.Minute, "--checkpoint-root", h.root)
	if err != nil {
		return err
	}
	h.srv = srv
	final := cycleResult{Cycle: cycles + 1, VerifyOK: true}
	final.RowsChecked, final.RowsLost = h.readBack()
	if code, err := srv.Stop(syscall.SIGTERM, time.Minute); err != nil || code != 0 {
		h.failf("final SIGTERM: exit %d %v", code, err)
	}
	results = append(results, final)
	report(results, time.Since(start), jsonOut)
	h.logMu.Lock()
	defer h.logMu.Unlock()
	for _, l := range h.log {
		fmt.Fprintln(os.Stderr, "FAIL:", l)
	}
	var errs []error
	for _, r := range results {
		if r.RowsLost > 0 || !r.VerifyOK {
			errs = append(errs, fmt.Errorf("cycle %d: %d rows lost, verify ok %v", r.Cycle, r.RowsLost, r.VerifyOK))
		}
		if r.RSSEndMiB > r.RSSMidMiB*1.2+16 {
			errs = append(errs, fmt.Errorf("cycle %d: resident memory grew from %.0f to %.0f MiB in the second half", r.Cycle, r.RSSMidMiB, r.RSSEndMiB))
		}
	}
	if n := h.fails.Load(); n > 0 {
		errs = append(errs, fmt.Errorf("%d failed checks", n))
	}
	return errors.Join(errs...)
}

func (h *harness) cycle(c int, dur time.Duration) (cycleResult, error) {
	r := cycleResult{Cycle: c}
	t0 := time.Now()
	srv, err := testbin.StartServer(h.bin, h.data, time.Minute, "--checkpoint-root", h.root, "--max-memory", fmt.Sprint(256<<20))
	if err != nil {
		return r, err
	}
	h.srv = srv
	r.RestartSecond = time.Since(t0).Seconds()
	if c == 1 {
		for _, b := range []struct {
			name string
			spec []byte
		}{{"fs", fsSpec}, {"mem", memSpec}} {
			if st, body := h.request("PUT", "/v1/buffers/"+b.name, "application/json", b.spec); st != 201 {
				srv.Kill()
				return r, fmt.Errorf("create %s: %d %s", b.name, st, body)
			}
		}
	} else {
		r.RowsChecked, r.RowsLost = h.readBack()
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var written, sampled, ops atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() { h.writer(ctx, w, &written) })
	}
	wg.Go(func() { h.sampler(ctx, false, &sampled) })
	wg.Go(func() { h.sampler(ctx, true, &sampled) })
	wg.Go(func() { h.churn(ctx, c, &ops) })
	var peakAnon, peakTotal, mid int64
	sample := func() {
		if a, t, err := srv.Memory(); err == nil {
			peakAnon, peakTotal = max(peakAnon, a), max(peakTotal, t)
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	half := time.After(dur / 2)
	cpAt := time.After(dur * 3 / 4)
loop:
	for {
		select {
		case <-tick.C:
			sample()
		case <-half:
			mid, _, _ = srv.Memory()
		case <-cpAt:
			r.Checkpoint, _ = h.checkpoint(c)
		case <-ctx.Done():
			break loop
		}
	}
	tick.Stop()
	end, _, _ := srv.Memory()
	// kill -9 while the writers may still be mid-request.
	srv.Kill()
	wg.Wait()
	r.RowsWritten, r.RowsSampled, r.ChurnOps = written.Load(), sampled.Load(), ops.Load()
	r.RSSMidMiB, r.RSSEndMiB = float64(mid)/(1<<20), float64(end)/(1<<20)
	r.RSSPeakMiB, r.VmRSSPeakMiB = float64(peakAnon)/(1<<20), float64(peakTotal)/(1<<20)
	out, err := exec.Command(h.bin, "verify", h.data).CombinedOutput()
	r.VerifyOK = err == nil
	if err != nil {
		h.failf("rbd verify after kill -9 in cycle %d: %v\n%s", c, err, out)
	}
	return r, nil
}

func report(rs []cycleResult, took time.Duration, jsonOut bool) {
	if jsonOut {
		json.NewEncoder(os.Stdout).Encode(map[string]any{"cycles": rs, "seconds": took.Seconds()})
		return
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cycle\trows written\trows sampled\tchurn ops\tcheckpoint rows\tverify after kill -9\trows checked\trows lost\tRssAnon mid MiB\tRssAnon end MiB\tpeak RssAnon MiB\tpeak VmRSS MiB\trestart s\t")
	var written, checked, lost int64
	for _, r := range rs {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%v\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t\n", r.Cycle, r.RowsWritten, r.RowsSampled, r.ChurnOps,
			r.Checkpoint, r.VerifyOK, r.RowsChecked, r.RowsLost, r.RSSMidMiB, r.RSSEndMiB, r.RSSPeakMiB, r.VmRSSPeakMiB, r.RestartSecond)
		written, checked, lost = written+r.RowsWritten, checked+r.RowsChecked, lost+r.RowsLost
	}
	tw.Flush()
	fmt.Printf("%d cycles in %v: %d rows written under fsync, %d read back after kill -9, %d lost\n", len(rs), took.Round(time.Second), written, checked, lost)
}
