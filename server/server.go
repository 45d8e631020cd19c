package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/internal/sysmem"
)

// Options configures a Server. The zero value gives the defaults.
type Options struct {
	// Token, when set, is an admin token: "Authorization: Bearer <token>"
	// is then required on every endpoint but GET /v1/health.
	Token string
	// Tokens are bearer tokens with their roles (see ParseTokenFile and
	// endpointRoles); Token is added to them as an admin token. With
	// neither, no endpoint needs a token. SetTokens replaces them live.
	Tokens *Tokens
	// MaxBody caps request bodies (413 above it). Zero means 64 MiB.
	MaxBody int64
	// MaxResponse caps sample and rows answers (a 400 for requests that
	// would exceed it). Zero means 1 GiB.
	MaxResponse int64
	// MaxWait caps a sample request's timeout_ms; keep it below the HTTP
	// server's write timeout. Zero means 30s.
	MaxWait time.Duration
	// MaxMemory bounds the memory all requests hold in flight together:
	// bodies being read, decoded rows, answers being built and written.
	// Zero means a quarter of the machine's memory or of the process's
	// cgroup limit, whichever is smaller.
	MaxMemory int64
	// BusyWait is how long a request waits for its share of MaxMemory
	// before it is answered 503 busy. Zero means 2s.
	BusyWait time.Duration
	// Pprof serves Go's runtime profiles under /debug/pprof/ (behind the
	// token, like every endpoint but health). Off by default: a profile
	// costs CPU and shows the program's internals.
	Pprof bool
	// CheckpointRoot is where POST .../checkpoint writes checkpoints (the
	// request names a dir under it). Empty turns checkpoints off (404).
	CheckpointRoot string
	// MaxWaiting bounds the sample requests that may wait for data
	// (timeout_ms > 0) and the sample streams open at once; more are
	// answered 503 busy. Zero means 4096.
	MaxWaiting int
	// StreamStallTimeout is how long a sample stream waits for its client
	// to take a frame before it ends the stream and frees what the stream
	// holds. Zero means 1 minute.
	StreamStallTimeout time.Duration
	// Logger receives operational events, and one line per request when
	// RequestLogger is nil. Nil discards them.
	Logger *slog.Logger
	// RequestLogger, when set, receives the line per request instead of
	// Logger (method, path, status, bytes, duration_ms at level Info):
	// `rbd serve` gives it a batching writer (internal/logbuf), so that a
	// request's line costs no system call of its own.
	RequestLogger *slog.Logger
	// Registry receives the server's metrics and serves /metrics. Nil
	// means a fresh registry (never the global one).
	Registry *prometheus.Registry
	// Weights, when set, serves PUT /v1/collectors/{name}/weights: it
	// replaces the named collector's policy weights from the decoded
	// tensors.
	Weights WeightSetter
}

// WeightSetter replaces policy weights of collectors run by the server.
type WeightSetter interface {
	// SetWeights returns an error wrapping storage.ErrNotFound for an
	// unknown collector (404) and one wrapping storage.ErrInvalidBatch
	// for tensors of the wrong name, dtype or shape (400).
	SetWeights(collector string, tensors map[string][]float32, shapes map[string][]int) error
}

