package envs

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// runVector steps a vector with random-looking but fixed actions and
// returns a checksum of every observation after each step, with the
// rewards and flags.
func runVector(t *testing.T, name string, n, workers int, opts Options) ([]uint32, []float32, []bool) {
	t.Helper()
	opts.Workers = workers
	v, err := New(name, n, &opts)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if workers > 0 && v.Workers() != min(workers, n) {
		t.Fatalf("%d workers, want %d", v.Workers(), min(workers, n))
	}
	spec := v.Spec()
	v.Seed(42)
	obs := make([]byte, n*spec.ObsBytes())
	if err := v.Reset(nil, obs); err != nil {
		t.Fatal(err)
	}
	all := []uint32{crc32.ChecksumIEEE(obs)}
	var rews []float32
	var flags []bool
	act := NewActions(spec, n)
	out := NewStepResult(spec, n)
	mask := make([]bool, n)
	steps := 120
	if spec.MaxEpisodeSteps > steps {
		steps = spec.MaxEpisodeSteps + 10
	}
	for s := 0; s < steps; s++ {
		for i := range act.Discrete {
			act.Discrete[i] = int64((s*7 + i*3) % spec.NumActions)
		}
		for i := range act.Continuous {
			act.Continuous[i] = float32((s*7+i*3)%9)/2 - 2
		}
		if err := v.Step(act, out); err != nil {
			t.Fatal(err)
		}
		all = append(all, crc32.ChecksumIEEE(out.Obs))
		rews = append(rews, out.Reward...)
		for i := range mask {
			mask[i] = out.Terminated[i] || out.Truncated[i]
			flags = append(flags, out.Terminated[i], out.Truncated[i])
		}
		if err := v.Reset(mask, out.Obs); err != nil {
			t.Fatal(err)
		}
		all = append(all, crc32.ChecksumIEEE(out.Obs))
	}
	return all, rews, flags
}

// Copies own their state and random streams: the number of workers does
// not change a single byte.
func TestVectorWorkersDeterministic(t *testing.T) {
	for _, name := range Names {
		var opts Options
		if name == "catch" {
			opts.FrameStack = 4
		}
		o1, r1, f1 := runVector(t, name, 5, 1, opts)
		o3, r3, f3 := runVector(t, name, 5, 3, opts)
		if !slices.Equal(o1, o3) || !slices.Equal(r1, r3) || !slices.Equal(f1, f3) {
			t.Errorf("%s: 1 and 3 workers differ", name)
		}
		ended := 0
		for _, f := range f1 {
			if f {
				ended++
			}
		}
		if ended == 0 {
			t.Errorf("%s: no episode ended", name)
		}
	}
}

// Copy i's episodes depend only on (seed, i): a copy behaves the same in a
// batch of 2 and a batch of 5.
func TestVectorCopiesIndependent(t *testing.T) {
	obs := map[int][]byte{}
	for _, n := range []int{2, 5} {
		v, err := New("cartpole", n, nil)
		if err != nil {
			t.Fatal(err)
		}
		v.Seed(42)
		obs[n] = make([]byte, 16*n)
		if err := v.Reset(nil, obs[n]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(obs[2], obs[5][:32]) {
		t.Fatal("copies 0 and 1 reset differently in batches of 2 and 5")
	}
}

func TestVectorResetMask(t *testing.T) {
	v, err := New("cartpole", 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	v.Seed(1)
	obs := make([]byte, 3*16)
	if err := v.Reset(nil, obs); err != nil {
		t.Fatal(err)
	}
	before := slices.Clone(obs)
	for i := range obs[16:32] {
		obs[16+i] = 0xAA
	}
	if err := v.Reset([]bool{false, true, false}, obs); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(obs[:16], before[:16]) || !bytes.Equal(obs[32:], before[32:]) {
		t.Fatal("reset touched copies outside the mask")
	}
	if bytes.Equal(obs[16:32], before[16:32]) || obs[16] == 0xAA && obs[17] == 0xAA {
		t.Fatal("masked copy not reset (or reset to the same state)")
	}
	if err := v.Reset([]bool{true}, obs); err == nil {
		t.Fatal("short mask accepted")
	}
}

type panicky struct{ at int }

func (p *panicky) Reset(_ *rand.Rand, obs []byte) { clear(obs) }
func (p *panicky) Step(a int64, _ []float32, obs []byte) (float32, bool, bool) {
	p.at--
	if p.at == 0 {
		panic("boom")
	}
	return 0, false, false
}

// A panicking copy in a worker goroutine becomes an error, not a crash or
// a hang.
func TestVectorPanicIsError(t *testing.T) {
	spec := Spec{Name: "panicky", ObsDType: "uint8", ObsShape: []int{2}, NumActions: 2}
	for _, workers := range []int{1, 2} {
		copies := []Copy{&panicky{at: 100}, &panicky{at: 3}}
		v := NewVector(spec, copies, workers)
		obs := make([]byte, 4)
		if err := v.Reset(nil, obs); err != nil {
			t.Fatal(err)
		}
		act, out := NewActions(spec, 2), NewStepResult(spec, 2)
		var err error
		for i := 0; i < 5 && err == nil; i++ {
			err = v.Step(act, out)
		}
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte("boom")) {
			t.Fatalf("workers %d: err = %v", workers, err)
		}
		v.Close()
	}
}

// slowCopy sleeps through each step: an env whose steps are expensive.
type slowCopy struct{ d time.Duration }

func (s slowCopy) Reset(_ *rand.Rand, obs []byte) { clear(obs) }
func (s slowCopy) Step(int64, []float32, []byte) (float32, bool, bool) {
	time.Sleep(s.d)
	return 0, false, false
}

// Automatic workers: steps are timed first; expensive ones move to a pool,
// cheap ones stay in the caller's goroutine.
func TestVectorAutoWorkers(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs 2 CPUs")
	}
	spec := Spec{Name: "slow", ObsDType: "uint8", ObsShape: []int{1}, NumActions: 1}
	for _, tc := range []struct {
		copies []Copy
		want   int
	}{
		{[]Copy{slowCopy{200 * time.Microsecond}, slowCopy{200 * time.Microsecond}}, 2},
		{[]Copy{slowCopy{0}, slowCopy{0}}, 1},
	} {
		v := NewVector(spec, tc.copies, 0)
		act, out := NewActions(spec, 2), NewStepResult(spec, 2)
		for i := 0; i < probeSteps+5; i++ {
			if err := v.Step(act, out); err != nil {
				t.Fatal(err)
			}
		}
		if v.Workers() != tc.want {
			t.Errorf("%v: %d workers, want %d", tc.copies[0], v.Workers(), tc.want)
		}
		v.Close()
	}
}
