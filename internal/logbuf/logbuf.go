package logbuf

import (
	"io"
	"sync"
	"time"
)

// Options tunes a Writer. The zero value is usable.
type Options struct {
	// Interval is the longest a line waits before it is written. Zero
	// means 200 ms.
	Interval time.Duration
	// MaxPending is how many bytes may wait; a line that would pass it
	// writes everything at once. Zero means 64 KiB.
	MaxPending int
}

// Writer is an io.Writer that batches what it is given (see the package
// doc). Each Write is kept whole: lines of concurrent writers are never
// interleaved. It is safe for concurrent use.
//
// Lines are appended under one mutex and written under another, so a slow
// output (a full pipe, a stalled terminal) holds up only the flush and,
// once MaxPending bytes wait, the writers that would add more; not every
// writer for the length of each flush.
type Writer struct {
	out  io.Writer
	opts Options

	// flushMu serialises writes to out, so that they leave in the order
	// the lines came; taken before mu.
	flushMu sync.Mutex

	mu      sync.Mutex
	pending []byte
	spare   []byte      // the buffer of the last flush, reused
	timer   *time.Timer // armed while pending is not empty
	closed  bool
	err     error // the first error out returned; later writes report it
}

// New returns a Writer that batches writes to out.
func New(out io.Writer, o *Options) *Writer {
	w := &Writer{out: out}
	if o != nil {
		w.opts = *o
	}
	if w.opts.Interval <= 0 {
		w.opts.Interval = 200 * time.Millisecond
	}
	if w.opts.MaxPending <= 0 {
		w.opts.MaxPending = 64 << 10
	}
	return w
}

// Write keeps p to be written within Interval. After Close it writes at
// once.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed || len(w.pending)+len(p) > w.opts.MaxPending {
		w.pending = append(w.pending, p...)
		w.mu.Unlock()
		return len(p), w.Flush()
	}
	if len(w.pending) == 0 {
		if w.timer == nil {
			w.timer = time.AfterFunc(w.opts.Interval, func() { _ = w.Flush() }) // an error is kept in w.err
		} else {
			w.timer.Reset(w.opts.Interval)
		}
	}
	w.pending = append(w.pending, p...)
	err := w.err
	w.mu.Unlock()
	return len(p), err
}

// Immediate returns an io.Writer whose writes go out at once, after every
// line waiting in w (so the output keeps the order of the writes).
func (w *Writer) Immediate() io.Writer { return immediate{w} }

type immediate struct{ w *Writer }

func (i immediate) Write(p []byte) (int, error) {
	w := i.w
	w.mu.Lock()
	w.pending = append(w.pending, p...)
	w.mu.Unlock()
	return len(p), w.Flush()
}

// Flush writes every line waiting now.
func (w *Writer) Flush() error {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	w.mu.Lock()
	buf := w.pending
	w.pending, w.spare = w.spare[:0], nil
	err := w.err
	w.mu.Unlock()
	if len(buf) == 0 {
		return err
	}
	_, werr := w.out.Write(buf)
	w.mu.Lock()
	defer w.mu.Unlock()
	if werr != nil && w.err == nil {
		w.err = werr
	}
	// A buffer grown by one burst is not kept for good.
	if cap(buf) <= 4*w.opts.MaxPending {
		w.spare = buf[:0]
	}
	return w.err
}

// Close writes every waiting line; later writes go out at once. It does
// not close the underlying writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	return w.Flush()
}
