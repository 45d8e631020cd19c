// Command httpbench measures rbd's HTTP sample and extend throughput on
// loopback, each next to a raw loopback baseline for the same body size
// measured in the same run.
//
//	go run ./bench/httpbench            # about 45 seconds
//	go run ./bench/httpbench -short     # about 10 seconds
//
// It starts an rbd server in-process on 127.0.0.1 (memory buffers in a
// temporary data dir), fills one compact buffer per workload, and then, for
// each workload and connection count, samples batches for -duration with
// plain net/http keep-alive clients (one connection per goroutine, answers
// read into a reused buffer). The raw baseline is a second loopback server
// whose handler writes a prebuilt body (a real answer captured once) with
// the same client code and connection count. See bench/README.md for the
// columns.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/benchdata"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

type options struct {
	duration    time.Duration
	short       bool
	batch       int
	conns       []int
	cartpoleCap int
	atariCap    int
	workloads   []string
	extendKinds []string
	jsonOut     bool
}

type workload struct {
	name     string
	obsShape []int
	obsDType string
	capacity int
}

// result is one line of the table.
type result struct {
	Test       string  `json:"test"` // "sample" or "extend"
	Workload   string  `json:"workload"`
	Kind       string  `json:"kind"`
	Conns      int     `json:"conns"`
	BodyBytes  int     `json:"body_bytes"`
	Requests   int64   `json:"requests"`
	PerSec     float64 `json:"requests_per_s"`
	GBs        float64 `json:"gb_per_s"`
	RawPerSec  float64 `json:"raw_requests_per_s"`
	RawGBs     float64 `json:"raw_gb_per_s"`
	Ratio      float64 `json:"ratio"`
	RowsPerSec float64 `json:"rows_per_s,omitempty"`
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("httpbench", flag.ContinueOnError)
	var o options
	var conns, workloads, kinds string
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measuring time per line (and per baseline)")
	fs.BoolVar(&o.short, "short", false, "quick run (~10 s): -duration 400ms and small buffers unless set explicitly")
	fs.IntVar(&o.batch, "batch", 256, "rows per sample answer and per extend request")
	fs.StringVar(&conns, "conns", "1,4", "comma-separated connection counts")
	fs.IntVar(&o.cartpoleCap, "cartpole-capacity", 100_000, "rows in the cartpole buffer")
	fs.IntVar(&o.atariCap, "atari-capacity", 8_192, "rows in the atari buffer (28,239 B each)")
	fs.StringVar(&workloads, "workloads", "cartpole,atari", "comma-separated sample workloads")
	fs.StringVar(&kinds, "extend-kinds", "memory", "comma-separated storage kinds for the extend lines (memory, memmap)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON lines instead of a table")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.short {
		if !set["duration"] {
			o.duration = 400 * time.Millisecond
		}
		if !set["cartpole-capacity"] {
			o.cartpoleCap = 10_000
		}
		if !set["atari-capacity"] {
			o.atariCap = 1_024
		}
	}
	for _, s := range strings.Split(conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return o, fmt.Errorf("-conns: %q is not a positive integer", s)
		}
		o.conns = append(o.conns, n)
	}
	o.workloads = strings.Split(workloads, ",")
	for _, w := range o.workloads {
		if w != "cartpole" && w != "atari" {
			return o, fmt.Errorf("-workloads: unknown workload %q (cartpole, atari)", w)
		}
	}
	if kinds != "" {
		o.extendKinds = strings.Split(kinds, ",")
	}
	for _, k := range o.extendKinds {
		if k != "memory" && k != "memmap" {
			return o, fmt.Errorf("-extend-kinds: unknown kind %q (memory, memmap)", k)
		}
	}
	if o.batch < 8 || o.batch%8 != 0 {
		return o, fmt.Errorf("-batch: %d must be a positive multiple of 8 (8 envs per batch)", o.batch)
	}
	if o.duration <= 0 {
		return o, errors.New("-duration must be positive")
	}
	return o, nil
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "httpbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := rbd.Open(dir, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	base, stop, err := serve(server.New(db, nil).Handler())
	if err != nil {
		return err
	}
	defer stop()

	machine := fmt.Sprintf("%s, GOMAXPROCS %d, %v per line; memcpy 64 MiB: %.1f GB/s",
		runtime.Version(), runtime.GOMAXPROCS(0), o.duration, memcpyGBs())
	fmt.Fprintln(os.Stderr, "httpbench:", machine)
	var results []result
	for _, name := range o.workloads {
		w := workload{name: "cartpole", obsShape: []int{4}, obsDType: "float32", capacity: o.cartpoleCap}
		if name == "atari" {
			w = workload{name: "atari", obsShape: []int{84, 84, 4}, obsDType: "uint8", capacity: o.atariCap}
		}
		rs, err := sampleLines(db, base, w, o)
		if err != nil {
			return fmt.Errorf("sample %s: %w", w.name, err)
		}
		results = append(results, rs...)
	}
	for _, kind := range o.extendKinds {
		rs, err := extendLines(db, base, kind, o)
		if err != nil {
			return fmt.Errorf("extend %s: %w", kind, err)
		}
		results = append(results, rs...)
	}
	return report(os.Stdout, machine, results, o)
}

