package storage

// Crash tests of the compressed kind: a real writer process (this test
// binary, re-executed by crashRunChild from crash_test.go) writes compressed
// buffers whose observation is a frame stack and is killed with SIGKILL, at
// random moments or at the crash points (RBD_CRASH_AT), in particular
// mid-chunk and after-chunk, where open chunks (fragments) and seals are
// torn or orphaned. The parent then checks what reopening yields.
//
// crashChild only knows the memmap buffers of crash_test.go and the child's
// command line is fixed there, so buffers named "cz…" select the writer of
// this file (see init below); everything else — the child protocol, the
// parent side, the acknowledgement model — is crash_test.go's.
//
// Every row is a function of its token (kept in "action"), as in
// crash_test.go, except the frame stack, which is a function of the token
// and of the trajectory it continues: the parent replays each writer's
// extends in order (czModel.replay) to know every stack and final
// observation the child sent.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

const (
	czPrefix = "cz"
	czFsync  = "czs" // fsync, frame stack on axis 0, chunks of 8 rows
	czFlush  = "czf" // flush, frame stack on axis 2, chunks of 5 rows, delta
)

// init makes the test binary the compressed writer when crashRunChild
// re-executes it for cz buffers (RBD_CRASH_BUFS), before the testing
// package runs TestCrashHelperProcess, which would not know them.
func init() {
	if os.Getenv(crashHelperEnv) != "1" || !strings.HasPrefix(os.Getenv("RBD_CRASH_BUFS"), czPrefix) {
		return
	}
	if err := czChild(); err != nil {
		fmt.Fprintln(os.Stderr, "compressed crash helper:", err)
		os.Exit(3)
	}
	os.Exit(0)
}

