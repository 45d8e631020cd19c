package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/spf13/cobra"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

type quickstartOptions struct {
	data     string
	steps    int
	envs     int
	capacity int64
	seed     uint64
	rowMeta  string
}

func newQuickstartCommand() *cobra.Command {
	o := &quickstartOptions{}
	cmd := &cobra.Command{
		Use:   "quickstart",
		Short: "Write CartPole steps into a store, reopen it and read them back",
		Long: `quickstart runs CartPole-v1 envs with a random policy, writes their steps into a
compact memmap buffer named "quickstart" (trajectory ids, links, final observations on
done rows), closes the store, reopens it and checks every live row against what was
written. It prints the buffer's size, trajectories and bytes per field.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runQuickstart(cmd.OutOrStdout(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", "./rbd-data", "data dir")
	f.IntVar(&o.steps, "steps", 20000, "env steps to write")
	f.IntVar(&o.envs, "envs", 8, "CartPole envs stepped side by side")
	f.Int64Var(&o.capacity, "capacity", 10000, "ring capacity in rows (the newest rows are kept)")
	f.Uint64Var(&o.seed, "seed", 1, "seed of envs and policy")
	f.StringVar(&o.rowMeta, "row-meta", "", `row metadata layout of the buffer: "blocks" (left out: the default of memmap buffers that are not fsync and hold 1,024 rows or more, rows.meta format version 3), "runs" (format version 2, which builds from 2026-11-27 open) or "row" (format version 1, which builds before 2026-11-27 open; "rbd upgrade" converts it to version 2)`)
	return cmd
}

// quickstartSpec is CartPole's step layout in compact form.
func quickstartSpec(capacity int64) storage.Spec {
	return storage.Spec{
		Capacity: capacity, Storage: storage.KindMemmap, CompactObs: true, ObsKeys: []string{"observation"},
		Fields: []storage.Field{
			{Name: "observation", DType: storage.Float32, Shape: []int{4}},
			{Name: "action", DType: storage.Int64},
			{Name: "next.reward", DType: storage.Float32},
			{Name: "next.done", DType: storage.Bool},
			{Name: "next.terminated", DType: storage.Bool},
			{Name: "next.truncated", DType: storage.Bool},
		},
	}
}

func runQuickstart(out io.Writer, o *quickstartOptions) error {
	if o.steps < 1 || o.envs < 1 || o.capacity < 1 {
		return fmt.Errorf("--steps, --envs and --capacity must be positive")
	}
	spec := quickstartSpec(o.capacity)
	spec.RowMetaLayout = storage.RowMetaLayout(o.rowMeta)
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("--row-meta: %w", err)
	}
	db, err := rbd.Open(o.data, nil)
	if err != nil {
		return err
	}
	buf, _, err := db.CreateBuffer("quickstart", spec)
	if err != nil {
		return fmt.Errorf("%w (delete %s or pass another --data to start afresh)", errorsJoin(err, db.Close()), o.data)
	}
	rng := rand.New(rand.NewPCG(o.seed, 0x9b))
	cps := make([]*envs.CartPole, o.envs)
	obs := make([][4]float32, o.envs)
	for i := range cps {
		cps[i] = envs.NewCartPole(rand.New(rand.NewPCG(o.seed, uint64(i))))
		obs[i] = cps[i].Reset()
	}
	written := map[int64][4]float32{} // seq -> observation, for the read-back check
	episodes, returns := 0, 0.0
	ret := make([]float64, o.envs)
	var firstSeq int64 = -1
	for done := 0; done < o.steps; {
		n := min(256/o.envs*o.envs, (o.steps-done+o.envs-1)/o.envs*o.envs)
		n = max(n, o.envs)
		var b stepBatch
		for r := 0; r < n; r++ {
			e := r % o.envs
			a := rng.IntN(2)
			next, rew, term, trunc := cps[e].Step(a)
			b.add(int64(e), obs[e], int64(a), rew, term, trunc, next)
			ret[e] += float64(rew)
			obs[e] = next
			if term || trunc {
				episodes++
				returns += ret[e]
				ret[e] = 0
				obs[e] = cps[e].Reset()
			}
		}
		res, err := buf.Extend("quickstart", b.batch())
		if err != nil {
			return errorsJoin(err, db.Close())
		}
		if firstSeq < 0 {
			firstSeq = res.FirstSeq
		}
		for r := 0; r < n; r++ {
			written[res.FirstSeq+int64(r)] = b.obsAt(r)
		}
		done += n
	}
	// The envs stop here, mid-episode: close their trajectories (as
	// truncated) so a later run starts new ones instead of continuing them.
	if _, err := buf.CloseStream("quickstart"); err != nil {
		return errorsJoin(err, db.Close())
	}
	if err := db.Close(); err != nil {
		return err
	}

	db, err = rbd.Open(o.data, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	buf, err = db.Buffer("quickstart")
	if err != nil {
		return err
	}
	seqs := buf.LiveSeqs(firstSeq, math.MaxInt32)
	col, _ := buf.Column("observation")
	dst := [][]byte{make([]byte, len(seqs)*col.RowBytes)}
	meta := make([]storage.RowMeta, len(seqs))
	missing, err := buf.Gather(seqs, []storage.Column{col}, dst, meta)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("read-back: %d rows missing after reopen", len(missing))
	}
	for i, seq := range seqs {
		var got [4]float32
		for k := range got {
			got[k] = math.Float32frombits(binary.LittleEndian.Uint32(dst[0][16*i+4*k:]))
		}
		if want, ok := written[seq]; ok && got != want {
			return fmt.Errorf("read-back: seq %d holds %v, wrote %v", seq, got, want)
		}
	}
	info, err := buf.Info()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %d CartPole steps from %d envs (%d episodes, mean return %.1f)\n", o.steps, o.envs, episodes, returns/math.Max(1, float64(episodes)))
	fmt.Fprintf(out, "reopened %s: buffer %q holds %d live rows of %d written, %d trajectories; all %d read back intact\n",
		o.data, info.Name, info.Size, info.WriteCount, info.Trajectories, len(seqs))
	for _, f := range append(info.Spec.Fields, storage.Field{Name: "next.observation"}) {
		if fb, ok := info.Bytes[f.Name]; ok {
			fmt.Fprintf(out, "  %-16s logical %9d B  on disk %9d B\n", f.Name, fb.Logical, fb.Stored)
		}
	}
	return nil
}

// stepBatch accumulates CartPole steps as a storage.Batch.
type stepBatch struct {
	obs, act, rew, done, term, trunc, tail []byte
	env                                    []int64
	rows                                   int
}

func (s *stepBatch) add(env int64, obs [4]float32, a int64, r float32, term, trunc bool, next [4]float32) {
	for _, v := range obs {
		s.obs = binary.LittleEndian.AppendUint32(s.obs, math.Float32bits(v))
	}
	s.act = binary.LittleEndian.AppendUint64(s.act, uint64(a))
	s.rew = binary.LittleEndian.AppendUint32(s.rew, math.Float32bits(r))
	s.done = append(s.done, b2u(term || trunc))
	s.term = append(s.term, b2u(term))
	s.trunc = append(s.trunc, b2u(trunc))
	if term || trunc {
		// compact_obs: the final observation travels on done rows only.
		for _, v := range next {
			s.tail = binary.LittleEndian.AppendUint32(s.tail, math.Float32bits(v))
		}
	}
	s.env = append(s.env, env)
	s.rows++
}

func (s *stepBatch) obsAt(r int) [4]float32 {
	var o [4]float32
	for k := range o {
		o[k] = math.Float32frombits(binary.LittleEndian.Uint32(s.obs[16*r+4*k:]))
	}
	return o
}

func (s *stepBatch) batch() *storage.Batch {
	return &storage.Batch{Rows: s.rows, Env: s.env, Fields: map[string][]byte{
		"observation": s.obs, "action": s.act, "next.reward": s.rew,
		"next.done": s.done, "next.terminated": s.term, "next.truncated": s.trunc,
		"next.observation": s.tail,
	}}
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}
