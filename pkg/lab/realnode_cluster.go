package lab

// The cluster side of lab up --kubelet: kube-controller-manager and
// kube-scheduler beside the API server, the nodes' configuration, lanekit
// installed with `kubectl apply -k` and CoreDNS.

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// Cluster settings of the real-node lab.
const (
	// ClusterCIDR holds every node's pod range (kube-controller-manager
	// allocates one /24 per node from it).
	ClusterCIDR = "10.244.0.0/16"
	// ClusterCIDR6 is a dual-stack lab's IPv6 cluster CIDR (a /64 per
	// node from it).
	ClusterCIDR6 = "fd00:10:244::/56"
	// WireIP6 is the underlay namespace's IPv6 address in a dual-stack
	// real-node lab (the API server and the e2e runner reach the nodes' and
	// pods' IPv6 addresses from there).
	WireIP6 = "fd00:77::fe"
	// ClusterDNS is CoreDNS's Service address; ClusterDomain its zone.
	ClusterDNS    = "10.96.0.10"
	ClusterDomain = "cluster.local"
	// LanekitNamespace is where deploy/ installs lanekit.
	LanekitNamespace = "lanekit-system"
	// realNodeTimeout bounds each wait of lab up --kubelet.
	realNodeTimeout = 4 * time.Minute
)

//go:embed manifests/coredns.yaml
var corednsManifest []byte

// upRealNodes brings up the control plane's controllers, the real nodes,
// lanekit and CoreDNS (lab up --k8s --kubelet; the underlay, the API server
// and the node namespaces exist).
func upRealNodes(ctx context.Context, cfg Config, st *State, kc kubernetes.Interface) error {
	nodeBins, err := CheckNodeBins()
	if err != nil {
		return err
	}
	if err := cfg.Bins.checkImages(); err != nil {
		return err
	}
	rv, isRival, err := rivalFor(cfg.CNI, cfg.routing())
	if err != nil {
		return err
	}
	if isRival {
		if err := checkRivalInputs(rv, nodeBins, cfg.Bins); err != nil {
			return err
		}
	}
	// The nodes import the KubeVirt images beside the others.
	extraImages := rv.Images
	var kvDir string
	if cfg.KubeVirt {
		if kvDir, err = CheckKubeVirt(cfg.Bins); err != nil {
			return err
		}
		extraImages = append(slices.Clone(extraImages), KubeVirtImages...)
	}
	srv, err := k8stest.Load(K8sDir)
	if err != nil {
		return err
	}
	r := &realNodes{}
	if err := r.save(); err != nil {
		return err
	}
	if err := makeMountpoints(r); err != nil {
		return err
	}
	dual := st.Dual()
	if err := startControllers(nodeBins, srv, dual); err != nil {
		return err
	}
	if dual {
		if err := sysctl(ctx, WireNS, "net.ipv6.conf.all.disable_ipv6", "0"); err != nil {
			return err
		}
		if err := ip(ctx, "-n", WireNS, "-6", "addr", "add", WireIP6+"/64", "dev", WireBridge, "nodad"); err != nil {
			return fmt.Errorf("underlay IPv6 address: %w", err)
		}
	}
	progress(cfg.Out, "lab: kube-controller-manager and kube-scheduler on %s", WireNS)
	for k := range st.Nodes {
		n := &st.Nodes[k]
		cgroup2, err := writeNodeConfig(r, n.Index, nodeBins)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.NS, err)
		}
		pid, err := startNodeInit(ctx, cfg.Bins, NodeSpec{Index: n.Index, Dir: RealNodeDir(n.Index),
			NodeBins: nodeBins, Images: cfg.Bins.ImagesDir(), Cgroup2: cgroup2, NodeIP6: n.UnderlayIP6, RivalImages: extraImages,
			Zone: cfg.zone(n.Index)})
		n.KubeletPID = pid
		if serr := st.save(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
		progress(cfg.Out, "lab: node %s: containerd + kubelet %s (node init pid %d, logs %s)", n.NS, nodeKubeVersion, pid, RealNodeDir(n.Index))
	}
	for _, n := range st.Nodes {
		if err := waitNodeRegistered(ctx, kc, n.Index); err != nil {
			return err
		}
	}
	switch {
	case isRival:
		progress(cfg.Out, "lab: %d nodes registered; installing %s, no lanekit", len(st.Nodes), cfg.CNI)
		if err := installRival(ctx, rv, st, nodeBins, cfg.Bins, srv, kc, cfg.Out); err != nil {
			return err
		}
	case cfg.install() == InstallHelm:
		progress(cfg.Out, "lab: %d nodes registered; installing lanekit with the Helm commands of %s", len(st.Nodes), InstallDoc)
		if err := installLanekitHelm(ctx, filepath.Dir(cfg.Bins.DeployDir()), srv); err != nil {
			return err
		}
	default:
		progress(cfg.Out, "lab: %d nodes registered; installing lanekit (kubectl apply -k %s)", len(st.Nodes), cfg.Bins.DeployDir())
		if err := installLanekit(ctx, nodeBins, cfg.Bins.DeployDir(), srv, cfg.LBPool, cfg.routing()); err != nil {
			return err
		}
	}
	if !isRival {
		if err := waitDaemonSet(ctx, kc, LanekitNamespace, "lanekit-agent", len(st.Nodes)); err != nil {
			return err
		}
	}
	for k := range st.Nodes {
		n := &st.Nodes[k]
		node, err := waitNodeReady(ctx, kc, n.Index)
		if err != nil {
			return err
		}
		n.PodCIDR = node.Spec.PodCIDR
		// The underlay routes each node's pod range to the node, as a
		// cluster's network does: the API server answers pods (the
		// kubernetes Service) and reaches them (its pod and service proxy).
		// Not on the routed underlay, whose router knows no pod CIDR.
		if cfg.underlay() == UnderlayRouted {
			continue
		}
		if err := ip(ctx, "-n", WireNS, "route", "replace", n.PodCIDR, "via", n.UnderlayIP); err != nil {
			return fmt.Errorf("route to %s's pods: %w", n.NS, err)
		}
		if dual {
			if n.PodCIDR6 = nodePodCIDR6(node); n.PodCIDR6 == "" {
				return fmt.Errorf("node %s: no IPv6 pod CIDR in spec.podCIDRs %v", n.NS, node.Spec.PodCIDRs)
			}
			if err := ip(ctx, "-n", WireNS, "-6", "route", "replace", n.PodCIDR6, "via", n.UnderlayIP6); err != nil {
				return fmt.Errorf("IPv6 route to %s's pods: %w", n.NS, err)
			}
		}
	}
	if err := st.save(); err != nil {
		return err
	}
	progress(cfg.Out, "lab: %s Ready on every node; nodes Ready", map[bool]string{false: "lanekit agents", true: cfg.CNI}[isRival])
	if _, err := kubectl(ctx, nodeBins, corednsManifest, "apply", "-f", "-"); err != nil {
		return err
	}
	if err := waitDeployment(ctx, kc, "kube-system", "coredns"); err != nil {
		return err
	}
	progress(cfg.Out, "lab: CoreDNS %s Ready (%s, zone %s only)", nodeCorednsVersion, ClusterDNS, ClusterDomain)
	if cfg.KubeVirt {
		if err := installKubeVirt(ctx, cfg, len(st.Nodes), nodeBins, kvDir, kc); err != nil {
			return err
		}
	}
	return nil
}

