package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/benchdata"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

// newServer serves a fresh data dir over HTTP for the test's lifetime.
func newServer(t testing.TB, opts *server.Options) (*httptest.Server, *server.Server) {
	t.Helper()
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(db, opts)
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.Config.ConnContext = server.ConnContext // as rbd serve does
	ts.Start()
	t.Cleanup(func() {
		ts.Close()
		if err := db.Close(); err != nil {
			t.Errorf("close db: %v", err)
		}
	})
	return ts, srv
}

func newClient(t testing.TB, url string, opts *client.Options) *client.Client {
	t.Helper()
	c, err := client.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// cartpole is benchdata.CartPoleSpec.
func cartpole(capacity int64) *client.Spec { return benchdata.CartPoleSpec(capacity) }

// pattern is the observation of the row with token tok; every field of a
// test row is derived from its token, so a torn row is visible.
func pattern(tok int64) []float32 {
	f := float32(tok)
	return []float32{f, f + 1, f + 2, f + 3}
}

// steps builds extend tensors for rows with the given tokens: observation
// pattern(tok), action tok, reward tok, and for done rows the final
// observation pattern(tok+1). env may be nil.
func steps(toks []int64, done []bool, env []int64) []codec.Tensor {
	n := len(toks)
	obs := make([]float32, 0, 4*n)
	rew := make([]float32, n)
	trunc := make([]bool, n)
	var final []float32
	for i, tok := range toks {
		obs = append(obs, pattern(tok)...)
		rew[i] = float32(tok)
		if done[i] {
			final = append(final, pattern(tok+1)...)
		}
	}
	ts := []codec.Tensor{
		client.NewTensor("observation", []int{n, 4}, obs),
		client.NewTensor("action", nil, toks),
		client.NewTensor("next.reward", nil, rew),
		client.NewTensor("next.done", nil, done),
		client.NewTensor("next.terminated", nil, done),
		client.NewTensor("next.truncated", nil, trunc),
		client.NewTensor("next.observation", []int{len(final) / 4, 4}, final),
	}
	if env != nil {
		ts = append(ts, client.NewTensor("env", nil, env))
	}
	return ts
}

func seqToks(from, n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from + int64(i)
	}
	return out
}

// rowView is one row of a Batch, decoded.
type rowView struct {
	seq, traj, step, action int64
	obs, next               []float32
	reward                  float32
}

// rowsOf decodes every row of a transition batch (or a flattened slice
// batch); next is nil when the batch has no next.observation.
func rowsOf(t testing.TB, b *client.Batch) []rowView {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	seq, err := client.Column[int64](b, "seq")
	must(err)
	traj, err := client.Column[int64](b, "traj_id")
	must(err)
	step, err := client.Column[int64](b, "step")
	must(err)
	act, err := client.Column[int64](b, "action")
	must(err)
	obs, err := client.Column[float32](b, "observation")
	must(err)
	rew, err := client.Column[float32](b, "next.reward")
	must(err)
	var next []float32
	if _, ok := b.Tensor("next.observation"); ok {
		next, err = client.Column[float32](b, "next.observation")
		must(err)
	}
	if len(obs) != 4*len(seq) || len(act) != len(seq) || len(traj) != len(seq) || len(step) != len(seq) || len(rew) != len(seq) {
		t.Fatalf("batch columns disagree on the row count: seq %d, obs %d, action %d", len(seq), len(obs), len(act))
	}
	out := make([]rowView, len(seq))
	for i := range out {
		out[i] = rowView{seq: seq[i], traj: traj[i], step: step[i], action: act[i], obs: obs[4*i : 4*i+4], reward: rew[i]}
		if next != nil {
			out[i].next = next[4*i : 4*i+4]
		}
	}
	return out
}

// checkRow reports a row whose fields do not all derive from its action
// token (a torn or misplaced row).
func checkRow(r rowView) error {
	if !slices.Equal(r.obs, pattern(r.action)) || r.reward != float32(r.action) {
		return fmt.Errorf("seq %d: action %d but observation %v, reward %v", r.seq, r.action, r.obs, r.reward)
	}
	if r.next != nil && !slices.Equal(r.next, pattern(r.action+1)) {
		return fmt.Errorf("seq %d: action %d but next.observation %v", r.seq, r.action, r.next)
	}
	return nil
}

