package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"

	mmap "github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// A seq witness is a page in a tmpfs outside the data dir (/dev/shm,
// defaultWitnessDir) where a memmap buffer's writer stores, before any byte of an
// extend reaches the buffer's files, the end of the seqs it hands out. A
// tmpfs outlives the process and not the kernel: after a crash of the
// process the witness names every seq the writer may have handed out,
// whatever its files hold, so recovery resumes there instead of at the
// seq reservation (which costs up to a block of the oldest rows). Files
// restored from a snapshot of a running dir, or pages an I/O error made
// the kernel drop, leave the witness ahead of the files: the seqs the
// writer handed out are still skipped, never given out again. After a
// reboot there is no witness, and recovery resumes at the reservation.
// docs/format.md, "Seq witness".

const (
	witnessMagic = "rbdwit01"
	witnessSize  = 4096
	// witnessEndOff is the u64 the writer raises: 8-byte aligned, so its
	// stores are never torn.
	witnessEndOff  = 16
	witnessBootOff = 24 // 40 bytes: the boot id, zero-padded
	witnessDirOff  = 64 // u16 length, then the buffer dir's absolute path
)

// bootIDFile names the kernel's boot: a fresh random UUID at every boot
// (Linux). Other systems have none, and rbd then assumes every crash may
// have been a power loss (no seq witness: witness.go).
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// currentBoot returns the running kernel's boot id, or "" when there is
// none to read.
func currentBoot() string {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// defaultWitnessDir is where witnesses live: the tmpfs Linux keeps for
// shared memory.
const defaultWitnessDir = "/dev/shm"

// seqWitness is a writer's mapping of its buffer's witness.
type seqWitness struct {
	path string
	m    mmap.MMap
}

// witnessFile names the witness of the buffer whose dir is bufDir and
// whose uid is uid: a copy of the data dir elsewhere has a witness of its
// own, a dir restored in place finds the one its writer left. The host
// name counts too: containers that share a /dev/shm (--ipc=host) and
// mount their data dirs at the same path keep apart.
func witnessFile(witnessDir, bufDir string, uid uint64) string {
	h := fnv.New64a()
	host, _ := os.Hostname()
	h.Write([]byte(host))
	h.Write([]byte{0})
	h.Write([]byte(bufDir))
	return filepath.Join(witnessDir, fmt.Sprintf("rbd-seq-%016x-%016x", uid, h.Sum64()))
}

// witnessHeader is the witness's first bytes but its end: magic, uid,
// boot id and dir. Errors: the dir's path does not fit.
func witnessHeader(uid uint64, boot, bufDir string) ([]byte, error) {
	if len(bufDir) > witnessSize-witnessDirOff-2 || len(boot) > witnessDirOff-witnessBootOff {
		return nil, fmt.Errorf("seq witness: buffer dir path of %d bytes is too long", len(bufDir))
	}
	h := make([]byte, witnessDirOff+2+len(bufDir))
	copy(h, witnessMagic)
	binary.LittleEndian.PutUint64(h[8:], uid)
	copy(h[witnessBootOff:], boot)
	binary.LittleEndian.PutUint16(h[witnessDirOff:], uint16(len(bufDir)))
	copy(h[witnessDirOff+2:], bufDir)
	return h, nil
}

// onTmpfs reports whether dir is a tmpfs: a witness on a disk would
// outlive a reboot and name seqs a power loss took the reservation of.
func onTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}

// readWitness returns the end a witness names for the buffer, and false
// when there is none to trust: no file, not a tmpfs, no boot id, or a
// file of another buffer, dir or boot.
func readWitness(witnessDir, bufDir string, uid uint64, boot string) (int64, bool) {
	if boot == "" || !onTmpfs(witnessDir) {
		return 0, false
	}
	b, err := os.ReadFile(witnessFile(witnessDir, bufDir, uid))
	if err != nil {
		return 0, false
	}
	w, ok := parseWitness(b)
	if !ok || w.uid != uid || w.dir != bufDir || w.boot != boot {
		return 0, false
	}
	return w.end, true
}

