package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// The socket load balancer (services for a node's own processes) works on a
// cgroup2 directory. On a real node that is the cgroup2 root; in the lab
// every node gets a child cgroup of its own, which its agent and the
// node's "host processes" join: the root would translate the connections of
// every process on the machine. (The programs also check the node's netns.)
const (
	// CgroupMount is where the lab mounts the cgroup2 hierarchy if it is
	// not mounted there (lanekitd's default --cgroup-root).
	CgroupMount = "/run/lanekit/cgroupv2"
	// LabCgroup holds the nodes' cgroups.
	LabCgroup = CgroupMount + "/lanekit-lab"
)

// NodeCgroup is node i's cgroup: its agent's --cgroup-root.
func NodeCgroup(i int) string { return filepath.Join(LabCgroup, NodeNS(i)) }

// ensureNodeCgroup creates node i's cgroup (mounting cgroup2 at CgroupMount
// first if needed).
func ensureNodeCgroup(i int) error {
	if err := datapath.EnsureCgroup2(CgroupMount); err != nil {
		return err
	}
	if err := os.MkdirAll(NodeCgroup(i), 0o755); err != nil {
		return fmt.Errorf("node cgroup: %w", err)
	}
	return nil
}

// removeLabCgroups removes the nodes' cgroups (their processes must be gone)
// and unmounts CgroupMount. Missing is fine.
func removeLabCgroups() error {
	var errs []error
	entries, err := os.ReadDir(LabCgroup)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroup(filepath.Join(LabCgroup, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("remove node cgroup: %w", err))
			}
		}
	}
	if err := os.Remove(LabCgroup); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove lab cgroup: %w", err))
	}
	var st unix.Statfs_t
	if unix.Statfs(CgroupMount, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		if err := unix.Unmount(CgroupMount, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", CgroupMount, err))
		} else if err := os.Remove(CgroupMount); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup removes a node's cgroup. Whatever still runs in it is the
// node's (its agent's children: backends, helpers lab down found no pid file
// or netns for) and is killed (cgroup.kill); the directory goes once the
// kernel has moved the last task out, which can take a moment after the kill.
func removeCgroup(dir string) error {
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return fmt.Errorf("%w (still in it: %q)", err, strings.Fields(string(procs)))
		}
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	}
}
