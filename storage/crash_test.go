package storage

// Crash tests: a real writer process (this test binary, re-executed as
// TestCrashHelperProcess) is killed with SIGKILL, at random moments or at
// the package's deterministic crash points (RBD_CRASH_AT), and the parent
// checks what reopening the data dir yields against what the child
// acknowledged.
//
// Every row is a deterministic function of a unique token (stored in the
// "action" column), so any row found in the store can be checked byte for
// byte, acknowledged or not, and the child reports each extend on stdout
// before (BEGIN) and after (ACK) it runs.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Rows as functions of a token.

const crashBlobBytes = 300

// crashSpec is the schema of the crash and concurrency tests: a CartPole-like
// row plus a larger "blob" field, so that a row spans more than one cache
// line and, in the column files, often a page boundary.
func crashSpec(kind Kind, capacity int64, blob int, compact bool, dur Durability) Spec {
	fields := []Field{
		{Name: "observation", DType: Float32, Shape: []int{4}},
		{Name: "action", DType: Int64, Shape: []int{}},
		{Name: "next.reward", DType: Float32, Shape: []int{}},
		{Name: "blob", DType: Uint8, Shape: []int{blob}},
		{Name: "next.done", DType: Bool, Shape: []int{}},
		{Name: "next.terminated", DType: Bool, Shape: []int{}},
		{Name: "next.truncated", DType: Bool, Shape: []int{}},
	}
	if !compact {
		fields = append(fields, Field{Name: "next.observation", DType: Float32, Shape: []int{4}})
	}
	if kind == KindCompressed {
		// The obs key too goes into chunks (with its final observations).
		fields[0].Compress = new(true)
	}
	s := Spec{Capacity: capacity, Storage: kind, Fields: fields, CompactObs: compact, ObsKeys: []string{"observation"}}
	if kind != KindMemory {
		s.Durability = dur
	}
	if kind == KindMemmap {
		s.RowMetaLayout = testMemmapRowMeta
	}
	return s
}

// The buffers of the crash tests: "fs" is fsync and compact_obs (final
// observations in tail columns), "fl" is flush and keeps next.observation
// as a field. Different capacities catch slot arithmetic mix-ups.
const (
	crashFsync = "fs"
	crashFlush = "fl"
	// crashFsyncRuns is crashFsync with rows.meta format version 2 and a
	// run log (row_meta "runs"), whatever RBD_TEST_MEMMAP_ROW_META says.
	crashFsyncRuns = "rs"
	// crashFsyncStrided is crashFsyncRuns with strided memory records
	// (row_meta "strided": the same files, 8-byte pass-stamped records
	// rebuilt from them on open).
	crashFsyncStrided = "ss"
	// crashFsyncBlocks has rows.meta format version 3 (row_meta
	// "blocks"), rows of 131 checksummed bytes (staged a block at a time)
	// and a capacity that is not a whole number of blocks.
	crashFsyncBlocks = "sb"
	// crashFlushBlocks is a flush buffer on version 3 that keeps
	// next.observation as a field.
	crashFlushBlocks = "fb"
	// crashNone is a none buffer on version 3: its seq reservations run
	// a lap ahead, so an open that resumed past them after a crash of the
	// process would empty it.
	crashNone = "nn"
)

func crashSpecFor(name string) Spec {
	switch name {
	case crashFsync:
		return crashSpec(KindMemmap, 512, crashBlobBytes, true, DurabilityFsync)
	case crashFlush:
		return crashSpec(KindMemmap, 320, crashBlobBytes, false, DurabilityFlush)
	case crashFsyncRuns:
		s := crashSpec(KindMemmap, 448, crashBlobBytes, true, DurabilityFsync)
		s.RowMetaLayout = RowMetaRuns
		return s
	case crashFsyncStrided:
		s := crashSpec(KindMemmap, 384, crashBlobBytes, true, DurabilityFsync)
		s.RowMetaLayout = RowMetaStrided
		return s
	case crashFsyncBlocks:
		s := crashSpec(KindMemmap, 416, 100, true, DurabilityFsync)
		s.RowMetaLayout = RowMetaBlocks
		return s
	case crashFlushBlocks:
		s := crashSpec(KindMemmap, 352, 24, false, DurabilityFlush)
		s.RowMetaLayout = RowMetaBlocks
		return s
	case crashNone:
		s := crashSpec(KindMemmap, 288, 24, false, DurabilityNone)
		s.RowMetaLayout = RowMetaBlocks
		return s
	}
	panic("unknown crash buffer " + name)
}

func crashMix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// crashFill fills dst with bytes derived from (token, salt).
func crashFill(dst []byte, token int64, salt uint64) {
	x := crashMix(uint64(token)*0x100000001B3 ^ salt<<56)
	var w [8]byte
	for i := 0; i < len(dst); i += 8 {
		binary.LittleEndian.PutUint64(w[:], crashMix(x+uint64(i)))
		copy(dst[i:], w[:])
	}
}

func crashEnvOf(token int64) int64 { return int64(crashMix(uint64(token)^0xE17) % 3) }

// crashFlagsOf makes about one row in eight end its trajectory, half of them
// terminated and half truncated.
func crashFlagsOf(token int64) (terminated, truncated bool) {
	h := crashMix(uint64(token)^0xD0E) % 16
	return h == 0, h == 1
}

func crashBool(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// crashFieldBytes writes what column name holds for the row of token.
func crashFieldBytes(name string, token int64, dst []byte) {
	term, trunc := crashFlagsOf(token)
	switch name {
	case "action":
		binary.LittleEndian.PutUint64(dst, uint64(token))
	case "next.done":
		dst[0] = crashBool(term || trunc)
	case "next.terminated":
		dst[0] = crashBool(term)
	case "next.truncated":
		dst[0] = crashBool(trunc)
	case "observation":
		crashFill(dst, token, 1)
	case "next.reward":
		crashFill(dst, token, 2)
	case "blob":
		crashFill(dst, token, 3)
	case "next.observation":
		crashFill(dst, token, 4)
	default:
		panic("crashFieldBytes: unknown column " + name)
	}
}

// crashBatch builds the rows of tokens. Compact buffers get final
// observations on every done row, as D rows or (fullTails) as N rows whose
// values on rows that are not done are junk the buffer must ignore.
func crashBatch(spec Spec, tokens []int64, fullTails bool) *Batch {
	n := len(tokens)
	b := &Batch{Rows: n, Fields: map[string][]byte{}, Env: make([]int64, n)}
	for _, f := range spec.Fields {
		rb := f.RowBytes()
		buf := make([]byte, n*rb)
		for i, tok := range tokens {
			crashFieldBytes(f.Name, tok, buf[i*rb:(i+1)*rb])
		}
		b.Fields[f.Name] = buf
	}
	for i, tok := range tokens {
		b.Env[i] = crashEnvOf(tok)
	}
	if spec.CompactObs {
		for _, k := range spec.ObsKeys {
			f, _ := spec.Field(k)
			rb := f.RowBytes()
			var tail []byte
			for _, tok := range tokens {
				term, trunc := crashFlagsOf(tok)
				row := make([]byte, rb)
				switch {
				case term || trunc:
					crashFieldBytes("next."+k, tok, row)
				case fullTails:
					for j := range row {
						row[j] = 0xA5
					}
				default:
					continue
				}
				tail = append(tail, row...)
			}
			if fullTails || len(tail) > 0 {
				b.Fields["next."+k] = tail
			}
		}
	}
	return b
}

// crashColumns lists every readable column of b: the spec's fields, then the
// tail columns.
func crashColumns(b *Buffer) []Column {
	var cols []Column
	spec := b.Spec()
	for _, f := range spec.Fields {
		c, _ := b.Column(f.Name)
		cols = append(cols, c)
	}
	if spec.CompactObs {
		for _, k := range spec.ObsKeys {
			c, _ := b.Column("next." + k)
			cols = append(cols, c)
		}
	}
	return cols
}

func crashDst(cols []Column, n int) [][]byte {
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = make([]byte, n*c.RowBytes)
	}
	return dst
}

