package rbd

// Statistical and exact tests of the samplers through Buffer.Sample (design
// "Testing the claims", semantics A2 and C, style rule 14). Every test uses
// fixed seeds; a statistical check fails when its p-value is below 1e-4.
//
// The first part of this file holds helpers shared with property_test.go and
// request_test.go: a model of what was written (rtModel), a writer that feeds
// the same rows to several buffers and the model (rtExtend), and the
// chi-square / Kolmogorov-Smirnov checks.

import (
	"context"
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

	"github.com/rbdb/rbd/storage"
)

// ---------------------------------------------------------------------------
// Shared helpers.

// rtIn is one row as a writer produces it: observation = [obs, obs+0.5],
// next is the true next observation (stored as next.observation by
// non-compact buffers, sent as the final observation on done rows of compact
// ones).
type rtIn struct {
	env            int64
	obs, next, rew float32
	term, trnc     bool
}

func (r rtIn) done() bool { return r.term || r.trnc }

// rtRow is a written row as the model sees it.
type rtRow struct {
	rtIn
	seq    int64
	stream string
	traj   int   // model trajectory number, in order of first row
	step   int64 // index within the trajectory
	tail   bool  // compact buffers: its final observation was sent
}

// rtModel mirrors the ring: rows by seq, trajectories by the (stream, env)
// rules of the design (a done row ends a trajectory, closing a stream or the
// end of an anonymous request closes the open ones).
type rtModel struct {
	capacity int64
	rows     []rtRow
	trajs    [][]int64                // model trajectory -> its seqs
	open     map[string]map[int64]int // stream -> env -> open trajectory
	isOpen   map[int]bool
}

func newRTModel(capacity int64) *rtModel {
	return &rtModel{capacity: capacity, open: map[string]map[int64]int{}, isOpen: map[int]bool{}}
}

func (m *rtModel) wc() int64 { return int64(len(m.rows)) }
func (m *rtModel) lo() int64 { return max(0, m.wc()-m.capacity) }

func (m *rtModel) live(seq int64) bool { return seq >= m.lo() && seq < m.wc() }

func (m *rtModel) liveSeqs() []int64 {
	var out []int64
	for s := m.lo(); s < m.wc(); s++ {
		out = append(out, s)
	}
	return out
}

// nextSeq returns the row after seq in its trajectory, or -1.
func (m *rtModel) nextSeq(seq int64) int64 {
	r := m.rows[seq]
	tr := m.trajs[r.traj]
	if int(r.step)+1 < len(tr) {
		return tr[r.step+1]
	}
	return -1
}

// prevSeq returns the row before seq in its trajectory (live or not), or -1.
func (m *rtModel) prevSeq(seq int64) int64 {
	r := m.rows[seq]
	if r.step == 0 {
		return -1
	}
	return m.trajs[r.traj][r.step-1]
}

// known reports whether a compact buffer knows the next observation of a
// live row: the final observation of a done row whose tail was sent, or the
// observation of the following row of its trajectory.
func (m *rtModel) known(seq int64) bool {
	r := m.rows[seq]
	if r.done() {
		return r.tail
	}
	return m.nextSeq(seq) >= 0
}

// liveTrajs returns every trajectory with live rows: its live seqs in time
// order.
func (m *rtModel) liveTrajs() map[int][]int64 {
	out := map[int][]int64{}
	for s := m.lo(); s < m.wc(); s++ {
		out[m.rows[s].traj] = append(out[m.rows[s].traj], s)
	}
	return out
}

// openCount returns how many trajectories with live rows are still open.
func (m *rtModel) openCount() int {
	n := 0
	for tr, ok := range m.isOpen {
		if ok && m.live(m.trajs[tr][len(m.trajs[tr])-1]) {
			n++
		}
	}
	return n
}

func (m *rtModel) apply(stream string, in []rtIn, sendTail bool) {
	envs := m.open[stream]
	if envs == nil {
		envs = map[int64]int{}
		m.open[stream] = envs
	}
	for _, r := range in {
		tr, ok := envs[r.env]
		if !ok {
			tr = len(m.trajs)
			m.trajs = append(m.trajs, nil)
			envs[r.env] = tr
			m.isOpen[tr] = true
		}
		seq := m.wc()
		m.rows = append(m.rows, rtRow{rtIn: r, seq: seq, stream: stream, traj: tr, step: int64(len(m.trajs[tr])), tail: sendTail && r.done()})
		m.trajs[tr] = append(m.trajs[tr], seq)
		if r.done() {
			delete(envs, r.env)
			m.isOpen[tr] = false
		}
	}
	if stream == "" {
		m.closeStream("")
	}
}

func (m *rtModel) closeStream(stream string) {
	for _, tr := range m.open[stream] {
		m.isOpen[tr] = false
	}
	delete(m.open, stream)
}

