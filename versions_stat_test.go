package rbd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// TestStatMinPolicyVersion: with min_policy_version, transition samplers
// draw from the rows at or above it with the distribution they have over
// the whole buffer (uniform: equal; prioritized: by priority), never below
// it; without-replacement visits each of them once per epoch.
func TestStatMinPolicyVersion(t *testing.T) {
	const capacity, perVersion, minV = 400, 50, 5 // versions 0..7; 150 rows qualify
	db := openDB(t)
	buf := rtCreate(t, db, "pv", rtPrioSpec(storage.KindMemory, capacity, false, 1, 0))
	m, g := newRTModel(capacity), newRTGen()
	in := g.episode("s", 0, capacity, "open")
	batch := rtBatch(false, in, false)
	batch.PolicyVersion = make([]int64, capacity)
	for i := range batch.PolicyVersion {
		batch.PolicyVersion[i] = int64(i / perVersion)
	}
	if _, err := buf.Extend("s", batch); err != nil {
		t.Fatal(err)
	}
	m.apply("s", in, false)
	// Priorities 1, 2, 3 by seq mod 3 (alpha 1, eps 0: probability ∝ p).
	seqs, prios := make([]int64, capacity), make([]float64, capacity)
	for i := range seqs {
		seqs[i], prios[i] = int64(i), float64(1+i%3)
	}
	if _, _, err := buf.UpdatePriorities(seqs, prios); err != nil {
		t.Fatal(err)
	}
	first := int64(minV * perVersion)
	v := int64(minV)
	for _, kind := range []string{"uniform", "prioritized"} {
		counts := make([]float64, capacity-first)
		const batches, bs = 40, 1000
		for i := range batches {
			got := rtSample(t, buf, SampleRequest{BatchSize: bs, Sampler: kind, Seed: seed(uint64(i)), MinPolicyVersion: &v})
			for _, s := range i64s(t, got, "seq") {
				if s < first {
					t.Fatalf("%s: seq %d (version %d) drawn with min_policy_version %d", kind, s, s/perVersion, minV)
				}
				counts[s-first]++
			}
		}
		exp := make([]float64, len(counts))
		total := 0.0
		for i := range exp {
			exp[i] = 1
			if kind == "prioritized" {
				exp[i] = prios[first+int64(i)]
			}
			total += exp[i]
		}
		for i := range exp {
			exp[i] *= batches * bs / total
		}
		rtChi2(t, kind+" over versions >= 5", counts, exp)
	}
	// One epoch without replacement: each qualifying row once, then epoch_end.
	seen := map[int64]bool{}
	for i := 0; ; i++ {
		got := rtSample(t, buf, SampleRequest{BatchSize: 64, Sampler: "without_replacement", Seed: seed(1), MinPolicyVersion: &v})
		for _, s := range i64s(t, got, "seq") {
			if s < first || seen[s] {
				t.Fatalf("without_replacement: seq %d (seen before: %v)", s, seen[s])
			}
			seen[s] = true
		}
		if got.Metadata["epoch_end"] == "true" {
			break
		}
		if i > 10 {
			t.Fatal("the epoch did not end")
		}
	}
	if len(seen) != int(capacity-first) {
		t.Fatalf("one epoch returned %d rows, want %d", len(seen), capacity-first)
	}
	// A version nobody wrote yet is not ready; a ready one's ages are measured.
	nine := int64(9)
	if _, err := buf.Sample(t.Context(), &SampleRequest{BatchSize: 1, MinPolicyVersion: &nine}, nil); !errors.Is(err, ErrNotReady) {
		t.Fatalf("min_policy_version 9: %v", err)
	}
	got := rtSample(t, buf, SampleRequest{BatchSize: 2000, Seed: seed(3)})
	if got.PolicyAgeMax != 7 || got.PolicyAgeMean < 3 || got.PolicyAgeMean > 4 {
		t.Fatalf("ages of a uniform batch over versions 0-7: mean %v (want about 3.5), max %d", got.PolicyAgeMean, got.PolicyAgeMax)
	}
}

// BenchmarkSampleMinPolicyVersion draws 256-row uniform and prioritized
// batches from 10^5 CartPole rows written by versions 0-9 (10^4 rows each),
// without a filter and with min_policy_version 5 (half the rows qualify)
// and 9 (a tenth): the cost of the rejection test per drawn row.
//
// go test . -run '^$' -bench BenchmarkSampleMinPolicyVersion -benchtime 2s -cpu 2
func BenchmarkSampleMinPolicyVersion(b *testing.B) {
	const rows, perVersion = 100_000, 10_000
	db, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	buf, _, err := db.CreateBuffer("pv", rtPrioSpec(storage.KindMemory, rows, false, 0.6, 1e-6))
	if err != nil {
		b.Fatal(err)
	}
	g := newRTGen()
	for v := range rows / perVersion {
		in := g.episode("s", 0, perVersion, "trnc")
		batch := rtBatch(false, in, false)
		batch.PolicyVersion = make([]int64, perVersion)
		for i := range batch.PolicyVersion {
			batch.PolicyVersion[i] = int64(v)
		}
		if _, err := buf.Extend("s", batch); err != nil {
			b.Fatal(err)
		}
	}
	for _, kind := range []string{"uniform", "prioritized"} {
		for _, min := range []int64{-1, 5, 9} {
			name := fmt.Sprintf("sampler=%s/min_policy_version=%d", kind, min)
			if min < 0 {
				name = fmt.Sprintf("sampler=%s/min_policy_version=none", kind)
			}
			b.Run(name, func(b *testing.B) {
				req := &SampleRequest{Sampler: kind, BatchSize: 256}
				if min >= 0 {
					req.MinPolicyVersion = &min
				}
				sbenchRun(b, buf, req)
			})
		}
	}
}

