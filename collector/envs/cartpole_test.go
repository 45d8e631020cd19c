package envs

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// One step from a known state, worked by hand from the CartPole equations
// (gym's cartpole.py): state (0, 0, 0.1, 0), push right.
func TestCartPoleStepByHand(t *testing.T) {
	c := NewCartPole(rand.New(rand.NewPCG(1, 2)))
	c.SetState(0, 0, 0.1, 0)
	obs, r, term, trunc := c.Step(1)
	sin, cos := math.Sin(0.1), math.Cos(0.1)
	temp := 10.0 / 1.1
	thetaAcc := (9.8*sin - cos*temp) / (0.5 * (4.0/3.0 - 0.1*cos*cos/1.1))
	xAcc := temp - 0.05*thetaAcc*cos/1.1
	want := [4]float32{0, float32(0.02 * xAcc), 0.1, float32(0.02 * thetaAcc)}
	if obs != want || r != 1 || term || trunc {
		t.Fatalf("step: %v %v %v %v, want %v", obs, r, term, trunc, want)
	}
	// Euler order: positions use the old velocities, so x stays 0 on the
	// first step while x_dot moves.
	obs, _, _, _ = c.Step(1)
	if obs[0] != float32(0.02*0.02*xAcc) {
		t.Fatalf("second step x = %v", obs[0])
	}
}

func TestCartPoleTermination(t *testing.T) {
	tests := []struct {
		name                  string
		x, xDot, theta, thDot float64
		wantTerm              bool
	}{
		{"upright", 0, 0, 0, 0, false},
		{"pole past 12 degrees", 0, 0, 0.2095, 1, true},
		{"cart past 2.4", 2.39, 1, 0, 0, true},
		{"cart past -2.4", -2.39, -1, 0, 0, true},
	}
	for _, tc := range tests {
		c := NewCartPole(rand.New(rand.NewPCG(1, 2)))
		c.SetState(tc.x, tc.xDot, tc.theta, tc.thDot)
		_, _, term, _ := c.Step(0)
		if term != tc.wantTerm {
			t.Errorf("%s: terminated=%v", tc.name, term)
		}
	}
}

func TestCartPoleTruncatesAt500(t *testing.T) {
	c := NewCartPole(rand.New(rand.NewPCG(3, 4)))
	c.Reset()
	// Balance with a simple controller: push towards the lean.
	for i := 1; i <= CartPoleMaxSteps; i++ {
		o := c.Obs()
		a := 0
		if o[2]+0.5*o[3] > 0 {
			a = 1
		}
		_, _, term, trunc := c.Step(a)
		if term {
			t.Fatalf("controller failed at step %d", i)
		}
		if trunc != (i == CartPoleMaxSteps) {
			t.Fatalf("step %d truncated=%v", i, trunc)
		}
	}
}

func TestCartPoleResetRangeAndDeterminism(t *testing.T) {
	a := NewCartPole(rand.New(rand.NewPCG(9, 9)))
	b := NewCartPole(rand.New(rand.NewPCG(9, 9)))
	for i := 0; i < 1000; i++ {
		oa, ob := a.Reset(), b.Reset()
		if oa != ob {
			t.Fatal("same seed, different resets")
		}
		for _, v := range oa {
			if v < -0.05 || v >= 0.05 {
				t.Fatalf("reset value %v out of [-0.05, 0.05)", v)
			}
		}
	}
	// A random policy ends episodes quickly (mean length ~22 in gym).
	rng := rand.New(rand.NewPCG(5, 6))
	c := NewCartPole(rng)
	total, episodes := 0, 0
	c.Reset()
	for episodes < 2000 {
		_, _, term, trunc := c.Step(rng.IntN(2))
		total++
		if term || trunc {
			episodes++
			c.Reset()
		}
	}
	if mean := float64(total) / float64(episodes); mean < 15 || mean > 30 {
		t.Fatalf("random policy mean episode length %.1f, want about 22", mean)
	}
}

// cartpole-masked is cartpole with the velocities dropped: the same seed
// and actions give the same episodes, observations (x, theta) and rewards.
func TestCartPoleMaskedIsCartPoleWithoutVelocities(t *testing.T) {
	const n = 3
	full, err := New("cartpole", n, &Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	masked, err := New("cartpole-masked", n, &Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s := masked.Spec(); s.ObsElems() != 2 || s.NumActions != 2 || s.MaxEpisodeSteps != 500 {
		t.Fatalf("masked spec %+v", s)
	}
	full.Seed(7)
	masked.Seed(7)
	fo, mo := make([]byte, n*16), make([]byte, n*8)
	if err := full.Reset(nil, fo); err != nil {
		t.Fatal(err)
	}
	if err := masked.Reset(nil, mo); err != nil {
		t.Fatal(err)
	}
	check := func(step int) {
		t.Helper()
		for e := range n {
			f, m := getF32s(fo[e*16:(e+1)*16]), getF32s(mo[e*8:(e+1)*8])
			if m[0] != f[0] || m[1] != f[2] {
				t.Fatalf("step %d copy %d: masked %v, full %v", step, e, m, f)
			}
		}
	}
	check(0)
	rng := rand.New(rand.NewPCG(1, 1))
	fa, ma := NewActions(full.Spec(), n), NewActions(masked.Spec(), n)
	fr, mr := NewStepResult(full.Spec(), n), NewStepResult(masked.Spec(), n)
	fr.Obs, mr.Obs = fo, mo
	mask, dones := make([]bool, n), 0
	for step := 1; step <= 300; step++ {
		for e := range n {
			fa.Discrete[e] = int64(rng.IntN(2))
			ma.Discrete[e] = fa.Discrete[e]
		}
		if err := full.Step(fa, fr); err != nil {
			t.Fatal(err)
		}
		if err := masked.Step(ma, mr); err != nil {
			t.Fatal(err)
		}
		check(step)
		any := false
		for e := range n {
			if fr.Reward[e] != mr.Reward[e] || fr.Terminated[e] != mr.Terminated[e] || fr.Truncated[e] != mr.Truncated[e] {
				t.Fatalf("step %d copy %d: rewards or ends differ", step, e)
			}
			mask[e] = fr.Terminated[e] || fr.Truncated[e]
			if mask[e] {
				any = true
				dones++
			}
		}
		if any {
			if err := full.Reset(mask, fo); err != nil {
				t.Fatal(err)
			}
			if err := masked.Reset(mask, mo); err != nil {
				t.Fatal(err)
			}
			check(step)
		}
	}
	if dones == 0 {
		t.Fatal("no episode ended in 300 random steps")
	}
}

func getF32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
