package sysmem

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCgroupLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		self  string
		files map[string]string
		want  int64
	}{
		{"v2 limit", "0::/pod/a\n", map[string]string{"pod/a/memory.max": "2147483648\n"}, 2 << 30},
		{"v2 max", "0::/pod/a\n", map[string]string{"pod/a/memory.max": "max\n"}, 0},
		{"v2 root file", "0::/\n", map[string]string{"memory.max": "1073741824"}, 1 << 30},
		{"v1 limit", "5:memory:/docker/x\n3:cpu:/\n", map[string]string{"memory/docker/x/memory.limit_in_bytes": "536870912"}, 512 << 20},
		{"v1 unlimited", "5:memory:/docker/x\n", map[string]string{"memory/docker/x/memory.limit_in_bytes": "9223372036854771712"}, 0},
		{"v1 joined controllers", "7:cpuset,memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "4096"}, 4096},
		{"garbage", "nonsense\n0::/a\n", map[string]string{"a/memory.max": "-5"}, 0},
		{"no file", "0::/none\n", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, v := range tc.files {
				full := filepath.Join(root, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			self := filepath.Join(t.TempDir(), "cgroup")
			if err := os.WriteFile(self, []byte(tc.self), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := cgroupLimit(self, root); got != tc.want {
				t.Fatalf("cgroupLimit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLimitIsPositive(t *testing.T) {
	// Every Linux machine this runs on reports its memory.
	if got := Limit(); got <= 0 {
		t.Fatalf("Limit() = %d", got)
	}
}
