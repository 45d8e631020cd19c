package storage

import (
	"os"
	"strings"
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
