package envs

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// Pendulum is Pendulum-v1: a pendulum of mass m and length l hinged at one
// end, starting at a random angle, swung up by a bounded torque u. With
// θ = 0 upright and θ normalised to [-π, π), each step costs
//
//	θ² + 0.1 θ̇² + 0.001 u²
//
// (the reward is its negative, computed on the state before the step), then
// integrates with semi-implicit Euler:
//
//	θ̇' = clip(θ̇ + (3g/(2l) sin θ + 3/(m l²) u) dt, -8, 8)
//	θ'  = θ + θ̇' dt
//
// with g = 10, m = l = 1, dt = 0.05 and u clipped to [-2, 2]. The
// observation is float32 [cos θ, sin θ, θ̇]. It never terminates; it is
// truncated after 200 steps. Resets draw θ uniform in [-π, π) and θ̇
// uniform in [-1, 1).
type Pendulum struct {
	Theta, ThetaDot float64
	steps           int
}

// Pendulum-v1 constants.
const (
	PendulumMaxSpeed  = 8.0
	PendulumMaxTorque = 2.0
	PendulumDt        = 0.05
	PendulumG         = 10.0
	PendulumM         = 1.0
	PendulumL         = 1.0
	PendulumMaxSteps  = 200
	PendulumObsSize   = 3
)

// PendulumSpec is the spec of Pendulum-v1: float32 [3] observations, one
// float32 torque in [-2, 2].
func PendulumSpec() Spec {
	return Spec{Name: "pendulum", ObsDType: "float32", ObsShape: []int{PendulumObsSize},
		ActionShape: []int{1}, ActionLow: -PendulumMaxTorque, ActionHigh: PendulumMaxTorque,
		MaxEpisodeSteps: PendulumMaxSteps}
}

// AngleNormalize maps x to [-π, π).
func AngleNormalize(x float64) float64 {
	m := math.Mod(x+math.Pi, 2*math.Pi)
	if m < 0 {
		m += 2 * math.Pi
	}
	return m - math.Pi
}

// Reset starts an episode from a random state drawn from rng.
func (p *Pendulum) Reset(rng *rand.Rand) [3]float32 {
	p.Theta = (rng.Float64()*2 - 1) * math.Pi
	p.ThetaDot = rng.Float64()*2 - 1
	p.steps = 0
	return p.Obs()
}

// SetState places the pendulum at θ, θ̇ with a fresh step count.
func (p *Pendulum) SetState(theta, thetaDot float64) {
	p.Theta, p.ThetaDot, p.steps = theta, thetaDot, 0
}

// Obs returns [cos θ, sin θ, θ̇] as float32.
func (p *Pendulum) Obs() [3]float32 {
	return [3]float32{float32(math.Cos(p.Theta)), float32(math.Sin(p.Theta)), float32(p.ThetaDot)}
}

// Step applies torque u (clipped to [-2, 2]).
func (p *Pendulum) Step(u float32) (obs [3]float32, reward float32, terminated, truncated bool) {
	uu := math.Max(-PendulumMaxTorque, math.Min(PendulumMaxTorque, float64(u)))
	th, thdot := p.Theta, p.ThetaDot
	an := AngleNormalize(th)
	cost := an*an + 0.1*thdot*thdot + 0.001*uu*uu
	thdot += (3*PendulumG/(2*PendulumL)*math.Sin(th) + 3/(PendulumM*PendulumL*PendulumL)*uu) * PendulumDt
	thdot = math.Max(-PendulumMaxSpeed, math.Min(PendulumMaxSpeed, thdot))
	p.Theta = th + thdot*PendulumDt
	p.ThetaDot = thdot
	p.steps++
	return p.Obs(), float32(-cost), false, p.steps >= PendulumMaxSteps
}

type pendulumCopy struct{ p Pendulum }

func (c *pendulumCopy) Reset(rng *rand.Rand, obs []byte) {
	o := c.p.Reset(rng)
	putF32s(obs, o[:])
}

func (c *pendulumCopy) Step(_ int64, act []float32, obs []byte) (float32, bool, bool) {
	o, r, term, trunc := c.p.Step(act[0])
	putF32s(obs, o[:])
	return r, term, trunc
}

// putF32s writes v as little-endian float32s at the start of dst.
func putF32s(dst []byte, v []float32) {
	_ = dst[4*len(v)-1]
	for i, x := range v {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}