// startControllers starts kube-controller-manager and kube-scheduler in the
// underlay namespace beside the API server (pid files in K8sDir).
func startControllers(nodeBins string, srv *k8stest.Server, dual bool) error {
	// Dual-stack: a cluster CIDR and a node mask per family (the single
	// --node-cidr-mask-size is refused beside two cluster CIDRs); the
	// Service ranges are the API server's (srv.ServiceCIDR).
	args := []string{
		"--kubeconfig=" + Kubeconfig,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
		"--allocate-node-cidrs",
		"--cluster-cidr=" + ClusterCIDR, "--node-cidr-mask-size=24",
		"--service-cluster-ip-range=" + srv.ServiceCIDR,
		"--service-account-private-key-file=" + filepath.Join(srv.Dir, "sa.key"),
		"--root-ca-file=" + srv.CAFile(),
		"--use-service-account-credentials=false",
		"--v=1",
	}
	if dual {
		args[4], args[5] = "--cluster-cidr="+ClusterCIDR+","+ClusterCIDR6, "--node-cidr-mask-size-ipv4=24"
		args = append(args, "--node-cidr-mask-size-ipv6=64")
	}
	if _, err := startDaemon(WireNS, filepath.Join(K8sDir, "kube-controller-manager"), filepath.Join(nodeBins, "kube-controller-manager"), args...); err != nil {
		return err
	}
	_, err := startDaemon(WireNS, filepath.Join(K8sDir, "kube-scheduler"), filepath.Join(nodeBins, "kube-scheduler"),
		"--kubeconfig="+Kubeconfig, "--bind-address=127.0.0.1", "--leader-elect=false", "--v=1")
	return err
}

