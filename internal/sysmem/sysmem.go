// Package sysmem tells how much memory this process may use: the machine's
// physical memory or, inside a container, its cgroup's limit, whichever is
// smaller. rbd sizes its default memory budgets from it, so that a server
// in a 2 GiB pod does not plan for the host's 256 GiB.
package sysmem

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Limit returns the memory available to this process in bytes: the
// physical memory, lowered to the cgroup (v2 or v1) limit when one is set.
// It returns 0 when neither can be read.
func Limit() int64 {
	var phys int64
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		phys = int64(si.Totalram) * int64(si.Unit)
	}
	if cg := cgroupLimit("/proc/self/cgroup", "/sys/fs/cgroup"); cg > 0 && (phys == 0 || cg < phys) {
		return cg
	}
	return phys
}

// cgroupLimit reads the memory limit of this process's cgroup (0: none or
// unreadable). root is where the cgroup filesystems are mounted.
func cgroupLimit(selfCgroup, root string) int64 {
	f, err := os.Open(selfCgroup)
	if err != nil {
		return 0
	}
	defer f.Close()
	var best int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "0::/path" (v2) or "4:memory:/path" (v1).
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var candidates []string
		switch {
		case parts[0] == "0" && parts[1] == "":
			candidates = []string{root + parts[2] + "/memory.max", root + "/memory.max"}
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			candidates = []string{root + "/memory" + parts[2] + "/memory.limit_in_bytes", root + "/memory/memory.limit_in_bytes"}
		}
		for _, path := range candidates {
			if v := readLimit(path); v > 0 && (best == 0 || v < best) {
				best = v
				break
			}
		}
	}
	return best
}

// readLimit parses a cgroup limit file: a byte count, or "max" (none). v1
// writes an absurdly large number for "no limit"; anything above 2^60 is
// taken as none.
func readLimit(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 || v > 1<<60 {
		return 0
	}
	return v
}
