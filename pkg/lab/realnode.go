package lab

// `lab up --k8s --kubelet`: real nodes. Each lab node runs containerd and
// the upstream kubelet (scripts/k8s-node-bins.sh) in the node's network
// namespace and in a PID and mount namespace of its own (realnode_init.go
// sets them up: node-private /var/lib/kubelet, /etc/cni/net.d, /opt/cni/bin,
// /run, a bpffs, the kernel tunables kubelet writes fenced by regular
// files). The control plane gains kube-controller-manager (node CIDRs,
// EndpointSlices, ServiceAccounts) and kube-scheduler (realnode_cluster.go);
// lanekit is installed with `kubectl apply -k deploy/`, CoreDNS as a
// Deployment. There is no kube-proxy.
//
// Nothing a node does reaches the machine: every directory kubelet and
// containerd write is a bind mount of the node's directory under RunDir
// (the mount points themselves are created when missing and removed by
// lab down), the pods' cgroups nest under the cgroup of the process that
// ran lab up, and killing a node's init (PID 1 of its PID namespace) ends
// every process of the node, its containers included.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// Versions and places of scripts/k8s-node-bins.sh (TestNodeBinDirMatchesScript
// keeps them equal).
const (
	nodeKubeVersion       = "v1.37.2"
	nodeContainerdVersion = "v2.4.2"
	nodeRuncVersion       = "v1.5.2"
	nodeCorednsVersion    = "v1.15.0"
	// EnvNodeBinDir overrides where the node binaries are found.
	EnvNodeBinDir = "LANEKIT_K8S_NODE_BIN_DIR"
	// EnvNodeRequired makes missing node binaries a test failure.
	EnvNodeRequired = "LANEKIT_K8S_NODE_REQUIRED"
)

// NodeBinDir is where scripts/k8s-node-bins.sh puts the node binaries.
func NodeBinDir() string {
	if d := os.Getenv(EnvNodeBinDir); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		cache = filepath.Join(os.Getenv("HOME"), ".cache")
	}
	return filepath.Join(cache, "lanekit", "k8s-node", fmt.Sprintf("kube-%s_containerd-%s_runc-%s_coredns-%s",
		nodeKubeVersion, nodeContainerdVersion, nodeRuncVersion, nodeCorednsVersion))
}

// nodeBinNames are the binaries lab up --kubelet runs.
var nodeBinNames = []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kubectl",
	"containerd", "containerd-shim-runc-v2", "ctr", "runc"}

// NodeImages are the image archives each node imports (internal/tools/lkimages).
var NodeImages = []string{"pause", "agent", "agnhost", "coredns"}

// ExtraNodeImages are imported when their archives exist: images only some
// upstream e2e tests run (make k8s-node-images writes them; `make
// conformance` needs them).
var ExtraNodeImages = []string{"regression", "busybox"}

// regularFile says whether a regular file exists at p.
func regularFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// nodeImageArchives are the archives a node imports: every NodeImages one
// and the ExtraNodeImages that exist.
func nodeImageArchives(dir string, rival []string) []string {
	var out []string
	for _, n := range append(slices.Clone(NodeImages), rival...) {
		out = append(out, filepath.Join(dir, n+".tar"))
	}
	for _, n := range ExtraNodeImages {
		if f := filepath.Join(dir, n+".tar"); regularFile(f) {
			out = append(out, f)
		}
	}
	return out
}

// CheckNodeBins returns the node binary directory, or an error saying how
// to build what is missing.
func CheckNodeBins() (string, error) {
	d := NodeBinDir()
	for _, b := range nodeBinNames {
		if !executable(filepath.Join(d, b)) {
			return "", fmt.Errorf("%s missing in %s: run `make k8s-node-bins` (scripts/k8s-node-bins.sh)", b, d)
		}
	}
	return d, nil
}

// ImagesDir holds the node image archives: `make k8s-node-images` writes
// them there (lkimages -out bin/images).
func (b Bins) ImagesDir() string { return filepath.Join(b.Dir, "images") }

// AgentDatapathStamp names the file beside agent.tar that holds the digest
// of the BPF programs the agent image carries (datapath.ObjectsDigest;
// internal/tools/lkimages writes it when it builds the agent's binaries).
const AgentDatapathStamp = "agent.datapath"