// writeNodeConfig writes node i's containerd and kubelet configuration
// (paths as the node sees them: its directory at nodeMount) and creates
// its cgroups; it returns the node's cgroup2 directory.
func writeNodeConfig(r *realNodes, i int, nodeBins string) (string, error) {
	d := RealNodeDir(i)
	if err := os.MkdirAll(filepath.Join(d, "etc"), 0o755); err != nil {
		return "", err
	}
	cgroupRoot, cgroup2, err := makeKubeletCgroups(r, i)
	if err != nil {
		return "", err
	}
	kubeconfig, err := os.ReadFile(Kubeconfig)
	if err != nil {
		return "", err
	}
	files := map[string]string{
		"containerd.toml": containerdConfig(nodeBins),
		"kubelet.yaml":    kubeletConfig(i, cgroupRoot),
		"kubeconfig":      string(kubeconfig),
		// kubelet's resolv.conf (pods with dnsPolicy Default, the search
		// path of the others): no upstream resolver in the lab.
		"resolv.conf": "# lanekit lab node: cluster DNS only, no upstream resolver\noptions ndots:5\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(d, "etc", name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return cgroup2, nil
}

// containerdConfig is a node's containerd configuration: CRI with runc from
// the node binaries, cgroupfs, CNI from the node's /opt/cni/bin and
// /etc/cni/net.d, pause as the sandbox image, nothing outside the node's
// directories.
func containerdConfig(nodeBins string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = "/run/containerd"
# /opt/containerd would be the machine's.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.2"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # kubelet asks for negative oom_score_adj values (pause -998, critical
  # pods -997); without CAP_SYS_RESOURCE (a sandboxed machine) runc cannot
  # lower it below containerd's own: clamp there instead of failing.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    use_internal_loopback = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
`, filepath.Join(nodeMount, "containerd"), filepath.Join(nodeBins, "runc"))
}

// kubeletConfig is node i's KubeletConfiguration: cgroupfs on cgroup v1
// (failCgroupV1 false) with the pods' cgroups under cgroupRoot, its own
// resolv.conf, CoreDNS as the cluster DNS, and every directory kubelet
// writes inside the node's bind mounts.
func kubeletConfig(i int, cgroupRoot string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: %q
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: %q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# The API server (the only client of this port) reaches it on the underlay.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS: [%q]
clusterDomain: %q
resolvConf: %q
podLogsDir: /var/lib/kubelet/pod-logs
volumePluginDir: /var/lib/kubelet/volume-plugins
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, cgroupRoot, UnderlayIP(i), ClusterDNS, ClusterDomain, filepath.Join(nodeMount, "etc", "resolv.conf"))
}

// kubectl runs the node binaries' kubectl with the admin kubeconfig in the
// underlay namespace (where the API server's address is).
func kubectl(ctx context.Context, nodeBins string, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsPath(WireNS), "--",
		filepath.Join(nodeBins, "kubectl"), "--kubeconfig", Kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// installLanekit installs deploy/ the way a user does, `kubectl apply -k`,
// through an overlay that sets only what a cluster without kube-proxy must
// set: the API server's own address for the agents (the ConfigMap's
// k8s-service-host and k8s-service-port); with routing RoutingTunnel, the
// ConfigMap's routing-mode and tunnel-port (VXLAN between the nodes'
// InternalIPs, as an admin whose network cannot route pod CIDRs sets it). With lbPool (addresses in the
// pools' syntax: a CIDR or FIRST-LAST) it also applies deploy/lb as its
// comment says (the LB RBAC and the lanekit-lb-pools ConfigMap, its one pool
// set to lbPool) and turns on lb-ipam and l2-announce.
func installLanekit(ctx context.Context, nodeBins, deployDir string, srv *k8stest.Server, lbPool, routing string) error {
	if _, err := os.Stat(filepath.Join(deployDir, "kustomization.yaml")); err != nil {
		return fmt.Errorf("lanekit manifests: %w", err)
	}
	overlay := filepath.Join(K8sDir, "lanekit-overlay")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		return err
	}
	// kustomize takes a base only by a relative path.
	base, err := filepath.Rel(overlay, deployDir)
	if err != nil {
		return err
	}
	resources := "  - " + base + "\n"
	// VMs' DHCP offers the lab's CoreDNS as kubelet gives it to pods.
	cmKeys := fmt.Sprintf("        cluster-dns: %s\n        cluster-domain: %s\n", ClusterDNS, ClusterDomain)
	lbPoolPatch := ""
	if lbPool != "" {
		ranges, err := lbPoolRanges(lbPool)
		if err != nil {
			return err
		}
		if err := routeLBClients(ctx, ranges); err != nil {
			return err
		}
		resources += "  - " + filepath.Join(base, "lb") + "\n"
		cmKeys += "        lb-ipam: \"true\"\n        l2-announce: \"true\"\n"
		var addrs strings.Builder
		for _, r := range ranges {
			fmt.Fprintf(&addrs, "\n                - %s-%s", r.First, r.Last)
		}
		lbPoolPatch = fmt.Sprintf(`  - patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata:
        name: lanekit-lb-pools
        namespace: %s
      data:
        pools.yaml: |
          pools:
            - name: lab
              addresses:%s
`, LanekitNamespace, addrs.String())
	}
	if routing == RoutingTunnel {
		cmKeys += fmt.Sprintf("        routing-mode: %s\n        tunnel-port: \"%d\"\n", RoutingTunnel, TunnelPort)
	}
	kust := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
%spatches:
  - patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata:
        name: lanekit-config
        namespace: %s
      data:
        k8s-service-host: %q
        k8s-service-port: %q
%s%s`, resources, LanekitNamespace, srv.Address, strconv.Itoa(srv.APIPort), cmKeys, lbPoolPatch)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		return err
	}
	_, err = kubectl(ctx, nodeBins, nil, "apply", "-k", overlay)
	return err
}

