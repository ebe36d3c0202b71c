package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultBPFFS is where the BPF filesystem is mounted on a node.
const DefaultBPFFS = "/sys/fs/bpf"

// bpfFSMagic is BPF_FS_MAGIC (include/uapi/linux/magic.h).
const bpfFSMagic = 0xcafe4a11

// onBPFFS reports whether dir, or its nearest existing parent, is on a BPF
// filesystem, and which directory it checked.
func onBPFFS(dir string) (bool, string, error) {
	p := filepath.Clean(dir)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return uint32(st.Type) == bpfFSMagic, p, nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return false, p, fmt.Errorf("statfs %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
}

// ensureBPFFS makes sure pinDir can hold pins: it is on a BPF filesystem
// already, or it lies under DefaultBPFFS and one is mounted there (as a
// node's boot would, and as Cilium's agent does when it is missing, e.g.
// under `ip netns exec`, which remounts /sys). Anywhere else the error says
// what to do.
func ensureBPFFS(pinDir string, log *slog.Logger) error {
	ok, checked, err := onBPFFS(pinDir)
	if err != nil {
		return fmt.Errorf("check bpffs for %s: %w", pinDir, err)
	}
	if ok {
		return nil
	}
	clean := filepath.Clean(pinDir)
	under := clean == DefaultBPFFS || strings.HasPrefix(clean, DefaultBPFFS+"/")
	// Mount only where the node's bpffs belongs: DefaultBPFFS itself (or a
	// parent) is what is missing, not something else mounted below it.
	if !under || len(checked) > len(DefaultBPFFS) {
		return fmt.Errorf("%s is not on a BPF filesystem (checked %s): mount one (mount -t bpf bpf %s) or choose --bpf-dir under %s",
			pinDir, checked, filepath.Dir(pinDir), DefaultBPFFS)
	}
	if err := os.MkdirAll(DefaultBPFFS, 0o755); err != nil {
		return fmt.Errorf("%s is not a BPF filesystem and cannot be created (%v): mount one with `mount -t bpf bpf %s` before starting the agent",
			DefaultBPFFS, err, DefaultBPFFS)
	}
	if err := unix.Mount("bpf", DefaultBPFFS, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w (mount it with `mount -t bpf bpf %s`, or start the agent with nsenter --net=... rather than ip netns exec, which remounts /sys)",
			DefaultBPFFS, err, DefaultBPFFS)
	}
	msg := "mounted bpffs"
	if own, err1 := os.Readlink("/proc/self/ns/mnt"); err1 == nil {
		if init, err2 := os.Readlink("/proc/1/ns/mnt"); err2 == nil && own != init {
			// A bpffs mounted in a private mount namespace dies with it:
			// pins (and so forwarding) do not outlive this agent.
			msg = "mounted bpffs in a private mount namespace: pins do not outlive it; run the agent in the node's mount namespace (nsenter --net=..., not ip netns exec) to keep forwarding across restarts"
			log.Warn(msg, "path", DefaultBPFFS)
			return nil
		}
	}
	log.Info(msg, "path", DefaultBPFFS)
	return nil
}
