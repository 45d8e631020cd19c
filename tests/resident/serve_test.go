package resident

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/testbin"
)

// TestServeResidentBytesPerCartPoleRow is TestResidentBytesPerCartPoleRow
// for the real server: a `rbd serve` process gets a compact CartPole memory
// buffer of 10^6 rows, filled twice over through the Go client in extends
// of 2,048 rows (256 ticks of 8 envs), and the growth of its RssAnon is
// read once the server, quiet, has returned its freed heap to the OS (it
// logs that; the test waits for the line, not for a time).
//
// Two readings: from the idle server before the buffer was created (what
// a user sees), and from the server after the first extend, which leaves
// out one-time costs of a first request (a connection, log lines, the
// first heap arenas: 1.2 MB here), so that it is what each row costs.
// Per row the server then holds what the in-process program does
// (TestResidentBytesPerCartPoleRow). The second reading's bounds are
// those of that test (strided's is the target, 47 B; the default
// row layout's its floor, 70 B); the first's are a byte more.
func TestServeResidentBytesPerCartPoleRow(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills 10^6 rows in a server twice over")
	}
	bin, err := testbin.BuildRbd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rowMeta        string
		maxBytesPerRow float64 // after the first extend; from idle: 1 more
	}{
		{"row", 70},
		{"runs", 57},
		{"strided", 47},
	} {
		t.Run(tc.rowMeta, func(t *testing.T) {
			const capacity = 1_000_000
			srv, c, anonIdle := cartPoleServer(t, bin, tc.rowMeta, capacity)
			ctx := context.Background()
			w := newCartPole()
			const ticks = 256
			var anonFirst int64
			for tick := 0; tick < 2*capacity/nEnvs; tick += ticks {
				if _, err := c.Extend(ctx, "cartpole", "actors", w.tensors(tick, ticks)); err != nil {
					t.Fatal(err)
				}
				if tick == 0 {
					anonFirst = rssAnon(t, srv)
				}
			}
			info, err := c.Info(ctx, "cartpole")
			if err != nil {
				t.Fatal(err)
			}
			if info.Size != capacity {
				t.Fatalf("the buffer holds %d rows, want %d", info.Size, capacity)
			}
			anon := quietRssAnon(t, srv)
			fromIdle := float64(anon-anonIdle) / capacity
			perRow := float64(anon-anonFirst) / (capacity - ticks*nEnvs)
			t.Logf("RssAnon: +%.1f B a row from the idle server, +%.1f B from after the first extend", fromIdle, perRow)
			if n := idleReleases(t, c); n < 1 {
				t.Errorf("rbd_memory_idle_releases_total is %d after a release was logged", n)
			}
			if perRow > tc.maxBytesPerRow || fromIdle > tc.maxBytesPerRow+1 {
				t.Errorf("rbd serve holding a full 10^6-row compact CartPole buffer (row_meta %s) grew by %.1f B a row after its first extend (bound %.0f), %.1f from idle (bound %.0f)",
					tc.rowMeta, perRow, tc.maxBytesPerRow, fromIdle, tc.maxBytesPerRow+1)
			}
		})
	}
}

// releaseLine is the message of the server's idle release (server/gctune.go).
const releaseLine = `"msg":"quiet: returned freed heap to the OS"`

