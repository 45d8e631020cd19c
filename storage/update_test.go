package storage

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// mutableSpec is testSpec plus a mutable field "h" float32 [3].
func mutableSpec(kind Kind, capacity int64) Spec {
	s := testSpec(kind, capacity, true)
	s.Fields = append(s.Fields, Field{Name: "h", DType: Float32, Shape: []int{3}, Mutable: true})
	return s
}

// hRows encodes n rows of h, row i = (v_i, v_i, v_i).
func hRows(vals ...float32) []byte {
	out := make([]byte, 12*len(vals))
	for i, v := range vals {
		for k := range 3 {
			binary.LittleEndian.PutUint32(out[12*i+4*k:], math.Float32bits(v))
		}
	}
	return out
}

// withH adds an h column to batch: row i = base + i.
func withH(b *Batch, base float32) *Batch {
	vals := make([]float32, b.Rows)
	for i := range vals {
		vals[i] = base + float32(i)
	}
	b.Fields["h"] = hRows(vals...)
	return b
}

// readH gathers h and observation of seqs; h rows come back as their
// first value, after checking the three values agree (no torn row).
func readH(t testing.TB, b *Buffer, seqs ...int64) (h, obs []float32, missing []int) {
	t.Helper()
	hc, _ := b.Column("h")
	oc, _ := b.Column("observation")
	dst := [][]byte{make([]byte, 12*len(seqs)), make([]byte, 16*len(seqs))}
	missing, err := b.Gather(seqs, []Column{hc, oc}, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range seqs {
		r := dst[0][12*i : 12*i+12]
		v := obsOf(r)
		if obsOf(r[4:]) != v || obsOf(r[8:]) != v {
			t.Fatalf("seq %d: torn h row %v %v %v", seqs[i], v, obsOf(r[4:]), obsOf(r[8:]))
		}
		h, obs = append(h, v), append(obs, obsOf(dst[1][16*i:]))
	}
	return h, obs, missing
}

// UpdateFields sets the mutable field of live rows and nothing else;
// rows overwritten since (or never written) count as stale; the values
// survive a reopen, and the row checksums (which leave mutable fields
// out) still verify.
func TestUpdateFields(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			b := mustCreate(t, s, "b", mutableSpec(kind, 8))
			rows := make([]row, 12) // 12 rows in a ring of 8: seqs 0-3 are overwritten
			for i := range rows {
				rows[i] = row{val: float32(10 * i)}
			}
			mustExtend(t, b, "w", withH(makeBatch(b.Spec(), rows, true), 100))
			seqs := []int64{5, 2, 11, 7, 20, -1, 5}
			updated, stale, err := b.UpdateFields(seqs, map[string][]byte{"h": hRows(-5, -2, -11, -7, -20, -1, -55)})
			if err != nil {
				t.Fatal(err)
			}
			if updated != 4 || stale != 3 {
				t.Fatalf("updated %d stale %d, want 4 (5 twice, 11, 7) and 3 (2 overwritten, 20 unwritten, -1)", updated, stale)
			}
			check := func(b *Buffer) {
				t.Helper()
				live := []int64{4, 5, 6, 7, 8, 9, 10, 11}
				h, obs, missing := readH(t, b, live...)
				if len(missing) != 0 {
					t.Fatalf("missing %v", missing)
				}
				want := map[int64]float32{5: -55, 7: -7, 11: -11} // the last value for 5 wins
				for i, seq := range live {
					w, ok := want[seq]
					if !ok {
						w = 100 + float32(seq)
					}
					if h[i] != w || obs[i] != float32(10*seq) {
						t.Fatalf("seq %d: h %v observation %v, want %v and %v", seq, h[i], obs[i], w, float32(10*seq))
					}
				}
			}
			check(b)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if kind == KindMemory {
				return
			}
			rep, err := Verify(dir, nil)
			if err != nil || !rep.OK() {
				t.Fatalf("verify after updates: %v %+v", err, rep)
			}
			s = openStore(t, dir)
			defer s.Close()
			b, err = s.Buffer("b")
			if err != nil {
				t.Fatal(err)
			}
			check(b)
		})
	}
}

