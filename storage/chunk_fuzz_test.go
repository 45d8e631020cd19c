package storage

// Fuzz targets for the decoders of chunk segments (style rule 11): the
// record parser and the payload decoder. The seeds run in every test run;
// a nightly job runs, for example:
//
//	go test ./storage -run '^$' -fuzz FuzzChunkRecord -fuzztime 60s
//	go test ./storage -run '^$' -fuzz FuzzChunkPayload -fuzztime 60s

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// fzChunkTails is the geometry the record fuzzer decodes with: two
// compressed fields, the first an obs key of a compact_obs buffer (it has
// final-observation units), as in czSpecFor; at most 8 rows a record.
var fzChunkTails = []bool{true, false}

const fzChunkRows = 8

// fzChunkRecords writes a small store with a compressed buffer of each
// crash spec (zstd; zstd with delta) and returns the raw bytes of every
// record of their segments: sealed chunks with and without final
// observations, fragments, anonymous seals.
func fzChunkRecords(tb testing.TB) [][]byte {
	tb.Helper()
	dir, err := os.MkdirTemp("", "rbd-chunkfuzz-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s := openStore(tb, dir)
	for _, name := range []string{czFsync, czFlush} {
		spec := czSpecFor(name)
		spec.Capacity = 64
		b := mustCreate(tb, s, name, spec)
		stk := newCzStacker(spec)
		tok := int64(1)
		for k := 0; k < 8; k++ {
			n := 3 + k%5
			stream, use := "a", stk
			if k == 5 {
				stream, use = "", newCzStacker(spec)
			}
			tokens := make([]int64, n)
			wants := make([]czWant, n)
			for i := range tokens {
				tokens[i], wants[i] = tok, use.next(tok)
				tok++
			}
			mustExtend(tb, b, stream, czBatch(spec, tokens, wants, k%2 == 1))
		}
	}
	if err := s.Close(); err != nil {
		tb.Fatal(err)
	}
	segs, err := filepath.Glob(filepath.Join(dir, "buffers", "*", "seg.*.rbdk"))
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(segs)
	var out [][]byte
	for _, path := range segs {
		data, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		for off := segHeaderSize; off < len(data); {
			n, err := recordLen(data[off:])
			if err != nil || off+n > len(data) {
				tb.Fatalf("%s: torn at %d", path, off)
			}
			out = append(out, slices.Clone(data[off:off+n]))
			off += n
		}
	}
	return out
}

// fzFixChunk makes what it can of b valid so that the fuzzer gets past the
// checksums to the checks behind them: magic, length and field count, the
// payload CRCs where the layout fits, then the record CRC.
func fzFixChunk(in []byte, tails []bool) []byte {
	b := slices.Clone(in)
	if len(b) < chunkHeaderSize+4 {
		return b
	}
	le := binary.LittleEndian
	copy(b, chunkMagic[:])
	le.PutUint32(b[4:], uint32(len(b)))
	le.PutUint16(b[10:], uint16(len(tails)))
	body := len(b) - 4
	rows := int(le.Uint32(b[12:]))
	tail := b[9]&recFlagTail != 0
	if rows >= 0 && rows <= 1<<16 {
		off := chunkHeaderSize + 8*rows
		type fieldAt struct{ at, stored int }
		var fs []fieldAt
		for _, tf := range tails {
			units := rows
			if tail && tf {
				units++
			}
			if off+fieldHeaderSize+units > body {
				break
			}
			fs = append(fs, fieldAt{off, int(le.Uint32(b[off+8:]))})
			off += fieldHeaderSize + units
		}
		if len(fs) == len(tails) {
			for _, f := range fs {
				if f.stored > body-off {
					break
				}
				le.PutUint32(b[f.at+12:], crc32.Checksum(b[off:off+f.stored], castagnoli))
				off += f.stored
			}
		}
	}
	le.PutUint32(b[body:], crc32.Checksum(b[:body], castagnoli))
	return b
}

// FuzzChunkRecord feeds bytes to decodeChunkRecord. It must not panic; a
// record it accepts must be internally consistent and encode back to the
// same bytes, apart from reserved bytes, which it ignores (when those are
// zero, byte for byte, checksum included). With fix set, magic, length,
// field count and checksums are made valid first.
func FuzzChunkRecord(f *testing.F) {
	for _, rec := range fzChunkRecords(f) {
		f.Add(rec, false)
		f.Add(rec[:len(rec)-1], true) // one byte short, checksums redone
	}
	// Hand-made records: codec none with delta, several rows, a tail.
	for _, r := range []*chunkRecord{
		{Kind: recSealed, Tail: true, TrajID: 7, FirstStep: 16, ID: 9, PrevID: 8, Seqs: []int64{40, 41, 45},
			Fields: []recordField{
				{Codec: codecNone, Delta: true, RawLen: 4, Modes: []byte{modeNewest, modeNewest, modeRepeat, modeZeroPad}, Payload: []byte{1, 2, 3, 4}},
				{Codec: codecNone, RawLen: 3, Modes: []byte{0, 0, 0}, Payload: []byte{5, 6, 7}},
			}},
		{Kind: recFragment, TrajID: 0, FirstStep: 0, ID: 1, Seqs: []int64{0},
			Fields: []recordField{
				{Codec: codecZstd, RawLen: 64, Modes: []byte{modeFull}, Payload: []byte{0x28, 0xb5, 0x2f, 0xfd}},
				{Codec: codecNone, RawLen: 0, Modes: []byte{modeFull}},
			}},
	} {
		f.Add(r.encode(nil), false)
	}
	f.Add([]byte("RBDK"), true)
	f.Add(make([]byte, chunkHeaderSize+4), true)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		b := in
		if fix {
			b = fzFixChunk(in, fzChunkTails)
		}
		r, err := decodeChunkRecord(b, fzChunkTails, fzChunkRows)
		if err != nil {
			return
		}
		if len(r.Seqs) < 1 || len(r.Seqs) > fzChunkRows || len(r.Fields) != len(fzChunkTails) {
			t.Fatalf("accepted a record of %d rows and %d fields", len(r.Seqs), len(r.Fields))
		}
		for i, fl := range r.Fields {
			if len(fl.Modes) != r.units(fzChunkTails[i]) {
				t.Fatalf("field %d: %d modes for %d units", i, len(fl.Modes), r.units(fzChunkTails[i]))
			}
			if fl.PayloadOff+len(fl.Payload) > len(b)-4 || !bytes.Equal(b[fl.PayloadOff:fl.PayloadOff+len(fl.Payload)], fl.Payload) {
				t.Fatalf("field %d: payload offset %d does not locate its %d bytes", i, fl.PayloadOff, len(fl.Payload))
			}
		}
		again := r.encode(nil)
		if len(again) != len(b) {
			t.Fatalf("re-encoded record has %d bytes, decoded from %d", len(again), len(b))
		}
		reserved := make([]bool, len(b))
		for i := 48; i < chunkHeaderSize; i++ {
			reserved[i] = true
		}
		off := chunkHeaderSize + 8*len(r.Seqs)
		for _, fl := range r.Fields {
			reserved[off+2], reserved[off+3] = true, true
			off += fieldHeaderSize + len(fl.Modes)
		}
		zero := true
		for i := range b[:len(b)-4] {
			if reserved[i] {
				zero = zero && b[i] == 0
				continue
			}
			if again[i] != b[i] {
				t.Fatalf("re-encoded record differs at byte %d:\n% x\n% x", i, b, again)
			}
		}
		if zero && !bytes.Equal(again, b) {
			t.Fatalf("re-encoded record differs in its checksum:\n% x\n% x", b, again)
		}
		r2, err := decodeChunkRecord(again, fzChunkTails, fzChunkRows)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("re-encoded record decodes to\n%+v\nwant\n%+v", r2, r)
		}
	})
}

