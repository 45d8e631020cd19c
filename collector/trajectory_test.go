package collector_test

import (
	"context"
	"testing"

	"github.com/rbdb/rbd/collector"
)

// expectedTraj replays the store's rule on the row order the collector
// writes (tick-major, copy order within a tick): a copy without an open
// trajectory starts one with the next id, a done row ends it. It returns
// each row's (id, step, prev, next), ids counted from 0.
func expectedTraj(env []int64, done []bool) (id, step, prev, next []int64) {
	n := len(env)
	id, step, prev, next = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	type open struct{ id, step, last int64 }
	cur := map[int64]*open{}
	var counter int64
	for r := 0; r < n; r++ {
		e := env[r]
		o := cur[e]
		if o == nil {
			o = &open{id: counter, step: -1, last: -1}
			counter++
			cur[e] = o
		}
		o.step++
		id[r], step[r], prev[r], next[r] = o.id, o.step, o.last, -1
		if o.last >= 0 {
			next[o.last] = int64(r)
		}
		o.last = int64(r)
		if done[r] {
			delete(cur, e)
		}
	}
	return
}

// Two copies with episodes of 2 and 3 steps, batches of 2 ticks: episodes
// span batches, and every row's trajectory id, step and links are exactly
// what the episodes say.
func TestTrajectoryIDsAcrossBatches(t *testing.T) {
	for _, compact := range []bool{false, true} {
		db := openDB(t)
		env := newScriptEnv(2, 3)
		buf := newBuffer(t, db, "s", env.Spec(), collector.SpecOptions{CompactObs: compact})
		st, err := collector.Run(context.Background(), collector.Config{
			Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer}, Stream: "a",
			FramesPerBatch: 4, TotalFrames: 24, CompactObs: compact,
		})
		if err != nil {
			t.Fatal(err)
		}
		if st.Frames != 24 || st.Batches != 6 {
			t.Fatalf("stats %+v", st)
		}
		r := readRows(t, buf)
		if len(r.seqs) != 24 {
			t.Fatalf("%d rows", len(r.seqs))
		}
		env64 := make([]int64, 24)
		done := make([]bool, 24)
		for i, m := range r.meta {
			env64[i], done[i] = m.Env, m.Done
			if want := int64(i % 2); m.Env != want {
				t.Fatalf("row %d: env %d, want %d (tick-major rows)", i, m.Env, want)
			}
		}
		id, step, prev, next := expectedTraj(env64, done)
		base := r.meta[0].TrajID
		for i, m := range r.meta {
			obs := r.at("observation", i)
			copyIdx, episode, obsStep := f32At(obs, 0), f32At(obs, 1), f32At(obs, 2)
			if m.TrajID-base != id[i] || m.Step != step[i] || m.PrevSeq != prev[i] || m.NextSeq != next[i] {
				t.Fatalf("compact=%v row %d: traj %d step %d prev %d next %d; want %d %d %d %d",
					compact, i, m.TrajID-base, m.Step, m.PrevSeq, m.NextSeq, id[i], step[i], prev[i], next[i])
			}
			// The trajectory is the env's episode: the observation's step
			// is the row's step, and episodes of a copy map to ids in order.
			if int64(copyIdx) != m.Env || int64(obsStep) != m.Step {
				t.Fatalf("row %d: observation %v %v %v does not match env %d step %d", i, copyIdx, episode, obsStep, m.Env, m.Step)
			}
			lens := []int64{2, 3}
			term := m.Step+1 == lens[m.Env]
			lastTick := i >= 22
			if m.Terminated != term || m.Truncated != (lastTick && !term) || m.Done != (term || lastTick) {
				t.Fatalf("row %d (env %d step %d): terminated %v truncated %v done %v", i, m.Env, m.Step, m.Terminated, m.Truncated, m.Done)
			}
			if compact && m.HasTail != m.Done {
				t.Fatalf("row %d: has tail %v, done %v", i, m.HasTail, m.Done)
			}
		}
		// Rows of one (copy, episode) pair share one id, and only they.
		ids := map[[2]float32]int64{}
		for i, m := range r.meta {
			obs := r.at("observation", i)
			k := [2]float32{f32At(obs, 0), f32At(obs, 1)}
			if got, ok := ids[k]; ok && got != m.TrajID {
				t.Fatalf("episode %v split over ids %d and %d", k, got, m.TrajID)
			}
			ids[k] = m.TrajID
		}
		if maxID := max(id[22], id[23]); len(ids) != int(maxID+1) {
			t.Fatalf("%d episodes, %d ids", len(ids), maxID+1)
		}
		info, err := buf.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.OpenTrajectories != 0 {
			t.Fatalf("%d trajectories left open", info.OpenTrajectories)
		}
	}
}