// checkImages verifies every archive a node imports exists, and that the
// agent image carries the BPF programs this binary does: an image built
// before the datapath changed would run (and benchmark) the older one.
func (b Bins) checkImages() error {
	for _, n := range NodeImages {
		if _, err := os.Stat(filepath.Join(b.ImagesDir(), n+".tar")); err != nil {
			return fmt.Errorf("image archive %s.tar missing in %s: run `make k8s-node-images`", n, b.ImagesDir())
		}
	}
	stamp, err := os.ReadFile(filepath.Join(b.ImagesDir(), AgentDatapathStamp))
	if err != nil {
		return fmt.Errorf("%s: no record of the agent image's BPF programs (%v): run `make k8s-node-images`", b.ImagesDir(), err)
	}
	if got, want := strings.TrimSpace(string(stamp)), datapath.ObjectsDigest(); got != want {
		return fmt.Errorf("the agent image in %s carries other BPF programs (%s) than this lanekit (%s): run `make k8s-node-images`",
			b.ImagesDir(), got, want)
	}
	return nil
}

// DeployDir is the repository's deploy/ (next to bin/).
func (b Bins) DeployDir() string { return filepath.Join(filepath.Dir(b.Dir), "deploy") }

// Node-private paths: each is a bind mount of a directory of the node
// (RealNodeDir) inside the node's mount namespace.
var nodeBinds = []struct{ sub, target string }{
	{"kubelet", "/var/lib/kubelet"},
	{"lanekit", "/var/lib/lanekit"},
	{"cni-conf", "/etc/cni/net.d"},
	{"cni-bin", "/opt/cni/bin"},
	{"cni-cache", "/var/lib/cni"},
	{"log-containers", "/var/log/containers"},
	// hostPath directories of KubeVirt's virt-handler (its node labeller's
	// output) and Multus' thick DaemonSet (its per-node configuration) that
	// are not under /run (the node's tmpfs) or the binds above.
	{"kubevirt-node-labeller", "/var/lib/kubevirt-node-labeller"},
	{"cni-multus", "/etc/cni/multus"},
	// Cilium's chart mounts the host's /lib/modules (no hostPath type: it
	// must exist); this machine has none, a node gets an empty one.
	{"lib-modules", "/lib/modules"},
}

// nodeMount is where a node sees its own directory (inside its /run tmpfs).
const nodeMount = "/run/lanekit-node"

// RealNodeDir holds node i's configuration, containerd root and the
// directories behind its bind mounts.
func RealNodeDir(i int) string { return filepath.Join(NodeDir(i), "node") }

// NodeInitPIDFile is node i's init (PID 1 of the node).
func NodeInitPIDFile(i int) string { return filepath.Join(NodeDir(i), "node.pid") }

// NodeLog returns the path of one of node i's logs (node, containerd, kubelet).
func NodeLog(i int, name string) string { return filepath.Join(RealNodeDir(i), name+".log") }

// kernelTunables are the machine-wide /proc/sys entries kubelet sets
// (setupKernelTunables; the keys only without a user namespace) and those
// Cilium's agent writes at start (pkg/datapath/loader Reinitialize:
// unprivileged_bpf_disabled=1, which the kernel never lets go back, and
// timer_migration=0; its net.* writes land in the node's netns). A node
// sees regular files holding the machine's values there.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
	"kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"kernel/unprivileged_bpf_disabled", "kernel/timer_migration"}

// ReadKernelTunables returns the machine's values of kernelTunables.
func ReadKernelTunables() (map[string]string, error) {
	out := map[string]string{}
	for _, k := range kernelTunables {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return nil, err
		}
		out[k] = strings.TrimSpace(string(v))
	}
	return out, nil
}

