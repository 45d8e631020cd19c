package storage

import (
	"bytes"
	"fmt"
)

// frameGeom locates the K frames of a stacked row. A row of shape
// [..., K, ...] (K at the stack axis) is, in C order, outer blocks of K
// frame slices of inner bytes each: frame j is the j-th slice of every
// block. For axis 0 a frame is one contiguous run.
type frameGeom struct {
	outer, k, inner int
}

func newFrameGeom(f Field) *frameGeom {
	fs := f.FrameStack
	if fs == nil {
		return nil
	}
	g := &frameGeom{outer: 1, k: fs.K, inner: f.DType.Size()}
	for i, d := range f.Shape {
		switch {
		case i < fs.Axis:
			g.outer *= d
		case i > fs.Axis:
			g.inner *= d
		}
	}
	return g
}

func (g *frameGeom) frameBytes() int { return g.outer * g.inner }
func (g *frameGeom) rowBytes() int   { return g.outer * g.k * g.inner }

// frame copies frame j of stack into dst (frameBytes long).
func (g *frameGeom) frame(dst, stack []byte, j int) {
	for o := 0; o < g.outer; o++ {
		src := (o*g.k + j) * g.inner
		copy(dst[o*g.inner:(o+1)*g.inner], stack[src:src+g.inner])
	}
}

// put copies a frame (frameBytes long) into frame j of stack.
func (g *frameGeom) put(stack, frame []byte, j int) {
	for o := 0; o < g.outer; o++ {
		d := (o*g.k + j) * g.inner
		copy(stack[d:d+g.inner], frame[o*g.inner:(o+1)*g.inner])
	}
}

// putFrameOf copies frame src of stack from into frame dst of stack to.
func (g *frameGeom) putFrameOf(to []byte, dst int, from []byte, src int) {
	for o := 0; o < g.outer; o++ {
		d, s := (o*g.k+dst)*g.inner, (o*g.k+src)*g.inner
		copy(to[d:d+g.inner], from[s:s+g.inner])
	}
}

// clearFrame zeroes frame j of stack.
func (g *frameGeom) clearFrame(stack []byte, j int) {
	for o := 0; o < g.outer; o++ {
		d := (o*g.k + j) * g.inner
		clear(stack[d : d+g.inner])
	}
}

// shifted reports whether frames 0..K-2 of cur are frames 1..K-1 of prev:
// cur is prev with one new frame pushed in.
func (g *frameGeom) shifted(prev, cur []byte) bool {
	span := (g.k - 1) * g.inner
	for o := 0; o < g.outer; o++ {
		base := o * g.k * g.inner
		if !bytes.Equal(cur[base:base+span], prev[base+g.inner:base+g.inner+span]) {
			return false
		}
	}
	return true
}

// zeroPadded reports whether frames 0..K-2 of cur are all zero.
func (g *frameGeom) zeroPadded(cur []byte) bool {
	span := (g.k - 1) * g.inner
	for o := 0; o < g.outer; o++ {
		base := o * g.k * g.inner
		for _, v := range cur[base : base+span] {
			if v != 0 {
				return false
			}
		}
	}
	return true
}

// repeated reports whether every frame of cur equals its newest frame.
func (g *frameGeom) repeated(cur []byte) bool {
	for o := 0; o < g.outer; o++ {
		base := o * g.k * g.inner
		last := cur[base+(g.k-1)*g.inner : base+g.k*g.inner]
		for j := 0; j < g.k-1; j++ {
			if !bytes.Equal(cur[base+j*g.inner:base+(j+1)*g.inner], last) {
				return false
			}
		}
	}
	return true
}

// encodeUnit chooses how to store the stack cur, given the previous row's
// stack (nil if unknown), and appends the unit to dst. Any mode but
// modeFull keeps only the newest frame; each is chosen only when it
// rebuilds cur exactly.
func (g *frameGeom) encodeUnit(dst, prev, cur []byte) ([]byte, byte) {
	var mode byte
	switch {
	case prev != nil && g.shifted(prev, cur):
		mode = modeNewest
	case g.zeroPadded(cur):
		mode = modeZeroPad
	case g.repeated(cur):
		mode = modeRepeat
	default:
		return append(dst, cur...), modeFull
	}
	n := len(dst)
	dst = append(dst, make([]byte, g.frameBytes())...)
	g.frame(dst[n:], cur, g.k-1)
	return dst, mode
}

// unitSize is the stored size of a unit in the given mode.
func unitSize(g *frameGeom, rowBytes int, mode byte) int {
	if g == nil || mode == modeFull {
		return rowBytes
	}
	return g.frameBytes()
}

// unitSeq gives access to the stored units of one field along a trajectory:
// unit(i) for units of the current chunk and, for i < 0, units of earlier
// chunks (-1 is the previous chunk's last row).
type unitSeq interface {
	unit(i int) (mode byte, data []byte, err error)
}

// rebuild writes into dst (a whole row) the stack of unit i, following
// modeNewest units back until one that holds the older frames itself. At
// most K-1 steps back are ever needed.
func (g *frameGeom) rebuild(dst []byte, us unitSeq, i int) error {
	j := g.k - 1
	for cur := i; ; cur-- {
		mode, data, err := us.unit(cur)
		if err != nil {
			return err
		}
		if mode == modeNewest {
			if len(data) != g.frameBytes() {
				return fmt.Errorf("unit %d has %d bytes, want a %d-byte frame", cur, len(data), g.frameBytes())
			}
			g.put(dst, data, j)
			if j == 0 {
				return nil
			}
			j--
			continue
		}
		// A base unit: its frames shift+m fill our frames m = 0..j.
		shift := g.k - 1 - j
		switch mode {
		case modeFull:
			if len(data) != g.rowBytes() {
				return fmt.Errorf("unit %d has %d bytes, want a %d-byte stack", cur, len(data), g.rowBytes())
			}
			if shift == 0 {
				copy(dst, data)
				return nil
			}
			for m := 0; m <= j; m++ {
				g.putFrameOf(dst, m, data, m+shift)
			}
		case modeZeroPad, modeRepeat:
			if len(data) != g.frameBytes() {
				return fmt.Errorf("unit %d has %d bytes, want a %d-byte frame", cur, len(data), g.frameBytes())
			}
			for m := 0; m <= j; m++ {
				if mode == modeZeroPad && m+shift < g.k-1 {
					g.clearFrame(dst, m)
				} else {
					g.put(dst, data, m)
				}
			}
		default:
			return fmt.Errorf("unit %d has unknown frame mode %d", cur, mode)
		}
		return nil
	}
}
