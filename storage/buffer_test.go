package storage

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// forEachKind runs a test against every storage kind, the same behaviour
// suite for all of them.
func forEachKind(t *testing.T, fn func(t *testing.T, kind Kind)) {
	for _, k := range kinds {
		t.Run(string(k), func(t *testing.T) { fn(t, k) })
	}
}

func TestRingOverwrite(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(kind, 5, false)
		b := mustCreate(t, s, "ring", spec)
		var rows []row
		for i := 0; i < 7; i++ {
			rows = append(rows, row{val: float32(i)})
		}
		res := mustExtend(t, b, "s", makeBatch(spec, rows, false))
		if res.FirstSeq != 0 || res.Rows != 7 || res.WriteCount != 7 {
			t.Fatalf("result %+v", res)
		}
		// Slots hold seq 5,6,2,3,4; with a spare block (more slots
		// than capacity) seqs 0 and 1 keep theirs, stamped void.
		want := []int64{5, 6, 2, 3, 4}
		if b.slots != 5 {
			want = []int64{-1, -1, 2, 3, 4, 5, 6}
		}
		for slot, want := range want {
			if got := b.stamps.Load(int64(slot)); got != want {
				t.Errorf("slot %d holds seq %d, want %d", slot, got, want)
			}
		}
		if got := b.LiveSeqs(0, 100); !slices.Equal(got, []int64{2, 3, 4, 5, 6}) {
			t.Errorf("live seqs %v", got)
		}
		col, _ := b.Column("observation")
		dst := [][]byte{make([]byte, 16*3)}
		m := make([]RowMeta, 3)
		missing, err := b.Gather([]int64{1, 2, 6}, []Column{col}, dst, m)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(missing, []int{0}) {
			t.Errorf("missing %v, want [0] (seq 1 was overwritten)", missing)
		}
		if obsOf(dst[0][16:]) != 2 || obsOf(dst[0][32:]) != 6 {
			t.Errorf("gathered %v %v", obsOf(dst[0][16:]), obsOf(dst[0][32:]))
		}
		// The trajectory keeps its live suffix with its original steps.
		if m[1].Step != 2 || m[1].PrevSeq != 1 || m[1].NextSeq != 3 || m[2].NextSeq != -1 {
			t.Errorf("meta %+v %+v", m[1], m[2])
		}
		info, err := b.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Size != 5 || info.WriteCount != 7 || info.Trajectories != 1 || info.OpenTrajectories != 1 {
			t.Errorf("info %+v", info)
		}
	})
}

func TestExtendLargerThanCapacity(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(kind, 4, false)
		b := mustCreate(t, s, "big", spec)
		var rows []row
		for i := 0; i < 10; i++ {
			rows = append(rows, row{val: float32(i), terminated: i == 9})
		}
		mustExtend(t, b, "s", makeBatch(spec, rows, false))
		if got := b.LiveSeqs(0, 100); !slices.Equal(got, []int64{6, 7, 8, 9}) {
			t.Fatalf("live %v, want the newest 4", got)
		}
		m := metas(t, b, 6, 9)
		if m[0].Step != 6 || m[0].PrevSeq != 5 || m[1].Step != 9 || !m[1].Done {
			t.Fatalf("meta %+v", m)
		}
	})
}

