package storage

// The corruption table of the compressed kind: each case damages the chunk
// segments of a freshly written, cleanly closed data dir (a compressed
// buffer whose observation is a frame stack, with sealed chunks, fragments
// of open chunks and a ring that has wrapped, in several segments) and
// states what must happen: Open refuses it naming the file, or Open
// accepts it and Verify reports the damage naming the rows' seqs (or,
// for a torn tail above the durable watermark only, reports nothing). In
// every case a row is served exactly as written or not at all: Gather
// reports it missing or returns an error naming buffer, field and seqs —
// never other bytes, never a panic.

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	ccBuf   = "cz"  // the buffer the table damages
	ccOther = "czo" // same spec, another uid: the donor of a foreign segment
)

// ccSpec is czSpecFor(czFsync) with larger, incompressible features, so
// that a few hundred rows span several segments (of 64 KiB at least).
func ccSpec() Spec {
	s := czSpecFor(czFsync)
	s.Capacity = 300
	s.Durability = DurabilityFlush
	s.Fields[1].Shape = []int{100}
	return s
}

// ccBuild writes both buffers of the fixture the same way: 640 rows over
// three envs on stream "a", with anonymous extends and stream closes
// (seals) among them, leaving trajectories open at the end (fragments).
func ccBuild(t testing.TB, s *Store) {
	for _, name := range []string{ccBuf, ccOther} {
		spec := ccSpec()
		b := mustCreate(t, s, name, spec)
		stk := newCzStacker(spec)
		tok := int64(1)
		for k := 0; tok < 640; k++ {
			n := 1 + int(crashMix(uint64(k))%20)
			stream, use := "a", stk
			if k%9 == 4 {
				stream, use = "", newCzStacker(spec)
			}
			tokens := make([]int64, n)
			wants := make([]czWant, n)
			for i := range tokens {
				tokens[i] = tok
				wants[i] = use.next(tok)
				tok++
			}
			mustExtend(t, b, stream, czBatch(spec, tokens, wants, k%2 == 0))
			if k%13 == 12 {
				if _, err := b.CloseStream("a"); err != nil {
					t.Fatal(err)
				}
				stk = newCzStacker(spec)
			}
		}
	}
}

func ccPristine(t testing.TB) *pristineStore {
	return pristine(t, "compressed-corruption", ccBuild)
}

// ccRec is one whole record of a segment of the fixture.
type ccRec struct {
	seg string // relative path
	off int
	n   int
	rec *chunkRecord
}

func ccTailFields(spec Spec) []bool {
	var tails []bool
	for _, f := range spec.Fields {
		if spec.Compressed(f) {
			tails = append(tails, slices.Contains(spec.ObsKeys, f.Name) && spec.CompactObs)
		}
	}
	return tails
}

// ccSegments lists the segments of buf in the fixture, oldest first.
func ccSegments(p *pristineStore, buf string) []string {
	var segs []string
	for rel := range p.files {
		if strings.HasPrefix(rel, "buffers/"+buf+"/seg.") {
			segs = append(segs, rel)
		}
	}
	slices.Sort(segs)
	return segs
}

func ccRecords(t testing.TB, p *pristineStore, seg string) []ccRec {
	t.Helper()
	spec := ccSpec()
	data := p.files[seg]
	var out []ccRec
	for off := segHeaderSize; off < len(data); {
		n, err := recordLen(data[off:])
		if err != nil || off+n > len(data) {
			t.Fatalf("fixture segment %s is torn at %d", seg, off)
		}
		r, err := decodeChunkRecord(data[off:off+n], ccTailFields(spec), spec.Compression.ChunkLen)
		if err != nil {
			t.Fatalf("fixture segment %s offset %d: %v", seg, off, err)
		}
		out = append(out, ccRec{seg: seg, off: off, n: n, rec: r})
		off += n
	}
	return out
}

// liveSeqs are the seqs of r that are live rows of the fixture.
func (r ccRec) liveSeqs(p *pristineStore) []int64 {
	var out []int64
	for _, s := range r.rec.Seqs {
		if _, ok := p.rows[ccBuf][s]; ok {
			out = append(out, s)
		}
	}
	return out
}

// ccHolders counts, per seq, the records of buf in the fixture that hold
// it (a fragment and the seal that supersedes it both do).
func ccHolders(t testing.TB, p *pristineStore) map[int64]int {
	n := map[int64]int{}
	for _, seg := range ccSegments(p, ccBuf) {
		for _, r := range ccRecords(t, p, seg) {
			for _, s := range r.rec.Seqs {
				n[s]++
			}
		}
	}
	return n
}

