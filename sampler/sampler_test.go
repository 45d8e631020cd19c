package sampler

// Selection-level tests: State.Draw against a real storage index, without
// gathering any bytes, so they can afford long slices and many draws. They
// cover paths the end-to-end tests in the root package reach rarely: the
// length index beyond its exact buckets, and the exact fallbacks the
// rejection samplers use when few rows qualify.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"testing"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"

	"github.com/rbdb/rbd/sampler/internal/perm"
	"github.com/rbdb/rbd/storage"
)

func newTestBuffer(t *testing.T, capacity int64, prio bool) *storage.Buffer {
	t.Helper()
	s, err := storage.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	spec := storage.Spec{Capacity: capacity, Storage: storage.KindMemory, Fields: []storage.Field{
		{Name: "observation", DType: storage.Float32},
		{Name: "next.done", DType: storage.Bool},
	}}
	if prio {
		spec.Priority = &storage.PriorityOptions{Alpha: 0.6, Eps: 1e-6}
	}
	b, _, err := s.CreateBuffer("b", spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeEpisodes writes one episode per length, the envs interleaved row by
// row (episode i on env i), each ending with done unless open[i].
func writeEpisodes(t *testing.T, b *storage.Buffer, lens []int, open []bool) {
	t.Helper()
	type row struct {
		env  int64
		done bool
	}
	var rows []row
	pos := make([]int, len(lens))
	for {
		progressed := false
		for i, n := range lens {
			if pos[i] < n {
				pos[i]++
				rows = append(rows, row{int64(i), pos[i] == n && (open == nil || !open[i])})
				progressed = true
			}
		}
		if !progressed {
			break
		}
	}
	for len(rows) > 0 {
		k := min(len(rows), 4096)
		obs, done, env := make([]byte, 4*k), make([]byte, k), make([]int64, k)
		for i, r := range rows[:k] {
			binary.LittleEndian.PutUint32(obs[4*i:], math.Float32bits(float32(i)))
			if r.done {
				done[i] = 1
			}
			env[i] = r.env
		}
		if _, err := b.Extend("s", &storage.Batch{Rows: k, Fields: map[string][]byte{"observation": obs, "next.done": done}, Env: env}); err != nil {
			t.Fatal(err)
		}
		rows = rows[k:]
	}
}

func draw(t *testing.T, b *storage.Buffer, st *State, p Params, rng *rand.Rand) (*Selection, error) {
	t.Helper()
	var sel *Selection
	var err error
	if e := b.ReadIndex(func(ix storage.Index) { sel, err = st.Draw(ix, p, rng) }); e != nil {
		t.Fatal(e)
	}
	return sel, err
}

func chi2(t *testing.T, what string, obs, exp []float64) {
	t.Helper()
	x2 := stat.ChiSquare(obs, exp)
	df := len(obs) - 1
	p := distuv.ChiSquared{K: float64(df)}.Survival(x2)
	t.Logf("%s: chi2=%.1f df=%d p=%.3g", what, x2, df, p)
	if p < 1e-4 {
		t.Errorf("%s: rejected: chi2=%.1f df=%d p=%.2g", what, x2, df, p)
	}
}

// ksUniform is a one-sample KS test against U(0,1).
func ksUniform(t *testing.T, what string, xs []float64) {
	t.Helper()
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	n := float64(len(xs))
	d := 0.0
	for i, x := range xs {
		d = max(d, float64(i+1)/n-x, x-float64(i)/n)
	}
	en := math.Sqrt(n)
	lambda := (en + 0.12 + 0.11/en) * d
	p := 0.0
	for k := 1; k <= 100; k++ {
		term := 2 * math.Exp(-2*float64(k*k)*lambda*lambda)
		if k%2 == 0 {
			term = -term
		}
		p += term
	}
	p = min(max(p, 0), 1)
	t.Logf("%s: KS D=%.4g n=%d p=%.3g", what, d, len(xs), p)
	if p < 1e-4 {
		t.Errorf("%s: KS rejected: D=%.4g p=%.2g", what, d, p)
	}
}

// Slices longer than the exact length buckets (4095 rows and more share the
// last bucket): trajectories stay equiprobable among those long enough and
// starts uniform, right at the bucket boundary.
func TestSliceLongerThanLengthBuckets(t *testing.T) {
	b := newTestBuffer(t, 40000, false)
	lens := []int{4093, 4094, 4095, 4096, 4100, 5000, 7, 3000}
	writeEpisodes(t, b, lens, []bool{false, false, false, false, false, true, false, false})
	for _, L := range []int{4094, 4095, 4097} {
		var want []int // episodes long enough
		for i, n := range lens {
			if n >= L {
				want = append(want, i)
			}
		}
		st := NewState()
		rng := rand.New(rand.NewPCG(uint64(L), 1))
		count := make([]float64, len(lens))
		var us []float64
		jit := rand.New(rand.NewPCG(9, uint64(L)))
		const draws, S = 10, 50
		for d := 0; d < draws; d++ {
			sel, err := draw(t, b, st, Params{Kind: Slice, NumSlices: S, SliceLen: L, StrictLength: true}, rng)
			if err != nil {
				t.Fatalf("L=%d: %v", L, err)
			}
			err = b.ReadIndex(func(ix storage.Index) {
				for k := 0; k < S; k++ {
					first, _ := ix.Row(sel.Seqs[k*L])
					last, _ := ix.Row(sel.Seqs[k*L+L-1])
					tr, pos := ix.Position(first)
					if tr == nil || last.TrajID != first.TrajID || last.Step != first.Step+int64(L-1) || !sel.SliceEnd[k*L+L-1] {
						t.Fatalf("L=%d slice %d: not %d consecutive rows of one trajectory", L, k, L)
					}
					ep := int(first.Env)
					count[ep]++
					if m := tr.Len() - L + 1; m > 1 {
						us = append(us, (float64(pos)+jit.Float64())/float64(m))
					} else if pos != 0 {
						t.Fatalf("L=%d: start %d in a trajectory of %d rows", L, pos, tr.Len())
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		var obs, exp []float64
		for i := range lens {
			if !slices.Contains(want, i) {
				if count[i] > 0 {
					t.Fatalf("L=%d: %v slices from episode %d of %d rows", L, count[i], i, lens[i])
				}
				continue
			}
			obs = append(obs, count[i])
			exp = append(exp, draws*S/float64(len(want)))
		}
		chi2(t, "trajectory choice, slice_len "+strconv.Itoa(L), obs, exp)
		ksUniform(t, "start within trajectory, slice_len "+strconv.Itoa(L), us)
	}
	// Longer than every trajectory: not ready, never a wrong slice.
	if _, err := draw(t, b, NewState(), Params{Kind: Slice, NumSlices: 1, SliceLen: 5001, StrictLength: true}, rand.New(rand.NewPCG(1, 1))); !errors.Is(err, ErrNotReady) {
		t.Fatalf("slice of 5001: %v, want ErrNotReady", err)
	}
}

// When only a few rows are eligible, uniform and prioritized draws exhaust
// their rejection budget and finish from an exact list: the mixture must
// still be uniform (or proportional to q) over the eligible rows.
func TestRejectionFallbackDistributions(t *testing.T) {
	b := newTestBuffer(t, 2000, true)
	writeEpisodes(t, b, []int{600, 700, 700}, nil)
	rng := rand.New(rand.NewPCG(4, 4))
	var seqs []int64
	var prios []float64
	prio := map[int64]float64{}
	for s := int64(0); s < 2000; s++ {
		p := 0.1 + 3*rng.Float64()
		seqs, prios, prio[s] = append(seqs, s), append(prios, p), p
	}
	if _, _, err := b.UpdatePriorities(seqs, prios); err != nil {
		t.Fatal(err)
	}
	var elig []int64
	for s := int64(5); s < 2000; s += 97 {
		elig = append(elig, s)
	}
	pos := map[int64]int{}
	for i, s := range elig {
		pos[s] = i
	}
	only := func(_ storage.Index, m storage.RowMeta) bool { _, ok := pos[m.Seq]; return ok }
	q := func(s int64) float64 { return math.Pow(prio[s]+1e-6, 0.6) }
	qmin := math.Inf(1)
	for s := range prio {
		qmin = min(qmin, q(s))
	}
	for _, kind := range []string{Uniform, Prioritized} {
		counts := make([]float64, len(elig))
		// About 64 tries per row drawn: the budget before the fallback.
		const draws, B = 20, 200
		for d := 0; d < draws; d++ {
			sel, err := draw(t, b, NewState(), Params{Kind: kind, BatchSize: B, Beta: 0.4, Eligible: only}, rng)
			if err != nil {
				t.Fatal(err)
			}
			if len(sel.Seqs) != B {
				t.Fatalf("%s: %d rows, want %d", kind, len(sel.Seqs), B)
			}
			for i, s := range sel.Seqs {
				k, ok := pos[s]
				if !ok {
					t.Fatalf("%s: ineligible seq %d", kind, s)
				}
				counts[k]++
				if kind == Prioritized {
					if want := float32(math.Pow(q(s)/qmin, -0.4)); math.Abs(float64(sel.Weights[i]-want)) > 2e-7*float64(want) {
						t.Fatalf("seq %d: weight %v, want %v", s, sel.Weights[i], want)
					}
				}
			}
		}
		exp := make([]float64, len(elig))
		sum := 0.0
		for _, s := range elig {
			sum += q(s)
		}
		for i, s := range elig {
			if kind == Uniform {
				exp[i] = draws * B / float64(len(elig))
			} else {
				exp[i] = draws * B * q(s) / sum
			}
		}
		chi2(t, kind+" with few eligible rows", counts, exp)
	}
}

// prioritized_slice with few valid starts (one trajectory long enough among
// many short ones) falls back to an exact list of starts: starts stay
// proportional to q among valid starts.
func TestPrioritizedSliceFallback(t *testing.T) {
	b := newTestBuffer(t, 1000, true)
	lens := []int{30}
	for i := 0; i < 120; i++ {
		lens = append(lens, 1+i%6)
	}
	writeEpisodes(t, b, lens, nil)
	const L = 25
	rng := rand.New(rand.NewPCG(8, 8))
	var seqs []int64
	var prios []float64
	n := b.WriteCount()
	for s := int64(0); s < n; s++ {
		seqs, prios = append(seqs, s), append(prios, 0.1+2*rng.Float64())
	}
	if _, _, err := b.UpdatePriorities(seqs, prios); err != nil {
		t.Fatal(err)
	}
	counts := map[int64]float64{}
	var starts []int64
	var qs []float64
	err := b.ReadIndex(func(ix storage.Index) {
		for i := 0; i < ix.NumTrajectories(); i++ {
			tr := ix.Trajectory(i)
			for p := 0; p+L <= tr.Len(); p++ {
				starts = append(starts, tr.Seq(p))
				qs = append(qs, ix.PriorityQ(tr.Seq(p)))
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(starts) != 6 {
		t.Fatalf("setup: %d valid starts", len(starts))
	}
	const draws, S = 40, 50
	for d := 0; d < draws; d++ {
		sel, err := draw(t, b, NewState(), Params{Kind: PrioritizedSlice, NumSlices: S, SliceLen: L, StrictLength: true, Beta: 0.4}, rng)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < S; k++ {
			counts[sel.Seqs[k*L]]++
		}
	}
	sum := 0.0
	for _, v := range qs {
		sum += v
	}
	var obs, exp []float64
	total := 0.0
	for i, s := range starts {
		obs = append(obs, counts[s])
		exp = append(exp, draws*S*qs[i]/sum)
		total += counts[s]
	}
	if total != draws*S {
		t.Fatalf("%v of %d slices start at a valid start", total, draws*S)
	}
	chi2(t, "prioritized_slice fallback starts", obs, exp)
}

// A without-replacement epoch over rows some of which are not eligible must
// still end with EpochEnd on the batch that returns its last eligible row,
// and the next draw must open a new epoch: never ErrNotReady while eligible
// rows exist.
func TestWithoutReplacementIneligibleTail(t *testing.T) {
	b := newTestBuffer(t, 100, false)
	writeEpisodes(t, b, []int{20}, nil)
	bad := map[int64]bool{3: true, 8: true, 11: true, 15: true, 19: true}
	elig := func(_ storage.Index, m storage.RowMeta) bool { return !bad[m.Seq] }
	const B = 15 // exactly the eligible rows
	st := NewState()
	rng := rand.New(rand.NewPCG(1, 2))
	for ep := int64(0); ep < 20; ep++ {
		sel, err := draw(t, b, st, Params{Kind: WithoutReplacement, BatchSize: B, Eligible: elig}, rng)
		if err != nil {
			t.Fatalf("epoch %d: %v", ep, err)
		}
		if sel.Epoch != ep || len(sel.Seqs) != B {
			t.Fatalf("epoch %d: got epoch %d with %d rows", ep, sel.Epoch, len(sel.Seqs))
		}
		if !sel.EpochEnd {
			t.Fatalf("BUG: epoch %d: the batch holding all %d eligible rows is not flagged EpochEnd "+
				"(the permutation still has ineligible entries after it); the next draw answers %v "+
				"(sampler/sampler.go drawWithoutReplacement: the cursor is not advanced past ineligible entries before deciding the epoch's end)",
				ep, B, func() error {
					_, err := draw(t, b, st, Params{Kind: WithoutReplacement, BatchSize: B, Eligible: elig}, rng)
					return err
				}())
		}
	}
}

// TestWithoutReplacementEpochOverFullRing draws a batch from a full ring,
// writes half a ring more (the live count stays the capacity, so the epoch
// goes on), then drains the epoch: every row comes at most once, and the
// rows written mid-epoch are reached where the epoch had not yet visited
// their slots. With a spare block (the rbd_spareslots build tag) those
// slots were outside the window when the epoch began; an epoch that
// permuted only the slots in use then returned none of them.
func TestWithoutReplacementEpochOverFullRing(t *testing.T) {
	const capacity = 100
	b := newTestBuffer(t, capacity, false)
	writeEpisodes(t, b, []int{capacity}, nil)
	st, rng := NewState(), rand.New(rand.NewPCG(9, 9))
	p := Params{Kind: WithoutReplacement, BatchSize: 10}
	sel, err := draw(t, b, st, p, rng)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, s := range sel.Seqs {
		seen[s] = true
	}
	writeEpisodes(t, b, []int{capacity / 2}, nil)
	for !sel.EpochEnd {
		if sel, err = draw(t, b, st, p, rng); err != nil {
			t.Fatal(err)
		}
		if sel.Epoch != 0 {
			t.Fatalf("epoch %d began before epoch 0 ended", sel.Epoch)
		}
		for _, s := range sel.Seqs {
			if seen[s] {
				t.Fatalf("seq %d drawn twice in one epoch", s)
			}
			seen[s] = true
		}
	}
	late := 0
	for s := range seen {
		if s >= capacity {
			late++
		}
	}
	// Seed 9: 100 rows in the epoch, 47 of them written after it began
	// (102 and 46 with a spare block, whose epoch also reaches rows that
	// left the window after it began); 53 and 0 when the epoch permuted
	// only the slots in use.
	if len(seen) < 90 || late < 35 {
		t.Fatalf("the epoch returned %d rows, %d of the %d written after it began", len(seen), late, capacity/2)
	}
}

// The same for slice epochs: trajectories shorter than a strict slice sit
// in the permutation; the batch that returns the last long one must end the
// epoch.
func TestSliceWithoutReplacementShortTail(t *testing.T) {
	b := newTestBuffer(t, 500, false)
	writeEpisodes(t, b, []int{10, 10, 10, 2, 2, 2, 2, 2, 2}, nil)
	st := NewState()
	rng := rand.New(rand.NewPCG(3, 3))
	for ep := int64(0); ep < 20; ep++ {
		sel, err := draw(t, b, st, Params{Kind: SliceWithoutReplacement, NumSlices: 3, SliceLen: 5, StrictLength: true}, rng)
		if err != nil {
			t.Fatalf("epoch %d: %v", ep, err)
		}
		if sel.Epoch != ep || sel.NumSlices != 3 {
			t.Fatalf("epoch %d: got epoch %d with %d slices", ep, sel.Epoch, sel.NumSlices)
		}
		if !sel.EpochEnd {
			t.Fatalf("BUG: epoch %d: the batch holding all 3 long trajectories is not flagged EpochEnd; "+
				"the next draw answers %v (sampler/sampler.go drawSlicesWithoutReplacement)", ep,
				func() error {
					_, err := draw(t, b, st, Params{Kind: SliceWithoutReplacement, NumSlices: 3, SliceLen: 5, StrictLength: true}, rng)
					return err
				}())
		}
	}
}

// Draw on an empty buffer is ErrNotReady for every kind.
func TestDrawEmpty(t *testing.T) {
	b := newTestBuffer(t, 10, true)
	for _, kind := range Kinds {
		p := Params{Kind: kind, BatchSize: 2, NumSlices: 1, SliceLen: 2, StrictLength: true}
		if _, err := draw(t, b, NewState(), p, rand.New(rand.NewPCG(1, 1))); !errors.Is(err, ErrNotReady) {
			t.Errorf("%s on an empty buffer: %v, want ErrNotReady", kind, err)
		}
	}
}

// With NextKnown, the exact fallback lists the eligible rows from the
// index's bits: in a ring where one row in 200 has a known next observation
// (one-row trajectories, most of them cut: the rejection budget runs out on
// every draw), uniform and prioritized draws
// return only those rows, uniformly (every priority is the initial one), and
// an Eligible filter on top keeps only the rows it admits.
func TestNextKnownFallbackDistribution(t *testing.T) {
	const capacity, every = 5000, 200
	b := newCompactBuffer(t, capacity, true)
	fillSparse(t, b, 2*capacity, every) // the ring wraps
	var elig, even []int64
	if err := b.ReadIndex(func(ix storage.Index) {
		lo, hi := ix.Window()
		for s := lo; s < hi; s++ {
			if m, ok := ix.Row(s); ok && m.Done && m.HasTail {
				elig = append(elig, s)
				if s%400 == 0 {
					even = append(even, s)
				}
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(elig) != capacity/every {
		t.Fatalf("%d eligible rows, want %d", len(elig), capacity/every)
	}
	every400 := func(_ storage.Index, m storage.RowMeta) bool { return m.Seq%400 == 0 }
	cases := []struct {
		kind     string
		eligible func(storage.Index, storage.RowMeta) bool
		want     []int64
	}{
		{Uniform, nil, elig},
		{Prioritized, nil, elig},
		{Uniform, every400, even},
		{Prioritized, every400, even},
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for _, tc := range cases {
		pos := map[int64]int{}
		for i, s := range tc.want {
			pos[s] = i
		}
		counts := make([]float64, len(tc.want))
		const draws, B = 40, 250
		for range draws {
			sel, err := draw(t, b, NewState(), Params{Kind: tc.kind, BatchSize: B, Beta: 0.4, NextKnown: true, Eligible: tc.eligible}, rng)
			if err != nil {
				t.Fatal(err)
			}
			if len(sel.Seqs) != B {
				t.Fatalf("%s: %d rows, want %d", tc.kind, len(sel.Seqs), B)
			}
			for _, s := range sel.Seqs {
				k, ok := pos[s]
				if !ok {
					t.Fatalf("%s (filter %v): seq %d is not eligible", tc.kind, tc.eligible != nil, s)
				}
				counts[k]++
			}
		}
		exp := make([]float64, len(tc.want))
		for i := range exp {
			exp[i] = draws * B / float64(len(tc.want))
		}
		chi2(t, fmt.Sprintf("%s, NextKnown fallback, filter %v", tc.kind, tc.eligible != nil), counts, exp)
	}
}

// TestPrioritizedRoundsMatchOneAtATime checks that drawing prioritised
// candidates a round at a time (their tree descents side by side) picks the
// rows, weights and leaves the random stream where taking one candidate at
// a time does, the rule a seed promises: with every row admitted, with most
// rejected (many rounds), and with so few admitted that the rejection
// budget runs out and the exact fallback takes over.
func TestPrioritizedRoundsMatchOneAtATime(t *testing.T) {
	b := newTestBuffer(t, 3000, true)
	writeEpisodes(t, b, []int{900, 1100, 1000}, nil)
	rng := rand.New(rand.NewPCG(8, 9))
	var seqs []int64
	var prios []float64
	for s := int64(0); s < 3000; s++ {
		seqs, prios = append(seqs, s), append(prios, 0.01+rng.ExpFloat64())
	}
	if _, _, err := b.UpdatePriorities(seqs, prios); err != nil {
		t.Fatal(err)
	}
	// oneAtATime is the draw before rounds: a candidate, its test, the next.
	oneAtATime := func(ix storage.Index, p Params, rng *rand.Rand) (out []int64, ws []float32) {
		total, qmin := ix.PriorityTotal(), ix.PriorityMinQ()
		for tries := rejectionBudget(p.BatchSize); len(out) < p.BatchSize && tries > 0; tries-- {
			seq := ix.PriorityFind(rng.Float64() * total)
			if admits(ix, p, seq) {
				out, ws = append(out, seq), append(ws, weight(ix.PriorityQ(seq), qmin, p.Beta))
			}
		}
		return out, ws
	}
	for _, tc := range []struct {
		name     string
		eligible func(storage.Index, storage.RowMeta) bool
		batch    int
	}{
		{"all admitted", nil, 256},
		{"a third admitted", func(_ storage.Index, m storage.RowMeta) bool { return m.Seq%3 == 0 }, 256},
		{"one in 500 admitted", func(_ storage.Index, m storage.RowMeta) bool { return m.Seq%500 == 7 }, 64},
		{"batch above a round", func(_ storage.Index, m storage.RowMeta) bool { return m.Seq%2 == 0 }, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Params{Kind: Prioritized, BatchSize: tc.batch, Beta: 0.4, Eligible: tc.eligible}
			for seed := range uint64(5) {
				r1, r2 := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1))
				var sel *Selection
				var want []int64
				var wantW []float32
				if err := b.ReadIndex(func(ix storage.Index) {
					var err error
					if sel, err = drawPrioritized(ix, p, r1); err != nil {
						t.Fatal(err)
					}
					want, wantW = oneAtATime(ix, p, r2)
				}); err != nil {
					t.Fatal(err)
				}
				if len(want) == tc.batch {
					if !slices.Equal(sel.Seqs, want) || !slices.Equal(sel.Weights, wantW) {
						t.Fatalf("seed %d: rounds drew %v, one at a time %v", seed, sel.Seqs[:min(8, len(sel.Seqs))], want[:min(8, len(want))])
					}
				} else if !slices.Equal(sel.Seqs[:len(want)], want) {
					// The budget ran out: the rows before the fallback agree.
					t.Fatalf("seed %d: rounds drew %v before the fallback, one at a time %v", seed, sel.Seqs[:len(want)], want)
				}
				if r1.Uint64() != r2.Uint64() && len(want) == tc.batch {
					t.Fatalf("seed %d: the random streams part after the draw", seed)
				}
			}
		})
	}
}

// TestWithoutReplacementBlocksMatchOneAtATime checks that computing an
// epoch's permutation a block at a time visits the slots, and returns the
// rows, of one entry at a time, batch after batch through a whole epoch,
// with some rows rejected.
func TestWithoutReplacementBlocksMatchOneAtATime(t *testing.T) {
	b := newTestBuffer(t, 3000, false)
	writeEpisodes(t, b, []int{900, 1100, 1000}, nil)
	only := func(_ storage.Index, m storage.RowMeta) bool { return m.Seq%5 != 0 }
	for _, batch := range []int{1, 7, 256, 1500} {
		st, rng := NewState(), rand.New(rand.NewPCG(3, uint64(batch)))
		refRng := rand.New(rand.NewPCG(3, uint64(batch)))
		p := Params{Kind: WithoutReplacement, BatchSize: batch, Eligible: only}
		var ref perm.Perm
		var cursor uint64
		for round := 0; ; round++ {
			sel, err := draw(t, b, st, p, rng)
			if err != nil {
				t.Fatal(err)
			}
			var want []int64
			if err := b.ReadIndex(func(ix storage.Index) {
				if round == 0 {
					ref = perm.New(uint64(epochSlots(ix)), refRng.Uint64())
				}
				for len(want) < batch && cursor < ref.N() {
					seq := ix.SlotSeq(int64(ref.At(cursor)))
					cursor++
					if seq >= 0 && admits(ix, p, seq) {
						want = append(want, seq)
					}
				}
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(sel.Seqs, want) {
				t.Fatalf("batch %d, round %d: blocks drew %v, one at a time %v", batch, round, sel.Seqs[:min(6, len(sel.Seqs))], want[:min(6, len(want))])
			}
			if sel.EpochEnd {
				break
			}
		}
	}
}

// TestUniformBlocksMatchOneAtATime checks that drawing uniform candidates a
// block at a time (so a pass can load their rows first) gives exactly the
// rows, and leaves the rng exactly where, drawing and testing one
// candidate at a time does: with every row eligible, with one in five
// rejected, with next-known rows only, and with a batch larger than the
// block.
func TestUniformBlocksMatchOneAtATime(t *testing.T) {
	b := newTestBuffer(t, 3000, false)
	writeEpisodes(t, b, []int{900, 1100, 1000}, nil)
	notFifth := func(_ storage.Index, m storage.RowMeta) bool { return m.Seq%5 != 0 }
	cases := []Params{
		{Kind: Uniform, BatchSize: 7},
		{Kind: Uniform, BatchSize: 256, Eligible: notFifth},
		{Kind: Uniform, BatchSize: 256, NextKnown: true},
		{Kind: Uniform, BatchSize: 700, Eligible: notFifth},
	}
	for i, p := range cases {
		rng, refRng := rand.New(rand.NewPCG(5, uint64(i))), rand.New(rand.NewPCG(5, uint64(i)))
		sel, err := draw(t, b, NewState(), p, rng)
		if err != nil {
			t.Fatal(err)
		}
		var want []int64
		if err := b.ReadIndex(func(ix storage.Index) {
			lo, hi := ix.Window()
			for tries := rejectionBudget(p.BatchSize); len(want) < p.BatchSize && tries > 0; tries-- {
				if seq := lo + refRng.Int64N(hi-lo); admits(ix, p, seq) {
					want = append(want, seq)
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(sel.Seqs, want) {
			t.Errorf("case %d: blocks drew %v..., one at a time %v...", i, sel.Seqs[:min(6, len(sel.Seqs))], want[:min(6, len(want))])
		}
		if got, want := rng.Uint64(), refRng.Uint64(); got != want {
			t.Errorf("case %d: the rng moved on differently (next value %d, want %d)", i, got, want)
		}
	}
}

// TestReuseMatchesFreshSelections draws with every kind in turn into one
// reused Selection and, with the same seeds, into new ones: the rows,
// weights, flags and epochs must be equal, and so must which optional
// arrays are nil (the answer has a "weight" tensor only when Weights is
// set), however the kinds before left the reused arrays.
func TestReuseMatchesFreshSelections(t *testing.T) {
	b := newTestBuffer(t, 3000, true)
	writeEpisodes(t, b, []int{900, 1100, 1000}, nil)
	cases := []Params{
		{Kind: Uniform, BatchSize: 64},
		{Kind: PrioritizedSlice, NumSlices: 4, SliceLen: 8, StrictLength: false},
		{Kind: Prioritized, BatchSize: 32},
		{Kind: Slice, NumSlices: 8, SliceLen: 4, StrictLength: true},
		{Kind: WithoutReplacement, BatchSize: 100, Consumer: "c"},
		{Kind: Uniform, BatchSize: 300},
		{Kind: SliceWithoutReplacement, NumSlices: 2, SliceLen: 16, StrictLength: false, Consumer: "c"},
		{Kind: Slice, NumSlices: 3, SliceLen: 5, StrictLength: false},
		{Kind: Uniform, BatchSize: 5},
	}
	reused, fresh := NewState(), NewState()
	var keep Selection
	for round := range 2 {
		for i, p := range cases {
			seed := uint64(100*round + i)
			want, err := draw(t, b, fresh, p, rand.New(rand.NewPCG(seed, 1)))
			if err != nil {
				t.Fatal(err)
			}
			p.Reuse = &keep
			got, err := draw(t, b, reused, p, rand.New(rand.NewPCG(seed, 1)))
			if err != nil {
				t.Fatal(err)
			}
			if got != &keep {
				t.Fatalf("case %d: the draw did not return the selection to reuse", i)
			}
			for _, d := range []struct {
				name      string
				same, nil bool
			}{
				{"seqs", slices.Equal(got.Seqs, want.Seqs), (got.Seqs == nil) == (want.Seqs == nil)},
				{"weights", slices.Equal(got.Weights, want.Weights), (got.Weights == nil) == (want.Weights == nil)},
				{"slice_end", slices.Equal(got.SliceEnd, want.SliceEnd), (got.SliceEnd == nil) == (want.SliceEnd == nil)},
				{"mask", slices.Equal(got.Mask, want.Mask), (got.Mask == nil) == (want.Mask == nil)},
			} {
				if !d.same || !d.nil {
					t.Errorf("round %d case %d (%s): reused %s differ from a new selection's (values equal %v, nil-ness equal %v)",
						round, i, p.Kind, d.name, d.same, d.nil)
				}
			}
			if got.NumSlices != want.NumSlices || got.SliceLen != want.SliceLen || got.HasEpoch != want.HasEpoch ||
				got.Epoch != want.Epoch || got.EpochEnd != want.EpochEnd {
				t.Errorf("round %d case %d (%s): shape or epoch %+v, want %+v", round, i, p.Kind,
					[]any{got.NumSlices, got.SliceLen, got.HasEpoch, got.Epoch, got.EpochEnd},
					[]any{want.NumSlices, want.SliceLen, want.HasEpoch, want.Epoch, want.EpochEnd})
			}
		}
	}
}

// TestWeightMatchesPow: weight's exp/log form gives the float32 of
// math.Pow's (q/q_min)^-beta to within one unit in the last place, over
// ratios from 1 to 10^12 and the betas in use (0 to 1).
func TestWeightMatchesPow(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	worst := 0.0
	for range 200000 {
		qmin := math.Exp(rng.Float64()*20 - 10)
		q := qmin * math.Pow(10, rng.Float64()*15-3) // q below q_min too (a stale minimum)
		beta := rng.Float64()
		if rng.IntN(10) == 0 {
			beta = float64(rng.IntN(2)) // 0 and 1 exactly
		}
		want := float32(math.Pow(q/qmin, -beta))
		got := weight(q, qmin, beta)
		ulp := math.Nextafter32(want, float32(math.Inf(1))) - want
		if d := math.Abs(float64(got - want)); d > float64(ulp) {
			t.Fatalf("weight(%g, %g, %g) = %v, math.Pow gives %v", q, qmin, beta, got, want)
		} else if d/float64(ulp) > worst {
			worst = d / float64(ulp)
		}
	}
	if got := weight(3.5, 3.5, 0.4); got != 1 {
		t.Errorf("the rarest row's weight is %v, want exactly 1", got)
	}
	t.Logf("largest difference: %.2f ulp", worst)
}