// fzPayloadStores opens a store with three compressed buffers whose chunk
// stores decode payloads: zstd, zstd with delta, and no codec with delta.
func fzPayloadStores(tb testing.TB) []*chunkStore {
	tb.Helper()
	dir, err := os.MkdirTemp("", "rbd-payloadfuzz-")
	if err != nil {
		tb.Fatal(err)
	}
	s := openStore(tb, dir)
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
		os.RemoveAll(dir)
	})
	var out []*chunkStore
	for i, opts := range []*CompressionOptions{
		{Codec: "zstd", ChunkLen: 8},
		{Codec: "zstd", ChunkLen: 5, Delta: true},
		{Codec: "none", ChunkLen: 4, Delta: true},
	} {
		spec := czSpecFor(czFsync)
		spec.Capacity = 32
		spec.Compression = opts
		spec = spec.WithDefaults()
		b := mustCreate(tb, s, []string{"z", "zd", "nd"}[i], spec)
		out = append(out, b.cs)
	}
	return out
}

// fzDecodeLimit is the most a chunk store's decoder may produce: what it
// is configured with in newChunkStore.
func fzDecodeLimit(cs *chunkStore) uint64 {
	maxRaw := 0
	for _, c := range cs.fields {
		maxRaw = max(maxRaw, (cs.chunkLen+1)*c.rowBytes)
	}
	return max(uint64(maxRaw)+1, 1<<20)
}

// fzUnits turns fuzz bytes into the modes of a field's units, as a record
// may hold them: at most a chunk and a final observation, and only modes
// the field can have.
func fzUnits(cs *chunkStore, fi int, modes []byte) []byte {
	modes = slices.Clone(modes)
	if len(modes) > cs.chunkLen+1 {
		modes = modes[:cs.chunkLen+1]
	}
	if len(modes) == 0 {
		modes = []byte{modeFull}
	}
	for i := range modes {
		if cs.geoms[fi] == nil {
			modes[i] = modeFull
		} else {
			modes[i] %= modeRepeat + 1
		}
	}
	return modes
}

