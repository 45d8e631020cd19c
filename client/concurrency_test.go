package client_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
)

// Token layout of the concurrency test: writer w's i-th row carries token
// w<<20 | i (exact in float32 up to tok+3 < 2^24), and its trajectories
// are exactly trajLen rows long, so step = i % trajLen.
const (
	trajLen   = 10
	tokWriter = 20
)

func tokOf(w, i int) int64 { return int64(w)<<tokWriter | int64(i) }

func splitTok(tok int64) (w, i int) { return int(tok >> tokWriter), int(tok & (1<<tokWriter - 1)) }

// checkStep reports a row whose step or traj metadata contradicts its
// token.
func checkStep(r rowView) error {
	if r.seq < 0 || r.traj < 0 {
		return fmt.Errorf("seq %d: negative seq or traj_id %d", r.seq, r.traj)
	}
	if _, i := splitTok(r.action); r.step != int64(i%trajLen) {
		return fmt.Errorf("seq %d: token %d (row %d of its writer) has step %d, want %d", r.seq, r.action, i, r.step, i%trajLen)
	}
	return nil
}

// TestConcurrentWritersSamplers runs 8 writers (one stream each) and 8
// samplers over HTTP against one buffer whose ring wraps many times. Every
// row's fields derive from one token, so a torn or misattributed row in an
// answer is caught; afterwards the counters must match what was written.
// It runs on a memmap buffer, a memory one (whose small rows live in its
// row group; both copy samples under the index lock) and a compressed one
// whose observations (and final observations) live in chunks (copied
// lock-free, with stamp checks).
func TestConcurrentWritersSamplers(t *testing.T) {
	compressed := cartpole(256)
	compressed.Storage = "compressed"
	compressed.Fields[0].Compress = client.Ptr(true)
	compressed.Compression = &client.Compression{ChunkLen: 4}
	memory := cartpole(256)
	memory.Storage = "memory"
	for _, tc := range []struct {
		name string
		spec *client.Spec
	}{{"memmap", cartpole(256)}, {"memory", memory}, {"compressed", compressed}} {
		t.Run(tc.name, func(t *testing.T) { concurrentWritersSamplers(t, tc.spec) })
	}
}

