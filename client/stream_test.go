package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/testbin"
	"github.com/rbdb/rbd/server"
)

// fillCartpole writes n rows to a new cartpole buffer "cp" in trajectories
// of 10 steps on 4 streams.
func fillCartpole(t *testing.T, c *client.Client, capacity, n int64) {
	t.Helper()
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(capacity)); err != nil {
		t.Fatal(err)
	}
	const per = 40
	for i := int64(0); i < n; i += per {
		toks := seqToks(1000+i, per)
		done := make([]bool, per)
		for k := range done {
			done[k] = (i+int64(k))%10 == 9
		}
		if _, err := c.Extend(ctx, "cp", fmt.Sprintf("s%d", (i/per)%4), steps(toks, done, nil)); err != nil {
			t.Fatal(err)
		}
	}
}

// sameBatch reports how two batches differ, tensor by tensor.
func sameBatch(a, b *client.Batch) error {
	if len(a.Tensors) != len(b.Tensors) {
		return fmt.Errorf("%d tensors, want %d", len(a.Tensors), len(b.Tensors))
	}
	for i, ta := range a.Tensors {
		tb := b.Tensors[i]
		if ta.Name != tb.Name || ta.DType != tb.DType || fmt.Sprint(ta.Shape) != fmt.Sprint(tb.Shape) || !bytes.Equal(ta.Data, tb.Data) {
			return fmt.Errorf("tensor %d: %s %s %v differs from %s %s %v", i, ta.Name, ta.DType, ta.Shape, tb.Name, tb.DType, tb.Shape)
		}
	}
	if fmt.Sprint(a.Metadata) != fmt.Sprint(b.Metadata) {
		return fmt.Errorf("metadata %v, want %v", a.Metadata, b.Metadata)
	}
	return nil
}

// sameAsSeeded fails t unless got, batch i of a stream whose request was
// req with seed, equals a single request req with seed+i.
func sameAsSeeded(t *testing.T, c *client.Client, got *client.Batch, req client.SampleRequest, seed uint64, i int) {
	t.Helper()
	req.Seed = client.Ptr(seed + uint64(i))
	want, err := c.Sample(ctxT(t), "cp", &req)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameBatch(got, want); err != nil {
		t.Fatalf("batch %d differs from a single request with seed %d: %v", i, seed+uint64(i), err)
	}
}

// transports are the ways a stream carries batches, for tests that run
// over both.
var transports = []struct {
	name  string
	shm   bool
	arena int // the arena version, for shm
}{{"socket", false, 0}, {"shm", true, 2}, {"shm-v1", true, 1}}

func TestSampleStreamMatchesSingleRequests(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { streamMatchesSingleRequests(t, tr.shm, tr.arena) })
	}
}

func streamMatchesSingleRequests(t *testing.T, shm bool, arena int) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 2000, 1200)
	ctx := ctxT(t)
	const batches = 12
	for _, tc := range []struct {
		name string
		req  client.SampleRequest
	}{
		{"uniform", client.SampleRequest{BatchSize: 64}},
		{"prioritized", client.SampleRequest{BatchSize: 64, Sampler: "prioritized"}},
		{"slice", client.SampleRequest{Sampler: "slice", NumSlices: 8, SliceLen: 4}},
		{"n-step", client.SampleRequest{BatchSize: 32, NStep: &client.NStep{N: 3, Gamma: 0.9}}},
		// Each side has its own consumer, so both start the same epochs.
		{"without replacement", client.SampleRequest{BatchSize: 500, Sampler: "without_replacement"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Seed = client.Ptr[uint64](41)
			if req.Sampler == "without_replacement" {
				req.Consumer = "stream"
			}
			st, err := c.SampleStream(ctx, "cp", &req, &client.StreamOptions{Batches: batches, Depth: 3, SharedMemory: shm, ArenaVersion: arena})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			single := tc.req
			if single.Sampler == "without_replacement" {
				single.Consumer = "single"
			}
			for i := range batches {
				got, err := st.Next()
				if err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				sameAsSeeded(t, c, got, single, 41, i)
				got.Release()
			}
			if b, err := st.Next(); err != io.EOF {
				t.Fatalf("after the last batch: %v, %v; want io.EOF", b, err)
			}
		})
	}
}