// parsedWitness is what a witness file says.
type parsedWitness struct {
	witnessOwner
	boot string
	end  int64
}

// parseWitness decodes a witness file's bytes (outside bytes: any file
// in the tmpfs may be there), false unless they are one.
func parseWitness(b []byte) (parsedWitness, bool) {
	if len(b) != witnessSize || string(b[:len(witnessMagic)]) != witnessMagic {
		return parsedWitness{}, false
	}
	n := int(binary.LittleEndian.Uint16(b[witnessDirOff:]))
	end := int64(binary.LittleEndian.Uint64(b[witnessEndOff:]))
	if witnessDirOff+2+n > len(b) || end < 0 {
		return parsedWitness{}, false
	}
	return parsedWitness{
		witnessOwner: witnessOwner{dir: string(b[witnessDirOff+2 : witnessDirOff+2+n]), uid: binary.LittleEndian.Uint64(b[8:])},
		boot:         string(bytes.TrimRight(b[witnessBootOff:witnessDirOff], "\x00")),
		end:          end,
	}, true
}

// startWitness gives the buffer's writer its witness, naming end. A
// witness that cannot be made (a full /dev/shm, say) is logged and left
// out, not an error: the buffer then recovers from a crash as after a
// power loss, as where there can be none (no tmpfs, no boot id).
func (b *Buffer) startWitness(end int64) {
	w, err := openWitness(defaultWitnessDir, b.witnessKey(), b.uid, b.store.boot, end)
	if err != nil {
		b.log.Warn("no seq witness: a crash will cost the oldest rows a power loss costs", "buffer", b.name, "err", err)
	}
	b.wit = w
}

// openWitness makes the buffer's witness, naming end, and maps it for
// the writer. Nil, without an error, where there can be none (no tmpfs,
// no boot id). On an error it removes the file: a witness left from
// before would name an end the writer is about to pass.
func openWitness(witnessDir, bufDir string, uid uint64, boot string, end int64) (_ *seqWitness, retErr error) {
	if boot == "" || !onTmpfs(witnessDir) {
		return nil, nil
	}
	h, err := witnessHeader(uid, boot, bufDir)
	if err != nil {
		return nil, err
	}
	path := witnessFile(witnessDir, bufDir, uid)
	defer func() {
		if retErr != nil {
			os.Remove(path)
		}
	}()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("seq witness: %w", err)
	}
	defer f.Close()
	// Allocated, not only sized: a store into a page a full tmpfs cannot
	// give is a SIGBUS, which no Go code recovers from.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, witnessSize); err != nil {
		return nil, fmt.Errorf("seq witness %s: %w", path, err)
	}
	if err := f.Truncate(witnessSize); err != nil {
		return nil, fmt.Errorf("seq witness %s: %w", path, err)
	}
	m, err := mmap.MapRegion(f, witnessSize, mmap.RDWR, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("seq witness %s: %w", path, err)
	}
	w := &seqWitness{path: path, m: m}
	// End first (stored, not raised: a file that was no witness of this
	// buffer may hold anything there), then the header that makes it
	// valid: a kill between them leaves a witness no open trusts.
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&m[witnessEndOff])), uint64(end))
	copy(m[witnessEndOff+8:], h[witnessEndOff+8:])
	copy(m, h[:witnessEndOff])
	return w, nil
}

// raise makes end the end of the seqs handed out, unless the witness
// names a larger one (an extend that failed after its raise). One writer
// at a time (wmu).
func (w *seqWitness) raise(end int64) {
	p := (*uint64)(unsafe.Pointer(&w.m[witnessEndOff]))
	if uint64(end) > atomic.LoadUint64(p) {
		atomic.StoreUint64(p, uint64(end))
	}
}