func TestUpdateFieldsRejectsBadInput(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	b := mustCreate(t, s, "b", mutableSpec(KindMemmap, 16))
	mustExtend(t, b, "w", withH(makeBatch(b.Spec(), []row{{val: 1}, {val: 2}}, true), 7))
	tests := []struct {
		name   string
		fields map[string][]byte
		want   []string
	}{
		{"no fields", map[string][]byte{}, []string{"none given"}},
		{"unknown field", map[string][]byte{"z": hRows(1, 2)}, []string{`field "z"`, "not a field", "mutable fields: h"}},
		{"immutable field", map[string][]byte{"h": hRows(1, 2), "next.reward": make([]byte, 8)}, []string{`field "next.reward"`, "is not mutable"}},
		{"wrong size", map[string][]byte{"h": hRows(1)}, []string{`field "h"`, "has 12 bytes, want 24"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := b.UpdateFields([]int64{0, 1}, tc.fields)
			if !errorsIs(err, ErrInvalidBatch) {
				t.Fatalf("error %v, want ErrInvalidBatch", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if h, _, _ := readH(t, b, 0, 1); h[0] != 7 || h[1] != 8 {
				t.Fatalf("a refused update changed h: %v", h)
			}
		})
	}
}

// Readers never see a mutable row half updated: every update writes the
// same value into all three elements of h, and concurrent gathers (which
// check the elements agree) and updates run side by side.
func TestUpdateFieldsConcurrentReadersSeeWholeRows(t *testing.T) {
	for _, kind := range []Kind{KindMemory, KindMemmap} {
		t.Run(string(kind), func(t *testing.T) {
			s := openStore(t, t.TempDir())
			defer s.Close()
			b := mustCreate(t, s, "b", mutableSpec(kind, 64))
			rows := make([]row, 64)
			mustExtend(t, b, "w", withH(makeBatch(b.Spec(), rows, true), 0))
			seqs := make([]int64, 64)
			for i := range seqs {
				seqs[i] = int64(i)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if _, _, missing := readH(t, b, seqs...); len(missing) != 0 {
							t.Errorf("an update made rows %v missing", missing)
							return
						}
					}
				}()
			}
			vals := make([]float32, 64)
			for k := range 2000 {
				for i := range vals {
					vals[i] = float32(k)
				}
				if _, _, err := b.UpdateFields(seqs, map[string][]byte{"h": hRows(vals...)}); err != nil {
					t.Fatal(err)
				}
			}
			stop.Store(true)
			wg.Wait()
			if h, _, _ := readH(t, b, 0, 63); h[0] != 1999 || h[1] != 1999 {
				t.Fatalf("after the last update h = %v", h)
			}
		})
	}
}

