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