func TestHealthAndMetrics(t *testing.T) {
	ts, _ := newServer(t, &server.Options{Token: "tok"})
	ctx := ctxT(t)
	// Health needs no token; metrics does.
	anon := newClient(t, ts.URL+"/", nil)
	if err := anon.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	if _, err := anon.Metrics(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("metrics without token: %v", err)
	}
	c := newClient(t, ts.URL, &client.Options{Token: "tok"})
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	m, err := c.Metrics(ctx)
	if err != nil || !strings.Contains(string(m), `rbd_buffer_write_count{buffer="cp"} 0`) {
		t.Fatalf("metrics: %v\n%s", err, m)
	}
}

func TestBufferLifecycle(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)

	spec := cartpole(1000)
	info, created, err := c.CreateBuffer(ctx, "cp", spec)
	if err != nil || !created {
		t.Fatalf("create: created=%v err=%v", created, err)
	}
	if info.Name != "cp" || info.Size != 0 || info.WriteCount != 0 || info.Spec.Capacity != 1000 {
		t.Fatalf("create info: %+v", info)
	}
	var names []string
	for _, f := range info.Spec.Fields {
		names = append(names, f.Name)
	}
	if want := []string{"observation", "action", "next.reward", "next.done", "next.terminated", "next.truncated"}; !slices.Equal(names, want) {
		t.Fatalf("spec fields %v, want %v (in order)", names, want)
	}
	if f, _ := info.Spec.Field("observation"); f.DType != "float32" || !slices.Equal(f.Shape, []int{4}) {
		t.Fatalf("observation field: %+v", f)
	}
	if p := info.Spec.Priority; p == nil || p.Alpha != 0.6 || p.Eps != 1e-6 || !info.Spec.CompactObs || info.Spec.Durability != "flush" {
		t.Fatalf("spec defaults: %+v", info.Spec)
	}

	// Identical after defaults, fields in another order: 200, not created.
	same := `{"capacity": 1000, "fields": {"action": {"dtype": "int64", "shape": []},
	 "observation": {"dtype": "float32", "shape": [4]}, "next.reward": {"dtype": "float32", "shape": []},
	 "next.done": {"dtype": "bool", "shape": []}, "next.terminated": {"dtype": "bool", "shape": []},
	 "next.truncated": {"dtype": "bool", "shape": []}}, "compact_obs": true, "priority": {}}`
	info2, created, err := c.CreateBufferJSON(ctx, "cp", json.RawMessage(same))
	if err != nil || created || info2.Name != "cp" {
		t.Fatalf("identical create: created=%v err=%v info=%+v", created, err, info2)
	}
	if _, created, err = c.CreateBuffer(ctx, "cp", spec); err != nil || created {
		t.Fatalf("identical create (typed): created=%v err=%v", created, err)
	}

	// A different spec: 409.
	other := cartpole(999)
	_, _, err = c.CreateBuffer(ctx, "cp", other)
	if !errors.Is(err, client.ErrConflict) {
		t.Fatalf("conflicting create: %v", err)
	}
	if ae, ok := errors.AsType[*client.APIError](err); !ok || ae.Status != 409 || ae.Message == "" {
		t.Fatalf("conflict error: %#v", err)
	}

	if _, _, err := c.CreateBuffer(ctx, "mem", &client.Spec{Capacity: 10, Storage: "memory",
		Fields: []client.Field{{Name: "observation", DType: "uint8", Shape: []int{2, 3}}, {Name: "next.done", DType: "bool"}}}); err != nil {
		t.Fatal(err)
	}
	list, err := c.Buffers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]client.Info{}
	for _, i := range list {
		got[i.Name] = i
	}
	if len(list) != 2 || got["cp"].Spec.Capacity != 1000 || got["mem"].Spec.Storage != "memory" {
		t.Fatalf("buffers: %+v", list)
	}
	info, err = c.Info(ctx, "mem")
	if err != nil || info.Spec.CompactObs || len(info.Spec.Fields) != 2 || !slices.Equal(info.Spec.Fields[0].Shape, []int{2, 3}) {
		t.Fatalf("info mem: %+v %v", info, err)
	}

	if err := c.DeleteBuffer(ctx, "cp"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.Info(ctx, "cp"); !client.IsNotFound(err) {
		t.Fatalf("info after delete: %v", err)
	}
	if err := c.DeleteBuffer(ctx, "cp"); !client.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := c.Extend(ctx, "cp", "s", steps([]int64{0}, []bool{false}, nil)); !client.IsNotFound(err) {
		t.Fatalf("extend after delete: %v", err)
	}
	if list, err := c.Buffers(ctx); err != nil || len(list) != 1 || list[0].Name != "mem" {
		t.Fatalf("buffers after delete: %+v %v", list, err)
	}
}