func TestSampleStreamUntilEpochEnd(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 2000, 400) // every trajectory ends: all 400 rows have a next observation
	st, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: 100, Sampler: "without_replacement"},
		&client.StreamOptions{StopAtEpochEnd: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows := 0
	for {
		b, err := st.Next()
		if err != nil {
			t.Fatalf("after %d rows: %v", rows, err)
		}
		rows += b.Rows()
		if b.Metadata["epoch_end"] == "true" {
			break
		}
	}
	if rows != 400 {
		t.Fatalf("one epoch gave %d rows, want 400", rows)
	}
	// The stream ends there: no batch of the next epoch was drawn.
	if _, err := st.Next(); !errors.Is(err, io.ErrUnexpectedEOF) && err != io.EOF {
		t.Fatalf("after the epoch's end: %v", err)
	}
	b, err := c.Sample(ctxT(t), "cp", &client.SampleRequest{BatchSize: 100, Sampler: "without_replacement"})
	if err != nil || b.Metadata["epoch"] != "1" {
		t.Fatalf("next single sample: epoch %q, %v; want the second epoch (1) untouched by the stream", b.Metadata["epoch"], err)
	}
}

// TestSampleStreamRowsNotTorn reads a stream while 8 writers overwrite a
// small ring: every row of every batch must derive from one token.
func TestSampleStreamRowsNotTorn(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { streamRowsNotTorn(t, tr.shm, tr.arena) })
	}
}

func streamRowsNotTorn(t *testing.T, shm bool, arena int) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	fillCartpole(t, c, 256, 256)
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i += 16 {
				toks := make([]int64, 16)
				done := make([]bool, 16)
				for k := range toks {
					toks[k] = int64(w)<<32 | int64(i+k)
					done[k] = (i+k)%7 == 6
				}
				if _, err := c.Extend(ctx, "cp", fmt.Sprintf("w%d", w), steps(toks, done, nil)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	st, err := c.SampleStream(ctx, "cp", &client.SampleRequest{BatchSize: 64}, &client.StreamOptions{Batches: 300, SharedMemory: shm, ArenaVersion: arena})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 300 {
		b, err := st.Next()
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		for _, r := range rowsOf(t, b) {
			if err := checkRow(r); err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
		}
		b.Release()
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestSampleStreamSharedMemorySlots: a batch not released is never
// overwritten however many follow; a reader that releases nothing loses
// its stream after the stall timeout; Close leaves unreleased batches
// readable.
func TestSampleStreamSharedMemorySlots(t *testing.T) {
	for _, arena := range []int{2, 1} {
		t.Run(fmt.Sprintf("arena=%d", arena), func(t *testing.T) { sharedMemorySlots(t, arena) })
	}
}

func sharedMemorySlots(t *testing.T, arena int) {
	ts, _ := newServer(t, &server.Options{StreamStallTimeout: 300 * time.Millisecond})
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 2000, 1200)
	st, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: 32}, &client.StreamOptions{SharedMemory: true, Depth: 1, ArenaVersion: arena})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := st.Next()
	if err != nil {
		t.Fatal(err)
	}
	want := make([][]byte, len(kept.Tensors))
	for i, tn := range kept.Tensors {
		want[i] = bytes.Clone(tn.Data)
	}
	for i := range 200 {
		b, err := st.Next()
		if err != nil {
			t.Fatalf("batch %d: %v", i+1, err)
		}
		b.Release()
	}
	for i, tn := range kept.Tensors {
		if !bytes.Equal(tn.Data, want[i]) {
			t.Fatalf("tensor %s of a batch not released changed while 200 more were read", tn.Name)
		}
	}
	// Keep every batch: depth 1 + 1 drawn + 4 held slots, then the server
	// waits and gives up.
	var held []*client.Batch
	drainCut(t, st, "the stream of a reader that releases nothing", func(b *client.Batch) { held = append(held, b) })
	if len(held) != 5 { // 6 slots, one of them the kept batch's
		t.Fatalf("%d more batches arrived with every slot held, want 5", len(held))
	}
	st.Close()
	for i, tn := range kept.Tensors {
		if !bytes.Equal(tn.Data, want[i]) {
			t.Fatalf("tensor %s of an unreleased batch unreadable after Close", tn.Name)
		}
	}
	kept.Release()
	for _, b := range held {
		b.Release()
	}
	waitFor(t, "the stream to end", func() bool { return streamsGauge(t, c) == "0" })

}