// witnessSaysUnclean returns st as recovery must take it once it found
// the files to reach wc: not clean if the buffer's witness names seqs past
// wc, which the writer handed out and the files no longer hold (a copy of
// the dir, or a hot checkpoint, restored in place after it went on
// writing; both come with a catalog that may say clean). Recovery then
// resumes past the witness, and the saved streams are not continued.
func (b *Buffer) witnessSaysUnclean(st bufferState, wc int64) bufferState {
	if st.Clean && b.witnessed && b.witnessEnd > wc {
		b.log.Warn("the buffer's files hold fewer rows than its writer handed out (restored from a copy?): resuming past every seq it handed out",
			"files_end", wc, "witness_end", b.witnessEnd)
		st.Clean = false
	}
	return st
}

// pastWitness is the write count recovery ends at, found wc: past every
// seq the buffer's witness names, for every durability (a restored copy
// of an fsync buffer lost acknowledged rows too).
func (b *Buffer) pastWitness(wc int64) int64 {
	if b.witnessed {
		return max(wc, b.witnessEnd)
	}
	return wc
}

// witnessKey is the path the buffer's witness is named after: its dir's.
func (b *Buffer) witnessKey() string {
	if abs, err := filepath.Abs(b.dir); err == nil {
		return abs
	}
	return b.dir
}

// dropWitness unmaps and removes the buffer's witness: after a delete,
// or a create that failed. (A clean close keeps it: a copy of the dir
// restored in place later must still find how far the writer went.) A
// buffer without one (memory, read-only): nothing.
func (b *Buffer) dropWitness() error {
	w := b.wit
	b.wit = nil
	return w.close(true)
}

// witnessOwner is the buffer a witness file names.
type witnessOwner struct {
	dir string
	uid uint64
}

// witnessFiles reads the witness files in witnessDir: file -> the buffer
// it names (files that are not witnesses are left out). One page buffer
// for them all: an open reads every witness of the machine.
func witnessFiles(witnessDir string) map[string]witnessOwner {
	out := map[string]witnessOwner{}
	files, _ := filepath.Glob(filepath.Join(witnessDir, "rbd-seq-*"))
	page := make([]byte, witnessSize)
	for _, f := range files {
		fd, err := os.Open(f)
		if err != nil {
			continue
		}
		n, _ := fd.ReadAt(page, 0)
		fd.Close()
		if w, ok := parseWitness(page[:n]); ok {
			out[f] = w.witnessOwner
		}
	}
	return out
}

// dropOrphanWitnesses removes this host's witnesses that no buffer will
// read: those of this data dir's buffers that are no longer its buffers
// (a writer killed while it deleted one), and those whose buffer dir is
// gone (a data dir removed, as tests and temporary dirs are), so that
// they do not pile up in the tmpfs until a reboot (a clean close keeps
// its witness). A dir that is only unmounted loses its witness too: its
// next crash then costs what a power loss costs.
func (s *Store) dropOrphanWitnesses() {
	wdir := defaultWitnessDir
	abs, err := filepath.Abs(filepath.Join(s.dir, "buffers"))
	if err != nil || !onTmpfs(wdir) {
		return
	}
	for f, w := range witnessFiles(wdir) {
		if witnessFile(wdir, w.dir, w.uid) != f {
			continue // another host's
		}
		orphan := false
		if filepath.Dir(w.dir) == abs {
			s.mu.Lock()
			buf, ok := s.buffers[filepath.Base(w.dir)]
			s.mu.Unlock()
			orphan = !ok || buf.uid != w.uid
		} else if _, err := os.Stat(w.dir); errors.Is(err, os.ErrNotExist) {
			orphan = true
		}
		if orphan {
			if err := os.Remove(f); err == nil {
				s.log.Info("removed the seq witness of a deleted buffer", "file", f, "dir", w.dir)
			}
		}
	}
}

// close unmaps the witness, and removes its file if remove is set.
func (w *seqWitness) close(remove bool) error {
	if w == nil {
		return nil
	}
	err := w.m.Unmap()
	if remove {
		if rerr := os.Remove(w.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}
