package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/server"
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