func TestExtendAndSample(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(1000)); err != nil {
		t.Fatal(err)
	}
	// One trajectory written in two requests on one stream: tokens 100..104
	// (done at 104), then a second trajectory 200..202 left open.
	res, err := c.Extend(ctx, "cp", "actor-0", steps(seqToks(100, 3), []bool{false, false, false}, nil))
	if err != nil || res != (client.ExtendResult{FirstSeq: 0, Rows: 3, WriteCount: 3}) {
		t.Fatalf("extend 1: %+v %v", res, err)
	}
	res, err = c.Extend(ctx, "cp", "actor-0", steps([]int64{103, 104, 200, 201, 202}, []bool{false, true, false, false, false}, nil))
	if err != nil || res != (client.ExtendResult{FirstSeq: 3, Rows: 5, WriteCount: 8}) {
		t.Fatalf("extend 2: %+v %v", res, err)
	}
	info, err := c.Info(ctx, "cp")
	if err != nil || info.Size != 8 || info.WriteCount != 8 || info.Trajectories != 2 || info.OpenTrajectories != 1 {
		t.Fatalf("info: %+v %v", info, err)
	}

	// Every row whose next observation is known (all but the open
	// trajectory's newest, seq 7), once each.
	batch, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 7, Sampler: "without_replacement", Seed: client.Ptr[uint64](1)})
	if err != nil {
		t.Fatal(err)
	}
	if batch.Rows() != 7 {
		t.Fatalf("batch rows %d", batch.Rows())
	}
	if obs, ok := batch.Tensor("observation"); !ok || obs.DType != "float32" || !slices.Equal(obs.Shape, []int{7, 4}) {
		t.Fatalf("observation tensor: %+v", obs)
	}
	if _, ok := batch.Tensor("nope"); ok {
		t.Fatal("Tensor found a tensor that is not there")
	}
	if batch.Metadata["epoch"] == "" {
		t.Errorf("without_replacement answer carries no epoch metadata: %v", batch.Metadata)
	}
	rows := rowsOf(t, batch)
	slices.SortFunc(rows, func(a, b rowView) int { return int(a.seq - b.seq) })
	wantAction := []int64{100, 101, 102, 103, 104, 200, 201}
	wantStep := []int64{0, 1, 2, 3, 4, 0, 1}
	for i, r := range rows {
		if r.seq != int64(i) || r.action != wantAction[i] || r.step != wantStep[i] {
			t.Errorf("row %d: seq %d action %d step %d, want %d %d %d", i, r.seq, r.action, r.step, i, wantAction[i], wantStep[i])
		}
		if err := checkRow(r); err != nil {
			t.Error(err)
		}
		if r.next == nil {
			t.Errorf("row %d: no next.observation", i)
		}
	}
	if rows[0].traj != rows[4].traj || rows[4].traj == rows[5].traj || rows[5].traj != rows[6].traj {
		t.Errorf("traj ids %v", rows)
	}

	// Keys select the fields; seq, traj_id and step always come.
	batch, err = c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 3, Keys: []string{"action"}, Seed: client.Ptr[uint64](0)})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tt := range batch.Tensors {
		names = append(names, tt.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"action", "seq", "step", "traj_id"}) {
		t.Fatalf("keys [action]: tensors %v", names)
	}

	// Slices follow the trajectory.
	batch, err = c.Sample(ctx, "cp", &client.SampleRequest{Sampler: "slice", NumSlices: 2, SliceLen: 3, Seed: client.Ptr[uint64](3)})
	if err != nil {
		t.Fatal(err)
	}
	if obs, _ := batch.Tensor("observation"); !slices.Equal(obs.Shape, []int{2, 3, 4}) {
		t.Fatalf("slice observation shape %v", obs.Shape)
	}
	rows = rowsOf(t, batch)
	for i, r := range rows {
		if err := checkRow(rowView{seq: r.seq, action: r.action, obs: r.obs, reward: r.reward}); err != nil {
			t.Error(err)
		}
		if i%3 > 0 && (r.seq != rows[i-1].seq+1 || r.action != rows[i-1].action+1) {
			t.Errorf("slice row %d: seq %d action %d after %d %d", i, r.seq, r.action, rows[i-1].seq, rows[i-1].action)
		}
	}

	// Prioritised samples carry importance weights.
	batch, err = c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 4, Sampler: "prioritized", Beta: client.Ptr(0.5)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := client.Column[float32](batch, "weight")
	if err != nil || len(w) != 4 {
		t.Fatalf("weight: %v %v", w, err)
	}
	for _, x := range w {
		if !(x > 0 && x <= 1) {
			t.Errorf("weight %v outside (0, 1]", x)
		}
	}

	// Two envs of one stream, interleaved: each env its own trajectory.
	res, err = c.Extend(ctx, "cp", "actor-1", steps([]int64{300, 400, 301, 401}, []bool{false, false, false, true}, []int64{0, 1, 0, 1}))
	if err != nil || res.FirstSeq != 8 || res.Rows != 4 {
		t.Fatalf("extend with env: %+v %v", res, err)
	}
	rb, err := c.Rows(ctx, "cp", 8, 4)
	if err != nil {
		t.Fatal(err)
	}
	rows = rowsOf(t, rb)
	if rows[0].traj != rows[2].traj || rows[1].traj != rows[3].traj || rows[0].traj == rows[1].traj ||
		rows[2].step != 1 || rows[3].step != 1 {
		t.Fatalf("env rows: %+v", rows)
	}
}