// Two envs in one stream, episodes of lengths 2 and 3, written interleaved
// across two requests.
func TestInterleavedEnvs(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(kind, 100, false)
		b := mustCreate(t, s, "envs", spec)
		// env 0: episodes of length 2; env 1: episodes of length 3.
		var all []row
		step := [2]int{}
		for i := 0; i < 6; i++ {
			for e := int64(0); e < 2; e++ {
				l := 2 + int(e)
				step[e]++
				all = append(all, row{env: e, val: float32(len(all)), terminated: step[e]%l == 0})
			}
		}
		mustExtend(t, b, "actor", makeBatch(spec, all[:5], false))
		mustExtend(t, b, "actor", makeBatch(spec, all[5:], false))
		seqs := b.LiveSeqs(0, 100)
		m := metas(t, b, seqs...)
		type want struct{ traj, step, prev, next int64 }
		// seq: env = seq%2. env0 trajs: {0,2},{4,6},{8,10}; env1: {1,3,5},{7,9,11}.
		// Trajectory ids are allocated in the order trajectories start.
		wants := []want{
			{0, 0, -1, 2}, {1, 0, -1, 3}, {0, 1, 0, -1}, {1, 1, 1, 5},
			{2, 0, -1, 6}, {1, 2, 3, -1}, {2, 1, 4, -1}, {3, 0, -1, 9},
			{4, 0, -1, 10}, {3, 1, 7, 11}, {4, 1, 8, -1}, {3, 2, 9, -1},
		}
		base := m[0].TrajID
		for i, w := range wants {
			got := want{m[i].TrajID - base, m[i].Step, m[i].PrevSeq, m[i].NextSeq}
			if got != w {
				t.Errorf("seq %d: got traj+%d step %d prev %d next %d, want %+v", i, got.traj, got.step, got.prev, got.next, w)
			}
		}
		info, _ := b.Info()
		if info.Trajectories != 5 || info.OpenTrajectories != 0 {
			t.Errorf("info %+v", info)
		}
	})
}

func TestStreamsContinueAndClose(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(kind, 100, false)
		b := mustCreate(t, s, "st", spec)
		mustExtend(t, b, "a", makeBatch(spec, []row{{val: 1}}, false))
		mustExtend(t, b, "b", makeBatch(spec, []row{{val: 2}}, false))
		mustExtend(t, b, "a", makeBatch(spec, []row{{val: 3}}, false))
		m := metas(t, b, 0, 1, 2)
		if m[2].TrajID != m[0].TrajID || m[2].PrevSeq != 0 || m[1].TrajID == m[0].TrajID {
			t.Fatalf("streams did not continue separately: %+v", m)
		}
		n, err := b.CloseStream("a")
		if err != nil || n != 1 {
			t.Fatalf("CloseStream = %d, %v", n, err)
		}
		mustExtend(t, b, "a", makeBatch(spec, []row{{val: 4}}, false))
		m = metas(t, b, 3)
		if m[0].TrajID == metas(t, b, 2)[0].TrajID || m[0].Step != 0 {
			t.Fatalf("closed stream continued its trajectory: %+v", m)
		}
		// An anonymous stream is closed when its request ends.
		mustExtend(t, b, "", makeBatch(spec, []row{{val: 5}}, false))
		mustExtend(t, b, "", makeBatch(spec, []row{{val: 6}}, false))
		m = metas(t, b, 4, 5)
		if m[0].TrajID == m[1].TrajID {
			t.Fatal("two anonymous requests shared a trajectory")
		}
		info, _ := b.Info()
		if info.OpenTrajectories != 2 { // stream b and the new one of a
			t.Fatalf("open trajectories %d, want 2", info.OpenTrajectories)
		}
	})
}

// TestOpenTrajectoryOutOfTheRing: a stream's open trajectory whose rows all
// left the ring is still open (the stream extends it, step continues) and
// counted as such; it was the cause of a flaky count in the client's
// concurrency test.
func TestOpenTrajectoryOutOfTheRing(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(kind, 4, false)
		b := mustCreate(t, s, "st", spec)
		mustExtend(t, b, "slow", makeBatch(spec, []row{{val: 1}, {val: 2}}, false))
		for i := range 3 { // 6 rows of other streams push "slow" out
			mustExtend(t, b, "fast", makeBatch(spec, []row{{val: 10}, {val: 11, terminated: i == 0}}, false))
		}
		info, err := b.Info()
		if err != nil {
			t.Fatal(err)
		}
		// "slow" holds 1 (no live row), "fast" holds 1 (its last row not done).
		if info.Streams != 2 || info.OpenTrajectories != 2 {
			t.Fatalf("streams %d open trajectories %d, want 2 and 2", info.Streams, info.OpenTrajectories)
		}
		res := mustExtend(t, b, "slow", makeBatch(spec, []row{{val: 3}}, false))
		m := metas(t, b, res.FirstSeq)[0]
		if m.Step != 2 || m.PrevSeq != 1 {
			t.Fatalf("slow's next row: step %d prev %d, want step 2 prev 1 (the trajectory continues)", m.Step, m.PrevSeq)
		}
		if n, err := b.CloseStream("slow"); err != nil || n != 1 {
			t.Fatalf("CloseStream(slow) = %d, %v; want 1", n, err)
		}
		if info, _ := b.Info(); info.OpenTrajectories != 1 || info.Streams != 1 {
			t.Fatalf("after close: streams %d open %d, want 1 and 1", info.Streams, info.OpenTrajectories)
		}
	})
}

