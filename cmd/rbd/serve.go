package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/internal/logbuf"
	"github.com/rbdb/rbd/internal/sysmem"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

type serveOptions struct {
	addr        string
	data        string
	token       string
	insecure    bool
	demo        bool
	demoRate    float64
	demoSPI     float64
	demoSeed    uint64
	demoEnv     string
	demoHidden  int
	maxBody     int64
	maxResponse int64
	checkpoint  time.Duration
	addrFile    string
	maxMemory   int64
	maxBuffers  int
	maxStreams  int
	maxWaiting  int
	streamStall time.Duration
	streamIdle  time.Duration
	cpRoot      string
	pprof       bool
	tokenFile   string
	tlsCert     string
	tlsKey      string
	tlsClientCA string
	// shutdownTimeout bounds the drain of requests in flight at shutdown.
	shutdownTimeout time.Duration
}

func newServeCommand() *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a data dir over HTTP (actors extend, learners sample)",
		Long: `serve opens the data dir and serves the HTTP API v1 (docs/http-api.md).

It listens on 127.0.0.1:7450 by default. With a token (--token or RBD_TOKEN)
every endpoint but /v1/health needs "Authorization: Bearer <token>"; a
non-loopback address without a token is refused unless --insecure.

--demo creates (or reuses) a buffer "demo" of CartPole-v1 steps fed by a
built-in collector: 8 envs, an epsilon-greedy linear Q policy starting from
zero weights, at most --demo-rate steps/s. A learner replaces the policy with
PUT /v1/collectors/demo/weights (safetensors: an MLP Q-network w1 [4,H],
b1 [H], w2 [H,2], b2 [2], or linear w [4,2], b [2]; optionally epsilon);
GET /v1/collectors/demo shows how long its episodes last. --demo-spi N puts
a rate limit of N sampled rows per inserted row on the demo buffer, so the
collector waits for the learner (docs/flow-control.md).

--demo-env cartpole-masked runs CartPole with only the positions observed
(x, theta): the demo buffer stores each row's recurrent_state
[--demo-hidden], the policy starts as a zero-weight GRU, and a learner may
push a GRU (w_ih [2,3H], w_hh [H,3H], b_ih [3H], b_hh [3H], w_q [H,2],
b_q [2]) as well as the other kinds (docs/recurrent.md,
examples/r2d2.py).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.token == "" {
				o.token = os.Getenv("RBD_TOKEN")
			}
			return runServe(cmd.Context(), cmd.ErrOrStderr(), o, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "addr", "127.0.0.1:7450", "listen address")
	f.StringVar(&o.data, "data", "./rbd-data", "data dir")
	f.StringVar(&o.token, "token", "", "bearer token required on every endpoint but health (default $RBD_TOKEN)")
	f.BoolVar(&o.insecure, "insecure", false, "allow a non-loopback address without a token")
	f.BoolVar(&o.demo, "demo", false, "run a built-in CartPole collector feeding buffer \"demo\"")
	f.Float64Var(&o.demoRate, "demo-rate", 5000, "demo collector steps per second at most")
	f.Float64Var(&o.demoSPI, "demo-spi", 0, "rate-limit the demo buffer to this many sampled rows per inserted row (min_size 1000); 0 leaves its rate limit as it is")
	f.Uint64Var(&o.demoSeed, "demo-seed", 0, "seed of the demo collector's envs and exploration (0: from the clock)")
	f.StringVar(&o.demoEnv, "demo-env", "cartpole", "env of the demo collector: cartpole, or cartpole-masked (positions only; the buffer stores recurrent states for a GRU policy)")
	f.IntVar(&o.demoHidden, "demo-hidden", 32, "with --demo-env cartpole-masked: the GRU width, i.e. the recurrent_state values stored per row")
	f.Int64Var(&o.maxBody, "max-body", 64<<20, "largest request body in bytes (413 above)")
	f.Int64Var(&o.maxResponse, "max-response", 1<<30, "largest sample answer in bytes (400 above)")
	f.DurationVar(&o.checkpoint, "checkpoint-interval", time.Second, "how often flush-mode buffers are synced")
	f.Int64Var(&o.maxMemory, "max-memory", 0, "memory all requests may hold in flight together, in bytes (503 busy past it); 0 means a quarter of the machine's or cgroup's memory")
	f.IntVar(&o.maxBuffers, "max-buffers", 1024, "buffers the data dir may hold (507 too_many_buffers past it)")
	f.IntVar(&o.maxStreams, "max-streams", 65536, "streams with an open trajectory per buffer (429 too_many_streams past it)")
	f.IntVar(&o.maxWaiting, "max-waiting", 4096, "sample requests that may wait for data, and sample streams, at once (503 busy past it)")
	f.DurationVar(&o.streamStall, "stream-stall-timeout", time.Minute, "end a sample stream whose client takes no batch (or, over shared memory, frees no slot) for this long")
	f.DurationVar(&o.streamIdle, "stream-idle-timeout", time.Hour, "close a stream (its open trajectories end as truncated) after this long without an extend; 0 never")
	f.StringVar(&o.cpRoot, "checkpoint-root", "./rbd-checkpoints", "where POST .../checkpoint writes hot checkpoints (the request names a dir under it); empty turns them off")
	f.StringVar(&o.tokenFile, "token-file", "", "bearer tokens with roles, one \"ROLE TOKEN\" per line (read, write, admin); reloaded on SIGHUP and when it changes")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate (chain); reloaded on SIGHUP and when it changes")
	f.StringVar(&o.tlsKey, "tls-key", "", "the PEM private key of --tls-cert")
	f.StringVar(&o.tlsClientCA, "tls-client-ca", "", "require client certificates signed by these PEM CAs (mutual TLS)")
	f.BoolVar(&o.pprof, "pprof", false, "serve Go's profiles under /debug/pprof/ (behind the token)")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may take to finish before their connections are cut")
	f.StringVar(&o.addrFile, "addr-file", "", "write the listening address (host:port) to this file once serving (useful with --addr 127.0.0.1:0)")
	return cmd
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// runServe serves until ctx ends. ready, if set, receives the listening
// address (tests use --addr 127.0.0.1:0).
//
// Shutdown (ctx ends: SIGINT or SIGTERM): new requests and samples waiting
// for data get 503 shutting_down at once, requests in flight get up to
// --shutdown-timeout to finish, then every connection is cut and the store
// is closed. A second signal cuts at once. The exit code is 0 unless the
// store failed to close cleanly.
func runServe(ctx context.Context, stderr io.Writer, o *serveOptions, ready func(addr string)) error {
	if !isLoopback(o.addr) && o.token == "" && o.tokenFile == "" && !o.insecure {
		return fmt.Errorf("refusing to listen on non-loopback %s without a token: set --token, RBD_TOKEN or --token-file (or --insecure)", o.addr)
	}
	if o.maxMemory < 0 {
		return fmt.Errorf("--max-memory %d: must not be negative (0 means the default)", o.maxMemory)
	}
	// Request lines are batched (a system call each had cost 10% of a
	// small sample); every other line goes out at once, after them.
	logw := logbuf.New(stderr, nil)
	defer logw.Close()
	log := slog.New(slog.NewJSONHandler(logw.Immediate(), nil))
	requestLog := slog.New(slog.NewJSONHandler(logw, nil))
	sec, tokens, err := loadSecrets(o, log)
	if err != nil {
		return err
	}
	defer signal.Stop(sec.hup)
	scheme := "http"
	if sec.tls != nil {
		scheme = "https"
	} else if !isLoopback(o.addr) && (o.token != "" || o.tokenFile != "") {
		log.Warn("tokens travel in clear text: anyone who can read this network sees them; serve with --tls-cert and --tls-key", "addr", o.addr)
	}
	// The address first: a port that is taken must fail before the data
	// dir is touched (or a demo buffer created in it).
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.addr, err)
	}
	defer ln.Close()
	maxMemory := o.maxMemory
	if maxMemory == 0 {
		maxMemory = server.DefaultMaxMemory()
	}
	if o.maxBody > maxMemory {
		return fmt.Errorf("--max-body %d is larger than --max-memory %d: no such body could ever be read", o.maxBody, maxMemory)
	}
	fdLimit, err := storage.RaiseFileLimit()
	if err != nil {
		log.Warn("could not raise the open-file limit", "err", err)
	}
	streamIdle := o.streamIdle
	if streamIdle == 0 {
		streamIdle = -1 // storage: never
	}
	db, err := rbd.Open(o.data, &rbd.Options{Logger: log, CheckpointInterval: o.checkpoint, MemoryLimit: storeMemoryLimit(maxMemory),
		MaxBuffers: o.maxBuffers, MaxStreams: o.maxStreams, StreamIdleTimeout: streamIdle})
	if err != nil {
		return err
	}
	opts := &server.Options{Token: o.token, Tokens: tokens, MaxBody: o.maxBody, MaxResponse: o.maxResponse, MaxMemory: maxMemory,
		MaxWaiting: o.maxWaiting, StreamStallTimeout: o.streamStall, CheckpointRoot: o.cpRoot, Pprof: o.pprof, Logger: log,
		RequestLogger: requestLog}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// collectorDone stays nil without --demo: a nil channel never fires in
	// the select below, so the server runs until ctx ends.
	var collectorDone chan error
	if o.demo {
		collectorDone = make(chan error, 1)
		so := collector.SpecOptions{Capacity: 100_000, CompactObs: true, Priority: true}
		switch o.demoEnv {
		case "cartpole":
		case "cartpole-masked":
			if o.demoHidden < 1 || o.demoHidden > demoMaxHidden {
				return errors.Join(fmt.Errorf("--demo-hidden %d: want 1..%d", o.demoHidden, demoMaxHidden), db.Close())
			}
			so.RecurrentState = o.demoHidden
		default:
			return errors.Join(fmt.Errorf("--demo-env %q: want cartpole or cartpole-masked", o.demoEnv), db.Close())
		}
		env, err := envs.New(o.demoEnv, demoEnvs, nil)
		if err != nil {
			return errors.Join(err, db.Close())
		}
		spec := collector.BufferSpec(env.Spec(), so)
		buf, _, err := db.CreateBuffer("demo", spec)
		if err != nil {
			return errors.Join(fmt.Errorf("demo buffer: %w", err), env.Close(), db.Close())
		}
		if o.demoSPI != 0 {
			if err := buf.SetRateLimit(demoRateLimit(o.demoSPI)); err != nil {
				return errors.Join(fmt.Errorf("--demo-spi: %w", err), env.Close(), db.Close())
			}
		}
		demo := newDemoCollector(env.Spec(), so.RecurrentState)
		// Versions continue from the rows a previous run left, so rows of
		// this run's policies are never counted as older than those.
		if pv, err := buf.PolicyVersions(); err == nil && pv.Newest > 0 {
			demo.version.Store(pv.Newest)
		}
		opts.Weights = demo
		seed := o.demoSeed
		if seed == 0 {
			seed = uint64(time.Now().UnixNano())
		}
		go func() {
			defer env.Close()
			_, err := collector.Run(runCtx, collector.Config{
				Env: env, Policy: demo.policy(), Writer: collector.BufferWriter{Buffer: buf.Buffer},
				FramesPerBatch: 256, MaxRate: o.demoRate, CompactObs: true, Stream: "demo-collector",
				Seed:          seed,
				BeforeBatch:   func(_ context.Context, st collector.Stats) error { demo.observe(st); return nil },
				OnRateLimited: demo.observe,
				PolicyVersion: demo.version.Load,
			})
			collectorDone <- err
		}()
	}
	waitCollector := func() error {
		if collectorDone == nil {
			return nil
		}
		return <-collectorDone
	}
	srv := server.New(db, opts)
	sec.srv = srv
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		// Sample streams size their connection's send buffer.
		ConnContext: server.ConnContext,
		// net/http's own complaints (TLS handshakes, bad requests) go to
		// the same JSON log as everything else.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if sec.tls != nil {
		hs.TLSConfig = sec.tls.Config()
	}
	log.Info("serving", "addr", scheme+"://"+ln.Addr().String(), "data", o.data, "demo", o.demo, "auth", o.token != "" || tokens.Len() > 0,
		"max_memory", maxMemory, "max_body", o.maxBody, "open_file_limit", fdLimit)
	if ready != nil {
		ready(ln.Addr().String())
	}
	if o.addrFile != "" {
		tmp := o.addrFile + ".tmp"
		err := os.WriteFile(tmp, []byte(ln.Addr().String()+"\n"), 0o644)
		if err == nil {
			err = os.Rename(tmp, o.addrFile)
		}
		if err != nil {
			log.Error("write --addr-file", "path", o.addrFile, "err", err)
		}
	}
	serveErr := make(chan error, 1)
	go func() {
		if sec.tls != nil {
			serveErr <- hs.ServeTLS(ln, "", "")
		} else {
			serveErr <- hs.Serve(ln)
		}
	}()
	go srv.TuneMemoryLimit(runCtx)
	go sec.watch(runCtx)
	var firstErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		firstErr = err
	case err := <-collectorDone:
		firstErr = fmt.Errorf("demo collector stopped: %w", err)
		if err == nil {
			firstErr = errors.New("demo collector stopped")
		}
		collectorDone <- nil // for waitCollector below
	}
	// A second signal during the drain cuts it short.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	log.Info("shutting down", "drain_timeout", o.shutdownTimeout.String())
	srv.BeginShutdown()
	stopRun()
	drainCtx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	go func() {
		select {
		case <-again:
			log.Warn("second signal: cutting every connection now")
			cancel()
		case <-drainCtx.Done():
		}
	}()
	if err := hs.Shutdown(drainCtx); err != nil {
		// Requests still running past the drain (a client reading slowly,
		// say) are cut: that is the point of the timeout, not a failure.
		log.Warn("drain ended with requests still in flight; closing their connections", "err", err)
		hs.Close()
	}
	err = errors.Join(firstErr, waitCollector())
	if cerr := db.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close store: %w", cerr))
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err == nil {
		log.Info("stopped cleanly")
	}
	return err
}

// storeMemoryLimit is what buffers may hold once full: what this process
// may use, less the requests' budget.
func storeMemoryLimit(maxMemory int64) int64 {
	m := sysmem.Limit()
	if m <= 0 {
		return 0 // storage's own default
	}
	return max(m-maxMemory, m/4)
}