func TestMutableSpec(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Spec)
		path string
		want string
	}{
		{"episode flag", func(s *Spec) { s.Fields[3].Mutable = true }, "fields.next.done.mutable", "episode flag"},
		{"obs key of a compact buffer", func(s *Spec) { s.Fields[0].Mutable = true }, "fields.observation.mutable", "obs key"},
		{"compressed on purpose", func(s *Spec) {
			s.Storage = KindCompressed
			s.Fields[len(s.Fields)-1].Compress = new(true)
		}, "fields.h.mutable", "stays plain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mutableSpec(KindMemmap, 16)
			tc.edit(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want %s: %s", err, tc.path, tc.want)
			}
		})
	}
	// The flag survives the spec's JSON, and keeps h out of chunks.
	s := mutableSpec(KindCompressed, 16)
	raw, err := s.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"h":{"dtype":"float32","shape":[3],"mutable":true}`) {
		t.Fatalf("spec JSON %s", raw)
	}
	back, err := ParseSpec(raw)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := back.Field("h")
	if !f.Mutable || back.WithDefaults().Compressed(f) {
		t.Fatalf("parsed field %+v (compressed %v)", f, back.WithDefaults().Compressed(f))
	}
	if _, err := ParseSpec([]byte(strings.Replace(string(raw), `"mutable":true`, `"mutable":"yes"`, 1))); err == nil ||
		!strings.Contains(err.Error(), "fields.h.mutable") {
		t.Fatalf("a non-boolean mutable: %v", err)
	}
}

const updateCrashEnv = "RBD_UPDATE_CRASH_DIR"

// TestUpdateCrashHelper is not a test: it is the process
// TestUpdateKilledMidway starts and kills. It fills a memmap buffer (fsync
// durability), then updates h of every row with 1, 2, 3, ... in seq
// order, printing "ACK k" once update k returned, until killed.
func TestUpdateCrashHelper(t *testing.T) {
	dir := os.Getenv(updateCrashEnv)
	if dir == "" {
		t.Skip("helper process of TestUpdateKilledMidway")
	}
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := mutableSpec(KindMemmap, updateCrashRows)
	spec.Durability = DurabilityFsync
	b := mustCreate(t, s, "b", spec)
	rows := make([]row, updateCrashRows)
	for i := range rows {
		rows[i] = row{val: float32(i)}
	}
	mustExtend(t, b, "w", withH(makeBatch(b.Spec(), rows, true), 0))
	seqs := make([]int64, updateCrashRows)
	vals := make([]float32, updateCrashRows)
	for i := range seqs {
		seqs[i] = int64(i)
	}
	fmt.Println("READY")
	for k := 1; ; k++ {
		for i := range vals {
			vals[i] = float32(k)
		}
		if _, _, err := b.UpdateFields(seqs, map[string][]byte{"h": hRows(vals...)}); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("ACK %d\n", k)
	}
}

const updateCrashRows = 4096

// kill -9 of a process in the middle of a stream of updates: the buffer
// reopens with no damage and every immutable byte exact; each row's h
// holds the last acknowledged update or the one under way, and the rows
// holding the newer one are a prefix in update order (seq order).
func TestUpdateKilledMidway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills writer processes")
	}
	for round := range 3 {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestUpdateCrashHelper$")
		cmd.Env = append(os.Environ(), updateCrashEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		acked, want := 0, 20+40*round
		for sc.Scan() {
			if n, ok := strings.CutPrefix(sc.Text(), "ACK "); ok {
				acked, _ = strconv.Atoi(n)
				if acked >= want {
					break
				}
			}
		}
		_ = cmd.Process.Kill()
		for sc.Scan() { // what the pipe still holds was acknowledged too
			if n, ok := strings.CutPrefix(sc.Text(), "ACK "); ok {
				acked, _ = strconv.Atoi(n)
			}
		}
		_ = cmd.Wait()
		if acked < want {
			t.Fatalf("round %d: the helper acknowledged %d updates before it ended", round, acked)
		}
		rep, err := Verify(dir, nil)
		if err != nil || !rep.OK() {
			t.Fatalf("round %d: verify after kill -9: %v %+v", round, err, rep)
		}
		s := openStore(t, dir)
		b, err := s.Buffer("b")
		if err != nil {
			t.Fatal(err)
		}
		seqs := make([]int64, updateCrashRows)
		for i := range seqs {
			seqs[i] = int64(i)
		}
		hc, _ := b.Column("h")
		oc, _ := b.Column("observation")
		dst := [][]byte{make([]byte, 12*updateCrashRows), make([]byte, 16*updateCrashRows)}
		if missing, err := b.Gather(seqs, []Column{hc, oc}, dst, nil); err != nil || len(missing) != 0 {
			t.Fatalf("round %d: gather: %v, missing %d rows", round, err, len(missing))
		}
		// Rows run: all newer (the update under way reached them), at most
		// one row caught mid-copy, then all older.
		const (
			newer = iota
			mixed
			older
		)
		phase := newer
		for i := range seqs {
			if got := obsOf(dst[1][16*i:]); got != float32(i) {
				t.Fatalf("round %d: seq %d observation %v, want %v", round, i, got, float32(i))
			}
			nNew, nOld := 0, 0
			for k := range 3 {
				switch obsOf(dst[0][12*i+4*k:]) {
				case float32(acked + 1):
					nNew++
				case float32(acked):
					nOld++
				}
			}
			rowPhase := mixed
			switch {
			case nNew+nOld != 3:
				t.Fatalf("round %d: seq %d h holds a value that is neither update %d nor %d", round, i, acked, acked+1)
			case nNew == 3:
				rowPhase = newer
			case nOld == 3:
				rowPhase = older
			}
			if rowPhase < phase || rowPhase == mixed && phase == mixed {
				t.Fatalf("round %d: seq %d is %d after rows of %d: updates did not run in seq order", round, i, rowPhase, phase)
			}
			phase = rowPhase
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: killed after %d acknowledged updates; h intact", round, acked)
	}
}

// BenchmarkUpdateFields writes back recurrent states the way an R2D2
// learner does: 64 slices x 80 rows of float32 [64] (1.3 MB) per call, at
// random live seqs of a 10^5-row buffer, memory and memmap. One op is one
// call.
//
//	go test ./storage -run '^$' -bench BenchmarkUpdateFields -benchtime 2s -count 3 -cpu 2
func BenchmarkUpdateFields(b *testing.B) {
	const rows, h, n = 100_000, 64, 64 * 80
	for _, kind := range []Kind{KindMemory, KindMemmap} {
		b.Run("storage="+string(kind), func(b *testing.B) {
			s := openStore(b, b.TempDir())
			defer s.Close()
			spec := testSpec(kind, rows, true)
			spec.Fields = append(spec.Fields, Field{Name: "h", DType: Float32, Shape: []int{h}, Mutable: true})
			buf := mustCreate(b, s, "b", spec)
			fill := make([]row, 1000)
			for i := range fill {
				fill[i].val = float32(i)
			}
			for range rows / len(fill) {
				batch := makeBatch(buf.Spec(), fill, true)
				batch.Fields["h"] = make([]byte, len(fill)*4*h)
				mustExtend(b, buf, "w", batch)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			seqs := make([]int64, n)
			for i := range seqs {
				seqs[i] = rng.Int64N(rows)
			}
			vals := map[string][]byte{"h": make([]byte, n*4*h)}
			b.SetBytes(int64(n * 4 * h))
			b.ReportAllocs()
			for b.Loop() {
				if _, stale, err := buf.UpdateFields(seqs, vals); err != nil || stale != 0 {
					b.Fatal(err, stale)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// A hot checkpoint of a buffer with a mutable field (memory too, whose rows
// get their checksum at copy time) opens with every row and its updated
// values; and a spec that differs only in "mutable" is another spec.
func TestMutableCheckpointAndSpecConflict(t *testing.T) {
	for _, kind := range []Kind{KindMemory, KindMemmap} {
		t.Run(string(kind), func(t *testing.T) {
			s := openStore(t, t.TempDir())
			defer s.Close()
			b := mustCreate(t, s, "b", mutableSpec(kind, 8))
			mustExtend(t, b, "w", withH(makeBatch(b.Spec(), make([]row, 4), true), 10))
			if _, _, err := b.UpdateFields([]int64{2}, map[string][]byte{"h": hRows(-2)}); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(t.TempDir(), "cp")
			if _, err := b.Checkpoint(context.Background(), dest, nil); err != nil {
				t.Fatal(err)
			}
			if rep, err := Verify(dest, nil); err != nil || !rep.OK() {
				t.Fatalf("verify the checkpoint: %v %+v", err, rep)
			}
			c := openStore(t, dest)
			defer c.Close()
			cb, err := c.Buffer("b")
			if err != nil {
				t.Fatal(err)
			}
			h, _, missing := readH(t, cb, 0, 1, 2, 3)
			if len(missing) != 0 || h[0] != 10 || h[2] != -2 || h[3] != 13 {
				t.Fatalf("checkpoint rows: h %v, missing %v", h, missing)
			}
			immutable := mutableSpec(kind, 8)
			immutable.Fields[len(immutable.Fields)-1].Mutable = false
			if _, _, err := s.CreateBuffer("b", immutable); !errorsIs(err, ErrSpecConflict) {
				t.Fatalf("create with h immutable over a mutable h: %v, want a spec conflict", err)
			}
		})
	}
}
