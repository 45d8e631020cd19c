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
type Writer struct {
	out  io.Writer
	opts Options

	mu      sync.Mutex
	pending []byte
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
	defer w.mu.Unlock()
	if w.closed || len(w.pending)+len(p) > w.opts.MaxPending {
		w.pending = append(w.pending, p...)
		return len(p), w.flushLocked()
	}
	if len(w.pending) == 0 {
		if w.timer == nil {
			w.timer = time.AfterFunc(w.opts.Interval, w.flushTimer)
		} else {
			w.timer.Reset(w.opts.Interval)
		}
	}
	w.pending = append(w.pending, p...)
	return len(p), w.err
}

// Immediate returns an io.Writer whose writes go out at once, after every
// line waiting in w (so the output keeps the order of the writes).
func (w *Writer) Immediate() io.Writer { return immediate{w} }

type immediate struct{ w *Writer }

func (i immediate) Write(p []byte) (int, error) {
	w := i.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = append(w.pending, p...)
	return len(p), w.flushLocked()
}

// Flush writes every waiting line now.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushLocked()
}

// Close writes every waiting line; later writes go out at once. It does
// not close the underlying writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	return w.flushLocked()
}

func (w *Writer) flushTimer() {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.flushLocked() // kept in w.err for the next Write
}

func (w *Writer) flushLocked() error {
	if len(w.pending) == 0 {
		return w.err
	}
	_, err := w.out.Write(w.pending)
	if err != nil && w.err == nil {
		w.err = err
	}
	// A buffer grown by one burst is not kept for good.
	if cap(w.pending) > 4*w.opts.MaxPending {
		w.pending = nil
	} else {
		w.pending = w.pending[:0]
	}
	return w.err
}
