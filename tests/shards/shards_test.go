// Package shards runs rbd shards as separate hosts: each `rbd serve` in a
// network namespace of its own with its own address on a bridge the test
// makes, actors and a learner reaching them through client.Sharded from the
// test's namespace. One shard is killed, one is cut off by a firewall
// rule, and both come back.
//
//	go test ./tests/shards -v
//
// It needs root, iproute2 and iptables (.ci/run installs them); elsewhere
// it skips and says why. Traffic goes only to the addresses it creates.
package shards

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/benchdata"
	"github.com/rbdb/rbd/internal/testbin"
)

var rbdBin string

func TestMain(m *testing.M) { testbin.RunWithRbd(m, "RBD_SHARDS_BIN", &rbdBin) }

const token = "shards-test-token"

// lab is a bridge in the test's namespace and one namespace per host,
// each joined to the bridge by a veth pair.
type lab struct {
	t      *testing.T
	tag    string // unique per test process: interface and namespace names
	subnet string // "10.213.N"
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newLab(t *testing.T, hosts int) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (apt-get install -y iproute2 iptables): %v", tool, err)
		}
	}
	pid := os.Getpid()
	l := &lab{t: t, tag: strconv.Itoa(pid % 100000), subnet: fmt.Sprintf("10.213.%d", pid%250+1)}
	br := "rbd" + l.tag + "b"
	if err := sh("ip", "link", "add", br, "type", "bridge"); err != nil {
		t.Skipf("cannot create a bridge here: %v", err)
	}
	t.Cleanup(func() { _ = sh("ip", "link", "del", br) })
	steps := [][]string{
		{"ip", "addr", "add", l.subnet + ".1/24", "dev", br},
		{"ip", "link", "set", br, "up"},
	}
	for h := range hosts {
		ns, host, peer := l.ns(h), fmt.Sprintf("rbd%sh%d", l.tag, h), fmt.Sprintf("rbd%sp%d", l.tag, h)
		if err := sh("ip", "netns", "add", ns); err != nil {
			t.Skipf("cannot create a network namespace here: %v", err)
		}
		t.Cleanup(func() { _ = sh("ip", "netns", "del", ns) })
		steps = append(steps,
			[]string{"ip", "link", "add", host, "type", "veth", "peer", "name", peer},
			[]string{"ip", "link", "set", peer, "netns", ns},
			[]string{"ip", "link", "set", host, "master", br},
			[]string{"ip", "link", "set", host, "up"},
			[]string{"ip", "netns", "exec", ns, "ip", "addr", "add", l.addr(h) + "/24", "dev", peer},
			[]string{"ip", "netns", "exec", ns, "ip", "link", "set", peer, "up"},
			[]string{"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"},
		)
	}
	// A sandbox that lets a namespace be made may still refuse a veth, an
	// address or netfilter inside it: that is this machine's limit, not a
	// failure of rbd, so the test says so and skips.
	for _, s := range steps {
		if err := sh(s...); err != nil {
			t.Skipf("cannot build the test network here: %v", err)
		}
	}
	if err := sh("ip", "netns", "exec", l.ns(0), "iptables", "-L", "INPUT", "-n"); err != nil {
		t.Skipf("iptables does not work in a network namespace here: %v", err)
	}
	return l
}

func (l *lab) ns(h int) string   { return fmt.Sprintf("rbd%sn%d", l.tag, h) }
func (l *lab) addr(h int) string { return fmt.Sprintf("%s.%d", l.subnet, 11+h) }
func (l *lab) url(h int) string  { return fmt.Sprintf("http://%s:7450", l.addr(h)) }

