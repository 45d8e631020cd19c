package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The corruption table (design.md, "Testing the claims"): every row damages
// the files of a freshly written, cleanly closed memmap data dir and states
// what must happen. Either Open refuses the data dir, naming the damaged
// file, or it opens it, Verify reports the damage for that buffer, and the
// damaged row is never served. In both cases nothing is repaired behind the
// user's back: the damaged bytes are still on disk afterwards.

const (
	cvBuf   = "buf"   // the buffer the table damages; opened first ("buf" < "other")
	cvOther = "other" // same spec, another uid: the donor of foreign files
	cvCap   = 64
	cvRows  = 100 // the ring wraps: seqs 36..99 are live, all below the watermark
	cvSeq   = 80  // a live row that is not done
	cvDone  = 76  // a live done row (terminated), with a final observation in compact mode
	cvSign  = 95  // a live row whose seq with the sign bit flipped reads as a marker for its own slot
)

// cvRow is row i of both buffers of the corruption fixture: 3 envs, dones
// every few rows, so trajectories interleave and end in the live window.
func cvRow(i int) row {
	return row{env: int64(i % 3), val: float32(i), terminated: i%7 == 6, truncated: i%11 == 10 && i%7 != 6, final: float32(1000 + i)}
}

// servedRow is what a reader must get for one seq.
type servedRow struct {
	meta RowMeta
	cols map[string][]byte
}

// pristineStore is a cleanly closed data dir, kept as bytes so each test
// case gets its own copy without writing a store again.
type pristineStore struct {
	files map[string][]byte              // slash path relative to the data dir
	rows  map[string]map[int64]servedRow // buffer -> seq -> row
}

var pristineCache struct {
	sync.Mutex
	m map[string]*pristineStore
}