// TestStatMinPolicyVersionSlices: slice samplers start slices only at rows
// of at least min_policy_version, with the distribution they have without
// it (uniform over the qualifying starts here), through the rejection
// path and the exact one.
func TestStatMinPolicyVersionSlices(t *testing.T) {
	const eps, rows, L = 4, 50, 10 // episode e, row r: version 10*e + r/10
	db := openDB(t)
	buf := rtCreate(t, db, "pvs", rtPrioSpec(storage.KindMemory, eps*rows, false, 1, 0))
	g := newRTGen()
	for e := range eps {
		batch := rtBatch(false, g.episode("s", 0, rows, "term"), false)
		batch.PolicyVersion = make([]int64, rows)
		for r := range rows {
			batch.PolicyVersion[r] = int64(10*e + r/10)
		}
		if _, err := buf.Extend("s", batch); err != nil {
			t.Fatal(err)
		}
	}
	// min 13: episode 0 none; episode 1 starts 30-40 (versions 13, 14);
	// episodes 2 and 3 every start 0-40: 11 + 41 + 41 qualifying starts.
	v := int64(13)
	qualifies := func(seq int64) bool {
		e, r := seq/rows, seq%rows
		return r <= rows-L && 10*e+r/10 >= v
	}
	var bins []int64
	for seq := int64(0); seq < eps*rows; seq++ {
		if qualifies(seq) {
			bins = append(bins, seq)
		}
	}
	if len(bins) != 93 {
		t.Fatalf("setup: %d qualifying starts", len(bins))
	}
	for _, kind := range []string{"slice", "prioritized_slice"} {
		counts := map[int64]float64{}
		const batches, ns = 100, 200
		for i := range batches {
			got := rtSample(t, buf, SampleRequest{Sampler: kind, NumSlices: ns, SliceLen: L, Seed: seed(uint64(i)), MinPolicyVersion: &v})
			seqs := i64s(t, got, "seq")
			for k := 0; k < ns; k++ {
				s := seqs[k*L]
				if !qualifies(s) || seqs[k*L+L-1] != s+L-1 {
					t.Fatalf("%s: slice %v starts at seq %d (episode %d row %d)", kind, seqs[k*L:k*L+L], s, s/rows, s%rows)
				}
				counts[s]++
			}
		}
		obs, exp := make([]float64, len(bins)), make([]float64, len(bins))
		for i, s := range bins {
			obs[i], exp[i] = counts[s], batches*ns/float64(len(bins))
		}
		rtChi2(t, kind+" starts over versions >= 13", obs, exp)
	}
	// One epoch without replacement: a slice from each of the 3 episodes
	// that have a qualifying start, then epoch_end.
	got := rtSample(t, buf, SampleRequest{Sampler: "slice_without_replacement", NumSlices: 4, SliceLen: L, Seed: seed(1), MinPolicyVersion: &v})
	seqs := i64s(t, got, "seq")
	if len(seqs) != 3*L || got.Metadata["epoch_end"] != "true" {
		t.Fatalf("epoch of slices: %d rows, metadata %v", len(seqs), got.Metadata)
	}
	seen := map[int64]bool{}
	for k := 0; k < 3; k++ {
		if s := seqs[k*L]; !qualifies(s) || seen[s/rows] {
			t.Fatalf("epoch slice %d starts at seq %d", k, s)
		} else {
			seen[s/rows] = true
		}
	}
	// min 34: one start in all (episode 3, row 40): the rejection budget
	// runs out and the exact path draws it.
	v = 34
	got = rtSample(t, buf, SampleRequest{Sampler: "slice", NumSlices: 100, SliceLen: L, Seed: seed(2), MinPolicyVersion: &v})
	for k, s := range i64s(t, got, "seq") {
		if want := int64(3*rows+40) + int64(k%L); s != want {
			t.Fatalf("row %d: seq %d, want %d", k, s, want)
		}
	}
	v = 40
	if _, err := buf.Sample(t.Context(), &SampleRequest{Sampler: "slice", NumSlices: 1, SliceLen: L, MinPolicyVersion: &v}, nil); !errors.Is(err, ErrNotReady) {
		t.Fatalf("min_policy_version 40: %v", err)
	}
}
