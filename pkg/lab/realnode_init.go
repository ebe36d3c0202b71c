package lab

// A real node's init (`lanekit lab node`, started by lab up --kubelet): PID
// 1 of the node's PID namespace, in the node's network namespace and a
// mount namespace of its own. It builds the node's view of the machine,
// starts containerd, imports the image archives, starts kubelet, reaps
// orphans and, on SIGTERM or when either daemon ends, stops them and exits
// (the kernel then kills every process left in the node).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// RunNode runs the node described by specFile until ctx ends or a daemon
// exits.
func RunNode(ctx context.Context, specFile string, log *slog.Logger) error {
	data, err := os.ReadFile(specFile)
	if err != nil {
		return err
	}
	var spec NodeSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", specFile, err)
	}
	if os.Getpid() != 1 {
		return errors.New("lab node: not PID 1 of a PID namespace (lab up --kubelet starts it)")
	}
	if err := nodeMounts(spec); err != nil {
		return fmt.Errorf("lab node: mounts: %w", err)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	env := append(os.Environ(), "PATH="+spec.NodeBins+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cd, err := startNodeProc(env, filepath.Join(nodeMount, "containerd.log"), filepath.Join(spec.NodeBins, "containerd"),
		"--config", filepath.Join(nodeMount, "etc", "containerd.toml"))
	if err != nil {
		return err
	}
	defer stopNodeProc(cd)
	sock := "/run/containerd/containerd.sock"
	if err := waitUnixSocket(ctx, sock, 30*time.Second); err != nil {
		return fmt.Errorf("lab node: containerd: %w", err)
	}
	log.Info("containerd up", "pid", cd.Process.Pid)
	ctrCmd := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, filepath.Join(spec.NodeBins, "ctr"), append([]string{"--address", sock, "-n", "k8s.io"}, args...)...)
	}
	ctr := func(args ...string) ([]byte, error) { return ctrCmd(args...).CombinedOutput() }
	list := func() (map[string]bool, error) {
		// Standard output only: ctr warns on standard error (cgroup v1).
		out, err := ctrCmd("images", "list", "--quiet").Output()
		if err != nil {
			return nil, fmt.Errorf("lab node: list images: %w", err)
		}
		names := map[string]bool{}
		for _, n := range strings.Fields(string(out)) {
			names[n] = true
		}
		return names, nil
	}
	names, err := list()
	if err != nil {
		return err
	}
	for _, archive := range nodeImageArchives(spec.Images, spec.RivalImages) {
		start := time.Now()
		if out, err := ctr("images", "import", "--digests", archive); err != nil {
			return fmt.Errorf("lab node: import %s: %w: %s", archive, err, out)
		}
		after, err := list()
		if err != nil {
			return err
		}
		// A reference by digest (repo@sha256:...) must resolve as it does
		// from a registry: KubeVirt pins a migration target's container
		// disk to the digest the source pod's status reports, which is
		// the imported index's, named import-DATE@sha256:... by ctr.
		for _, ref := range digestRefs(names, after) {
			if out, err := ctr("images", "tag", ref[0], ref[1]); err != nil {
				return fmt.Errorf("lab node: tag %s %s: %w: %s", ref[0], ref[1], err, out)
			}
			after[ref[1]] = true
		}
		names = after
		log.Info("image imported", "archive", archive, "took", time.Since(start).Round(time.Millisecond))
	}
	// No registry: kubelet's image garbage collection must never remove them.
	for ref := range names {
		if o, err := ctr("images", "label", ref, "io.cri-containerd.pinned=pinned"); err != nil {
			return fmt.Errorf("lab node: pin %s: %w: %s", ref, err, o)
		}
	}
	// From here PID 1 reaps every child and orphan of the node (exited
	// shims, their children); the ctr runs above waited for their own.
	exited := make(chan int, 16)
	go reapLoop(ctx, exited)
	nodeIP := UnderlayIP(spec.Index)
	if spec.NodeIP6 != "" {
		nodeIP += "," + spec.NodeIP6 // dual-stack: an InternalIP of each family
	}
	args := []string{"--config", filepath.Join(nodeMount, "etc", "kubelet.yaml"),
		"--kubeconfig", filepath.Join(nodeMount, "etc", "kubeconfig"),
		"--hostname-override", KubeNodeName(spec.Index),
		"--node-ip", nodeIP,
		"--v", "1"}
	if spec.Zone != "" {
		args = append(args, "--node-labels", corev1.LabelTopologyZone+"="+spec.Zone)
	}
	kl, err := startNodeProc(env, filepath.Join(nodeMount, "kubelet.log"), filepath.Join(spec.NodeBins, "kubelet"), args...)
	if err != nil {
		return err
	}
	defer stopNodeProc(kl)
	log.Info("kubelet started", "pid", kl.Process.Pid)
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping")
			return nil
		case pid := <-exited:
			switch pid {
			case cd.Process.Pid:
				return errors.New("lab node: containerd exited (containerd.log)")
			case kl.Process.Pid:
				return errors.New("lab node: kubelet exited (kubelet.log)")
			}
		}
	}
}