// serve runs h on a loopback listener.
func serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() { srv.Close() }, nil
}

// rawServer answers every request with body (after reading the request).
func rawServer(body []byte, ctype string) (string, func(), error) {
	n := strconv.Itoa(len(body))
	return serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ctype)
		w.Header().Set("Content-Length", n)
		_, _ = w.Write(body)
	}))
}

func spec(w workload, kind string, capacity int) (storage.Spec, error) {
	shape, _ := json.Marshal(w.obsShape)
	return storage.ParseSpec([]byte(fmt.Sprintf(`{"capacity": %d, "storage": %q,
	 "fields": {"observation": {"dtype": %q, "shape": %s},
	            "action": {"dtype": "int64", "shape": []},
	            "next.reward": {"dtype": "float32", "shape": []},
	            "next.done": {"dtype": "bool", "shape": []},
	            "next.terminated": {"dtype": "bool", "shape": []},
	            "next.truncated": {"dtype": "bool", "shape": []}},
	 "compact_obs": true, "obs_keys": ["observation"]}`, capacity, kind, w.obsDType, shape)))
}

const (
	envs    = 8   // envs interleaved in one batch
	episode = 200 // steps per episode
)

// batchTensors is batch k of a stream (see benchdata.Batch).
func batchTensors(w workload, n, k int) []codec.Tensor {
	return benchdata.Batch(w.obsDType, w.obsShape, n, k, envs, episode)
}

// measure runs req on conns goroutines (one connection each): a short
// untimed warm-up, then as many requests as fit in d. It returns the
// requests done and the time they took.
func measure(conns int, d time.Duration, req func(conn int, buf *[]byte) error) (int64, time.Duration, error) {
	bufs := make([][]byte, conns)
	var firstErr atomic.Pointer[error]
	loop := func(d time.Duration) int64 {
		var done atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		for c := range conns {
			wg.Go(func() {
				for firstErr.Load() == nil {
					if err := req(c, &bufs[c]); err != nil {
						firstErr.CompareAndSwap(nil, &err)
						return
					}
					done.Add(1)
					if !time.Now().Before(deadline) {
						return
					}
				}
			})
		}
		wg.Wait()
		return done.Load()
	}
	loop(min(d/4, 250*time.Millisecond))
	start := time.Now()
	n := loop(d)
	elapsed := time.Since(start)
	if p := firstErr.Load(); p != nil {
		return 0, 0, *p
	}
	return n, elapsed, nil
}

func sampleLines(db *rbd.DB, base string, w workload, o options) ([]result, error) {
	s, err := spec(w, "memory", w.capacity)
	if err != nil {
		return nil, err
	}
	name := "sample-" + w.name
	buf, _, err := db.CreateBuffer(name, s)
	if err != nil {
		return nil, err
	}
	for k := 0; k <= w.capacity/o.batch; k++ {
		if _, err := buf.Extend("fill", benchdata.StorageBatch(batchTensors(w, o.batch, k), o.batch)); err != nil {
			return nil, err
		}
	}
	url := base + "/v1/buffers/" + name + "/sample"
	req := []byte(fmt.Sprintf(`{"batch_size": %d}`, o.batch))
	var answer []byte
	n, err := benchdata.Post(benchdata.Client(1), url, "application/json", req, &answer)
	if err != nil {
		return nil, err
	}
	answer = answer[:n]
	if _, _, err := codec.DecodeSafetensors(answer); err != nil {
		return nil, err
	}
	raw, stop, err := rawServer(answer, "application/octet-stream")
	if err != nil {
		return nil, err
	}
	defer stop()

	var out []result
	for _, conns := range o.conns {
		r := result{Test: "sample", Workload: fmt.Sprintf("%s %d", w.name, o.batch), Kind: "memory", Conns: conns, BodyBytes: n}
		for _, target := range []string{raw, url} {
			hc := benchdata.Client(conns)
			cnt, el, err := measure(conns, o.duration, func(_ int, buf *[]byte) error {
				m, err := benchdata.Post(hc, target, "application/json", req, buf)
				if err == nil && m != n {
					err = fmt.Errorf("answer of %d bytes, want %d", m, n)
				}
				return err
			})
			hc.CloseIdleConnections()
			if err != nil {
				return nil, err
			}
			perSec := float64(cnt) / el.Seconds()
			if target == raw {
				r.RawPerSec, r.RawGBs = perSec, perSec*float64(n)/1e9
			} else {
				r.Requests, r.PerSec, r.GBs = cnt, perSec, perSec*float64(n)/1e9
			}
		}
		r.Ratio = r.GBs / r.RawGBs
		r.RowsPerSec = r.PerSec * float64(o.batch)
		out = append(out, r)
		fmt.Fprintf(os.Stderr, "  sample %s conns=%d: %.0f batches/s\n", w.name, conns, r.PerSec)
	}
	if err := db.DeleteBuffer(name); err != nil {
		return nil, err
	}
	return out, nil
}

