package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/storage"
)

type dumpOptions struct {
	buffer string
	rows   string
	traj   int64
	json   bool
}

func newDumpCommand() *cobra.Command {
	o := &dumpOptions{traj: -1}
	cmd := &cobra.Command{
		Use:   "dump DIR",
		Short: "Show what is in a data dir: schema, sizes, trajectories, rows",
		Long: `dump prints, for each buffer of a data dir: its spec, live rows and write count,
trajectories (count, open, length histogram) and bytes per field (logical and
stored). --rows A:B prints the rows with seq in [A, B) (negative values count
back from write_count), --traj ID one trajectory in time order.

It is read-only: it works while a server runs on the dir (it then reads the
catalog snapshot the server publishes and says how old it is) and on a dir
left by a crash.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runDump(cmd.OutOrStdout(), args[0], o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.buffer, "buffer", "", "only this buffer")
	f.StringVar(&o.rows, "rows", "", "print rows with seq in [A, B)")
	f.Int64Var(&o.traj, "traj", -1, "print the live rows of this trajectory")
	f.BoolVar(&o.json, "json", false, "print one JSON object {\"buffers\": [...]}")
	return cmd
}

type dumpRow struct {
	Seq        int64          `json:"seq"`
	TrajID     int64          `json:"traj_id"`
	Step       int64          `json:"step"`
	PrevSeq    int64          `json:"prev_seq"`
	NextSeq    int64          `json:"next_seq"`
	Env        int64          `json:"env"`
	Done       bool           `json:"done"`
	Terminated bool           `json:"terminated"`
	Truncated  bool           `json:"truncated"`
	Fields     map[string]any `json:"fields"`
}

type dumpBuffer struct {
	Name             string                        `json:"name"`
	Storage          storage.Kind                  `json:"storage"`
	Capacity         int64                         `json:"capacity"`
	Spec             storage.Spec                  `json:"spec"`
	Size             int64                         `json:"size"`
	WriteCount       int64                         `json:"write_count"`
	Durable          int64                         `json:"durable_seq"`
	Trajectories     int                           `json:"trajectories"`
	OpenTrajectories int                           `json:"open_trajectories"`
	LengthHistogram  map[string]int                `json:"length_histogram"`
	Holes            int64                         `json:"holes"`
	Damaged          int                           `json:"damaged_rows"`
	Bytes            map[string]storage.FieldBytes `json:"bytes"`
	DiskBytes        int64                         `json:"disk_bytes"`
	// RowMetaBytes and RunRecords are Info's: a slot's row metadata, and
	// the run records of a buffer with "row_meta": "runs".
	RowMetaBytes int64 `json:"row_meta_bytes"`
	RunRecords   int64 `json:"run_records,omitempty"`
	// TailLayout is Info's: where final observations are kept.
	TailLayout string `json:"tail_layout,omitempty"`
	// RateLimit is the limiter's state: live (from the running server's
	// snapshot) or, on a dir no server holds, what it restarts with.
	RateLimit *ratelimit.State `json:"rate_limit,omitempty"`
	Rows      []dumpRow        `json:"rows,omitempty"`
}

type dumpOutput struct {
	Dir                string       `json:"dir"`
	SnapshotAgeSeconds *float64     `json:"snapshot_age_seconds,omitempty"`
	Buffers            []dumpBuffer `json:"buffers"`
}

func runDump(out io.Writer, dir string, o *dumpOptions) error {
	s, err := storage.Open(dir, &storage.Options{ReadOnly: true, LockTimeout: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	defer s.Close()
	res := dumpOutput{Dir: dir, Buffers: []dumpBuffer{}}
	if at, ok := s.SnapshotTime(); ok {
		age := time.Since(at).Seconds()
		res.SnapshotAgeSeconds = &age
	}
	bufs := s.Buffers()
	if o.buffer != "" {
		b, err := s.Buffer(o.buffer)
		if err != nil {
			return err
		}
		bufs = []*storage.Buffer{b}
	}
	for _, b := range bufs {
		db, err := dumpOne(b, o)
		if err != nil {
			return err
		}
		res.Buffers = append(res.Buffers, db)
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printDump(out, &res)
	return nil
}

func dumpOne(b *storage.Buffer, o *dumpOptions) (dumpBuffer, error) {
	info, err := b.Info()
	if err != nil {
		return dumpBuffer{}, err
	}
	d := dumpBuffer{
		Name: info.Name, Storage: info.Spec.Storage, Capacity: info.Spec.Capacity, Spec: info.Spec,
		Size: info.Size, WriteCount: info.WriteCount, Durable: info.Durable, Trajectories: info.Trajectories,
		OpenTrajectories: info.OpenTrajectories, Holes: info.Holes, Damaged: info.Damaged, Bytes: info.Bytes,
		DiskBytes: info.DiskBytes, RowMetaBytes: info.RowMetaBytes, RunRecords: info.RunRecords, TailLayout: info.TailLayout,
		LengthHistogram: map[string]int{}, RateLimit: info.RateLimit,
	}
	var trajSeqs []int64
	b.ReadIndex(func(ix storage.Index) {
		for i := 0; i < ix.NumTrajectories(); i++ {
			d.LengthHistogram[lengthBucket(ix.Trajectory(i).Len())]++
		}
		if o.traj >= 0 {
			if t := ix.ByID(o.traj); t != nil {
				for i := 0; i < t.Len(); i++ {
					trajSeqs = append(trajSeqs, t.Seq(i))
				}
			}
		}
	})
	var seqs []int64
	switch {
	case o.rows != "":
		from, to, err := parseRange(o.rows, info.WriteCount)
		if err != nil {
			return d, err
		}
		if to > from {
			seqs = b.LiveSeqs(from, int(min(to-from, 1<<20)))
			seqs = slices.DeleteFunc(seqs, func(s int64) bool { return s >= to })
		}
	case o.traj >= 0:
		if trajSeqs == nil {
			return d, fmt.Errorf("buffer %q has no live trajectory %d", b.Name(), o.traj)
		}
		seqs = trajSeqs
	}
	if len(seqs) > 0 {
		rows, err := readRows(b, seqs)
		if err != nil {
			return d, err
		}
		d.Rows = rows
	}
	return d, nil
}

// lengthBucket names power-of-two length buckets: "1", "2-3", "4-7", ...
func lengthBucket(n int) string {
	lo := 1
	for lo*2 <= n {
		lo *= 2
	}
	if lo == 1 {
		return "1"
	}
	return fmt.Sprintf("%d-%d", lo, 2*lo-1)
}

func parseRange(s string, wc int64) (int64, int64, error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("--rows %q: want A:B", s)
	}
	parse := func(v string, def int64) (int64, error) {
		if v == "" {
			return def, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("--rows %q: %q is not an integer", s, v)
		}
		if n < 0 {
			n += wc
		}
		return max(n, 0), nil
	}
	from, err := parse(a, 0)
	if err != nil {
		return 0, 0, err
	}
	to, err := parse(b, wc)
	return from, to, err
}

func readRows(b *storage.Buffer, seqs []int64) ([]dumpRow, error) {
	spec := b.Spec()
	var cols []storage.Column
	for _, f := range spec.Fields {
		c, _ := b.Column(f.Name)
		cols = append(cols, c)
	}
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = make([]byte, len(seqs)*c.RowBytes)
	}
	meta := make([]storage.RowMeta, len(seqs))
	missing, err := b.Gather(seqs, cols, dst, meta)
	if err != nil {
		return nil, err
	}
	var rows []dumpRow
	for j, m := range meta {
		if slices.Contains(missing, j) {
			continue
		}
		r := dumpRow{Seq: m.Seq, TrajID: m.TrajID, Step: m.Step, PrevSeq: m.PrevSeq, NextSeq: m.NextSeq, Env: m.Env,
			Done: m.Done, Terminated: m.Terminated, Truncated: m.Truncated, Fields: map[string]any{}}
		for i, c := range cols {
			t := codec.Tensor{Name: c.Name, DType: c.DType.String(), Shape: c.Shape, Data: dst[i][j*c.RowBytes : (j+1)*c.RowBytes]}
			js, err := codec.AppendJSONTensor(nil, &t)
			if err != nil {
				return nil, err
			}
			r.Fields[c.Name] = json.RawMessage(js)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func printRateLimit(out io.Writer, rl *ratelimit.State, live bool) {
	if rl.SamplesPerInsert == nil {
		fmt.Fprintf(out, "  rate limit: min_size %d (no ratio); blocked: %s\n", rl.MinSize, rl.Blocked)
	} else {
		fmt.Fprintf(out, "  rate limit: samples_per_insert %g, min_size %d, error_buffer %g\n", *rl.SamplesPerInsert, rl.MinSize, *rl.ErrorBuffer)
		fmt.Fprintf(out, "    diff %g in [%g, %g] (inserts %d, samples %d); blocked: %s\n", rl.Diff, *rl.MinDiff, *rl.MaxDiff, rl.Inserts, rl.Samples, rl.Blocked)
	}
	if live {
		fmt.Fprintf(out, "    waiting: %d samples, %d extends; waited %.1fs / %.1fs; refused %d / %d\n",
			rl.WaitingSamples, rl.WaitingExtends, rl.SampleWaitSeconds, rl.ExtendWaitSeconds, rl.RefusedSamples, rl.RefusedExtends)
	} else {
		fmt.Fprintln(out, "    (no server holds the dir: these are the counters it restarts with)")
	}
}

func printDump(out io.Writer, res *dumpOutput) {
	fmt.Fprintf(out, "data dir %s\n", res.Dir)
	if res.SnapshotAgeSeconds != nil {
		fmt.Fprintf(out, "note: in use by a running server; read its catalog snapshot (%.1fs old)\n", *res.SnapshotAgeSeconds)
	}
	for _, d := range res.Buffers {
		fmt.Fprintf(out, "\nbuffer %q  storage %s  capacity %d", d.Name, d.Storage, d.Capacity)
		if d.Spec.Durability != "" {
			fmt.Fprintf(out, "  durability %s", d.Spec.Durability)
		}
		if d.Spec.CompactObs {
			fmt.Fprintf(out, "  compact_obs %v", d.Spec.ObsKeys)
		}
		if d.Spec.Priority != nil {
			fmt.Fprintf(out, "  priority alpha=%g eps=%g", d.Spec.Priority.Alpha, d.Spec.Priority.Eps)
		}
		fmt.Fprintf(out, "\n  rows: %d live, %d written, durable below seq %d, %d holes, %d damaged\n", d.Size, d.WriteCount, d.Durable, d.Holes, d.Damaged)
		fmt.Fprintf(out, "  trajectories: %d live, %d open\n", d.Trajectories, d.OpenTrajectories)
		if d.Storage != storage.KindMemory {
			fmt.Fprintf(out, "  disk: %d bytes in files\n", d.DiskBytes)
		}
		runs := d.Spec.RowMetaLayout == storage.RowMetaRuns || d.Spec.RowMetaLayout == storage.RowMetaStrided
		switch {
		case d.Spec.RowMetaLayout == storage.RowMetaBlocks:
			fmt.Fprintf(out, "  row metadata: rows.meta format version 3 (block records, %d byte a slot) and a run log; %d run records in memory\n", d.RowMetaBytes, d.RunRecords)
		case runs && d.Storage == storage.KindMemmap:
			fmt.Fprintf(out, "  row metadata: rows.meta format version 2 (%d bytes a slot) and a run log; %d run records in memory\n", d.RowMetaBytes, d.RunRecords)
		case runs:
			fmt.Fprintf(out, "  row metadata: %d bytes a slot and %d run records\n", d.RowMetaBytes, d.RunRecords)
		default:
			fmt.Fprintf(out, "  row metadata: %d bytes a slot\n", d.RowMetaBytes)
		}
		switch {
		case d.TailLayout == "dense" && d.Spec.RowMetaLayout == storage.RowMetaBlocks:
			fmt.Fprintf(out, "  final observations: dense tail files (tail format version 3: entries with checksums)\n")
		case d.TailLayout == "dense" && d.Storage == storage.KindMemmap:
			fmt.Fprintf(out, "  final observations: dense tail files (tail format version 2)\n")
		case d.TailLayout == "slot" && d.Storage == storage.KindMemmap:
			fmt.Fprintf(out, "  final observations: at the slot (tail format version 1; rbd upgrade makes them dense)\n")
		}
		if c := d.Spec.Compression; c != nil {
			fmt.Fprintf(out, "  compression: %s level %d, chunks of %d rows, delta %v\n", c.Codec, c.Level, c.ChunkLen, c.Delta)
		}
		if rl := d.RateLimit; rl != nil {
			printRateLimit(out, rl, res.SnapshotAgeSeconds != nil)
		}
		if len(d.LengthHistogram) > 0 {
			keys := make([]string, 0, len(d.LengthHistogram))
			for k := range d.LengthHistogram {
				keys = append(keys, k)
			}
			slices.SortFunc(keys, func(a, b string) int { return bucketLo(a) - bucketLo(b) })
			peak := 0
			for _, v := range d.LengthHistogram {
				peak = max(peak, v)
			}
			fmt.Fprintln(out, "  trajectory lengths:")
			for _, k := range keys {
				n := d.LengthHistogram[k]
				fmt.Fprintf(out, "    %10s %7d %s\n", k, n, strings.Repeat("#", int(math.Ceil(40*float64(n)/float64(peak)))))
			}
		}
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  field\tdtype\tshape\tkept as\tlogical B\tstored B\tlogical/stored")
		names := make([]string, 0, len(d.Bytes))
		for _, f := range d.Spec.Fields {
			names = append(names, f.Name)
		}
		for k := range d.Bytes {
			if !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
		for _, n := range names {
			fb := d.Bytes[n]
			dt, shape, kept := "", "", "column"
			if f, ok := d.Spec.Field(n); ok {
				dt, shape = f.DType.String(), fmt.Sprint(f.Shape)
				if d.Spec.Compressed(f) {
					kept = "chunks"
					if fs := f.FrameStack; fs != nil {
						kept = fmt.Sprintf("chunks, frames k=%d", fs.K)
					}
				}
			} else {
				dt, shape, kept = "(tail)", "final obs", "column"
				if f, ok := d.Spec.Field(strings.TrimPrefix(n, "next.")); ok && d.Spec.Compressed(f) {
					kept = "in " + f.Name + " chunks"
				}
			}
			ratio := "-"
			if fb.Stored > 0 {
				ratio = fmt.Sprintf("%.1fx", float64(fb.Logical)/float64(fb.Stored))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%s\n", n, dt, shape, kept, fb.Logical, fb.Stored, ratio)
		}
		tw.Flush()
		if len(d.Rows) > 0 {
			fmt.Fprintln(out, "  rows:")
			for _, r := range d.Rows {
				flags := ""
				if r.Terminated {
					flags += " terminated"
				}
				if r.Truncated {
					flags += " truncated"
				}
				fmt.Fprintf(out, "    seq %d traj %d step %d prev %d next %d env %d%s\n", r.Seq, r.TrajID, r.Step, r.PrevSeq, r.NextSeq, r.Env, flags)
				for _, f := range d.Spec.Fields {
					v := string(r.Fields[f.Name].(json.RawMessage))
					if len(v) > 100 {
						v = v[:97] + "..."
					}
					fmt.Fprintf(out, "      %s = %s\n", f.Name, v)
				}
			}
		}
	}
}

func bucketLo(k string) int {
	lo, _, _ := strings.Cut(k, "-")
	n, _ := strconv.Atoi(lo)
	return n
}