// crashCheckRow checks that row j of a gather is whole: every column holds
// exactly the bytes of the token found in its "action" column, and its
// metadata (env, flags, tail) is the one that token was written with. It
// returns the token. Writers of these tests always send final observations,
// so in compact buffers HasTail == Done.
func crashCheckRow(cols []Column, dst [][]byte, j int, m RowMeta, scratch []byte) (int64, error) {
	token := int64(-1)
	for i, c := range cols {
		if c.Name == "action" {
			token = int64(binary.LittleEndian.Uint64(dst[i][j*c.RowBytes:]))
		}
	}
	if token < 0 {
		return -1, fmt.Errorf("seq %d: no action column or negative token", m.Seq)
	}
	for i, c := range cols {
		got := dst[i][j*c.RowBytes : (j+1)*c.RowBytes]
		want := scratch[:c.RowBytes]
		switch {
		case c.Tail && !m.HasTail:
			clear(want)
		default:
			crashFieldBytes(c.Name, token, want)
		}
		if !bytes.Equal(got, want) {
			k := 0
			for k < len(got) && got[k] == want[k] {
				k++
			}
			return token, fmt.Errorf("seq %d (token %d): column %q differs at byte %d of %d: got %#x, want %#x (torn or foreign row)",
				m.Seq, token, c.Name, k, len(got), got[k], want[k])
		}
	}
	term, trunc := crashFlagsOf(token)
	if m.Env != crashEnvOf(token) || m.Terminated != term || m.Truncated != trunc || m.Done != (term || trunc) {
		return token, fmt.Errorf("seq %d (token %d): metadata env=%d done=%v term=%v trunc=%v, row was written with env=%d term=%v trunc=%v",
			m.Seq, token, m.Env, m.Done, m.Terminated, m.Truncated, crashEnvOf(token), term, trunc)
	}
	compact := false
	for _, c := range cols {
		compact = compact || c.Tail
	}
	if compact && m.HasTail != m.Done {
		return token, fmt.Errorf("seq %d (token %d): has_tail=%v but done=%v (every done row was written with its final observation)", m.Seq, token, m.HasTail, m.Done)
	}
	return token, nil
}

// ---------------------------------------------------------------------------
// The child: a writer process that is killed.

const crashHelperEnv = "RBD_CRASH_HELPER"

// TestCrashHelperProcess is not a test: it is the writer process the crash
// tests start and kill. It only runs when re-executed by them.
func TestCrashHelperProcess(t *testing.T) {
	if os.Getenv(crashHelperEnv) != "1" {
		t.Skip("helper process of the crash tests; runs only when they re-execute the test binary")
	}
	if err := crashChild(); err != nil {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		os.Exit(3)
	}
	os.Exit(0)
}

func crashEnvInt(name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: %v", name, v, err))
	}
	return n
}

// crashChild opens the store, creates (or reuses) the buffers named in
// RBD_CRASH_BUFS and writes batches of 1..40 rows to them until killed.
// Protocol on stdout, one line per event, each written with one write(2):
//
//	START <buffer> <write_count>
//	READY
//	BEGIN <buffer> <writer> <rows> <first token>          (before Extend)
//	ACK <buffer> <writer> <first_seq> <rows> <first token> <write_count>
//	DONE                                                  (limit reached)
func crashChild() error {
	return runCrashChild(crashSpecFor, crashFsync, func(spec Spec, writer int) crashWriter {
		return &plainCrashWriter{spec: spec, stream: fmt.Sprintf("w%d", writer)}
	})
}

// crashWriter makes the extends of one writer goroutine of a crash child.
type crashWriter interface {
	// size draws the number of rows of the next extend.
	size(rng *rand.Rand) int
	// next returns the stream and batch of rows carrying tokens.
	next(rng *rand.Rand, tokens []int64) (stream string, batch *Batch)
	// acked runs after the extend of rows from first on was acknowledged.
	acked(b *Buffer, stream string, first int64) error
}

// plainCrashWriter writes crashBatch rows of 1..40 on one stream.
type plainCrashWriter struct {
	spec   Spec
	stream string
}

func (w *plainCrashWriter) next(rng *rand.Rand, tokens []int64) (string, *Batch) {
	return w.stream, crashBatch(w.spec, tokens, rng.IntN(2) == 0)
}

func (w *plainCrashWriter) acked(*Buffer, string, int64) error { return nil }

func (w *plainCrashWriter) size(rng *rand.Rand) int { return 1 + rng.IntN(40) }

// runCrashChild is the child's loop: specFor gives each buffer's spec, the
// buffer named fsyncName gets two writers (group commit), newWriter makes
// each writer's batches.
func runCrashChild(specFor func(string) Spec, fsyncName string, newWriter func(spec Spec, writer int) crashWriter) error {
	dir := os.Getenv("RBD_CRASH_DIR")
	tokenBase := crashEnvInt("RBD_CRASH_TOKEN", 1)
	seed := uint64(crashEnvInt("RBD_CRASH_SEED", 1))
	writersPer := int(crashEnvInt("RBD_CRASH_WRITERS", 0))
	maxExt := int(crashEnvInt("RBD_CRASH_MAX_EXTENDS", 0))
	ckptEach := os.Getenv("RBD_CRASH_CHECKPOINT_EACH") == "1"
	interval := time.Duration(crashEnvInt("RBD_CRASH_INTERVAL_MS", 20)) * time.Millisecond
	bufs := strings.Split(os.Getenv("RBD_CRASH_BUFS"), ",")

	s, err := Open(dir, &Options{CheckpointInterval: interval})
	if err != nil {
		return err
	}
	out := func(format string, args ...any) {
		// One write per line: a pipe write of less than PIPE_BUF is atomic,
		// so lines of concurrent writers never interleave.
		os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
	}
	type target struct {
		name string
		b    *Buffer
		spec Spec
	}
	var targets []target
	for _, name := range bufs {
		spec := specFor(name)
		b, _, err := s.CreateBuffer(name, spec)
		if err != nil {
			return err
		}
		targets = append(targets, target{name, b, b.Spec()})
		out("START %s %d", name, b.WriteCount())
	}
	out("READY")
	var tok atomic.Int64
	tok.Store(tokenBase)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	w := 0
	for _, tg := range targets {
		n := writersPer
		if n == 0 {
			n = 1
			if tg.name == fsyncName {
				n = 2 // two streams share fsyncs (group commit)
			}
		}
		for i := 0; i < n; i++ {
			w++
			wg.Add(1)
			go func(tg target, writer int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(writer)))
				cw := newWriter(tg.spec, writer)
				for k := 0; maxExt == 0 || k < maxExt; k++ {
					n := cw.size(rng)
					first := tok.Add(int64(n)) - int64(n)
					tokens := make([]int64, n)
					for j := range tokens {
						tokens[j] = first + int64(j)
					}
					stream, batch := cw.next(rng, tokens)
					out("BEGIN %s %d %d %d", tg.name, writer, n, first)
					res, err := tg.b.Extend(stream, batch)
					if err != nil {
						errc <- err
						return
					}
					out("ACK %s %d %d %d %d %d", tg.name, writer, res.FirstSeq, res.Rows, first, res.WriteCount)
					if err := cw.acked(tg.b, stream, first); err != nil {
						errc <- err
						return
					}
					if ckptEach {
						if err := s.Checkpoint(); err != nil {
							errc <- err
							return
						}
					}
				}
			}(tg, w)
		}
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	out("DONE")
	return s.Close()
}