// waitNodeRegistered waits for node i's kubelet to create its Node.
func waitNodeRegistered(ctx context.Context, c kubernetes.Interface, i int) error {
	err := wait.PollUntilContextTimeout(ctx, time.Second, realNodeTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Nodes().Get(ctx, KubeNodeName(i), metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not registered after %s: %w; node: %s; kubelet: %s", KubeNodeName(i), realNodeTimeout, err,
			logTail(filepath.Join(NodeDir(i), "node.log")), logTail(NodeLog(i, "kubelet")))
	}
	return nil
}

// waitNodeReady waits until node i is Ready with a pod CIDR.
func waitNodeReady(ctx context.Context, c kubernetes.Interface, i int) (*corev1.Node, error) {
	var node *corev1.Node
	err := wait.PollUntilContextTimeout(ctx, time.Second, realNodeTimeout, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, KubeNodeName(i), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		return n.Spec.PodCIDR != "" && nodeReady(n), nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s not Ready after %s: %w; kubelet: %s", KubeNodeName(i), realNodeTimeout, err, logTail(NodeLog(i, "kubelet")))
	}
	return node, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitDaemonSet waits until the DaemonSet has a Ready pod on each of n nodes.
func waitDaemonSet(ctx context.Context, c kubernetes.Interface, ns, name string, n int) error {
	var last *appsv1.DaemonSet
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, realNodeTimeout, true, func(ctx context.Context) (bool, error) {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = ds
		return int(ds.Status.NumberReady) == n && int(ds.Status.DesiredNumberScheduled) == n, nil
	})
	if err != nil {
		status := "not found"
		if last != nil {
			status = fmt.Sprintf("%d/%d ready", last.Status.NumberReady, last.Status.DesiredNumberScheduled)
		}
		return fmt.Errorf("daemonset %s/%s: %s after %s: %w; %s", ns, name, status, realNodeTimeout, err, podSummary(ctx, c, ns))
	}
	return nil
}

// waitDeployment waits until every replica of a Deployment is available.
func waitDeployment(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, realNodeTimeout, true, func(ctx context.Context) (bool, error) {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || d.Spec.Replicas == nil {
			return false, nil
		}
		return d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas, nil
	})
	if err != nil {
		return fmt.Errorf("deployment %s/%s not available after %s: %w; %s", ns, name, realNodeTimeout, err, podSummary(ctx, c, ns))
	}
	return nil
}

// podSummary describes a namespace's pods for error messages: phase,
// readiness, restarts and the last container state that is not running.
func podSummary(ctx context.Context, c kubernetes.Interface, ns string) string {
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "pods: " + err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, " [%s ready=%t restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
			if t := cs.LastTerminationState.Terminated; t != nil {
				fmt.Fprintf(&b, " last exit %d %s", t.ExitCode, t.Reason)
			}
			b.WriteString("]")
		}
		b.WriteString("; ")
	}
	return b.String()
}

// nodePodCIDR6 is a Node's IPv6 entry of spec.podCIDRs ("" when none).
func nodePodCIDR6(n *corev1.Node) string {
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() {
			return p.String()
		}
	}
	return ""
}