// onlyHere are the live seqs of r that no other record holds: losing r
// loses them.
func (r ccRec) onlyHere(p *pristineStore, holders map[int64]int) []int64 {
	var out []int64
	for _, s := range r.liveSeqs(p) {
		if holders[s] == 1 {
			out = append(out, s)
		}
	}
	return out
}

// ccTarget finds the longest sealed record, in an older segment, whose
// rows are all live and held by no other record (its damage costs live
// rows).
func ccTarget(t testing.TB, p *pristineStore) ccRec {
	t.Helper()
	holders := ccHolders(t, p)
	var best ccRec
	segs := ccSegments(p, ccBuf)
	for _, seg := range segs[:len(segs)-1] {
		for _, r := range ccRecords(t, p, seg) {
			if r.rec.Kind == recSealed && len(r.onlyHere(p, holders)) == len(r.rec.Seqs) && (best.rec == nil || len(r.rec.Seqs) > len(best.rec.Seqs)) {
				best = r
			}
		}
	}
	if best.rec == nil || len(best.rec.Seqs) < 2 {
		t.Fatal("the fixture has no sealed chunk of live rows held nowhere else")
	}
	return best
}

// ccServed gathers every row the fixture served, one by one, from b: each
// must be exactly as written, reported missing, or refused with an error
// that names the buffer. It returns the seqs served, and the errors.
func ccServed(t *testing.T, b *Buffer, want map[int64]servedRow) (map[int64]bool, []error) {
	t.Helper()
	cols := readColumns(b)
	served := map[int64]bool{}
	var errs []error
	for _, seq := range slices.Sorted(maps.Keys(want)) {
		dst := crashDst(cols, 1)
		meta := make([]RowMeta, 1)
		missing, err := b.Gather([]int64{seq}, cols, dst, meta)
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", b.Name())) {
				t.Errorf("seq %d: gather error does not name buffer %q: %v", seq, b.Name(), err)
			}
			errs = append(errs, err)
			continue
		}
		if len(missing) > 0 {
			continue
		}
		w := want[seq]
		got, exp := meta[0], w.meta
		if got.NextSeq != exp.NextSeq && got.NextSeq != -1 {
			t.Errorf("seq %d: next_seq %d, written %d", seq, got.NextSeq, exp.NextSeq)
		}
		got.NextSeq, exp.NextSeq = 0, 0
		if got != exp {
			t.Errorf("seq %d: metadata\n got %+v\nwant %+v", seq, got, exp)
		}
		for i, c := range cols {
			if !bytes.Equal(dst[i], w.cols[c.Name]) {
				t.Errorf("seq %d column %q: served other bytes than were written (wrong data)", seq, c.Name)
			}
		}
		served[seq] = true
	}
	for _, seq := range b.LiveSeqs(0, 1<<30) {
		if _, ok := want[seq]; !ok {
			t.Errorf("buffer %q serves seq %d, which was not live when the store was closed", b.Name(), seq)
		}
	}
	return served, errs
}

// ccDir is one damaged copy of the fixture.
type ccDir struct {
	t   *testing.T
	dir string
	p   *pristineStore
}

func (d *ccDir) abs(rel string) string { return filepath.Join(d.dir, filepath.FromSlash(rel)) }