// rtF32 appends little-endian float32s.
func rtF32(b []byte, vals ...float32) []byte {
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// rtBatch encodes rows for a testSpec buffer. Compact buffers get the final
// observations of the done rows (one per done row) when sendTail is set and
// no next.observation at all otherwise.
func rtBatch(compact bool, in []rtIn, sendTail bool) *storage.Batch {
	var obs, nobs, rew, done, term, trunc, tail []byte
	env := make([]int64, len(in))
	for i, r := range in {
		obs = rtF32(obs, r.obs, r.obs+0.5)
		nobs = rtF32(nobs, r.next, r.next+0.5)
		rew = rtF32(rew, r.rew)
		done, term, trunc = append(done, u8(r.done())), append(term, u8(r.term)), append(trunc, u8(r.trnc))
		if r.done() {
			tail = rtF32(tail, r.next, r.next+0.5)
		}
		env[i] = r.env
	}
	fields := map[string][]byte{"observation": obs, "next.reward": rew, "next.done": done, "next.terminated": term, "next.truncated": trunc}
	switch {
	case !compact:
		fields["next.observation"] = nobs
	case sendTail:
		if tail == nil {
			tail = []byte{}
		}
		fields["next.observation"] = tail
	}
	return &storage.Batch{Rows: len(in), Fields: fields, Env: env}
}

// rtExtend writes the same rows to every buffer (each encoded for its own
// spec) and records them in the model.
func rtExtend(t testing.TB, m *rtModel, stream string, in []rtIn, sendTail bool, bufs ...*Buffer) {
	t.Helper()
	for _, b := range bufs {
		res, err := b.Extend(stream, rtBatch(b.Spec().CompactObs, in, sendTail))
		if err != nil {
			t.Fatalf("extend %s: %v", b.Name(), err)
		}
		if res.FirstSeq != m.wc() {
			t.Fatalf("extend %s: first_seq %d, model expects %d", b.Name(), res.FirstSeq, m.wc())
		}
	}
	m.apply(stream, in, sendTail)
}

func rtCloseStream(t testing.TB, m *rtModel, stream string, bufs ...*Buffer) {
	t.Helper()
	for _, b := range bufs {
		if _, err := b.CloseStream(stream); err != nil {
			t.Fatal(err)
		}
	}
	m.closeStream(stream)
}

// rtGen simulates envs: each (stream, env) has a current observation; a step
// moves to a fresh value, a done resets to another fresh value. All values
// are distinct small integers, exact in float32.
type rtGen struct {
	counter float32
	cur     map[string]float32
}

func newRTGen() *rtGen { return &rtGen{cur: map[string]float32{}} }

func (g *rtGen) fresh() float32 { g.counter++; return g.counter }

func (g *rtGen) step(stream string, env int64, rew float32, term, trnc bool) rtIn {
	key := stream + "/" + strconv.FormatInt(env, 10)
	o, ok := g.cur[key]
	if !ok {
		o = g.fresh()
	}
	next := g.fresh()
	if term || trnc {
		g.cur[key] = g.fresh() // reset
	} else {
		g.cur[key] = next
	}
	return rtIn{env: env, obs: o, next: next, rew: rew, term: term, trnc: trnc}
}

// rtEpisode returns the rows of one whole episode of n steps on (stream,
// env), ending terminated or truncated (open: no done at all).
func (g *rtGen) episode(stream string, env int64, n int, end string) []rtIn {
	var out []rtIn
	for i := 0; i < n; i++ {
		last := i == n-1
		out = append(out, g.step(stream, env, float32(i%7)-2, last && end == "term", last && end == "trnc"))
	}
	return out
}

func rtCreate(t testing.TB, db *DB, name string, spec storage.Spec) *Buffer {
	t.Helper()
	b, _, err := db.CreateBuffer(name, spec)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return b
}

// rtTrySample calls Buffer.Sample and turns a panic into an error, so one
// broken path fails its test instead of the whole binary.
func rtTrySample(b *Buffer, req *SampleRequest) (got *Batch, err error) {
	defer func() {
		if r := recover(); r != nil {
			got, err = nil, fmt.Errorf("Sample panicked: %v", r)
		}
	}()
	return b.Sample(context.Background(), req, nil)
}

func rtSample(t testing.TB, b *Buffer, req SampleRequest) *Batch {
	t.Helper()
	got, err := rtTrySample(b, &req)
	if err != nil {
		t.Fatalf("sample %s %+v: %v", b.Name(), req, err)
	}
	return got
}

// rtMetas returns the row metadata of seqs (Seq -1 for padding or dead rows).
func rtMetas(t testing.TB, b *Buffer, seqs []int64) []storage.RowMeta {
	t.Helper()
	meta := make([]storage.RowMeta, len(seqs))
	if _, err := b.Gather(seqs, nil, nil, meta); err != nil {
		t.Fatal(err)
	}
	return meta
}

// rtChi2 checks observed counts against expected counts with len(obs)-1
// degrees of freedom and returns the p-value.
func rtChi2(t testing.TB, what string, obs, exp []float64) float64 {
	t.Helper()
	return rtChi2DF(t, what, stat.ChiSquare(obs, exp), len(obs)-1)
}

// rtChi2DF checks a chi-square statistic with df degrees of freedom.
func rtChi2DF(t testing.TB, what string, x2 float64, df int) float64 {
	t.Helper()
	if df < 1 {
		t.Fatalf("%s: %d degrees of freedom", what, df)
	}
	p := distuv.ChiSquared{K: float64(df)}.Survival(x2)
	t.Logf("%s: chi2=%.1f df=%d p=%.3g", what, x2, df, p)
	if p < 1e-4 {
		t.Errorf("%s: rejected: chi2=%.1f df=%d p=%.2g", what, x2, df, p)
	}
	return p
}

// rtPoisson checks a count of rare events against a Poisson law of mean
// lambda (two-sided, p > 1e-4).
func rtPoisson(t testing.TB, what string, k int, lambda float64) {
	t.Helper()
	d := distuv.Poisson{Lambda: lambda}
	hi := 1 - d.CDF(float64(k)-1) // P(X >= k)
	lo := d.CDF(float64(k))       // P(X <= k)
	t.Logf("%s: %d events, %.3g expected, P(X>=k)=%.3g P(X<=k)=%.3g", what, k, lambda, hi, lo)
	if min(hi, lo) < 1e-4 {
		t.Errorf("%s: %d events where %.3g are expected (Poisson p=%.2g)", what, k, lambda, min(hi, lo))
	}
}

// rtKSUniform runs a one-sample Kolmogorov-Smirnov test of xs against U(0,1)
// (asymptotic Kolmogorov distribution with Stephens' correction).
func rtKSUniform(t testing.TB, what string, xs []float64) float64 {
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
		if math.Abs(term) < 1e-12 {
			break
		}
	}
	p = min(max(p, 0), 1)
	t.Logf("%s: KS D=%.4g n=%d p=%.3g", what, d, len(xs), p)
	if p < 1e-4 {
		t.Errorf("%s: KS rejected uniformity: D=%.4g n=%d p=%.2g", what, d, len(xs), p)
	}
	return p
}

// rtPrioSpec is testSpec with PER settings alpha, eps.
func rtPrioSpec(kind storage.Kind, capacity int64, compact bool, alpha, eps float64) storage.Spec {
	s := testSpec(kind, capacity, compact, false)
	s.Priority = &storage.PriorityOptions{Alpha: alpha, Eps: eps}
	return s
}

