// Package procstat reads a process's memory and CPU figures from /proc: the
// resident set and its parts from /proc/PID/status, the CPU time from
// /proc/PID/stat. Shared by the agent (its own RSS around the initial sync)
// and the lab's and tests' samplers of other processes.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Status returns the kB-valued fields of /proc/PID/status (VmRSS,
// RssAnon, RssFile, VmHWM, ...) in bytes; pid 0 is the calling process.
func Status(pid int) (map[string]uint64, error) {
	b, err := os.ReadFile(path(pid, "status"))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for l := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(l, ":")
		v, kb := strings.CutSuffix(strings.TrimSpace(v), " kB")
		if !ok || !kb {
			continue
		}
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			out[k] = n << 10
		}
	}
	return out, nil
}

// RSS is the process's resident set in bytes (VmRSS); pid 0 is the calling
// process.
func RSS(pid int) (uint64, error) {
	st, err := Status(pid)
	if err != nil {
		return 0, err
	}
	rss, ok := st["VmRSS"]
	if !ok {
		return 0, fmt.Errorf("%s: no VmRSS", path(pid, "status"))
	}
	return rss, nil
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux).
const clockTick = 10 * time.Millisecond

// CPU is the CPU time the process has used, user plus system (utime and
// stime, fields 14 and 15 of /proc/PID/stat, after the parenthesised
// command name, which may hold spaces).
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path(pid, "stat"))
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: short", path(pid, "stat"))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%s: utime %q, stime %q", path(pid, "stat"), f[11], f[12])
	}
	return time.Duration(ut+st) * clockTick, nil
}

func path(pid int, file string) string {
	if pid == 0 {
		return "/proc/self/" + file
	}
	return fmt.Sprintf("/proc/%d/%s", pid, file)
}