func TestExtendRejected(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	bad := steps(seqToks(0, 2), []bool{false, false}, nil)
	bad[0] = client.NewTensor("observation", []int{2, 3}, make([]float32, 6))
	_, err := c.Extend(ctx, "cp", "", bad)
	if !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), "observation") {
		t.Fatalf("mis-shaped extend: %v", err)
	}
	// A shape that does not match the data never leaves the client.
	broken := steps(seqToks(0, 2), []bool{false, false}, nil)
	broken[1].Shape = []int{3}
	if _, err := c.Extend(ctx, "cp", "", broken); err == nil || errors.As(err, new(*client.APIError)) {
		t.Fatalf("inconsistent tensor: %v", err)
	}
	if info, err := c.Info(ctx, "cp"); err != nil || info.WriteCount != 0 {
		t.Fatalf("rejected extends wrote: %+v %v", info, err)
	}
}

func TestPriorities(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(8)); err != nil {
		t.Fatal(err)
	}
	// 12 rows into 8 slots: seqs 0..3 are overwritten.
	if _, err := c.Extend(ctx, "cp", "s", steps(seqToks(0, 12), make([]bool, 12), nil)); err != nil {
		t.Fatal(err)
	}
	updated, stale, err := c.UpdatePriorities(ctx, "cp", []int64{0, 3, 4, 11, 12, -1}, []float64{1, 1, 5, 0, 2, 1})
	if err != nil || updated != 2 || stale != 4 {
		t.Fatalf("update: updated=%d stale=%d err=%v, want 2 and 4", updated, stale, err)
	}
	// Sampleable rows are 4..10 (11, the open trajectory's newest, has no
	// next observation yet). Seq 4 now has the highest priority (5, the
	// others keep the initial 1), so the lowest importance weight.
	batch, err := c.Sample(ctx, "cp", &client.SampleRequest{BatchSize: 64, Sampler: "prioritized", Seed: client.Ptr[uint64](9), Keys: []string{"action"}})
	if err != nil {
		t.Fatal(err)
	}
	seqs, _ := client.Column[int64](batch, "seq")
	ws, _ := client.Column[float32](batch, "weight")
	for i, s := range seqs {
		if s < 4 || s > 10 {
			t.Fatalf("sampled seq %d outside the sampleable 4..10", s)
		}
		if s == 4 && ws[i] >= 1 {
			t.Errorf("seq 4 (the highest priority) has weight %v", ws[i])
		}
	}
	_, _, err = c.UpdatePriorities(ctx, "cp", []int64{5}, []float64{math.NaN()})
	if !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), "priority") {
		t.Fatalf("NaN priority: %v", err)
	}
	if _, _, err = c.UpdatePriorities(ctx, "cp", []int64{5}, []float64{-1}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("negative priority: %v", err)
	}
	if _, _, err = c.UpdatePriorities(ctx, "cp", []int64{5, 6}, []float64{1}); err == nil || errors.As(err, new(*client.APIError)) {
		t.Fatalf("length mismatch must fail in the client: %v", err)
	}
	if u, s, err := c.UpdatePriorities(ctx, "cp", nil, nil); err != nil || u != 0 || s != 0 {
		t.Fatalf("empty update: %d %d %v", u, s, err)
	}
	// A buffer without priorities.
	spec := cartpole(8)
	spec.Priority = nil
	if _, _, err := c.CreateBuffer(ctx, "plain", spec); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.UpdatePriorities(ctx, "plain", []int64{0}, []float64{1}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("priorities on a buffer without them: %v", err)
	}
}