// rtCheckRows checks that every real row of a batch holds what the model
// wrote at its seq (observation, traj, step) and that traj ids map one to
// one onto model trajectories.
func rtCheckRows(t *testing.T, m *rtModel, got *Batch, trajMap map[int64]int) {
	t.Helper()
	seqs, trajs, steps := i64s(t, got, "seq"), i64s(t, got, "traj_id"), i64s(t, got, "step")
	obs := f32s(t, got, "observation")
	for i, s := range seqs {
		if s < 0 {
			continue
		}
		if !m.live(s) {
			t.Fatalf("row %d: seq %d is not live (live range [%d, %d))", i, s, m.lo(), m.wc())
		}
		r := m.rows[s]
		if obs[2*i] != r.obs || obs[2*i+1] != r.obs+0.5 {
			t.Fatalf("row %d seq %d: observation %v, wrote %v", i, s, obs[2*i:2*i+2], r.obs)
		}
		if steps[i] != r.step {
			t.Fatalf("row %d seq %d: step %d, model step %d", i, s, steps[i], r.step)
		}
		if mt, ok := trajMap[trajs[i]]; ok && mt != r.traj {
			t.Fatalf("seq %d: traj_id %d names model trajectory %d and %d", s, trajs[i], mt, r.traj)
		}
		trajMap[trajs[i]] = r.traj
	}
}

// ---------------------------------------------------------------------------
// Uniform.

// A ring wrapped so that one trajectory is partly overwritten and the
// newest one is still open: uniform draws are uniform over the live rows
// (chi-square per seq, and KS on the jittered rank), never outside them.
func TestStatUniformWrappedRing(t *testing.T) {
	for _, kind := range []storage.Kind{storage.KindMemory, storage.KindMemmap} {
		t.Run(string(kind), func(t *testing.T) {
			const capacity = 250
			db := openDB(t)
			buf := rtCreate(t, db, "u", testSpec(kind, capacity, false, false))
			m, g := newRTModel(capacity), newRTGen()
			var rows []rtIn
			for i, n := range []int{100, 120, 90, 80, 70} {
				end := []string{"term", "trnc", "term", "trnc", "open"}[i]
				rows = append(rows, g.episode("s", 0, n, end)...)
			}
			for len(rows) > 0 {
				k := min(37, len(rows))
				rtExtend(t, m, "s", rows[:k], false, buf)
				rows = rows[k:]
			}
			lo := m.lo()
			// The second trajectory (seqs 100..219) keeps only 210..219.
			if lo != 210 || m.rows[lo].step != 110 {
				t.Fatalf("setup: lo=%d step=%d", lo, m.rows[lo].step)
			}
			const batches, bs = 50, 1000
			counts := make([]float64, capacity)
			jitter := rand.New(rand.NewPCG(7, 7))
			var ranks []float64
			trajMap := map[int64]int{}
			for i := 0; i < batches; i++ {
				got := rtSample(t, buf, SampleRequest{BatchSize: bs, Seed: seed(uint64(i))})
				rtCheckRows(t, m, got, trajMap)
				for _, s := range i64s(t, got, "seq") {
					counts[s-lo]++
					ranks = append(ranks, (float64(s-lo)+jitter.Float64())/capacity)
				}
			}
			exp := make([]float64, capacity)
			for i := range exp {
				exp[i] = batches * bs / capacity
			}
			rtChi2(t, "uniform over live seqs", counts, exp)
			rtKSUniform(t, "uniform over live seqs", ranks)
		})
	}
}

// rtCompactMix writes, into a compact buffer, rows of every kind of
// next-observation status: done rows with a final observation, done rows
// without one, open trajectories (newest row unknown) and a trajectory cut
// by closing its stream; the ring wraps.
func rtCompactMix(t *testing.T, m *rtModel, g *rtGen, bufs ...*Buffer) {
	rng := rand.New(rand.NewPCG(11, 12))
	for round := 0; round < 6; round++ {
		// Episodes with final observations, two envs interleaved.
		var in []rtIn
		a, b := g.episode("a", 0, 5+rng.IntN(15), "term"), g.episode("a", 1, 5+rng.IntN(15), "trnc")
		for len(a)+len(b) > 0 {
			if len(b) == 0 || (len(a) > 0 && rng.IntN(2) == 0) {
				in, a = append(in, a[0]), a[1:]
			} else {
				in, b = append(in, b[0]), b[1:]
			}
		}
		rtExtend(t, m, "a", in, true, bufs...)
		// Episodes whose writer did not send the final observation.
		rtExtend(t, m, "a", g.episode("a", 2, 3+rng.IntN(8), "term"), false, bufs...)
		// A stream cut mid-episode.
		rtExtend(t, m, "c", g.episode("c", 0, 4+rng.IntN(6), "open"), true, bufs...)
		rtCloseStream(t, m, "c", bufs...)
	}
	// Open trajectories: three envs of stream "b" still running.
	for e := int64(0); e < 3; e++ {
		rtExtend(t, m, "b", g.episode("b", e, 2+int(e), "open"), true, bufs...)
	}
}

