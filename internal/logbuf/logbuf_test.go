package logbuf

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// sink is the file or pipe: it records each write it gets.
type sink struct {
	mu     sync.Mutex
	writes []string
	err    error
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	s.writes = append(s.writes, string(p))
	return len(p), nil
}

func (s *sink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes)
}

func TestWriterBatches(t *testing.T) {
	hour := &Options{Interval: time.Hour} // only the step under test writes
	for _, tc := range []struct {
		name string
		opts *Options
		do   func(w *Writer) error
		want []string // the writes the sink got, in order
	}{
		{"lines wait", hour, func(w *Writer) error {
			_, err := w.Write([]byte("a\n"))
			return err
		}, nil},
		{"flush writes them together", hour, func(w *Writer) error {
			w.Write([]byte("a\n"))
			w.Write([]byte("b\n"))
			return w.Flush()
		}, []string{"a\nb\n"}},
		{"immediate writes what waits first", hour, func(w *Writer) error {
			w.Write([]byte("a\n"))
			_, err := w.Immediate().Write([]byte("warn\n"))
			return err
		}, []string{"a\nwarn\n"}},
		{"more than MaxPending goes at once", &Options{Interval: time.Hour, MaxPending: 10}, func(w *Writer) error {
			w.Write([]byte("1234567\n"))
			_, err := w.Write([]byte("89\n"))
			return err
		}, []string{"1234567\n89\n"}},
		{"close flushes, later writes go at once", hour, func(w *Writer) error {
			w.Write([]byte("a\n"))
			if err := w.Close(); err != nil {
				return err
			}
			_, err := w.Write([]byte("b\n"))
			return err
		}, []string{"a\n", "b\n"}},
		{"flush with nothing waiting writes nothing", hour, func(w *Writer) error {
			return w.Flush()
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &sink{}
			w := New(s, tc.opts)
			if err := tc.do(w); err != nil {
				t.Fatal(err)
			}
			if got := s.got(); !slices.Equal(got, tc.want) {
				t.Fatalf("sink got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWriterWritesWithinInterval(t *testing.T) {
	s := &sink{}
	w := New(s, &Options{Interval: 5 * time.Millisecond})
	w.Write([]byte("a\n"))
	// Not a timing assertion: the line must arrive without a Flush; the
	// deadline only ends a test that would otherwise hang.
	for deadline := time.Now().Add(10 * time.Second); len(s.got()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a waiting line was not written without a Flush")
		}
	}
	if got := s.got(); !slices.Equal(got, []string{"a\n"}) {
		t.Fatalf("sink got %q", got)
	}
	// The timer re-arms for the next line.
	w.Write([]byte("b\n"))
	for deadline := time.Now().Add(10 * time.Second); len(s.got()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second line was not written without a Flush")
		}
	}
}

func TestWriterKeepsConcurrentLinesWhole(t *testing.T) {
	s := &sink{}
	w := New(s, &Options{Interval: time.Millisecond, MaxPending: 512})
	const writers, lines = 8, 500
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			out := w.Immediate()
			for i := range lines {
				line := []byte(fmt.Sprintf("writer %d line %d\n", g, i))
				if i%50 == 0 {
					out.Write(line)
				} else {
					w.Write(line)
				}
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(s.got(), "")
	next := make([]int, writers) // each writer's lines arrive in its order
	for _, line := range strings.Split(strings.TrimSuffix(all, "\n"), "\n") {
		var g, i int
		if _, err := fmt.Sscanf(line, "writer %d line %d", &g, &i); err != nil || g < 0 || g >= writers {
			t.Fatalf("torn line %q", line)
		}
		if i != next[g] {
			t.Fatalf("writer %d: line %d after %d", g, i, next[g]-1)
		}
		next[g]++
	}
	for g, n := range next {
		if n != lines {
			t.Fatalf("writer %d: %d lines arrived, want %d", g, n, lines)
		}
	}
}

func TestWriterReportsWriteErrors(t *testing.T) {
	broken := errors.New("pipe closed")
	s := &sink{err: broken}
	w := New(s, &Options{Interval: time.Hour})
	w.Write([]byte("a\n"))
	if err := w.Flush(); !errors.Is(err, broken) {
		t.Fatalf("Flush = %v, want %v", err, broken)
	}
	if _, err := w.Write([]byte("b\n")); !errors.Is(err, broken) {
		t.Fatalf("a later Write = %v, want the earlier %v", err, broken)
	}
	var buf bytes.Buffer
	if _, err := New(&buf, nil).Immediate().Write([]byte("x")); err != nil || buf.String() != "x" {
		t.Fatalf("Immediate on a working writer: %v, %q", err, buf.String())
	}
}

// blockingSink holds every write until release is closed.
type blockingSink struct {
	sink
	entered chan struct{} // gets a value when a write starts
	release chan struct{}
}

func (b *blockingSink) Write(p []byte) (int, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.sink.Write(p)
}

func TestWriterDoesNotHoldWritersDuringAFlush(t *testing.T) {
	s := &blockingSink{entered: make(chan struct{}, 1), release: make(chan struct{})}
	w := New(s, &Options{Interval: time.Hour})
	w.Write([]byte("a\n"))
	flushed := make(chan error)
	go func() { flushed <- w.Flush() }()
	<-s.entered // the flush is inside the output's write, which blocks
	wrote := make(chan struct{})
	go func() {
		w.Write([]byte("b\n"))
		close(wrote)
	}()
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("a Write waited for a flush that was blocked in the output")
	}
	close(s.release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	<-s.entered
	if got := s.got(); !slices.Equal(got, []string{"a\n", "b\n"}) {
		t.Fatalf("sink got %q", got)
	}
}