// ---------------------------------------------------------------------------
// The parent: run a child, kill it, read what it acknowledged.

type crashChildCfg struct {
	dir        string
	seed       uint64
	tokenBase  int64
	bufs       []string
	writers    int // per buffer; 0: two on fs, one on fl
	maxExt     int // per writer; 0: unlimited
	ckptEach   bool
	intervalMS int
	crashAt    string
	crashAfter int
	// killAfter > 0: SIGKILL the child that long after it is READY.
	// 0: wait for it to kill itself at its crash point, or, with
	// cleanExit, to finish its maxExt extends and close the store.
	killAfter time.Duration
	// killAtAcks > 0: SIGKILL the child once it has acknowledged that
	// many extends of bufs[0] (an event, not a time: a busy machine
	// writes less in a given time).
	killAtAcks int
	cleanExit  bool
}

type crashExt struct {
	buf          string
	writer, rows int
	token, first int64
	wc           int64
	acked        bool
}

// maxWriteCount is the most the child can have written to buffer name:
// its start plus every row it began to write (last if it reported no
// start).
func (r *crashRun) maxWriteCount(name string, last int64) int64 {
	start, ok := r.start[name]
	if !ok {
		return last
	}
	for _, e := range r.begins {
		if e.buf == name {
			start += int64(e.rows)
		}
	}
	return start
}

type crashRun struct {
	start  map[string]int64
	begins []*crashExt
	acks   []*crashExt
	ready  bool
	done   bool // the child finished its extends (then it closes the store)
	stderr string
}

// inFlight returns the extends of buf that began but were not acknowledged.
func (r *crashRun) inFlight(buf string) []*crashExt {
	var out []*crashExt
	for _, e := range r.begins {
		if e.buf == buf && !e.acked {
			out = append(out, e)
		}
	}
	return out
}

func (r *crashRun) acksOf(buf string) []*crashExt {
	var out []*crashExt
	for _, e := range r.acks {
		if e.buf == buf {
			out = append(out, e)
		}
	}
	return out
}

func crashChildEnv(cfg crashChildCfg) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RBD_CRASH") {
			env = append(env, kv)
		}
	}
	env = append(env,
		crashHelperEnv+"=1",
		"RBD_CRASH_DIR="+cfg.dir,
		fmt.Sprintf("RBD_CRASH_TOKEN=%d", cfg.tokenBase),
		fmt.Sprintf("RBD_CRASH_SEED=%d", cfg.seed),
		fmt.Sprintf("RBD_CRASH_WRITERS=%d", cfg.writers),
		fmt.Sprintf("RBD_CRASH_MAX_EXTENDS=%d", cfg.maxExt),
		fmt.Sprintf("RBD_CRASH_INTERVAL_MS=%d", cfg.intervalMS),
		"RBD_CRASH_BUFS="+strings.Join(cfg.bufs, ","),
	)
	if cfg.ckptEach {
		env = append(env, "RBD_CRASH_CHECKPOINT_EACH=1")
	}
	if cfg.crashAt != "" {
		env = append(env, "RBD_CRASH_AT="+cfg.crashAt, fmt.Sprintf("RBD_CRASH_AFTER=%d", cfg.crashAfter))
	}
	return env
}

// crashRunChild runs one child to its death by SIGKILL and returns what it
// reported. It fails the test if the child dies any other way.
func crashRunChild(t *testing.T, cfg crashChildCfg) *crashRun {
	t.Helper()
	t.Cleanup(func() { removeWitnessesUnder(t, cfg.dir) })
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperProcess$", "-test.timeout=5m")
	cmd.Env = crashChildEnv(cfg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		r := bufio.NewReader(pipe)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return // a last line without its newline was cut by the kill
			}
			lines <- strings.TrimSuffix(line, "\n")
		}
	}()
	run := &crashRun{start: map[string]int64{}}
	byToken := map[int64]*crashExt{}
	acked := 0 // extends of cfg.bufs[0] acknowledged (killAtAcks)
	var kill <-chan time.Time
	deadline := time.After(90 * time.Second)
	killed := false
	parse := func(line string) {
		f := strings.Fields(line)
		num := func(i int) int64 {
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
			return n
		}
		switch {
		case len(f) == 1 && f[0] == "READY":
			run.ready = true
			if cfg.killAfter > 0 {
				kill = time.After(cfg.killAfter)
			}
		case len(f) == 3 && f[0] == "START":
			run.start[f[1]] = num(2)
		case len(f) == 5 && f[0] == "BEGIN":
			e := &crashExt{buf: f[1], writer: int(num(2)), rows: int(num(3)), token: num(4), first: -1}
			run.begins = append(run.begins, e)
			byToken[e.token] = e
		case len(f) == 7 && f[0] == "ACK":
			e := byToken[num(5)]
			if e == nil || e.buf != f[1] || int64(e.rows) != num(4) {
				t.Fatalf("child acknowledged an extend it never began: %q", line)
			}
			e.first, e.wc, e.acked = num(3), num(6), true
			run.acks = append(run.acks, e)
			if e.buf == cfg.bufs[0] {
				if acked++; acked == cfg.killAtAcks {
					kill = time.After(0)
				}
			}
		case len(f) == 1 && f[0] == "DONE":
			run.done = true
		default:
			// go test's own output (e.g. "PASS") is not ours.
		}
	}
loop:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break loop
			}
			parse(line)
		case <-kill:
			kill = nil
			killed = true
			_ = cmd.Process.Signal(syscall.SIGKILL)
		case <-deadline:
			_ = cmd.Process.Kill()
			for range lines {
			}
			_ = cmd.Wait()
			t.Fatalf("crash child still running after 90s; stderr:\n%s", stderr.String())
		}
	}
	werr := cmd.Wait()
	run.stderr = stderr.String()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if cfg.cleanExit {
		if werr != nil || !run.done {
			t.Fatalf("the child did not finish and close cleanly: %v; stderr:\n%s", werr, run.stderr)
		}
	} else if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		if cfg.crashAt != "" && werr == nil {
			t.Fatalf("crash point %s (pass %d) was never reached: the child finished its %d extends per writer; stderr:\n%s",
				cfg.crashAt, cfg.crashAfter, cfg.maxExt, run.stderr)
		}
		t.Fatalf("crash child died of %v, not SIGKILL (killed by us: %v); stderr:\n%s", werr, killed, run.stderr)
	}
	if i := strings.Index(run.stderr, "WARNING: DATA RACE"); i >= 0 {
		t.Errorf("the race detector reported a data race in the writer process:\n%s", run.stderr[i:min(len(run.stderr), i+4000)])
	}
	if cfg.crashAt != "" && killed {
		t.Fatalf("the child had to be killed: crash point %s never fired", cfg.crashAt)
	}
	if !run.ready {
		t.Fatalf("crash child died before it was ready; stderr:\n%s", run.stderr)
	}
	return run
}