// TestSampleStreamNotColocated: an arena the client cannot map (missing,
// or another process's file) is ErrNotColocated, so a caller can fall back
// to a socket stream.
func TestSampleStreamNotColocated(t *testing.T) {
	notArena := filepath.Join(t.TempDir(), "not-an-arena")
	if err := os.WriteFile(notArena, bytes.Repeat([]byte{7}, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/proc/999999999/fd/3", notArena} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/vnd.rbd.sample-stream")
			w.Header().Set("X-Rbd-Arena", path)
			w.Header().Set("X-Rbd-Arena-Nonce", "00112233445566778899aabbccddeeff")
		}))
		c := newClient(t, srv.URL, nil)
		_, err := c.SampleStream(ctxT(t), "cp", nil, &client.StreamOptions{SharedMemory: true})
		srv.Close()
		if !errors.Is(err, client.ErrNotColocated) {
			t.Errorf("arena %s: %v, want ErrNotColocated", path, err)
		}
	}
}

// metric returns the value of the /metrics line that starts with series
// (a name and its labels), and whether there was one.
func metric(t *testing.T, c *client.Client, series string) (string, bool) {
	t.Helper()
	m, err := c.Metrics(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return testbin.MetricValue(m, series)
}

// rowsSampled reads rbd_sampler_rows_sampled_total of buffer "cp" (0
// before the first sample creates the series).
func rowsSampled(t *testing.T, c *client.Client) int64 {
	t.Helper()
	var n int64
	if v, ok := metric(t, c, `rbd_sampler_rows_sampled_total{buffer="cp"}`); ok {
		fmt.Sscan(v, &n)
	}
	return n
}

// streamsGauge reads rbd_sample_streams.
func streamsGauge(t *testing.T, c *client.Client) string {
	t.Helper()
	v, ok := metric(t, c, "rbd_sample_streams")
	if !ok {
		t.Fatal("no rbd_sample_streams in /metrics")
	}
	return v
}

// waitFor polls cond until it holds or the test's deadline nears.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSampleStreamFreesWhatItHolds closes endless streams (after a batch,
// and without reading a thing, so the server stalls on a full socket) and
// checks that the server's stream goroutines and memory go back to what
// they were, and that a stalled stream never held up a writer.
func TestSampleStreamFreesWhatItHolds(t *testing.T) {
	ts, _ := newServer(t, &server.Options{StreamStallTimeout: 200 * time.Millisecond})
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	fillCartpole(t, c, 4000, 4000)
	baseline := runtime.NumGoroutine()

	// A client that reads one batch and closes.
	st, err := c.SampleStream(ctx, "cp", &client.SampleRequest{BatchSize: 256}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Next(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	waitFor(t, "the closed stream to end", func() bool { return streamsGauge(t, c) == "0" })

	// A client that reads nothing: the server fills the socket (or, in
	// shared memory, the arena's ring), stalls, and ends the stream after
	// StreamStallTimeout. Writers go on meanwhile.
	var stalled []*client.SampleStream
	for _, shm := range []bool{false, true} {
		st, err := c.SampleStream(ctx, "cp", &client.SampleRequest{BatchSize: 256}, &client.StreamOptions{Depth: 8, SharedMemory: shm})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		stalled = append(stalled, st)
		for i := range 50 {
			if _, err := c.Extend(ctx, "cp", "writer", steps(seqToks(int64(i)*16, 16), make([]bool, 16), nil)); err != nil {
				t.Fatalf("extend %d next to a stalled stream (shared memory %v): %v", i, shm, err)
			}
		}
	}
	waitFor(t, "the stalled streams to time out", func() bool { return streamsGauge(t, c) == "0" })
	// The stalled clients then find their streams cut short (after the
	// batches the server drew before it stalled).
	for _, st := range stalled {
		drainCut(t, st, "a stalled stream", (*client.Batch).Release)
		st.Close()
	}
	waitFor(t, "the streams' goroutines to exit", func() bool {
		ts.CloseClientConnections() // idle keep-alive connections hold goroutines too
		return runtime.NumGoroutine() <= baseline
	})
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
}

// drainCut reads st until the server cuts it short (an unexpected EOF or a
// reset connection), handing each batch before that to take.
func drainCut(t *testing.T, st *client.SampleStream, what string, take func(*client.Batch)) {
	t.Helper()
	for {
		b, err := st.Next()
		if err != nil {
			if !errors.Is(err, io.ErrUnexpectedEOF) && !isConnReset(err) {
				t.Fatalf("%s ended with %v, want an unexpected EOF", what, err)
			}
			return
		}
		take(b)
	}
}

func isConnReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) || strings.Contains(err.Error(), "connection reset")
}

// TestSampleStreamBoundsReadAhead checks how far a stream runs ahead of a
// reader that has stopped: depth batches in the server, about depth frames
// in the send buffer (ConnContext), and the reader's receive buffer. The
// kernel's own send buffer would hold hundreds more (4 MiB).
func TestSampleStreamBoundsReadAhead(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 2000, 2000)
	sampled := func() int64 { return rowsSampled(t, c) }
	const rows, depth = 256, 2
	st, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: rows}, &client.StreamOptions{Depth: depth})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := st.Next()
	if err != nil {
		t.Fatal(err)
	}
	frame := 0
	for _, t := range b.Tensors {
		frame += len(t.Data)
	}
	// Give the server every chance to run ahead: the bound is an upper
	// one, so a slow machine only makes it easier to meet.
	time.Sleep(300 * time.Millisecond)
	ahead := sampled()/rows - 1
	bound := int64(depth + 2 + (1<<20)/frame)
	t.Logf("%d-byte batches: %d drawn ahead of the reader (bound %d)", frame, ahead, bound)
	if ahead > bound {
		t.Fatalf("the stream drew %d batches of %d bytes ahead of a stalled reader, more than %d (depth %d + 1 MiB of socket buffers)", ahead, frame, bound, depth)
	}
	b.Release()
	st.Close()
	waitFor(t, "the stream to end", func() bool { return streamsGauge(t, c) == "0" })

	// A version 2 shared-memory stream has no socket buffers in the way:
	// the ring holds at most depth+1 batches the reader has not taken.
	before := sampled()
	shm, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: rows}, &client.StreamOptions{Depth: depth, SharedMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	if b, err = shm.Next(); err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	drawnAhead := func() int64 { return (sampled()-before)/rows - 1 }
	waitFor(t, "the shared-memory stream to draw ahead", func() bool { return drawnAhead() >= depth+1 })
	time.Sleep(200 * time.Millisecond) // time to draw more, if it would
	if ahead := drawnAhead(); ahead != depth+1 {
		t.Fatalf("a shared-memory stream drew %d batches ahead of a stalled reader, want depth+1 = %d", ahead, depth+1)
	}
}

