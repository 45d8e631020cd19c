package storage

// chunkUndo records what a write to the chunk store changes in memory, so
// that a write the disk refuses (ENOSPC, EIO) can be taken back whole: the
// writer's state is then what it was before the call, the batch is
// rejected, and the next write may succeed once there is space again. No
// restart needed. Records that reached the disk before the failure stay
// there as garbage: their seqs are handed out again, and recovery matches
// a row to its chunk by seq, trajectory and step (as after a crash).
//
// Only what a write can change is logged: the slots' row locations, the
// trajectories' states, the sizes of the open chunks it appended to, the
// dieAt marks it raised, the next chunk id and the queue of link cuts.
// Guarded by b.wmu, like the writer's state.
type chunkUndo struct {
	locs   map[int64]rowLoc
	trajs  map[int64]trajSave
	chunks map[*chunk]chunkSave
	dieAts map[*chunk]int64
	nextID uint64 // chunks with an id at or above it were made by the write
	cuts   int
}

type trajSave struct {
	ts    *trajState // nil: the trajectory had no state
	state trajState  // ts's fields, stack deep-copied
}

type chunkSave struct {
	seqs     int
	tail     bool
	fragFrom int
	sealNo   int64
	fields   [][3]int // per field: len(raw), len(modes), len(offs)
}

// begin starts logging a write.
func (cs *chunkStore) begin() {
	cs.undo = &chunkUndo{locs: map[int64]rowLoc{}, trajs: map[int64]trajSave{}, chunks: map[*chunk]chunkSave{},
		dieAts: map[*chunk]int64{}, nextID: cs.nextID, cuts: len(cs.cuts)}
}

// end ends a write begun with begin: it keeps what the write did if *errp
// is nil and takes it all back otherwise. Use as `defer cs.end(&err)`.
func (cs *chunkStore) end(errp *error) {
	if *errp != nil {
		cs.rollback()
	}
	cs.undo = nil
}

// saveTraj logs trajectory traj's state before its first change.
func (cs *chunkStore) saveTraj(traj int64) {
	u := cs.undo
	if u == nil {
		return
	}
	if _, ok := u.trajs[traj]; ok {
		return
	}
	ts := cs.trajs[traj]
	if ts == nil {
		u.trajs[traj] = trajSave{}
		return
	}
	st := *ts
	st.stack = make([][]byte, len(ts.stack))
	for i, s := range ts.stack {
		st.stack[i] = append([]byte(nil), s...)
	}
	u.trajs[traj] = trajSave{ts: ts, state: st}
}

// saveChunk logs an open chunk's sizes before the write first appends to
// it or seals it. Chunks made by this write need no log: nothing refers to
// them once the trajectories are restored.
func (cs *chunkStore) saveChunk(c *chunk) {
	u := cs.undo
	if u == nil || c.id >= u.nextID {
		return
	}
	if _, ok := u.chunks[c]; ok {
		return
	}
	s := chunkSave{seqs: len(c.seqs), tail: c.tail, fragFrom: c.fragFrom, sealNo: c.sealNo, fields: make([][3]int, len(c.f))}
	for i, f := range c.f {
		s.fields[i] = [3]int{len(f.raw), len(f.modes), len(f.offs)}
	}
	u.chunks[c] = s
}

// setLoc sets a slot's row location, logging the first old value. Called
// with cs.mu held.
func (cs *chunkStore) setLoc(slot int64, l rowLoc) {
	if u := cs.undo; u != nil {
		if _, ok := u.locs[slot]; !ok {
			u.locs[slot] = cs.loc[slot]
		}
	}
	cs.loc[slot] = l
}

// setDieAt raises c.dieAt, logging the first old value.
func (cs *chunkStore) setDieAt(c *chunk, v int64) {
	if u := cs.undo; u != nil {
		if _, ok := u.dieAts[c]; !ok {
			u.dieAts[c] = c.dieAt
		}
	}
	c.dieAt = v
}

// rollback restores everything the write changed.
func (cs *chunkStore) rollback() {
	u := cs.undo
	cs.undo = nil
	if u == nil {
		return
	}
	cs.mu.Lock()
	for slot, l := range u.locs {
		cs.loc[slot] = l
	}
	for c, s := range u.chunks {
		c.seqs = c.seqs[:s.seqs]
		c.tail, c.fragFrom, c.sealNo = s.tail, s.fragFrom, s.sealNo
		for i, n := range s.fields {
			f := &c.f[i]
			f.raw, f.modes, f.offs = f.raw[:n[0]], f.modes[:n[1]], f.offs[:n[2]]
		}
	}
	cs.mu.Unlock()
	for c, v := range u.dieAts {
		c.dieAt = v
	}
	for traj, s := range u.trajs {
		if s.ts == nil {
			delete(cs.trajs, traj)
			continue
		}
		*s.ts = s.state
		cs.trajs[traj] = s.ts
	}
	clear(cs.cuts[u.cuts:])
	cs.cuts = cs.cuts[:u.cuts]
	// The failed write may have left records of these open chunks on
	// disk (a fragment, a seal) holding rows whose seqs will be handed out
	// again. Each continues under a new id, which recovery prefers to the
	// old one for a row both hold; its next fragment rewrites all its
	// rows. Ids are never reused: one may be on disk already.
	for _, ts := range cs.trajs {
		if c := ts.open; c != nil {
			if _, touched := u.chunks[c]; touched {
				ts.open = cs.reissue(c)
			}
		}
	}
}

// reissue returns an open chunk with c's rows under a new id, and points
// the rows' slots at it.
func (cs *chunkStore) reissue(c *chunk) *chunk {
	nc := &chunk{id: cs.nextID, traj: c.traj, step0: c.step0, seqs: c.seqs, tail: c.tail,
		f: append([]chunkField(nil), c.f...), dieAt: c.dieAt}
	cs.nextID++
	nc.prevp.Store(c.prev())
	cs.mu.Lock()
	for i, s := range c.seqs {
		slot := s % cs.b.slots
		if l := cs.loc[slot]; l.c == c && l.i == i {
			cs.loc[slot] = rowLoc{nc, i}
		}
	}
	cs.mu.Unlock()
	return nc
}