// On a compact buffer uniform never returns a row whose next observation is
// unknown, and is uniform over the others; with include_incomplete it is
// uniform over all live rows and flags the unknown ones invalid, zero-filled
// (NaN with fill "nan").
func TestStatUniformCompactEligibility(t *testing.T) {
	const capacity = 200
	db := openDB(t)
	buf := rtCreate(t, db, "c", testSpec(storage.KindMemory, capacity, true, false))
	m, g := newRTModel(capacity), newRTGen()
	rtCompactMix(t, m, g, buf)
	if m.wc() <= capacity {
		t.Fatalf("setup: ring did not wrap (%d rows)", m.wc())
	}
	var known, unknown []int64
	for _, s := range m.liveSeqs() {
		if m.known(s) {
			known = append(known, s)
		} else {
			unknown = append(unknown, s)
		}
	}
	t.Logf("%d live rows, %d with unknown next", len(known)+len(unknown), len(unknown))
	if len(unknown) < 8 {
		t.Fatalf("setup: only %d rows with unknown next", len(unknown))
	}
	pos := map[int64]int{}
	for i, s := range known {
		pos[s] = i
	}
	const bs = 1000
	trajMap := map[int64]int{}

	t.Run("eligible only", func(t *testing.T) {
		counts := make([]float64, len(known))
		const batches = 50
		for i := 0; i < batches; i++ {
			got := rtSample(t, buf, SampleRequest{BatchSize: bs, Seed: seed(uint64(100 + i))})
			rtCheckRows(t, m, got, trajMap)
			no := f32s(t, got, "next.observation")
			if _, ok := got.Tensor("next.observation_valid"); ok {
				t.Fatalf("next.observation_valid returned without include_incomplete")
			}
			for j, s := range i64s(t, got, "seq") {
				k, ok := pos[s]
				if !ok {
					t.Fatalf("seq %d sampled, but its next observation is unknown (done=%v tail=%v next=%d)", s, m.rows[s].done(), m.rows[s].tail, m.nextSeq(s))
				}
				if no[2*j] != m.rows[s].next || no[2*j+1] != m.rows[s].next+0.5 {
					t.Fatalf("seq %d: next.observation %v, want %v", s, no[2*j:2*j+2], m.rows[s].next)
				}
				counts[k]++
			}
		}
		exp := make([]float64, len(known))
		for i := range exp {
			exp[i] = float64(batches*bs) / float64(len(known))
		}
		rtChi2(t, "uniform over rows with a known next", counts, exp)
	})

	for _, fill := range []string{"", "nan"} {
		t.Run("include_incomplete fill="+fill, func(t *testing.T) {
			lo := m.lo()
			counts := make([]float64, capacity)
			batches := 30
			if fill == "nan" {
				batches = 5
			}
			for i := 0; i < batches; i++ {
				got := rtSample(t, buf, SampleRequest{BatchSize: bs, Seed: seed(uint64(200 + i)), IncludeIncomplete: true, Fill: fill})
				rtCheckRows(t, m, got, trajMap)
				no, valid := f32s(t, got, "next.observation"), bools(t, got, "next.observation_valid")
				for j, s := range i64s(t, got, "seq") {
					counts[s-lo]++
					want := m.known(s)
					if valid[j] != want {
						t.Fatalf("seq %d: valid=%v, model says %v", s, valid[j], want)
					}
					v := no[2*j : 2*j+2]
					switch {
					case want && (v[0] != m.rows[s].next || v[1] != m.rows[s].next+0.5):
						t.Fatalf("seq %d: next.observation %v, want %v", s, v, m.rows[s].next)
					case !want && fill == "" && (v[0] != 0 || v[1] != 0):
						t.Fatalf("seq %d: invalid next.observation %v, want zeros", s, v)
					case !want && fill == "nan" && !(math.IsNaN(float64(v[0])) && math.IsNaN(float64(v[1]))):
						t.Fatalf("seq %d: invalid next.observation %v, want NaN", s, v)
					}
				}
			}
			if fill == "nan" {
				return
			}
			exp := make([]float64, capacity)
			for i := range exp {
				exp[i] = float64(batches*bs) / capacity
			}
			rtChi2(t, "include_incomplete uniform over all live rows", counts, exp)
		})
	}
}

// ---------------------------------------------------------------------------
// Prioritized.

// Frequencies match q_i / sum q with q = (p + eps)^alpha (alpha 0.6, eps
// 1e-6) on a wrapped ring with varied priorities, rows of priority zero get
// only their eps mass, and every weight is (q_i / q_min)^-beta.
func TestStatPrioritized(t *testing.T) {
	const capacity, alpha, eps, beta = 200, 0.6, 1e-6, 0.5
	db := openDB(t)
	buf := rtCreate(t, db, "p", rtPrioSpec(storage.KindMemory, capacity, false, alpha, eps))
	m, g := newRTModel(capacity), newRTGen()
	for i := 0; i < 13; i++ {
		rtExtend(t, m, "s", g.episode("s", int64(i%3), 20, "term"), false, buf)
	}
	live := m.liveSeqs()
	rng := rand.New(rand.NewPCG(3, 4))
	prio := map[int64]float64{}
	var seqs []int64
	var vals []float64
	for i, s := range live {
		p := math.Exp(math.Log(0.1) + rng.Float64()*math.Log(100)) // log-uniform in [0.1, 10]
		if i%10 == 3 {
			p = 0
		}
		prio[s] = p
		seqs, vals = append(seqs, s), append(vals, p)
	}
	seqs, vals = append(seqs, m.lo()-1), append(vals, 5) // overwritten: stale
	if u, st, err := buf.UpdatePriorities(seqs, vals); err != nil || u != len(live) || st != 1 {
		t.Fatalf("update priorities: updated %d stale %d err %v", u, st, err)
	}
	q := func(p float64) float64 { return math.Pow(p+eps, alpha) }
	qmin, qsumPos := math.Inf(1), 0.0
	for _, p := range prio {
		qmin = min(qmin, q(p))
		if p > 0 {
			qsumPos += q(p)
		}
	}
	counts := map[int64]float64{}
	zeroDraws := 0
	const batches, bs = 100, 1000
	for i := 0; i < batches; i++ {
		got := rtSample(t, buf, SampleRequest{Sampler: "prioritized", BatchSize: bs, Seed: seed(uint64(i)), Beta: ptr(beta)})
		w := f32s(t, got, "weight")
		for j, s := range i64s(t, got, "seq") {
			p, ok := prio[s]
			if !ok {
				t.Fatalf("seq %d drawn, not live", s)
			}
			want := float32(math.Pow(q(p)/qmin, -beta))
			if math.Abs(float64(w[j]-want)) > 2e-7*float64(want) {
				t.Fatalf("seq %d (p=%g): weight %g, want (q/q_min)^-beta = %g", s, p, w[j], want)
			}
			if p == 0 {
				zeroDraws++
				continue
			}
			counts[s]++
		}
	}
	// Rows of priority 0 hold only eps^alpha each: a couple of draws in
	// all, Poisson distributed.
	qzero := q(0) * float64(len(live)/10)
	rtPoisson(t, "rows of priority 0", zeroDraws, batches*bs*qzero/(qsumPos+qzero))
	n := float64(batches*bs - zeroDraws)
	var obs, exp []float64
	for _, s := range live {
		if prio[s] > 0 {
			obs = append(obs, counts[s])
			exp = append(exp, n*q(prio[s])/qsumPos)
		}
	}
	rtChi2(t, "prioritized frequencies vs q_i/sum q", obs, exp)
}