// streamAfterOne serves a filled buffer "cp" and returns a stream of it
// that has delivered one batch.
func streamAfterOne(t *testing.T) (*client.Client, *server.Server, *client.SampleStream) {
	ts, srv := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 1000, 400)
	st, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: 8}, &client.StreamOptions{Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Next(); err != nil {
		t.Fatal(err)
	}
	return c, srv, st
}

func TestSampleStreamEndsWithErrorFrame(t *testing.T) {
	t.Run("shutdown", func(t *testing.T) {
		_, srv, st := streamAfterOne(t)
		srv.BeginShutdown()
		for {
			_, err := st.Next()
			if err == nil {
				continue // drawn before the shutdown
			}
			if !errors.Is(err, client.ErrShuttingDown) {
				t.Fatalf("stream ended with %v, want ErrShuttingDown", err)
			}
			break
		}
	})
	t.Run("buffer deleted", func(t *testing.T) {
		c, _, st := streamAfterOne(t)
		if err := c.DeleteBuffer(ctxT(t), "cp"); err != nil {
			t.Fatal(err)
		}
		for {
			_, err := st.Next()
			if err == nil {
				continue
			}
			var ae *client.APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
				t.Fatalf("stream ended with %v, want a 404 error frame", err)
			}
			break
		}
	})
	t.Run("not ready is an ordinary answer", func(t *testing.T) {
		ts, _ := newServer(t, nil)
		c := newClient(t, ts.URL, nil)
		if _, _, err := c.CreateBuffer(ctxT(t), "cp", cartpole(100)); err != nil {
			t.Fatal(err)
		}
		_, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: 8}, nil)
		if !errors.Is(err, client.ErrNotReady) {
			t.Fatalf("stream of an empty buffer: %v, want ErrNotReady", err)
		}
	})
}