// ---------------------------------------------------------------------------
// The model: everything acknowledged so far, across rounds.

type crashModel struct {
	specs     map[string]Spec
	acked     map[string]map[int64]int64 // buffer -> seq -> token of acknowledged rows
	maxAckEnd map[string]int64           // largest acknowledged first_seq+rows
	lastWC    map[string]int64           // write count found at the last check
	begun     map[int64]bool             // every token handed to an Extend
	trajBuf   map[int64]string           // traj id -> buffer it was seen in
	trajRound map[int64]int              // traj id -> first round it was seen in
	maxTraj   int64
	parentTok int64 // tokens of rows the parent writes itself
	ackedRows int
	lostRows  int
	pushedOut map[string]int  // acknowledged rows that left the window on reopen though nothing overwrote them
	reused    map[string]bool // seq reuse already reported
}

func newCrashModel(bufs ...string) *crashModel {
	m := &crashModel{
		specs: map[string]Spec{}, acked: map[string]map[int64]int64{}, maxAckEnd: map[string]int64{},
		lastWC: map[string]int64{}, begun: map[int64]bool{}, trajBuf: map[int64]string{},
		trajRound: map[int64]int{}, maxTraj: -1, parentTok: 1 << 50, reused: map[string]bool{},
		pushedOut: map[string]int{},
	}
	for _, b := range bufs {
		m.specs[b] = crashSpecFor(b)
		m.acked[b] = map[int64]int64{}
	}
	return m
}

func (m *crashModel) noteAck(t *testing.T, buf string, first int64, rows int, token int64) {
	t.Helper()
	if first < m.maxAckEnd[buf] && !m.reused[buf] {
		m.reused[buf] = true // reported once per buffer
		t.Errorf("buffer %q: seqs reused: an extend was answered first_seq %d, but seqs up to %d had been handed out (acknowledged) before",
			buf, first, m.maxAckEnd[buf]-1)
	}
	for i := 0; i < rows; i++ {
		m.acked[buf][first+int64(i)] = token + int64(i)
	}
	m.maxAckEnd[buf] = max(m.maxAckEnd[buf], first+int64(rows))
	m.ackedRows += rows
}

// absorb records a round's report and checks that the child resumed past
// everything acknowledged before (no seq reused across rounds).
func (m *crashModel) absorb(t *testing.T, round int, run *crashRun) {
	t.Helper()
	for buf, wc := range run.start {
		if (wc < m.lastWC[buf] || wc < m.maxAckEnd[buf]) && !m.reused[buf] {
			m.reused[buf] = true
			t.Errorf("round %d: buffer %q restarted at write count %d, but %d was seen at the last reopen and seqs up to %d were acknowledged",
				round, buf, wc, m.lastWC[buf], m.maxAckEnd[buf])
		}
	}
	for _, e := range run.begins {
		for i := 0; i < e.rows; i++ {
			m.begun[e.token+int64(i)] = true
		}
	}
	// A round's ACK lines of one buffer come from several writers; their
	// seqs are disjoint but need not be printed in seq order.
	acks := slices.Clone(run.acks)
	sort.Slice(acks, func(i, j int) bool { return acks[i].first < acks[j].first })
	for _, e := range acks {
		if e.wc < e.first+int64(e.rows) {
			t.Errorf("round %d: buffer %q: extend at %d of %d rows answered write count %d", round, e.buf, e.first, e.rows, e.wc)
		}
		m.noteAck(t, e.buf, e.first, e.rows, e.token)
	}
}

type crashCheckOpts struct {
	// powerLoss: everything above the durable watermark was destroyed;
	// durable holds each buffer's watermark as found on disk.
	powerLoss bool
	durable   map[string]int64
}

// crashState is what a check found in one buffer.
type crashState struct {
	info Info
	live map[int64]RowMeta
	tok  map[int64]int64 // seq -> token of live rows
}

// check verifies the data dir and reopens it: every acknowledged row that
// can still be live is, with its exact bytes; every row present is whole
// and consistent with its links; trajectories are closed, ids fresh.
func (m *crashModel) check(t *testing.T, dir string, round int, run *crashRun, o crashCheckOpts) map[string]*crashState {
	t.Helper()
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatalf("round %d: verify could not run: %v", round, err)
	}
	for _, br := range rep.Buffers {
		if len(br.Problems) > 0 {
			t.Errorf("round %d: verify reports %d problem(s) in buffer %q (write_count %d, durable %d, live %d, holes %d); first: %s",
				round, len(br.Problems), br.Name, br.WriteCount, br.Durable, br.LiveRows, br.Holes, br.Problems[0])
		}
	}
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatalf("round %d: reopen: %v", round, err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("round %d: close: %v", round, err)
		}
	}()
	out := map[string]*crashState{}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range m.specs {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		b, err := s.Buffer(name)
		if err != nil {
			if _, started := run.start[name]; started {
				t.Errorf("round %d: buffer %q is gone after the crash: %v", round, name, err)
			}
			continue
		}
		out[name] = m.checkBuffer(t, b, round, run, o)
	}
	return out
}

