package rbd

// Memory efficiency of the storage layouts on the catch env's pixel data
// (84x84 uint8 frames stacked 4 deep: [4,84,84], 28,224 B per
// observation), all in one run so the ratios compare like with like. The
// numbers are written up in docs/memory-efficient.md and
// docs/performance.md ("Compressed storage and frame dedup");
// bench/memeff prints the same table as a program.
//
// Smoke run (CI; tiny rings):
//
//	go test . -run '^$' -bench BenchmarkCompressedLayouts -benchtime 1x -short
//
// Measurement (about two minutes on 2 cores; 20,000-row rings):
//
//	go test . -run '^$' -bench BenchmarkCompressedLayouts -benchtime 2s -count 3 -cpu 2 | tee new.txt
//	go tool benchstat -col /op new.txt
//
// Every layout's buffer is filled once by the collector (catch, 8 envs,
// random policy, seed 1, batches of 256 frames) with 1.25x its capacity,
// so the ring has wrapped, and shared by the layout's sub-benchmarks; the
// buffers are closed when the top-level benchmark ends (about 2.3 GB for
// the four uncompressed layouts at 20,000 rows).

import (
	"context"
	"fmt"
	"testing"

	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/sampler"
	"github.com/rbdb/rbd/storage"
)

// memLayout is one way of storing catch's steps.
type memLayout struct {
	name    string
	kind    storage.Kind
	compact bool   // compact_obs: next.observation rebuilt at sample time
	dedup   bool   // frame_stack on observation (compressed kinds only)
	codec   string // compressed kinds: "zstd" or "none"
}

// memLayouts are the layouts compared, plain (the baseline) first.
var memLayouts = []memLayout{
	{name: "plain", kind: storage.KindMemory},
	{name: "memory-compact", kind: storage.KindMemory, compact: true},
	{name: "memmap-compact", kind: storage.KindMemmap, compact: true},
	{name: "compressed", kind: storage.KindCompressed, compact: true, codec: "zstd"},
	{name: "compressed-dedup", kind: storage.KindCompressed, compact: true, dedup: true, codec: "zstd"},
	{name: "none-dedup", kind: storage.KindCompressed, compact: true, dedup: true, codec: "none"},
}

const (
	memEnvs       = 8
	memFrameStack = 4
	memCapacity   = 20_000 // rows per ring (-short: memCapacityShort)
	// memCapacityShort keeps -short runs to a few MB per layout.
	memCapacityShort = 1024
	memUniformBatch  = 256
	memSlices        = 32
	memSliceLen      = 8
)

// memSpec is the collector's spec for catch in layout l.
func memSpec(l memLayout, capacity int64) storage.Spec {
	o := collector.SpecOptions{Capacity: capacity, Storage: l.kind, CompactObs: l.compact, FrameDedup: l.dedup}
	if l.kind == storage.KindCompressed {
		o.Compression = &storage.CompressionOptions{Codec: l.codec}
	}
	s := collector.BufferSpec(envs.CatchSpec(memFrameStack), o)
	if l.kind != storage.KindMemory {
		s.Durability = storage.DurabilityNone // the OS writes back; nothing to wait for
	}
	return s
}

// memBuf is a filled buffer of one layout and its footprint right after
// the fill.
type memBuf struct {
	db  *DB
	buf *Buffer
	// obsPerRow is the stored observation bytes (observation plus
	// next/final observations) per live transition.
	obsPerRow float64
	disk      int64
}

// memCache holds the filled buffers of one top-level benchmark.
type memCache struct {
	dir  string
	bufs map[string]*memBuf
}

func newMemCache(b *testing.B) *memCache {
	c := &memCache{dir: b.TempDir(), bufs: map[string]*memBuf{}}
	b.Cleanup(func() {
		for _, mb := range c.bufs {
			mb.db.Close()
		}
	})
	return c
}