// TestSampleStreamOutlivesReadTimeout runs a stream longer than the HTTP
// server's ReadTimeout (rbd serve sets one), reading it slowly.
func TestSampleStreamOutlivesReadTimeout(t *testing.T) {
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: server.New(db, nil).Handler(), ReadTimeout: time.Second, WriteTimeout: time.Second}
	go hs.Serve(ln)
	defer hs.Close()
	c := newClient(t, "http://"+ln.Addr().String(), nil)
	fillCartpole(t, c, 1000, 400)
	st, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: 8}, &client.StreamOptions{Batches: 8, Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Now()
	for i := range 8 {
		if _, err := st.Next(); err != nil {
			t.Fatalf("batch %d, %v into the stream: %v", i, time.Since(start), err)
		}
		time.Sleep(200 * time.Millisecond) // a slow learner: 1.6 s in all, past both timeouts
	}
}

func TestSampleStreamBadInput(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 1000, 400)
	for _, tc := range []struct {
		name, query, body, accept, want string
	}{
		{"depth 0", "stream=1", `{"batch_size": 8, "depth": 0}`, "", "depth: must be in [1, 64], got 0"},
		{"depth huge", "stream=1", `{"batch_size": 8, "depth": 100000}`, "", "depth: must be in [1, 64]"},
		{"depth not a number", "stream=1", `{"batch_size": 8, "depth": "2"}`, "", "depth: must be an integer"},
		{"negative batches", "stream=1", `{"batch_size": 8, "batches": -1}`, "", "batches: must be at least 1, got -1"},
		{"zero batches", "stream=1", `{"batch_size": 8, "batches": 0}`, "", "batches: must be at least 1"},
		{"fractional batches", "stream=1", `{"batch_size": 8, "batches": 1.5}`, "", "batches: must be an integer"},
		{"bad epoch flag", "stream=1", `{"batch_size": 8, "stop_at_epoch_end": 1}`, "", "stop_at_epoch_end: must be a boolean"},
		{"unknown transport option", "stream=pigeon", `{"batch_size": 8}`, "", `stream: \"pigeon\" is not a transport option`},
		{"sample key checked", "stream=1", `{"batch_size": 8, "samplr": "x"}`, "", "samplr: unknown key"},
		{"bad sample request", "stream=1", `{"batch_size": -3}`, "", "batch_size"},
		{"not an object", "stream=1", `[1]`, "", "body: not a JSON object"},
		{"JSON answer", "stream=1", `{"batch_size": 8}`, "application/json", "stream: a sample stream is binary frames"},
		{"stream keys without stream=1", "", `{"batch_size": 8, "depth": 2}`, "", "depth: unknown key"},
		{"unknown arena version", "stream=shm&arena=3", `{"batch_size": 8}`, "", `arena: \"3\" is not an arena version (want 1 or 2)`},
		{"arena on a socket stream", "stream=1&arena=2", `{"batch_size": 8}`, "", `arena: \"2\" applies to stream=shm only`},
		{"arena on a single request", "arena=2", `{"batch_size": 8}`, "", `arena: \"2\" applies to stream=shm only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", ts.URL+"/v1/buffers/cp/sample?"+tc.query, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if tc.accept != "" {
				req.Header.Set("Accept", tc.accept)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), tc.want) || !strings.HasPrefix(string(body), `{"error":`) {
				t.Fatalf("%d %s, want 400 with %q", resp.StatusCode, body, tc.want)
			}
		})
	}
	if _, err := c.SampleStream(context.Background(), "cp", nil, &client.StreamOptions{Batches: -1}); err == nil || !strings.Contains(err.Error(), "batches -1 is negative") {
		t.Fatalf("client-side check: %v", err)
	}
	// The server still answers.
	if _, err := c.Sample(ctxT(t), "cp", &client.SampleRequest{BatchSize: 8}); err != nil {
		t.Fatal(err)
	}
}

// FuzzSampleStreamFrames feeds any bytes to a stream reader as the
// server's answer: every outcome is batches then an error or EOF, never a
// panic, and never a batch larger than the client allows.
func FuzzSampleStreamFrames(f *testing.F) {
	frame := func(flag uint64, payload []byte) []byte {
		return append(binary.LittleEndian.AppendUint64(nil, flag|uint64(len(payload))), payload...)
	}
	st, err := codec.EncodeSafetensors([]codec.Tensor{client.NewTensor("seq", []int{2}, []int64{4, 5})}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(frame(0, st))
	f.Add(append(frame(0, st), frame(1<<63, []byte(`{"error":"gone","code":"x","status":404}`))...))
	f.Add(frame(1<<63, []byte(`{"error":"x"}`)))
	f.Add(frame(0, st)[:12])
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<62))
	f.Fuzz(func(t *testing.T, body []byte) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/vnd.rbd.sample-stream")
			w.Write(body)
		}))
		defer srv.Close()
		c, err := client.New(srv.URL, &client.Options{MaxResponseBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.SampleStream(context.Background(), "b", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for range len(body)/8 + 2 {
			b, err := s.Next()
			if err != nil {
				return
			}
			if b == nil {
				t.Fatal("nil batch without an error")
			}
		}
		t.Fatal("the reader returned more batches than the body has frames")
	})
}

// TestSampleStreamWakesAWaitingReader: a rate limiter makes every draw
// wait for a writer, so the reader runs out of batches each time and
// sleeps on the socket; each batch must still arrive (a shared-memory
// stream of version 2 announces batches in the arena and sends a wake-up
// only to a reader that said it waits).
func TestSampleStreamWakesAWaitingReader(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ts, _ := newServer(t, nil)
			c := newClient(t, ts.URL, nil)
			ctx := ctxT(t)
			spec := cartpole(1000)
			spec.RateLimit = &client.RateLimit{SamplesPerInsert: 1, MinSize: 8, ErrorBuffer: 8}
			if _, _, err := c.CreateBuffer(ctx, "cp", spec); err != nil {
				t.Fatal(err)
			}
			ext := func(i int64) {
				if _, err := c.Extend(ctx, "cp", "w", steps(seqToks(8*i, 8), make([]bool, 8), nil)); err != nil {
					t.Error(err)
				}
			}
			ext(0)
			ext(1)
			st, err := c.SampleStream(ctx, "cp", &client.SampleRequest{BatchSize: 8, TimeoutMS: 20000},
				&client.StreamOptions{Batches: 12, Depth: 1, SharedMemory: tr.shm, ArenaVersion: tr.arena})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			stop := make(chan struct{})
			wrote := make(chan struct{})
			go func() { // one insert of 8 rows per 20 ms lets one batch through
				defer close(wrote)
				for i := int64(2); ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
						ext(i)
					}
				}
			}()
			defer func() { close(stop); <-wrote }()
			for i := range 12 {
				b, err := st.Next()
				if err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				b.Release()
			}
			if _, err := st.Next(); err != io.EOF {
				t.Fatalf("after the last batch: %v, want io.EOF", err)
			}
		})
	}
}

// TestSampleStreamCountsRows: a stream of N batches of R rows adds exactly
// N*R to rbd_sampler_rows_sampled_total, over every transport.
func TestSampleStreamCountsRows(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 2000, 1000)
	sampled := func() int64 { return rowsSampled(t, c) }
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			before := sampled()
			st, err := c.SampleStream(ctxT(t), "cp", &client.SampleRequest{BatchSize: 16},
				&client.StreamOptions{Batches: 5, SharedMemory: tr.shm, ArenaVersion: tr.arena})
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				b, err := st.Next()
				if err != nil {
					t.Fatal(err)
				}
				b.Release()
			}
			st.Close()
			waitFor(t, "the stream to end", func() bool { return streamsGauge(t, c) == "0" })
			if got := sampled() - before; got != 5*16 {
				t.Fatalf("a stream of 5 batches of 16 rows counted %d rows sampled, want 80", got)
			}
		})
	}
}

// TestSampleStreamUnchunked: over HTTP/1.1 a socket stream's body is its
// frames as they are, not chunked (its frames delimit themselves), and
// ends with the connection after the last one.
func TestSampleStreamUnchunked(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 1000, 400)
	req, _ := http.NewRequest("POST", ts.URL+"/v1/buffers/cp/sample?stream=1", strings.NewReader(`{"batch_size": 8, "batches": 2}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(resp.TransferEncoding) != 0 || resp.ContentLength != -1 || !resp.Close {
		t.Fatalf("status %d, transfer encoding %v, content length %d, close %v: want 200, none, -1 (until close), true",
			resp.StatusCode, resp.TransferEncoding, resp.ContentLength, resp.Close)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if len(body) < 8 {
			t.Fatalf("frame %d: %d bytes left", i, len(body))
		}
		n := binary.LittleEndian.Uint64(body)
		if n&(frameErrorBit|frameArenaBit) != 0 || uint64(len(body)-8) < n {
			t.Fatalf("frame %d: length word %#x with %d bytes left", i, n, len(body)-8)
		}
		body = body[8+n:]
	}
	if len(body) != 0 {
		t.Fatalf("%d bytes after the last frame", len(body))
	}
}

// The length word's flags (docs/http-api.md, "Framing").
const (
	frameErrorBit = uint64(1) << 63
	frameArenaBit = uint64(1) << 62
)

// TestSampleStreamLargeBatchesInSharedMemory: batches over 1 MiB, which a
// version 2 shared-memory stream draws ahead in a producer goroutine (as
// socket streams do) rather than inline, arrive in order and equal single
// requests with seeds seed+i; the stream counts exactly its rows.
func TestSampleStreamLargeBatchesInSharedMemory(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	fillCartpole(t, c, 20000, 20000)
	ctx := ctxT(t)
	const rows, batches = 16384, 5 // about 1.2 MB a batch
	before := rowsSampled(t, c)
	req := client.SampleRequest{BatchSize: rows, Seed: client.Ptr[uint64](7)}
	st, err := c.SampleStream(ctx, "cp", &req, &client.StreamOptions{Batches: batches, Depth: 2, SharedMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got []*client.Batch
	for i := range batches {
		b, err := st.Next()
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		got = append(got, b)
	}
	if _, err := st.Next(); err != io.EOF {
		t.Fatalf("after the last batch: %v, want io.EOF", err)
	}
	st.Close()
	waitFor(t, "the stream to end", func() bool { return streamsGauge(t, c) == "0" })
	if n := rowsSampled(t, c) - before; n != rows*batches {
		t.Fatalf("the stream counted %d rows sampled, want %d", n, rows*batches)
	}
	for i, b := range got {
		sameAsSeeded(t, c, b, req, 7, i)
		b.Release()
	}
}