// NodeSpec is what a node's init needs (RealNodeDir/node.json).
type NodeSpec struct {
	Index    int    `json:"index"`
	Dir      string `json:"dir"`      // RealNodeDir on the machine
	NodeBins string `json:"nodeBins"` // scripts/k8s-node-bins.sh dir
	Images   string `json:"images"`   // image archives
	// Cgroup2 is the node's cgroup2 directory: its init starts there and
	// binds it at /run/lanekit/cgroupv2.
	Cgroup2 string `json:"cgroup2"`
	// NodeIP6 is the node's IPv6 underlay address in a dual-stack lab:
	// kubelet's --node-ip gets both families ("" : IPv4 only).
	NodeIP6 string `json:"nodeIP6,omitempty"`
	// RivalImages are the archives of the --cni rival (rivals.go) or of
	// --kubevirt (KubeVirtImages) the node imports beside the others.
	RivalImages []string `json:"rivalImages,omitempty"`
	// Zone is the node's topology.kubernetes.io/zone (kubelet --node-labels;
	// "": none).
	Zone string `json:"zone,omitempty"`
}

// realNodes is what lab down needs to undo beyond processes and RunDir
// (RunDir/realnodes.json).
type realNodes struct {
	// Cgroups are the cgroup directories lab up created or found missing
	// (runc creates them), parents first; down removes those that exist
	// (and all below) children first.
	Cgroups []string `json:"cgroups"`
	// Mountpoints lab up created on the machine (empty directories).
	Mountpoints []string `json:"mountpoints"`
}

// realNodesFile is the record; outside RunDir, so that it survives a lab
// down that does not know real nodes (an older lanekit) removing RunDir.
func realNodesFile() string { return filepath.Join(filepath.Dir(RunDir), "lab-realnodes.json") }

func (r *realNodes) save() error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(realNodesFile(), data, 0o644)
}

// KubeletCgroupRoot is the cgroup that holds node i's pods (kubelet's
// cgroupRoot): under the memory cgroup of the calling process (the one
// that accounts for the lab; with cgroup v2, its only cgroup).
func KubeletCgroupRoot(i int) (string, error) {
	base, err := selfCgroup()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "lanekit-lab", NodeNS(i)), nil
}

// selfCgroup reads the calling process's cgroup from /proc/self/cgroup:
// the memory controller's path with cgroup v1, the unified one otherwise.
func selfCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	var unified, memory string
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			unified = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			memory = parts[2]
		}
	}
	if memory != "" {
		return memory, nil
	}
	if unified != "" {
		return unified, nil
	}
	return "", errors.New("/proc/self/cgroup: no memory or unified cgroup")
}

// cgroupHierarchies lists the mount points of the cgroup v1 hierarchies
// and of cgroup2.
func cgroupHierarchies() (v1, v2 []string, err error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, pf := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(pf) < 1 {
			continue
		}
		switch pf[0] {
		case "cgroup":
			v1 = append(v1, f[4])
		case "cgroup2":
			v2 = append(v2, f[4])
		}
	}
	return v1, v2, nil
}

// makeKubeletCgroups creates node i's cgroupRoot in every cgroup v1
// hierarchy (kubelet wants it to exist in each), copying cpuset's cpus and
// mems down, and in cgroup2, where runc places containers at the same path
// on a hybrid machine; it records the directories it created. It returns
// kubelet's cgroupRoot and the node's cgroup2 directory (the node's
// processes and containers are all below it: the agent's --cgroup-root).
func makeKubeletCgroups(r *realNodes, i int) (root, cgroup2 string, err error) {
	if root, err = KubeletCgroupRoot(i); err != nil {
		return "", "", err
	}
	v1, v2, err := cgroupHierarchies()
	if err != nil {
		return "", "", err
	}
	if len(v2) == 0 {
		return "", "", errors.New("no cgroup2 hierarchy mounted (the agent's socket load balancer needs one)")
	}
	// The lab's own mount of it (/run/lanekit/cgroupv2) is the same tree.
	v2 = v2[:1]
	for _, h := range append(v1, v2...) {
		dir := h
		for _, part := range strings.Split(strings.Trim(root, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if _, err := os.Stat(dir); err == nil {
				continue
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				return "", "", fmt.Errorf("cgroup %s: %w", dir, err)
			}
			r.Cgroups = append(r.Cgroups, dir)
			if err := r.save(); err != nil {
				return "", "", err
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if v, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
					if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil {
						return "", "", fmt.Errorf("cgroup %s: %w", f, err)
					}
				}
			}
		}
	}
	return root, filepath.Join(v2[0], root), nil
}

