package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/lanekit/lanekit/internal/procstat"
)

// A Go program's heap may grow to twice its live size between collections
// (GOGC=100): an agent with 340 MB live at 30,000 Services peaked near 0.9 GB
// (docs/benchmarks.md#scale), so a container memory limit below that is an
// OOM kill at the first full sync. Go collects harder near a soft limit
// (GOMEMLIMIT); the agent sets one from its cgroup's memory limit, as
// automemlimit-style libraries do, unless GOMEMLIMIT is in its environment.

// cgroupMemoryLimit returns the memory limit (bytes) of the cgroup of the
// process whose /proc/PID/cgroup text is procCgroup, reading the cgroup
// filesystem under root ("/" in production): cgroup v2's memory.max of the
// unified hierarchy, else v1's memory.limit_in_bytes. ok is false when there
// is no limit ("max", or v1's page-rounded near-2^63 value) or no
// hierarchy to read. In a container with its own cgroup namespace the path
// is "/" and the limit is the container's.
func cgroupMemoryLimit(root, procCgroup string) (limit uint64, ok bool, err error) {
	v1, v2 := memoryCgroups(procCgroup)
	var files []string
	if v1 != "" {
		files = append(files, filepath.Join(root, "sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"))
	}
	if v2 != "" {
		files = append(files, filepath.Join(root, "sys/fs/cgroup", v2, "memory.max"))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		return parseLimit(strings.TrimSpace(string(b)))
	}
	return 0, false, nil
}

// memoryCgroups returns the paths, in /proc/PID/cgroup text, of the
// process's cgroup v1 memory hierarchy and of its cgroup v2 unified one
// ("" for one it is not in).
func memoryCgroups(procCgroup string) (v1, v2 string) {
	sc := bufio.NewScanner(strings.NewReader(procCgroup))
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	return v1, v2
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// parseLimit reads memory.max / memory.limit_in_bytes: "max" or a value at
// or above 2^62 (v1's unlimited is 2^63 rounded down to a page) is no limit.
func parseLimit(s string) (uint64, bool, error) {
	if s == "max" {
		return 0, false, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("cgroup memory limit %q: %w", s, err)
	}
	if v == 0 || v >= 1<<62 {
		return 0, false, nil
	}
	return v, true, nil
}

// setMemoryLimit sets the Go runtime's soft memory limit to ratio × the
// agent's cgroup memory limit, unless ratio is 0, GOMEMLIMIT is set (the
// runtime took it already) or there is no limit. It returns the limit set
// (0: none).
func setMemoryLimit(ratio float64, log *slog.Logger) (int64, error) {
	if ratio == 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, nil // no /proc: nothing to read the limit from
	}
	limit, ok, err := cgroupMemoryLimit("/", string(own))
	if err != nil || !ok {
		return 0, err
	}
	soft := int64(math.Min(float64(limit)*ratio, math.MaxInt64))
	debug.SetMemoryLimit(soft)
	log.Info("Go soft memory limit from the cgroup's", "cgroup_limit_bytes", limit, "ratio", ratio, "gomemlimit_bytes", soft)
	return soft, nil
}

// The initial sync (and a restart's restore before it) decodes and
// translates the whole cluster: once the agent has programmed it, that
// garbage is dead, but Go's background scavenger returns the heap it grew
// to only over the following tens of seconds, so a probe or an operator
// reading RSS at ready sees most of the sync's peak. And a restart's
// restore read every stored object through the store's mapping, whose
// pages stay resident (file-backed RSS) though nothing reads them again.
// The source calls releaseSyncMemory once then (k8s.Config.OnSynced),
// never per event: FreeOSMemory forces a GC and returns every free page at
// once.

// releaseSyncMemory returns the initial sync's free heap to the OS and
// drops the store's mapped pages (dropStorePages), logging the RSS before
// and after.
func releaseSyncMemory(log *slog.Logger, dropStorePages func() error) {
	before, start := selfRSS(), time.Now()
	if err := dropStorePages(); err != nil {
		log.Warn("initial sync done: the store's pages stay resident", "err", err)
	}
	freeOSMemory()
	log.Info("initial sync done: returned its free memory to the OS", "rss_before_mb", before>>20, "rss_after_mb", selfRSS()>>20,
		"took", time.Since(start).Round(time.Millisecond))
}

// freeOSMemory is debug.FreeOSMemory (a test counts the calls).
var freeOSMemory = debug.FreeOSMemory

// selfRSS is the process's resident set (bytes; 0 if unreadable).
func selfRSS() uint64 {
	rss, _ := procstat.RSS(0)
	return rss
}