// reset_at_each_iter: every batch starts from fresh episodes and new
// trajectory ids; no trajectory spans two batches.
func TestResetAtEachIterStartsNewIDs(t *testing.T) {
	for _, compact := range []bool{false, true} {
		db := openDB(t)
		env := newScriptEnv(2, 3)
		buf := newBuffer(t, db, "s", env.Spec(), collector.SpecOptions{CompactObs: compact})
		_, err := collector.Run(context.Background(), collector.Config{
			Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer}, Stream: "a",
			FramesPerBatch: 4, TotalFrames: 20, ResetAtEachIter: true, CompactObs: compact,
		})
		if err != nil {
			t.Fatal(err)
		}
		r := readRows(t, buf)
		lastID := int64(-1)
		for b := 0; b < 5; b++ {
			batchIDs := map[int64]bool{}
			for i := 4 * b; i < 4*b+4; i++ {
				m := r.meta[i]
				batchIDs[m.TrajID] = true
				if m.TrajID <= lastID {
					t.Fatalf("batch %d row %d: id %d not after the previous batch's %d", b, i, m.TrajID, lastID)
				}
				tick := (i % 4) / 2
				if m.Step != int64(tick) {
					t.Fatalf("batch %d row %d: step %d, want %d (a fresh episode per batch)", b, i, m.Step, tick)
				}
				if obsStep := f32At(r.at("observation", i), 2); int64(obsStep) != m.Step {
					t.Fatalf("row %d: the env was not reset (observation step %v)", i, obsStep)
				}
				if tick == 1 && !m.Done {
					t.Fatalf("batch %d row %d: the batch's last step is not done", b, i)
				}
				if tick == 1 && m.Env == 1 && (!m.Truncated || m.Terminated) {
					t.Fatalf("batch %d row %d: a cut episode must be truncated, not terminated", b, i)
				}
				if compact && m.Done && !m.HasTail {
					t.Fatalf("row %d: cut row without its final observation", i)
				}
			}
			if len(batchIDs) != 2 {
				t.Fatalf("batch %d: %d ids, want one per copy", b, len(batchIDs))
			}
			for id := range batchIDs {
				lastID = max(lastID, id)
			}
		}
	}
}

