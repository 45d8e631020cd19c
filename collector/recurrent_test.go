package collector_test

import (
	"context"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

const recurrentH = 8

// recurrentPolicy is the GRU every recurrent test runs: seeded weights,
// and an epsilon high enough that masked CartPole episodes end every few
// dozen steps, so done rows fall inside collector batches.
func recurrentPolicy() *collector.GRUQ {
	return collector.NewGRUQ(2, recurrentH, 2, 0.3, 11)
}

// stateAt decodes row i's stored state from a column of float32 [H] rows.
func stateAt(col []byte, i int) []float32 {
	out := make([]float32, recurrentH)
	for k := range out {
		out[k] = f32At(col, i*recurrentH+k)
	}
	return out
}

func sameBits(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func isZero(v []float32) bool {
	for _, x := range v {
		if math.Float32bits(x) != 0 {
			return false
		}
	}
	return true
}

// replayStep is the recurrence on one row: the state after observation obs
// from state h.
func replayStep(p *collector.GRUQ, obs, h []float32) []float32 {
	next := make([]float32, recurrentH)
	p.Step(obs, h, 1, next)
	return next
}

// stateCheck is what checkStoredStates found.
type stateCheck struct {
	starts, carried, acrossBatches int
	maxStep                        int64
}

// checkStoredStates checks every live row of b: a row at step 0 stores the
// zero state; any other row stores exactly (bit for bit) the state the
// recurrence gives from its previous row's stored state and observation.
// batchRows is the collector's batch size, to count the states carried
// from one batch into the next.
func checkStoredStates(t *testing.T, b *rbd.Buffer, p *collector.GRUQ, batchRows int64) stateCheck {
	t.Helper()
	r := readRows(t, b)
	pos := make(map[int64]int, len(r.seqs))
	for i, s := range r.seqs {
		pos[s] = i
	}
	obs := r.cols["observation"]
	states := r.cols[collector.DefaultStateField]
	var c stateCheck
	for i, m := range r.meta {
		h := stateAt(states, i)
		c.maxStep = max(c.maxStep, m.Step)
		if m.Step == 0 {
			if !isZero(h) {
				t.Fatalf("seq %d starts trajectory %d but stores state %v, want zeros", m.Seq, m.TrajID, h)
			}
			c.starts++
			continue
		}
		j, ok := pos[m.PrevSeq]
		if !ok {
			continue // the previous row left the ring
		}
		want := replayStep(p, []float32{f32At(obs, 2*j), f32At(obs, 2*j+1)}, stateAt(states, j))
		if !sameBits(h, want) {
			t.Fatalf("seq %d (trajectory %d step %d): stored state %v, the recurrence from seq %d gives %v",
				m.Seq, m.TrajID, m.Step, h, m.PrevSeq, want)
		}
		c.carried++
		if m.Seq/batchRows != m.PrevSeq/batchRows {
			c.acrossBatches++
		}
	}
	return c
}

// The collector stores each row's state before the step: zero where a
// trajectory starts (the env ended it, the collector cut it, or the batch
// was reset) and otherwise carried from the previous step, within a batch
// and across batches, bit for bit.
func TestRecurrentCollectorStates(t *testing.T) {
	const (
		numEnvs = 4
		fpb     = 64
		frames  = 1024
	)
	tests := []struct {
		name  string
		cfg   collector.Config
		check func(t *testing.T, c stateCheck)
	}{
		{"carried across batches", collector.Config{}, func(t *testing.T, c stateCheck) {
			if c.acrossBatches == 0 {
				t.Fatal("no state was carried from one batch into the next")
			}
		}},
		{"reset at each iter", collector.Config{ResetAtEachIter: true}, func(t *testing.T, c stateCheck) {
			if c.acrossBatches != 0 {
				t.Fatalf("%d states carried across batches that each start new trajectories", c.acrossBatches)
			}
			if c.starts < frames/fpb*numEnvs {
				t.Fatalf("%d trajectory starts, want at least one per copy per batch (%d)", c.starts, frames/fpb*numEnvs)
			}
		}},
		{"max frames per traj", collector.Config{MaxFramesPerTraj: 5}, func(t *testing.T, c stateCheck) {
			if c.maxStep != 4 {
				t.Fatalf("largest step %d, want 4 with trajectories cut at 5 frames", c.maxStep)
			}
		}},
		{"init random frames", collector.Config{InitRandomFrames: 256}, func(t *testing.T, c stateCheck) {
			if c.carried == 0 {
				t.Fatal("no carried state checked")
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t)
			buf := newBuffer(t, db, "r", envs.CartPoleMaskedSpec(), collector.SpecOptions{CompactObs: true, RecurrentState: recurrentH})
			p := recurrentPolicy()
			cfg := tc.cfg
			cfg.Env, cfg.Policy, cfg.Writer = newEnv(t, "cartpole-masked", numEnvs, nil), p, collector.BufferWriter{Buffer: buf.Buffer}
			cfg.Seed, cfg.FramesPerBatch, cfg.TotalFrames, cfg.CompactObs = 5, fpb, frames, true
			st, err := collector.Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if st.Frames != frames || st.Trajectories < 8 {
				t.Fatalf("run: %d frames, %d trajectories", st.Frames, st.Trajectories)
			}
			c := checkStoredStates(t, buf, p, fpb)
			if c.starts+c.carried != frames {
				t.Fatalf("checked %d starts and %d carried states of %d rows", c.starts, c.carried, frames)
			}
			tc.check(t, c)
			t.Logf("%d starts, %d carried (%d across batches), largest step %d", c.starts, c.carried, c.acrossBatches, c.maxStep)
		})
	}
}

// A buffer without the state field, or with one of the wrong shape, is an
// error naming the field before anything is written.
func TestRecurrentCollectorChecksTheStateField(t *testing.T) {
	tests := []struct {
		name  string
		state int // RecurrentState of the buffer
		field string
		want  []string
	}{
		{"missing", 0, "", []string{`no field "recurrent_state"`, "float32 [8]"}},
		{"wrong size", 4, "", []string{`field "recurrent_state" is float32 [4]`, "float32 [8]"}},
		{"other name", recurrentH, "h0", []string{`no field "h0"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t)
			buf := newBuffer(t, db, "r", envs.CartPoleMaskedSpec(), collector.SpecOptions{RecurrentState: tc.state})
			_, err := collector.Run(context.Background(), collector.Config{
				Env: newEnv(t, "cartpole-masked", 2, nil), Policy: recurrentPolicy(), Writer: collector.BufferWriter{Buffer: buf.Buffer},
				TotalFrames: 64, StateField: tc.field,
			})
			if err == nil {
				t.Fatal("run succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if wc := buf.WriteCount(); wc != 0 {
				t.Fatalf("%d rows written", wc)
			}
		})
	}
}

// End to end on a memmap buffer: a recurrent collector writes masked
// CartPole with episodes ending mid-batch; after a reopen, slices are
// sampled and the recurrence is re-run from each slice's stored first state
// over the slice's observations, giving every stored state back bit for
// bit, with the zero state exactly where step == 0; a second run after the
// reopen (a restart) starts from zero states.
func TestRecurrentEndToEndSlicesAcrossReopen(t *testing.T) {
	const (
		numEnvs   = 4
		fpb       = 96
		frames    = 1536
		numSlices = 16
		sliceLen  = 10
	)
	dir := t.TempDir()
	p := recurrentPolicy()
	collect := func(db *rbd.DB) {
		t.Helper()
		b, err := db.Buffer("r")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := collector.Run(context.Background(), collector.Config{
			Env: newEnv(t, "cartpole-masked", numEnvs, nil), Policy: p, Writer: collector.BufferWriter{Buffer: b.Buffer},
			Stream: "actor", Seed: 9, FramesPerBatch: fpb, TotalFrames: frames, CompactObs: true,
		}); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *rbd.DB {
		t.Helper()
		db, err := rbd.Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db := open()
	spec := collector.BufferSpec(envs.CartPoleMaskedSpec(), collector.SpecOptions{
		Capacity: 1 << 14, Storage: storage.KindMemmap, CompactObs: true, RecurrentState: recurrentH})
	if _, _, err := db.CreateBuffer("r", spec); err != nil {
		t.Fatal(err)
	}
	collect(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = open()
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	buf, err := db.Buffer("r")
	if err != nil {
		t.Fatal(err)
	}
	var slices, fromStart, fromMid, acrossBatches, checked int
	for seed := uint64(1); seed <= 8; seed++ {
		sd := seed
		b, err := buf.Sample(context.Background(), &rbd.SampleRequest{Sampler: "slice", NumSlices: numSlices, SliceLen: sliceLen,
			StrictLength: new(bool), Seed: &sd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seqs, steps, mask := tensor(t, b, "seq"), tensor(t, b, "step"), tensor(t, b, "mask")
		obs, states := tensor(t, b, "observation"), tensor(t, b, collector.DefaultStateField)
		for i := range numSlices {
			first := i * sliceLen
			h := stateAt(states, first)
			if step := int64(binary.LittleEndian.Uint64(steps[8*first:])); step == 0 {
				fromStart++
			} else {
				fromMid++
			}
			for j := range sliceLen {
				pos := first + j
				if mask[pos] == 0 {
					break
				}
				got := stateAt(states, pos)
				step := int64(binary.LittleEndian.Uint64(steps[8*pos:]))
				if step == 0 && !isZero(got) {
					t.Fatalf("seed %d slice %d pos %d: step 0 stores %v", seed, i, j, got)
				}
				if !sameBits(got, h) {
					t.Fatalf("seed %d slice %d pos %d (step %d): stored state %v, the replay from the slice's first state gives %v",
						seed, i, j, step, got, h)
				}
				if j > 0 {
					prev := int64(binary.LittleEndian.Uint64(seqs[8*(pos-1):]))
					if seq := int64(binary.LittleEndian.Uint64(seqs[8*pos:])); seq/fpb != prev/fpb {
						acrossBatches++
					}
				}
				h = replayStep(p, []float32{f32At(obs, 2*pos), f32At(obs, 2*pos+1)}, got)
				checked++
			}
			slices++
		}
	}
	if fromStart == 0 || fromMid == 0 || acrossBatches == 0 {
		t.Fatalf("slices from a start %d, from mid-trajectory %d, steps across a batch boundary %d: want all kinds",
			fromStart, fromMid, acrossBatches)
	}
	t.Logf("%d slices, %d positions replayed (%d from a start, %d mid-trajectory, %d steps across batches)",
		slices, checked, fromStart, fromMid, acrossBatches)

	// A restart: the second run's first row of each copy is a step 0 with
	// the zero state, and every stored state still replays.
	collect(db)
	c := checkStoredStates(t, buf, p, fpb)
	if c.starts+c.carried != 2*frames {
		t.Fatalf("checked %d starts and %d carried states of %d rows", c.starts, c.carried, 2*frames)
	}
	r := readRows(t, buf)
	for e := int64(0); e < numEnvs; e++ {
		for i, m := range r.meta {
			if m.Seq >= frames && m.Env == e {
				if m.Step != 0 || !isZero(stateAt(r.cols[collector.DefaultStateField], i)) {
					t.Fatalf("restart: copy %d's first row (seq %d) has step %d", e, m.Seq, m.Step)
				}
				break
			}
		}
	}
}
