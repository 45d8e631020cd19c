package rbd

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/rbdb/rbd/storage"
)

// returnProbBuffer is a compact prioritised buffer with ended trajectories,
// open ones (whose newest rows are not eligible: their next observation is
// unknown), rows overwritten by the ring, and priorities set per row.
func returnProbBuffer(t *testing.T) (*Buffer, map[int64]float64) {
	t.Helper()
	db := openDB(t)
	buf, _, err := db.CreateBuffer("p", testSpec(storage.KindMemory, 40, true, true))
	if err != nil {
		t.Fatal(err)
	}
	var steps []step
	var nexts []float32
	for i := range 50 {
		// 3 envs; env 0 ends an episode every 7 steps, env 1 every 5, env 2
		// never: it stays open.
		e := int64(i % 3)
		s := step{obs: float32(i), env: e}
		if e == 0 && i%7 == 0 || e == 1 && i%5 == 0 {
			s.term = true
		}
		steps = append(steps, s)
		nexts = append(nexts, float32(i)+100)
	}
	if _, err := buf.Extend("s", stepsBatch(true, steps, nexts)); err != nil {
		t.Fatal(err)
	}
	prios := map[int64]float64{}
	var seqs []int64
	var ps []float64
	for seq := int64(10); seq < 50; seq++ {
		p := 1 + float64(seq%4)*3 // 1, 4, 7, 10
		seqs, ps = append(seqs, seq), append(ps, p)
		prios[seq] = p
	}
	if _, _, err := buf.UpdatePriorities(seqs, ps); err != nil {
		t.Fatal(err)
	}
	return buf, prios
}

// prob, size, priority_total and priority_min equal what a brute-force
// pass over the eligible rows gives, for uniform and prioritized draws,
// and the draws follow prob (chi-squared, fixed seed).
func TestReturnProb(t *testing.T) {
	buf, prios := returnProbBuffer(t)
	// The eligible rows, by the index's own rule.
	var eligible []int64
	if err := buf.ReadIndex(func(ix storage.Index) { eligible = ix.AppendNextKnown(nil) }); err != nil {
		t.Fatal(err)
	}
	info, _ := buf.Info()
	if int64(len(eligible)) >= info.Size || len(eligible) < 20 {
		t.Fatalf("%d eligible of %d live rows: the fixture should have some, not all, rows eligible", len(eligible), info.Size)
	}
	total, qmin := 0.0, math.Inf(1)
	for _, s := range eligible {
		total += prios[s]
	}
	for _, p := range prios {
		qmin = min(qmin, p)
	}
	for _, tc := range []struct {
		sampler string
		prob    func(seq int64) float64
	}{
		{"uniform", func(int64) float64 { return 1 / float64(len(eligible)) }},
		{"prioritized", func(seq int64) float64 { return prios[seq] / total }},
	} {
		t.Run(tc.sampler, func(t *testing.T) {
			const n = 200_000
			got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: tc.sampler, BatchSize: n, Seed: seed(5), ReturnProb: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			md := got.Metadata
			if md["size"] != strconv.Itoa(len(eligible)) {
				t.Errorf("metadata size %q, want %d (the eligible rows)", md["size"], len(eligible))
			}
			if tc.sampler == "prioritized" {
				if v, _ := strconv.ParseFloat(md["priority_total"], 64); math.Abs(v-total) > 1e-9*total {
					t.Errorf("priority_total %v, want %v (eligible rows only)", v, total)
				}
				if v, _ := strconv.ParseFloat(md["priority_min"], 64); v != qmin {
					t.Errorf("priority_min %v, want %v", v, qmin)
				}
			}
			seqs, probs := i64s(t, got, "seq"), f64s(t, got, "prob")
			counts := map[int64]float64{}
			for i, s := range seqs {
				if want := tc.prob(s); math.Abs(probs[i]-want) > 1e-12 {
					t.Fatalf("row %d (seq %d): prob %v, want %v", i, s, probs[i], want)
				}
				counts[s]++
			}
			if tc.sampler == "prioritized" {
				// The weights the server gives are the single-buffer
				// formula on q = prob * priority_total.
				w := f32s(t, got, "weight")
				for i := range seqs {
					q := probs[i] * total
					if want := float32(math.Pow(q/qmin, -0.4)); math.Abs(float64(w[i]-want)) > 1e-6 {
						t.Fatalf("weight %v, want %v from prob", w[i], want)
					}
				}
			}
			chi2 := 0.0
			for _, s := range eligible {
				exp := n * tc.prob(s)
				chi2 += (counts[s] - exp) * (counts[s] - exp) / exp
			}
			df := float64(len(eligible) - 1)
			if pv := (distuv.ChiSquared{K: df}).Survival(chi2); pv < 1e-4 {
				t.Fatalf("draws do not follow prob: chi2 %.1f with %v degrees of freedom, p = %.2g", chi2, df, pv)
			}
		})
	}
}

func TestReturnProbBadRequests(t *testing.T) {
	buf, _ := returnProbBuffer(t)
	reqs := []SampleRequest{
		{Sampler: "prioritized_slice", NumSlices: 2, SliceLen: 2, ReturnProb: true},
		{Sampler: "slice_without_replacement", NumSlices: 2, SliceLen: 2, ReturnProb: true},
		{Sampler: "without_replacement", BatchSize: 2, ReturnProb: true},
		{BatchSize: 2, ReturnProb: true, MinPolicyVersion: ptr(int64(0))},
	}
	for _, req := range reqs {
		_, err := buf.Sample(context.Background(), &req, nil)
		var re *RequestError
		if !errors.As(err, &re) || re.Field != "return_prob" {
			t.Errorf("%+v: %v, want a 400 naming return_prob", req, err)
		}
	}
	db := openDB(t)
	for _, name := range storage.ReservedNewSampleKeys {
		spec := testSpec(storage.KindMemory, 8, false, false)
		spec.Fields = append(spec.Fields, storage.Field{Name: name, DType: storage.Float64})
		if _, _, err := db.CreateBuffer("r", spec); err == nil {
			t.Errorf("a new buffer with a field %q was created", name)
		}
	}
}