// UpdateFields sets a mutable field of live rows; stale seqs are skipped;
// an immutable field or a wrong shape is a 400 naming the field.
func TestUpdateFields(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	spec := cartpole(8)
	spec.Fields = append(spec.Fields, client.Field{Name: "h", DType: "float32", Shape: []int{2}, Mutable: true})
	if _, _, err := c.CreateBuffer(ctx, "r", spec); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := info.Spec.Field("h"); !ok || !f.Mutable {
		t.Fatalf("the server's spec lost mutable: %+v", info.Spec.Fields)
	}
	// 10 rows into 8 slots: seqs 0 and 1 are overwritten.
	h := make([]float32, 20)
	tensors := append(steps(seqToks(0, 10), make([]bool, 10), nil), client.NewTensor("h", []int{10, 2}, h))
	if _, err := c.Extend(ctx, "r", "s", tensors); err != nil {
		t.Fatal(err)
	}
	updated, stale, err := c.UpdateFields(ctx, "r", []int64{1, 4, 9}, client.NewTensor("h", []int{3, 2}, []float32{1, 1, 4, 4, 9, 9}))
	if err != nil || updated != 2 || stale != 1 {
		t.Fatalf("update: updated=%d stale=%d err=%v, want 2 and 1", updated, stale, err)
	}
	rows, err := c.Rows(ctx, "r", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	seqs, _ := client.Column[int64](rows, "seq")
	hs, _ := client.Column[float32](rows, "h")
	for i, s := range seqs {
		want := float32(0)
		if s == 4 || s == 9 {
			want = float32(s)
		}
		if hs[2*i] != want || hs[2*i+1] != want {
			t.Fatalf("seq %d: h %v, want %v", s, hs[2*i:2*i+2], want)
		}
	}
	for _, bad := range []struct {
		tensor codec.Tensor
		want   string
	}{
		{client.NewTensor("action", []int{1}, []int64{7}), `field "action": not mutable`},
		{client.NewTensor("h", []int{1, 3}, []float32{1, 2, 3}), `field "h": shape [1 3], want [N [2]]`},
	} {
		_, _, err := c.UpdateFields(ctx, "r", []int64{4}, bad.tensor)
		if !errors.Is(err, client.ErrBadRequest) || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("update with %s: %v, want a 400 saying %q", bad.tensor.Name, err, bad.want)
		}
	}
}

