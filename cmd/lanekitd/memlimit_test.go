package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

func TestCgroupMemoryLimit(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes", "536870912")
	write("sys/fs/cgroup/memory/free/memory.limit_in_bytes", "9223372036854771712") // v1's "no limit"
	write("sys/fs/cgroup/kubepods.slice/c2/memory.max", "1073741824")
	write("sys/fs/cgroup/unlimited/memory.max", "max")
	write("sys/fs/cgroup/memory/bad/memory.limit_in_bytes", "lots")
	for _, c := range []struct {
		name, proc string
		limit      uint64
		ok, err    bool
	}{
		{"v1 limit", "4:memory:/kubepods/pod1/c1\n0::/\n", 536870912, true, false},
		{"v1 with other controllers", "5:cpu,memory:/kubepods/pod1/c1\n", 536870912, true, false},
		{"v1 unlimited", "4:memory:/free\n", 0, false, false},
		{"v2 limit", "0::/kubepods.slice/c2\n", 1 << 30, true, false},
		{"v2 max", "0::/unlimited\n", 0, false, false},
		{"no such cgroup", "0::/gone\n4:memory:/gone\n", 0, false, false},
		{"malformed value", "4:memory:/bad\n", 0, false, true},
		{"no memory hierarchy", "3:cpuset:/\n", 0, false, false},
	} {
		limit, ok, err := cgroupMemoryLimit(root, c.proc)
		if limit != c.limit || ok != c.ok || (err != nil) != c.err {
			t.Errorf("%s: %d %v %v, want %d %v err %v", c.name, limit, ok, err, c.limit, c.ok, c.err)
		}
	}
}

// memLimitChildEnv makes this test binary the agent's memory-limit step
// in a cgroup the test made (TestMemoryLimitFromOwnCgroup).
const memLimitChildEnv = "LANEKIT_MEMLIMIT_CHILD"

var ratio09 = 0.9

// TestMemoryLimitFromOwnCgroup runs the agent's memory-limit step in a
// process placed in a memory cgroup of 512 MiB (made under this process's
// own, cgroup v1 or v2): Go's soft limit becomes 0.9 of it; with
// GOMEMLIMIT in the environment it stays the environment's. Root only.
func TestMemoryLimitFromOwnCgroup(t *testing.T) {
	if os.Getenv(memLimitChildEnv) != "" {
		ratio, _ := strconv.ParseFloat(os.Getenv(memLimitChildEnv), 64)
		if _, err := setMemoryLimit(ratio, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("GOMEMLIMIT=%d\n", debug.SetMemoryLimit(-1))
		return
	}
	testutil.RequireRoot(t)
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("skipping: no /proc/self/cgroup: %v", err)
	}
	var dir, limitFile string
	switch v1, v2 := memoryCgroups(string(own)); {
	case v1 != "":
		dir, limitFile = filepath.Join("/sys/fs/cgroup/memory", v1), "memory.limit_in_bytes"
	case v2 != "":
		dir, limitFile = filepath.Join("/sys/fs/cgroup", v2), "memory.max"
	}
	if _, err := os.Stat(filepath.Join(dir, limitFile)); dir == "" || err != nil {
		t.Skipf("skipping: no writable memory cgroup of this process found (%s): %v", dir, err)
	}
	cg := filepath.Join(dir, fmt.Sprintf("lk-memlimit-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("skipping: cannot make a child memory cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(cg) })
	const limit = 512 << 20
	if err := os.WriteFile(filepath.Join(cg, limitFile), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	child := func(ratio string, env ...string) string {
		t.Helper()
		cmd := exec.Command("sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg, os.Args[0], "-test.run=^TestMemoryLimitFromOwnCgroup$")
		cmd.Env = append(append(os.Environ(), memLimitChildEnv+"="+ratio), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, "GOMEMLIMIT="); ok {
				return v
			}
		}
		t.Fatalf("child printed no limit:\n%s", out)
		return ""
	}
	if got, want := child("0.9"), strconv.FormatInt(int64(float64(limit)*ratio09), 10); got != want {
		t.Errorf("soft limit in a 512 MiB cgroup with ratio 0.9: %s, want %s", got, want)
	}
	if got, want := child("0.9", "GOMEMLIMIT=100MiB"), strconv.Itoa(100<<20); got != want {
		t.Errorf("with GOMEMLIMIT=100MiB: %s, want %s (the environment's)", got, want)
	}
	if got := child("0"); got != strconv.FormatInt(int64(^uint64(0)>>1), 10) {
		t.Errorf("ratio 0 (off): %s, want no limit", got)
	}
}

// releaseSyncMemory returns the free heap and drops the store's pages once
// per call and logs the RSS around it (the source calls it once: TestSyncedRunsOnceAfterTheFullSets).
func TestReleaseSyncMemory(t *testing.T) {
	calls := 0
	orig := freeOSMemory
	freeOSMemory = func() { calls++; orig() }
	t.Cleanup(func() { freeOSMemory = orig })
	var b strings.Builder
	drops := 0
	releaseSyncMemory(slog.New(slog.NewTextHandler(&b, nil)), func() error { drops++; return nil })
	if calls != 1 || drops != 1 {
		t.Errorf("FreeOSMemory called %d times, the store's pages dropped %d times, want once each", calls, drops)
	}
	if rss := selfRSS(); rss == 0 || !strings.Contains(b.String(), "rss_before_mb=") || !strings.Contains(b.String(), "rss_after_mb=") {
		t.Errorf("RSS %d, log %q: want the RSS before and after", rss, b.String())
	}
}
