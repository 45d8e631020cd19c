package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
)

// A version 2 shared-memory stream (?stream=shm&arena=2) announces each
// batch in a ring in the arena instead of a frame on the socket, so a
// learner that is ahead of its next batch takes it with no system call on
// either side, and the server draws, copies and announces in one goroutine
// with no hand-off. The socket carries only what the arena cannot: a
// wake-up for a client that waits on it (it says so in the arena's
// waiting word), an error frame, and the stream's end. The layout and the
// protocol are in docs/format.md, "Sample arenas".

// ringInlineMaxBytes is the largest batch a version 2 stream draws in
// its own goroutine (ringStream).
const ringInlineMaxBytes = 1 << 20

// frameWake is a version 2 stream's wake-up: an arena frame with no
// payload. The client looks at the ring again.
const frameWake = frameArena

// ringStream answers a version 2 shared-memory stream. The first batch is
// drawn before the answer, so a bad request or data not ready are ordinary
// error answers, as for every stream. The caller (sampleStream) counts the
// stream.
func (s *Server) ringStream(w http.ResponseWriter, r *http.Request, b *rbd.Buffer, sr *streamRequest) error {
	ctx := r.Context()
	it := s.drawStreamBatch(ctx, b, sr, 0)
	defer func() { it.free() }()
	if it.err != nil {
		if ctx.Err() != nil {
			return clientGone(ctx.Err())
		}
		return it.err
	}
	hdr, total, err := codec.SafetensorsHeader(batchTensors(it.batch), it.batch.Metadata) // to size the arena
	if err != nil {
		return err
	}
	// The ring holds at most depth+1 batches the client has not taken;
	// the client may keep arenaHold more alive.
	slots := sr.depth + 1 + arenaHold
	slotBytes := total + int64(len(hdr)) + 4096
	if err := leaseOf(w).grow(ctx, int64(slots)*slotBytes+4096, "the stream's shared-memory arena"); err != nil {
		return err
	}
	ar, err := newArena(2, slots, slotBytes)
	if err != nil {
		return err
	}
	defer ar.close()
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{}) // the stream outlives the read timeout
	w.Header().Set("X-Rbd-Arena", ar.path())
	w.Header().Set("X-Rbd-Arena-Nonce", ar.nonce)
	w.Header().Set("Content-Type", StreamContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil // the client is gone; nothing more to say
	}

	// Batches of image rows are drawn ahead by a producer, as socket
	// streams do, so the draw of one overlaps the copy of the last into
	// the arena (milliseconds each); small batches are drawn inline, where
	// a hand-off would cost more than it overlaps. (Not for streams that
	// stop at an epoch's end: no batch of the next epoch may be drawn.)
	var ahead chan streamBatch
	if total > ringInlineMaxBytes && sr.batches != 1 && !sr.untilEpochEnd {
		pctx, cancel := context.WithCancel(ctx)
		ahead = make(chan streamBatch, sr.depth-1)
		go s.produceStream(pctx, b, sr, ahead, 1)
		defer func() {
			cancel()
			for it := range ahead { // closed once the producer has stopped
				it.free()
			}
		}()
	}

	var sent int64
	reason := "complete"
	defer func() {
		s.log.Info("sample stream ended", "buffer", b.Name(), "batches", sent, "reason", reason, "transport", "shm2")
	}()
	var werr error // a failed wake-up write: the client is gone
	wake := func() {
		if werr == nil && ar.wantsWake(sent) {
			_ = rc.SetWriteDeadline(time.Now().Add(s.opts.StreamStallTimeout))
			var f [8]byte
			binary.LittleEndian.PutUint64(f[:], frameWake)
			if _, werr = w.Write(f[:]); werr == nil {
				werr = rc.Flush()
			}
		}
	}
	stopping := func() bool {
		select {
		case <-s.stopping:
			return true
		default:
			return false
		}
	}
	// wait polls cond, waking the client whenever it waits for a batch
	// already announced (it may have raced the announcement).
	wait := func(cond func() bool) error {
		err := poll(ctx, s.opts.StreamStallTimeout, func() bool {
			wake()
			return werr != nil || stopping() || cond()
		})
		if err == nil && werr != nil {
			err = werr
		}
		return err
	}
	fail := func(err error) error {
		reason = err.Error()
		if ctx.Err() == nil && werr == nil {
			s.writeErrorFrame(w, rc, err)
		}
		return nil
	}
	// The tensor list and the header are rebuilt for every batch into the
	// same memory: a stream sends tens of thousands of batches a second.
	var sc frameScratch
	for {
		if stopping() {
			reason = "server shutting down"
			s.writeErrorFrame(w, rc, &apiError{status: http.StatusServiceUnavailable, code: "shutting_down", msg: "server is shutting down"})
			return nil
		}
		if total, err = s.encodeFrame(&sc, b, it.batch); err != nil {
			return fail(err)
		}
		if total > ar.slotBytes {
			// Tensors keep their sizes within a stream; only the header
			// can grow, and the slot leaves 4 KiB for that.
			return fail(fmt.Errorf("a batch of %d bytes does not fit the stream's %d-byte arena slots", total, ar.slotBytes))
		}
		slot := -1
		if err := wait(func() bool {
			var ok bool
			slot, ok = ar.takeFree()
			return ok
		}); err != nil || slot < 0 {
			if err == nil && stopping() {
				continue // said at the top of the loop
			}
			if err == nil {
				err = errArenaStalled // woken by shutdown or a failed write
			}
			reason = "client gone or stalled: " + err.Error()
			return nil
		}
		ar.fill(slot, sc.hdr, sc.tensors)
		ar.publish(sent, slot, total)
		epochEnd := it.batch.Metadata["epoch_end"] == "true"
		it.free()
		it = streamBatch{}
		sent++
		wake()
		if werr != nil {
			reason = "client gone: " + werr.Error()
			return nil
		}
		if (sr.batches > 0 && sent == sr.batches) || (sr.untilEpochEnd && epochEnd) {
			break
		}
		// Draw the next batch once the client is at most depth batches
		// behind: then at most depth+1 wait in the ring.
		if err := wait(func() bool { return sent-ar.consumed() <= int64(sr.depth) }); err != nil {
			reason = "client gone or stalled: " + err.Error()
			return nil
		}
		if ahead == nil {
			it = s.drawStreamBatch(ctx, b, sr, sent)
		} else {
			var ok bool
			select {
			case it, ok = <-ahead:
			case <-ctx.Done():
				it, ok = streamBatch{err: ctx.Err()}, true
			case <-s.stopping:
				it = streamBatch{}
				continue // said at the top of the loop
			}
			if !ok { // only after an error it sent, or ctx ended: not expected here
				it = streamBatch{err: fmt.Errorf("the stream's producer stopped after %d batches", sent)}
				if ctx.Err() != nil {
					it.err = ctx.Err()
				}
			}
		}
		if it.err != nil {
			if ctx.Err() != nil {
				reason = "client gone"
				return nil
			}
			return fail(it.err)
		}
	}
	// The client maps the arena by the server's fd: keep it until the
	// client has taken and dropped every batch, or hung up.
	_ = wait(func() bool { return ar.consumed() >= sent && ar.idle() })
	return nil
}
