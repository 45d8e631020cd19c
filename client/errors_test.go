package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/server"
)

func TestErrorMapping(t *testing.T) {
	ts, srv := newServer(t, &server.Options{MaxBody: 4096})
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	apiErr := func(t *testing.T, err error) *client.APIError {
		t.Helper()
		ae, ok := errors.AsType[*client.APIError](err)
		if !ok {
			t.Fatalf("%v (%T) is not an *APIError", err, err)
		}
		if ae.Message == "" || !strings.Contains(err.Error(), ae.Message) {
			t.Fatalf("message %q not in %q", ae.Message, err)
		}
		return ae
	}

	// 400, naming the field.
	_, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1, Sampler: "bogus"})
	if ae := apiErr(t, err); ae.Status != 400 || !errors.Is(err, client.ErrBadRequest) || !strings.Contains(ae.Message, "sampler") {
		t.Fatalf("bad sampler: %v", err)
	}
	if errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrNotReady) || client.IsNotFound(err) {
		t.Fatalf("a 400 matches other sentinels: %v", err)
	}
	_, _, err = c.CreateBuffer(ctx, "bad", &client.Spec{Capacity: -1})
	if ae := apiErr(t, err); ae.Status != 400 || !strings.Contains(ae.Message, "capacity") {
		t.Fatalf("bad spec: %v", err)
	}
	// A name the server refuses travels escaped and gets its 400.
	if _, err := c.Info(ctx, "a b/c"); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("invalid name: %v", err)
	}
	// 404.
	_, err = c.Sample(ctx, "nope", &client.SampleRequest{BatchSize: 1})
	if ae := apiErr(t, err); ae.Status != 404 || !client.IsNotFound(err) || !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("missing buffer: %v", err)
	}
	// 409.
	_, _, err = c.CreateBuffer(ctx, "cp", cartpole(99))
	if ae := apiErr(t, err); ae.Status != 409 || !errors.Is(err, client.ErrConflict) {
		t.Fatalf("conflict: %v", err)
	}
	if _, ok := client.RetryAfter(fmt.Errorf("x: %w", &client.APIError{Status: 404})); ok {
		t.Fatal("RetryAfter on a 404")
	}
	// 503 not_ready: see TestNotReady.
	// 413: a body above --max-body.
	big := steps(seqToks(0, 200), make([]bool, 200), nil)
	_, err = c.Extend(ctx, "cp", "s", big)
	if ae := apiErr(t, err); ae.Status != 413 || !errors.Is(err, client.ErrTooLarge) {
		t.Fatalf("large body: %v", err)
	}
	// Names that cannot be a path segment never leave the client.
	for _, name := range []string{"", ".", ".."} {
		if _, err := c.Info(ctx, name); err == nil || errors.As(err, new(*client.APIError)) {
			t.Fatalf("Info(%q): %v", name, err)
		}
	}
	// 503 shutting_down.
	srv.BeginShutdown()
	_, err = c.Info(ctx, "cp")
	if ae := apiErr(t, err); ae.Status != 503 || !errors.Is(err, client.ErrShuttingDown) || client.IsNotReady(err) {
		t.Fatalf("shutting down: %v", err)
	}
	if d, ok := client.RetryAfter(err); !ok || d != time.Second {
		t.Fatalf("retry after while shutting down: %v %v", d, ok)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatalf("health while shutting down: %v", err)
	}
}

func TestToken(t *testing.T) {
	ts, _ := newServer(t, &server.Options{Token: "s3cret"})
	ctx := ctxT(t)
	for _, tok := range []string{"", "wrong", "s3cret2", "S3CRET"} {
		c := newClient(t, ts.URL, &client.Options{Token: tok})
		_, err := c.Buffers(ctx)
		ae, ok := errors.AsType[*client.APIError](err)
		if !ok || ae.Status != 401 || !errors.Is(err, client.ErrUnauthorized) || !strings.Contains(ae.Message, "token") {
			t.Errorf("token %q: %v", tok, err)
		}
		if err := c.Health(ctx); err != nil {
			t.Errorf("health with token %q: %v", tok, err)
		}
	}
	c := newClient(t, ts.URL, &client.Options{Token: "s3cret"})
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(ctx, "cp", "", steps([]int64{1}, []bool{true}, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1}); err != nil {
		t.Fatal(err)
	}
	if list, err := c.Buffers(ctx); err != nil || len(list) != 1 {
		t.Fatalf("buffers: %v %v", list, err)
	}
}

