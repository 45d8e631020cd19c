package collector_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

// The HTTP writer stores exactly what the in-process writer stores: same
// seed, same rows, byte for byte, with the same trajectories and links.
func TestHTTPWriterMatchesInProcess(t *testing.T) {
	for _, tc := range []struct {
		env     string
		opts    *envs.Options
		compact bool
	}{{"cartpole", nil, false}, {"cartpole", nil, true}, {"pendulum", nil, true}, {"catch", &envs.Options{FrameStack: 4}, true}} {
		db := openDB(t)
		c, _ := httpServer(t, db)
		spec := collector.BufferSpec(newEnv(t, tc.env, 1, tc.opts).Spec(), collector.SpecOptions{Capacity: 4096, Storage: storage.KindMemory, CompactObs: tc.compact})
		raw, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, created, err := c.CreateBufferJSON(context.Background(), "remote", raw); err != nil || !created {
			t.Fatalf("create over HTTP: %v %v", created, err)
		}
		local, _, err := db.CreateBuffer("local", spec)
		if err != nil {
			t.Fatal(err)
		}
		remote, err := db.Buffer("remote")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []collector.Writer{collector.NewHTTPWriter(c, "remote", spec), collector.BufferWriter{Buffer: local.Buffer}} {
			// A policy version that moves every 4 ticks, the same in both
			// runs: the rows' policy_version must arrive either way.
			ticks := int64(0)
			version := func() int64 { ticks++; return ticks / 4 }
			if _, err := collector.Run(context.Background(), collector.Config{
				Env: newEnv(t, tc.env, 3, tc.opts), Writer: w, Stream: "x", Seed: 4,
				FramesPerBatch: 30, TotalFrames: 300, CompactObs: tc.compact, MaxFramesPerTraj: 25,
				PolicyVersion: version,
			}); err != nil {
				t.Fatalf("%s: %v", tc.env, err)
			}
		}
		a, b := readRows(t, remote), readRows(t, local)
		if len(a.seqs) != 300 || !slices.Equal(a.seqs, b.seqs) {
			t.Fatalf("%s: %d and %d rows", tc.env, len(a.seqs), len(b.seqs))
		}
		for k, v := range b.cols {
			if !bytes.Equal(a.cols[k], v) {
				t.Fatalf("%s: column %s differs", tc.env, k)
			}
		}
		// 300 rows of 3 envs are 100 ticks: versions 0 (ticks 1-3) to 25.
		if a.meta[0].PolicyVersion != 0 || a.meta[299].PolicyVersion != 25 || a.meta[15].PolicyVersion != 1 {
			t.Fatalf("%s: policy versions %d, %d, %d; want 0, 1, 25", tc.env, a.meta[0].PolicyVersion, a.meta[15].PolicyVersion, a.meta[299].PolicyVersion)
		}
		base := a.meta[0].TrajID - b.meta[0].TrajID
		for i := range a.meta {
			ma, mb := a.meta[i], b.meta[i]
			ma.TrajID -= base
			if ma != mb {
				t.Fatalf("%s row %d: meta %+v over HTTP, %+v in process", tc.env, i, a.meta[i], mb)
			}
		}
	}
}

// Tensors names and shapes a batch by the spec: [N, ...] per field,
// env int64 [N], final observations [D, ...].
func TestTensorsFromBatch(t *testing.T) {
	spec := collector.BufferSpec(envs.PendulumSpec(), collector.SpecOptions{Capacity: 10, CompactObs: true})
	b := &storage.Batch{Rows: 2, Env: []int64{0, 7}, Fields: map[string][]byte{
		"observation": make([]byte, 24), "action": make([]byte, 8), "next.reward": make([]byte, 8),
		"next.done": {0, 1}, "next.terminated": {0, 0}, "next.truncated": {0, 1}, "next.observation": make([]byte, 12),
	}}
	ts, err := collector.Tensors(spec, b)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, x := range ts {
		sh, _ := json.Marshal(x.Shape)
		got[x.Name] = x.DType + string(sh)
	}
	want := map[string]string{"observation": "float32[2,3]", "action": "float32[2,1]", "next.reward": "float32[2]",
		"next.done": "bool[2]", "next.terminated": "bool[2]", "next.truncated": "bool[2]", "next.observation": "float32[1,3]", "env": "int64[2]"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s, want %s", k, got[k], v)
		}
	}
	for _, x := range ts {
		if x.Name == "env" && binary.LittleEndian.Uint64(x.Data[8:]) != 7 {
			t.Errorf("env data %v", x.Data)
		}
	}
	b.Fields["bogus"] = nil
	if _, err := collector.Tensors(spec, b); err == nil {
		t.Error("a field outside the spec was accepted")
	}
	delete(b.Fields, "bogus")
	delete(b.Fields, "action")
	if _, err := collector.Tensors(spec, b); err == nil {
		t.Error("a missing field was accepted")
	}
}

// Over HTTP, a server that goes away or a buffer deleted mid-run stops
// the run with the error, promptly.
func TestHTTPWriterFailures(t *testing.T) {
	for _, how := range []string{"server closed", "buffer deleted"} {
		db := openDB(t)
		c, srv := httpServer(t, db)
		env := newEnv(t, "cartpole", 2, nil)
		spec := collector.BufferSpec(env.Spec(), collector.SpecOptions{Capacity: 1000, Storage: storage.KindMemory})
		if _, _, err := db.CreateBuffer("b", spec); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := collector.Run(context.Background(), collector.Config{
			Env: env, Writer: collector.NewHTTPWriter(c, "b", spec), FramesPerBatch: 20, TotalFrames: -1,
			AfterBatch: func(b *collector.BatchInfo) error {
				if b.Stats.Batches == 3 {
					if how == "server closed" {
						srv.CloseClientConnections()
						srv.Close()
					} else if err := c.DeleteBuffer(context.Background(), "b"); err != nil {
						t.Error(err)
					}
				}
				return nil
			},
		})
		if err == nil {
			t.Fatalf("%s: no error", how)
		}
		if how == "buffer deleted" && !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("%s: err = %v, want not found", how, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("%s: took %v", how, d)
		}
		t.Logf("%s: %v", how, err)
	}
}