// With eps = 0, rows of priority 0 are never drawn. Their q is 0, so q_min
// over the stored range is 0 and (q_i/q_min)^-beta is undefined: TorchRL
// refuses to sample (RuntimeError); whatever rbd does, it must not hand out
// weights that are all 0 (a loss multiplied by them learns nothing).
func TestPrioritizedEpsZero(t *testing.T) {
	db := openDB(t)
	buf := rtCreate(t, db, "p0", rtPrioSpec(storage.KindMemory, 64, false, 0.6, 0))
	m, g := newRTModel(64), newRTGen()
	rtExtend(t, m, "s", g.episode("s", 0, 40, "term"), false, buf)
	var seqs []int64
	var vals []float64
	for _, s := range m.liveSeqs() {
		seqs = append(seqs, s)
		vals = append(vals, float64(s%4)) // every fourth row has priority 0
	}
	if _, _, err := buf.UpdatePriorities(seqs, vals); err != nil {
		t.Fatal(err)
	}
	got, err := buf.Sample(context.Background(), &SampleRequest{Sampler: "prioritized", BatchSize: 20000, Seed: seed(1)}, nil)
	if err != nil {
		t.Logf("eps=0 with zero priorities: sample refused: %v", err)
		return
	}
	w := f32s(t, got, "weight")
	bad := 0
	// The rows that can be drawn have q = p^0.6 with p in {1, 2, 3}: the
	// weight normalised over them is (q/q(1))^-0.4.
	for i, s := range i64s(t, got, "seq") {
		if s%4 == 0 {
			t.Fatalf("seq %d of priority 0 drawn with eps=0", s)
		}
		if !(w[i] > 0 && w[i] <= 1) {
			bad++
			continue
		}
		if want := float32(math.Pow(math.Pow(float64(s%4), 0.6), -0.4)); math.Abs(float64(w[i]-want)) > 2e-7 {
			t.Fatalf("seq %d (priority %d): weight %v, want (q/q_min)^-beta = %v over the rows of positive q", s, s%4, w[i], want)
		}
	}
	if bad > 0 {
		t.Errorf("BUG: eps=0 and some priority 0: %d of %d weights are outside (0, 1] (first: %v); "+
			"q_min is 0 so (q_i/q_min)^-beta collapses to 0 (sampler/sampler.go weight, storage PriorityMinQ); "+
			"expected an error (as TorchRL) or weights normalised over the rows that can be drawn", bad, len(w), w[0])
	}
}

// ---------------------------------------------------------------------------
// Slices.

// rtSkewed writes trajectories of skewed lengths (most shorter than 8),
// interleaved over several envs so no trajectory is adjacent in storage,
// with the ring wrapped through a long first trajectory and one long
// trajectory left open.
func rtSkewed(t *testing.T, m *rtModel, g *rtGen, bufs ...*Buffer) {
	rng := rand.New(rand.NewPCG(21, 22))
	rtExtend(t, m, "s", g.episode("s", 9, 60, "term"), true, bufs...)
	lens := []int{8, 9, 11, 13, 16, 20}
	for i := 0; i < 50; i++ {
		lens = append(lens, 1+rng.IntN(7))
	}
	rng.Shuffle(len(lens), func(i, j int) { lens[i], lens[j] = lens[j], lens[i] })
	// Four envs run the episodes one after another.
	queues := make([][]rtIn, 4)
	for i, n := range lens {
		e := int64(i % 4)
		end := "term"
		if i%3 == 0 {
			end = "trnc"
		}
		queues[e] = append(queues[e], g.episode("s", e, n, end)...)
	}
	queues = append(queues, g.episode("s", 4, 12, "open"))
	for {
		var batch []rtIn
		for len(batch) < 17 {
			var nonEmpty []int
			for e, q := range queues {
				if len(q) > 0 {
					nonEmpty = append(nonEmpty, e)
				}
			}
			if len(nonEmpty) == 0 {
				break
			}
			e := nonEmpty[rng.IntN(len(nonEmpty))]
			batch = append(batch, queues[e][0])
			queues[e] = queues[e][1:]
		}
		if len(batch) == 0 {
			break
		}
		rtExtend(t, m, "s", batch, true, bufs...)
	}
}

// rtSliceParts splits a slice batch into its slices: for each, the real
// seqs and the live trajectory (model number) and start position they come
// from. It checks the layout contract on the way: slices are runs of
// consecutive live rows of one trajectory in time order, mask (non-strict)
// is true exactly on the real prefix, slice_end at its last real row,
// padding holds seq/traj_id/step -1, zero data and weight 0.
func rtSliceParts(t *testing.T, m *rtModel, got *Batch, S, L int, strict bool) (trajs []int, starts []int, lens []int) {
	t.Helper()
	seqs, tids, steps := i64s(t, got, "seq"), i64s(t, got, "traj_id"), i64s(t, got, "step")
	se := bools(t, got, "slice_end")
	obs, rew := f32s(t, got, "observation"), f32s(t, got, "next.reward")
	if ts, _ := got.Tensor("seq"); !slices.Equal(ts.Shape, []int{S, L}) {
		t.Fatalf("seq shape %v, want [%d %d]", ts.Shape, S, L)
	}
	mask, hasMask := got.Tensor("mask")
	if hasMask == strict {
		t.Fatalf("mask returned=%v with strict_length=%v", hasMask, strict)
	}
	var w []float32
	if _, ok := got.Tensor("weight"); ok {
		w = f32s(t, got, "weight")
	}
	lt := m.liveTrajs()
	for k := 0; k < S; k++ {
		row := seqs[k*L : (k+1)*L]
		l := 0
		for l < L && row[l] >= 0 {
			l++
		}
		if l == 0 {
			t.Fatalf("slice %d is empty: %v", k, row)
		}
		if strict && l != L {
			t.Fatalf("slice %d: %d real rows with strict_length", k, l)
		}
		for i := 0; i < L; i++ {
			j := k*L + i
			if se[j] != (i == l-1) {
				t.Fatalf("slice %d: slice_end %v, want true only at %d", k, se[k*L:(k+1)*L], l-1)
			}
			if hasMask && (mask.Data[j] != 0) != (i < l) {
				t.Fatalf("slice %d: mask %v, want true on the first %d", k, mask.Data[k*L:(k+1)*L], l)
			}
			if i >= l {
				if row[i] != -1 || tids[j] != -1 || steps[j] != -1 {
					t.Fatalf("slice %d pad %d: seq %d traj %d step %d, want -1", k, i, row[i], tids[j], steps[j])
				}
				if obs[2*j] != 0 || obs[2*j+1] != 0 || rew[j] != 0 {
					t.Fatalf("slice %d pad %d: data %v %v, want zeros", k, i, obs[2*j:2*j+2], rew[j])
				}
				if w != nil && w[j] != 0 {
					t.Fatalf("slice %d pad %d: weight %v, want 0", k, i, w[j])
				}
			}
		}
		tr := m.rows[row[0]].traj
		ls := lt[tr]
		start := slices.Index(ls, row[0])
		if start < 0 || start+l > len(ls) || !slices.Equal(ls[start:start+l], row[:l]) {
			t.Fatalf("slice %d %v is not a run of trajectory %d's live rows %v", k, row[:l], tr, ls)
		}
		if !strict && l != min(L, len(ls)-start) {
			t.Fatalf("slice %d: %d real rows, but trajectory %d has %d live rows from position %d", k, l, tr, len(ls), start)
		}
		for i := 0; i < l-1; i++ {
			if m.rows[row[i]].done() {
				t.Fatalf("slice %d crosses a done at position %d", k, i)
			}
		}
		trajs, starts, lens = append(trajs, tr), append(starts, start), append(lens, l)
	}
	return trajs, starts, lens
}