// shard is `rbd serve` running in host h's namespace.
type shard struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// serve starts rbd on host h with data dir dir and waits until it answers
// health from the test's namespace.
func (l *lab) serve(h int, dir string) *shard {
	l.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", l.ns(h), rbdBin, "serve", "--addr", l.addr(h)+":7450",
		"--data", dir, "--token", token)
	logf, err := os.Create(filepath.Join(dir + ".log"))
	if err != nil {
		l.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	s := &shard{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
	l.t.Cleanup(func() { s.kill() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: time.Second}).Get(l.url(h) + "/v1/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(dir + ".log")
			l.t.Fatalf("shard %d exited before serving:\n%s", h, b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("shard %d did not answer health at %s within 20 s: %v", h, l.url(h), err)
		}
	}
}

// kill ends the shard with SIGKILL (ip netns exec execs rbd: the pid is
// rbd's).
func (s *shard) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// cut drops every packet to host h's port 7450 (a network partition: no
// refusal, no answer); restore removes the rule.
func (l *lab) cut(h int) error {
	return sh("ip", "netns", "exec", l.ns(h), "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "7450", "-j", "DROP")
}

func (l *lab) restore(h int) error {
	return sh("ip", "netns", "exec", l.ns(h), "iptables", "-D", "INPUT", "-p", "tcp", "--dport", "7450", "-j", "DROP")
}

func spec() *client.Spec { return benchdata.CartPoleSpec(100_000) }

// rows is n steps of an episode that goes on after the batch (none is
// done: each stream's trajectory stays open, as a long episode's would).
func rows(tok int64, n int) []codec.Tensor {
	obs := make([]float32, 0, 4*n)
	act := make([]int64, n)
	rew := make([]float32, n)
	done := make([]bool, n)
	for i := range n {
		f := float32(tok + int64(i))
		obs = append(obs, f, f, f, f)
		act[i] = tok + int64(i)
	}
	return []codec.Tensor{
		client.NewTensor("observation", []int{n, 4}, obs),
		client.NewTensor("action", nil, act),
		client.NewTensor("next.reward", nil, rew),
		client.NewTensor("next.done", nil, done),
		client.NewTensor("next.terminated", nil, done),
		client.NewTensor("next.truncated", nil, make([]bool, n)),
		client.NewTensor("next.observation", []int{0, 4}, []float32{}),
	}
}

func TestShardsAcrossHosts(t *testing.T) {
	const hosts = 3
	l := newLab(t, hosts)
	dirs := make([]string, hosts)
	shards := make([]*shard, hosts)
	var urls []string
	for h := range hosts {
		dirs[h] = filepath.Join(t.TempDir(), fmt.Sprintf("shard%d", h))
		shards[h] = l.serve(h, dirs[h])
		urls = append(urls, l.url(h))
	}
	const shardTimeout = time.Second
	s, err := client.NewSharded(urls, &client.ShardedOptions{Client: &client.Options{Token: token},
		ShardTimeout: shardTimeout, StatsTTL: 100 * time.Millisecond, DownFor: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Host h's shard number (shards are numbered by URL).
	num := func(h int) int {
		for i, u := range s.Shards() {
			if u == l.url(h) {
				return i
			}
		}
		t.Fatalf("host %d is not a shard", h)
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := s.CreateBuffer(ctx, "b", spec()); err != nil {
		t.Fatal(err)
	}
	// Two actor streams per shard, by hash order.
	streams := map[int][]string{}
	for k := 0; len(streams[0]) < 2 || len(streams[1]) < 2 || len(streams[2]) < 2; k++ {
		st := fmt.Sprintf("actor-%d", k)
		first := s.HashOrder(st)[0]
		if len(streams[first]) < 2 {
			streams[first] = append(streams[first], st)
		}
	}
	tok := int64(0)
	write := func(stream string) client.ShardedExtendResult {
		t.Helper()
		res, err := s.Extend(ctx, "b", stream, rows(tok, 32))
		if err != nil {
			t.Fatalf("extend %s: %v", stream, err)
		}
		tok += 32
		return res
	}
	for shard, sts := range streams {
		for _, st := range sts {
			for range 5 {
				if res := write(st); res.Shard != shard {
					t.Fatalf("stream %s wrote to shard %d, its first is %d", st, res.Shard, shard)
				}
			}
		}
	}
	sample := func(wantMissing string) time.Duration {
		t.Helper()
		start := time.Now()
		b, err := s.Sample(ctx, "b", &client.SampleRequest{Sampler: "prioritized", BatchSize: 256})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("sample: %v", err)
		}
		if b.Rows() != 256 || b.Metadata["shards_missing"] != wantMissing {
			t.Fatalf("sample: %d rows, metadata %v; want 256 rows, shards_missing %q", b.Rows(), b.Metadata, wantMissing)
		}
		return took
	}
	time.Sleep(150 * time.Millisecond) // past StatsTTL: the figures include every row
	t.Logf("all shards: a sample took %v", sample(""))

	// Kill host 0's shard: draws go on without it, its streams move.
	killed := num(0)
	shards[0].kill()
	time.Sleep(150 * time.Millisecond)
	t.Logf("shard %d killed: a sample took %v", killed, sample(strconv.Itoa(killed)))
	for _, st := range streams[killed] {
		if res := write(st); res.Shard == killed || res.Shard != s.HashOrder(st)[1] {
			t.Fatalf("stream %s of the killed shard wrote to %d, want its second choice %d", st, res.Shard, s.HashOrder(st)[1])
		}
	}

	// Cut host 1 off: packets dropped, no refusal. Draws leave it out
	// within the shard timeout, writes pass it over.
	cut := num(1)
	if err := l.cut(1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	missing := []string{strconv.Itoa(killed), strconv.Itoa(cut)}
	if cut < killed {
		missing[0], missing[1] = missing[1], missing[0]
	}
	took := sample(strings.Join(missing, ","))
	t.Logf("shard %d cut off: a sample took %v (shard timeout %v)", cut, took, shardTimeout)
	if took > 3*shardTimeout+5*time.Second {
		t.Fatalf("a sample took %v with a shard cut off; the shard timeout is %v", took, shardTimeout)
	}
	for _, st := range streams[cut] {
		res := write(st)
		if res.Shard == cut || res.Shard == killed {
			t.Fatalf("stream %s wrote to shard %d, which is cut off or dead", st, res.Shard)
		}
	}

	// Both come back: the rule goes, the killed shard restarts on its data
	// dir (its rows recovered). After the figures' TTL both take part in
	// draws again, and after DownFor their streams write to them again.
	if err := l.restore(1); err != nil {
		t.Fatal(err)
	}
	shards[0] = l.serve(0, dirs[0])
	info, err := s.Shard(killed).Info(ctx, "b")
	if err != nil || info.Size == 0 {
		t.Fatalf("the restarted shard: %+v %v, want its rows back", info.Size, err)
	}
	time.Sleep(600 * time.Millisecond) // past DownFor and StatsTTL
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := s.Sample(ctx, "b", &client.SampleRequest{Sampler: "prioritized", BatchSize: 256})
		if err == nil && b.Metadata["shards_missing"] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shards did not rejoin draws: %v %v", err, b.Metadata)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Each stream is back on its shard, and starts a new trajectory
	// there: the one it left open when the shard went away must not go on
	// across the rows it wrote elsewhere meanwhile.
	for _, h := range []int{0, 1} {
		for _, st := range streams[num(h)] {
			res := write(st)
			if res.Shard != num(h) {
				t.Fatalf("stream %s wrote to shard %d after its shard %d came back", st, res.Shard, num(h))
			}
			b, err := s.Shard(res.Shard).Rows(ctx, "b", res.FirstSeq, 1)
			if err != nil {
				t.Fatal(err)
			}
			steps, _ := b.Tensor("step")
			if step := int64(binary.LittleEndian.Uint64(steps.Data)); step != 0 {
				t.Fatalf("stream %s back on shard %d continued its old trajectory at step %d, want a new one", st, res.Shard, step)
			}
		}
	}
	var refused *client.APIError
	if _, err := s.Extend(ctx, "b", "x", rows(0, 1)[:1]); !errors.As(err, &refused) || refused.Status != http.StatusBadRequest {
		t.Fatalf("a bad extend: %v, want the shard's 400", err)
	}
}