func TestBadBatchesWriteNothing(t *testing.T) {
	spec := testSpec(KindMemory, 10, false)
	good := func() *Batch { return makeBatch(spec, []row{{val: 1}, {val: 2, terminated: true}}, false) }
	tests := []struct {
		name   string
		mutate func(*Batch)
		field  string
	}{
		{"missing field", func(b *Batch) { delete(b.Fields, "action") }, "action"},
		{"extra field", func(b *Batch) { b.Fields["bogus"] = []byte{1} }, "bogus"},
		{"short field", func(b *Batch) { b.Fields["observation"] = b.Fields["observation"][:20] }, "observation"},
		{"bad bool", func(b *Batch) { b.Fields["next.truncated"][0] = 7 }, "next.truncated"},
		{"done without reason", func(b *Batch) { b.Fields["next.done"][0] = 1 }, "next.done"},
		{"reason without done", func(b *Batch) { b.Fields["next.done"][1] = 0 }, "next.done"},
		{"env length", func(b *Batch) { b.Env = []int64{0} }, "env"},
		{"zero rows", func(b *Batch) { b.Rows = 0 }, ""},
	}
	s := openStore(t, t.TempDir())
	defer s.Close()
	b := mustCreate(t, s, "bad", spec)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			batch := good()
			tc.mutate(batch)
			_, err := b.Extend("s", batch)
			var be *BatchError
			if !errors.Is(err, ErrInvalidBatch) || !errors.As(err, &be) || be.Field != tc.field {
				t.Fatalf("got %v, want a BatchError on field %q", err, tc.field)
			}
			if b.WriteCount() != 0 {
				t.Fatalf("write count %d after a rejected batch", b.WriteCount())
			}
		})
	}
}

func TestCompactTails(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec := testSpec(kind, 100, true)
		b := mustCreate(t, s, "compact", spec)
		rows := []row{{val: 0}, {val: 10, terminated: true, final: 100}, {val: 20}, {val: 30, truncated: true, final: 300}}
		// D rows.
		mustExtend(t, b, "s", makeBatch(spec, rows, true))
		// N rows: values on non-done rows are ignored.
		nb := makeBatch(spec, rows, false)
		nb.Fields["next.observation"] = makeBatch(testSpec(kind, 100, false), rows, false).Fields["next.observation"]
		mustExtend(t, b, "s", nb)
		// No final observations at all.
		mustExtend(t, b, "s", makeBatch(spec, rows, false))
		tail, ok := b.Column("next.observation")
		if !ok || !tail.Tail {
			t.Fatal("no tail column")
		}
		seqs := []int64{1, 3, 5, 7, 9, 11, 0}
		dst := [][]byte{make([]byte, 16*len(seqs))}
		m := make([]RowMeta, len(seqs))
		if _, err := b.Gather(seqs, []Column{tail}, dst, m); err != nil {
			t.Fatal(err)
		}
		wantTail := []float32{100, 300, 100, 300, 0, 0, 0}
		wantHas := []bool{true, true, true, true, false, false, false}
		for i := range seqs {
			if got := obsOf(dst[0][16*i:]); got != wantTail[i] || m[i].HasTail != wantHas[i] {
				t.Errorf("seq %d: tail %v has %v, want %v %v", seqs[i], got, m[i].HasTail, wantTail[i], wantHas[i])
			}
		}
		info, _ := b.Info()
		if fb := info.Bytes["next.observation"]; fb.Logical != 12*16 {
			t.Errorf("tail bytes %+v", fb)
		}
		// Partial final observations are refused.
		bad := makeBatch(spec, rows, true)
		bad.Fields["next.observation"] = bad.Fields["next.observation"][:16]
		if _, err := b.Extend("s", bad); !errors.Is(err, ErrInvalidBatch) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestCreateBufferSpecConflict(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemmap, 10, false)
	if _, created, err := s.CreateBuffer("x", spec); err != nil || !created {
		t.Fatal(created, err)
	}
	// Same spec in another field order: identical.
	same := spec.Clone()
	slices.Reverse(same.Fields)
	if _, created, err := s.CreateBuffer("x", same); err != nil || created {
		t.Fatalf("identical spec: created=%v err=%v", created, err)
	}
	other := spec.Clone()
	other.Capacity = 11
	if _, _, err := s.CreateBuffer("x", other); !errors.Is(err, ErrSpecConflict) {
		t.Fatalf("got %v, want ErrSpecConflict", err)
	}
	for _, name := range []string{"", "..", "a/b", "../x", "-x", "a..b", string(make([]byte, 65))} {
		if _, _, err := s.CreateBuffer(name, spec); !errors.Is(err, ErrInvalidName) {
			t.Errorf("name %q: got %v", name, err)
		}
	}
	bad := spec.Clone()
	bad.Storage = KindCompressed
	bad.Durability = DurabilityNone
	bad.RowMetaLayout = ""
	if _, _, err := s.CreateBuffer("x", bad); !errors.Is(err, ErrSpecConflict) {
		t.Errorf("same name, compressed: got %v, want ErrSpecConflict", err)
	}
}