// rtStartChi2 tests, conditional on the trajectory, that starts are uniform
// over nStarts(t) positions, by pooling per-trajectory chi-squares.
func rtStartChi2(t *testing.T, what string, trajs, starts []int, nStarts func(tr int) int) {
	t.Helper()
	per := map[int][]float64{}
	for i, tr := range trajs {
		if per[tr] == nil {
			per[tr] = make([]float64, nStarts(tr))
		}
		if starts[i] >= len(per[tr]) {
			t.Fatalf("%s: trajectory %d: start %d outside [0, %d)", what, tr, starts[i], len(per[tr]))
		}
		per[tr][starts[i]]++
	}
	x2, df := 0.0, 0
	for _, c := range per {
		if len(c) < 2 {
			continue
		}
		total := 0.0
		for _, v := range c {
			total += v
		}
		e := total / float64(len(c))
		for _, v := range c {
			x2 += (v - e) * (v - e) / e
		}
		df += len(c) - 1
	}
	rtChi2DF(t, what, x2, df)
}

// Strict slices: trajectories are equiprobable among those with at least
// slice_len live rows (most are shorter here), and given the trajectory the
// start is uniform over [0, len-L].
func TestStatSliceStrict(t *testing.T) {
	const L = 8
	db := openDB(t)
	m, g := newRTModel(0), newRTGen()
	// Size the ring so the 60-row first trajectory keeps 25 live rows.
	probe := newRTModel(1 << 30)
	rtSkewed(t, probe, newRTGen())
	capacity := probe.wc() - 35
	m.capacity = capacity
	buf := rtCreate(t, db, "s", testSpec(storage.KindMemory, capacity, true, false))
	rtSkewed(t, m, g, buf)
	lt := m.liveTrajs()
	var long []int
	short := 0
	for tr, s := range lt {
		if len(s) >= L {
			long = append(long, tr)
		} else {
			short++
		}
	}
	t.Logf("%d live trajectories, %d with >= %d rows", len(lt), len(long), L)
	if short < 3*len(long) {
		t.Fatalf("setup: lengths not skewed (%d short, %d long)", short, len(long))
	}
	const S, calls = 100, 200
	var trajs, starts []int
	trajMap := map[int64]int{}
	for i := 0; i < calls; i++ {
		got := rtSample(t, buf, SampleRequest{Sampler: "slice", NumSlices: S, SliceLen: L, Seed: seed(uint64(i))})
		rtCheckRows(t, m, got, trajMap)
		tr, st, _ := rtSliceParts(t, m, got, S, L, true)
		trajs, starts = append(trajs, tr...), append(starts, st...)
	}
	count := map[int]float64{}
	for _, tr := range trajs {
		if len(lt[tr]) < L {
			t.Fatalf("strict slice from trajectory %d of %d live rows", tr, len(lt[tr]))
		}
		count[tr]++
	}
	var obs, exp []float64
	for _, tr := range long {
		obs = append(obs, count[tr])
		exp = append(exp, float64(len(trajs))/float64(len(long)))
	}
	rtChi2(t, "strict slices: trajectory choice", obs, exp)
	rtStartChi2(t, "strict slices: start given trajectory", trajs, starts, func(tr int) int { return len(lt[tr]) - L + 1 })
}

// Non-strict slices: every trajectory is equiprobable, the start is uniform
// over [0, len - min(L, len)], and short slices are padded (checked by
// rtSliceParts).
func TestStatSliceNonStrict(t *testing.T) {
	const L = 8
	db := openDB(t)
	m := newRTModel(0)
	probe := newRTModel(1 << 30)
	rtSkewed(t, probe, newRTGen())
	m.capacity = probe.wc() - 35
	buf := rtCreate(t, db, "s", testSpec(storage.KindMemory, m.capacity, true, false))
	rtSkewed(t, m, newRTGen(), buf)
	lt := m.liveTrajs()
	const S, calls = 100, 150
	var trajs, starts []int
	trajMap := map[int64]int{}
	padded := 0
	for i := 0; i < calls; i++ {
		got := rtSample(t, buf, SampleRequest{Sampler: "slice", BatchSize: S * L, SliceLen: L, StrictLength: ptr(false), Seed: seed(uint64(i))})
		rtCheckRows(t, m, got, trajMap)
		tr, st, ls := rtSliceParts(t, m, got, S, L, false)
		for _, l := range ls {
			if l < L {
				padded++
			}
		}
		trajs, starts = append(trajs, tr...), append(starts, st...)
	}
	if padded == 0 {
		t.Fatalf("no padded slice in %d", len(trajs))
	}
	count := map[int]float64{}
	for _, tr := range trajs {
		count[tr]++
	}
	var obs, exp []float64
	for tr := range lt {
		obs = append(obs, count[tr])
		exp = append(exp, float64(len(trajs))/float64(len(lt)))
	}
	rtChi2(t, "non-strict slices: trajectory choice", obs, exp)
	rtStartChi2(t, "non-strict slices: start given trajectory", trajs, starts, func(tr int) int { return len(lt[tr]) - min(L, len(lt[tr])) + 1 })
}