func extendLines(db *rbd.DB, base, kind string, o options) ([]result, error) {
	w := workload{name: "cartpole", obsShape: []int{4}, obsDType: "float32"}
	// Enough batches for whole episodes in every env, so that cycling
	// through them continues each env's episodes seamlessly.
	perEnv := o.batch / envs
	cycle := 1
	for (cycle*perEnv)%episode != 0 {
		cycle++
	}
	bodies := make([][]byte, cycle)
	size := 0
	for k := range bodies {
		var err error
		if bodies[k], err = codec.EncodeSafetensors(batchTensors(w, o.batch, k), nil); err != nil {
			return nil, err
		}
		size += len(bodies[k])
	}
	raw, stop, err := rawServer([]byte(fmt.Sprintf(`{"first_seq":0,"rows":%d,"write_count":%d}`+"\n", o.batch, o.batch)), "application/json")
	if err != nil {
		return nil, err
	}
	defer stop()
	var out []result
	for _, conns := range o.conns {
		name := fmt.Sprintf("extend-%s-%d", kind, conns)
		s, err := spec(w, kind, 100_000)
		if err != nil {
			return nil, err
		}
		if _, _, err := db.CreateBuffer(name, s); err != nil {
			return nil, err
		}
		r := result{Test: "extend", Workload: fmt.Sprintf("cartpole %d", o.batch), Kind: kind, Conns: conns, BodyBytes: size / len(bodies)}
		if kind == "memmap" {
			r.Kind = "memmap (flush)"
		}
		for _, target := range []string{raw, base + "/v1/buffers/" + name + "/extend?stream=actor-"} {
			hc := benchdata.Client(conns)
			sent := make([]int, conns)
			cnt, el, err := measure(conns, o.duration, func(c int, buf *[]byte) error {
				k := sent[c] % len(bodies)
				sent[c]++
				u := target
				if target != raw {
					u += strconv.Itoa(c)
				}
				_, err := benchdata.Post(hc, u, "application/octet-stream", bodies[k], buf)
				return err
			})
			hc.CloseIdleConnections()
			if err != nil {
				return nil, err
			}
			perSec := float64(cnt) / el.Seconds()
			if target == raw {
				r.RawPerSec, r.RawGBs = perSec, perSec*float64(r.BodyBytes)/1e9
			} else {
				r.Requests, r.PerSec, r.GBs = cnt, perSec, perSec*float64(r.BodyBytes)/1e9
			}
		}
		r.Ratio = r.PerSec / r.RawPerSec
		r.RowsPerSec = r.PerSec * float64(o.batch)
		out = append(out, r)
		fmt.Fprintf(os.Stderr, "  extend %s conns=%d: %.0f rows/s\n", kind, conns, r.RowsPerSec)
		if err := db.DeleteBuffer(name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// memcpyGBs is the machine limit: one copy of 64 MiB, best of a few.
func memcpyGBs() float64 {
	src, dst := make([]byte, 64<<20), make([]byte, 64<<20)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in
	best := time.Duration(math.MaxInt64)
	for range 5 {
		t := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t))
	}
	return float64(len(src)) / best.Seconds() / 1e9
}

func report(out io.Writer, machine string, rs []result, o options) error {
	if o.jsonOut {
		enc := json.NewEncoder(out)
		for _, r := range rs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(out, "# %s\n\n", machine)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sample\tconns\tbody bytes\tbatches/s\tGB/s\traw GB/s\tratio\t")
	for _, r := range rs {
		if r.Test == "sample" {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.2f\t\n", r.Workload, r.Conns, r.BodyBytes, r.PerSec, r.GBs, r.RawGBs, r.Ratio)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "extend\tkind\tconns\tbody bytes\trows/s\tMB/s\traw req/s\tratio\t")
	for _, r := range rs {
		if r.Test == "extend" {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.1f\t%.0f\t%.2f\t\n", r.Workload, r.Kind, r.Conns, r.BodyBytes, r.RowsPerSec, r.GBs*1e3, r.RawPerSec, r.Ratio)
		}
	}
	return tw.Flush()
}