// FuzzChunkPayload feeds payloads to chunkStore.unpack with every codec
// (and an unknown one), with and without delta, for unit layouts a record
// can describe. It must not panic, must not allocate much beyond the
// decoder's configured limit (a zstd bomb is refused, not expanded), and
// what it returns has exactly the size the units need. And pack followed
// by unpack is the identity, for whole chunks and for fragments (units
// from..to).
func FuzzChunkPayload(f *testing.F) {
	stores := fzPayloadStores(f)
	// Real payloads: units of a frame-stacked field and a plain one.
	for which, cs := range stores {
		for fi := range cs.fields {
			g := cs.geoms[fi]
			stk := newCzStacker(czSpecFor(czFsync))
			var raw []byte
			var modes []byte
			var prev []byte
			offs := []int{0}
			for tok := int64(1); len(modes) < cs.chunkLen; tok++ {
				w := stk.next(tok)
				if g != nil {
					var m byte
					raw, m = g.encodeUnit(raw, prev, w.stack)
					modes = append(modes, m)
					prev = w.stack
				} else {
					unit := make([]byte, cs.fields[fi].rowBytes)
					crashFill(unit, tok, 3)
					raw = append(raw, unit...)
					modes = append(modes, modeFull)
				}
				offs = append(offs, len(raw))
			}
			cs.b.wmu.Lock() // pack uses the writer's scratch buffer
			rf := cs.pack(fi, &chunkField{modes: modes, offs: offs, raw: raw}, 0, len(modes))
			rf.Payload = bytes.Clone(rf.Payload) // pack's buffer is reused by the next pack
			cs.b.wmu.Unlock()
			sel := uint8(which) | uint8(fi)<<2
			f.Add(rf.Payload, sel, rf.Codec, rf.Delta, modes)
			f.Add(rf.Payload[:len(rf.Payload)/2], sel, rf.Codec, rf.Delta, modes)
		}
	}
	// zstd bombs: one frame claiming a terabyte, and many frames each
	// within the limit whose sum is not.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		f.Fatal(err)
	}
	one := enc.EncodeAll(make([]byte, 768<<10), nil)
	enc.Close()
	f.Add(bytes.Repeat(one, 12), uint8(0), codecZstd, false, []byte{0})
	f.Add(bytes.Repeat(one, 12), uint8(1), codecZstd, true, []byte{1, 1, 1, 1, 1, 1})
	// Magic, a single-segment frame with an 8-byte content size of 2^40,
	// then one last RLE block of 128 KiB zeros.
	huge := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 0, 1, 0, 0, 0x03, 0x00, 0x10, 0x00}
	f.Add(huge, uint8(0), codecZstd, false, []byte{0, 0})
	f.Add([]byte{}, uint8(2), codecNone, true, []byte{})
	f.Add([]byte{1, 2, 3}, uint8(2), uint8(7), false, []byte{0})
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd}, uint8(2), codecZstd, false, []byte{0})

	f.Fuzz(func(t *testing.T, payload []byte, sel uint8, codec uint8, delta bool, modeBytes []byte) {
		cs := stores[int(sel&3)%len(stores)]
		fi := int(sel>>2&1) % len(cs.fields)
		modes := fzUnits(cs, fi, modeBytes)
		offs := cs.unitOffsets(fi, modes)
		want := offs[len(offs)-1]

		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		raw, err := cs.unpack(payload, codec, delta, offs)
		runtime.ReadMemStats(&ms)
		limit := fzDecodeLimit(cs)
		if got := ms.TotalAlloc - before; got > 3*limit+4*uint64(len(payload)) {
			t.Fatalf("unpack of a %d-byte payload (codec %d) allocated %d bytes; the decoder's limit is %d", len(payload), codec, got, limit)
		}
		if err == nil {
			if len(raw) != want {
				t.Fatalf("unpack returned %d bytes for units of %d", len(raw), want)
			}
			if codec == codecNone && !delta && !bytes.Equal(raw, payload) {
				t.Fatalf("unpack changed a plain payload")
			}
		}

		// pack, then unpack, gives the units back: whole, and from a
		// later unit on (a fragment).
		units := make([]byte, want)
		for i := range units {
			if len(payload) > 0 {
				units[i] = payload[i%len(payload)] ^ byte(i/7)
			}
		}
		cf := &chunkField{modes: modes, offs: offs, raw: units}
		from := int(sel>>3) % len(modes)
		for _, lo := range []int{0, from} {
			cs.b.wmu.Lock()
			rf := cs.pack(fi, cf, lo, len(modes))
			cs.b.wmu.Unlock()
			sub := cs.unitOffsets(fi, modes[lo:])
			back, err := cs.unpack(rf.Payload, rf.Codec, rf.Delta, sub)
			if err != nil {
				t.Fatalf("units %d..%d: unpack of what pack made: %v", lo, len(modes), err)
			}
			if !bytes.Equal(back, units[offs[lo]:]) {
				t.Fatalf("units %d..%d (modes %v, delta %v): pack+unpack changed the bytes", lo, len(modes), modes, rf.Delta)
			}
			if int(rf.RawLen) != len(back) {
				t.Fatalf("pack says raw length %d for %d bytes", rf.RawLen, len(back))
			}
		}
	})
}