// prioritized_slice: strict starts are drawn with probability proportional
// to q among the valid starts (positions with L live rows from them), and
// each slice carries its start row's weight on every row. Non-strict ones
// may start anywhere, in proportion to q, padded with weight 0.
func TestStatPrioritizedSlice(t *testing.T) {
	const L, alpha, eps, beta = 6, 0.6, 1e-6, 0.4
	db := openDB(t)
	m := newRTModel(0)
	probe := newRTModel(1 << 30)
	rtSkewed(t, probe, newRTGen())
	m.capacity = probe.wc() - 35
	buf := rtCreate(t, db, "ps", rtPrioSpec(storage.KindMemory, m.capacity, false, alpha, eps))
	rtSkewed(t, m, newRTGen(), buf)
	rng := rand.New(rand.NewPCG(5, 6))
	prio := map[int64]float64{}
	var seqs []int64
	var vals []float64
	for _, s := range m.liveSeqs() {
		p := 0.2 + 5*rng.Float64()
		if rng.IntN(8) == 0 {
			p = 0
		}
		prio[s] = p
		seqs, vals = append(seqs, s), append(vals, p)
	}
	if _, _, err := buf.UpdatePriorities(seqs, vals); err != nil {
		t.Fatal(err)
	}
	q := func(s int64) float64 { return math.Pow(prio[s]+eps, alpha) }
	qmin := math.Inf(1)
	for s := range prio {
		qmin = min(qmin, q(s))
	}
	lt := m.liveTrajs()
	pos := map[int64]int{} // seq -> position in its trajectory's live rows
	for _, ls := range lt {
		for i, s := range ls {
			pos[s] = i
		}
	}
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			// The valid starts and their mass.
			valid := map[int64]bool{}
			for _, ls := range lt {
				for i, s := range ls {
					if !strict || len(ls)-i >= L {
						valid[s] = true
					}
				}
			}
			const S, calls = 100, 150
			counts := map[int64]float64{}
			zeroDraws, total := 0, 0
			trajMap := map[int64]int{}
			for c := 0; c < calls; c++ {
				got := rtSample(t, buf, SampleRequest{Sampler: "prioritized_slice", NumSlices: S, SliceLen: L, StrictLength: ptr(strict), Seed: seed(uint64(c)), Beta: ptr(beta)})
				rtCheckRows(t, m, got, trajMap)
				rtSliceParts(t, m, got, S, L, strict)
				ss, w := i64s(t, got, "seq"), f32s(t, got, "weight")
				for k := 0; k < S; k++ {
					st := ss[k*L]
					if !valid[st] {
						t.Fatalf("slice starts at seq %d (position %d of %d live rows): not a valid start", st, pos[st], len(lt[m.rows[st].traj]))
					}
					want := float32(math.Pow(q(st)/qmin, -beta))
					for i := 0; i < L; i++ {
						if ss[k*L+i] >= 0 && math.Abs(float64(w[k*L+i]-want)) > 2e-7*float64(want) {
							t.Fatalf("slice %d row %d: weight %v, want the start's (q/q_min)^-beta = %v", k, i, w[k*L+i], want)
						}
					}
					total++
					if prio[st] == 0 {
						zeroDraws++
						continue
					}
					counts[st]++
				}
			}
			sum, zsum := 0.0, 0.0
			for s := range valid {
				if prio[s] > 0 {
					sum += q(s)
				} else {
					zsum += q(s)
				}
			}
			rtPoisson(t, "starts of priority 0", zeroDraws, float64(total)*zsum/(sum+zsum))
			n := float64(total - zeroDraws)
			var obs, exp []float64
			for s := range valid {
				if prio[s] > 0 {
					obs = append(obs, counts[s])
					exp = append(exp, n*q(s)/sum)
				}
			}
			rtChi2(t, "prioritized_slice starts vs q among valid starts", obs, exp)
		})
	}
}

// ---------------------------------------------------------------------------
// Without replacement.

// rtEpochWalker follows one consumer through epochs, checking each against
// the set of rows (or trajectories) it must cover.
type rtEpochWalker struct {
	t        *testing.T
	buf      *Buffer
	req      SampleRequest
	epoch    int64 // expected epoch number of the next batch
	seen     map[int64]int
	batches  []int
	epochs   int
	calls    int
	unitOf   func(got *Batch) []int64 // the units (seqs or trajectories) of a batch
	unitSize int                      // rows per unit in req terms (1 for rows)
}

func newRTWalker(t *testing.T, buf *Buffer, req SampleRequest) *rtEpochWalker {
	return &rtEpochWalker{t: t, buf: buf, req: req, seen: map[int64]int{}, unitOf: func(got *Batch) []int64 { return i64s(t, got, "seq") }}
}

// step draws one batch; at an epoch end it checks coverage against want and
// returns true.
func (w *rtEpochWalker) step(want []int64, size int) bool {
	t := w.t
	t.Helper()
	w.calls++
	req := w.req
	req.Seed = seed(uint64(w.calls))
	got, err := rtTrySample(w.buf, &req)
	if err != nil {
		t.Fatalf("consumer %q epoch %d batch %d (after batches %v, %d of %d units seen): %v",
			req.Consumer, w.epoch, len(w.batches), w.batches, len(w.seen), len(want), err)
	}
	ep, err := strconv.ParseInt(got.Metadata["epoch"], 10, 64)
	if err != nil {
		t.Fatalf("metadata %v", got.Metadata)
	}
	if ep != w.epoch {
		t.Fatalf("consumer %q: batch has epoch %d, want %d (batches so far %v)", req.Consumer, ep, w.epoch, w.batches)
	}
	units := w.unitOf(got)
	for _, u := range units {
		w.seen[u]++
		if w.seen[u] > 1 {
			t.Fatalf("consumer %q epoch %d: %d returned twice", req.Consumer, ep, u)
		}
	}
	w.batches = append(w.batches, len(units))
	end := got.Metadata["epoch_end"] == "true"
	if !end {
		if len(units) != size {
			t.Fatalf("consumer %q epoch %d: batch %d has %d units before the epoch end, want %d", req.Consumer, ep, len(w.batches)-1, len(units), size)
		}
		return false
	}
	// Epoch end: exact coverage (all but a dropped short remainder).
	n := len(want)
	full := n
	if req.DropLast {
		full = n / size * size
	}
	if len(w.seen) != full {
		t.Fatalf("consumer %q epoch %d: covered %d units in batches %v, want %d of %d", req.Consumer, ep, len(w.seen), w.batches, full, n)
	}
	for _, u := range want {
		if w.seen[u] == 0 && !req.DropLast {
			t.Fatalf("consumer %q epoch %d: %d never returned", req.Consumer, ep, u)
		}
	}
	for u := range w.seen {
		if !slices.Contains(want, u) {
			t.Fatalf("consumer %q epoch %d: %d returned, not in the epoch's set", req.Consumer, ep, u)
		}
	}
	for i, b := range w.batches {
		last := i == len(w.batches)-1
		if (!last && b != size) || (last && (b < 1 || b > size)) || (req.DropLast && b != size) {
			t.Fatalf("consumer %q epoch %d: batch sizes %v for %d units in batches of %d (drop_last=%v)", req.Consumer, ep, w.batches, n, size, req.DropLast)
		}
	}
	if !req.DropLast && len(w.batches) != (n+size-1)/size {
		t.Fatalf("consumer %q epoch %d: %d batches, want %d", req.Consumer, ep, len(w.batches), (n+size-1)/size)
	}
	w.epoch++
	w.epochs++
	w.seen = map[int64]int{}
	w.batches = nil
	return true
}