func czSpecFor(name string) Spec {
	var (
		g        stackGeom
		opts     *CompressionOptions
		capacity int64
		dur      Durability
	)
	switch name {
	case czFsync:
		g, opts, capacity, dur = stackGeom{shape: []int{4, 8, 8}, axis: 0}, &CompressionOptions{Codec: "zstd", ChunkLen: 8}, 256, DurabilityFsync
	case czFlush:
		g, opts, capacity, dur = stackGeom{shape: []int{8, 8, 4}, axis: 2}, &CompressionOptions{Codec: "zstd", ChunkLen: 5, Delta: true}, 200, DurabilityFlush
	default:
		panic("unknown compressed crash buffer " + name)
	}
	return Spec{Capacity: capacity, Storage: KindCompressed, CompactObs: true, ObsKeys: []string{"observation"},
		Durability: dur, Compression: opts,
		Fields: []Field{
			{Name: "observation", DType: Uint8, Shape: g.shape, FrameStack: &FrameStack{K: 4, Axis: g.axis}},
			{Name: "features", DType: Float32, Shape: []int{24}}, // compressed, no frame stack
			{Name: "action", DType: Int64, Shape: []int{}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
			{Name: "next.done", DType: Bool, Shape: []int{}},
			{Name: "next.terminated", DType: Bool, Shape: []int{}},
			{Name: "next.truncated", DType: Bool, Shape: []int{}},
		}}.WithDefaults()
}

// ---------------------------------------------------------------------------
// Rows: frame stacks along trajectories.

// czWant is what one row holds besides what crashFieldBytes derives from
// its token.
type czWant struct {
	stack []byte // observation
	tail  []byte // final observation (done rows), nil otherwise
	step  int64  // index in its trajectory
	pred  int64  // token of the trajectory's previous row, -1 at its start
}

// czStacker plays the observations of one stream: per env, a frame stack
// that gains one frame per row, as gym's FrameStack builds it, starting
// with zero padding, a repeated first frame or frames from elsewhere, and
// now and then (a writer glitch) a stack that does not continue the
// previous one. Rows' envs and flags come from their tokens (crashEnvOf,
// crashFlagsOf).
type czStacker struct {
	g    *frameGeom
	prev map[int64]*czPrev
}

type czPrev struct {
	stack       []byte
	step, token int64
}

func newCzStacker(spec Spec) *czStacker {
	f, _ := spec.Field("observation")
	return &czStacker{g: newFrameGeom(f), prev: map[int64]*czPrev{}}
}

// frame is a mostly black frame with a few bright pixels.
func (s *czStacker) frame(token int64, salt uint64) []byte {
	fr := make([]byte, s.g.frameBytes())
	crashFill(fr, token, salt)
	for i, v := range fr {
		if v&7 != 0 {
			fr[i] = 0
		}
	}
	return fr
}

func (s *czStacker) push(prev, fr []byte) []byte {
	out := make([]byte, s.g.rowBytes())
	for j := 1; j < s.g.k; j++ {
		s.g.putFrameOf(out, j-1, prev, j)
	}
	s.g.put(out, fr, s.g.k-1)
	return out
}

func (s *czStacker) next(token int64) czWant {
	env := crashEnvOf(token)
	h := crashMix(uint64(token) ^ 0x57AC4)
	p := s.prev[env]
	w := czWant{pred: -1}
	newest := s.frame(token, 1)
	if p != nil && h%32 != 0 {
		w.stack = s.push(p.stack, newest)
	} else {
		w.stack = make([]byte, s.g.rowBytes())
		for j := 0; j < s.g.k-1; j++ {
			switch (h >> 8) % 3 {
			case 0: // zero padding
			case 1:
				s.g.put(w.stack, newest, j)
			default:
				s.g.put(w.stack, s.frame(token, uint64(10+j)), j)
			}
		}
		s.g.put(w.stack, newest, s.g.k-1)
	}
	if p != nil {
		w.pred, w.step = p.token, p.step+1
	}
	if term, trunc := crashFlagsOf(token); term || trunc {
		w.tail = s.push(w.stack, s.frame(token, 5))
		delete(s.prev, env)
	} else {
		s.prev[env] = &czPrev{stack: w.stack, step: w.step, token: token}
	}
	return w
}

// czAnonymous says which extends (by first token) the writer sends without
// a stream: every chunk they touch is sealed at once.
func czAnonymous(first int64) bool { return crashMix(uint64(first)^0xA11C)%10 == 0 }

// czCloses says after which (named) extends the writer closes its stream,
// which seals its open chunks.
func czCloses(first int64) bool { return crashMix(uint64(first)^0xC105E)%12 == 0 }

// czFieldBytes writes what column name holds for the row of token.
func czFieldBytes(name string, token int64, w czWant, hasTail bool, dst []byte) {
	switch name {
	case "observation":
		copy(dst, w.stack)
	case "next.observation":
		if hasTail {
			copy(dst, w.tail)
		} else {
			clear(dst)
		}
	case "features":
		crashFill(dst, token, 3)
	default:
		crashFieldBytes(name, token, dst)
	}
}

// czBatch builds the rows of tokens. Final observations go as D rows or
// (fullTails) as N rows with junk on rows that are not done.
func czBatch(spec Spec, tokens []int64, wants []czWant, fullTails bool) *Batch {
	n := len(tokens)
	b := &Batch{Rows: n, Fields: map[string][]byte{}, Env: make([]int64, n)}
	for _, f := range spec.Fields {
		rb := f.RowBytes()
		buf := make([]byte, n*rb)
		for i, tok := range tokens {
			czFieldBytes(f.Name, tok, wants[i], false, buf[i*rb:(i+1)*rb])
		}
		b.Fields[f.Name] = buf
	}
	obs, _ := spec.Field("observation")
	var tails []byte
	for i, tok := range tokens {
		b.Env[i] = crashEnvOf(tok)
		switch {
		case wants[i].tail != nil:
			tails = append(tails, wants[i].tail...)
		case fullTails:
			tails = append(tails, bytes.Repeat([]byte{0xA5}, obs.RowBytes())...)
		}
	}
	if fullTails || len(tails) > 0 {
		b.Fields["next.observation"] = tails
	}
	return b
}

// ---------------------------------------------------------------------------
// The child.

// czChild is crashChild for compressed buffers: the same loop and protocol
// on stdout, with czWriter's batches.
func czChild() error {
	return runCrashChild(czSpecFor, czFsync, func(spec Spec, writer int) crashWriter {
		return &czWriter{spec: spec, stream: fmt.Sprintf("w%d", writer), st: newCzStacker(spec)}
	})
}

// czWriter writes frame stacks of 1..24 rows; now and then an anonymous
// extend or a stream close after an extend (both seal chunks).
type czWriter struct {
	spec   Spec
	stream string
	st     *czStacker
}

func (w *czWriter) size(rng *rand.Rand) int { return 1 + rng.IntN(24) }

func (w *czWriter) next(rng *rand.Rand, tokens []int64) (string, *Batch) {
	stream, stk := w.stream, w.st
	if czAnonymous(tokens[0]) {
		stream, stk = "", newCzStacker(w.spec)
	}
	wants := make([]czWant, len(tokens))
	for j, tok := range tokens {
		wants[j] = stk.next(tok)
	}
	return stream, czBatch(w.spec, tokens, wants, rng.IntN(2) == 0)
}

func (w *czWriter) acked(b *Buffer, stream string, first int64) error {
	if stream == "" || !czCloses(first) {
		return nil
	}
	if _, err := b.CloseStream(stream); err != nil {
		return err
	}
	w.st = newCzStacker(w.spec)
	return nil
}

// ---------------------------------------------------------------------------
// The parent.

// czModel is crash_test.go's acknowledgement model plus every row's stack.
type czModel struct {
	*crashModel
	want map[int64]czWant // token -> its row
	// fragRows counts acknowledged rows found, after a crash, in open
	// chunks rebuilt from fragment records.
	fragRows int
}

func newCzModel(bufs ...string) *czModel {
	m := &czModel{crashModel: newCrashModel(), want: map[int64]czWant{}}
	for _, b := range bufs {
		m.specs[b] = czSpecFor(b)
		m.acked[b] = map[int64]int64{}
	}
	return m
}

// replay recomputes the rows of every extend the child began, writer by
// writer in the order it began them, as czChild built them.
func (m *czModel) replay(run *crashRun) {
	stk := map[int]*czStacker{}
	for _, e := range run.begins {
		spec := m.specs[e.buf]
		if stk[e.writer] == nil {
			stk[e.writer] = newCzStacker(spec)
		}
		use := stk[e.writer]
		anon := czAnonymous(e.token)
		if anon {
			use = newCzStacker(spec)
		}
		for i := 0; i < e.rows; i++ {
			m.want[e.token+int64(i)] = use.next(e.token + int64(i))
		}
		if !anon && czCloses(e.token) {
			stk[e.writer] = newCzStacker(spec)
		}
	}
}

// checkRow checks row j of a gather against the row of the token in its
// action column and returns that token.
func (m *czModel) checkRow(cols []Column, dst [][]byte, j int, meta RowMeta) (int64, error) {
	token := int64(-1)
	for i, c := range cols {
		if c.Name == "action" {
			token = int64(binary.LittleEndian.Uint64(dst[i][j*c.RowBytes:]))
		}
	}
	w, ok := m.want[token]
	if !ok {
		return token, fmt.Errorf("seq %d holds token %d, which no writer sent", meta.Seq, token)
	}
	for i, c := range cols {
		got := dst[i][j*c.RowBytes : (j+1)*c.RowBytes]
		want := make([]byte, c.RowBytes)
		czFieldBytes(c.Name, token, w, meta.HasTail, want)
		if !bytes.Equal(got, want) {
			k := 0
			for k < len(got) && got[k] == want[k] {
				k++
			}
			return token, fmt.Errorf("seq %d (token %d, traj %d step %d): column %q differs at byte %d of %d: got %#x, want %#x",
				meta.Seq, token, meta.TrajID, meta.Step, c.Name, k, len(got), got[k], want[k])
		}
	}
	term, trunc := crashFlagsOf(token)
	if meta.Env != crashEnvOf(token) || meta.Terminated != term || meta.Truncated != trunc || meta.Done != (term || trunc) || meta.HasTail != meta.Done {
		return token, fmt.Errorf("seq %d (token %d): metadata %+v, row was written with env=%d term=%v trunc=%v and a final observation on done", meta.Seq, token, meta, crashEnvOf(token), term, trunc)
	}
	if meta.Step != w.step {
		return token, fmt.Errorf("seq %d (token %d): step %d, written as step %d of its trajectory", meta.Seq, token, meta.Step, w.step)
	}
	return token, nil
}

// check runs Verify on the data dir, reopens it and checks every buffer:
// each acknowledged row that can still be live is, and every row present
// is exactly as written and linked to the right neighbours. run is the
// child that crashed just before (nil after a clean close).
func (m *czModel) check(t *testing.T, dir string, round int, run *crashRun) map[string]*crashState {
	t.Helper()
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatalf("round %d: verify could not run: %v", round, err)
	}
	for _, br := range rep.Buffers {
		if len(br.Problems) > 0 {
			t.Errorf("round %d: verify reports %d problem(s) in buffer %q (write_count %d, durable %d, live %d, holes %d): %s",
				round, len(br.Problems), br.Name, br.WriteCount, br.Durable, br.LiveRows, br.Holes, strings.Join(br.Problems[:min(3, len(br.Problems))], "; "))
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
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range m.specs {
			if !yield(k) {
				return
			}
		}
	}) {
		b, err := s.Buffer(name)
		if err != nil {
			started := run == nil
			if run != nil {
				_, started = run.start[name]
			}
			if started {
				t.Errorf("round %d: buffer %q is gone: %v", round, name, err)
			}
			continue
		}
		out[name] = m.checkBuffer(t, b, round, run)
	}
	return out
}