// nodeMounts builds the node's mount namespace.
func nodeMounts(spec NodeSpec) error {
	// Nothing propagates back to the machine.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The node's own /proc (its PID namespace), then the kernel tunables
	// kubelet writes: regular files holding the machine's values.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	fence := filepath.Join(spec.Dir, "sysctl")
	for _, k := range kernelTunables {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return err
		}
		f := filepath.Join(fence, strings.ReplaceAll(k, "/", "."))
		if err := os.MkdirAll(fence, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f, v, 0o644); err != nil {
			return err
		}
		if err := bind(f, "/proc/sys/"+k); err != nil {
			return err
		}
	}
	for _, b := range nodeBinds {
		src := filepath.Join(spec.Dir, b.sub)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := bind(src, b.target); err != nil {
			return err
		}
	}
	// The node's /run: a tmpfs with its netns files, containerd's state
	// and shim sockets, lanekit's socket and the node's cgroup2 directory
	// (the agent's --cgroup-root), and the node's directory at nodeMount.
	// Directories /run hides are bound through descriptors opened before.
	dir, err := os.Open(spec.Dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	cg, err := os.Open(spec.Cgroup2)
	if err != nil {
		return err
	}
	defer cg.Close()
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount /run: %w", err)
	}
	for _, d := range []string{"/run/netns", "/run/containerd", "/run/lanekit/cgroupv2", nodeMount} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := bind(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), nodeMount); err != nil {
		return err
	}
	if err := bind(fmt.Sprintf("/proc/self/fd/%d", cg.Fd()), "/run/lanekit/cgroupv2"); err != nil {
		return err
	}
	// The node's own bpffs: its pins go with the node.
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	// Kubelet's and the DaemonSet's mount propagation (Bidirectional,
	// HostToContainer) need shared mounts: shared within the node only.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared: %w", err)
	}
	return nil
}

func bind(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// startNodeProc starts one of the node's daemons with its log.
func startNodeProc(env []string, log, bin string, args ...string) (*exec.Cmd, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lab node: start %s: %w", filepath.Base(bin), err)
	}
	return cmd, nil
}

// stopNodeProc asks a daemon to stop and gives it a moment (lab down
// waits 3 s for the node); whatever is left dies with the node's PID
// namespace.
func stopNodeProc(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(cmd.Process.Pid, 0) != nil {
			return
		}
	}
}

// reapLoop waits for every child (as PID 1: every orphan too) and reports
// the exits.
func reapLoop(ctx context.Context, exited chan<- int) {
	for ctx.Err() == nil {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.ECHILD) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil || pid <= 0 {
			continue
		}
		select {
		case exited <- pid:
		default:
		}
	}
}

// waitUnixSocket waits until a unix socket accepts connections.
func waitUnixSocket(ctx context.Context, path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering after %s: %w", path, limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// digestRefs pairs the image names one import added (after, less before):
// for each import-DATE@sha256:D name and each repo:tag name, the source and
// the repo@sha256:D name to tag it as.
func digestRefs(before, after map[string]bool) [][2]string {
	var digests, repos []string
	for n := range after {
		if before[n] {
			continue
		}
		name, _, ok := strings.Cut(n, "@")
		switch {
		case ok && strings.HasPrefix(name, "import-"):
			digests = append(digests, n)
		case !ok:
			if i := strings.LastIndex(n, ":"); i > strings.LastIndex(n, "/") {
				repos = append(repos, n[:i])
			}
		}
	}
	slices.Sort(digests)
	slices.Sort(repos)
	var out [][2]string
	for _, d := range digests {
		_, digest, _ := strings.Cut(d, "@")
		for _, r := range repos {
			out = append(out, [2]string{d, r + "@" + digest})
		}
	}
	return out
}