// cartPoleServer starts rbd serve (stopped when the test ends) with a
// compact CartPole memory buffer "cartpole" of capacity rows and the
// row_meta given, and returns a client and the server's RssAnon from
// before the buffer was created.
func cartPoleServer(t *testing.T, bin, rowMeta string, capacity int) (*testbin.Server, *client.Client, int64) {
	t.Helper()
	srv, err := testbin.StartServer(bin, t.TempDir(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(syscall.SIGTERM, 10*time.Second) })
	c, err := client.New(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	anonIdle := rssAnon(t, srv)
	spec := fmt.Sprintf(`{"capacity": %d, "storage": "memory", "compact_obs": true, "row_meta": %q, "fields": {
		"observation": {"dtype": "float32", "shape": [4]},
		"action": {"dtype": "int64", "shape": []},
		"next.reward": {"dtype": "float32", "shape": []},
		"next.done": {"dtype": "bool", "shape": []},
		"next.terminated": {"dtype": "bool", "shape": []},
		"next.truncated": {"dtype": "bool", "shape": []}}}`, capacity, rowMeta)
	if _, _, err := c.CreateBufferJSON(context.Background(), "cartpole", []byte(spec)); err != nil {
		t.Fatal(err)
	}
	return srv, c, anonIdle
}

// quietRssAnon waits until the server, quiet after a fill, logs that it
// returned its freed heap to the OS, and returns its RssAnon then. It
// waits for the log line, not on /metrics: a scrape's garbage would be
// part of the reading.
func quietRssAnon(t *testing.T, srv *testbin.Server) int64 {
	t.Helper()
	releases := strings.Count(srv.Stderr.String(), releaseLine)
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(srv.Stderr.String(), releaseLine) == releases {
		if time.Now().After(deadline) {
			t.Fatalf("the server, quiet for 30 s after the fill, did not return its freed heap (no new %q line):\n%s", releaseLine, srv.Stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return rssAnon(t, srv)
}

func rssAnon(t *testing.T, srv *testbin.Server) int64 {
	t.Helper()
	anon, _, err := srv.Memory()
	if err != nil {
		t.Fatal(err)
	}
	return anon
}

// idleReleases reads rbd_memory_idle_releases_total from /metrics.
func idleReleases(t *testing.T, c *client.Client) int64 {
	t.Helper()
	m, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, ok := testbin.MetricValue(m, "rbd_memory_idle_releases_total")
	if !ok {
		t.Fatalf("/metrics has no rbd_memory_idle_releases_total:\n%s", m)
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("rbd_memory_idle_releases_total %q: %v", v, err)
	}
	return int64(n)
}

// cartPole makes bench/compare's CartPole rows (inproc's workload): 8 envs
// stepped together, 200-step episodes with staggered starts, observations
// from a pool of random frames, next observation = the env's observation a
// tick later (sent for done rows only: compact_obs).
type cartPole struct{ pool [][]byte }

const nEnvs = 8

func newCartPole() *cartPole {
	w := &cartPole{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4096 {
		f := make([]byte, 16)
		for i := 0; i < len(f); i += 4 {
			binary.LittleEndian.PutUint32(f[i:], math.Float32bits(float32(rng.NormFloat64())))
		}
		w.pool = append(w.pool, f)
	}
	return w
}

func (w *cartPole) obs(env, tick int) []byte { return w.pool[(env*7919+tick)%len(w.pool)] }

func (w *cartPole) done(env, tick int) bool { return (tick+env*200/nEnvs)%200 == 199 }

// tensors returns ticks [tick0, tick0+ticks) of every env, tick-major.
func (w *cartPole) tensors(tick0, ticks int) []codec.Tensor {
	n := ticks * nEnvs
	var obs, final, act, rew, done, term, trunc, env []byte
	finals := 0
	for t := tick0; t < tick0+ticks; t++ {
		for e := range nEnvs {
			obs = append(obs, w.obs(e, t)...)
			act = binary.LittleEndian.AppendUint64(act, uint64((e+t)%2))
			rew = binary.LittleEndian.AppendUint32(rew, math.Float32bits(1))
			var f byte
			if w.done(e, t) {
				f = 1
				final = append(final, w.obs(e, t+1)...)
				finals++
			}
			done, term, trunc = append(done, f), append(term, f), append(trunc, 0)
			env = binary.LittleEndian.AppendUint64(env, uint64(e))
		}
	}
	ts := []codec.Tensor{
		{Name: "observation", DType: "float32", Shape: []int{n, 4}, Data: obs},
		{Name: "action", DType: "int64", Shape: []int{n}, Data: act},
		{Name: "next.reward", DType: "float32", Shape: []int{n}, Data: rew},
		{Name: "next.done", DType: "bool", Shape: []int{n}, Data: done},
		{Name: "next.terminated", DType: "bool", Shape: []int{n}, Data: term},
		{Name: "next.truncated", DType: "bool", Shape: []int{n}, Data: trunc},
		{Name: "env", DType: "int64", Shape: []int{n}, Data: env},
	}
	if finals > 0 {
		ts = append(ts, codec.Tensor{Name: "next.observation", DType: "float32", Shape: []int{finals, 4}, Data: final})
	}
	return ts
}