func (w *rtEpochWalker) epochsOf(want []int64, size, n int) {
	w.t.Helper()
	for w.epochs < n {
		if w.calls > 10000 {
			w.t.Fatal("too many calls")
		}
		w.step(want, size)
	}
}

// Every live row exactly once per epoch, for batch sizes that divide the
// number of rows and that don't (short last batch, epoch_end on it), with
// drop_last, on a partly filled and on a wrapped ring; consumers are
// independent; a write that changes the number of live rows starts a new
// epoch.
func TestWithoutReplacementEpochs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		capacity  int64
		write     int
		sizes     []int
		dropSizes []int
	}{
		{"partial", 200, 103, []int{1, 7, 10, 103, 200}, []int{10, 103}},
		{"wrapped", 50, 130, []int{5, 7, 50, 64}, []int{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t)
			buf := rtCreate(t, db, "w", testSpec(storage.KindMemory, tc.capacity, false, false))
			m, g := newRTModel(tc.capacity), newRTGen()
			var in []rtIn
			for len(in) < tc.write {
				in = append(in, g.episode("s", 0, 9, "term")...)
			}
			rtExtend(t, m, "s", in[:tc.write], false, buf)
			live := m.liveSeqs()
			for _, B := range tc.sizes {
				w := newRTWalker(t, buf, SampleRequest{Sampler: "without_replacement", BatchSize: B, Consumer: fmt.Sprintf("c%d", B)})
				w.epochsOf(live, B, 3)
			}
			for _, B := range tc.dropSizes {
				w := newRTWalker(t, buf, SampleRequest{Sampler: "without_replacement", BatchSize: B, DropLast: true, Consumer: fmt.Sprintf("d%d", B)})
				w.epochsOf(live, B, 3)
			}
			// drop_last with a batch larger than the live rows can never
			// be served from the current data.
			_, err := rtTrySample(buf, &SampleRequest{Sampler: "without_replacement", BatchSize: len(live) + 1, DropLast: true, Consumer: "big"})
			if !errors.Is(err, ErrNotReady) {
				t.Errorf("drop_last with batch > live rows: %v, want ErrNotReady", err)
			}
			// Two consumers interleaved, each through full epochs.
			x := newRTWalker(t, buf, SampleRequest{Sampler: "without_replacement", BatchSize: 6, Consumer: "x"})
			y := newRTWalker(t, buf, SampleRequest{Sampler: "without_replacement", BatchSize: 11, Consumer: "y"})
			for x.epochs < 3 || y.epochs < 3 {
				x.step(live, 6)
				y.step(live, 11)
				y.step(live, 11)
			}
		})
	}

	t.Run("write starts a new epoch", func(t *testing.T) {
		db := openDB(t)
		buf := rtCreate(t, db, "w", testSpec(storage.KindMemory, 100, false, false))
		m, g := newRTModel(100), newRTGen()
		rtExtend(t, m, "s", g.episode("s", 0, 40, "term"), false, buf)
		w := newRTWalker(t, buf, SampleRequest{Sampler: "without_replacement", BatchSize: 8, Consumer: "n"})
		w.step(m.liveSeqs(), 8)
		w.step(m.liveSeqs(), 8)
		rtExtend(t, m, "s", g.episode("s", 0, 5, "term"), false, buf)
		// The epoch in progress is abandoned: the next batch opens epoch
		// 1, which covers the 45 live rows.
		w.epoch++
		w.seen, w.batches = map[int64]int{}, nil
		w.epochsOf(m.liveSeqs(), 8, 2)
	})
}

// On a compact buffer without_replacement covers every row whose next
// observation is known once per epoch. Rows it may not return sit in the
// permutation too; a consumer must still get every epoch's rows, with
// epoch_end on the last batch, and never an ErrNotReady while such rows
// exist.
func TestWithoutReplacementCompactEpochEnd(t *testing.T) {
	const capacity = 200
	db := openDB(t)
	buf := rtCreate(t, db, "wc", testSpec(storage.KindMemory, capacity, true, false))
	m, g := newRTModel(capacity), newRTGen()
	rtCompactMix(t, m, g, buf)
	var known []int64
	for _, s := range m.liveSeqs() {
		if m.known(s) {
			known = append(known, s)
		}
	}
	t.Logf("%d live rows, %d with a known next", m.wc()-m.lo(), len(known))
	for _, B := range []int{len(known), len(known) / 2, 9} {
		t.Run(fmt.Sprintf("batch=%d", B), func(t *testing.T) {
			w := newRTWalker(t, buf, SampleRequest{Sampler: "without_replacement", BatchSize: B, Consumer: fmt.Sprintf("c%d", B)})
			w.epochsOf(known, B, 12)
		})
	}
}

// slice_without_replacement: each trajectory at most once per epoch (strict:
// exactly the long enough ones; non-strict: all of them).
func TestSliceWithoutReplacementEpochs(t *testing.T) {
	const L = 8
	db := openDB(t)
	m := newRTModel(0)
	probe := newRTModel(1 << 30)
	rtSkewed(t, probe, newRTGen())
	m.capacity = probe.wc() - 35
	buf := rtCreate(t, db, "sw", testSpec(storage.KindMemory, m.capacity, true, false))
	rtSkewed(t, m, newRTGen(), buf)
	lt := m.liveTrajs()
	var all, long []int64
	for tr, ls := range lt {
		all = append(all, int64(tr))
		if len(ls) >= L {
			long = append(long, int64(tr))
		}
	}
	for _, tc := range []struct {
		strict bool
		S      int
		want   []int64
	}{{false, 4, all}, {false, 7, all}, {true, 2, long}, {true, 3, long}} {
		t.Run(fmt.Sprintf("strict=%v/slices=%d", tc.strict, tc.S), func(t *testing.T) {
			w := newRTWalker(t, buf, SampleRequest{Sampler: "slice_without_replacement", NumSlices: tc.S, SliceLen: L,
				StrictLength: ptr(tc.strict), Consumer: fmt.Sprintf("%v%d", tc.strict, tc.S)})
			w.unitOf = func(got *Batch) []int64 {
				S := got.Tensors[0].Shape[0]
				trs, _, _ := rtSliceParts(t, m, got, S, L, tc.strict)
				var out []int64
				for _, tr := range trs {
					out = append(out, int64(tr))
				}
				return out
			}
			w.epochsOf(tc.want, tc.S, 4)
		})
	}
}
