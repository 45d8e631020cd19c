package server_test

// HTTP benchmarks: sample and extend throughput of a real server on
// loopback, each next to a raw loopback baseline measured in the same run
// with the same client code and connection count. Every request is plain
// net/http with keep-alive; each connection reads answers into one reused
// buffer, so the client costs the same on both sides of a comparison.
//
// The whole suite once (CI smoke, a few seconds):
//
//	go test ./server -run '^$' -bench 'BenchmarkHTTP' -benchtime 1x -short
//
// The measurement (about 2.5 minutes on 2 cores):
//
//	go test ./server -run '^$' -bench 'BenchmarkHTTP' -benchtime 2s -count 3 -cpu 2 | tee http.txt
//	go tool benchstat -col /server http.txt   # benchstat is not pinned in go.mod yet

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/benchdata"
	"github.com/rbdb/rbd/internal/logbuf"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

// bnWorkload is a buffer shape the benchmarks sample from.
type bnWorkload struct {
	name     string
	obsShape []int
	obsDType string
	capacity int // rows; -short uses shortCap
	shortCap int
}

var bnWorkloads = []bnWorkload{
	// CartPole: float32[4] observations, 47 B per transition with next obs.
	{name: "cartpole", obsShape: []int{4}, obsDType: "float32", capacity: 100_000, shortCap: 10_000},
	// Atari: uint8[84,84,4] frames, 28,239 B per row stored; an answer
	// carries obs and next obs, 56,478 B per transition.
	{name: "atari", obsShape: []int{84, 84, 4}, obsDType: "uint8", capacity: 8_192, shortCap: 1_024},
}

const (
	bnBatch   = 256 // rows per sample answer and per extend request
	bnEnvs    = 8   // envs interleaved in one extend batch
	bnEpisode = 200 // steps per episode
)

// bnSpec is a compact_obs spec: the answer's next.observation is rebuilt
// from the following row.
func bnSpec(w bnWorkload, capacity int, storageKind string) string {
	shape := bnJSONShape(w.obsShape)
	return fmt.Sprintf(`{"capacity": %d, "storage": %q,
	 "fields": {"observation": {"dtype": %q, "shape": %s},
	            "action": {"dtype": "int64", "shape": []},
	            "next.reward": {"dtype": "float32", "shape": []},
	            "next.done": {"dtype": "bool", "shape": []},
	            "next.terminated": {"dtype": "bool", "shape": []},
	            "next.truncated": {"dtype": "bool", "shape": []}},
	 "compact_obs": true, "obs_keys": ["observation"]}`, capacity, storageKind, w.obsDType, shape)
}

func bnJSONShape(s []int) string {
	b := []byte{'['}
	for i, d := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(d), 10)
	}
	return string(append(b, ']'))
}

// bnBatchTensors returns batch k of a stream: bnBatch rows, bnEnvs envs
// interleaved, each env at step k*bnBatch/bnEnvs + i, done every
// bnEpisode steps with its final observation sent (one per done row).
func bnBatchTensors(w bnWorkload, k int) []codec.Tensor {
	return benchdata.Batch(w.obsDType, w.obsShape, bnBatch, k, bnEnvs, bnEpisode)
}

// bnServe opens a store in dir, serves it on loopback and returns the
// store and the base URL.
func bnServe(tb testing.TB, dir string) (*rbd.DB, string) {
	tb.Helper()
	db, err := rbd.Open(dir, nil)
	if err != nil {
		tb.Fatal(err)
	}
	// Logs as `rbd serve` does: request lines batched, to a file.
	f, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		tb.Fatal(err)
	}
	logw := logbuf.New(f, nil)
	so := &server.Options{Logger: slog.New(slog.NewJSONHandler(logw.Immediate(), nil)),
		RequestLogger: slog.New(slog.NewJSONHandler(logw, nil))}
	ts := httptest.NewServer(server.New(db, so).Handler())
	tb.Cleanup(func() {
		ts.Close()
		db.Close()
		logw.Close()
		f.Close()
	})
	return db, ts.URL
}

// bnRaw serves body to every request (after reading the request's body):
// the raw loopback baseline.
func bnRaw(tb testing.TB, body []byte, ctype string) string {
	tb.Helper()
	n := strconv.Itoa(len(body))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ctype)
		w.Header().Set("Content-Length", n)
		_, _ = w.Write(body)
	}))
	tb.Cleanup(ts.Close)
	return ts.URL
}