func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 64 << 20
	}
	if c.MaxResponse <= 0 {
		c.MaxResponse = 1 << 30
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 30 * time.Second
	}
	if c.MaxMemory <= 0 {
		c.MaxMemory = DefaultMaxMemory()
	}
	if c.BusyWait <= 0 {
		c.BusyWait = 2 * time.Second
	}
	if c.MaxWaiting <= 0 {
		c.MaxWaiting = 4096
	}
	if c.StreamStallTimeout <= 0 {
		c.StreamStallTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RequestLogger == nil {
		c.RequestLogger = c.Logger
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	return c
}

// DefaultMaxMemory is Options.MaxMemory's default: a quarter of the
// machine's memory or of the process's cgroup limit, whichever is smaller
// (1 GiB when neither can be read).
func DefaultMaxMemory() int64 {
	if m := sysmem.Limit(); m > 0 {
		return m / 4
	}
	return 1 << 30
}

// Server serves one DB over HTTP.
type Server struct {
	db       *rbd.DB
	opts     Options
	log      *slog.Logger
	mux      *http.ServeMux
	metrics  *metrics
	budget   *budget
	shutting atomic.Bool
	// stopping is closed by BeginShutdown: samples waiting for data
	// answer 503 shutting_down at once.
	stopping chan struct{}
	stopOnce sync.Once
	// waiting counts sample requests that may wait for data, and streams.
	waiting atomic.Int64
	// streams counts the sample streams open now.
	streams atomic.Int64
	// idleReleases counts the times TuneMemoryLimit returned a quiet
	// server's freed heap to the OS.
	idleReleases atomic.Int64
	// tokens are the bearer tokens and their roles (SetTokens).
	tokens atomic.Pointer[Tokens]
	// errs remembers failed requests per buffer for the dashboard.
	errs errorLog
	// bodies holds extend bodies for reuse (up to maxPooledBody each): a
	// storage extend copies every byte it keeps, so a body is free once
	// Extend returns.
	bodies bodyPool
	// answers holds buffers (*[]byte) that small binary sample answers are
	// assembled in (writeTensors); at most maxAssembledAnswer each.
	answers sync.Pool
	// sampleBodies holds the buffers sample request bodies are read into
	// (readSampleRequest), up to bodyStartCap each.
	sampleBodies bodyPool
	// answerHeaders holds the buffers single answers' safetensors headers
	// are built in (writeTensors), up to maxPooledHeader each.
	answerHeaders bodyPool
	// contentLengths keeps Content-Length values of recent single
	// answers, by their length mod 16: a learner asks for the same shape
	// every time, so its answers' lengths differ by a few bytes at most
	// (the metadata's digits), and the values need not be formatted and
	// allocated again.
	contentLengths [16]atomic.Pointer[lengthValue]
	// writers holds *statusWriter for reuse (wrap).
	writers sync.Pool
	// requests remembers parsed sample request bodies.
	requests requestCache
}

// New returns a server for db.
func New(db *rbd.DB, opts *Options) *Server {
	o := opts.withDefaults()
	s := &Server{db: db, opts: o, log: o.Logger, mux: http.NewServeMux(), budget: newBudget(o.MaxMemory, o.BusyWait),
		stopping: make(chan struct{})}
	s.bodies.max, s.sampleBodies.max, s.answerHeaders.max = maxPooledBody, bodyStartCap, maxPooledHeader
	s.metrics = newMetrics(o.Registry, db, s.budget, &s.streams, &s.idleReleases)
	s.SetTokens(o.Tokens)
	s.route("GET /v1/health", "health", s.health)
	s.mux.Handle("GET /metrics", s.wrap("metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry})))
	s.route("GET /v1/buffers", "list", s.listBuffers)
	s.route("PUT /v1/buffers/{name}", "create", s.createBuffer)
	s.route("GET /v1/buffers/{name}", "info", s.getBuffer)
	s.route("DELETE /v1/buffers/{name}", "delete", s.deleteBuffer)
	s.route("POST /v1/buffers/{name}/extend", "extend", s.extend)
	s.route("POST /v1/buffers/{name}/sample", "sample", s.sample)
	s.route("POST /v1/buffers/{name}/priorities", "priorities", s.priorities)
	s.route("POST /v1/buffers/{name}/update", "update", s.update)
	s.route("GET /v1/buffers/{name}/rows", "rows", s.rows)
	s.route("DELETE /v1/buffers/{name}/streams/{stream}", "close_stream", s.closeStream)
	s.route("POST /v1/buffers/{name}/checkpoint", "checkpoint", s.checkpoint)
	s.route("PUT /v1/buffers/{name}/rate_limit", "rate_limit", s.setRateLimit)
	s.route("GET /v1/buffers/{name}/stats", "stats", s.bufferStats)
	s.route("GET /v1/activity", "activity", s.activity)
	s.route("GET /v1/collectors", "collectors", s.listCollectors)
	s.route("GET /v1/collectors/{name}", "collector", s.getCollector)
	s.route("PUT /v1/collectors/{name}/weights", "weights", s.setWeights)
	ui := uiHandler()
	s.route("GET /{$}", "ui", ui)
	s.route("GET /ui/{file...}", "ui", ui)
	if o.Pprof {
		s.mux.Handle("GET /debug/pprof/", s.wrap("pprof", http.HandlerFunc(pprof.Index)))
		s.mux.Handle("GET /debug/pprof/cmdline", s.wrap("pprof", http.HandlerFunc(pprof.Cmdline)))
		s.mux.Handle("GET /debug/pprof/profile", s.wrap("pprof", http.HandlerFunc(pprof.Profile)))
		s.mux.Handle("GET /debug/pprof/symbol", s.wrap("pprof", http.HandlerFunc(pprof.Symbol)))
		s.mux.Handle("GET /debug/pprof/trace", s.wrap("pprof", http.HandlerFunc(pprof.Trace)))
	}
	s.mux.Handle("/", s.wrap("not_found", handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{status: http.StatusNotFound, msg: "no such endpoint: " + r.Method + " " + r.URL.Path}
	})))
	return s
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// BeginShutdown makes new requests fail with 503 "shutting_down" and
// answers samples waiting for data the same way at once, while other
// requests in flight finish (http.Server.Shutdown waits for those).
func (s *Server) BeginShutdown() {
	s.shutting.Store(true)
	s.stopOnce.Do(func() { close(s.stopping) })
}

// handlerFunc is an HTTP handler that returns its error instead of writing
// it, so every failure takes the same {"error": ...} path.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) route(pattern, name string, h handlerFunc) {
	s.mux.Handle(pattern, s.wrap(name, h))
}

// statusWriter records the status a handler wrote. It also carries the
// request's lease on the memory budget, so that handlers reach it without
// a context allocation per request (see leaseOf).
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	lease  lease
	// failure is what writeError told the client, for the dashboard's
	// error log.
	failure *errorBody
}