func TestRows(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(6)); err != nil {
		t.Fatal(err)
	}
	// Trajectory A: tokens 10,11,12 (done); B: 20..24 open. 8 rows into 6
	// slots: seqs 0 and 1 are gone, and seq 2's prev link points at a dead
	// row.
	if _, err := c.Extend(ctx, "cp", "s", steps([]int64{10, 11, 12, 20, 21, 22, 23, 24}, []bool{false, false, true, false, false, false, false, false}, nil)); err != nil {
		t.Fatal(err)
	}
	b, err := c.Rows(ctx, "cp", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if b.Rows() != 6 {
		t.Fatalf("rows: %d, want the 6 live ones", b.Rows())
	}
	rows := rowsOf(t, b)
	prev, _ := client.Column[int64](b, "prev_seq")
	next, _ := client.Column[int64](b, "next_seq")
	done, _ := client.Column[bool](b, "next.done")
	wantSeq := []int64{2, 3, 4, 5, 6, 7}
	wantPrev := []int64{1, -1, 3, 4, 5, 6}
	wantNext := []int64{-1, 4, 5, 6, 7, -1}
	wantAct := []int64{12, 20, 21, 22, 23, 24}
	for i, r := range rows {
		if r.seq != wantSeq[i] || prev[i] != wantPrev[i] || next[i] != wantNext[i] || r.action != wantAct[i] {
			t.Errorf("row %d: seq %d prev %d next %d action %d, want %d %d %d %d",
				i, r.seq, prev[i], next[i], r.action, wantSeq[i], wantPrev[i], wantNext[i], wantAct[i])
		}
		if err := checkRow(r); err != nil {
			t.Error(err)
		}
		if done[i] != (i == 0) {
			t.Errorf("row %d: done %v", i, done[i])
		}
	}
	if rows[0].step != 2 || rows[1].step != 0 || rows[5].step != 4 {
		t.Errorf("steps: %+v", rows)
	}
	// Paging.
	b, err = c.Rows(ctx, "cp", 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := client.Column[int64](b, "seq"); !slices.Equal(s, []int64{5, 6}) {
		t.Fatalf("rows from 5 count 2: %v", s)
	}
	// Past the end: an empty answer, well formed.
	b, err = c.Rows(ctx, "cp", 100, 0)
	if err != nil || b.Rows() != 0 {
		t.Fatalf("rows past the end: %d %v", b.Rows(), err)
	}
	if _, err := c.Rows(ctx, "nope", 0, 1); !client.IsNotFound(err) {
		t.Fatalf("rows of a missing buffer: %v", err)
	}
}

func TestCloseStream(t *testing.T) {
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if _, _, err := c.CreateBuffer(ctx, "cp", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	// A stream name that needs escaping in the path.
	const stream = "actor/1 ü?#%"
	if _, err := c.Extend(ctx, "cp", stream, steps([]int64{1, 2, 5}, []bool{false, false, false}, []int64{0, 0, 1})); err != nil {
		t.Fatal(err)
	}
	if info, _ := c.Info(ctx, "cp"); info.OpenTrajectories != 2 || info.Streams != 1 {
		t.Fatalf("before close: %+v", info)
	}
	n, err := c.CloseStream(ctx, "cp", stream)
	if err != nil || n != 2 {
		t.Fatalf("close: %d %v, want 2", n, err)
	}
	if info, _ := c.Info(ctx, "cp"); info.OpenTrajectories != 0 || info.Streams != 0 {
		t.Fatalf("after close: %+v", info)
	}
	if n, err := c.CloseStream(ctx, "cp", stream); err != nil || n != 0 {
		t.Fatalf("second close: %d %v, want 0", n, err)
	}
	// The next extend on the stream starts a new trajectory.
	if _, err := c.Extend(ctx, "cp", stream, steps([]int64{3}, []bool{false}, nil)); err != nil {
		t.Fatal(err)
	}
	b, err := c.Rows(ctx, "cp", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	rows := rowsOf(t, b)
	if len(rows) != 4 || rows[3].step != 0 || rows[3].traj == rows[0].traj || rows[3].traj == rows[2].traj {
		t.Fatalf("rows after close: %+v", rows)
	}
	// A stream that ended with a done row has nothing open.
	if _, err := c.Extend(ctx, "cp", "done", steps([]int64{7}, []bool{true}, nil)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.CloseStream(ctx, "cp", "done"); err != nil || n != 0 {
		t.Fatalf("close of a finished stream: %d %v", n, err)
	}
	if _, err := c.CloseStream(ctx, "nope", "s"); !client.IsNotFound(err) {
		t.Fatalf("close on a missing buffer: %v", err)
	}
	if _, err := c.CloseStream(ctx, "cp", ".."); err == nil || errors.As(err, new(*client.APIError)) {
		t.Fatalf("stream \"..\" must be refused by the client: %v", err)
	}
}

// weights records SetWeights calls.
type weights struct {
	mu      sync.Mutex
	vals    map[string][]float32
	version int64
}

// CollectorInfo reports how many updates the stand-in took.
func (w *weights) CollectorInfo(collector string) (server.CollectorInfo, error) {
	if collector != "demo" {
		return server.CollectorInfo{}, fmt.Errorf("collector %q: %w", collector, storage.ErrNotFound)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return server.CollectorInfo{Name: "demo", Env: "cartpole", Envs: 1, Buffer: "demo", Policy: "linear", WeightsVersion: w.version}, nil
}

func (w *weights) SetWeights(collector string, vals map[string][]float32, shapes map[string][]int) error {
	if collector != "demo" {
		return fmt.Errorf("collector %q: %w", collector, storage.ErrNotFound)
	}
	if !slices.Equal(shapes["w"], []int{4, 2}) || !slices.Equal(shapes["b"], []int{2}) || len(vals) != 2 {
		return fmt.Errorf("want w [4 2] and b [2]: %w", storage.ErrInvalidBatch)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.vals = vals
	w.version++
	return nil
}

func TestSetWeights(t *testing.T) {
	rec := &weights{}
	ts, _ := newServer(t, &server.Options{Weights: rec})
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	w := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	b := []float32{-1, 0.5}
	if err := c.SetWeights(ctx, "demo", []codec.Tensor{client.NewTensor("w", []int{4, 2}, w), client.NewTensor("b", nil, b)}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	if !slices.Equal(rec.vals["w"], w) || !slices.Equal(rec.vals["b"], b) {
		t.Errorf("server got %v", rec.vals)
	}
	rec.mu.Unlock()
	if info, err := c.Collector(ctx, "demo"); err != nil || info.WeightsVersion != 1 || info.Policy != "linear" {
		t.Fatalf("collector: %+v %v", info, err)
	}
	if _, err := c.Collector(ctx, "other"); !client.IsNotFound(err) {
		t.Fatalf("unknown collector: %v", err)
	}
	err := c.SetWeights(ctx, "demo", []codec.Tensor{client.NewTensor("w", []int{8}, w), client.NewTensor("b", nil, b)})
	if !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("wrong shape: %v", err)
	}
	if err := c.SetWeights(ctx, "demo", []codec.Tensor{client.NewTensor("w", []int{4, 2}, make([]int64, 8))}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("wrong dtype: %v", err)
	}
	if err := c.SetWeights(ctx, "other", []codec.Tensor{client.NewTensor("w", []int{4, 2}, w), client.NewTensor("b", nil, b)}); !client.IsNotFound(err) {
		t.Fatalf("unknown collector: %v", err)
	}
	// A server that runs no collector.
	ts2, _ := newServer(t, nil)
	if err := newClient(t, ts2.URL, nil).SetWeights(ctx, "demo", nil); !client.IsNotFound(err) {
		t.Fatalf("no collectors: %v", err)
	}
}
