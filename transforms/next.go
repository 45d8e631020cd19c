package transforms

import "github.com/rbdb/rbd/storage"

// NextSource says where the next observation of a row is stored. At most
// one of the seqs is set; none when the next observation is not known yet.
type NextSource struct {
	// Row is the next row of the trajectory, whose observation is the
	// next observation (compact buffers, row not done).
	Row int64
	// Tail is the row itself: its final observation, kept in the tail
	// store (compact buffers, done rows whose writer sent it).
	Tail int64
	// Stored is the row itself: its stored next.<k> field (buffers that
	// are not compact).
	Stored int64
}

// Known reports whether the next observation is available.
func (s NextSource) Known() bool { return s.Row >= 0 || s.Tail >= 0 || s.Stored >= 0 }

var unknown = NextSource{Row: -1, Tail: -1, Stored: -1}

// NextOf returns where the next observation of row m comes from. In a
// compact buffer it is the observation of the next row of the same
// trajectory, or the final observation on a done row; it is unknown for the
// newest row of an open trajectory, for a done row whose final observation
// was not sent, and for a row whose trajectory was closed without done.
func NextOf(m storage.RowMeta, compact bool) NextSource {
	s := unknown
	switch {
	case m.Seq < 0:
	case !compact:
		s.Stored = m.Seq
	case m.Done:
		if m.HasTail {
			s.Tail = m.Seq
		}
	case m.NextSeq >= 0:
		s.Row = m.NextSeq
	}
	return s
}

// Window is the n-step window of a row: the rows whose rewards are summed
// and where the bootstrap observation comes from.
type Window struct {
	// Rows are the k rows of the window, the sampled row first.
	Rows []storage.RowMeta
	// Next is the next observation of the window's last row: the
	// observation k steps on.
	Next NextSource
}

// NStep returns the n-step window of row m: m and the rows that follow it
// in its trajectory, at most n, stopping after a done row and before a row
// whose own next observation is not known (so the window only holds rows
// with a known bootstrap). ok is false when m's next observation is not
// known itself.
func NStep(ix storage.Index, m storage.RowMeta, n int, compact bool) (w Window, ok bool) {
	w, _, ok = NStepAppend(ix, m, n, compact, make([]storage.RowMeta, 0, n))
	return w, ok
}

// NStepAppend is NStep with the window's rows appended to buf, which it
// returns grown: w.Rows is the appended part, so the windows of a batch can
// share one array (an allocation per window cost an R2D2 n-step batch
// 5,000 allocations). Nothing is appended when ok is false.
func NStepAppend(ix storage.Index, m storage.RowMeta, n int, compact bool, buf []storage.RowMeta) (w Window, out []storage.RowMeta, ok bool) {
	next := NextOf(m, compact)
	if !next.Known() {
		return Window{}, buf, false
	}
	start := len(buf)
	buf = append(buf, m)
	w.Next = next
	last := m
	for len(buf)-start < n && !last.Done && last.NextSeq >= 0 {
		nm, live := ix.Row(last.NextSeq)
		if !live {
			break
		}
		nn := NextOf(nm, compact)
		if !nn.Known() {
			break
		}
		buf = append(buf, nm)
		w.Next = nn
		last = nm
	}
	w.Rows = buf[start:len(buf):len(buf)]
	return w, buf, true
}

// Discount returns the n-step return sum_j gamma^j r_j and gamma^k.
func Discount(rewards []float64, gamma float64) (ret, gammaK float64) {
	g := 1.0
	for _, r := range rewards {
		ret += g * r
		g *= gamma
	}
	return ret, g
}