func (c *memCache) get(b *testing.B, l memLayout) *memBuf {
	b.Helper()
	if mb := c.bufs[l.name]; mb != nil {
		return mb
	}
	capacity := int64(memCapacity)
	if testing.Short() {
		capacity = memCapacityShort
	}
	db, err := Open(fmt.Sprintf("%s/%s", c.dir, l.name), nil)
	if err != nil {
		b.Fatal(err)
	}
	buf, _, err := db.CreateBuffer("catch", memSpec(l, capacity))
	if err != nil {
		db.Close()
		b.Fatal(err)
	}
	mb := &memBuf{db: db, buf: buf}
	c.bufs[l.name] = mb
	env, err := envs.New("catch", memEnvs, &envs.Options{FrameStack: memFrameStack, Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	if _, err := collector.Run(context.Background(), collector.Config{Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer},
		Stream: "bench", Seed: 1, FramesPerBatch: 256, TotalFrames: capacity + capacity/4, CompactObs: l.compact}); err != nil {
		b.Fatalf("%s: collect: %v", l.name, err)
	}
	info, err := buf.Info()
	if err != nil {
		b.Fatal(err)
	}
	if info.Size != capacity {
		b.Fatalf("%s: %d live rows after the fill, want %d", l.name, info.Size, capacity)
	}
	mb.obsPerRow = float64(info.Bytes["observation"].Stored+info.Bytes["next.observation"].Stored) / float64(info.Size)
	mb.disk = info.DiskBytes
	return mb
}

// BenchmarkCompressedLayouts measures, per layout:
//
//   - op=footprint: one op is a Buffer.Info call; it reports obs-B/row
//     (stored observation bytes, next and final observations included,
//     per live transition), vs-plain (that over layout=plain's, measured
//     in the same run; design.md asks for at most 0.5 with compact_obs and
//     0.125 with frame dedup) and disk-MB (0 for memory buffers).
//   - op=uniform256: uniform batches of 256 transitions, every key, with
//     next.observation (stored in plain, rebuilt in the compact layouts).
//   - op=slice32x8: slice batches of 32 slices of 8 steps, the same keys.
//
// Sample ops report rows/s, batches/s and GB/s of the answer; compressed
// layouts also hit% (decoded-chunk cache hits over lookups during the
// timed loop) and decodes/batch (cache misses per batch: each is a chunk
// field read from its segment, checked and decoded). The cache is 64 MiB
// (the default) and keeps its contents across ops, as in a long-running
// learner.
func BenchmarkCompressedLayouts(b *testing.B) {
	cache := newMemCache(b)
	for _, l := range memLayouts {
		b.Run(fmt.Sprintf("layout=%s/op=footprint", l.name), func(b *testing.B) {
			plain := cache.get(b, memLayouts[0])
			mb := cache.get(b, l)
			for b.Loop() {
				if _, err := mb.buf.Info(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(mb.obsPerRow, "obs-B/row")
			b.ReportMetric(mb.obsPerRow/plain.obsPerRow, "vs-plain")
			b.ReportMetric(float64(mb.disk)/1e6, "disk-MB")
		})
		b.Run(fmt.Sprintf("layout=%s/op=uniform%d", l.name, memUniformBatch), func(b *testing.B) {
			memSampleRun(b, cache.get(b, l).buf, &SampleRequest{Sampler: sampler.Uniform, BatchSize: memUniformBatch})
		})
		b.Run(fmt.Sprintf("layout=%s/op=slice%dx%d", l.name, memSlices, memSliceLen), func(b *testing.B) {
			memSampleRun(b, cache.get(b, l).buf, &SampleRequest{Sampler: sampler.Slice, NumSlices: memSlices, SliceLen: memSliceLen})
		})
	}
}

// memSampleRun samples req in a b.Loop (a new seed per batch) and reports
// the rates and, for compressed buffers, the chunk cache's hit rate over
// the loop.
func memSampleRun(b *testing.B, buf *Buffer, req *SampleRequest) {
	ctx := context.Background()
	before, err := buf.Info()
	if err != nil {
		b.Fatal(err)
	}
	var rows, bytes int64
	var s uint64
	b.ReportAllocs()
	for b.Loop() {
		s++
		req.Seed = &s
		got, err := buf.Sample(ctx, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range got.Tensors {
			bytes += int64(len(t.Data))
			if t.Name == "seq" {
				rows += int64(len(t.Data) / 8)
			}
		}
		got.Release()
	}
	sec := b.Elapsed().Seconds()
	after, err := buf.Info()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(rows)/sec, "rows/s")
	b.ReportMetric(float64(b.N)/sec, "batches/s")
	b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
	if after.Cache != nil {
		hits, misses := after.Cache.Hits-before.Cache.Hits, after.Cache.Misses-before.Cache.Misses
		if hits+misses > 0 {
			b.ReportMetric(100*float64(hits)/float64(hits+misses), "hit%")
		}
		b.ReportMetric(float64(misses)/float64(b.N), "decodes/batch")
	}
}