func (m *crashModel) checkBuffer(t *testing.T, b *Buffer, round int, run *crashRun, o crashCheckOpts) *crashState {
	t.Helper()
	name := b.Name()
	capacity := b.Capacity()
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	st := &crashState{info: info, live: map[int64]RowMeta{}, tok: map[int64]int64{}}
	wc := info.WriteCount
	fsync := b.Spec().Durability == DurabilityFsync
	if info.OpenTrajectories != 0 {
		t.Errorf("round %d: buffer %q: %d trajectories still open right after reopening a crashed store", round, name, info.OpenTrajectories)
	}
	if wc < m.lastWC[name] {
		t.Errorf("round %d: buffer %q: write count went back from %d to %d", round, name, m.lastWC[name], wc)
	}
	if (!o.powerLoss || fsync) && wc < m.maxAckEnd[name] {
		t.Errorf("round %d: buffer %q: write count %d after reopen, but rows up to seq %d were acknowledged", round, name, wc, m.maxAckEnd[name]-1)
	}
	if info.Durable > wc {
		t.Errorf("round %d: buffer %q: durable watermark %d above write count %d", round, name, info.Durable, wc)
	}

	// Acknowledged rows above wMax-capacity cannot have been overwritten
	// by anything, so they must all be here.
	wMax := run.maxWriteCount(name, m.lastWC[name])
	lo := max(wc, wMax) - capacity
	var required []int64
	pushedNow := 0
	for seq := range m.acked[name] {
		if seq >= wMax-capacity && seq < wc-capacity && (!o.powerLoss || seq < o.durable[name]) {
			// Live when the writer died, overwritten by nothing, yet out
			// of the window now: the reopened store skipped seqs.
			m.pushedOut[name]++
			pushedNow++
		}
		if seq < lo {
			delete(m.acked[name], seq) // can never be required again
			continue
		}
		if o.powerLoss && seq >= o.durable[name] {
			continue // flush mode: not durable yet, may be lost
		}
		required = append(required, seq)
	}
	// A kill under the same kernel loses nothing from the page cache, so
	// a reopen skips no seqs past rows the writer left live, whatever the
	// durability and wherever the kill came (builds before the night of
	// 2026-11-29 resumed flush and none rings past their seq
	// reservations: up to a reservation block of their oldest rows
	// left; version 3 left the block the writer was filling, up to 63 of
	// them, until 2026-11-30 when the kill came inside an extend).
	if !o.powerLoss && witnessesHere() && pushedNow > 0 { // without witnesses every crash counts as a power loss
		t.Errorf("round %d: buffer %q (%s): %d acknowledged rows that nothing overwrote left the window when the reopen after a kill skipped seqs to %d (the writer could have reached %d)",
			round, name, b.Spec().Durability, pushedNow, wc, wMax)
	}
	// After a power loss the reopen resumes at the seq reservation: the
	// synced rows it pushes out of the window are at most a block (a
	// flush or none buffer reserves a lap only while its window holds no
	// synced row; an fsync one lets go of a block at the window's bottom
	// at most once a walk step).
	if limit := int(b.seqBlock()) + blockRows; o.powerLoss && pushedNow > limit {
		t.Errorf("round %d: buffer %q (%s): a power loss pushed %d synced rows that nothing overwrote out of the window (reopened at %d, the writer could have reached %d): more than a block (%d)",
			round, name, b.Spec().Durability, pushedNow, wc, wMax, limit)
	}
	slices.Sort(required)
	var lost []int64
	for _, seq := range required {
		if !b.Live(seq) {
			lost = append(lost, seq)
			delete(m.acked[name], seq) // reported once
		}
	}
	if len(lost) > 0 {
		m.lostRows += len(lost)
		t.Errorf("round %d: buffer %q (%s): %d acknowledged row(s) missing after the crash (write_count %d, durable watermark %d, the writer could have reached seq %d); seqs %v",
			round, name, b.Spec().Durability, len(lost), wc, info.Durable, wMax-1, lost[:min(len(lost), 12)])
	}

	// Every row present: whole, as written, and linked consistently.
	seqs := b.LiveSeqs(0, int(capacity)+1)
	if int64(len(seqs)) != info.Size {
		t.Errorf("round %d: buffer %q: %d live seqs but size %d", round, name, len(seqs), info.Size)
	}
	cols := crashColumns(b)
	dst := crashDst(cols, len(seqs))
	metas := make([]RowMeta, len(seqs))
	missing, err := b.Gather(seqs, cols, dst, metas)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("round %d: buffer %q: %d live rows reported missing by Gather with no writer running", round, name, len(missing))
	}
	scratch := make([]byte, 1<<16)
	bad := 0
	for j, meta := range metas {
		if meta.Seq < 0 {
			continue
		}
		if meta.Seq != seqs[j] {
			t.Errorf("round %d: buffer %q: gathered seq %d, meta says %d", round, name, seqs[j], meta.Seq)
		}
		tok, err := crashCheckRow(cols, dst, j, meta, scratch)
		if err == nil {
			if want, ok := m.acked[name][meta.Seq]; ok && tok != want {
				err = fmt.Errorf("seq %d holds token %d, but token %d was acknowledged at that seq", meta.Seq, tok, want)
			} else if !m.begun[tok] {
				err = fmt.Errorf("seq %d holds token %d, which no writer ever sent", meta.Seq, tok)
			}
		}
		if err != nil {
			if bad < 5 {
				t.Errorf("round %d: buffer %q: %v", round, name, err)
			}
			bad++
			continue
		}
		st.live[meta.Seq] = meta
		st.tok[meta.Seq] = tok
	}
	// Acknowledged rows that may be gone (overwritten by an unacknowledged
	// write, or above the watermark after a power loss) and are: forget
	// them, their seqs may be written again with other rows.
	for seq := range m.acked[name] {
		if _, ok := st.live[seq]; !ok {
			delete(m.acked[name], seq)
		}
	}
	for _, meta := range st.live {
		seq, prev := meta.Seq, meta.PrevSeq
		switch {
		case prev == -1:
			if meta.Step != 0 {
				t.Errorf("round %d: buffer %q: seq %d starts a trajectory at step %d", round, name, seq, meta.Step)
			}
		case prev >= seq:
			t.Errorf("round %d: buffer %q: seq %d links back to later row %d", round, name, seq, prev)
		case prev < wc-capacity:
			if meta.Step < 1 {
				t.Errorf("round %d: buffer %q: seq %d links to overwritten row %d but has step %d", round, name, seq, prev, meta.Step)
			}
		default:
			p, ok := st.live[prev]
			if !ok {
				t.Errorf("round %d: buffer %q: seq %d links to row %d, which is in the window but not live", round, name, seq, prev)
				continue
			}
			if p.TrajID != meta.TrajID || p.Step != meta.Step-1 || p.Env != meta.Env || p.Done || st.tok[prev] >= st.tok[seq] {
				t.Errorf("round %d: buffer %q: seq %d (traj %d step %d env %d token %d) links to seq %d (traj %d step %d env %d done %v token %d)",
					round, name, seq, meta.TrajID, meta.Step, meta.Env, st.tok[seq], prev, p.TrajID, p.Step, p.Env, p.Done, st.tok[prev])
			}
			if p.NextSeq != seq {
				t.Errorf("round %d: buffer %q: seq %d has next_seq %d, but seq %d links back to it", round, name, prev, p.NextSeq, seq)
			}
		}
		if meta.Done && meta.NextSeq != -1 {
			t.Errorf("round %d: buffer %q: done row %d has next_seq %d", round, name, seq, meta.NextSeq)
		}
		if meta.NextSeq >= 0 {
			if n, ok := st.live[meta.NextSeq]; !ok || n.PrevSeq != seq {
				t.Errorf("round %d: buffer %q: seq %d has next_seq %d, which does not link back", round, name, seq, meta.NextSeq)
			}
		}
	}

	// Trajectory ids: one counter per data dir, never reused, increasing in
	// the order trajectories start.
	start, started := run.start[name]
	var starts []RowMeta
	for _, meta := range st.live {
		id := meta.TrajID
		if owner, ok := m.trajBuf[id]; ok && owner != name {
			t.Errorf("round %d: trajectory id %d is used in buffer %q and in buffer %q", round, id, owner, name)
		}
		if r, ok := m.trajRound[id]; ok && r < round && started && meta.Seq >= start {
			t.Errorf("round %d: buffer %q: row %d written in this round carries trajectory id %d, already used in round %d", round, name, meta.Seq, id, r)
		}
		if meta.Step == 0 {
			starts = append(starts, meta)
		}
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Seq < starts[j].Seq })
	for i := 1; i < len(starts); i++ {
		if starts[i].TrajID <= starts[i-1].TrajID {
			t.Errorf("round %d: buffer %q: trajectory started at seq %d has id %d, not above id %d of the one started at seq %d",
				round, name, starts[i].Seq, starts[i].TrajID, starts[i-1].TrajID, starts[i-1].Seq)
		}
	}
	for _, meta := range st.live {
		if _, ok := m.trajBuf[meta.TrajID]; !ok {
			m.trajBuf[meta.TrajID] = name
			m.trajRound[meta.TrajID] = round
		}
		m.maxTraj = max(m.maxTraj, meta.TrajID)
	}

	// The index agrees with the rows.
	err = b.ReadIndex(func(ix Index) {
		var rows int64
		for i := 0; i < ix.NumTrajectories(); i++ {
			tr := ix.Trajectory(i)
			rows += int64(tr.Len())
			if tr.Open() {
				t.Errorf("round %d: buffer %q: trajectory %d open after reopening a crashed store", round, name, tr.ID())
			}
			for k := 0; k < tr.Len(); k++ {
				meta, ok := st.live[tr.Seq(k)]
				if !ok || meta.TrajID != tr.ID() || meta.Step != tr.FirstStep()+int64(k) {
					t.Errorf("round %d: buffer %q: index puts seq %d at trajectory %d step %d; row says %+v", round, name, tr.Seq(k), tr.ID(), tr.FirstStep()+int64(k), meta)
					break
				}
				if k == tr.Len()-1 && meta.Done != tr.Ended() {
					t.Errorf("round %d: buffer %q: trajectory %d Ended()=%v, last row done=%v", round, name, tr.ID(), tr.Ended(), meta.Done)
				}
			}
		}
		if rows != info.Size || ix.LiveRows() != info.Size {
			t.Errorf("round %d: buffer %q: trajectories hold %d rows, index counts %d, size %d", round, name, rows, ix.LiveRows(), info.Size)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	m.lastWC[name] = wc
	return st
}

// writeAfter reopens the store and writes a few rows to every buffer: they
// must get fresh seqs (at or above the write count and every acknowledged
// seq), fresh trajectory ids, be readable, and leave verify clean. It
// returns each buffer's first new seq.
func (m *crashModel) writeAfter(t *testing.T, dir string, round int) map[string]int64 {
	t.Helper()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	firsts := map[string]int64{}
	for name, spec := range m.specs {
		b, err := s.Buffer(name)
		if err != nil {
			continue
		}
		wc := b.WriteCount()
		before := map[int64]bool{}
		for _, seq := range b.LiveSeqs(0, int(spec.Capacity)) {
			before[seq] = true
		}
		tokens := []int64{m.parentTok, m.parentTok + 1, m.parentTok + 2}
		m.parentTok += 3
		for _, tok := range tokens {
			m.begun[tok] = true
		}
		res, err := b.Extend("parent", crashBatch(b.Spec(), tokens, false))
		if err != nil {
			t.Fatalf("round %d: buffer %q refuses writes after the crash: %v", round, name, err)
		}
		firsts[name] = res.FirstSeq
		if res.FirstSeq < wc {
			t.Errorf("round %d: buffer %q: new rows got seq %d below the write count %d", round, name, res.FirstSeq, wc)
		}
		for i := range tokens {
			if before[res.FirstSeq+int64(i)] {
				t.Errorf("round %d: buffer %q: new row got seq %d of a row that was live", round, name, res.FirstSeq+int64(i))
			}
		}
		seqs := []int64{res.FirstSeq, res.FirstSeq + 1, res.FirstSeq + 2}
		cols := crashColumns(b)
		dst := crashDst(cols, 3)
		metas := make([]RowMeta, 3)
		missing, err := b.Gather(seqs, cols, dst, metas)
		if err != nil || len(missing) > 0 {
			t.Fatalf("round %d: buffer %q: new rows not readable: missing %v, %v", round, name, missing, err)
		}
		scratch := make([]byte, 1<<16)
		for j := range seqs {
			tok, err := crashCheckRow(cols, dst, j, metas[j], scratch)
			if err != nil || tok != tokens[j] {
				t.Errorf("round %d: buffer %q: new row %d: token %d, %v", round, name, seqs[j], tok, err)
			}
			if metas[j].Step == 0 && metas[j].TrajID <= m.maxTraj {
				t.Errorf("round %d: buffer %q: new trajectory got id %d, not above %d seen before", round, name, metas[j].TrajID, m.maxTraj)
			}
		}
		m.noteAck(t, name, res.FirstSeq, len(tokens), tokens[0])
		for _, meta := range metas {
			m.maxTraj = max(m.maxTraj, meta.TrajID)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, br := range rep.Buffers {
		if len(br.Problems) > 0 {
			t.Errorf("round %d: after new writes and a clean close, verify reports %d problem(s) in buffer %q: %s",
				round, len(br.Problems), br.Name, strings.Join(br.Problems[:min(len(br.Problems), 3)], "; "))
		}
	}
	return firsts
}

// ---------------------------------------------------------------------------
// The tests.

// TestCrashKillRandom kills a writer of two buffers (fsync + compact, flush)
// with SIGKILL at random moments, round after round on the same data dir,
// and checks after each round that nothing acknowledged was lost and
// everything present is whole and consistent.
func TestCrashKillRandom(t *testing.T) {
	rounds := 20
	if testing.Short() {
		rounds = 6
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 11))
	bufs := []string{crashFsync, crashFlush, crashFsyncRuns, crashFsyncStrided, crashFsyncBlocks, crashFlushBlocks, crashNone}
	m := newCrashModel(bufs...)
	inflight := 0
	var failed []int
	for r := 0; r < rounds; r++ {
		delay := time.Duration(30+rng.IntN(300)) * time.Millisecond
		ok := t.Run(fmt.Sprintf("round%02d", r), func(t *testing.T) {
			run := crashRunChild(t, crashChildCfg{
				dir: dir, seed: uint64(r), tokenBase: int64(r+1) << 32,
				bufs: bufs, intervalMS: 20, killAfter: delay,
			})
			inflight += len(run.begins) - len(run.acks)
			m.absorb(t, r, run)
			m.check(t, dir, r, run, crashCheckOpts{})
			if t.Failed() {
				t.Logf("killed %v after ready; %d extends acknowledged, %d in flight", delay, len(run.acks), len(run.begins)-len(run.acks))
			}
		})
		if !ok {
			failed = append(failed, r)
		}
	}
	m.writeAfter(t, dir, rounds)
	t.Logf("%d rounds, %d rows acknowledged, %d extends in flight at the kills; write counts %v", rounds, m.ackedRows, inflight, m.lastWC)
	if len(m.pushedOut) > 0 {
		t.Logf("acknowledged rows that nothing overwrote but that left the window when the store skipped seqs on reopen: %v", m.pushedOut)
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d rounds failed %v; %d acknowledged rows lost in all", len(failed), rounds, failed, m.lostRows)
	}
	for _, name := range bufs {
		if m.lastWC[name] <= crashSpecFor(name).Capacity {
			t.Errorf("the rings never wrapped (write counts %v): the test exercised too little", m.lastWC)
		}
	}
}

// TestCrashPoints kills the writer at each of the package's crash points
// (RBD_CRASH_AT) and checks the state each one must leave.
func TestCrashPoints(t *testing.T) {
	cases := []struct {
		point string
		buf   string
		after int // the point's pass that kills: rows for after-data/-meta, extends or checkpoints otherwise
	}{
		{"after-data", crashFsync, 1},
		{"after-data", crashFsync, 700}, // ring of 512 wrapped: the row overwrites an old one
		{"after-data", crashFlush, 500},
		{"after-meta", crashFsync, 1},
		{"after-meta", crashFsync, 700},
		{"before-sync", crashFsync, 1},
		{"before-sync", crashFsync, 40},
		{"after-sync", crashFsync, 1},
		{"after-sync", crashFsync, 40},
		{"before-commit", crashFlush, 1},
		{"before-commit", crashFlush, 30},
		// rows.meta version 2: a row's record, and the run records of an
		// extend (torn or whole) written before any of its rows.
		{"after-data", crashFsyncRuns, 700},
		{"after-meta", crashFsyncRuns, 1},
		{"after-meta", crashFsyncRuns, 700},
		{"mid-runs", crashFsyncRuns, 1},
		{"mid-runs", crashFsyncRuns, 30},
		{"after-runs", crashFsyncRuns, 30},
		{"after-sync", crashFsyncRuns, 40},
		// The same files with strided memory records.
		{"after-meta", crashFsyncStrided, 1},
		{"after-meta", crashFsyncStrided, 700},
		{"after-runs", crashFsyncStrided, 30},
		// rows.meta version 3: after-data and after-meta pass once an
		// extend (its rows' bytes written; its block records written),
		// mid-block-final between the two copies of the final record of
		// a block the extend leaves.
		{"after-data", crashFsyncBlocks, 1},
		{"after-data", crashFsyncBlocks, 40},
		{"after-meta", crashFsyncBlocks, 1},
		{"after-meta", crashFsyncBlocks, 40},
		{"mid-runs", crashFsyncBlocks, 30},
		{"after-runs", crashFsyncBlocks, 30},
		{"before-sync", crashFsyncBlocks, 40},
		{"after-sync", crashFsyncBlocks, 40},
		{"mid-block-final", crashFsyncBlocks, 1},
		{"mid-block-final", crashFsyncBlocks, 20},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%s/%s/%d", tc.point, tc.buf, tc.after), func(t *testing.T) {
			dir := t.TempDir()
			m := newCrashModel(tc.buf)
			run := crashRunChild(t, crashChildCfg{
				dir: dir, seed: uint64(100 + i), tokenBase: 1 << 32, bufs: []string{tc.buf}, writers: 1,
				maxExt: 3000, intervalMS: 3600_000, ckptEach: tc.point == "before-commit",
				crashAt: tc.point, crashAfter: tc.after,
			})
			m.absorb(t, 0, run)
			lastAck := m.maxAckEnd[tc.buf]
			inflight := run.inFlight(tc.buf)
			acks := run.acksOf(tc.buf)
			st := m.check(t, dir, 0, run, crashCheckOpts{})[tc.buf]
			if st == nil {
				t.Fatal("buffer missing after the crash")
			}
			wc, durable := st.info.WriteCount, st.info.Durable
			fsync := crashSpecFor(tc.buf).Durability == DurabilityFsync
			capacity := crashSpecFor(tc.buf).Capacity
			// rowsPresent checks that seqs [from, to) of the in-flight
			// extend e are live with its tokens.
			rowsPresent := func(e *crashExt, from, to int64) {
				t.Helper()
				for seq := from; seq < to; seq++ {
					want := e.token + (seq - lastAck)
					if got, ok := st.tok[seq]; !ok || got != want {
						t.Errorf("%s: row %d of the unacknowledged extend is not there (live %v, token %d, want %d)", tc.point, seq, ok, got, want)
					}
				}
			}
			// windowFrom checks the write count after reopening: at least
			// next (what the rows on disk show), more only if the store
			// skips seqs it may have handed out (then [next, wc) are holes),
			// and never by a whole ring.
			windowFrom := func(next int64) {
				t.Helper()
				if wc < next || wc >= next+capacity {
					t.Errorf("%s: write count %d after reopening, want at least %d and less than %d", tc.point, wc, next, next+capacity)
				}
				for seq := next; seq < wc; seq++ {
					if _, ok := st.live[seq]; ok {
						t.Errorf("%s: seq %d, never written, is live", tc.point, seq)
					}
				}
			}
			perExtend := memmapBlocks(crashSpecFor(tc.buf))
			switch tc.point {
			case "after-data", "after-meta", "before-sync", "after-sync", "mid-runs", "after-runs", "mid-block-final":
				if len(inflight) != 1 {
					t.Fatalf("%d extends in flight at %s, want 1", len(inflight), tc.point)
				}
			}
			switch {
			case perExtend && (tc.point == "after-data" || tc.point == "after-meta"):
				// Pass N is the N-th extend: its rows and final
				// observations are written; after-meta, its block
				// records too, which make every one of them count.
				if len(acks) != tc.after-1 {
					t.Errorf("%s: %d extends acknowledged, want %d", tc.point, len(acks), tc.after-1)
				}
				e := inflight[0]
				end := lastAck + int64(e.rows)
				if tc.point == "after-meta" {
					rowsPresent(e, lastAck, end)
					windowFrom(end)
				} else {
					if witnessesHere() && wc != end {
						// The witness says the writer handed out seqs
						// up to end: the reopen goes on filling the
						// block there, skipping none to its end.
						t.Errorf("after-data: write count %d after reopening, want %d (the end of the extend cut off)", wc, end)
					}
					for seq := lastAck; seq < end; seq++ {
						if _, ok := st.live[seq]; ok {
							t.Errorf("after-data: row %d of the extend whose block records were not written is live", seq)
						}
					}
					windowFrom(lastAck)
				}
				if fsync && durable != lastAck {
					t.Errorf("%s: durable watermark %d, want %d", tc.point, durable, lastAck)
				}
			case tc.point == "mid-block-final":
				// The extend left a block: one copy of its final record
				// is written, which verifies the block's rows; its rows
				// past that block have no record yet.
				e := inflight[0]
				end := lastAck + int64(e.rows)
				left := (lastAck/blockRows + 1) * blockRows
				if left > end {
					t.Fatalf("the extend [%d, %d) leaves no block", lastAck, end)
				}
				rowsPresent(e, lastAck, left)
				for seq := left; seq < end; seq++ {
					if _, ok := st.live[seq]; ok {
						t.Errorf("mid-block-final: row %d, past the block whose final record was being written, is live", seq)
					}
				}
				windowFrom(left)
			}
			switch tc.point {
			case "after-data", "after-meta":
				if perExtend {
					break
				}
				// Pass N is the N-th row ever written: seq N-1.
				c := int64(tc.after - 1)
				e := inflight[0]
				if c < lastAck || c >= lastAck+int64(e.rows) {
					t.Fatalf("crash row %d is not in the in-flight extend [%d, %d)", c, lastAck, lastAck+int64(e.rows))
				}
				if tc.point == "after-data" {
					// Field bytes copied, record not written: the row is
					// absent, the rows before it in its batch are whole.
					// The row it was overwriting must not be taken for
					// damage (verify, checked above).
					rowsPresent(e, lastAck, c)
					if _, ok := st.live[c]; ok {
						t.Errorf("after-data: the row being written (seq %d) is live", c)
					}
					windowFrom(c)
				} else {
					rowsPresent(e, lastAck, c+1)
					windowFrom(c + 1) // the row whose record was completed counts
				}
				if fsync && durable != lastAck {
					t.Errorf("%s: durable watermark %d, want %d (the end of the last acknowledged extend)", tc.point, durable, lastAck)
				}
			case "before-sync", "after-sync":
				if len(acks) != tc.after-1 {
					t.Errorf("%s: %d extends acknowledged, want %d", tc.point, len(acks), tc.after-1)
				}
				e := inflight[0]
				end := lastAck + int64(e.rows)
				// kill -9 keeps the page cache: the written rows are all
				// there, acknowledged or not.
				rowsPresent(e, lastAck, end)
				windowFrom(end)
				wantDurable := lastAck
				if tc.point == "after-sync" {
					wantDurable = end // synced, just not acknowledged
				}
				if durable != wantDurable {
					t.Errorf("%s: durable watermark %d, want %d", tc.point, durable, wantDurable)
				}
			case "mid-runs", "after-runs":
				// The extend's run records are in the log (half of the
				// last one for mid-runs), none of its rows: nothing of it
				// is live, and the ring has not moved.
				if len(acks) != tc.after-1 {
					t.Errorf("%s: %d extends acknowledged, want %d", tc.point, len(acks), tc.after-1)
				}
				e := inflight[0]
				for seq := lastAck; seq < lastAck+int64(e.rows); seq++ {
					if _, ok := st.live[seq]; ok {
						t.Errorf("%s: row %d of the extend whose run records were being written is live", tc.point, seq)
					}
				}
				windowFrom(lastAck)
				if durable != lastAck {
					t.Errorf("%s: durable watermark %d, want %d", tc.point, durable, lastAck)
				}
			case "before-commit":
				// The N-th checkpoint follows the N-th acknowledged extend.
				if len(acks) != tc.after || len(inflight) != 0 {
					t.Errorf("before-commit: %d extends acknowledged and %d in flight, want %d and 0", len(acks), len(inflight), tc.after)
				}
				windowFrom(lastAck)
				if durable != lastAck {
					t.Errorf("before-commit: durable watermark %d, want %d (synced before the commit)", durable, lastAck)
				}
			}
			if n := m.pushedOut[tc.buf]; n > 0 {
				t.Logf("%s: %d acknowledged rows that nothing overwrote left the window on reopen (write count %d)", tc.point, n, wc)
			}
			m.writeAfter(t, dir, 1)
		})
	}
}

// TestWitnessSkipsSeqsOfRestoredFiles: a data dir restored in place from
// a copy taken while it was written (a block-level snapshot, rolled back
// on the same machine: no reboot) holds fewer rows than its writer handed
// out, whether the writer was killed or stopped cleanly afterwards (its
// catalog then says clean, and so does the copy's if it was taken
// clean). The buffers' seq witnesses still name how far the writer went,
// so the reopen resumes past every seq it acknowledged (clients may hold
// them) instead of handing them out again. The catalog's reservation,
// what an open without a witness resumes at, is checked to be short of
// that, or the test would prove nothing.
func TestWitnessSkipsSeqsOfRestoredFiles(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here (a boot id and a tmpfs at " + defaultWitnessDir + ")")
	}
	for _, stop := range []string{"killed", "closed"} {
		t.Run(stop, func(t *testing.T) {
			bufs := []string{crashFlush, crashFlushBlocks, crashNone, crashFsyncBlocks}
			dir := filepath.Join(t.TempDir(), "data")
			crashRunChild(t, crashChildCfg{dir: dir, seed: 9, tokenBase: 1 << 32, bufs: bufs, intervalMS: 20, killAfter: 150 * time.Millisecond})
			snapshot := filepath.Join(t.TempDir(), "snapshot")
			if out, err := exec.Command("cp", "-a", dir, snapshot).CombinedOutput(); err != nil {
				t.Fatalf("copy the dir: %v %s", err, out)
			}
			reserved := map[string]int64{}
			upEditStates(t, snapshot, func(name string, st *bufferState) { reserved[name] = st.SeqReserved })
			m := newCrashModel(bufs...)
			// Killed once it has acknowledged 1,000 extends of the flush
			// buffer (an event, not a time: the same rows whatever the
			// load): past the copy's reservation of the fsync buffer
			// at least, whose writer gets a share of them.
			cfg := crashChildCfg{dir: dir, seed: 10, tokenBase: 2 << 32, bufs: bufs, intervalMS: 20, killAtAcks: 1000}
			if stop == "closed" {
				cfg.killAfter, cfg.maxExt, cfg.writers, cfg.cleanExit = 0, 150, 1, true // then a clean close
			}
			run := crashRunChild(t, cfg)
			m.absorb(t, 1, run)
			// The restore tests the witness only for the buffers whose
			// writer went past the copy's reservation (an open without
			// one resumes there): the fsync buffer's blocks are a
			// sixteenth of its ring; flush and none buffers reserve a
			// lap at a time once a lap past their last sync (since
			// 2026-11-30 for flush), a reserve the writer may not use
			// up before it stops, depending on what the copy caught.
			var past []string
			for _, name := range bufs {
				if m.maxAckEnd[name] > reserved[name] {
					past = append(past, name)
				}
			}
			t.Logf("buffers whose writer acknowledged seqs past the copy's reservation: %v", past)
			if len(past) == 0 {
				t.Fatalf("the writer acknowledged no seq past the copy's reservation of any buffer: nothing to skip")
			}
			restoreInPlace(t, snapshot, dir)
			if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
				t.Fatalf("verify the restored dir: %v %+v", err, rep)
			}
			s := openStore(t, dir)
			for _, name := range bufs {
				b := mustBuffer(t, s, name)
				if wc := b.WriteCount(); wc < m.maxAckEnd[name] {
					t.Errorf("buffer %q: write count %d after the restore, but the writer had acknowledged seqs up to %d: they would be handed out again", name, wc, m.maxAckEnd[name]-1)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
				t.Fatalf("verify after the reopen: %v %+v", err, rep)
			}
		})
	}
}