func TestHeaders(t *testing.T) {
	type seen struct{ method, path, rawPath, ctype, accept, ua, auth, query string }
	var mu sync.Mutex
	var got []seen
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.Path, r.URL.RawPath, r.Header.Get("Content-Type"), r.Header.Get("Accept"),
			r.Header.Get("User-Agent"), r.Header.Get("Authorization"), r.URL.RawQuery})
		mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/sample") {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = codec.WriteSafetensors(w, []codec.Tensor{client.NewTensor("seq", nil, []int64{1})}, nil)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer ts.Close()
	c := newClient(t, ts.URL+"/prefix/", &client.Options{Token: "t", UserAgent: "ua/1"})
	ctx := ctxT(t)
	_, _ = c.Extend(ctx, "b", "s 1&x", nil)
	_, _ = c.Sample(ctx, "b", nil)
	_, _ = c.CloseStream(ctx, "b", "x/y")
	mu.Lock()
	defer mu.Unlock()
	want := []seen{
		{"POST", "/prefix/v1/buffers/b/extend", "", "application/octet-stream", "application/json", "ua/1", "Bearer t", "stream=s+1%26x"},
		{"POST", "/prefix/v1/buffers/b/sample", "", "application/json", "application/octet-stream", "ua/1", "Bearer t", ""},
		{"DELETE", "/prefix/v1/buffers/b/streams/x/y", "/prefix/v1/buffers/b/streams/x%2Fy", "", "application/json", "ua/1", "Bearer t", ""},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("requests:\n got %+v\nwant %+v", got, want)
	}
}