// max_frames_per_traj truncates trajectories (the copy is reset); a
// termination on the limit's step is both terminated and truncated, as
// TorchRL's StepCounter does.
func TestMaxFramesPerTrajTruncates(t *testing.T) {
	db := openDB(t)
	env := newScriptEnv(5, 3, 2)
	buf := newBuffer(t, db, "s", env.Spec(), collector.SpecOptions{})
	st, err := collector.Run(context.Background(), collector.Config{
		Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer},
		FramesPerBatch: 9, TotalFrames: 90, MaxFramesPerTraj: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := readRows(t, buf)
	lens := map[int64]int{}
	for i, m := range r.meta {
		lens[m.TrajID]++
		if m.Step >= 3 {
			t.Fatalf("row %d: step %d beyond max_frames_per_traj", i, m.Step)
		}
		obsStep := int64(f32At(r.at("observation", i), 2))
		if obsStep != m.Step {
			t.Fatalf("row %d: env not reset after truncation (observation step %d, row step %d)", i, obsStep, m.Step)
		}
		last := i >= len(r.meta)-3
		switch {
		case m.Step == 2 && m.Env == 0: // limit reached in a 5-step episode
			if !m.Truncated || m.Terminated {
				t.Fatalf("row %d: truncated %v terminated %v", i, m.Truncated, m.Terminated)
			}
		case m.Step == 2 && m.Env == 1: // the env terminates on the limit's step
			if !m.Truncated || !m.Terminated {
				t.Fatalf("row %d: truncated %v terminated %v", i, m.Truncated, m.Terminated)
			}
		case m.Step == 1 && m.Env == 2:
			if m.Truncated && !last || !m.Terminated {
				t.Fatalf("row %d: truncated %v terminated %v", i, m.Truncated, m.Terminated)
			}
		case !last:
			if m.Done {
				t.Fatalf("row %d: done early", i)
			}
		}
	}
	for id, n := range lens {
		if n > 3 {
			t.Fatalf("trajectory %d has %d rows", id, n)
		}
	}
	// Copy 0: 30 steps in trajectories of 3; copy 1: of 3; copy 2: of 2.
	if want := int64(10 + 10 + 15); st.Trajectories != want {
		t.Fatalf("%d trajectories, want %d", st.Trajectories, want)
	}
	if st.Episodes != st.Trajectories {
		t.Fatalf("episodes %d, trajectories %d: limit truncations count as episodes", st.Episodes, st.Trajectories)
	}
}

// In compact mode only done rows carry next.observation, as [D, ...] in
// row order, and it is the final observation the env produced.
func TestCompactBatchLayout(t *testing.T) {
	env := newScriptEnv(2, 3)
	rec := &recorder{}
	_, err := collector.Run(context.Background(), collector.Config{
		Env: env, Writer: rec, FramesPerBatch: 6, TotalFrames: 12, CompactObs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	for bi, b := range rec.batches {
		var want []byte
		for r := 0; r < b.Rows; r++ {
			if b.Fields["next.done"][r] == 1 {
				// The final observation: same copy and episode, step + 1.
				obs := b.Fields["observation"][12*r : 12*r+12]
				fin := append([]byte(nil), obs...)
				putF32(fin, 2, f32At(obs, 2)+1)
				want = append(want, fin...)
			}
		}
		if got := b.Fields["next.observation"]; string(got) != string(want) {
			t.Fatalf("batch %d: final observations %v, want %v", bi, got, want)
		}
		if _, ok := b.Fields["next.observation"]; !ok && len(want) > 0 {
			t.Fatalf("batch %d: final observations missing", bi)
		}
	}
	if len(rec.batches) != 2 {
		t.Fatalf("%d batches", len(rec.batches))
	}
}

// Two collectors writing into one buffer at once, on two streams, with the
// same env indices: the store keeps their trajectories apart.
func TestConcurrentCollectorsNeverCollide(t *testing.T) {
	db := openDB(t)
	spec := newScriptEnv(2, 3).Spec()
	buf := newBuffer(t, db, "s", spec, collector.SpecOptions{CompactObs: true})
	errs := make(chan error, 2)
	for _, stream := range []string{"a", "b"} {
		go func() {
			// Stream b's episodes are longer, so a mix-up shows in the rows.
			env := newScriptEnv(2, 3)
			if stream == "b" {
				env = newScriptEnv(4, 5)
			}
			_, err := collector.Run(context.Background(), collector.Config{Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer},
				Stream: stream, FramesPerBatch: 4, TotalFrames: 400, CompactObs: true})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r := readRows(t, buf)
	if len(r.seqs) != 800 {
		t.Fatalf("%d rows", len(r.seqs))
	}
	byID := map[int64][]int{}
	for i, m := range r.meta {
		byID[m.TrajID] = append(byID[m.TrajID], i)
	}
	for id, rows := range byID {
		first := r.at("observation", rows[0])
		copyIdx, episode := f32At(first, 0), f32At(first, 1)
		for k, i := range rows {
			obs := r.at("observation", i)
			if f32At(obs, 0) != copyIdx || f32At(obs, 1) != episode || int64(f32At(obs, 2)) != int64(k) || r.meta[i].Step != int64(k) {
				t.Fatalf("trajectory %d mixes episodes: row %d holds %v %v %v at step %d", id, i, f32At(obs, 0), f32At(obs, 1), f32At(obs, 2), k)
			}
		}
	}
}
