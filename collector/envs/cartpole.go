package envs

import (
	"math"
	"math/rand/v2"
)

// CartPole is gym's CartPole-v1: a pole on a cart, pushed left (action 0)
// or right (action 1) with a fixed force. Every step gives reward 1; the
// episode terminates when the pole leans more than 12 degrees or the cart
// leaves [-2.4, 2.4], and is truncated after 500 steps. The equations, the
// constants, explicit Euler integration and the float32 observation follow
// gym's classic_control/cartpole.py, so trajectories match gym's for the
// same initial state and actions.
type CartPole struct {
	x, xDot, theta, thetaDot float64
	steps                    int
	rng                      *rand.Rand
}

// CartPole-v1 constants.
const (
	cartPoleGravity      = 9.8
	cartPoleMassCart     = 1.0
	cartPoleMassPole     = 0.1
	cartPoleTotalMass    = cartPoleMassCart + cartPoleMassPole
	cartPoleLength       = 0.5 // half the pole's length
	cartPolePoleMassLen  = cartPoleMassPole * cartPoleLength
	cartPoleForceMag     = 10.0
	cartPoleTau          = 0.02 // seconds between state updates
	cartPoleThetaLimit   = 12 * 2 * math.Pi / 360
	cartPoleXLimit       = 2.4
	CartPoleMaxSteps     = 500
	CartPoleObsSize      = 4
	CartPoleActionsCount = 2
)

// NewCartPole returns an env whose resets draw from rng.
func NewCartPole(rng *rand.Rand) *CartPole { return &CartPole{rng: rng} }

// Reset starts an episode: every state variable uniform in [-0.05, 0.05).
func (c *CartPole) Reset() [4]float32 {
	u := func() float64 { return c.rng.Float64()*0.1 - 0.05 }
	c.x, c.xDot, c.theta, c.thetaDot = u(), u(), u(), u()
	c.steps = 0
	return c.Obs()
}

// SetState places the env in a given state (for tests and replays).
func (c *CartPole) SetState(x, xDot, theta, thetaDot float64) {
	c.x, c.xDot, c.theta, c.thetaDot = x, xDot, theta, thetaDot
	c.steps = 0
}

// Obs returns the observation: x, x_dot, theta, theta_dot as float32.
func (c *CartPole) Obs() [4]float32 {
	return [4]float32{float32(c.x), float32(c.xDot), float32(c.theta), float32(c.thetaDot)}
}

// Step applies action (0 = push left, anything else = push right).
func (c *CartPole) Step(action int) (obs [4]float32, reward float32, terminated, truncated bool) {
	force := -cartPoleForceMag
	if action != 0 {
		force = cartPoleForceMag
	}
	cos, sin := math.Cos(c.theta), math.Sin(c.theta)
	temp := (force + cartPolePoleMassLen*c.thetaDot*c.thetaDot*sin) / cartPoleTotalMass
	thetaAcc := (cartPoleGravity*sin - cos*temp) /
		(cartPoleLength * (4.0/3.0 - cartPoleMassPole*cos*cos/cartPoleTotalMass))
	xAcc := temp - cartPolePoleMassLen*thetaAcc*cos/cartPoleTotalMass
	c.x += cartPoleTau * c.xDot
	c.xDot += cartPoleTau * xAcc
	c.theta += cartPoleTau * c.thetaDot
	c.thetaDot += cartPoleTau * thetaAcc
	c.steps++
	terminated = c.x < -cartPoleXLimit || c.x > cartPoleXLimit ||
		c.theta < -cartPoleThetaLimit || c.theta > cartPoleThetaLimit
	truncated = !terminated && c.steps >= CartPoleMaxSteps
	return c.Obs(), 1, terminated, truncated
}

// CartPoleSpec is the spec of CartPole-v1: float32 [4] observations, two
// discrete actions.
func CartPoleSpec() Spec {
	return Spec{Name: "cartpole", ObsDType: "float32", ObsShape: []int{CartPoleObsSize},
		NumActions: CartPoleActionsCount, MaxEpisodeSteps: CartPoleMaxSteps}
}

type cartPoleCopy struct{ c CartPole }

func (c *cartPoleCopy) Reset(rng *rand.Rand, obs []byte) {
	c.c.rng = rng
	o := c.c.Reset()
	putF32s(obs, o[:])
}

func (c *cartPoleCopy) Step(a int64, _ []float32, obs []byte) (float32, bool, bool) {
	o, r, term, trunc := c.c.Step(int(a))
	putF32s(obs, o[:])
	return r, term, trunc
}

// CartPoleMaskedSpec is the spec of CartPole-v1 with the velocities hidden:
// the observation is float32 [2] (x, theta), the dynamics, rewards and time
// limit are CartPole-v1's. A policy that sees only positions cannot tell
// which way the pole is moving from one observation, so it must remember
// earlier ones: the partially observable env recurrent policies need.
func CartPoleMaskedSpec() Spec {
	return Spec{Name: "cartpole-masked", ObsDType: "float32", ObsShape: []int{2},
		NumActions: CartPoleActionsCount, MaxEpisodeSteps: CartPoleMaxSteps}
}

// MaskedObs returns the observation of cartpole-masked: x and theta as
// float32 (the velocities left out).
func (c *CartPole) MaskedObs() [2]float32 {
	return [2]float32{float32(c.x), float32(c.theta)}
}

type cartPoleMaskedCopy struct{ c CartPole }

func (c *cartPoleMaskedCopy) Reset(rng *rand.Rand, obs []byte) {
	c.c.rng = rng
	c.c.Reset()
	o := c.c.MaskedObs()
	putF32s(obs, o[:])
}

func (c *cartPoleMaskedCopy) Step(a int64, _ []float32, obs []byte) (float32, bool, bool) {
	_, r, term, trunc := c.c.Step(int(a))
	o := c.c.MaskedObs()
	putF32s(obs, o[:])
	return r, term, trunc
}