// bnRun runs b.N requests spread over conns goroutines (one connection
// each), after one untimed warm-up request per connection. req is called
// with the goroutine's index and the request's index.
func bnRun(b *testing.B, conns int, req func(conn int, i int64, buf *[]byte) error) {
	b.Helper()
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	bufs := make([][]byte, conns) // one per connection, kept from the warm-up on
	warm := func() {
		for c := range conns {
			wg.Go(func() {
				if err := req(c, -1, &bufs[c]); err != nil {
					fail(err)
				}
			})
		}
		wg.Wait()
	}
	warm()
	if p := firstErr.Load(); p != nil {
		b.Fatal(*p)
	}
	var next atomic.Int64
	b.ResetTimer()
	for c := range conns {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) || firstErr.Load() != nil {
					return
				}
				if err := req(c, i, &bufs[c]); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if p := firstErr.Load(); p != nil {
		b.Fatal(*p)
	}
}

func bnCapacity(w bnWorkload) int {
	if testing.Short() {
		return w.shortCap
	}
	return w.capacity
}

// BenchmarkHTTPSample: POST .../sample {"batch_size": 256} against a full
// compact memory buffer (uniform, a fresh random draw each time, answer
// = obs + next obs + action, reward, flags, seq, traj_id, step as
// safetensors), then the raw baseline: the same client fetching a prebuilt
// body of the same size from a handler that only writes it,
// server=rbd-stream: the same batches from one sample stream per
// connection (?stream=1, depth 2; frames read raw, like the request
// sides' answers), and server=rbd-shm: a shared-memory stream read with
// the Go client, which also decodes each batch's safetensors header (each
// batch copied out once, then released). x_raw is rbd's GB/s over the raw GB/s
// of the same run.
//
//	go test ./server -run '^$' -bench 'BenchmarkHTTPSample' -benchtime 2s -count 3 -cpu 2
func BenchmarkHTTPSample(b *testing.B) {
	const req = `{"batch_size": 256}`
	for _, w := range bnWorkloads {
		b.Run("workload="+w.name, func(b *testing.B) {
			capacity := bnCapacity(w)
			db, base := bnServe(b, b.TempDir())
			bnFill(b, db, w, capacity)
			url := base + "/v1/buffers/bench/sample"
			// One real answer, served as is by the raw baseline.
			var answer []byte
			n, err := benchdata.Post(benchdata.Client(1), url, "application/json", []byte(req), &answer)
			if err != nil {
				b.Fatal(err)
			}
			answer = answer[:n]
			if _, _, err := codec.DecodeSafetensors(answer); err != nil {
				b.Fatal(err)
			}
			raw := bnRaw(b, answer, "application/octet-stream")

			for _, conns := range []int{1, 4} {
				var rawGBs float64
				for _, side := range []string{"raw", "rbd", "rbd-stream", "rbd-shm"} {
					b.Run(fmt.Sprintf("conns=%d/server=%s", conns, side), func(b *testing.B) {
						if side == "rbd-stream" || side == "rbd-shm" {
							b.SetBytes(int64(len(answer)))
							bnStreams(b, base, url, req, conns, len(answer), side == "rbd-shm")
							sec := b.Elapsed().Seconds()
							gbs := float64(b.N) * float64(len(answer)) / sec / 1e9
							b.ReportMetric(float64(b.N)/sec, "batches/s")
							b.ReportMetric(gbs, "GB/s")
							if rawGBs > 0 {
								b.ReportMetric(gbs/rawGBs, "x_raw")
							}
							return
						}
						target := url
						if side == "raw" {
							target = raw
						}
						hc := benchdata.Client(conns)
						defer hc.CloseIdleConnections()
						b.SetBytes(int64(len(answer)))
						bnRun(b, conns, func(_ int, _ int64, buf *[]byte) error {
							m, err := benchdata.Post(hc, target, "application/json", []byte(req), buf)
							if err == nil && m != len(answer) {
								err = fmt.Errorf("answer of %d bytes, want %d", m, len(answer))
							}
							return err
						})
						sec := b.Elapsed().Seconds()
						gbs := float64(b.N) * float64(len(answer)) / sec / 1e9
						b.ReportMetric(float64(b.N)/sec, "batches/s")
						b.ReportMetric(gbs, "GB/s")
						if side == "raw" {
							rawGBs = gbs
						} else if rawGBs > 0 {
							b.ReportMetric(gbs/rawGBs, "x_raw")
						}
					})
				}
			}
		})
	}
}

// bnFill creates a compact memory buffer "bench" of capacity rows of
// workload w in db and fills it.
func bnFill(b testing.TB, db *rbd.DB, w bnWorkload, capacity int) {
	b.Helper()
	bnFillSpec(b, db, w, capacity, bnSpec(w, capacity, "memory"))
}

