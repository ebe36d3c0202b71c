package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// reapDeadRuns removes the network namespaces /run/netns/<prefix><pid> and
// bpffs pin directories /sys/fs/bpf/<prefix><pid> of runs whose process is
// gone: a bench killed before its cleanup (a go test timeout, SIGKILL)
// leaves them behind, and the next run removes them. A live process's are
// kept (a concurrent run).
func reapDeadRuns(ctx context.Context, prefix string) []string {
	return reapDeadRunsIn(ctx, prefix, "/run/netns", "/sys/fs/bpf", processAlive, func(ctx context.Context, ns string) error {
		return runIP(ctx, "netns", "del", ns)
	})
}

func reapDeadRunsIn(ctx context.Context, prefix, netnsDir, bpfDir string, alive func(int) bool,
	delNetns func(context.Context, string) error) (removed []string) {
	for _, dir := range []string{netnsDir, bpfDir} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), prefix))
			if !strings.HasPrefix(e.Name(), prefix) || err != nil || pid <= 0 || alive(pid) {
				continue
			}
			if dir == netnsDir {
				err = delNetns(ctx, e.Name())
			} else {
				err = os.RemoveAll(filepath.Join(dir, e.Name()))
			}
			if err == nil {
				removed = append(removed, filepath.Join(dir, e.Name()))
			}
		}
	}
	return removed
}

// processAlive reports whether process pid exists (EPERM: it does, as
// another user's).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
