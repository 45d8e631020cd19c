package storage

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TrajectoryLengths must equal a histogram counted by walking every
// trajectory, for any mix of lengths, including trajectories cut by the
// ring and ones longer than the exact length index.
func TestTrajectoryLengths(t *testing.T) {
	tests := []struct {
		name     string
		capacity int64
		lengths  []int // episode lengths written in order, one env
		buckets  int
	}{
		{name: "empty", capacity: 16, buckets: 8},
		{name: "one trajectory", capacity: 16, lengths: []int{5}, buckets: 8},
		{name: "equal lengths", capacity: 64, lengths: []int{3, 3, 3, 3}, buckets: 4},
		{name: "mixed, more buckets than lengths", capacity: 256, lengths: []int{1, 2, 9, 40, 17, 3, 3}, buckets: 30},
		{name: "ring cuts the oldest", capacity: 20, lengths: []int{12, 7, 9, 4}, buckets: 5},
		{name: "longer than the exact index", capacity: 10000, lengths: []int{5000, 30, 4095, 4094}, buckets: 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, t.TempDir())
			defer s.Close()
			spec := testSpec(KindMemory, tc.capacity, false)
			b := mustCreate(t, s, "lens", spec)
			for _, n := range tc.lengths {
				rows := make([]row, n)
				rows[n-1].terminated = true
				mustExtend(t, b, "s", makeBatch(spec, rows, false))
			}
			var h LengthHistogram
			var want []int
			if err := b.ReadIndex(func(v Index) {
				h = v.TrajectoryLengths(tc.buckets)
				for i := range v.NumTrajectories() {
					want = append(want, v.Trajectory(i).Len())
				}
			}); err != nil {
				t.Fatal(err)
			}
			if h.Trajectories != len(want) {
				t.Fatalf("%d trajectories, want %d", h.Trajectories, len(want))
			}
			if len(want) == 0 {
				if len(h.Counts) != 0 {
					t.Fatalf("counts %v for an empty buffer", h.Counts)
				}
				return
			}
			if len(h.Counts) > tc.buckets || len(h.Edges) != len(h.Counts)+1 {
				t.Fatalf("%d counts, %d edges for %d buckets", len(h.Counts), len(h.Edges), tc.buckets)
			}
			got := make([]int, len(h.Counts))
			for _, n := range want {
				n = min(n, MaxExactLength)
				i, found := slices.BinarySearch(h.Edges, n)
				if !found {
					i--
				}
				if i < 0 || i >= len(got) {
					t.Fatalf("length %d outside the edges %v", n, h.Edges)
				}
				got[i]++
			}
			if !slices.Equal(got, h.Counts) {
				t.Fatalf("counts %v, want %v (edges %v, lengths %v)", h.Counts, got, h.Edges, want)
			}
			if wantCapped := slices.Max(want) >= MaxExactLength; h.Capped != wantCapped {
				t.Fatalf("capped %v, want %v", h.Capped, wantCapped)
			}
		})
	}
}

func TestActivity(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemory, 8, false)
	b := mustCreate(t, s, "act", spec)
	if a := b.Activity(0); len(a.T) != 0 {
		t.Fatalf("a new buffer has activity %+v", a)
	}
	mustExtend(t, b, "s", makeBatch(spec, make([]row, 5), false))
	mustExtend(t, b, "s", makeBatch(spec, make([]row, 6), false))
	b.NoteSampled(7)
	b.NoteSampled(3)
	a := b.Activity(0)
	n := len(a.T)
	if n == 0 || n > 2 {
		t.Fatalf("%d points, want 1 (or 2 across a second)", n)
	}
	if a.WriteCount[n-1] != 11 || a.Size[n-1] != 8 || a.SamplesServed[n-1] != 10 {
		t.Fatalf("last point: write_count %v size %v samples %v, want 11 8 10", a.WriteCount[n-1], a.Size[n-1], a.SamplesServed[n-1])
	}
	if late := b.Activity(a.T[n-1]); len(late.T) != 0 {
		t.Fatalf("Activity(since the last point) = %+v, want nothing", late)
	}
}

func TestOpenTrajectoriesByStream(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemory, 64, false)
	b := mustCreate(t, s, "streams", spec)
	mustExtend(t, b, "a", makeBatch(spec, []row{{env: 0}, {env: 1}, {env: 2, terminated: true}}, false))
	mustExtend(t, b, "b", makeBatch(spec, []row{{env: 0}}, false))
	mustExtend(t, b, "c", makeBatch(spec, []row{{env: 0, truncated: true}}, false))
	got := b.OpenTrajectoriesByStream()
	if len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("open by stream %v, want a:2 b:1", got)
	}
}

func TestSamplePriorities(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	plain := mustCreate(t, s, "plain", testSpec(KindMemory, 8, false))
	if p, err := plain.SamplePriorities(10, rand.New(rand.NewPCG(1, 2))); err != nil || p != nil {
		t.Fatalf("a buffer without priorities: %v %v, want nil", p, err)
	}
	spec := testSpec(KindMemory, 8, false)
	spec.Priority = &PriorityOptions{Alpha: 1, Eps: 1e-6}
	b := mustCreate(t, s, "prio", spec)
	if p, err := b.SamplePriorities(10, rand.New(rand.NewPCG(1, 2))); err != nil || len(p) != 0 {
		t.Fatalf("an empty buffer: %v %v, want none", p, err)
	}
	mustExtend(t, b, "s", makeBatch(spec, make([]row, 12), false)) // seqs 4..11 live
	if _, _, err := b.UpdatePriorities([]int64{4, 5, 6, 7, 8, 9, 10, 11}, []float64{1, 2, 3, 4, 5, 6, 7, 8}); err != nil {
		t.Fatal(err)
	}
	p, err := b.SamplePriorities(400, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 400 || !slices.IsSorted(p) || p[0] < 1 || p[len(p)-1] > 8 {
		t.Fatalf("%d priorities from %v to %v, want 400 sorted in [1, 8]", len(p), p[0], p[len(p)-1])
	}
	seen := map[float64]bool{}
	for _, v := range p {
		seen[v] = true
	}
	if len(seen) != 8 {
		t.Fatalf("%d distinct priorities in 400 draws of 8 rows, want all 8", len(seen))
	}
}
