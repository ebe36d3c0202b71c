package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DownOptions tune teardown.
type DownOptions struct {
	Bins Bins
	Out  func(format string, args ...any)
}

// labProcs are the programs the lab starts inside its namespaces.
var labProcs = map[string]bool{
	"lanekitd": true, "lanekit": true, "lanekit-cni": true, "iperf3": true,
	"sockperf": true, "ping": true, "busybox": true, "bridge": true, "host-local": true,
	"lanekit-vhost": true, "qemu-system-x86_64": true, "qemu-system-x86": true,
	"etcd": true, "kube-apiserver": true,
	// lab up --kubelet (comm is at most 15 characters)
	"kube-controller": true, "kube-scheduler": true, "kubelet": true, "containerd": true,
	"containerd-shim": true, "kubectl": true, "ctr": true, "runc": true,
}

// Down removes everything the lab may have left, also after a crashed or
// half-done Up: CNI DEL for recorded pods (best effort), agents by pid file,
// lab programs still running in an lk- netns, every lk- netns, RunDir, the
// nodes' bpffs pins and their cgroups (NodeCgroup). It is idempotent.
func Down(ctx context.Context, o DownOptions) error {
	beforeLab()
	say := o.Out
	if say == nil {
		say = func(string, ...any) {}
	}
	var errs []error
	if st, err := LoadState(); err == nil {
		for _, n := range st.Nodes {
			for _, p := range n.Pods {
				if !netnsExists(p.NS) {
					continue
				}
				if p.Kind == KindLanekit && !alive(n.AgentPID) {
					continue // the agent owns the pod's state; nothing answers DEL
				}
				if p.Kind == KindLanekit && st.K8s {
					continue // the lab kubelet's pods: their netns and the agent's state go below
				}
				if err := delPod(ctx, o.Bins, n.Index, p.NS, p.Kind); err != nil {
					say("lab down: %v (continuing)", err)
				}
			}
		}
		for _, p := range st.NamedPods {
			if err := delNamedPod(ctx, o.Bins, st, &p); err != nil {
				say("lab down: %v (continuing)", err)
			}
		}
	}
	downK8s()
	pidFiles, _ := filepath.Glob(filepath.Join(RunDir, "*", "*.pid"))
	for _, f := range pidFiles {
		if pid := readPID(f); pid > 0 && inLabNetns(pid) {
			say("lab down: stopping pid %d (%s)", pid, f)
			terminate(pid, 3*time.Second)
		}
	}
	for _, pid := range labNetnsProcs() {
		say("lab down: killing pid %d left in a lab netns", pid)
		terminate(pid, time.Second)
	}
	// Real nodes: their cgroups and the mount points lab up created.
	if err := downRealNodes(say); err != nil {
		errs = append(errs, err)
	}
	for _, ns := range listLabNetns() {
		if err := ip(ctx, "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(RunDir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", RunDir, err))
	}
	for _, d := range bpfNodeDirs() {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("remove pins %s: %w", d, err))
		}
	}
	// The pin root too when nothing else (a node's own agent) pins there.
	if err := removeIfEmpty(BPFRoot); err != nil {
		errs = append(errs, err)
	}
	// After the pins (the socket LB's cgroup links) and the processes.
	if err := removeLabCgroups(); err != nil {
		errs = append(errs, err)
	}
	// /run/lanekit too when the lab was all it held (a node's own agent
	// keeps its socket there).
	if err := removeIfEmpty(filepath.Dir(RunDir)); err != nil {
		errs = append(errs, err)
	}
	if left := listLabNetns(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("netns still present: %s", strings.Join(left, " ")))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab down: %w", err)
	}
	return nil
}

// removeIfEmpty removes dir when it is empty; gone or not empty is fine.
func removeIfEmpty(dir string) error {
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// bpfNodeDirs lists the nodes' pin directories.
func bpfNodeDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(BPFRoot, "lk-node*"))
	return dirs
}

// labNetnsInodes maps the inode of every lk- netns to its name.
func labNetnsInodes() map[uint64]string {
	out := map[uint64]string{}
	for _, ns := range listLabNetns() {
		var st syscall.Stat_t
		if syscall.Stat(netnsPath(ns), &st) == nil {
			out[st.Ino] = ns
		}
	}
	return out
}

// procNetnsInode returns the inode of pid's network namespace.
func procNetnsInode(pid int) (uint64, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, false
	}
	return st.Ino, true
}

// inLabNetns reports whether pid lives in an lk- netns.
func inLabNetns(pid int) bool {
	ino, ok := procNetnsInode(pid)
	if !ok {
		return false
	}
	_, ok = labNetnsInodes()[ino]
	return ok
}

// labNetnsProcs lists lab programs (labProcs) running inside an lk- netns,
// never the calling process.
func labNetnsProcs() []int {
	inodes := labNetnsInodes()
	if len(inodes) == 0 {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		ino, ok := procNetnsInode(pid)
		if !ok {
			continue
		}
		if _, ok := inodes[ino]; !ok {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && labProcs[strings.TrimSpace(string(comm))] {
			out = append(out, pid)
		}
	}
	return out
}
