package envs

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Steps worked out independently from the Pendulum-v1 equations (a few
// lines of Python over float64, the state before each step):
// cost = norm(θ)² + 0.1 θ̇² + 0.001 u², θ̇' = clip(θ̇ + (15 sin θ + 3u)·0.05, ±8),
// θ' = θ + 0.05 θ̇'.
func TestPendulumStepsByHand(t *testing.T) {
	type step struct {
		u                float32
		theta, thetaDot  float64
		reward, cos, sin float64
	}
	cases := []struct {
		name            string
		theta, thetaDot float64
		steps           []step
	}{
		{"three pushes", 1.0, 0.5, []step{
			{1.5, 1.0678051619302962, 1.3561032386059226, -1.02725, 0.48204838409011624, 0.8761445973103457},
			{-0.5, 1.1647157462597302, 1.9382116865886818, -1.3243594632207343, 0.3950116942988777, 0.9186760916488085},
			{2.0, 1.3110766840259946, 2.927218755325288, -1.7362292237882555, 0.2568096073739853, 0.9664620145460553},
		}},
		// θ = 3π/2 costs as -π/2 (normalised to [-π, π)); u = 5 is clipped to 2.
		{"normalised angle, clipped torque", 3 * math.Pi / 2, 0, []step{
			{5, 4.68988898038469, -0.45, -2.4714011002723395, -0.022498101610553767, -0.9997468856785308},
		}},
		// θ̇ would exceed 8 and is clipped before θ moves.
		{"speed limit", -3, 7.9, []step{{2, -2.6, 8, -15.245, -0.8568887533689473, -0.5155013718214642}}},
		{"at rest upright", 0, 0, []step{{0, 0, 0, 0, 1, 0}}},
	}
	for _, tc := range cases {
		var p Pendulum
		p.SetState(tc.theta, tc.thetaDot)
		for i, s := range tc.steps {
			obs, r, term, trunc := p.Step(s.u)
			if math.Abs(p.Theta-s.theta) > 1e-12 || math.Abs(p.ThetaDot-s.thetaDot) > 1e-12 {
				t.Fatalf("%s step %d: state (%v, %v), want (%v, %v)", tc.name, i, p.Theta, p.ThetaDot, s.theta, s.thetaDot)
			}
			want := [3]float32{float32(s.cos), float32(s.sin), float32(s.thetaDot)}
			if obs != want || r != float32(s.reward) || term || trunc {
				t.Fatalf("%s step %d: obs %v reward %v term %v trunc %v, want %v %v", tc.name, i, obs, r, term, trunc, want, float32(s.reward))
			}
		}
	}
}

func TestPendulumAngleNormalize(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{0, 0}, {math.Pi, -math.Pi}, {-math.Pi, -math.Pi}, {3 * math.Pi / 2, -math.Pi / 2},
		{-3 * math.Pi / 2, math.Pi / 2}, {7 * math.Pi, -math.Pi}, {0.5 - 4*math.Pi, 0.5},
	} {
		if got := AngleNormalize(c.in); math.Abs(got-c.want) > 1e-9 || got < -math.Pi || got >= math.Pi {
			t.Errorf("AngleNormalize(%v) = %v, want %v in [-π, π)", c.in, got, c.want)
		}
	}
}

func TestPendulumTruncatesAt200AndResetsInRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var p Pendulum
	for ep := 0; ep < 20; ep++ {
		obs := p.Reset(rng)
		if p.Theta < -math.Pi || p.Theta >= math.Pi || p.ThetaDot < -1 || p.ThetaDot >= 1 {
			t.Fatalf("reset state (%v, %v) out of range", p.Theta, p.ThetaDot)
		}
		if obs[2] != float32(p.ThetaDot) {
			t.Fatalf("reset obs %v", obs)
		}
		for i := 1; i <= PendulumMaxSteps; i++ {
			o, r, term, trunc := p.Step(float32(rng.Float64()*4 - 2))
			if term || trunc != (i == PendulumMaxSteps) {
				t.Fatalf("step %d: terminated %v truncated %v", i, term, trunc)
			}
			if r > 0 || r < -(math.Pi*math.Pi+0.1*64+0.001*4) || math.Abs(float64(o[2])) > PendulumMaxSpeed {
				t.Fatalf("step %d: reward %v obs %v out of bounds", i, r, o)
			}
			if d := float64(o[0])*float64(o[0]) + float64(o[1])*float64(o[1]); math.Abs(d-1) > 1e-6 {
				t.Fatalf("step %d: cos²+sin² = %v", i, d)
			}
		}
	}
}