// restoreInPlace makes dir hold what src holds, as a restore over it
// does, without its directories ever going missing: an open of another
// store on the machine (a test package running beside this one) would
// take the witnesses of buffer dirs that are gone for orphans.
func restoreInPlace(t *testing.T, src, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Remove(p)
	})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", src+"/.", dir).CombinedOutput(); err != nil {
		t.Fatalf("restore %s over %s: %v %s", src, dir, err, out)
	}
}

// TestWitnessSkipsSeqsOfARestoredCheckpoint: a hot checkpoint restored in
// place of its buffer's dir after the buffer went on writing comes with a
// clean catalog of fewer rows; the witness makes the reopen resume past
// every seq the buffer handed out since, and not continue its streams.
func TestWitnessSkipsSeqsOfARestoredCheckpoint(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here (a boot id and a tmpfs at " + defaultWitnessDir + ")")
	}
	dir := filepath.Join(t.TempDir(), "data")
	s := openStore(t, dir)
	spec := testSpec(KindMemmap, 4096, false)
	b := mustCreate(t, s, "b", spec)
	rows := make([]row, 250)
	for i := range rows {
		rows[i] = row{env: int64(i % 2), val: float32(i)}
	}
	mustExtend(t, b, "s", makeBatch(spec, rows, false))
	cp := filepath.Join(t.TempDir(), "cp")
	if _, err := b.Checkpoint(context.Background(), cp, nil); err != nil {
		t.Fatal(err)
	}
	var last int64
	for range 30 {
		last = mustExtend(t, b, "s", makeBatch(spec, rows, false)).WriteCount
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	restoreInPlace(t, cp, dir)
	s = openStore(t, dir)
	defer s.Close()
	b = mustBuffer(t, s, "b")
	if wc := b.WriteCount(); wc < last {
		t.Fatalf("write count %d after the checkpoint was restored, but seqs up to %d were handed out", wc, last-1)
	}
	if info, _ := b.Info(); info.OpenTrajectories != 0 {
		t.Fatalf("%d trajectories continue across the skipped seqs", info.OpenTrajectories)
	}
}