func (d *ccDir) xor(rel string, off int, mask byte) {
	d.t.Helper()
	b, err := os.ReadFile(d.abs(rel))
	if err != nil {
		d.t.Fatal(err)
	}
	b[off] ^= mask
	if err := os.WriteFile(d.abs(rel), b, 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// ccDamage is what a case did and what must follow.
type ccDamage struct {
	seg string // the damaged segment (relative path)
	// lost: live rows that must no longer be served. Verify must report
	// a problem naming one of them.
	lost []int64
	// clean: Verify reports nothing, every row is served.
	clean bool
	// openErr: Open refuses the data dir with a *CorruptionError naming
	// seg at offset openOff.
	openErr bool
	openOff int64
	// segNamed: a problem names the damaged segment.
	segNamed bool
}

func TestCompressedCorruptionTable(t *testing.T) {
	p := ccPristine(t)
	segs := ccSegments(p, ccBuf)
	if len(segs) < 3 {
		t.Fatalf("the fixture has %d segments, want at least 3", len(segs))
	}
	holders := ccHolders(t, p)
	cases := []struct {
		name   string
		damage func(d *ccDir) ccDamage
	}{
		{"sealed chunk payload byte flipped", func(d *ccDir) ccDamage {
			r := ccTarget(t, d.p)
			f := r.rec.Fields[0] // observation
			d.xor(r.seg, r.off+f.PayloadOff+len(f.Payload)/2, 0x10)
			return ccDamage{seg: r.seg, lost: r.rec.Seqs, segNamed: true}
		}},
		{"features payload's last byte flipped", func(d *ccDir) ccDamage {
			r := ccTarget(t, d.p)
			f := r.rec.Fields[1]
			d.xor(r.seg, r.off+f.PayloadOff+len(f.Payload)-1, 0x01)
			return ccDamage{seg: r.seg, lost: r.rec.Seqs, segNamed: true}
		}},
		{"record header trajectory byte flipped", func(d *ccDir) ccDamage {
			r := ccTarget(t, d.p)
			d.xor(r.seg, r.off+16, 0x01)
			return ccDamage{seg: r.seg, lost: r.rec.Seqs, segNamed: true}
		}},
		{"record header length byte flipped", func(d *ccDir) ccDamage {
			r := ccTarget(t, d.p)
			d.xor(r.seg, r.off+7, 0x40)
			return ccDamage{seg: r.seg, lost: r.rec.Seqs, segNamed: true}
		}},
		{"record header frame mode byte flipped", func(d *ccDir) ccDamage {
			r := ccTarget(t, d.p)
			d.xor(r.seg, r.off+chunkHeaderSize+8*len(r.rec.Seqs)+fieldHeaderSize, 0x01)
			return ccDamage{seg: r.seg, lost: r.rec.Seqs, segNamed: true}
		}},
		{"newest segment truncated mid-record below the watermark", func(d *ccDir) ccDamage {
			seg := segs[len(segs)-1]
			recs := ccRecords(t, d.p, seg)
			last := recs[len(recs)-1]
			if err := os.Truncate(d.abs(seg), int64(last.off+last.n/2)); err != nil {
				t.Fatal(err)
			}
			return ccDamage{seg: seg, lost: last.onlyHere(d.p, holders), segNamed: true}
		}},
		{"newest segment truncated mid-record above the watermark", func(d *ccDir) ccDamage {
			// A torn tail is what a crash (or a power loss) leaves when
			// the rows were not durable yet: move the watermark below the
			// rows of the last record, then tear it.
			seg := segs[len(segs)-1]
			recs := ccRecords(t, d.p, seg)
			last := recs[len(recs)-1]
			meta := d.abs(cvBufRel(ccBuf, "rows.meta"))
			b, err := os.ReadFile(meta)
			if err != nil {
				t.Fatal(err)
			}
			putWatermark(b, slices.Min(last.rec.Seqs))
			if err := os.WriteFile(meta, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(d.abs(seg), int64(last.off+last.n/2)); err != nil {
				t.Fatal(err)
			}
			return ccDamage{seg: seg, clean: true, lost: last.onlyHere(d.p, holders)}
		}},
		{"segment of another buffer (uid)", func(d *ccDir) ccDamage {
			seg := segs[0]
			donor := "buffers/" + ccOther + "/" + path.Base(seg)
			b, ok := d.p.files[donor]
			if !ok {
				t.Fatalf("the donor buffer has no %s", path.Base(seg))
			}
			if err := os.WriteFile(d.abs(seg), b, 0o644); err != nil {
				t.Fatal(err)
			}
			return ccDamage{seg: seg, openErr: true, openOff: 16, segNamed: true}
		}},
		{"oldest segment deleted", func(d *ccDir) ccDamage {
			seg := segs[0]
			here := map[int64]int{}
			recs := ccRecords(t, d.p, seg)
			for _, r := range recs {
				for _, s := range r.rec.Seqs {
					here[s]++
				}
			}
			var lost []int64 // live rows held only by records of this segment
			for _, r := range recs {
				for _, s := range r.liveSeqs(d.p) {
					if here[s] == holders[s] && !slices.Contains(lost, s) {
						lost = append(lost, s)
					}
				}
			}
			if len(lost) == 0 {
				t.Fatalf("the oldest segment %s holds no live row", seg)
			}
			if err := os.Remove(d.abs(seg)); err != nil {
				t.Fatal(err)
			}
			return ccDamage{seg: seg, lost: lost}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &ccDir{t: t, dir: t.TempDir(), p: p}
			writeTree(t, d.dir, p.files)
			dmg := tc.damage(d)
			ccCheckDamage(t, d, dmg)
		})
	}
}

// ccCheckDamage checks Verify, Open and every read against what a case
// says its damage must cause.
func ccCheckDamage(t *testing.T, d *ccDir, dmg ccDamage) {
	t.Helper()
	rep, err := Verify(d.dir, nil)
	if err != nil {
		t.Fatalf("verify could not run: %v", err)
	}
	var probs []string
	for _, br := range rep.Buffers {
		switch {
		case br.Name == ccBuf:
			probs = br.Problems
		case len(br.Problems) > 0:
			t.Errorf("verify reports problems in the undamaged buffer %q: %v", br.Name, br.Problems)
		}
	}
	all := strings.Join(probs, "\n")
	switch {
	case dmg.clean && len(probs) > 0:
		t.Errorf("verify reports %d problem(s) for a torn tail above the watermark: %s", len(probs), probs[0])
	case !dmg.clean && len(probs) == 0:
		t.Errorf("verify reports no problem")
	}
	if dmg.segNamed && !dmg.clean && !strings.Contains(all, path.Base(dmg.seg)) {
		t.Errorf("no problem names the damaged segment %s:\n%s", path.Base(dmg.seg), all)
	}
	if len(dmg.lost) > 0 && !dmg.clean && !dmg.openErr {
		named := false
		for _, s := range dmg.lost {
			named = named || strings.Contains(all, fmt.Sprintf("seq %d ", s))
		}
		if !named {
			t.Errorf("no problem names a lost row (seqs %v):\n%s", dmg.lost, all)
		}
	}

	s, err := Open(d.dir, nil)
	if dmg.openErr {
		var ce *CorruptionError
		switch {
		case err == nil:
			s.Close()
			t.Fatalf("Open accepted a data dir with a foreign segment")
		case !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce):
			t.Fatalf("Open: %v; want a *CorruptionError", err)
		case ce.Path != d.abs(dmg.seg) || ce.Offset != dmg.openOff:
			t.Fatalf("Open: corruption at %s offset %d, want %s offset %d", ce.Path, ce.Offset, d.abs(dmg.seg), dmg.openOff)
		}
		return
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	b, err := s.Buffer(ccBuf)
	if err != nil {
		t.Fatal(err)
	}
	served, errs := ccServed(t, b, d.p.rows[ccBuf])
	t.Logf("%d problem(s); %d of %d rows served; %d rows held only by the damaged record(s)", len(probs), len(served), len(d.p.rows[ccBuf]), len(dmg.lost))
	for _, e := range errs {
		t.Errorf("a row of a damaged store opened with its damage dropped cannot be read: %v", e)
	}
	for _, seq := range dmg.lost {
		if served[seq] {
			t.Errorf("seq %d, whose chunk record is damaged, is served", seq)
		}
	}
	if dmg.clean && len(served) < len(d.p.rows[ccBuf])-len(dmg.lost) {
		t.Errorf("only %d of %d rows served after a torn tail above the watermark", len(served), len(d.p.rows[ccBuf]))
	}
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	if (info.Damaged > 0) == dmg.clean {
		t.Errorf("Info reports %d damaged rows", info.Damaged)
	}
	// The damaged buffer still takes writes, which read back.
	spec := b.Spec()
	stk := newCzStacker(spec)
	tokens := []int64{1 << 45, 1<<45 + 1, 1<<45 + 2, 1<<45 + 3}
	wants := make([]czWant, len(tokens))
	for i, tok := range tokens {
		wants[i] = stk.next(tok)
	}
	res, err := b.Extend("after", czBatch(spec, tokens, wants, false))
	if err != nil {
		t.Fatalf("extend after reopening a damaged store: %v", err)
	}
	cols := readColumns(b)
	dst := crashDst(cols, len(tokens))
	metas := make([]RowMeta, len(tokens))
	seqs := []int64{res.FirstSeq, res.FirstSeq + 1, res.FirstSeq + 2, res.FirstSeq + 3}
	if missing, err := b.Gather(seqs, cols, dst, metas); err != nil || len(missing) > 0 {
		t.Fatalf("new rows: missing %v, %v", missing, err)
	}
	m := newCzModel()
	for i, tok := range tokens {
		m.want[tok] = wants[i]
	}
	for j := range seqs {
		if _, err := m.checkRow(cols, dst, j, metas[j]); err != nil {
			t.Errorf("new row: %v", err)
		}
	}
}

// TestCompressedCorruptChunkRead damages a sealed chunk's payload on disk
// while the store is open (after recovery checked it): reading its rows
// must fail with ErrCorrupt naming buffer, field and seq range, other rows
// stay readable, and Verify finds the damage after close.
func TestCompressedCorruptChunkRead(t *testing.T) {
	p := ccPristine(t)
	for fi, field := range []string{"observation", "features"} {
		t.Run(field, func(t *testing.T) {
			d := &ccDir{t: t, dir: t.TempDir(), p: p}
			writeTree(t, d.dir, p.files)
			r := ccTarget(t, p)
			s := openStore(t, d.dir)
			b, err := s.Buffer(ccBuf)
			if err != nil {
				t.Fatal(err)
			}
			f := r.rec.Fields[fi]
			d.xor(r.seg, r.off+f.PayloadOff+len(f.Payload)/3, 0x08)
			col, _ := b.Column(field)
			first, last := r.rec.Seqs[0], r.rec.Seqs[len(r.rec.Seqs)-1]
			for _, seq := range r.rec.Seqs {
				missing, err := b.Gather([]int64{seq}, []Column{col}, [][]byte{make([]byte, col.RowBytes)}, nil)
				switch {
				case err == nil:
					t.Errorf("seq %d of the damaged chunk read without error (missing %v)", seq, missing)
				case !errors.Is(err, ErrCorrupt):
					t.Errorf("seq %d: %v; want ErrCorrupt", seq, err)
				default:
					for _, want := range []string{fmt.Sprintf("%q", ccBuf), fmt.Sprintf("field %q", field), fmt.Sprintf("seqs %d..%d", first, last), path.Base(r.seg)} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("seq %d: error does not name %s: %v", seq, want, err)
						}
					}
				}
			}
			// Rows of other chunks are served as written.
			var others []int64
			for seq := range p.rows[ccBuf] {
				if !slices.Contains(r.rec.Seqs, seq) {
					others = append(others, seq)
				}
			}
			slices.Sort(others)
			cols := readColumns(b)
			for _, seq := range others {
				dst := crashDst(cols, 1)
				meta := make([]RowMeta, 1)
				missing, err := b.Gather([]int64{seq}, cols, dst, meta)
				if err != nil || len(missing) > 0 {
					// Stacks of the next chunk's first rows reach back into
					// the damaged one: they may fail too, with ErrCorrupt.
					if err != nil && errors.Is(err, ErrCorrupt) && strings.Contains(err.Error(), fmt.Sprintf("seqs %d..%d", first, last)) {
						continue
					}
					t.Errorf("seq %d of another chunk: missing %v, %v", seq, missing, err)
					continue
				}
				for i, c := range cols {
					if !bytes.Equal(dst[i], p.rows[ccBuf][seq].cols[c.Name]) {
						t.Errorf("seq %d column %q: wrong data", seq, c.Name)
					}
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(d.dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() {
				t.Errorf("verify after close finds nothing wrong")
			}
		})
	}
}

// TestCompressedCorruptionEverySegment deletes each segment in turn, and
// truncates the newest at several points: whatever is lost, a row is
// served as written or not at all, and a store that Verify passes serves
// every row it lists.
func TestCompressedCorruptionEverySegment(t *testing.T) {
	p := ccPristine(t)
	segs := ccSegments(p, ccBuf)
	type variant struct {
		name string
		do   func(d *ccDir)
	}
	var vs []variant
	for _, seg := range segs {
		vs = append(vs, variant{"delete " + path.Base(seg), func(d *ccDir) {
			if err := os.Remove(d.abs(seg)); err != nil {
				t.Fatal(err)
			}
		}})
	}
	newest := segs[len(segs)-1]
	for _, frac := range []int{1, 3, 5, 7} {
		vs = append(vs, variant{fmt.Sprintf("truncate %s at %d/8", path.Base(newest), frac), func(d *ccDir) {
			n := len(p.files[newest])
			if err := os.Truncate(d.abs(newest), int64(segHeaderSize+(n-segHeaderSize)*frac/8)); err != nil {
				t.Fatal(err)
			}
		}})
	}
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			d := &ccDir{t: t, dir: t.TempDir(), p: p}
			writeTree(t, d.dir, p.files)
			v.do(d)
			rep, err := Verify(d.dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(d.dir, nil)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			b, err := s.Buffer(ccBuf)
			if err != nil {
				t.Fatal(err)
			}
			served, errs := ccServed(t, b, p.rows[ccBuf])
			if rep.OK() {
				if len(errs) > 0 {
					t.Errorf("verify passes, but %d live row(s) cannot be read; first: %v", len(errs), errs[0])
				}
				if len(served) != len(p.rows[ccBuf]) {
					t.Errorf("verify passes, but only %d of %d rows are served", len(served), len(p.rows[ccBuf]))
				}
			}
		})
	}
}

// TestCompressedCorruptionMissingPredecessor: the oldest live row of a
// trajectory keeps only its newest frame; its three older frames are in
// the previous chunk, whose own rows have all been overwritten (it is kept
// only for this). If that chunk's record is lost (here: cut out of its
// segment, as if the segment holding it had been damaged or deleted), the
// row cannot be rebuilt: recovery or Verify must report it, and reading it
// must fail or report it missing, never serve other bytes.
func TestCompressedCorruptionMissingPredecessor(t *testing.T) {
	dir := t.TempDir()
	spec := czSpecFor(czFsync)
	spec.Capacity = 20 // chunks of 8, stacks of 4
	var tokens []int64 // env 0, never done, no glitch: one trajectory, one stack sliding along
	for tok := int64(1); len(tokens) < 30; tok++ {
		glitch := crashMix(uint64(tok)^0x57AC4)%32 == 0
		if term, trunc := crashFlagsOf(tok); crashEnvOf(tok) == 0 && !term && !trunc && !glitch {
			tokens = append(tokens, tok)
		}
	}
	s := openStore(t, dir)
	b := mustCreate(t, s, "b", spec)
	stk := newCzStacker(spec)
	m := newCzModel()
	for i := 0; i < len(tokens); i += 5 {
		wants := make([]czWant, 5)
		for j := range wants {
			wants[j] = stk.next(tokens[i+j])
			m.want[tokens[i+j]] = wants[j]
		}
		mustExtend(t, b, "a", czBatch(spec, tokens[i:i+5], wants, false))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Seqs 10..29 are live; chunk 0 holds seqs 0..7, chunk 1 seqs 8..15.
	// Row 10 (step 10) keeps its newest frame and rebuilds the others from
	// rows 9, 8 and 7: chunk 0 is needed.
	bufDir := filepath.Join(dir, "buffers", "b")
	segs, _ := filepath.Glob(filepath.Join(bufDir, "seg.*.rbdk"))
	var chunk0 uint64
	for _, r := range czRecords(t, bufDir, spec) {
		if r.FirstStep == 0 {
			chunk0 = r.ID
		}
		if r.Kind == recSealed && r.FirstStep == 8 && r.Fields[0].Modes[2] != modeNewest {
			t.Skipf("row 10's stack is stored whole (mode %d): nothing reaches into chunk 0", r.Fields[0].Modes[2])
		}
	}
	removed := 0
	for _, seg := range segs {
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		out := slices.Clone(data[:segHeaderSize])
		for off := segHeaderSize; off < len(data); {
			n, err := recordLen(data[off:])
			if err != nil {
				t.Fatal(err)
			}
			r, err := decodeChunkRecord(data[off:off+n], ccTailFields(spec), spec.Compression.ChunkLen)
			if err != nil {
				t.Fatal(err)
			}
			if r.ID == chunk0 {
				removed++
			} else {
				out = append(out, data[off:off+n]...)
			}
			off += n
		}
		if err := os.WriteFile(seg, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if removed == 0 {
		t.Fatal("chunk 0 has no record")
	}
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	b, err = s.Buffer("b")
	if err != nil {
		t.Fatal(err)
	}
	cols := readColumns(b)
	dst := crashDst(cols, 1)
	meta := make([]RowMeta, 1)
	missing, gerr := b.Gather([]int64{10}, cols, dst, meta)
	switch {
	case gerr != nil:
		t.Logf("gather of row 10: %v", gerr)
	case len(missing) == 1:
	default:
		if _, err := m.checkRow(cols, dst, 0, meta[0]); err != nil {
			t.Errorf("row 10 served with wrong data: %v", err)
		}
	}
	if rep.OK() && b.Live(10) {
		t.Errorf("verify passes and row 10 is live, but its frame stack needs chunk %d, which is gone (gather: %v)", chunk0, gerr)
	}
	// Every other live row reads back exactly.
	for _, seq := range b.LiveSeqs(11, 100) {
		if _, err := b.Gather([]int64{seq}, cols, dst, meta); err != nil {
			t.Errorf("seq %d: %v", seq, err)
		} else if _, err := m.checkRow(cols, dst, 0, meta[0]); err != nil {
			t.Errorf("seq %d: %v", seq, err)
		}
	}
}