// leaseOf returns the memory lease of the request w answers. Every
// handler's writer is a *statusWriter (wrap makes it); anything else is a
// programming error.
func leaseOf(w http.ResponseWriter) *lease { return &w.(*statusWriter).lease }

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// wrap adds, around every endpoint: the shutdown gate, authentication, the
// body limit, panic containment, request logs and metrics.
func (s *Server) wrap(name string, h http.Handler) http.Handler {
	need, ok := endpointRoles[name]
	if !ok {
		panic(fmt.Sprintf("server: endpoint %q has no role in endpointRoles", name))
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w, _ := s.writers.Get().(*statusWriter)
		if w == nil {
			w = new(statusWriter)
		}
		*w = statusWriter{ResponseWriter: rw, lease: lease{b: s.budget}}
		defer func() { // runs last: the answer is written by then
			w.lease.release()
			// net/http forbids using a ResponseWriter once its handler
			// has returned, so the wrapper can serve the next request.
			*w = statusWriter{}
			s.writers.Put(w)
		}()
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error("handler panic", "endpoint", name, "panic", p)
				if w.status == 0 {
					writeError(w, errors.New("internal error"))
				}
			}
			if w.status == 0 {
				w.status = http.StatusOK
			}
			s.metrics.observe(name, w.status, time.Since(start))
			if w.status >= 400 {
				s.noteFailure(name, r, w)
			}
			if rl := s.opts.RequestLogger; rl.Enabled(r.Context(), slog.LevelInfo) {
				// LogAttrs: no argument boxed into an interface.
				rl.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("method", r.Method),
					slog.String("path", r.URL.Path), slog.Int("status", w.status), slog.Int64("bytes", w.bytes),
					slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
			}
		}()
		if s.shutting.Load() && name != "health" {
			writeError(w, &apiError{status: http.StatusServiceUnavailable, code: "shutting_down", msg: "server is shutting down"})
			return
		}
		if err := s.authorize(r, need); err != nil {
			if ae, ok := err.(*apiError); ok && ae.status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="rbd"`)
			}
			writeError(w, err)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBody)
		h.ServeHTTP(w, r)
	})
}

// bufferEndpoints are the endpoints whose {name} is a buffer: their
// failures go into that buffer's error log.
var bufferEndpoints = map[string]bool{"create": true, "info": true, "delete": true, "extend": true, "sample": true,
	"priorities": true, "update": true, "rows": true, "close_stream": true, "checkpoint": true, "rate_limit": true, "stats": true}

// noteFailure remembers a failed request in its buffer's error log, if it
// named an existing buffer.
func (s *Server) noteFailure(endpoint string, r *http.Request, w *statusWriter) {
	name := r.PathValue("name")
	if !bufferEndpoints[endpoint] || name == "" {
		return
	}
	if _, err := s.db.Buffer(name); err != nil {
		return
	}
	f := failedRequest{Time: time.Now().UTC(), Endpoint: endpoint, Status: w.status}
	if w.failure != nil {
		f.Code, f.Error = w.failure.Code, w.failure.Error
	}
	s.errs.note(name, f)
}

func (h handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h(w, r); err != nil {
		writeError(w, err)
	}
}

// healthAnswer is GET /v1/health: "ok" while the server answers, with the
// figures an operator checks first when requests are refused.
type healthAnswer struct {
	Status string       `json:"status"`
	Memory healthMemory `json:"memory"`
}

type healthMemory struct {
	// Requests in flight against --max-memory.
	BudgetBytes   int64 `json:"budget_bytes"`
	InFlightBytes int64 `json:"in_flight_bytes"`
	RefusedTotal  int64 `json:"refused_total"`
	// What the buffers may hold once full, against what is left to them.
	BuffersBytes      int64 `json:"buffers_bytes"`
	BuffersLimitBytes int64 `json:"buffers_limit_bytes"`
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) error {
	used, limit := s.db.Store().MemoryUse()
	writeJSON(w, http.StatusOK, healthAnswer{Status: "ok", Memory: healthMemory{
		BudgetBytes: s.budget.total, InFlightBytes: s.budget.used(), RefusedTotal: s.budget.refused.Load(),
		BuffersBytes: used, BuffersLimitBytes: limit,
	}})
	return nil
}