// bnFillSpec is bnFill with a spec of the caller's (for workload w's rows).
func bnFillSpec(b testing.TB, db *rbd.DB, w bnWorkload, capacity int, specJSON string) {
	b.Helper()
	spec, err := storage.ParseSpec([]byte(specJSON))
	if err != nil {
		b.Fatal(err)
	}
	buf, _, err := db.CreateBuffer("bench", spec)
	if err != nil {
		b.Fatal(err)
	}
	for k := 0; k < capacity/bnBatch+1; k++ {
		if _, err := buf.Extend("fill", benchdata.StorageBatch(bnBatchTensors(w, k), bnBatch)); err != nil {
			b.Fatal(err)
		}
	}
}

// bnStreams reads b.N batches from conns sample streams (POST
// .../sample?stream=1, one per connection, depth 2), each frame into one
// reused buffer like the request sides.
func bnStreams(b *testing.B, base, url, req string, conns, answer int, shm bool) {
	b.Helper()
	hc := benchdata.Client(conns)
	defer hc.CloseIdleConnections()
	gc, err := client.New(base, &client.Options{HTTPClient: hc})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	b.ResetTimer()
	for c := range conns {
		n := b.N / conns
		if c < b.N%conns {
			n++
		}
		if n == 0 {
			continue
		}
		wg.Go(func() {
			var err error
			if shm {
				err = bnReadShm(gc, n, answer)
			} else {
				err = bnReadStream(hc, url, fmt.Sprintf(`{"batch_size": 256, "batches": %d}`, n), n, answer)
			}
			if err != nil {
				firstErr.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if p := firstErr.Load(); p != nil {
		b.Fatal(*p)
	}
}

// bnReadShm reads n batches from a shared-memory stream with the Go
// client, copying every tensor into one reused buffer (so the reader
// touches each byte, as the other sides do), then releasing the slot.
func bnReadShm(c *client.Client, n, answer int) error {
	st, err := c.SampleStream(context.Background(), "bench", &client.SampleRequest{BatchSize: 256},
		&client.StreamOptions{Batches: int64(n), SharedMemory: true})
	if err != nil {
		return err
	}
	defer st.Close()
	buf := make([]byte, answer)
	for i := range n {
		b, err := st.Next()
		if err != nil {
			return fmt.Errorf("batch %d: %w", i, err)
		}
		off := 0
		for _, t := range b.Tensors {
			off += copy(buf[off:], t.Data)
		}
		b.Release()
	}
	return nil
}

func bnReadStream(hc *http.Client, url, req string, n, answer int) error {
	resp, err := hc.Post(url+"?stream=1", "application/json", strings.NewReader(req))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("stream: %d %s", resp.StatusCode, msg)
	}
	buf := make([]byte, answer)
	var prefix [8]byte
	for i := range n {
		if _, err := io.ReadFull(resp.Body, prefix[:]); err != nil {
			return fmt.Errorf("batch %d: %w", i, err)
		}
		if m := binary.LittleEndian.Uint64(prefix[:]); m != uint64(answer) {
			return fmt.Errorf("batch %d: frame word %#x, want a %d-byte batch", i, m, answer)
		}
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			return fmt.Errorf("batch %d: %w", i, err)
		}
	}
	return nil
}

// BenchmarkHTTPExtend: POST .../extend?stream=actor-<c> with 256 CartPole
// rows as safetensors (8 envs interleaved, episodes of 200 steps, final
// observations of done rows sent), one stream per connection, into a
// compact buffer of 100,000 rows (memory, or memmap with the default
// durability "flush"). server=raw posts the same bodies to a handler that
// reads and discards them: the HTTP floor.
//
//	go test ./server -run '^$' -bench 'BenchmarkHTTPExtend' -benchtime 2s -count 3 -cpu 2
func BenchmarkHTTPExtend(b *testing.B) {
	w := bnWorkloads[0]
	// 25 batches of 32 steps per env are 800 steps, four whole episodes,
	// so cycling through them continues each env's episodes seamlessly.
	const cycle = bnEpisode * 4 / (bnBatch / bnEnvs)
	bodies := make([][]byte, cycle)
	for k := range bodies {
		var err error
		if bodies[k], err = codec.EncodeSafetensors(bnBatchTensors(w, k), nil); err != nil {
			b.Fatal(err)
		}
	}
	for _, kind := range []string{"memory", "memmap"} {
		for _, conns := range []int{1, 4} {
			for _, side := range []string{"raw", "rbd"} {
				name := fmt.Sprintf("kind=%s/conns=%d/server=%s", kind, conns, side)
				if kind == "memmap" {
					name = fmt.Sprintf("kind=memmap-flush/conns=%d/server=%s", conns, side)
				}
				if side == "raw" && kind != "memory" {
					continue // the floor does not depend on the kind
				}
				b.Run(name, func(b *testing.B) {
					var url string
					if side == "raw" {
						url = bnRaw(b, []byte(`{"first_seq":0,"rows":256,"write_count":256}`+"\n"), "application/json")
					} else {
						db, base := bnServe(b, b.TempDir())
						spec, err := storage.ParseSpec([]byte(bnSpec(w, w.capacity, kind)))
						if err != nil {
							b.Fatal(err)
						}
						if _, _, err := db.CreateBuffer("bench", spec); err != nil {
							b.Fatal(err)
						}
						url = base + "/v1/buffers/bench/extend?stream=actor-"
					}
					hc := benchdata.Client(conns)
					defer hc.CloseIdleConnections()
					var sent [4]atomic.Int64 // batches sent per connection, for the cycle
					var size int64
					for _, body := range bodies {
						size += int64(len(body))
					}
					b.SetBytes(size / int64(len(bodies)))
					bnRun(b, conns, func(c int, _ int64, buf *[]byte) error {
						k := sent[c].Add(1) - 1
						target := url
						if side == "rbd" {
							target += strconv.Itoa(c)
						}
						_, err := benchdata.Post(hc, target, "application/octet-stream", bodies[k%cycle], buf)
						return err
					})
					b.ReportMetric(float64(b.N)*bnBatch/b.Elapsed().Seconds(), "rows/s")
				})
			}
		}
	}
}

// BenchmarkSampleHandler: the server's own cost of one 256-row CartPole
// sample request (routing, auth, parse, draw, gather, encode), with no
// network and a writer that discards the answer. allocs/op is the figure to
// watch: the lean request path allocates little beyond pooled memory (the
// benchmark's own http.NewRequest makes about ten of them). The request
// log three ways: none, log=batched as `rbd serve` writes it (a JSON line
// per request, batched by internal/logbuf) and log=each-line (a write per
// line), both into a pipe, as under a container runtime or systemd.
//
//	go test ./server -run '^$' -bench 'BenchmarkSampleHandler' -benchtime 3s -count 3
func BenchmarkSampleHandler(b *testing.B) {
	w := bnWorkloads[0]
	capacity := bnCapacity(w)
	db, err := rbd.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	bnFill(b, db, w, capacity)
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	go io.Copy(io.Discard, pr)
	defer pw.Close()
	logw := logbuf.New(pw, nil)
	defer logw.Close()
	for _, tc := range []struct {
		log  string
		opts *server.Options
	}{
		{"none", nil},
		{"batched", &server.Options{Logger: slog.New(slog.NewJSONHandler(logw.Immediate(), nil)),
			RequestLogger: slog.New(slog.NewJSONHandler(logw, nil))}},
		{"each-line", &server.Options{Logger: slog.New(slog.NewJSONHandler(pw, nil))}},
	} {
		b.Run("log="+tc.log, func(b *testing.B) {
			h := server.New(db, tc.opts).Handler()
			body := []byte(`{"batch_size": 256}`)
			rw := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				r, err := http.NewRequest(http.MethodPost, "/v1/buffers/bench/sample", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				r.Header.Set("Content-Type", "application/json")
				clear(rw.h)
				rw.status = 0
				h.ServeHTTP(rw, r)
				if rw.status != http.StatusOK {
					b.Fatalf("status %d", rw.status)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

// discardWriter is an http.ResponseWriter that keeps only the status.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	return len(p), nil
}
func (d *discardWriter) WriteHeader(code int) {
	if d.status == 0 {
		d.status = code
	}
}

// BenchmarkDashboardPoll measures one refresh of the dashboard's buffer
// page: the requests it sends every second (the buffer list, the buffer's
// info, its stats, the activity since two seconds ago) against a full
// prioritised CartPole buffer and 99 more buffers. core_%_at_1Hz is the
// share of one core a page open on it costs the server.
func BenchmarkDashboardPoll(b *testing.B) {
	w := bnWorkloads[0]
	capacity := w.capacity
	if testing.Short() {
		capacity = w.shortCap
	}
	db, url := bnServe(b, b.TempDir())
	prio := strings.Replace(bnSpec(w, capacity, "memory"), `"compact_obs"`, `"priority": {"alpha": 0.6, "eps": 1e-6}, "compact_obs"`, 1)
	bnFillSpec(b, db, w, capacity, prio)
	small, err := storage.ParseSpec([]byte(bnSpec(w, 1000, "memory")))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 99 {
		o, _, err := db.CreateBuffer(fmt.Sprintf("other%02d", i), small)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := o.Extend("fill", benchdata.StorageBatch(bnBatchTensors(w, 0), bnBatch)); err != nil {
			b.Fatal(err)
		}
	}
	hc := &http.Client{}
	get := func(path string) {
		resp, err := hc.Get(url + path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		get("/v1/buffers")
		get("/v1/buffers/bench")
		get("/v1/buffers/bench/stats")
		get(fmt.Sprintf("/v1/activity?since=%d", time.Now().Unix()-2))
	}
	perPoll := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perPoll/1e9*100, "core_%_at_1Hz")
}