func concurrentWritersSamplers(t *testing.T, spec *client.Spec) {
	const (
		writers, samplers = 8, 8
		batchRows         = 16
		capacity          = 256
		maxBatches        = 400 // per writer: at most 6,400 rows each
		maxSamples        = 600 // per sampler
		runFor            = 2 * time.Second
	)
	ts, _ := newServer(t, nil)
	c := newClient(t, ts.URL, nil)
	ctx := ctxT(t)
	if spec.Capacity != capacity {
		t.Fatalf("spec capacity %d, want %d", spec.Capacity, capacity)
	}
	if _, _, err := c.CreateBuffer(ctx, "cc", spec); err != nil {
		t.Fatal(err)
	}

	var (
		stop      atomic.Bool
		failed    atomic.Bool
		errMu     sync.Mutex
		errs      []error
		extendsMu sync.Mutex
		extends   []client.ExtendResult
	)
	fail := func(err error) {
		failed.Store(true)
		errMu.Lock()
		if len(errs) < 20 {
			errs = append(errs, err)
		}
		errMu.Unlock()
	}
	written := make([]int, writers)
	started := sync.WaitGroup{}
	started.Add(writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			stream := fmt.Sprintf("writer-%d", w)
			first := true
			defer func() {
				if first {
					started.Done()
				}
			}()
			for b := 0; b < maxBatches && !failed.Load() && (first || !stop.Load()); b++ {
				toks := make([]int64, batchRows)
				done := make([]bool, batchRows)
				for k := range toks {
					i := written[w] + k
					toks[k] = tokOf(w, i)
					done[k] = i%trajLen == trajLen-1
				}
				res, err := c.Extend(ctx, "cc", stream, steps(toks, done, nil))
				if err != nil {
					fail(fmt.Errorf("writer %d: %w", w, err))
					return
				}
				if res.Rows != batchRows || res.FirstSeq < 0 || res.FirstSeq+batchRows > res.WriteCount {
					fail(fmt.Errorf("writer %d: extend answer %+v", w, res))
				}
				extendsMu.Lock()
				extends = append(extends, res)
				extendsMu.Unlock()
				written[w] += batchRows
				if first {
					first = false
					started.Done()
				}
			}
		})
	}
	// Samplers start once every writer has a trajectory long enough for
	// slices, so no request waits for data.
	started.Wait()
	var sampled, sampledRows [samplers]int
	for s := range samplers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(s), 1))
			for n := 0; n < maxSamples && !failed.Load() && !stop.Load(); n++ {
				var req client.SampleRequest
				switch n % 3 {
				case 0:
					req = client.SampleRequest{BatchSize: 32}
				case 1:
					req = client.SampleRequest{BatchSize: 32, Sampler: "prioritized"}
				case 2:
					req = client.SampleRequest{Sampler: "slice", NumSlices: 4, SliceLen: 5}
				}
				batch, err := c.Sample(ctx, "cc", &req)
				if errors.Is(err, client.ErrNotReady) || errors.Is(err, client.ErrContention) {
					continue
				}
				if err != nil {
					fail(fmt.Errorf("sampler %d: %w", s, err))
					return
				}
				rows := rowsOf(t, batch)
				if want := max(req.BatchSize, req.NumSlices*req.SliceLen); len(rows) != want {
					fail(fmt.Errorf("sampler %d: %d rows", s, len(rows)))
					return
				}
				for k, r := range rows {
					if req.Sampler == "slice" {
						// Slices: next.observation may be unknown at the
						// newest row of an open trajectory (then zero).
						if valid, _ := client.Column[bool](batch, "next.observation_valid"); valid != nil && !valid[k] {
							r.next = nil
						}
						if k%5 > 0 {
							p := rows[k-1]
							if r.traj != p.traj || r.step != p.step+1 || r.action != p.action+1 {
								fail(fmt.Errorf("sampler %d: slice row %d (seq %d traj %d step %d tok %d) does not follow seq %d traj %d step %d tok %d",
									s, k, r.seq, r.traj, r.step, r.action, p.seq, p.traj, p.step, p.action))
							}
						}
					}
					if err := checkRow(r); err != nil {
						fail(fmt.Errorf("sampler %d: %w", s, err))
					}
					if err := checkStep(r); err != nil {
						fail(fmt.Errorf("sampler %d: %w", s, err))
					}
				}
				if req.Sampler == "prioritized" {
					seqs := make([]int64, len(rows))
					prios := make([]float64, len(rows))
					for k, r := range rows {
						seqs[k], prios[k] = r.seq, rng.Float64()*3
					}
					u, st, err := c.UpdatePriorities(ctx, "cc", seqs, prios)
					if err != nil || u+st != len(seqs) {
						fail(fmt.Errorf("sampler %d: priorities: updated %d stale %d of %d: %v", s, u, st, len(seqs), err))
					}
				}
				sampled[s]++
				sampledRows[s] += len(rows)
			}
		})
	}
	time.Sleep(runFor)
	stop.Store(true)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	total := 0
	for _, n := range written {
		total += n
	}
	samples, rowsServed := 0, 0
	for s := range sampled {
		samples += sampled[s]
		rowsServed += sampledRows[s]
	}
	t.Logf("%d rows written in %d extends, %d samples", total, len(extends), samples)
	if samples < samplers {
		t.Errorf("only %d samples served", samples)
	}
	// The extends tile [0, write_count) exactly.
	slices.SortFunc(extends, func(a, b client.ExtendResult) int { return int(a.FirstSeq - b.FirstSeq) })
	for k, e := range extends {
		if e.FirstSeq != int64(k*batchRows) {
			t.Fatalf("extend %d starts at seq %d, want %d", k, e.FirstSeq, k*batchRows)
		}
	}
	info, err := c.Info(ctx, "cc")
	if err != nil {
		t.Fatal(err)
	}
	if info.WriteCount != int64(total) || info.Size > capacity || info.Size != min(int64(total), capacity) {
		t.Fatalf("info: write_count %d size %d, want %d and %d", info.WriteCount, info.Size, total, min(total, capacity))
	}
	// A stream whose last row was a done has nothing open and is gone.
	open := 0
	for _, n := range written {
		if n%trajLen != 0 {
			open++
		}
	}
	if info.Streams != open || info.OpenTrajectories != open || info.SamplesServed != int64(rowsServed) {
		t.Errorf("info: streams %d, open trajectories %d (want %d), samples_served %d (want %d)",
			info.Streams, info.OpenTrajectories, open, info.SamplesServed, rowsServed)
	}

	// Every live row, read back, is whole; its links agree with the
	// tokens of its neighbours.
	byseq := map[int64]rowView{}
	links := map[int64][2]int64{}
	for from := info.WriteCount - capacity; ; {
		b, err := c.Rows(ctx, "cc", from, 300)
		if err != nil {
			t.Fatal(err)
		}
		if b.Rows() == 0 {
			break
		}
		prev, _ := client.Column[int64](b, "prev_seq")
		next, _ := client.Column[int64](b, "next_seq")
		for k, r := range rowsOf(t, b) {
			if err := checkRow(r); err != nil {
				t.Fatal(err)
			}
			if err := checkStep(r); err != nil {
				t.Fatal(err)
			}
			byseq[r.seq] = r
			links[r.seq] = [2]int64{prev[k], next[k]}
			from = r.seq + 1
		}
	}
	if int64(len(byseq)) != info.Size {
		t.Fatalf("rows returned %d live rows, info says %d", len(byseq), info.Size)
	}
	for seq, r := range byseq {
		l := links[seq]
		if _, i := splitTok(r.action); i%trajLen == trajLen-1 && l[1] != -1 {
			t.Errorf("seq %d: done row links to next %d", seq, l[1])
		}
		if r.step == 0 && l[0] != -1 {
			t.Errorf("seq %d: first row of a trajectory links to prev %d", seq, l[0])
		}
		if n, ok := byseq[l[1]]; ok && (n.action != r.action+1 || n.traj != r.traj || n.seq <= seq) {
			t.Errorf("seq %d (tok %d): next_seq %d holds tok %d traj %d", seq, r.action, l[1], n.action, n.traj)
		}
		if p, ok := byseq[l[0]]; ok && (p.action != r.action-1 || p.traj != r.traj || p.seq >= seq) {
			t.Errorf("seq %d (tok %d): prev_seq %d holds tok %d traj %d", seq, r.action, l[0], p.action, p.traj)
		}
	}

	// Closing each stream closes its open trajectory, if its last row was
	// not a done.
	for w := range writers {
		n, err := c.CloseStream(ctx, "cc", fmt.Sprintf("writer-%d", w))
		want := 0
		if written[w]%trajLen != 0 {
			want = 1
		}
		if err != nil || n != want {
			t.Errorf("close writer-%d after %d rows: %d %v, want %d", w, written[w], n, err, want)
		}
	}
	if info, err := c.Info(ctx, "cc"); err != nil || info.OpenTrajectories != 0 || info.Streams != 0 {
		t.Errorf("after closing every stream: %+v %v", info, err)
	}
}