func (m *czModel) checkBuffer(t *testing.T, b *Buffer, round int, run *crashRun) *crashState {
	t.Helper()
	name, capacity := b.Name(), b.Capacity()
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	st := &crashState{info: info, live: map[int64]RowMeta{}, tok: map[int64]int64{}}
	wc := info.WriteCount
	if run != nil && info.OpenTrajectories != 0 {
		t.Errorf("round %d: buffer %q: %d trajectories open right after reopening a crashed store", round, name, info.OpenTrajectories)
	}
	if wc < m.maxAckEnd[name] || wc < m.lastWC[name] {
		t.Errorf("round %d: buffer %q: write count %d after reopen, but seqs up to %d were acknowledged and %d was seen before", round, name, wc, m.maxAckEnd[name]-1, m.lastWC[name])
	}
	// Acknowledged rows the child's later writes cannot have overwritten
	// must all be live (kill -9 keeps the page cache, so even flush rows).
	wMax := m.lastWC[name]
	if run != nil {
		wMax = run.maxWriteCount(name, wMax)
	}
	lo := max(wc, wMax) - capacity
	var lost []int64
	for seq := range m.acked[name] {
		switch {
		case seq < lo:
			delete(m.acked[name], seq)
		case !b.Live(seq):
			lost = append(lost, seq)
			delete(m.acked[name], seq)
		}
	}
	slices.Sort(lost)
	if len(lost) > 0 {
		m.lostRows += len(lost)
		t.Errorf("round %d: buffer %q (%s): %d acknowledged row(s) missing (write_count %d, durable %d): seqs %v",
			round, name, b.Spec().Durability, len(lost), wc, info.Durable, lost[:min(len(lost), 12)])
	}

	seqs := b.LiveSeqs(0, int(capacity)+1)
	cols := readColumns(b)
	dst := crashDst(cols, len(seqs))
	metas := make([]RowMeta, len(seqs))
	missing, err := b.Gather(seqs, cols, dst, metas)
	if err != nil {
		t.Fatalf("round %d: buffer %q: gather of the live rows: %v", round, name, err)
	}
	if len(missing) > 0 {
		t.Errorf("round %d: buffer %q: %d live rows reported missing with no writer running", round, name, len(missing))
	}
	bad := 0
	for j, meta := range metas {
		if meta.Seq < 0 {
			continue
		}
		tok, err := m.checkRow(cols, dst, j, meta)
		if err == nil {
			if want, ok := m.acked[name][meta.Seq]; ok && want != tok {
				err = fmt.Errorf("seq %d holds token %d, but token %d was acknowledged at that seq", meta.Seq, tok, want)
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
	for seq, meta := range st.live {
		w := m.want[st.tok[seq]]
		if p, ok := st.tok[meta.PrevSeq]; ok && p != w.pred {
			t.Errorf("round %d: buffer %q: seq %d (token %d) links back to seq %d (token %d), but follows token %d", round, name, seq, st.tok[seq], meta.PrevSeq, p, w.pred)
		}
		if meta.PrevSeq == -1 && w.pred != -1 {
			t.Errorf("round %d: buffer %q: seq %d (token %d) starts a trajectory, but follows token %d", round, name, seq, st.tok[seq], w.pred)
		}
		if meta.NextSeq >= 0 {
			if n, ok := st.live[meta.NextSeq]; !ok || n.PrevSeq != seq {
				t.Errorf("round %d: buffer %q: seq %d has next_seq %d, which does not link back", round, name, seq, meta.NextSeq)
			}
		}
	}
	if run != nil {
		b.cs.mu.RLock()
		for seq := range m.acked[name] {
			if l := b.cs.loc[seq%capacity]; l.c != nil && !l.c.sealed && b.Live(seq) {
				m.fragRows++
			}
		}
		b.cs.mu.RUnlock()
	}
	m.lastWC[name] = wc
	return st
}

// writeAfter reopens the store and writes to every buffer an anonymous
// extend (its chunks sealed at once) and one on a new stream (chunks left
// open), each longer than any extend of the child, so that they take every
// seq an unacknowledged extend may have used. The rows must read back
// exactly, and verify must pass after a clean close.
func (m *czModel) writeAfter(t *testing.T, dir string, round int) {
	t.Helper()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name := range m.specs {
		b, err := s.Buffer(name)
		if err != nil {
			continue
		}
		wc := b.WriteCount()
		var seqs []int64
		for _, stream := range []string{"", fmt.Sprintf("parent%d", m.parentTok)} {
			const n = 30
			tokens := make([]int64, n)
			wants := make([]czWant, n)
			stk := newCzStacker(b.Spec())
			for i := range tokens {
				tokens[i] = m.parentTok + int64(i)
				wants[i] = stk.next(tokens[i])
				m.want[tokens[i]] = wants[i]
				m.begun[tokens[i]] = true
			}
			m.parentTok += n
			res, err := b.Extend(stream, czBatch(b.Spec(), tokens, wants, false))
			if err != nil {
				t.Fatalf("round %d: buffer %q refuses writes after reopening: %v", round, name, err)
			}
			if res.FirstSeq < wc {
				t.Errorf("round %d: buffer %q: new rows got seq %d below the write count %d", round, name, res.FirstSeq, wc)
			}
			m.noteAck(t, name, res.FirstSeq, n, tokens[0])
			for i := range n {
				seqs = append(seqs, res.FirstSeq+int64(i))
			}
		}
		cols := readColumns(b)
		dst := crashDst(cols, len(seqs))
		metas := make([]RowMeta, len(seqs))
		missing, err := b.Gather(seqs, cols, dst, metas)
		if err != nil || len(missing) > 0 {
			t.Fatalf("round %d: buffer %q: new rows not readable: missing %v, %v", round, name, missing, err)
		}
		for j := range seqs {
			tok, err := m.checkRow(cols, dst, j, metas[j])
			if err == nil && m.acked[name][seqs[j]] != tok {
				err = fmt.Errorf("seq %d holds token %d, wrote %d", seqs[j], tok, m.acked[name][seqs[j]])
			}
			if err != nil {
				t.Errorf("round %d: buffer %q: new row: %v", round, name, err)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// czNewestRecord reports the kind of the last record in a buffer's newest
// segment and whether it is torn (cut short), or ok=false if there is none.
func czNewestRecord(t *testing.T, bufDir string) (kind byte, torn, ok bool) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(bufDir, "seg.*.rbdk"))
	if err != nil || len(segs) == 0 {
		return 0, false, false
	}
	sort.Strings(segs)
	data, err := os.ReadFile(segs[len(segs)-1])
	if err != nil {
		t.Fatal(err)
	}
	for off := segHeaderSize; off < len(data); {
		n, err := recordLen(data[off:])
		if err != nil || off+n > len(data) {
			if len(data)-off > 8 {
				return data[off+8], true, true
			}
			return 0, true, false
		}
		kind, ok = data[off+8], true
		off += n
	}
	return kind, false, ok
}

func czKindName(k byte) string {
	switch k {
	case recSealed:
		return "seal"
	case recFragment:
		return "fragment"
	}
	return fmt.Sprintf("kind %d", k)
}

// ---------------------------------------------------------------------------
// The tests.

// TestCompressedCrashPoints kills the writer of a compressed buffer at each
// crash point, mid-chunk and after-chunk at several counts so that both
// fragments of open chunks and seals are torn or orphaned, and checks what
// reopening yields: verify clean, every acknowledged row there byte for
// byte, nothing of the extend in flight at a chunk point, new writes
// accepted and readable, and all of that again after another reopen.
func TestCompressedCrashPoints(t *testing.T) {
	cases := []struct {
		point string
		buf   string
		after int
	}{
		{"mid-chunk", czFsync, 1},
		{"mid-chunk", czFsync, 2},
		{"mid-chunk", czFsync, 5},
		{"mid-chunk", czFsync, 13},
		{"mid-chunk", czFsync, 40},
		{"mid-chunk", czFsync, 150}, // the ring of 256 has wrapped
		{"after-chunk", czFsync, 1},
		{"after-chunk", czFsync, 3},
		{"after-chunk", czFsync, 8},
		{"after-chunk", czFsync, 30},
		{"after-chunk", czFsync, 160},
		{"mid-chunk", czFlush, 25},
		{"after-data", czFsync, 40},
		{"after-meta", czFsync, 300},
		{"before-sync", czFsync, 9},
		{"after-sync", czFsync, 9},
		{"before-commit", czFlush, 7},
	}
	hit := map[string]map[string]bool{} // point -> kinds of record the crash hit
	fragRows := 0
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%s/%s/%d", tc.point, tc.buf, tc.after), func(t *testing.T) {
			dir := t.TempDir()
			m := newCzModel(tc.buf)
			run := crashRunChild(t, crashChildCfg{
				dir: dir, seed: uint64(300 + i), tokenBase: 1 << 32, bufs: []string{tc.buf}, writers: 1,
				maxExt: 250, intervalMS: 3600_000, ckptEach: tc.point == "before-commit",
				crashAt: tc.point, crashAfter: tc.after,
			})
			chunkPoint := tc.point == "mid-chunk" || tc.point == "after-chunk"
			if chunkPoint {
				kind, torn, ok := czNewestRecord(t, filepath.Join(dir, "buffers", tc.buf))
				if !ok {
					t.Fatalf("%s: no record in the newest segment", tc.point)
				}
				if torn != (tc.point == "mid-chunk") {
					t.Errorf("%s: the newest segment's last record (a %s) torn=%v", tc.point, czKindName(kind), torn)
				}
				if hit[tc.point] == nil {
					hit[tc.point] = map[string]bool{}
				}
				hit[tc.point][czKindName(kind)] = true
				t.Logf("%s pass %d hit a %s record", tc.point, tc.after, czKindName(kind))
			}
			m.absorb(t, 0, run)
			m.replay(run)
			lastAck := m.maxAckEnd[tc.buf]
			inflight := run.inFlight(tc.buf)
			st := m.check(t, dir, 0, run)[tc.buf]
			if st == nil {
				t.Fatal("buffer missing after the crash")
			}
			wc, durable := st.info.WriteCount, st.info.Durable
			fsync := tc.buf == czFsync
			if len(inflight) > 1 {
				t.Fatalf("%d extends in flight with one writer", len(inflight))
			}
			present := func(from, to int64) {
				t.Helper()
				e := inflight[0]
				for seq := from; seq < to; seq++ {
					if got, ok := st.tok[seq]; !ok || got != e.token+(seq-lastAck) {
						t.Errorf("%s: row %d of the extend in flight is not there (live %v, token %d, want %d)", tc.point, seq, ok, got, e.token+(seq-lastAck))
					}
				}
			}
			switch tc.point {
			case "mid-chunk", "after-chunk":
				// Chunk records go before any row record: nothing of
				// the extend in flight (if the crash was not in a
				// CloseStream after its extend) can be live.
				for _, e := range inflight {
					for seq, tok := range st.tok {
						if tok >= e.token && tok < e.token+int64(e.rows) {
							t.Errorf("%s: row %d (token %d) of the extend in flight is live", tc.point, seq, tok)
						}
					}
				}
				if fsync && (wc != lastAck || durable != lastAck) {
					t.Errorf("%s: write count %d and durable watermark %d, want both %d (the end of the last acknowledged extend)", tc.point, wc, durable, lastAck)
				}
			case "after-data", "after-meta":
				if len(inflight) != 1 {
					t.Fatalf("%d extends in flight at %s, want 1", len(inflight), tc.point)
				}
				c := int64(tc.after - 1) // the row being written
				if tc.point == "after-meta" {
					c++
				}
				present(lastAck, c)
				if _, ok := st.live[c]; ok && tc.point == "after-data" {
					t.Errorf("after-data: the row being written (seq %d) is live", c)
				}
				if durable != lastAck {
					t.Errorf("%s: durable watermark %d, want %d", tc.point, durable, lastAck)
				}
			case "before-sync", "after-sync":
				if len(inflight) != 1 {
					t.Fatalf("%d extends in flight at %s, want 1", len(inflight), tc.point)
				}
				end := lastAck + int64(inflight[0].rows)
				present(lastAck, end)
				want := lastAck
				if tc.point == "after-sync" {
					want = end
				}
				if durable != want {
					t.Errorf("%s: durable watermark %d, want %d", tc.point, durable, want)
				}
			case "before-commit":
				if len(inflight) != 0 || durable != lastAck {
					t.Errorf("before-commit: %d extends in flight, durable %d, want 0 and %d", len(inflight), durable, lastAck)
				}
			}
			m.writeAfter(t, dir, 1)
			m.check(t, dir, 2, nil)
			fragRows += m.fragRows
		})
	}
	for _, p := range []string{"mid-chunk", "after-chunk"} {
		if !hit[p]["seal"] || !hit[p]["fragment"] {
			t.Errorf("%s crashes hit only %v records; want both seals and fragments", p, hit[p])
		}
	}
	if fragRows == 0 {
		t.Errorf("no acknowledged row was recovered from the fragments of an open chunk: kill -9 with an open chunk was not exercised")
	}
	t.Logf("%d acknowledged rows were recovered from fragments of open chunks", fragRows)
}

// TestCompressedCrashMidChunkAfterN: RBD_CRASH_AFTER=n makes mid-chunk
// fire at the n-th chunk record, as it does for every other point, leaving
// n-1 whole records and a torn one.
func TestCompressedCrashMidChunkAfterN(t *testing.T) {
	dir := t.TempDir()
	crashRunChild(t, crashChildCfg{
		dir: dir, seed: 5, tokenBase: 1 << 32, bufs: []string{czFsync}, writers: 1,
		maxExt: 40, intervalMS: 3600_000, crashAt: "mid-chunk", crashAfter: 3,
	})
	bufDir := filepath.Join(dir, "buffers", czFsync)
	if _, torn, _ := czNewestRecord(t, bufDir); !torn {
		t.Errorf("the newest segment does not end with a torn record")
	}
	if n := len(czRecords(t, bufDir, czSpecFor(czFsync))); n != 2 {
		t.Errorf("%d whole records before the torn one, want 2", n)
	}
}

// TestCompressedCrashReusedSeqs: a crash after an extend's chunk records
// but before its rows' records (after-chunk) leaves records naming seqs
// that no row has. An fsync buffer resumes at the end of the last
// acknowledged extend, so those seqs are handed out again, to rows whose
// chunks are written anew. Every later open must bind each row to the
// chunk written for it (same trajectory and step), never to the stale
// record of the lost extend: the new rows must read back as written after
// a clean close and reopen, and Verify must pass.
func TestCompressedCrashReusedSeqs(t *testing.T) {
	dir := t.TempDir()
	m := newCzModel(czFsync)
	run := crashRunChild(t, crashChildCfg{
		dir: dir, seed: 306, tokenBase: 1 << 32, bufs: []string{czFsync}, writers: 1,
		maxExt: 40, intervalMS: 3600_000, crashAt: "after-chunk", crashAfter: 1,
	})
	kind, _, _ := czNewestRecord(t, filepath.Join(dir, "buffers", czFsync))
	m.absorb(t, 0, run)
	m.replay(run)
	st := m.check(t, dir, 0, run)[czFsync]
	if st == nil || st.info.WriteCount != 0 {
		t.Fatalf("after a crash in the first extend: %+v, want write count 0", st)
	}
	t.Logf("the lost extend left a %s record for seqs from 0 on", czKindName(kind))
	m.writeAfter(t, dir, 1) // seqs 0..59 again: 30 rows sealed at once, 30 in an open chunk
	m.check(t, dir, 2, nil)
}

// TestCompressedCrashKillRandom kills a writer of two compressed buffers
// (fsync with two streams sharing syncs, and flush) at random moments,
// round after round on the same data dir.
func TestCompressedCrashKillRandom(t *testing.T) {
	rounds := 6
	if testing.Short() {
		rounds = 3
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(17, 3))
	m := newCzModel(czFsync, czFlush)
	for r := 0; r < rounds; r++ {
		delay := time.Duration(40+rng.IntN(260)) * time.Millisecond
		t.Run(fmt.Sprintf("round%02d", r), func(t *testing.T) {
			run := crashRunChild(t, crashChildCfg{
				dir: dir, seed: uint64(r), tokenBase: int64(r+1) << 32,
				bufs: []string{czFsync, czFlush}, intervalMS: 20, killAfter: delay,
			})
			m.absorb(t, r, run)
			m.replay(run)
			m.check(t, dir, r, run)
			if t.Failed() {
				t.Logf("killed %v after ready; %d extends acknowledged, %d in flight", delay, len(run.acks), len(run.begins)-len(run.acks))
			}
		})
	}
	m.writeAfter(t, dir, rounds)
	m.check(t, dir, rounds+1, nil)
	t.Logf("%d rounds, %d rows acknowledged (%d recovered from fragments); write counts %v", rounds, m.ackedRows, m.fragRows, m.lastWC)
	if m.lastWC[czFsync] <= czSpecFor(czFsync).Capacity {
		t.Errorf("the fsync ring never wrapped (write counts %v): the test exercised too little", m.lastWC)
	}
}

// TestCompressedOpenChunkSurvivesCleanClose: a store closed cleanly while a
// trajectory is still growing keeps its open chunk (held in fragment
// records): after reopening, the chunk's rows read back exactly, the
// trajectory is still open, and the stream continues it — the same
// trajectory, the next step, and the same chunk, sealed once full.
func TestCompressedOpenChunkSurvivesCleanClose(t *testing.T) {
	dir := t.TempDir()
	spec := czSpecFor(czFsync) // chunks of 8
	m := newCzModel()
	m.specs["live"] = spec
	m.acked["live"] = map[int64]int64{}
	// Tokens of env 0 that do not end a trajectory, and one that does.
	var plain []int64
	done := int64(-1)
	for tok := int64(1 << 40); len(plain) < 40 || done < 0; tok++ {
		if crashEnvOf(tok) != 0 {
			continue
		}
		if term, trunc := crashFlagsOf(tok); term || trunc {
			if done < 0 {
				done = tok
			}
			continue
		}
		plain = append(plain, tok)
	}
	stk := newCzStacker(spec)
	seqOf := map[int64]int64{}
	extend := func(b *Buffer, tokens []int64) ExtendResult {
		t.Helper()
		wants := make([]czWant, len(tokens))
		for i, tok := range tokens {
			wants[i] = stk.next(tok)
			m.want[tok] = wants[i]
		}
		res := mustExtend(t, b, "actor", czBatch(spec, tokens, wants, false))
		for i, tok := range tokens {
			seqOf[tok] = res.FirstSeq + int64(i)
			m.acked["live"][res.FirstSeq+int64(i)] = tok // tokens are not consecutive: no noteAck
		}
		m.maxAckEnd["live"] = res.WriteCount
		return res
	}
	s := openStore(t, dir)
	b := mustCreate(t, s, "live", spec)
	// 13 rows in extends of 3, 4, 3, 2 and 1: steps 0-7 are sealed during
	// the third extend, steps 8-12 are an open chunk in three fragments.
	next := 0
	for _, n := range []int{3, 4, 3, 2, 1} {
		extend(b, plain[next:next+n])
		next += n
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	recs := czRecords(t, filepath.Join(dir, "buffers", "live"), spec)
	var openID uint64
	frags := 0
	for _, r := range recs {
		if r.Kind == recFragment && r.FirstStep >= 8 {
			openID = r.ID
			frags++
		}
	}
	for _, r := range recs {
		if r.Kind == recSealed && r.ID == openID {
			t.Fatalf("the open chunk %d was sealed at close", openID)
		}
	}
	if frags != 3 {
		t.Fatalf("%d fragment records of the open chunk (steps 8-12), want 3", frags)
	}
	m.check(t, dir, 0, nil) // verify, reopen, every row exact

	s = openStore(t, dir)
	b, err := s.Buffer("live")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := b.Info()
	if info.OpenTrajectories != 1 || info.Streams != 1 {
		t.Fatalf("after a clean close: %d open trajectories, %d streams; want 1 and 1", info.OpenTrajectories, info.Streams)
	}
	b.cs.mu.RLock()
	for _, tok := range plain[8:13] {
		l := b.cs.loc[seqOf[tok]%b.capacity]
		if l.c == nil || l.c.sealed || l.c.id != openID {
			t.Errorf("row %d is not in the open chunk %d rebuilt from its fragments", seqOf[tok], openID)
		}
	}
	b.cs.mu.RUnlock()
	// The stream continues: 3 more rows fill the chunk (steps 8-15), which
	// is then sealed with the rows from before the close; 2 more start
	// the next chunk; then the trajectory ends.
	before := seqOf[plain[12]]
	res := extend(b, plain[13:18])
	extend(b, []int64{plain[18], done})
	metas := make([]RowMeta, 5)
	cols := readColumns(b)
	seqs := []int64{res.FirstSeq, res.FirstSeq + 1, res.FirstSeq + 2, res.FirstSeq + 3, res.FirstSeq + 4}
	if _, err := b.Gather(seqs, cols, crashDst(cols, 5), metas); err != nil {
		t.Fatal(err)
	}
	old := make([]RowMeta, 1)
	if _, err := b.Gather([]int64{before}, cols, crashDst(cols, 1), old); err != nil {
		t.Fatal(err)
	}
	if metas[0].TrajID != old[0].TrajID || metas[0].Step != 13 || metas[0].PrevSeq != before {
		t.Errorf("the stream did not continue its trajectory: first new row %+v, last row before the close %+v", metas[0], old[0])
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var sealed *chunkRecord
	for _, r := range czRecords(t, filepath.Join(dir, "buffers", "live"), spec) {
		if r.Kind == recSealed && r.ID == openID {
			sealed = r
		}
	}
	switch {
	case sealed == nil:
		t.Errorf("the continued chunk %d was never sealed", openID)
	case sealed.FirstStep != 8 || len(sealed.Seqs) != 8 || sealed.Seqs[0] != seqOf[plain[8]] || sealed.Seqs[7] != seqOf[plain[15]]:
		t.Errorf("the continued chunk was sealed with first step %d and seqs %v; want steps 8-15, seqs %d..%d", sealed.FirstStep, sealed.Seqs, seqOf[plain[8]], seqOf[plain[15]])
	}
	m.check(t, dir, 1, nil)
}

// czRecords decodes every whole record of a buffer's segments, oldest
// segment first.
func czRecords(t *testing.T, bufDir string, spec Spec) []*chunkRecord {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(bufDir, "seg.*.rbdk"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(segs)
	var tails []bool
	for _, f := range spec.Fields {
		if spec.Compressed(f) {
			tails = append(tails, f.Name == "observation")
		}
	}
	var out []*chunkRecord
	for _, path := range segs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off := segHeaderSize; off < len(data); {
			n, err := recordLen(data[off:])
			if err != nil || off+n > len(data) {
				break
			}
			r, err := decodeChunkRecord(data[off:off+n], tails, spec.Compression.ChunkLen)
			if err != nil {
				t.Fatalf("%s offset %d: %v", path, off, err)
			}
			out = append(out, r)
			off += n
		}
	}
	return out
}
