// Command memeff measures what each storage layout costs for pixel replay:
// the catch env's 84x84 uint8 frames stacked 4 deep ([4,84,84]), collected
// into one buffer per layout, then sampled. It prints, per layout, the
// stored observation bytes per transition (observation plus next and final
// observations, what a plain obs + next_obs layout stores twice), the ratio
// to the plain layout, the bytes on disk, and uniform (256) and slice
// (32 x 8) sample rates with the decoded-chunk cache's hit rate.
//
//	go run ./bench/memeff                      # 20,000-row rings (about 30 s on 2 cores)
//	go run ./bench/memeff -capacity 4000 -seconds 0.5
//
// docs/memory-efficient.md and docs/performance.md quote its output.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/collector"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/sampler"
	"github.com/rbdb/rbd/storage"
)

// layout is one way of storing catch's steps.
type layout struct {
	name    string
	kind    storage.Kind
	compact bool
	dedup   bool
	comp    *storage.CompressionOptions
}

func layouts() []layout {
	z := func(level, chunk int) *storage.CompressionOptions {
		return &storage.CompressionOptions{Codec: "zstd", Level: level, ChunkLen: chunk}
	}
	return []layout{
		{name: "plain (obs + next_obs)", kind: storage.KindMemory},
		{name: "memory compact_obs", kind: storage.KindMemory, compact: true},
		{name: "memmap compact_obs", kind: storage.KindMemmap, compact: true},
		{name: "dedup, no zstd", kind: storage.KindCompressed, compact: true, dedup: true, comp: &storage.CompressionOptions{Codec: "none"}},
		{name: "zstd per row (chunk 1)", kind: storage.KindCompressed, compact: true, comp: z(1, 1)},
		{name: "zstd chunk 32", kind: storage.KindCompressed, compact: true, comp: z(1, 32)},
		{name: "zstd+dedup chunk 4", kind: storage.KindCompressed, compact: true, dedup: true, comp: z(1, 4)},
		{name: "zstd+dedup chunk 32", kind: storage.KindCompressed, compact: true, dedup: true, comp: z(1, 32)},
		{name: "zstd+dedup chunk 128", kind: storage.KindCompressed, compact: true, dedup: true, comp: z(1, 128)},
		{name: "zstd+dedup chunk 32 level 9", kind: storage.KindCompressed, compact: true, dedup: true, comp: z(9, 32)},
	}
}

func main() {
	capacity := flag.Int64("capacity", 20_000, "rows per ring")
	frames := flag.Int64("frames", 0, "frames collected into each buffer (0: 1.25 x capacity, so the ring wraps)")
	seconds := flag.Float64("seconds", 1, "seconds each sample rate is measured for")
	cacheMiB := flag.Int("cache-mib", 64, "decoded-chunk cache of compressed layouts")
	flag.Parse()
	if *frames == 0 {
		*frames = *capacity + *capacity/4
	}
	dir, err := os.MkdirTemp("", "memeff")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "layout\tobs B/transition\tvs plain\tdisk MB\tcollect frames/s\tuniform 256 batches/s\tslice 32x8 batches/s\tcache hit%%\t\n")
	var plain float64
	for i, l := range layouts() {
		r, err := measure(filepath.Join(dir, fmt.Sprint(i)), l, *capacity, *frames, *seconds, *cacheMiB)
		if err != nil {
			log.Fatalf("%s: %v", l.name, err)
		}
		if i == 0 {
			plain = r.obsPerRow
		}
		hit := "-"
		if r.hitRate >= 0 {
			hit = fmt.Sprintf("%.0f", r.hitRate)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.4f\t%.1f\t%.0f\t%.1f\t%.1f\t%s\t\n", l.name, r.obsPerRow, r.obsPerRow/plain,
			float64(r.disk)/1e6, r.collectRate, r.uniform, r.slice, hit)
	}
	tw.Flush()
}

type result struct {
	obsPerRow, collectRate, uniform, slice, hitRate float64
	disk                                            int64
}

func measure(dir string, l layout, capacity, frames int64, seconds float64, cacheMiB int) (result, error) {
	r := result{hitRate: -1}
	db, err := rbd.Open(dir, nil)
	if err != nil {
		return r, err
	}
	defer db.Close()
	o := collector.SpecOptions{Capacity: capacity, Storage: l.kind, CompactObs: l.compact, FrameDedup: l.dedup, Compression: l.comp}
	if l.comp != nil {
		c := *l.comp
		c.CacheMiB = cacheMiB
		o.Compression = &c
	}
	spec := collector.BufferSpec(envs.CatchSpec(4), o)
	if l.kind != storage.KindMemory {
		spec.Durability = storage.DurabilityNone
	}
	buf, _, err := db.CreateBuffer("catch", spec)
	if err != nil {
		return r, err
	}
	env, err := envs.New("catch", 8, &envs.Options{FrameStack: 4, Workers: 1})
	if err != nil {
		return r, err
	}
	defer env.Close()
	start := time.Now()
	if _, err := collector.Run(context.Background(), collector.Config{Env: env, Writer: collector.BufferWriter{Buffer: buf.Buffer},
		Stream: "memeff", Seed: 1, FramesPerBatch: 256, TotalFrames: frames, CompactObs: l.compact}); err != nil {
		return r, fmt.Errorf("collect: %w", err)
	}
	r.collectRate = float64(frames) / time.Since(start).Seconds()
	info, err := buf.Info()
	if err != nil {
		return r, err
	}
	r.obsPerRow = float64(info.Bytes["observation"].Stored+info.Bytes["next.observation"].Stored) / float64(info.Size)
	r.disk = info.DiskBytes
	before := info.Cache
	if r.uniform, err = rate(buf, &rbd.SampleRequest{Sampler: sampler.Uniform, BatchSize: 256}, seconds); err != nil {
		return r, err
	}
	if r.slice, err = rate(buf, &rbd.SampleRequest{Sampler: sampler.Slice, NumSlices: 32, SliceLen: 8}, seconds); err != nil {
		return r, err
	}
	if after, err := buf.Info(); err == nil && after.Cache != nil && before != nil {
		hits, misses := after.Cache.Hits-before.Hits, after.Cache.Misses-before.Misses
		if hits+misses > 0 {
			r.hitRate = 100 * float64(hits) / float64(hits+misses)
		}
	}
	return r, nil
}

// rate samples req for the given time and returns batches per second.
func rate(buf *rbd.Buffer, req *rbd.SampleRequest, seconds float64) (float64, error) {
	ctx := context.Background()
	var n uint64
	start := time.Now()
	for time.Since(start).Seconds() < seconds {
		n++
		seed := n
		req.Seed = &seed
		b, err := buf.Sample(ctx, req, nil)
		if err != nil {
			return 0, err
		}
		b.Release()
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
