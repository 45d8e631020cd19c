package storage

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestStreamLimit: past MaxStreams, an extend that would open a new
// stream's trajectory fails and writes nothing; streams that end their
// trajectories in the request, and streams already open, go on.
func TestStreamLimit(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s, err := Open(t.TempDir(), &Options{MaxStreams: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		spec := testSpec(kind, 100, false)
		b := mustCreate(t, s, "b", spec)
		for i := range 3 {
			mustExtend(t, b, fmt.Sprintf("s%d", i), makeBatch(spec, []row{{val: 1}}, false))
		}
		wc := b.WriteCount()
		_, err = b.Extend("s3", makeBatch(spec, []row{{val: 1}}, false))
		if !errors.Is(err, ErrTooManyStreams) {
			t.Fatalf("4th open stream: %v, want ErrTooManyStreams", err)
		}
		if b.WriteCount() != wc {
			t.Fatalf("a refused extend wrote: write count %d -> %d", wc, b.WriteCount())
		}
		// A stream whose rows all end their trajectories holds nothing.
		mustExtend(t, b, "s3", makeBatch(spec, []row{{val: 1}, {val: 2, terminated: true}}, false))
		// Open streams continue; closing one makes room.
		mustExtend(t, b, "s0", makeBatch(spec, []row{{val: 2}}, false))
		if _, err := b.CloseStream("s1"); err != nil {
			t.Fatal(err)
		}
		mustExtend(t, b, "s4", makeBatch(spec, []row{{val: 1}}, false))
		if info, _ := b.Info(); info.Streams != 3 || info.OpenTrajectories != 3 {
			t.Fatalf("streams %d open %d, want 3 and 3", info.Streams, info.OpenTrajectories)
		}
	})
}

// TestIdleStreamsExpire: a stream that stops extending is closed after
// StreamIdleTimeout (its trajectory ends, its memory is freed) and starts
// a new trajectory when it comes back; a busy stream is not touched.
func TestIdleStreamsExpire(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		s, err := Open(t.TempDir(), &Options{StreamIdleTimeout: 300 * time.Millisecond, CheckpointInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		spec := testSpec(kind, 1000, false)
		b := mustCreate(t, s, "b", spec)
		first := mustExtend(t, b, "idle", makeBatch(spec, []row{{val: 1}, {val: 2}}, false))
		busySteps := 0
		for deadline := time.Now().Add(30 * time.Second); ; {
			mustExtend(t, b, "busy", makeBatch(spec, []row{{val: 5}}, false))
			busySteps++
			info, _ := b.Info()
			if info.Streams == 1 {
				if info.OpenTrajectories != 1 {
					t.Fatalf("after expiry: %d open trajectories, want 1 (busy)", info.OpenTrajectories)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("idle stream not closed after 30s: %+v", info)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// busy kept its one trajectory all along.
		res := mustExtend(t, b, "busy", makeBatch(spec, []row{{val: 5}}, false))
		if m := metas(t, b, res.FirstSeq)[0]; m.Step != int64(busySteps) {
			t.Fatalf("busy stream's step %d, want %d (its trajectory continues)", m.Step, busySteps)
		}
		res = mustExtend(t, b, "idle", makeBatch(spec, []row{{val: 3}}, false))
		m := metas(t, b, first.FirstSeq, res.FirstSeq)
		if m[1].Step != 0 || m[1].TrajID == m[0].TrajID {
			t.Fatalf("a returning idle stream continued trajectory %d at step %d; want a new trajectory", m[1].TrajID, m[1].Step)
		}
	})
}

// TestMaxBuffers: past MaxBuffers a create fails and leaves nothing.
func TestMaxBuffers(t *testing.T) {
	s, err := Open(t.TempDir(), &Options{MaxBuffers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	spec := testSpec(KindMemmap, 10, false)
	mustCreate(t, s, "a", spec)
	mustCreate(t, s, "b", spec)
	if _, _, err := s.CreateBuffer("c", spec); !errors.Is(err, ErrTooManyBuffers) {
		t.Fatalf("3rd buffer: %v, want ErrTooManyBuffers", err)
	}
	// The existing ones are still found (an identical create is no new buffer).
	if _, created, err := s.CreateBuffer("a", spec); err != nil || created {
		t.Fatalf("re-create a: created %v %v", created, err)
	}
	if len(s.Buffers()) != 2 {
		t.Fatalf("%d buffers", len(s.Buffers()))
	}
}
