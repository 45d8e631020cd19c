package envs

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// pixel returns the value at (y, x) of frame f of an observation.
func pixel(obs []byte, f, y, x int) byte { return obs[f*CatchFrameBytes+y*CatchSize+x] }

// checkFrame checks that frame f of obs shows exactly the ball at cell
// (row, col) and the paddle centred at column p.
func checkFrame(t *testing.T, obs []byte, f, row, col, p int) {
	t.Helper()
	want := make([]byte, CatchFrameBytes)
	for y := 0; y < CatchSize; y++ {
		for x := 0; x < CatchSize; x++ {
			cy, cx := y/4, x/4
			switch {
			case cy == row && cx == col:
				want[y*CatchSize+x] = 255
			case cy == 20 && cx >= p-1 && cx <= p+1:
				want[y*CatchSize+x] = 128
			}
		}
	}
	got := obs[f*CatchFrameBytes : (f+1)*CatchFrameBytes]
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("frame %d: pixel (%d, %d) = %d, want %d (ball (%d,%d), paddle %d)", f, i/CatchSize, i%CatchSize, got[i], want[i], row, col, p)
			}
		}
	}
}

func TestCatchFrames(t *testing.T) {
	c := NewCatch(nil, 4)
	c.Reset(rand.New(rand.NewPCG(1, 1)))
	obs := make([]byte, c.ObsBytes())
	c.Obs(obs)
	col := c.BallCol
	if c.BallRow != 0 || c.Paddle != 10 || col < 0 || col >= CatchGrid {
		t.Fatalf("reset state: ball (%d,%d) paddle %d", c.BallRow, col, c.Paddle)
	}
	// A reset fills the stack with the first frame.
	for f := 0; f < 4; f++ {
		checkFrame(t, obs, f, 0, col, 10)
	}
	// Right, right, left: the newest frame is last, the oldest first.
	paddles := []int{10, 11, 12, 11}
	for i, a := range []int{2, 2, 0} {
		r, term, trunc := c.Step(a)
		if r != 0 || term || trunc {
			t.Fatalf("step %d: %v %v %v", i, r, term, trunc)
		}
	}
	c.Obs(obs)
	for f := 0; f < 4; f++ {
		checkFrame(t, obs, f, f, col, paddles[f])
	}
	if pixel(obs, 3, 3*4, col*4) != 255 || pixel(obs, 3, 83, 11*4) != 128 {
		t.Fatal("ball or paddle pixel missing")
	}
	// A single-frame catch shows the newest frame only.
	s := NewCatch(nil, 0)
	s.SetState(5, 3, 7)
	one := make([]byte, s.ObsBytes())
	s.Obs(one)
	if len(one) != CatchFrameBytes {
		t.Fatalf("single frame: %d bytes", len(one))
	}
	checkFrame(t, one, 0, 5, 3, 7)
	// The paddle stays on screen.
	s.SetState(0, 0, 1)
	s.Step(0)
	if s.Paddle != 1 {
		t.Fatalf("paddle left the screen: %d", s.Paddle)
	}
	s.SetState(0, 0, 19)
	s.Step(2)
	if s.Paddle != 19 {
		t.Fatalf("paddle left the screen: %d", s.Paddle)
	}
}

func TestCatchRewards(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for ep := 0; ep < 200; ep++ {
		c := NewCatch(nil, 1)
		c.Reset(rng)
		follow := ep%2 == 0 // even episodes chase the ball, odd ones flee it
		var r float32
		var term bool
		steps := 0
		for !term {
			a := 1
			switch {
			case follow && c.Paddle < c.BallCol, !follow && c.Paddle >= c.BallCol:
				a = 2
			case follow && c.Paddle > c.BallCol, !follow && c.Paddle < c.BallCol:
				a = 0
			}
			var trunc bool
			r, term, trunc = c.Step(a)
			steps++
			if trunc || (!term && r != 0) {
				t.Fatalf("episode %d step %d: reward %v truncated %v", ep, steps, r, trunc)
			}
		}
		if steps != CatchMaxSteps {
			t.Fatalf("episode %d lasted %d steps, want %d", ep, steps, CatchMaxSteps)
		}
		caught := c.BallCol >= c.Paddle-1 && c.BallCol <= c.Paddle+1
		if want := map[bool]float32{true: 1, false: -1}[caught]; r != want {
			t.Fatalf("episode %d: reward %v, caught %v", ep, r, caught)
		}
		// Chasing always catches (10 cells at most to cover in 19 steps);
		// fleeing misses unless the ball falls where the paddle is pinned
		// against a wall.
		if follow && r != 1 {
			t.Fatalf("episode %d: the chasing paddle missed (ball col %d, paddle %d)", ep, c.BallCol, c.Paddle)
		}
		if !follow && r != -1 && c.Paddle != 1 && c.Paddle != 19 {
			t.Fatalf("episode %d: the fleeing paddle caught the ball", ep)
		}
	}
}