func TestDeleteBuffer(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		dir := t.TempDir()
		s := openStore(t, dir)
		defer s.Close()
		spec := testSpec(kind, 10, false)
		b := mustCreate(t, s, "d", spec)
		mustExtend(t, b, "s", makeBatch(spec, []row{{val: 1}}, false))
		if err := s.DeleteBuffer("d"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Extend("s", makeBatch(spec, []row{{val: 1}}, false)); !errors.Is(err, ErrClosed) {
			t.Fatalf("extend after delete: %v", err)
		}
		if _, err := s.Buffer("d"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("lookup after delete: %v", err)
		}
		if err := s.DeleteBuffer("d"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		b2 := mustCreate(t, s, "d", spec)
		if b2.WriteCount() != 0 {
			t.Fatal("recreated buffer kept rows")
		}
	})
}

// TestMemoryRowGroup checks which fields a memory buffer lays out row-major
// with its records, and that rows and their metadata read back whole from
// that layout.
func TestMemoryRowGroup(t *testing.T) {
	image := Field{Name: "pixels", DType: Uint8, Shape: []int{84, 84, 4}}
	small := []string{"observation", "action", "next.reward", "next.done", "next.terminated", "next.truncated"}
	cases := []struct {
		name    string
		kind    Kind
		layout  RowMetaLayout
		extra   []Field
		grouped []string // fields in the group; the rest have their own column
		pitch   int64    // the group's row size
		recs    int64    // bytes from one record to the next
	}{
		{"cartpole", KindMemory, RowMetaPerRow, nil, small, 64, 64}, // a 32-byte record and 31 bytes of fields, padded to a cache line
		{"image stays a column", KindMemory, RowMetaPerRow, []Field{image}, small, 64, 64},
		{"cartpole with run records", KindMemory, RowMetaRuns, nil, small, 48, 48},     // a 16-byte record and 31 bytes of fields
		{"cartpole with strided runs", KindMemory, RowMetaStrided, nil, small, 40, 40}, // an 8-byte record and 31 bytes of fields
		{"memmap keeps columns", KindMemmap, RowMetaPerRow, nil, nil, 0, recordSize},
		// Memory records beside rows.meta version 2: a region of records
		// alone.
		{"memmap with run records keeps columns", KindMemmap, RowMetaRuns, nil, nil, memRunRecordSize, memRunRecordSize},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, t.TempDir())
			defer s.Close()
			spec := testSpec(tc.kind, 50, true)
			spec.Fields = append(spec.Fields, tc.extra...)
			spec.RowMetaLayout = tc.layout
			b := mustCreate(t, s, "b", spec)
			for _, c := range b.cols {
				want := int64(0)
				if slices.Contains(tc.grouped, c.name) {
					want = tc.pitch
				}
				if c.stride != want {
					t.Errorf("field %q: stride %d, want %d", c.name, c.stride, want)
				}
			}
			if (b.group != nil) != (tc.pitch > 0) {
				t.Errorf("row group region %v, want one: %v", b.group != nil, tc.pitch > 0)
			}
			if b.recPitch != tc.recs {
				t.Errorf("records %d bytes apart, want %d", b.recPitch, tc.recs)
			}
			rows := make([]row, 60) // the ring wraps
			for i := range rows {
				rows[i] = row{env: int64(i % 3), val: float32(10 * i), terminated: i%7 == 6}
			}
			batch := makeBatch(spec, rows, true)
			for _, f := range tc.extra {
				batch.Fields[f.Name] = make([]byte, 60*f.RowBytes())
				for i := range 60 {
					batch.Fields[f.Name][i*f.RowBytes()] = byte(i)
				}
			}
			mustExtend(t, b, "", batch)
			seqs := []int64{10, 59, 33, 10, 5}
			cols := make([]Column, 0, len(b.cols))
			dst := make([][]byte, 0, len(b.cols))
			for _, c := range b.cols {
				col, _ := b.Column(c.name)
				cols = append(cols, col)
				dst = append(dst, make([]byte, len(seqs)*col.RowBytes))
			}
			meta := make([]RowMeta, len(seqs))
			missing, err := b.Gather(seqs, cols, dst, meta)
			if err != nil || !slices.Equal(missing, []int{4}) {
				t.Fatalf("gather: missing %v, %v (want [4]: seq 5 was overwritten)", missing, err)
			}
			for j, seq := range seqs[:4] {
				if m := meta[j]; m.Seq != seq || m.Env != seq%3 || m.Terminated != (seq%7 == 6) {
					t.Errorf("seq %d: metadata %+v", seq, m)
				}
				for i, c := range cols {
					got := dst[i][j*c.RowBytes : (j+1)*c.RowBytes]
					if want := batch.Fields[c.Name][int(seq)*c.RowBytes : int(seq+1)*c.RowBytes]; !slices.Equal(got, want) {
						t.Errorf("seq %d field %q = %v, want %v", seq, c.Name, got[:min(8, len(got))], want[:min(8, len(want))])
					}
				}
			}
		})
	}
}