// removeCgroupTree removes dir and every cgroup below it, children first,
// killing what still runs there (a node's processes are gone by now; this
// catches stragglers) and retrying while the kernel empties them.
func removeCgroupTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroupTree(filepath.Join(dir, e.Name())))
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			break
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w (still in it: %q)", dir, err, strings.Fields(string(procs))))
			break
		}
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, p := range strings.Fields(string(procs)) {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return errors.Join(errs...)
}

// makeMountpoints creates the machine-side mount points of nodeBinds that
// do not exist (recorded, so lab down removes them again).
func makeMountpoints(r *realNodes) error {
	for _, b := range nodeBinds {
		var missing []string
		for d := b.target; d != "/"; d = filepath.Dir(d) {
			if _, err := os.Stat(d); err == nil {
				break
			}
			missing = append(missing, d)
		}
		slices.Reverse(missing)
		for _, d := range missing {
			if err := os.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("mount point %s: %w", d, err)
			}
			r.Mountpoints = append(r.Mountpoints, d)
			if err := r.save(); err != nil {
				return err
			}
		}
	}
	return nil
}

// downRealNodes removes the real nodes' cgroups and the mount points lab
// up created (lab down, after the nodes' processes; idempotent). Without
// the record, the lanekit-lab cgroup trees under the caller's cgroup go.
func downRealNodes(say func(string, ...any)) error {
	var r realNodes
	data, err := os.ReadFile(realNodesFile())
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("%s: %w", realNodesFile(), err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	var errs []error
	trees := 0
	if base, err := selfCgroup(); err == nil {
		v1, v2, _ := cgroupHierarchies()
		for _, h := range append(v1, v2...) {
			if d := filepath.Join(h, base, "lanekit-lab"); dirExists(d) {
				trees++
				errs = append(errs, removeCgroupTree(d))
			}
		}
	}
	for _, d := range slices.Backward(r.Cgroups) {
		if err := removeCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range slices.Backward(r.Mountpoints) {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove mount point %s: %w", d, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if len(r.Cgroups)+len(r.Mountpoints)+trees > 0 {
		say("lab down: removed the real nodes' cgroups (%d recorded, %d lanekit-lab trees) and %d mount points", len(r.Cgroups), trees, len(r.Mountpoints))
	}
	if err := os.Remove(realNodesFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func dirExists(d string) bool {
	st, err := os.Stat(d)
	return err == nil && st.IsDir()
}

// nodeSpecFile is where startNodeInit writes the NodeSpec of the node whose
// RealNodeDir is dir.
func nodeSpecFile(dir string) string { return filepath.Join(dir, "node.json") }

// startNodeInit runs `lanekit lab node --spec FILE` for node i: in the
// node's network namespace and its cgroup2 directory (spec.Cgroup2), as PID 1 of a
// new PID namespace with a new mount namespace.
func startNodeInit(ctx context.Context, b Bins, spec NodeSpec) (int, error) {
	i := spec.Index
	specFile := nodeSpecFile(spec.Dir)
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(specFile, data, 0o644); err != nil {
		return 0, err
	}
	pid, err := startNodeDaemon(NodeNS(i), spec.Cgroup2, filepath.Join(NodeDir(i), "node"), b.Self, "lab", "node", "--spec", specFile)
	if err != nil {
		return pid, fmt.Errorf("start node %s: %w", NodeNS(i), err)
	}
	return pid, nil
}

// startNodeDaemon is startDaemonIn for a node's init: the child is cloned
// into a new PID and mount namespace (nsenter then only joins the network
// namespace and executes bin, which stays PID 1).
func startNodeDaemon(ns, cgroup, base, bin string, args ...string) (int, error) {
	nsexec.CloseInheritedOnExec()
	logf, err := os.OpenFile(base+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cg, err := os.Open(cgroup)
	if err != nil {
		return 0, err
	}
	defer cg.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + netnsPath(ns), "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	go cmd.Wait() //nolint:errcheck // reaps the child; its status is in the log
	pid := cmd.Process.Pid
	return pid, os.WriteFile(base+".pid", []byte(strconv.Itoa(pid)+"\n"), 0o644)
}

// RealNodeAgentSocket is node i's lanekit agent socket as the machine
// reaches it: the DaemonSet's hostPath /run/lanekit is in the node's own
// /run, seen through its init's root.
func RealNodeAgentSocket(i int) (string, error) {
	return NodeRunFile(i, "lanekit/agent.sock")
}
