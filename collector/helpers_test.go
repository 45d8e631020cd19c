package collector_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openDB opens a data dir in a temp dir, closed at cleanup.
func openDB(t testing.TB) *rbd.DB {
	t.Helper()
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// newBuffer creates a buffer for env's steps.
func newBuffer(t testing.TB, db *rbd.DB, name string, env envs.Spec, o collector.SpecOptions) *rbd.Buffer {
	t.Helper()
	if o.Storage == "" {
		o.Storage = storage.KindMemory
	}
	if o.Capacity == 0 {
		o.Capacity = 1 << 16
	}
	b, _, err := db.CreateBuffer(name, collector.BufferSpec(env, o))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newEnv(t testing.TB, name string, n int, opts *envs.Options) *envs.Vector {
	t.Helper()
	v, err := envs.New(name, n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// httpServer serves db over HTTP for the test and returns a client.
func httpServer(t testing.TB, db *rbd.DB) (*client.Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(server.New(db, nil).Handler())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	c, err := client.New(srv.URL, &client.Options{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

// rowsOf reads every live row of b: the field bytes per column plus the
// metadata (with links) of each row, in seq order.
type rows struct {
	seqs []int64
	meta []storage.RowMeta
	cols map[string][]byte
	size map[string]int // row bytes per column
}

func readRows(t testing.TB, b *rbd.Buffer) *rows {
	t.Helper()
	wc := b.WriteCount()
	seqs := b.LiveSeqs(0, int(wc)+1)
	r := &rows{seqs: seqs, cols: map[string][]byte{}, size: map[string]int{}}
	var cols []storage.Column
	for _, f := range b.Spec().Fields {
		c, _ := b.Column(f.Name)
		cols = append(cols, c)
	}
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = make([]byte, len(seqs)*c.RowBytes)
	}
	missing, err := b.Gather(seqs, cols, dst, nil)
	if err != nil || len(missing) > 0 {
		t.Fatalf("gather: %v, missing %v", err, missing)
	}
	for i, c := range cols {
		r.cols[c.Name] = dst[i]
		r.size[c.Name] = c.RowBytes
	}
	r.meta = make([]storage.RowMeta, len(seqs))
	if err := b.ReadIndex(func(ix storage.Index) {
		for i, s := range seqs {
			r.meta[i], _ = ix.Row(s)
		}
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rows) at(col string, i int) []byte {
	n := r.size[col]
	return r.cols[col][i*n : (i+1)*n]
}

func f32At(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }

func putF32(b []byte, i int, v float32) { binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v)) }

// scriptEnv is a batched env of fixed episode lengths: copy i's episodes
// last lens[i] steps and then terminate. Its observation is float32
// [copy, episode, step] (episode counts the copy's resets from 0), its
// reward the step number. Actions are ignored.
type scriptEnv struct {
	lens     []int
	step     []int
	episode  []int
	failStep int // Step fails on this call (1-based); 0 never
	calls    int
}

func newScriptEnv(lens ...int) *scriptEnv {
	s := &scriptEnv{lens: lens, step: make([]int, len(lens)), episode: make([]int, len(lens))}
	for i := range s.episode {
		s.episode[i] = -1
	}
	return s
}

func (s *scriptEnv) Spec() envs.Spec {
	return envs.Spec{Name: "script", ObsDType: "float32", ObsShape: []int{3}, NumActions: 2}
}
func (s *scriptEnv) NumEnvs() int { return len(s.lens) }
func (s *scriptEnv) Seed(uint64)  {}
func (s *scriptEnv) Close() error { return nil }

func (s *scriptEnv) obs(i int, dst []byte) {
	for k, v := range []float32{float32(i), float32(s.episode[i]), float32(s.step[i])} {
		binary.LittleEndian.PutUint32(dst[12*i+4*k:], math.Float32bits(v))
	}
}

func (s *scriptEnv) Reset(mask []bool, obs []byte) error {
	for i := range s.lens {
		if mask == nil || mask[i] {
			s.episode[i]++
			s.step[i] = 0
			s.obs(i, obs)
		}
	}
	return nil
}

var errEnvBroke = errors.New("env broke")

func (s *scriptEnv) Step(_ *envs.Actions, out *envs.StepResult) error {
	s.calls++
	if s.calls == s.failStep {
		return errEnvBroke
	}
	for i := range s.lens {
		s.step[i]++
		s.obs(i, out.Obs)
		out.Reward[i] = float32(s.step[i])
		out.Terminated[i] = s.step[i] == s.lens[i]
		out.Truncated[i] = false
	}
	return nil
}

// recorder is a Writer that keeps a copy of every batch and forwards it
// (when next is set). It can fail on a given call.
type recorder struct {
	next    collector.Writer
	mu      sync.Mutex
	batches []storage.Batch
	closed  []string
	failAt  int // Extend fails on this call (1-based); 0 never
	calls   int
}

var errWriterBroke = errors.New("writer broke")

func (w *recorder) Extend(ctx context.Context, stream string, b *storage.Batch) (storage.ExtendResult, error) {
	w.mu.Lock()
	w.calls++
	fail := w.calls == w.failAt
	c := storage.Batch{Rows: b.Rows, Env: append([]int64(nil), b.Env...), Fields: map[string][]byte{}}
	for k, v := range b.Fields {
		c.Fields[k] = append([]byte(nil), v...)
	}
	w.batches = append(w.batches, c)
	w.mu.Unlock()
	if fail {
		return storage.ExtendResult{}, errWriterBroke
	}
	if w.next == nil {
		return storage.ExtendResult{Rows: b.Rows}, nil
	}
	return w.next.Extend(ctx, stream, b)
}

func (w *recorder) CloseStream(ctx context.Context, stream string) error {
	w.mu.Lock()
	w.closed = append(w.closed, stream)
	w.mu.Unlock()
	if w.next == nil {
		return nil
	}
	return w.next.CloseStream(ctx, stream)
}

// countingPolicy counts calls and acts like its inner policy.
type countingPolicy struct {
	inner collector.Policy
	calls int
	err   error
}

func (p *countingPolicy) Act(obs *collector.Obs, act *envs.Actions, rng *rand.Rand) error {
	p.calls++
	if p.err != nil {
		return p.err
	}
	return p.inner.Act(obs, act, rng)
}
