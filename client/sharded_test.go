package client_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
)

func newSharded(t *testing.T, urls []string, opts *client.ShardedOptions) *client.Sharded {
	t.Helper()
	s, err := client.NewSharded(urls, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// col is a tensor's values, or the test fails.
func col[T client.Elem](t *testing.T, b *client.Batch, name string) []T {
	t.Helper()
	v, err := client.Column[T](b, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// shardServers starts n servers for the test and returns them with their
// URLs.
func shardServers(t testing.TB, n int) ([]*httptest.Server, []string) {
	t.Helper()
	var servers []*httptest.Server
	var urls []string
	for range n {
		ts, _ := newServer(t, nil)
		servers = append(servers, ts)
		urls = append(urls, ts.URL)
	}
	return servers, urls
}

func TestShardedBadInput(t *testing.T) {
	ts, _ := newServer(t, nil)
	for _, tc := range []struct {
		name string
		urls []string
		want string
	}{
		{"empty", nil, "empty"},
		{"duplicate", []string{ts.URL, ts.URL + "/"}, "listed twice"},
		{"not a URL", []string{ts.URL, "ftp://x"}, "shard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := client.NewSharded(tc.urls, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewSharded(%v) = %v, want an error saying %q", tc.urls, err, tc.want)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := client.NewShardedSRV(ctx, "no such service!", nil); err == nil || !strings.Contains(err.Error(), "SRV") {
		t.Fatalf("a bad SRV name: %v, want an error naming the lookup", err)
	}
	s := newSharded(t, []string{ts.URL}, nil)
	if _, err := s.Sample(ctxT(t), "x", &client.SampleRequest{Sampler: "prioritized_slice", NumSlices: 2, SliceLen: 2}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("prioritized slices from a sharded client: %v, want ErrBadRequest", err)
	}
	if _, err := s.Sample(ctxT(t), "x", &client.SampleRequest{Sampler: "slice", NumSlices: 2}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("slices without a length: %v, want ErrBadRequest", err)
	}
}

// Shards that hold a buffer with different specs are refused before
// anything is created.
func TestShardedSpecConflict(t *testing.T) {
	_, urls := shardServers(t, 3)
	s := newSharded(t, urls, nil)
	ctx := ctxT(t)
	if _, _, err := s.Shard(0).CreateBuffer(ctx, "b", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Shard(1).CreateBuffer(ctx, "b", cartpole(200)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBuffer(ctx, "b", cartpole(100)); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("create over shards with different specs: %v, want ErrConflict", err)
	}
	if _, err := s.Shard(2).Info(ctx, "b"); !client.IsNotFound(err) {
		t.Fatalf("shard 2 got the buffer anyway: %v", err)
	}
	if _, err := s.CreateBuffer(ctx, "c", cartpole(100)); err != nil {
		t.Fatal(err)
	}
	infos, errs := s.Infos(ctx, "c")
	for i := range infos {
		if errs[i] != nil || infos[i].Spec.Capacity != 100 {
			t.Fatalf("shard %d after create: %+v %v", i, infos[i].Spec, errs[i])
		}
	}
}

// Rendezvous hashing: dropping a shard moves only the streams whose first
// choice it was, each to its own second choice.
func TestShardedHashOrder(t *testing.T) {
	urls := []string{"http://10.0.0.1:7450", "http://10.0.0.2:7450", "http://10.0.0.3:7450", "http://10.0.0.4:7450"}
	all := newSharded(t, urls, nil)
	three := newSharded(t, urls[:3], nil) // without 10.0.0.4
	first := make([]int, 4)
	for k := range 4000 {
		stream := fmt.Sprintf("actor-%d", k)
		o4, o3 := all.HashOrder(stream), three.HashOrder(stream)
		first[o4[0]]++
		want := o4[0]
		if want == 3 {
			want = o4[1] // the dropped shard's streams go to their second choice
		}
		if o3[0] != want {
			t.Fatalf("stream %s: first shard %d with 3 shards, want %d (order with 4: %v)", stream, o3[0], want, o4)
		}
	}
	for i, n := range first {
		if n < 800 || n > 1200 {
			t.Errorf("shard %d is first for %d of 4000 streams, want about 1000", i, n)
		}
	}
}

// shardedFixture writes the same rows to three shards of different sizes
// and to one reference buffer that holds all of them: trajectories of 7
// rows, the last of each shard's streams left open (its newest row is not
// eligible), priorities 1 + tok%5 set by (shard, seq). Every row's action
// is its token, unique over all shards.
func shardedFixture(t *testing.T) (*client.Sharded, *client.Client) {
	t.Helper()
	_, urls := shardServers(t, 3)
	refTS, _ := newServer(t, nil)
	ref := newClient(t, refTS.URL, nil)
	s := newSharded(t, urls, &client.ShardedOptions{Seed: client.Ptr[uint64](1)})
	ctx := ctxT(t)
	if _, err := s.CreateBuffer(ctx, "b", cartpole(1000)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ref.CreateBuffer(ctx, "b", cartpole(1000)); err != nil {
		t.Fatal(err)
	}
	tok := int64(0)
	for shard, rows := range []int{30, 75, 150} {
		var toks []int64
		var done []bool
		for r := range rows {
			toks = append(toks, tok)
			done = append(done, r%7 == 6)
			tok++
		}
		stream := fmt.Sprintf("shard-%d", shard)
		res, err := s.Shard(shard).Extend(ctx, "b", stream, steps(toks, done, nil))
		if err != nil {
			t.Fatal(err)
		}
		rres, err := ref.Extend(ctx, "b", stream, steps(toks, done, nil))
		if err != nil {
			t.Fatal(err)
		}
		var sh, seqs, rseqs []int64
		var prio []float64
		for k, tk := range toks {
			sh = append(sh, int64(shard))
			seqs = append(seqs, res.FirstSeq+int64(k))
			rseqs = append(rseqs, rres.FirstSeq+int64(k))
			prio = append(prio, float64(1+tk%5))
		}
		if _, _, err := s.UpdatePriorities(ctx, "b", sh, seqs, prio); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ref.UpdatePriorities(ctx, "b", rseqs, prio); err != nil {
			t.Fatal(err)
		}
	}
	return s, ref
}

// A batch merged from 3 shards of different sizes and priorities is
// distributed as one buffer holding the same rows (chi-squared against
// the reference buffer's own probabilities), and its prob and weight equal
// the reference's for the same row.
func TestShardedSampleMatchesOneBuffer(t *testing.T) {
	s, ref := shardedFixture(t)
	// Thousands of draws: more than ctxT's 20 s under the race detector.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, kind := range []string{"uniform", "prioritized"} {
		t.Run(kind, func(t *testing.T) {
			// The reference: each row's probability and weight, by token.
			rb, err := ref.Sample(ctx, "b", &client.SampleRequest{Sampler: kind, BatchSize: 20000, ReturnProb: true, Beta: client.Ptr(0.6), Seed: client.Ptr[uint64](3)})
			if err != nil {
				t.Fatal(err)
			}
			wantProb := map[int64]float64{}
			wantWeight := map[int64]float32{}
			rprob := col[float64](t, rb, "prob")
			var rweight []float32
			if kind == "prioritized" {
				rweight = col[float32](t, rb, "weight")
			}
			for i, tk := range col[int64](t, rb, "action") {
				wantProb[tk] = rprob[i]
				if rweight != nil {
					wantWeight[tk] = rweight[i]
				}
			}
			eligible := 255 - 3 // every row but the open newest of each shard
			if len(wantProb) != eligible {
				t.Fatalf("the reference drew %d distinct rows, want all %d eligible", len(wantProb), eligible)
			}
			counts := map[int64]float64{}
			const batches, batch = 100, 256 // about 100 draws per row
			for k := range batches {
				b, err := s.Sample(ctx, "b", &client.SampleRequest{Sampler: kind, BatchSize: batch, Beta: client.Ptr(0.6), Seed: client.Ptr(uint64(k))})
				if err != nil {
					t.Fatal(err)
				}
				if b.Rows() != batch || b.Metadata["shards_used"] != "0,1,2" || b.Metadata["shards_missing"] != "" {
					t.Fatalf("batch of %d rows, metadata %v", b.Rows(), b.Metadata)
				}
				toks, probs, shards := col[int64](t, b, "action"), col[float64](t, b, "prob"), col[int64](t, b, "shard")
				var weights []float32
				if kind == "prioritized" {
					weights = col[float32](t, b, "weight")
				}
				for i, tk := range toks {
					want, ok := wantProb[tk]
					if !ok {
						t.Fatalf("row %d (token %d) is not an eligible row", i, tk)
					}
					if math.Abs(probs[i]-want) > 1e-12*want+1e-15 {
						t.Fatalf("token %d: merged prob %v, one buffer's %v", tk, probs[i], want)
					}
					if wantShard := map[bool]int64{true: 0, false: 1}[tk < 30]; tk >= 105 && shards[i] != 2 || tk < 105 && shards[i] != wantShard {
						t.Fatalf("token %d came from shard %d", tk, shards[i])
					}
					if weights != nil && math.Abs(float64(weights[i]-wantWeight[tk])) > 1e-6*float64(wantWeight[tk]) {
						t.Fatalf("token %d: merged weight %v, one buffer's %v", tk, weights[i], wantWeight[tk])
					}
					counts[tk]++
				}
			}
			n := float64(batches * batch)
			chi2 := 0.0
			for tk, p := range wantProb {
				exp := n * p
				chi2 += (counts[tk] - exp) * (counts[tk] - exp) / exp
			}
			df := float64(len(wantProb) - 1)
			if pv := (distuv.ChiSquared{K: df}).Survival(chi2); pv < 1e-4 {
				t.Fatalf("merged draws differ from one buffer's: chi2 %.1f, %v degrees of freedom, p = %.2g", chi2, df, pv)
			}
			t.Logf("%s: chi2 %.1f with %v degrees of freedom", kind, chi2, df)
		})
	}
}

// Slices merged from 3 shards are drawn as one buffer's slice sampler
// draws them: each slice (named by its first row) has the reference
// buffer's probability, and the counts follow it (chi-squared).
func TestShardedSlicesMatchOneBuffer(t *testing.T) {
	s, ref := shardedFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const L = 3
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict_length=%v", strict), func(t *testing.T) {
			rb, err := ref.Sample(ctx, "b", &client.SampleRequest{Sampler: "slice", NumSlices: 5000, SliceLen: L, StrictLength: client.Ptr(strict), ReturnProb: true, Seed: client.Ptr[uint64](4)})
			if err != nil {
				t.Fatal(err)
			}
			want := map[int64]float64{} // first row's token -> the slice's probability
			rtok, rprob := col[int64](t, rb, "action"), col[float64](t, rb, "prob")
			for k := 0; k < len(rtok); k += L {
				want[rtok[k]] = rprob[k]
			}
			sum := 0.0
			for _, p := range want {
				sum += p
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Fatalf("the reference's slice probabilities sum to %v over %d slices seen: some slice never drawn?", sum, len(want))
			}
			counts := map[int64]float64{}
			const batches, slicesPer = 60, 64
			for k := range batches {
				b, err := s.Sample(ctx, "b", &client.SampleRequest{Sampler: "slice", NumSlices: slicesPer, SliceLen: L, StrictLength: client.Ptr(strict), Seed: client.Ptr(uint64(k))})
				if err != nil {
					t.Fatal(err)
				}
				if b.Rows() != slicesPer {
					t.Fatalf("%d slices, want %d", b.Rows(), slicesPer)
				}
				if sh, _ := b.Tensor("shard"); !slices.Equal(sh.Shape, []int{slicesPer, L}) {
					t.Fatalf("shard shape %v, want [%d %d]", sh.Shape, slicesPer, L)
				}
				toks, probs := col[int64](t, b, "action"), col[float64](t, b, "prob")
				for j := 0; j < len(toks); j += L {
					w, ok := want[toks[j]]
					if !ok {
						t.Fatalf("a slice starting at token %d, which one buffer never starts a slice at", toks[j])
					}
					if math.Abs(probs[j]-w) > 1e-12 {
						t.Fatalf("slice at token %d: merged prob %v, one buffer's %v", toks[j], probs[j], w)
					}
					counts[toks[j]]++
				}
			}
			n := float64(batches * slicesPer)
			chi2 := 0.0
			for tk, p := range want {
				chi2 += (counts[tk] - n*p) * (counts[tk] - n*p) / (n * p)
			}
			df := float64(len(want) - 1)
			if pv := (distuv.ChiSquared{K: df}).Survival(chi2); pv < 1e-4 {
				t.Fatalf("merged slices differ from one buffer's: chi2 %.1f, %v degrees of freedom, p = %.2g", chi2, df, pv)
			}
			t.Logf("chi2 %.1f with %v degrees of freedom", chi2, df)
		})
	}
}

// A shard that is down is left out of draws (the answer names it, the
// batch is full from the others) and writes fail over to the next shard in
// the stream's order.
func TestShardedShardDown(t *testing.T) {
	servers, urls := shardServers(t, 3)
	s := newSharded(t, urls, &client.ShardedOptions{ShardTimeout: 2 * time.Second, StatsTTL: time.Millisecond})
	ctx := ctxT(t)
	if _, err := s.CreateBuffer(ctx, "b", cartpole(1000)); err != nil {
		t.Fatal(err)
	}
	// One stream per shard, found by its hash order.
	streamFor := map[int]string{}
	for k := 0; len(streamFor) < 3; k++ {
		st := fmt.Sprintf("actor-%d", k)
		if _, ok := streamFor[s.HashOrder(st)[0]]; !ok {
			streamFor[s.HashOrder(st)[0]] = st
		}
	}
	tok := int64(0)
	write := func(stream string) client.ShardedExtendResult {
		t.Helper()
		toks := seqToks(tok, 14)
		tok += 14
		done := make([]bool, 14)
		done[6], done[13] = true, true
		res, err := s.Extend(ctx, "b", stream, steps(toks, done, nil))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for shard, st := range streamFor {
		if res := write(st); res.Shard != shard {
			t.Fatalf("stream %s went to shard %d, its hash order says %d", st, res.Shard, shard)
		}
	}
	// One shard dies (shards are numbered in the order of their URLs).
	dead := slices.Index(s.Shards(), servers[1].URL)
	var alive []string
	for i := range 3 {
		if i != dead {
			alive = append(alive, strconv.Itoa(i))
		}
	}
	servers[1].CloseClientConnections()
	servers[1].Close()
	b, err := s.Sample(ctx, "b", &client.SampleRequest{BatchSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	if b.Rows() != 64 || b.Metadata["shards_missing"] != strconv.Itoa(dead) || b.Metadata["shards_used"] != strings.Join(alive, ",") {
		t.Fatalf("with shard %d down: %d rows, metadata %v", dead, b.Rows(), b.Metadata)
	}
	for _, sh := range col[int64](t, b, "shard") {
		if sh == int64(dead) {
			t.Fatal("a row came from the dead shard")
		}
	}
	res := write(streamFor[dead])
	if want := s.HashOrder(streamFor[dead])[1]; res.Shard != want || s.StreamShard("b", streamFor[dead]) != want {
		t.Fatalf("the dead shard's stream wrote to shard %d, want its second choice %d", res.Shard, want)
	}
	// The other streams stay where they were.
	for shard := range 3 {
		if shard == dead {
			continue
		}
		if res := write(streamFor[shard]); res.Shard != shard {
			t.Fatalf("stream of shard %d moved to %d", shard, res.Shard)
		}
	}
	// Bad requests are not failures of a shard: no failover.
	if _, err := s.Extend(ctx, "b", streamFor[0], []codec.Tensor{client.NewTensor("observation", []int{1, 4}, []float32{1, 2, 3, 4})}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("a bad extend: %v, want ErrBadRequest from its shard", err)
	}
}

// UpdateFields sends each row's new values to its shard; SetRateLimit and
// Health reach every shard.
func TestShardedUpdateFieldsLimitsHealth(t *testing.T) {
	servers, urls := shardServers(t, 3)
	s := newSharded(t, urls, nil)
	ctx := ctxT(t)
	sp := cartpole(1000)
	sp.Fields = append(sp.Fields, client.Field{Name: "h", DType: "float32", Shape: []int{2}, Mutable: true})
	if _, err := s.CreateBuffer(ctx, "b", sp); err != nil {
		t.Fatal(err)
	}
	for k := range 9 {
		toks := seqToks(int64(20*k), 20)
		done := make([]bool, 20)
		done[19] = true
		rows := append(steps(toks, done, nil), client.NewTensor("h", []int{20, 2}, make([]float32, 40)))
		if _, err := s.Extend(ctx, "b", fmt.Sprintf("actor-%d", k), rows); err != nil {
			t.Fatal(err)
		}
	}
	b, err := s.Sample(ctx, "b", &client.SampleRequest{BatchSize: 64, Keys: []string{"action"}})
	if err != nil {
		t.Fatal(err)
	}
	shards, seqs, toks := col[int64](t, b, "shard"), col[int64](t, b, "seq"), col[int64](t, b, "action")
	h := make([]float32, 0, 2*len(toks))
	for _, tk := range toks {
		h = append(h, float32(tk), float32(-tk))
	}
	if _, stale, err := s.UpdateFields(ctx, "b", shards, seqs, client.NewTensor("h", []int{len(seqs), 2}, h)); err != nil || stale != 0 {
		t.Fatalf("update: stale %d, %v", stale, err)
	}
	for i, sh := range shards {
		r, err := s.Shard(int(sh)).Rows(ctx, "b", seqs[i], 1)
		if err != nil {
			t.Fatal(err)
		}
		got, act := col[float32](t, r, "h"), col[int64](t, r, "action")
		if act[0] != toks[i] || got[0] != float32(toks[i]) || got[1] != float32(-toks[i]) {
			t.Fatalf("shard %d seq %d: action %d h %v, want the update for token %d", sh, seqs[i], act[0], got, toks[i])
		}
	}
	if _, _, err := s.UpdateFields(ctx, "b", shards[:1], seqs, client.NewTensor("h", []int{len(seqs), 2}, h)); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("shards and seqs of different lengths: %v, want ErrBadRequest", err)
	}
	if err := s.SetRateLimit(ctx, "b", &client.RateLimit{MinSize: 5}); err != nil {
		t.Fatal(err)
	}
	infos, errs := s.Infos(ctx, "b")
	for i := range infos {
		if errs[i] != nil || infos[i].RateLimit == nil || infos[i].RateLimit.MinSize != 5 {
			t.Fatalf("shard %d rate limit %+v %v", i, infos[i].RateLimit, errs[i])
		}
	}
	dead := slices.Index(s.Shards(), servers[2].URL)
	servers[2].Close()
	for i, err := range s.Health(ctx) {
		if (err != nil) != (i == dead) {
			t.Fatalf("health of shard %d: %v (dead: %d)", i, err, dead)
		}
	}
}

// A seeded sharded sample is reproducible: the split and every shard's
// draw derive from the seed.
func TestShardedSeedReproducible(t *testing.T) {
	s, _ := shardedFixture(t)
	ctx := ctxT(t)
	for _, kind := range []string{"uniform", "prioritized"} {
		req := &client.SampleRequest{Sampler: kind, BatchSize: 128, Seed: client.Ptr[uint64](42)}
		a, err := s.Sample(ctx, "b", req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Sample(ctx, "b", req)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(col[int64](t, a, "action"), col[int64](t, b, "action")) {
			t.Fatalf("%s: the same seed gave different batches", kind)
		}
		req.Seed = client.Ptr[uint64](43)
		c, err := s.Sample(ctx, "b", req)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(col[int64](t, a, "action"), col[int64](t, c, "action")) {
			t.Fatalf("%s: seeds 42 and 43 gave the same batch", kind)
		}
	}
}
