package storage

import (
	"os"
	"strings"
)

// bootIDFile names the kernel's boot: a fresh random UUID at every boot
// (Linux). Other systems have none, and rbd then assumes every crash may
// have been a power loss.
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

// crashKeptPageCache reports whether the writer that left st unclean ran
// under the running kernel: every store it made into its maps and every
// write it made to its files is then in the page cache (a kill, an OOM
// kill or a crash of the process loses none of them), so recovery reads
// every seq it may have handed out and need not resume past its
// reservation. Only memmap buffers rely on it: their recovery counts the
// seq of every write a crash cut short (a marker, a piece), which is what
// makes "every seq it may have handed out" readable. A reboot, or a data
// dir last written on another machine, changes the boot id; a disk that
// lost its cache without a reboot (yanked, or its filesystem shut down
// after an I/O error) cannot be told apart (docs/architecture.md,
// "Recovery").
func (b *Buffer) crashKeptPageCache(st bufferState) bool {
	return b.spec.Storage == KindMemmap && st.Boot != "" && st.Boot == b.store.boot
}