func TestNonJSONErrors(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/buffers/plain":
			w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
			http.Error(w, "upstream down", http.StatusBadGateway)
		case "/v1/buffers/empty":
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
		case "/v1/buffers/json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"name": 1}`))
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"starting"}`))
		}
	}))
	defer ts.Close()
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	_, err := c.Info(ctx, "plain")
	ae, ok := errors.AsType[*client.APIError](err)
	if !ok || ae.Status != 502 || ae.Message != "upstream down" || ae.RetryAfter < 59*time.Minute {
		t.Fatalf("plain text error: %#v", err)
	}
	if _, ok := client.RetryAfter(err); ok {
		t.Fatal("RetryAfter on a 502")
	}
	_, err = c.Info(ctx, "empty")
	if ae, ok = errors.AsType[*client.APIError](err); !ok || ae.Status != 429 || ae.Message != "Too Many Requests" {
		t.Fatalf("empty error: %#v", err)
	}
	if d, ok := client.RetryAfter(err); !ok || d != 3*time.Second {
		t.Fatalf("retry after 3: %v %v", d, ok)
	}
	if _, err := c.Info(ctx, "json"); err == nil || errors.As(err, new(*client.APIError)) {
		t.Fatalf("malformed answer: %v", err)
	}
	if err := c.Health(ctx); err == nil || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("health not ok: %v", err)
	}
	// A JSON answer where safetensors were asked for.
	if _, err := c.Sample(ctx, "x", nil); err == nil || !strings.Contains(err.Error(), "content type") {
		t.Fatalf("sample answered with JSON: %v", err)
	}
}

func TestContextCancellation(t *testing.T) {
	// A server that answers only when the request is abandoned.
	entered := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server notice the client leaving.
		_, _ = io.Copy(io.Discard, r.Body)
		entered <- struct{}{}
		<-r.Context().Done()
	}))
	defer slow.Close()
	c := newClient(t, slow.URL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sample past the deadline: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("sample returned after %v", d)
	}
	<-entered
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		<-entered
		cancel()
	}()
	if _, err := c.Rows(ctx, "cp", 0, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("rows, cancelled: %v", err)
	}

	// Against the real server: an already cancelled context sends nothing.
	ts, _ := newServer(t, nil)
	c = newClient(t, ts.URL, nil)
	if _, _, err := c.CreateBuffer(ctxT(t), "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := c.Extend(ctx, "cp", "s", steps([]int64{1}, []bool{false}, nil)); !errors.Is(err, context.Canceled) {
		t.Fatalf("extend with a cancelled context: %v", err)
	}
	if info, err := c.Info(ctxT(t), "cp"); err != nil || info.WriteCount != 0 {
		t.Fatalf("cancelled extend wrote: %+v %v", info, err)
	}
}

// TestNotReady covers the 503 not_ready answers of the real server and its
// wait (timeout_ms) against the client's deadline.
func TestNotReady(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	// An empty buffer, with a Retry-After hint.
	_, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 4})
	ae, ok := errors.AsType[*client.APIError](err)
	if !ok || ae.Status != 503 || ae.Code != "not_ready" || !client.IsNotReady(err) || !errors.Is(err, client.ErrNotReady) || errors.Is(err, client.ErrShuttingDown) {
		t.Fatalf("sample of an empty buffer: %v, want 503 not_ready", err)
	}
	if d, ok := client.RetryAfter(err); !ok || d != time.Second || ae.RetryAfter != time.Second {
		t.Fatalf("retry after: %v %v (%v)", d, ok, ae.RetryAfter)
	}
	// The server would wait 10 s for data; the client's deadline ends the
	// call first.
	dctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.Sample(dctx, "cp", &client.SampleRequest{BatchSize: 1, TimeoutMS: 10_000}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sample past the deadline: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("sample returned after %v", d)
	}
	// A waiting sample is woken by an extend.
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1, TimeoutMS: 10_000})
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Extend(ctx, "cp", "s", steps([]int64{1, 2, 3}, []bool{false, false, true}, nil)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("waiting sample: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting sample not woken by the extend")
	}
	// A strict slice longer than any trajectory is not ready either.
	if _, err = c.Sample(ctx, "cp", &client.SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: 10}); !client.IsNotReady(err) {
		t.Fatalf("slice longer than any trajectory: %v", err)
	}
}

func TestConnectionReuse(t *testing.T) {
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var conns atomic.Int64
	ts := httptest.NewUnstartedServer(server.New(db, nil).Handler())
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Start()
	defer ts.Close()
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1, Sampler: "bogus"}); !errors.Is(err, client.ErrBadRequest) {
			t.Fatal(err)
		}
		if _, err := c.Extend(ctx, "cp", "s", steps([]int64{int64(i)}, []bool{true}, nil)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Rows(ctx, "cp", 0, 10); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Info(ctx, "nope"); !client.IsNotFound(err) {
			t.Fatal(err)
		}
		if err := c.DeleteBuffer(ctx, "nope"); !client.IsNotFound(err) {
			t.Fatal(err)
		}
		if _, _, err := c.UpdatePriorities(ctx, "cp", []int64{0}, []float64{2}); err != nil {
			t.Fatal(err)
		}
		if err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
		// Drop the buffer's rows: the next round starts empty again.
		if err := c.DeleteBuffer(ctx, "cp"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for sequential calls, want 1", n)
	}
}

func TestMaxResponseBytes(t *testing.T) {
	ts, _ := newServer(t, nil)
	ctx := ctxT(t)
	c := newClient(t, ts.URL, &client.Options{MaxResponseBytes: 1024})
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(ctx, "cp", "s", steps(seqToks(0, 10), make([]bool, 10), nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 1, Keys: []string{"action"}}); err != nil {
		t.Fatalf("small answer: %v", err)
	}
	if _, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 64}); err == nil || !strings.Contains(err.Error(), "MaxResponseBytes") {
		t.Fatalf("large answer: %v", err)
	}
}
