package storage

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// fdReserve is the part of the open-file limit kept for connections and
// everything else that is not a buffer file.
const fdReserve = 1024

// filesNeeded is how many file descriptors a buffer of spec keeps open:
// one per mapped column, the row metadata and, for compressed buffers, a
// few segments (more come and go as the ring turns).
func filesNeeded(spec Spec) int {
	if spec.Storage == KindMemory {
		return 0
	}
	n := len(spec.Fields) + 1
	if spec.CompactObs {
		n += len(spec.ObsKeys)
	}
	if spec.Priority != nil {
		n++
	}
	if spec.Storage == KindCompressed {
		n += 8
	}
	return n
}

// checkFilesLocked refuses a persistent buffer that would take the process
// close to its open-file limit, where every other open (a connection, a
// segment) would start failing. Called with s.mu held.
func (s *Store) checkFilesLocked(name string, spec Spec) error {
	need := filesNeeded(spec)
	if need == 0 {
		return nil
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil // cannot tell; the open itself will say
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	open := len(entries)
	if uint64(open+need+fdReserve) <= lim.Cur {
		return nil
	}
	return fmt.Errorf("create buffer %q: it needs %d open files, the process has %d of its %d open (%d kept for connections): %w (raise the open-file limit, ulimit -n, or use memory storage)",
		name, need, open, lim.Cur, fdReserve, ErrTooManyBuffers)
}

// RaiseFileLimit lifts the soft open-file limit to the hard one, so that a
// server can hold as many buffers and connections as the system allows,
// and returns the new soft limit.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("setrlimit: %w", err)
		}
	}
	return lim.Cur, nil
}

// expireStreams closes, in every buffer, the streams idle for longer than
// idle (see Options.StreamIdleTimeout).
func (s *Store) expireStreams(idle time.Duration) {
	s.mu.Lock()
	bufs := make([]*Buffer, 0, len(s.buffers))
	for _, b := range s.buffers {
		bufs = append(bufs, b)
	}
	s.mu.Unlock()
	for _, b := range bufs {
		n, err := b.expireStreams(idle)
		if n > 0 || err != nil {
			s.log.Info("closed idle streams", "buffer", b.name, "streams", n, "idle", idle.String(), "err", err)
		}
	}
}