// pristine returns the store that build writes, building it once per
// process.
func pristine(t testing.TB, key string, build func(t testing.TB, s *Store)) *pristineStore {
	t.Helper()
	pristineCache.Lock()
	defer pristineCache.Unlock()
	if p := pristineCache.m[key]; p != nil {
		return p
	}
	dir, err := os.MkdirTemp("", "rbd-pristine-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s := openStore(t, dir)
	build(t, s)
	p := &pristineStore{files: map[string][]byte{}, rows: map[string]map[int64]servedRow{}}
	for _, b := range s.Buffers() {
		p.rows[b.Name()] = servedRows(t, b)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	p.files = readTree(t, dir)
	if pristineCache.m == nil {
		pristineCache.m = map[string]*pristineStore{}
	}
	pristineCache.m[key] = p
	return p
}

// readTree returns every regular file under dir by slash-separated
// relative path.
func readTree(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		files[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// writeTree writes files into dir.
func writeTree(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	for rel, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readColumns returns every column of b: the spec's fields, then the tails.
func readColumns(b *Buffer) []Column {
	var cols []Column
	for _, f := range b.Spec().Fields {
		if c, ok := b.Column(f.Name); ok {
			cols = append(cols, c)
		}
	}
	for _, k := range b.Spec().ObsKeys {
		if c, ok := b.Column("next." + k); ok && c.Tail {
			cols = append(cols, c)
		}
	}
	return cols
}

// gatherLive gathers every live row of b with every column. LiveSeqs rows
// of a buffer nobody writes to must all be served.
func gatherLive(t testing.TB, b *Buffer) ([]int64, []RowMeta, []Column, [][]byte) {
	t.Helper()
	seqs := b.LiveSeqs(0, 1<<30)
	cols := readColumns(b)
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = make([]byte, len(seqs)*c.RowBytes)
	}
	meta := make([]RowMeta, len(seqs))
	missing, err := b.Gather(seqs, cols, dst, meta)
	if err != nil {
		t.Fatalf("buffer %q: gather of its live seqs: %v", b.Name(), err)
	}
	if len(missing) > 0 {
		t.Fatalf("buffer %q: LiveSeqs listed rows that Gather reports missing (positions %v)", b.Name(), missing)
	}
	return seqs, meta, cols, dst
}

func servedRows(t testing.TB, b *Buffer) map[int64]servedRow {
	t.Helper()
	seqs, meta, cols, dst := gatherLive(t, b)
	out := make(map[int64]servedRow, len(seqs))
	for j, seq := range seqs {
		r := servedRow{meta: meta[j], cols: map[string][]byte{}}
		for i, c := range cols {
			r.cols[c.Name] = slices.Clone(dst[i][j*c.RowBytes : (j+1)*c.RowBytes])
		}
		out[seq] = r
	}
	return out
}

// checkServed checks that every row b serves is exactly the row written
// under that seq: a row is either correct or missing, never wrong. It
// returns the seqs served.
func checkServed(t testing.TB, b *Buffer, want map[int64]servedRow) []int64 {
	t.Helper()
	seqs, meta, cols, dst := gatherLive(t, b)
	for j, seq := range seqs {
		w, ok := want[seq]
		if !ok {
			t.Fatalf("buffer %q serves seq %d, which was not a live row when the store was closed", b.Name(), seq)
		}
		got, exp := meta[j], w.meta
		if got.NextSeq != exp.NextSeq && got.NextSeq != -1 {
			t.Fatalf("buffer %q seq %d: next_seq %d, written %d", b.Name(), seq, got.NextSeq, exp.NextSeq)
		}
		got.NextSeq, exp.NextSeq = 0, 0
		if got != exp {
			t.Fatalf("buffer %q seq %d: metadata\n got %+v\nwant %+v", b.Name(), seq, got, exp)
		}
		for i, c := range cols {
			if g := dst[i][j*c.RowBytes : (j+1)*c.RowBytes]; !bytes.Equal(g, w.cols[c.Name]) {
				t.Fatalf("buffer %q seq %d column %q: served % x, written % x", b.Name(), seq, c.Name, g, w.cols[c.Name])
			}
		}
	}
	return seqs
}

// readCatalog returns every key of a catalog, buckets flattened to slash
// paths, reading it read-only as Verify does.
func readCatalog(path string) (map[string]string, error) {
	db, err := bolt.Open(path, 0o644, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(prefix+string(k)+"/", b.Bucket(k))
			}
			out[prefix+string(k)] = string(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(string(name)+"/", b) })
	})
	return out, errors.Join(err, db.Close())
}

func catalogContents(t testing.TB, path string) map[string]string {
	t.Helper()
	m, err := readCatalog(path)
	if err != nil {
		t.Fatalf("read catalog %s: %v", path, err)
	}
	return m
}

// cvDir is one damaged copy of the corruption fixture.
type cvDir struct {
	t       *testing.T
	dir     string
	compact bool
	p       *pristineStore
}

func (d *cvDir) abs(rel string) string { return filepath.Join(d.dir, filepath.FromSlash(rel)) }

func cvBufRel(buf, file string) string { return "buffers/" + buf + "/" + file }

// Files of the damaged buffer, relative to the data dir.
func (d *cvDir) col(field string) string { return cvBufRel(cvBuf, "f."+field+".col") }
func (d *cvDir) tail(key string) string  { return cvBufRel(cvBuf, "tail."+key+".col") }
func (d *cvDir) meta() string            { return cvBufRel(cvBuf, "rows.meta") }
func (d *cvDir) prio() string            { return cvBufRel(cvBuf, "priority.col") }

const cvCatalog = "catalog.db"

func (d *cvDir) read(rel string) []byte {
	d.t.Helper()
	b, err := os.ReadFile(d.abs(rel))
	if err != nil {
		d.t.Fatal(err)
	}
	return b
}

func (d *cvDir) write(rel string, b []byte) {
	d.t.Helper()
	if err := os.WriteFile(d.abs(rel), b, 0o644); err != nil {
		d.t.Fatal(err)
	}
}

func (d *cvDir) xor(rel string, off int64, mask byte) {
	d.t.Helper()
	b := d.read(rel)
	b[off] ^= mask
	d.write(rel, b)
}

func (d *cvDir) truncate(rel string, size int64) {
	d.t.Helper()
	if err := os.Truncate(d.abs(rel), size); err != nil {
		d.t.Fatal(err)
	}
}

func (d *cvDir) size(rel string) int64 { return int64(len(d.read(rel))) }

// tailEntry is the offset of seq's entry in the dense tail file of key
// (16-byte observations).
func (d *cvDir) tailEntry(key string, seq int64) int64 {
	d.t.Helper()
	off, ok := denseTailEntry(d.read(d.tail(key)), seq, 16)
	if !ok {
		d.t.Fatalf("%s: no entry holds seq %d's final observation", d.tail(key), seq)
	}
	return off
}

func (d *cvDir) putU64(rel string, off int64, v int64) {
	d.t.Helper()
	b := d.read(rel)
	binary.LittleEndian.PutUint64(b[off:], uint64(v))
	d.write(rel, b)
}

// rowOff is the offset of seq's row in a column whose rows have n bytes.
func rowOff(seq int64, n int) int64 { return headerSize + seq%cvCap*int64(n) }

// recOff is the offset of seq's record in rows.meta.
func recOff(seq int64) int64 { return headerSize + seq%cvCap*recordSize }

// patchColHeader rewrites a column header with a changed field and a
// correct checksum, so only the check against the catalog can catch it.
func (d *cvDir) patchColHeader(rel string, change func(h *colHeader)) {
	d.t.Helper()
	b := d.read(rel)
	h, err := decodeColHeader(rel, b)
	if err != nil {
		d.t.Fatal(err)
	}
	change(&h)
	copy(b, h.encode())
	d.write(rel, b)
}

// putU32 stores v at off and recomputes the header checksum at crcOff over
// [0, crcOff), leaving the rest (such as the watermark block) as it is.
func (d *cvDir) putU32(rel string, off int, v uint32, crcOff int) {
	d.t.Helper()
	b := d.read(rel)
	binary.LittleEndian.PutUint32(b[off:], v)
	binary.LittleEndian.PutUint32(b[crcOff:], crc32.Checksum(b[:crcOff], castagnoli))
	d.write(rel, b)
}

func (d *cvDir) catalogUpdate(fn func(tx *bolt.Tx) error) {
	d.t.Helper()
	db, err := bolt.Open(d.abs(cvCatalog), 0o644, &bolt.Options{Timeout: time.Second})
	if err != nil {
		d.t.Fatal(err)
	}
	if err := errors.Join(db.Update(fn), db.Close()); err != nil {
		d.t.Fatal(err)
	}
}

// anyOffset accepts any CorruptionError.Offset.
const anyOffset = -2

type corruptCase struct {
	name    string
	compact bool // only for the compact fixture (tail files)
	corrupt func(d *cvDir)

	// Open refuses the data dir: wantErr is ErrCorrupt or
	// ErrVersionMismatch, naming the file wantFile (relative), and for
	// ErrCorrupt a *CorruptionError with that Path and Offset wantOff.
	wantErr  error
	wantFile string
	wantOff  int64
	// Open accepts it: the rows lost are not served, and Verify reports
	// them as problems of the damaged buffer. lostIn, when set, finds
	// them in the fixture.
	lost   []int64
	lostIn func(t testing.TB, p *pristineStore) []int64
}

func corruptCases(layout RowMetaLayout) []corruptCase {
	const obs = "observation" // float32 [4]: 16-byte rows
	obsCol := cvBufRel(cvBuf, "f.observation.col")
	meta := cvBufRel(cvBuf, "rows.meta")
	cases := []corruptCase{
		// Column files.
		{name: "column truncated by 1 byte", corrupt: func(d *cvDir) { d.truncate(d.col(obs), d.size(d.col(obs))-1) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: -1},
		{name: "column truncated by a page", corrupt: func(d *cvDir) { d.truncate(d.col(obs), d.size(d.col(obs))-4096) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: -1},
		{name: "column truncated to 0", corrupt: func(d *cvDir) { d.truncate(d.col(obs), 0) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: -1},
		{name: "column longer by a page", corrupt: func(d *cvDir) { d.truncate(d.col(obs), d.size(d.col(obs))+4096) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: -1},
		{name: "column header magic", corrupt: func(d *cvDir) { d.xor(d.col(obs), 3, 0x20) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column header version bumped", corrupt: func(d *cvDir) { d.putU32(d.col(obs), 8, FormatVersion+1, colHeaderCRCOff) },
			wantErr: ErrVersionMismatch, wantFile: obsCol},
		{name: "column header checksum byte flipped", corrupt: func(d *cvDir) { d.xor(d.col(obs), colHeaderCRCOff+1, 0x01) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: colHeaderCRCOff},
		{name: "column header capacity byte flipped", corrupt: func(d *cvDir) { d.xor(d.col(obs), 24, 0x01) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: colHeaderCRCOff},
		{name: "column copied from another buffer", corrupt: func(d *cvDir) { d.write(d.col(obs), d.p.files[cvBufRel(cvOther, "f.observation.col")]) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 16},
		{name: "column header dtype differs from catalog", corrupt: func(d *cvDir) { d.patchColHeader(d.col(obs), func(h *colHeader) { h.DType = Int32 }) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column header shape differs from catalog", corrupt: func(d *cvDir) { d.patchColHeader(d.col(obs), func(h *colHeader) { h.Shape = []int{2, 2} }) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column header capacity differs from catalog", corrupt: func(d *cvDir) { d.patchColHeader(d.col(obs), func(h *colHeader) { h.Capacity = cvCap / 2 }) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column header row size differs from catalog", corrupt: func(d *cvDir) { d.patchColHeader(d.col(obs), func(h *colHeader) { h.RowBytes = 8 }) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column header names another field", corrupt: func(d *cvDir) { d.patchColHeader(d.col(obs), func(h *colHeader) { h.Name = "next.observation" }) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column header says tail", corrupt: func(d *cvDir) { d.patchColHeader(d.col(obs), func(h *colHeader) { h.Role = roleTail }) },
			wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 0},
		{name: "column field byte flipped below watermark", corrupt: func(d *cvDir) { d.xor(d.col("action"), rowOff(cvSeq, 8), 0x01) },
			lost: []int64{cvSeq}},
		{name: "column last byte of a row flipped below watermark", corrupt: func(d *cvDir) { d.xor(d.col(obs), rowOff(cvSeq, 16)+15, 0x80) },
			lost: []int64{cvSeq}},

		// Tail files (compact_obs).
		{name: "tail truncated by 1 byte", compact: true, corrupt: func(d *cvDir) { d.truncate(d.tail(obs), d.size(d.tail(obs))-1) },
			wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, "tail.observation.col"), wantOff: -1},
		{name: "tail copied from another buffer", compact: true, corrupt: func(d *cvDir) { d.write(d.tail(obs), d.p.files[cvBufRel(cvOther, "tail.observation.col")]) },
			wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, "tail.observation.col"), wantOff: 16},
		{name: "tail header says field", compact: true, corrupt: func(d *cvDir) { d.patchColHeader(d.tail(obs), func(h *colHeader) { h.Role = roleField }) },
			wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, "tail.observation.col"), wantOff: 0},
		{name: "tail byte of a done row flipped below watermark", compact: true, corrupt: func(d *cvDir) { d.xor(d.tail(obs), d.tailEntry(obs, cvDone)+2, 0x04) },
			lost: []int64{cvDone}},
		{name: "tail entry of a done row names another seq", compact: true, corrupt: func(d *cvDir) { d.putU64(d.tail(obs), d.tailEntry(obs, cvDone)+16, cvSeq+1) },
			lost: []int64{cvDone}},
		{name: "tail entry of a done row zeroed", compact: true, corrupt: func(d *cvDir) {
			b := d.read(d.tail(obs))
			off := d.tailEntry(obs, cvDone)
			clear(b[off : off+16+tailTrailerSize])
			d.write(d.tail(obs), b)
		}, lost: []int64{cvDone}},

		// priority.col (the compact fixture has priorities).
		{name: "priority column truncated by 1 byte", compact: true, corrupt: func(d *cvDir) { d.truncate(d.prio(), d.size(d.prio())-1) },
			wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, "priority.col"), wantOff: -1},
		{name: "priority column copied from another buffer", compact: true, corrupt: func(d *cvDir) { d.write(d.prio(), d.p.files[cvBufRel(cvOther, "priority.col")]) },
			wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, "priority.col"), wantOff: 16},
		{name: "priority header says field", compact: true, corrupt: func(d *cvDir) { d.patchColHeader(d.prio(), func(h *colHeader) { h.Role = roleField }) },
			wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, "priority.col"), wantOff: 0},

		// rows.meta.
		{name: "rows.meta truncated by 1 byte", corrupt: func(d *cvDir) { d.truncate(d.meta(), d.size(d.meta())-1) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: -1},
		{name: "rows.meta truncated to its header", corrupt: func(d *cvDir) { d.truncate(d.meta(), headerSize) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: -1},
		{name: "rows.meta truncated to 0", corrupt: func(d *cvDir) { d.truncate(d.meta(), 0) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: -1},
		{name: "rows.meta magic", corrupt: func(d *cvDir) { d.xor(d.meta(), 0, 0xff) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 0},
		{name: "rows.meta version bumped", corrupt: func(d *cvDir) { d.putU32(d.meta(), 8, metaVersionBlocks+1, metaHeaderCRCOff) },
			wantErr: ErrVersionMismatch, wantFile: meta},
		{name: "rows.meta header checksum byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), metaHeaderCRCOff, 0x10) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: metaHeaderCRCOff},
		{name: "rows.meta copied from another buffer", corrupt: func(d *cvDir) { d.write(d.meta(), d.p.files[cvBufRel(cvOther, "rows.meta")]) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 16},
		// The watermark is what tells damage from a crash's torn tail: if it
		// cannot be read, the damage below it must still be reported, not
		// mistaken for unacknowledged rows.
		{name: "watermark block and a row flipped", corrupt: func(d *cvDir) {
			d.xor(d.meta(), watermarkOff+1, 0x01)
			d.xor(d.col("action"), rowOff(cvSeq, 8), 0x01)
		}, lost: []int64{cvSeq}},

		// catalog.db.
		{name: "catalog is not a bbolt file", corrupt: func(d *cvDir) {
			d.write(cvCatalog, bytes.Repeat([]byte("this is not a bbolt database\n"), 2000))
		}, wantErr: ErrCorrupt, wantFile: cvCatalog, wantOff: anyOffset},
		{name: "catalog truncated to 0", corrupt: func(d *cvDir) { d.truncate(cvCatalog, 0) },
			wantErr: ErrCorrupt, wantFile: cvCatalog, wantOff: anyOffset},
		{name: "catalog is another program's bbolt file", corrupt: func(d *cvDir) {
			if err := os.Remove(d.abs(cvCatalog)); err != nil {
				d.t.Fatal(err)
			}
			d.catalogUpdate(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("members"))
				if err != nil {
					return err
				}
				return b.Put([]byte("alice"), []byte(`{"role":"admin"}`))
			})
		}, wantErr: ErrCorrupt, wantFile: cvCatalog, wantOff: anyOffset},
		{name: "catalog format version bumped", corrupt: func(d *cvDir) {
			d.catalogUpdate(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketRBD).Put(keyFormat, binary.LittleEndian.AppendUint32(nil, FormatVersion+1))
			})
		}, wantErr: ErrVersionMismatch, wantFile: cvCatalog},
		{name: "catalog buffer state is not JSON", corrupt: func(d *cvDir) {
			d.catalogUpdate(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketBuffers).Bucket([]byte(cvBuf)).Put(keyState, []byte(`{"uid":`))
			})
		}, wantErr: ErrCorrupt, wantFile: cvCatalog, wantOff: -1},
		{name: "catalog uid names other files", corrupt: func(d *cvDir) {
			d.catalogUpdate(func(tx *bolt.Tx) error {
				b := tx.Bucket(bucketBuffers).Bucket([]byte(cvBuf))
				var st bufferState
				if err := json.Unmarshal(b.Get(keyState), &st); err != nil {
					return err
				}
				st.UID ^= 1
				v, err := json.Marshal(st)
				if err != nil {
					return err
				}
				return b.Put(keyState, v)
			})
		}, wantErr: ErrCorrupt, wantFile: obsCol, wantOff: 16},
	}
	if layout == RowMetaRuns || layout == RowMetaStrided { // rows.meta version 2
		return append(cases, runMetaCases()...)
	}
	return append(cases, rowMetaCases()...)
}

// rowMetaCases damage rows.meta records of format version 1.
func rowMetaCases() []corruptCase {
	meta := cvBufRel(cvBuf, "rows.meta")
	return []corruptCase{
		{name: "rows.meta says version 2", corrupt: func(d *cvDir) { d.putU32(d.meta(), 8, metaVersionRuns, metaHeaderCRCOff) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 8},
		{name: "rows.meta record size differs", corrupt: func(d *cvDir) { d.putU32(d.meta(), 12, 32, metaHeaderCRCOff) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 0},
		{name: "rows.meta capacity differs", corrupt: func(d *cvDir) { d.putU32(d.meta(), 24, cvCap*2, metaHeaderCRCOff) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 0},
		{name: "record traj_id byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), recOff(cvSeq)+recTraj, 0x02) },
			lost: []int64{cvSeq}},
		{name: "record flags byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), recOff(cvDone)+recFlags, byte(flagDone)) },
			lost: []int64{cvDone}},
		{name: "record data checksum byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), recOff(cvSeq)+recDataCRC+3, 0x40) },
			lost: []int64{cvSeq}},
		{name: "record checksum byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), recOff(cvSeq)+recCRC, 0x01) },
			lost: []int64{cvSeq}},
		{name: "record seq is -1", corrupt: func(d *cvDir) {
			b := d.read(d.meta())
			binary.LittleEndian.PutUint64(b[recOff(cvSeq):], ^uint64(0))
			d.write(d.meta(), b)
		}, lost: []int64{cvSeq}},
		// A writing marker, -(seq+2), carries no checksum. With the sign bit
		// of seq 95 flipped, its record reads as the marker of seq
		// 2^63-97, which is also in slot 31: one flipped bit must cost
		// that row, not move the ring 2^63 rows ahead and drop all of them.
		{name: "record seq sign bit flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), recOff(cvSign)+7, 0x80) },
			lost: []int64{cvSign}},
		{name: "record moved to another slot", corrupt: func(d *cvDir) {
			b := d.read(d.meta())
			copy(b[recOff(cvSeq+1):recOff(cvSeq+1)+recordSize], b[recOff(cvSeq):recOff(cvSeq)+recordSize])
			d.write(d.meta(), b)
		}, wantErr: ErrCorrupt, wantFile: meta, wantOff: recOff(cvSeq + 1)},
	}
}

// cvBuild writes the corruption fixture: two buffers of the same spec,
// with the row metadata layout given (rows.meta format version 1 or 2).
func cvBuild(compact bool, layout RowMetaLayout) func(t testing.TB, s *Store) {
	return func(t testing.TB, s *Store) {
		spec := testSpec(KindMemmap, cvCap, compact)
		spec.RowMetaLayout = layout
		if compact {
			spec.Priority = &PriorityOptions{Alpha: 0.6, Eps: 1e-6} // adds priority.col
		}
		for _, name := range []string{cvBuf, cvOther} {
			b := mustCreate(t, s, name, spec)
			rows := make([]row, cvRows)
			for i := range rows {
				rows[i] = cvRow(i)
			}
			mustExtend(t, b, "s", makeBatch(spec, rows[:60], true))
			mustExtend(t, b, "s", makeBatch(spec, rows[60:], true))
		}
	}
}

func TestCorruptionTable(t *testing.T) {
	for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns} {
		t.Run("row_meta="+string(layout), func(t *testing.T) { testCorruptionTable(t, layout) })
	}
}

func testCorruptionTable(t *testing.T, layout RowMetaLayout) {
	for _, compact := range []bool{false, true} {
		p := pristine(t, fmt.Sprintf("corrupt/compact=%v/row_meta=%s", compact, layout), cvBuild(compact, layout))
		if _, ok := p.rows[cvBuf][cvSeq]; !ok {
			t.Fatalf("fixture: seq %d is not live", cvSeq)
		}
		if r, ok := p.rows[cvBuf][cvDone]; !ok || !r.meta.Done || r.meta.HasTail != compact {
			t.Fatalf("fixture: seq %d is not a live done row: %+v", cvDone, r.meta)
		}
		for _, tc := range corruptCases(layout) {
			if tc.compact && !compact {
				continue
			}
			if tc.lostIn != nil {
				tc.lost = tc.lostIn(t, p)
			}
			t.Run(fmt.Sprintf("compact=%v/%s", compact, tc.name), func(t *testing.T) {
				t.Parallel()
				d := &cvDir{t: t, dir: t.TempDir(), compact: compact, p: p}
				writeTree(t, d.dir, p.files)
				tc.corrupt(d)
				damaged := readTree(t, d.dir)
				if tc.wantErr != nil {
					checkRefused(t, d, tc)
				} else {
					checkDropped(t, d, tc)
				}
				checkUnchanged(t, d, damaged, tc.wantErr != nil)
			})
		}
	}
}

// TestCorruptRefusedOpenLeavesOtherBuffersAlone damages the buffer that is
// opened second. Open must refuse the data dir without touching the state of
// the buffer it had already recovered: a clean close recorded its open
// trajectories, and they must still continue once the damage is repaired
// (say, the file restored from a backup).
func TestCorruptRefusedOpenLeavesOtherBuffersAlone(t *testing.T) {
	p := pristine(t, "corrupt/compact=false/row_meta=row", cvBuild(false, RowMetaPerRow))
	d := &cvDir{t: t, dir: t.TempDir(), p: p}
	writeTree(t, d.dir, p.files)
	other := cvBufRel(cvOther, "rows.meta")
	d.truncate(other, headerSize)
	before := catalogContents(t, d.abs(cvCatalog))
	if s, err := Open(d.dir, nil); err == nil {
		s.Close()
		t.Fatal("Open accepted a truncated rows.meta")
	} else if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), d.abs(other)) {
		t.Fatalf("Open: %v; want ErrCorrupt naming %s", err, other)
	}
	if after := catalogContents(t, d.abs(cvCatalog)); !maps.Equal(after, before) {
		t.Errorf("a refused Open changed the catalog entry of buffer %q, which it had recovered before reaching the damaged %q "+
			"(recover() commits Clean=false and drops the saved streams before Open knows it will succeed):\n%s",
			cvBuf, cvOther, diffMaps(before, after))
	}

	// Repair the damage: buf's open trajectories must still continue.
	d.write(other, p.files[other])
	s := openStore(t, d.dir)
	defer s.Close()
	b, err := s.Buffer(cvBuf)
	if err != nil {
		t.Fatal(err)
	}
	last := p.rows[cvBuf][cvRows-1].meta // env 0, not done: its trajectory is open
	if last.Done {
		t.Fatal("fixture: the last row is done")
	}
	spec := b.Spec()
	res := mustExtend(t, b, "s", makeBatch(spec, []row{{env: last.Env, val: 1}}, true))
	if m := metas(t, b, res.FirstSeq)[0]; m.TrajID != last.TrajID || m.PrevSeq != last.Seq {
		t.Errorf("after a refused Open and a repair, stream %q env %d started trajectory %d instead of continuing %d after seq %d",
			"s", last.Env, m.TrajID, last.TrajID, last.Seq)
	}
}

// TestCorruptCatalogPageNoCrash flips single bits in catalog.db's B+tree
// and opens the data dir in a child process. bbolt keeps no checksums on
// its pages and trusts the page ids it reads, so such a bit can make it
// panic or fault (SIGSEGV, which recover cannot catch). rbd serve, dump and
// verify all read the catalog first: a damaged one must be refused with
// ErrCorrupt naming catalog.db, never crash the process.
func TestCorruptCatalogPageNoCrash(t *testing.T) {
	if dir := os.Getenv("RBD_TEST_CORRUPT_CHILD"); dir != "" {
		openInChild(dir)
		return
	}
	p := pristine(t, "corrupt/compact=false/row_meta=row", cvBuild(false, RowMetaPerRow))
	// A small bucket is stored inline, in its parent's leaf, right after
	// its key: an 8-byte root page id (0 = inline), an 8-byte sequence,
	// then the inline page (16-byte header, 16-byte element headers).
	key := []byte("streams")
	for _, tc := range []struct {
		name  string
		after int // offset from the end of the key
		mask  byte
	}{
		{"inline bucket root page id, low byte", 0, 0x01},
		{"inline page element position", 27, 0x80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := maps.Clone(p.files)
			cat := slices.Clone(files[cvCatalog])
			n := 0
			for i := 0; ; {
				j := bytes.Index(cat[i:], key)
				if j < 0 {
					break
				}
				i += j + len(key)
				cat[i+tc.after] ^= tc.mask // live and stale copies alike
				n++
			}
			if n == 0 {
				t.Fatalf("no %q key in the fixture's catalog", key)
			}
			files[cvCatalog] = cat
			dir := t.TempDir()
			writeTree(t, dir, files)
			cmd := exec.Command(os.Args[0], "-test.run=^TestCorruptCatalogPageNoCrash$", "-test.count=1")
			cmd.Env = append(os.Environ(), "RBD_TEST_CORRUPT_CHILD="+dir)
			out, err := cmd.CombinedOutput()
			if err != nil {
				crash := string(out)
				if i := strings.Index(crash, "\ngoroutine "); i >= 0 {
					crash = crash[:i]
				}
				t.Fatalf("a flipped bit in catalog.db (%s) crashed the process opening it (%v):\n%s", tc.name, err, crash)
			}
			for _, op := range []string{"verify", "open"} {
				if !strings.Contains(string(out), "rbd-child "+op+": corrupt\n") {
					t.Errorf("%s of a data dir with a damaged catalog page: want ErrCorrupt naming catalog.db; child said:\n%s", op, out)
				}
			}
		})
	}
}

// openInChild verifies and opens dir and reports how each went.
func openInChild(dir string) {
	class := func(err error) string {
		ce, ok := errors.AsType[*CorruptionError](err)
		switch {
		case err == nil:
			return "ok"
		case ok && errors.Is(err, ErrCorrupt) && ce.Path == filepath.Join(dir, cvCatalog):
			return "corrupt"
		}
		return "other " + err.Error()
	}
	_, err := Verify(dir, nil)
	fmt.Printf("rbd-child verify: %s\n", class(err))
	s, err := Open(dir, nil)
	fmt.Printf("rbd-child open: %s\n", class(err))
	if err == nil {
		s.Close()
	}
}

// checkRefused opens a data dir that must be refused, and verifies it.
func checkRefused(t *testing.T, d *cvDir, tc corruptCase) {
	path := d.abs(tc.wantFile)
	s, err := Open(d.dir, nil)
	if err == nil {
		s.Close()
		t.Fatalf("Open accepted a damaged data dir; want an error matching %v naming %s", tc.wantErr, tc.wantFile)
	}
	checkErr(t, "Open", err, tc, path)
	if !strings.Contains(tc.wantFile, "buffers/") {
		// A damaged catalog stops Verify itself.
		rep, err := Verify(d.dir, nil)
		if err == nil {
			t.Fatalf("Verify ran on a data dir with a damaged catalog (%+v); want an error matching %v", rep, tc.wantErr)
		}
		checkErr(t, "Verify", err, tc, path)
		return
	}
	if !strings.Contains(err.Error(), `"`+cvBuf+`"`) {
		t.Errorf("Open error does not name buffer %q: %v", cvBuf, err)
	}
	rep, err := Verify(d.dir, nil)
	if err != nil {
		t.Fatalf("Verify could not run: %v", err)
	}
	if rep.OK() {
		t.Fatalf("Verify reports no problem: %+v", rep)
	}
	for _, br := range rep.Buffers {
		switch {
		case br.Name == cvBuf && !slices.ContainsFunc(br.Problems, func(p string) bool { return strings.Contains(p, path) }):
			t.Errorf("Verify does not name %s for buffer %q: %q", path, cvBuf, br.Problems)
		case br.Name != cvBuf && len(br.Problems) > 0:
			t.Errorf("Verify reports problems in the undamaged buffer %q: %q", br.Name, br.Problems)
		}
	}
}

func checkErr(t *testing.T, op string, err error, tc corruptCase, path string) {
	t.Helper()
	if !errors.Is(err, tc.wantErr) {
		t.Fatalf("%s: %v\nwant an error matching %v", op, err, tc.wantErr)
	}
	if tc.wantErr == ErrVersionMismatch {
		// A newer version is not damage: callers must be able to tell.
		if errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: a newer format version is reported as corruption: %v", op, err)
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: version error does not name %s: %v", op, path, err)
		}
		return
	}
	ce, ok := errors.AsType[*CorruptionError](err)
	if !ok {
		t.Fatalf("%s: %v\nwant a *CorruptionError", op, err)
	}
	if ce.Path != path {
		t.Errorf("%s: CorruptionError.Path = %s, want %s", op, ce.Path, path)
	}
	if tc.wantOff != anyOffset && ce.Offset != tc.wantOff {
		t.Errorf("%s: CorruptionError.Offset = %d, want %d (%v)", op, ce.Offset, tc.wantOff, err)
	}
}

// checkDropped verifies, then opens a data dir whose damage must cost only
// the damaged rows (and later rows of their trajectories, which link to
// them).
func checkDropped(t *testing.T, d *cvDir, tc corruptCase) {
	rep, err := Verify(d.dir, nil)
	if err != nil {
		t.Fatalf("Verify could not run: %v", err)
	}
	for _, br := range rep.Buffers {
		if br.Name != cvBuf {
			if len(br.Problems) > 0 {
				t.Errorf("Verify reports problems in the undamaged buffer %q: %q", br.Name, br.Problems)
			}
			continue
		}
		for _, seq := range tc.lost {
			if !slices.ContainsFunc(br.Problems, func(p string) bool { return strings.Contains(p, fmt.Sprintf("seq %d ", seq)) }) {
				t.Errorf("Verify does not report damaged seq %d of buffer %q (below the durable watermark): problems %q", seq, cvBuf, br.Problems)
			}
		}
	}
	if rep.OK() {
		t.Errorf("Verify reports no problem for a damaged buffer: %+v", rep)
	}

	s, err := Open(d.dir, nil)
	if err != nil {
		t.Fatalf("Open refused a data dir with row damage only: %v", err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	for _, name := range []string{cvBuf, cvOther} {
		b, err := s.Buffer(name)
		if err != nil {
			t.Fatal(err)
		}
		served := checkServed(t, b, d.p.rows[name])
		if name == cvOther {
			if len(served) != len(d.p.rows[name]) || len(b.Damage()) > 0 {
				t.Errorf("undamaged buffer %q serves %d of %d rows, damage %q", name, len(served), len(d.p.rows[name]), b.Damage())
			}
			continue
		}
		if len(b.Damage()) == 0 {
			t.Errorf("buffer %q: Damage() is empty after recovery dropped rows", name)
		}
		for _, seq := range tc.lost {
			if b.Live(seq) || slices.Contains(served, seq) {
				t.Errorf("buffer %q serves damaged seq %d", name, seq)
			}
			missing, err := b.Gather([]int64{seq}, nil, nil, nil)
			if err != nil || !slices.Equal(missing, []int{0}) {
				t.Errorf("buffer %q: Gather of damaged seq %d: missing %v, err %v; want it reported missing", name, seq, missing, err)
			}
		}
		if len(served) < len(d.p.rows[name])/2 {
			t.Errorf("buffer %q: one damaged row cost %d of %d rows", name, len(d.p.rows[name])-len(served), len(d.p.rows[name]))
		}
	}
}

// checkUnchanged checks that opening, failing and verifying repaired
// nothing: every buffer file still holds the damaged bytes and, after a
// refused Open, the catalog still says what it said. bbolt rewrites a meta
// page on every commit, even an empty one, so a catalog bbolt can read is
// compared by contents; any other catalog must keep its exact bytes.
func checkUnchanged(t *testing.T, d *cvDir, damaged map[string][]byte, refused bool) {
	after := readTree(t, d.dir)
	for _, rel := range slices.Sorted(maps.Keys(damaged)) {
		if !strings.HasPrefix(rel, "buffers/") {
			continue // the catalog is compared below; catalog.snapshot.json is rewritten on every open
		}
		a, ok := after[rel]
		if ok && !refused && strings.HasSuffix(rel, "/rows.meta") && len(a) == len(damaged[rel]) && len(a) >= headerSize {
			// Every sync rewrites the watermark block, a torn one included.
			a = slices.Clone(a)
			copy(a[watermarkOff:watermarkOff+12], damaged[rel][watermarkOff:])
		}
		if !ok {
			t.Errorf("%s was removed", rel)
		} else if !bytes.Equal(a, damaged[rel]) {
			t.Errorf("%s changed: damage was repaired or overwritten behind the user's back", rel)
		}
	}
	for rel := range after {
		if _, ok := damaged[rel]; !ok && strings.HasPrefix(rel, "buffers/") {
			t.Errorf("%s was created", rel)
		}
	}
	if !refused {
		return
	}
	want, err := catalogBytesContents(t, damaged[cvCatalog])
	if err != nil {
		if !bytes.Equal(after[cvCatalog], damaged[cvCatalog]) {
			t.Errorf("the damaged catalog was rewritten (%d bytes, was %d)", len(after[cvCatalog]), len(damaged[cvCatalog]))
		}
		return
	}
	if got := catalogContents(t, d.abs(cvCatalog)); !maps.Equal(got, want) {
		t.Errorf("a refused Open changed the catalog:\n%s", diffMaps(want, got))
	}
}

// catalogBytesContents reads a catalog given as bytes (see catalogContents).
func catalogBytesContents(t testing.TB, b []byte) (map[string]string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "catalog.db")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return readCatalog(path)
}

func diffMaps(want, got map[string]string) string {
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok {
			fmt.Fprintf(&sb, "  - %s = %s\n", k, want[k])
		} else if g != want[k] {
			fmt.Fprintf(&sb, "  ~ %s = %s\n    was %s\n", k, g, want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&sb, "  + %s = %s\n", k, got[k])
		}
	}
	return sb.String()
}

// runMetaCases damage rows.meta records of format version 2 and the run
// log (row_meta "runs").
func runMetaCases() []corruptCase {
	meta := cvBufRel(cvBuf, "rows.meta")
	seg := cvBufRel(cvBuf, runSegName(1))
	rec := func(seq int64) int64 { return headerSize + seq%cvCap*fileRunRecordSize }
	return []corruptCase{
		{name: "rows.meta says version 1", corrupt: func(d *cvDir) { d.putU32(d.meta(), 8, FormatVersion, metaHeaderCRCOff) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 8},
		{name: "rows.meta record size differs", corrupt: func(d *cvDir) { d.putU32(d.meta(), 12, recordSize, metaHeaderCRCOff) },
			wantErr: ErrCorrupt, wantFile: meta, wantOff: 0},
		{name: "record seq byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSeq)+frWord, 0x01) },
			lost: []int64{cvSeq}},
		{name: "record run delta byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSeq)+frWord+6, 0x01) },
			lost: []int64{cvSeq}},
		{name: "record offset byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSeq)+frOff, 0x01) },
			lost: []int64{cvSeq}},
		{name: "record distance byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSeq)+frDist, 0x02) },
			lost: []int64{cvSeq}},
		{name: "record checksum byte flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSeq)+frCRC+2, 0x10) },
			lost: []int64{cvSeq}},
		// The writing bit has no checksum of its own: set on a complete
		// record it must cost that row, nothing more.
		{name: "record writing bit set", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSeq)+frWord+5, 0x80) },
			lost: []int64{cvSeq}},
		// Bit 46 of the seq residue moves the seq 2^46 away, into the same
		// slot (the capacity divides 2^46): it must cost that row, not
		// move the ring 2^46 rows ahead.
		{name: "record seq bit 46 flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSign)+frWord+5, 0x40) },
			lost: []int64{cvSign}},
		{name: "record seq bit 46 and writing bit flipped", corrupt: func(d *cvDir) { d.xor(d.meta(), rec(cvSign)+frWord+5, 0xc0) },
			lost: []int64{cvSign}},
		// A version 1 record in the wrong slot refuses the open; a version
		// 2 record's checksum covers the bytes of its own slot, so a
		// moved one is a torn record there.
		{name: "record moved to another slot", corrupt: func(d *cvDir) {
			b := d.read(d.meta())
			copy(b[rec(cvSeq+1):rec(cvSeq+1)+fileRunRecordSize], b[rec(cvSeq):rec(cvSeq)+fileRunRecordSize])
			d.write(d.meta(), b)
		}, lost: []int64{cvSeq + 1}},

		// The run log.
		{name: "run segment magic", corrupt: func(d *cvDir) { d.xor(seg, 1, 0x04) },
			wantErr: ErrCorrupt, wantFile: seg, wantOff: 0},
		{name: "run segment header checksum byte flipped", corrupt: func(d *cvDir) { d.xor(seg, segHeaderCRCOff, 0x01) },
			wantErr: ErrCorrupt, wantFile: seg, wantOff: segHeaderCRCOff},
		{name: "run segment version bumped", corrupt: func(d *cvDir) { d.putU32(seg, 8, metaVersionRuns+1, segHeaderCRCOff) },
			wantErr: ErrVersionMismatch, wantFile: seg},
		{name: "run segment copied from another buffer", corrupt: func(d *cvDir) { d.write(seg, d.p.files[cvBufRel(cvOther, runSegName(1))]) },
			wantErr: ErrCorrupt, wantFile: seg, wantOff: 16},
		{name: "run segment renumbered", corrupt: func(d *cvDir) {
			d.write(cvBufRel(cvBuf, runSegName(7)), d.read(seg))
			if err := os.Remove(d.abs(seg)); err != nil {
				d.t.Fatal(err)
			}
		}, wantErr: ErrCorrupt, wantFile: cvBufRel(cvBuf, runSegName(7)), wantOff: 24},
		// A damaged run record costs the rows of its piece, and only them.
		{name: "run record byte flipped", corrupt: func(d *cvDir) {
			off, _ := cvPiece(d.t, d.p.files[seg], func(p runPiece) bool { return cvSeq >= p.FirstSeq && cvSeq <= p.lastSeq() })
			d.xor(seg, int64(off)+rlTraj, 0x01)
		}, lostIn: func(t testing.TB, p *pristineStore) []int64 {
			_, piece := cvPiece(t, p.files[seg], func(p runPiece) bool { return cvSeq >= p.FirstSeq && cvSeq <= p.lastSeq() })
			return cvPieceRows(p, piece)
		}},
		// A crash cut the last append short (as "mid-runs" does): the
		// rows of its pieces were never acknowledged, but here they are
		// below the watermark, so they are damage.
		{name: "run segment's last record torn", corrupt: func(d *cvDir) {
			b := d.read(seg)
			off, _ := cvLastPiece(d.t, b)
			clear(b[off+runLogRecordSize/2 : off+runLogRecordSize])
			d.write(seg, b)
		}, lostIn: func(t testing.TB, p *pristineStore) []int64 {
			_, last := cvLastPiece(t, p.files[seg])
			return cvPieceRows(p, last)
		}},
		// A file cut short (a copy that stopped): the pieces past the cut
		// and the one it splits are gone.
		{name: "run segment truncated in its last record", corrupt: func(d *cvDir) {
			off, _ := cvLastPiece(d.t, d.read(seg))
			d.truncate(seg, int64(off+runLogRecordSize/2))
		}, lostIn: func(t testing.TB, p *pristineStore) []int64 {
			_, last := cvLastPiece(t, p.files[seg])
			return cvPieceRows(p, last)
		}},
	}
}

// cvPiece returns the offset in a run segment of the first record that
// match accepts, and the record.
func cvPiece(t testing.TB, seg []byte, match func(runPiece) bool) (int, runPiece) {
	t.Helper()
	for off := segHeaderSize; off+runLogRecordSize <= len(seg); off += runLogRecordSize {
		if isZero(seg[off : off+runLogRecordSize]) {
			continue // room never written
		}
		p, why := decodeRunPiece(seg[off : off+runLogRecordSize])
		if why != "" {
			t.Fatalf("fixture: run record at %d: %s", off, why)
		}
		if match(p) {
			return off, p
		}
	}
	t.Fatal("fixture: no such run record")
	return 0, runPiece{}
}

// cvLastPiece returns the offset of the last run record written in a run
// segment, and the record.
func cvLastPiece(t testing.TB, seg []byte) (int, runPiece) {
	t.Helper()
	for off := len(seg) - len(seg)%runLogRecordSize - runLogRecordSize; off >= segHeaderSize; off -= runLogRecordSize {
		if rec := seg[off : off+runLogRecordSize]; !isZero(rec) {
			p, why := decodeRunPiece(rec)
			if why != "" {
				t.Fatalf("fixture: run record at %d: %s", off, why)
			}
			return off, p
		}
	}
	t.Fatal("fixture: no run record")
	return 0, runPiece{}
}

// cvPieceRows lists the live rows of cvBuf in the fixture that piece holds.
func cvPieceRows(p *pristineStore, piece runPiece) []int64 {
	var out []int64
	for seq, r := range p.rows[cvBuf] {
		if r.meta.TrajID == piece.TrajID && seq >= piece.FirstSeq && seq <= piece.lastSeq() {
			out = append(out, seq)
		}
	}
	slices.Sort(out)
	return out
}