// TestGatherFieldWidths writes and reads rows of fields of every width the
// copy loops know (1, 2, 4, 8, 16 and 32 bytes) and of widths they do not
// (3, 12, 40), through both read paths, with every row there and with rows
// missing (never written, overwritten): each row's bytes come back where
// they belong, a missing row is zeros. The second of two 40-row extends
// into a 64-row ring wraps.
func TestGatherFieldWidths(t *testing.T) {
	extra := []Field{
		{Name: "i16", DType: Int16, Shape: []int{}},
		{Name: "u8x3", DType: Uint8, Shape: []int{3}},
		{Name: "f32x3", DType: Float32, Shape: []int{3}},
		{Name: "f64x4", DType: Float64, Shape: []int{4}},
		{Name: "u8x40", DType: Uint8, Shape: []int{40}},
	}
	const rows = 40 // an extend; two of them
	for _, kind := range []Kind{KindMemory, KindMemmap} {
		for _, tc := range []struct {
			name    string
			seqs    []int64
			missing []int
		}{
			{"all there", []int64{47, 16, 79, 47, 61, 39}, nil},
			{"missing", []int64{47, 5, 80, 79, 61}, []int{1, 2}}, // 5 was overwritten, 80 never written
		} {
			t.Run(fmt.Sprintf("%s/%s", kind, tc.name), func(t *testing.T) {
				s := openStore(t, t.TempDir())
				defer s.Close()
				spec := testSpec(kind, 64, true)
				spec.Fields = append(spec.Fields, extra...)
				b := mustCreate(t, s, "b", spec)
				var batches []*Batch
				for k := range 2 {
					batch := makeBatch(spec, make([]row, rows), false)
					for _, f := range extra {
						v := make([]byte, rows*f.RowBytes())
						for i := range v {
							v[i] = byte(i*7 + len(f.Name) + 101*k)
						}
						batch.Fields[f.Name] = v
					}
					mustExtend(t, b, "", batch)
					batches = append(batches, batch)
				}
				var cols []Column
				for _, f := range spec.Fields {
					c, _ := b.Column(f.Name)
					cols = append(cols, c)
				}
				check := func(path string, dst [][]byte, missing, wantMissing []int) {
					t.Helper()
					if !slices.Equal(missing, wantMissing) {
						t.Fatalf("%s: missing %v, want %v", path, missing, wantMissing)
					}
					for i, c := range cols {
						for j, seq := range tc.seqs {
							got := dst[i][j*c.RowBytes : (j+1)*c.RowBytes]
							want := make([]byte, c.RowBytes)
							if !slices.Contains(tc.missing, j) {
								r := seq % rows
								want = batches[seq/rows].Fields[c.Name][r*int64(c.RowBytes) : (r+1)*int64(c.RowBytes)]
							}
							if !bytes.Equal(got, want) {
								t.Errorf("%s: field %q (%d B), row %d (seq %d): %v, want %v", path, c.Name, c.RowBytes, j, seq, got, want)
							}
						}
					}
				}
				dsts := func() [][]byte {
					var d [][]byte
					for _, c := range cols {
						v := make([]byte, len(tc.seqs)*c.RowBytes)
						for i := range v {
							v[i] = 0xee // a missing row must be zeroed, not left
						}
						d = append(d, v)
					}
					return d
				}
				dst := dsts()
				missing, err := b.Gather(tc.seqs, cols, dst, nil)
				if err != nil {
					t.Fatal(err)
				}
				check("Gather", dst, missing, tc.missing)
				dst = dsts()
				if err := b.ReadIndex(func(ix Index) {
					// The caller's scratch keeps what it held.
					missing, err = ix.CopyIndexed(tc.seqs, cols, dst, []int{99})
				}); err != nil {
					t.Fatal(err)
				}
				if err != nil {
					t.Fatal(err)
				}
				check("CopyIndexed", dst, missing, append([]int{99}, tc.missing...))
			})
		}
	}
}

