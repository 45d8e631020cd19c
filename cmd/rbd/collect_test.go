package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

// rbd collect --url writes through a server (here in-process, with a
// token): the buffer is created with a PUT, the rows arrive as extends.
func TestCollectURL(t *testing.T) {
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv := httptest.NewServer(server.New(db, &server.Options{Token: "s3cret"}).Handler())
	defer srv.Close()
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	collect := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"collect", "--url", srv.URL}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := collect("--token", "s3cret", "--env", "catch", "--num-envs", "2", "--frames", "120",
		"--frames-per-batch", "40", "--compact", "--capacity", "500", "--policy", "linear-q", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var sum collectSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Frames != 120 || sum.Buffer != "catch" || sum.Trajectories != 6 {
		t.Fatalf("summary %+v", sum)
	}
	buf, err := db.Buffer("catch")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := buf.Info()
	spec := buf.Spec()
	if info.WriteCount != 120 || info.OpenTrajectories != 0 || !spec.CompactObs || spec.Capacity != 500 {
		t.Fatalf("info %+v", info)
	}
	if f, _ := spec.Field("observation"); len(f.Shape) != 3 || f.Shape[0] != 4 || f.Shape[1] != 84 {
		t.Fatalf("observation field %+v", f)
	}

	// A second run appends to the same buffer (identical spec).
	if code, _, errs := collect("--token", "s3cret", "--env", "catch", "--num-envs", "2", "--frames", "40",
		"--frames-per-batch", "40", "--compact", "--capacity", "500"); code != 0 {
		t.Fatalf("second run: exit %d: %s", code, errs)
	}
	if wc := buf.WriteCount(); wc != 160 {
		t.Fatalf("write count %d", wc)
	}
	// Another spec under that name is a conflict; a wrong token a 401.
	if code, _, errs := collect("--token", "s3cret", "--env", "catch", "--frames", "40", "--capacity", "500"); code == 0 || !strings.Contains(errs, "different spec") {
		t.Fatalf("conflict: exit %d: %s", code, errs)
	}
	if code, _, errs := collect("--token", "nope", "--env", "cartpole", "--frames", "40"); code == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("bad token: exit %d: %s", code, errs)
	}
}

// Interrupting collect (the context ends, as on Ctrl-C) stops it after the
// batch under way, with exit code 0 and the summary saying so.
func TestCollectInterrupted(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	// The progress log's first line cancels.
	errw := &cancelOnWrite{cancel: cancel}
	code := run(ctx, []string{"collect", "--env", "pendulum", "--frames", "-1", "--log-every", "1ns", "--data", dir, "--compact"}, &out, errw)
	if code != 0 || !strings.Contains(out.String(), "(interrupted)") {
		t.Fatalf("exit %d: %s %s", code, out.String(), errw.buf.String())
	}
	db, err := rbd.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	buf, err := db.Buffer("pendulum")
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := buf.Info(); info.WriteCount == 0 || info.WriteCount%256 != 0 {
		t.Fatalf("write count %d: want whole batches", info.WriteCount)
	}
}

type cancelOnWrite struct {
	cancel context.CancelFunc
	buf    bytes.Buffer
}

func (c *cancelOnWrite) Write(p []byte) (int, error) {
	c.cancel()
	return c.buf.Write(p)
}

// rbd collect --policy gru-q --weights FILE on cartpole-masked: the buffer
// gets recurrent_state [H] (mutable), the policy starts from the file's
// weights (every stored state replays bit for bit with them), and bad
// weights are refused before anything is written.
func TestCollectRecurrentWithWeights(t *testing.T) {
	const H = 4
	vals, shapes := collector.NewGRUQ(2, H, 2, 0, 77).Weights()
	// The replay runs the weights as the file holds them (float32).
	src := collector.NewGRUQ(2, H, 2, 0, 0)
	if err := src.SetWeights(vals, shapes); err != nil {
		t.Fatal(err)
	}
	var tensors []codec.Tensor
	for name, v := range vals {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		tensors = append(tensors, codec.Tensor{Name: name, DType: "float32", Shape: shapes[name], Data: b})
	}
	raw, err := codec.EncodeSafetensors(tensors, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wfile := filepath.Join(dir, "gru.safetensors")
	if err := os.WriteFile(wfile, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "d")
	collect := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"collect", "--env", "cartpole-masked", "--data", data}, args...), &out, &errb)
		return code, errb.String()
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--weights", wfile}, "the random policy has no weights"},
		{[]string{"--policy", "gru-q", "--hidden", "5", "--weights", wfile}, "w_hh: shape [4 12], want [5 15]"},
		{[]string{"--policy", "gru-q", "--weights", filepath.Join(dir, "nope")}, "no such file"},
		{[]string{"--policy", "gru-q", "--weights", data + "-not-there"}, "--weights"},
	} {
		if code, errs := collect(bad.args...); code == 0 || !strings.Contains(errs, bad.want) {
			t.Fatalf("%v: exit %d, stderr %q, want it to say %q", bad.args, code, errs, bad.want)
		}
	}
	if _, err := os.Stat(data); err == nil {
		t.Fatal("a refused run created the data dir")
	}
	if code, errs := collect("--policy", "gru-q", "--hidden", "4", "--epsilon", "0.2", "--weights", wfile,
		"--num-envs", "3", "--frames", "300", "--frames-per-batch", "60", "--compact", "--seed", "2"); code != 0 {
		t.Fatalf("collect: %s", errs)
	}
	db, err := rbd.Open(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	buf, err := db.Buffer("cartpole-masked")
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := buf.Spec().Field("recurrent_state"); !ok || !f.Mutable || f.Shape[0] != H {
		t.Fatalf("recurrent_state field %+v (present %v)", f, ok)
	}
	seqs := buf.LiveSeqs(0, 300)
	oc, _ := buf.Column("observation")
	hc, _ := buf.Column("recurrent_state")
	dst := [][]byte{make([]byte, len(seqs)*8), make([]byte, len(seqs)*4*H)}
	meta := make([]storage.RowMeta, len(seqs))
	if _, err := buf.Gather(seqs, []storage.Column{oc, hc}, dst, meta); err != nil {
		t.Fatal(err)
	}
	f32 := func(b []byte, n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out
	}
	carried := 0
	for i, m := range meta {
		if m.Step == 0 {
			continue
		}
		j := int(m.PrevSeq) // every row is live: seq == index
		next := make([]float32, H)
		src.Step(f32(dst[0][8*j:], 2), f32(dst[1][4*H*j:], H), 1, next)
		if got := f32(dst[1][4*H*i:], H); !slices.Equal(got, next) {
			t.Fatalf("seq %d: stored state %v, the file's weights give %v", m.Seq, got, next)
		}
		carried++
	}
	if carried < 100 {
		t.Fatalf("only %d carried states checked", carried)
	}
}
