package envs

import (
	"math/rand/v2"
)

// Catch is a pixel game for image-sized workloads: a ball falls straight
// down an 84x84 screen one cell (4x4 pixels) per step from a random column
// of the top row; a paddle three cells wide on the bottom row moves one
// cell left (action 0), stays (1) or moves right (2). When the ball reaches
// the bottom row the episode terminates with reward +1 if the paddle is
// under the ball and -1 if not; every other step gives 0. Episodes last
// exactly 20 steps.
//
// Frames are uint8 [84, 84]: 0 background, 255 ball, 128 paddle (the ball
// drawn over the paddle). With a frame stack of K > 1 an observation is
// [K, 84, 84], oldest frame first and newest last (the frame_stack layout,
// axis 0); a reset fills the stack with the first frame.
type Catch struct {
	// BallRow and BallCol are the ball's cell (row 0 at the top); Paddle
	// is the column of the paddle's centre cell.
	BallRow, BallCol, Paddle int

	k      int
	frames []byte // k frames, a ring; newest at head
	head   int
}

// Catch constants.
const (
	CatchSize        = 84 // frame side in pixels
	CatchCell        = 4  // cell side in pixels
	CatchGrid        = CatchSize / CatchCell
	CatchFrameBytes  = CatchSize * CatchSize
	CatchActions     = 3
	CatchMaxSteps    = CatchGrid - 1
	CatchBallValue   = 255
	CatchPaddleValue = 128
	catchPaddleHalf  = 1 // the paddle covers Paddle-1 .. Paddle+1
)

// CatchSpec is the spec of catch with a frame stack of k (0 or 1: single
// frames).
func CatchSpec(k int) Spec {
	shape := []int{CatchSize, CatchSize}
	if k > 1 {
		shape = []int{k, CatchSize, CatchSize}
	}
	s := Spec{Name: "catch", ObsDType: "uint8", ObsShape: shape, NumActions: CatchActions,
		MaxEpisodeSteps: CatchMaxSteps, Pixels: true}
	if k > 1 {
		s.FrameStack = k
	}
	return s
}

// NewCatch returns a catch game stacking k frames (0 or 1: single frames).
// rng is unused; resets take their random source as an argument.
func NewCatch(_ *rand.Rand, k int) *Catch {
	k = max(k, 1)
	return &Catch{k: k, frames: make([]byte, k*CatchFrameBytes)}
}

// ObsBytes is the size of one observation.
func (c *Catch) ObsBytes() int { return c.k * CatchFrameBytes }

// Reset starts an episode: the ball in the top row at a column drawn from
// rng, the paddle centred.
func (c *Catch) Reset(rng *rand.Rand) {
	c.BallRow, c.BallCol, c.Paddle = 0, rng.IntN(CatchGrid), CatchGrid/2
	c.head = 0
	c.render(c.frames[:CatchFrameBytes])
	for i := 1; i < c.k; i++ {
		copy(c.frames[i*CatchFrameBytes:(i+1)*CatchFrameBytes], c.frames[:CatchFrameBytes])
	}
}

// SetState places ball and paddle (for tests) and redraws the whole stack
// with that frame.
func (c *Catch) SetState(ballRow, ballCol, paddle int) {
	c.BallRow, c.BallCol, c.Paddle = ballRow, ballCol, paddle
	c.head = 0
	c.render(c.frames[:CatchFrameBytes])
	for i := 1; i < c.k; i++ {
		copy(c.frames[i*CatchFrameBytes:(i+1)*CatchFrameBytes], c.frames[:CatchFrameBytes])
	}
}

// Step moves the paddle by action (0 left, 1 stay, 2 right; the paddle
// stays on screen) and the ball one cell down.
func (c *Catch) Step(action int) (reward float32, terminated, truncated bool) {
	d := min(max(action, 0), 2) - 1
	c.Paddle = min(max(c.Paddle+d, catchPaddleHalf), CatchGrid-1-catchPaddleHalf)
	if c.BallRow < CatchGrid-1 {
		c.BallRow++
	}
	if c.BallRow == CatchGrid-1 {
		terminated = true
		reward = -1
		if c.BallCol >= c.Paddle-catchPaddleHalf && c.BallCol <= c.Paddle+catchPaddleHalf {
			reward = 1
		}
	}
	c.head = (c.head + 1) % c.k
	c.render(c.frames[c.head*CatchFrameBytes : (c.head+1)*CatchFrameBytes])
	return reward, terminated, false
}

// Obs writes the observation (the stack, oldest frame first) to dst.
func (c *Catch) Obs(dst []byte) {
	for j := 0; j < c.k; j++ {
		s := (c.head + 1 + j) % c.k
		copy(dst[j*CatchFrameBytes:(j+1)*CatchFrameBytes], c.frames[s*CatchFrameBytes:(s+1)*CatchFrameBytes])
	}
}

func (c *Catch) render(f []byte) {
	clear(f)
	fill := func(row, col, cells int, v byte) {
		for y := row * CatchCell; y < (row+1)*CatchCell; y++ {
			line := f[y*CatchSize+col*CatchCell : y*CatchSize+(col+cells)*CatchCell]
			for x := range line {
				line[x] = v
			}
		}
	}
	fill(CatchGrid-1, c.Paddle-catchPaddleHalf, 2*catchPaddleHalf+1, CatchPaddleValue)
	fill(c.BallRow, c.BallCol, 1, CatchBallValue)
}

type catchCopy struct{ c *Catch }

func (c *catchCopy) Reset(rng *rand.Rand, obs []byte) {
	c.c.Reset(rng)
	c.c.Obs(obs)
}

func (c *catchCopy) Step(a int64, _ []float32, obs []byte) (float32, bool, bool) {
	r, term, trunc := c.c.Step(int(a))
	c.c.Obs(obs)
	return r, term, trunc
}