// TestBatchFlagsEveryRow puts a flag, or a bad flag byte, at each row of a
// 20-row batch (two blocks of eight that validation checks at once, then
// four it checks row by row): a valid row's flags come back on it alone,
// a bad one is reported at its row.
func TestBatchFlagsEveryRow(t *testing.T) {
	const n = 20
	spec := testSpec(KindMemory, 4*n, false)
	type flags struct{ done, term, trunc byte }
	cases := []struct {
		name  string
		set   flags
		field string // "" when the batch is valid
	}{
		{"terminated", flags{1, 1, 0}, ""},
		{"truncated", flags{1, 0, 1}, ""},
		{"both", flags{1, 1, 1}, ""},
		{"bad done byte", flags{2, 0, 0}, "next.done"},
		{"bad truncated byte", flags{0, 0, 255}, "next.truncated"},
		{"done without reason", flags{1, 0, 0}, "next.done"},
		{"reason without done", flags{0, 1, 0}, "next.done"},
	}
	s := openStore(t, t.TempDir())
	defer s.Close()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for p := range n {
				b := mustCreate(t, s, fmt.Sprintf("b%d", p), spec)
				batch := makeBatch(spec, make([]row, n), false)
				batch.Fields["next.done"][p] = tc.set.done
				batch.Fields["next.terminated"][p] = tc.set.term
				batch.Fields["next.truncated"][p] = tc.set.trunc
				_, err := b.Extend("", batch)
				if tc.field != "" {
					var be *BatchError
					if !errors.As(err, &be) || be.Field != tc.field || be.Row != p {
						t.Fatalf("row %d: got %v, want a BatchError on %q row %d", p, err, tc.field, p)
					}
					if err := s.DeleteBuffer(b.Name()); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("row %d: %v", p, err)
				}
				seqs := make([]int64, n)
				for i := range seqs {
					seqs[i] = int64(i)
				}
				meta := make([]RowMeta, n)
				if err := b.ReadIndex(func(ix Index) { ix.Rows(seqs, meta) }); err != nil {
					t.Fatal(err)
				}
				for i, m := range meta {
					want := flags{}
					if i == p {
						want = tc.set
					}
					got := flags{b2u(m.Done), b2u(m.Terminated), b2u(m.Truncated)}
					if got != want {
						t.Errorf("flag at row %d: row %d has done/terminated/truncated %v, want %v", p, i, got, want)
					}
				}
				if err := s.DeleteBuffer(b.Name()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// TestCopyFixed checks the unsafe row copies of copyFixed against a plain
// copy: every width it has a loop for, rows side by side (pitch = width)
// or in a row group (pitch larger), slots up to the last row the data
// holds, skipped slots (-1) left untouched, and a slot past the data a
// panic, never a read outside it.
func TestCopyFixed(t *testing.T) {
	for _, tc := range []struct {
		rb    int
		pitch int64
		ok    bool // copyFixed has a loop for rb
	}{
		{1, 1, true}, {1, 48, true}, {2, 2, true}, {2, 48, true}, {4, 4, true}, {4, 48, true},
		{8, 8, true}, {8, 48, true}, {16, 16, true}, {16, 48, true}, {32, 32, true}, {32, 64, true},
		{3, 3, false}, {12, 48, false}, {64, 64, false},
	} {
		t.Run(fmt.Sprintf("rb=%d/pitch=%d", tc.rb, tc.pitch), func(t *testing.T) {
			const rows = 37
			// As the last field of a row group: the data ends with the
			// last row's field, not with a whole pitch.
			data := make([]byte, (rows-1)*tc.pitch+int64(tc.rb))
			for i := range data {
				data[i] = byte(i*7 + 3)
			}
			slots := []int64{rows - 1, 0, -1, 5, rows - 1, 17, -1, 1}
			dst := bytes.Repeat([]byte{0xAA}, len(slots)*tc.rb)
			if got := copyFixed(dst, data, slots, tc.pitch, tc.rb); got != tc.ok {
				t.Fatalf("copyFixed reports %v, want %v", got, tc.ok)
			}
			if !tc.ok {
				return
			}
			for j, slot := range slots {
				want := bytes.Repeat([]byte{0xAA}, tc.rb)
				if slot >= 0 {
					want = data[slot*tc.pitch : slot*tc.pitch+int64(tc.rb)]
				}
				if got := dst[j*tc.rb : (j+1)*tc.rb]; !bytes.Equal(got, want) {
					t.Errorf("row %d (slot %d): %x, want %x", j, slot, got, want)
				}
			}
			for _, bad := range []int64{rows, rows + 1000} {
				func() {
					defer func() {
						if recover() == nil {
							t.Errorf("slot %d of %d rows: no panic", bad, rows)
						}
					}()
					copyFixed(dst, data, []int64{0, bad}, tc.pitch, tc.rb)
				}()
			}
		})
	}
}

// TestGatherForeignColumn: a Column handle is bound to the buffer that
// returned it. One of another buffer, or of a buffer closed since (the same
// name reopened is a new buffer), is refused with an error by Gather and
// CopyIndexed instead of being read with the wrong buffer's slots.
func TestGatherForeignColumn(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := testSpec(KindMemmap, 64, false)
	a := mustCreate(t, s, "a", spec)
	other := mustCreate(t, s, "b", testSpec(KindMemmap, 8, false))
	rows := make([]row, 10)
	for i := range rows {
		rows[i] = row{val: float32(i)}
	}
	mustExtend(t, a, "", makeBatch(spec, rows, false))
	mustExtend(t, other, "", makeBatch(spec, rows[:3], false))
	own, _ := a.Column("action")
	foreign, _ := other.Column("action")
	seqs := []int64{0, 5, 9}
	dst := [][]byte{make([]byte, len(seqs)*own.RowBytes)}
	if _, err := a.Gather(seqs, []Column{own}, dst, nil); err != nil {
		t.Fatalf("gather with the buffer's own column: %v", err)
	}
	check := func(what string, c Column, b *Buffer) {
		t.Helper()
		if _, err := b.Gather(seqs, []Column{c}, dst, nil); err == nil || !strings.Contains(err.Error(), "not from this buffer") {
			t.Errorf("gather with %s: %v, want an error naming the column as not from this buffer", what, err)
		}
		var err error
		if rerr := b.ReadIndex(func(ix Index) { _, err = ix.CopyIndexed(seqs, []Column{c}, dst, nil) }); rerr != nil {
			t.Fatal(rerr)
		}
		if err == nil || !strings.Contains(err.Error(), "not a plain column of this buffer") {
			t.Errorf("CopyIndexed with %s: %v, want an error", what, err)
		}
	}
	check("another buffer's column", foreign, a)
	_, a = reopenBuffer(t, s, dir, "a")
	check("a column of the buffer before it was closed", own, a)
}
