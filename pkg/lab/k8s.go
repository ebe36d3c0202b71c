package lab

// `lab up --k8s`: a real control plane (etcd + kube-apiserver built from Go
// modules, internal/k8stest) on the underlay in the lk-wire namespace, a Node
// object per lab node (spec.podCIDR = the node's lanekit range, InternalIP =
// its underlay address), agents started with --kubeconfig/--node-name
// (their pod CIDR and the routes to the other nodes come from the Nodes: no
// static pod routes), and a lab kubelet per node (kubelet.go). The lab's
// lanekit pods are Pod objects the kubelets attach.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// The control plane's place in the lab.
const (
	K8sDir     = RunDir + "/k8s"
	Kubeconfig = K8sDir + "/kubeconfig"
	// APIAddress is the API server's address on the underlay bridge.
	APIAddress = "10.77.0.254"
	// PodNamespace is where the lab creates its pods.
	PodNamespace = "default"
	// ServiceCIDR6 is the IPv6 Service range of a dual-stack lab (beside
	// ServiceCIDR; a /108, the largest the API server accepts).
	ServiceCIDR6 = "fd00:96::/108"
)

// serviceCIDRs is --service-cluster-ip-range: both families in a
// dual-stack lab, IPv4 first (the primary family). An IPv6-only lab keeps
// the IPv4 range as the primary too: the API server's advertise address
// (APIAddress, on the IPv4 underlay) must be of the primary family; its
// Services ask for IPv6 (ipFamilies [IPv6]).
func serviceCIDRs(family, v4 string) string {
	if v4 == "" {
		v4 = ServiceCIDR
	}
	if family == IPFamilyDual || family == IPFamilyIPv6 {
		return v4 + "," + ServiceCIDR6
	}
	return v4
}

// checkServiceCIDR validates --service-cidr: an IPv4 range from /12 (the
// widest the API server takes) to /16 that holds ServiceCIDR, where the
// lab's fixed Service addresses (cluster DNS, the bench's VIPs) are.
func (c Config) checkServiceCIDR() error {
	if c.ServiceCIDR == "" {
		return nil
	}
	if !c.K8s {
		return errors.New("--service-cidr needs --k8s")
	}
	p, err := netip.ParsePrefix(c.ServiceCIDR)
	lab := netip.MustParsePrefix(ServiceCIDR)
	switch {
	case err != nil:
		return fmt.Errorf("--service-cidr %q: %w", c.ServiceCIDR, err)
	case !p.Addr().Is4() || p != p.Masked():
		return fmt.Errorf("--service-cidr %s: want an IPv4 CIDR without host bits", p)
	case p.Bits() < 12 || p.Bits() > lab.Bits() || !p.Contains(lab.Addr()):
		return fmt.Errorf("--service-cidr %s: want /12 to /%d holding %s (the lab's fixed Service addresses)", p, lab.Bits(), ServiceCIDR)
	}
	return nil
}

// serviceCapacity is how many ClusterIPs the IPv4 range of --service-cluster-ip-range
// (srv.ServiceCIDR) holds: its addresses less the network and broadcast ones.
func serviceCapacity(cidrs string) (int, error) {
	p, err := netip.ParsePrefix(strings.Split(cidrs, ",")[0])
	if err != nil || !p.Addr().Is4() {
		return 0, fmt.Errorf("the lab API server's service range %q: want IPv4 first", cidrs)
	}
	return 1<<(32-p.Bits()) - 2, nil
}

// K8s returns the lab's API server and an admin client that reaches it
// from the caller's network namespace.
func K8s() (*k8stest.Server, kubernetes.Interface, error) {
	beforeLab()
	srv, err := k8stest.Load(K8sDir)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errNoLabK8s, err)
	}
	c, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		return nil, nil, err
	}
	return srv, c, nil
}

// upK8s starts the control plane on the underlay and registers the nodes.
func upK8s(ctx context.Context, cfg Config) (kubernetes.Interface, error) {
	if _, _, err := k8stest.Bins(); err != nil {
		return nil, err
	}
	// On the routed underlay APIAddress is the router's own (RouterIP, on
	// every port as they are added): the server binds it on lo before any.
	dev, plen := WireBridge, "/24"
	if cfg.underlay() == UnderlayRouted {
		dev, plen = "lo", "/32"
	}
	if err := ip(ctx, "-n", WireNS, "addr", "add", APIAddress+plen, "dev", dev); err != nil {
		return nil, fmt.Errorf("api server address: %w", err)
	}
	progress(cfg.Out, "lab: kube-apiserver %s + etcd %s on %s (%s)", k8stest.KubeVersion, k8stest.EtcdVersion, APIAddress, WireNS)
	srv, err := k8stest.Start(ctx, k8stest.Options{Dir: K8sDir, Netns: netnsPath(WireNS), Address: APIAddress, ServiceCIDR: serviceCIDRs(cfg.IPFamily, cfg.ServiceCIDR), Cluster: cfg.Kubelet})
	if err != nil {
		return nil, err
	}
	if err := srv.WriteKubeconfig(Kubeconfig); err != nil {
		return nil, err
	}
	c, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		return nil, err
	}
	for i := 1; i <= cfg.Nodes && !cfg.Kubelet; i++ { // real kubelets register themselves
		if err := registerNode(ctx, c, i, cfg.IPFamily); err != nil {
			return nil, err
		}
	}
	// KubeVirt's VMI type (no KubeVirt controllers): the agents watch VMIs.
	// With --kubevirt, virt-operator installs KubeVirt's own CRDs (it fails
	// on one it did not create).
	if !cfg.KubeVirt {
		if err := k8stest.InstallKubeVirtCRD(ctx, srv.RESTConfig()); err != nil {
			return nil, err
		}
	}
	// Pods need their namespace's default ServiceAccount only with the
	// admission plugin, which is off; the namespace itself exists.
	return c, nil
}

// registerNode creates node i's Node as kubelet and the node IPAM
// controller would leave it: pod CIDRs, InternalIPs (one of each family
// when dual), Ready. An IPv6-only node has only its IPv6 pod CIDR (the
// agent takes it from the Node and runs IPv6-only) and keeps both
// InternalIPs (its IPv4 underlay address reaches the API server).
func registerNode(ctx context.Context, c kubernetes.Interface, i int, family string) error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: KubeNodeName(i), Labels: map[string]string{
			"kubernetes.io/hostname": KubeNodeName(i), "kubernetes.io/os": "linux"}},
		Spec: corev1.NodeSpec{PodCIDR: PodCIDR(i), PodCIDRs: []string{PodCIDR(i)}},
	}
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: UnderlayIP(i)}}
	switch family {
	case IPFamilyDual:
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, PodCIDR6(i))
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: UnderlayIP6(i)})
	case IPFamilyIPv6:
		n.Spec.PodCIDR, n.Spec.PodCIDRs = PodCIDR6(i), []string{PodCIDR6(i)}
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: UnderlayIP6(i)})
	}
	out, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	out.Status = corev1.NodeStatus{
		Addresses:  append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name}),
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "LabKubelet"}},
	}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", n.Name, err)
	}
	return nil
}

// KubeletPIDFile and KubeletLog are node i's lab kubelet files.
func KubeletPIDFile(i int) string { return filepath.Join(NodeDir(i), "kubelet.pid") }

// KubeletLog is node i's lab kubelet log.
func KubeletLog(i int) string { return filepath.Join(NodeDir(i), "kubelet.log") }

// startKubelet runs `lanekit lab kubelet --node i` detached in node i's
// namespace (it reaches the API server over the underlay).
func startKubelet(b Bins, i int) (int, error) {
	if b.Self == "" {
		return 0, fmt.Errorf("lab kubelet: the lanekit CLI path is unknown")
	}
	pid, err := startDaemon(NodeNS(i), filepath.Join(NodeDir(i), "kubelet"), b.Self, "lab", "kubelet", "--node", strconv.Itoa(i))
	if err != nil {
		return pid, fmt.Errorf("start lab kubelet on %s: %w", NodeNS(i), err)
	}
	return pid, nil
}

// createLabPod creates a lanekit pod on node i through the API and waits
// until its kubelet reports the IP.
func createLabPod(ctx context.Context, c kubernetes.Interface, i, j int) (Pod, error) {
	name := fmt.Sprintf("n%d-p%d", i, j)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: PodNamespace, Labels: map[string]string{"app": "lab", "lab.lanekit.io/node": strconv.Itoa(i)}},
		Spec: corev1.PodSpec{NodeName: KubeNodeName(i), Containers: []corev1.Container{{
			Name: "echo", Image: "lanekit/lab-echo", Ports: []corev1.ContainerPort{{Name: "echo", ContainerPort: 5201}}}}},
	}
	created, err := c.CoreV1().Pods(PodNamespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return Pod{}, fmt.Errorf("create pod %s: %w", name, err)
	}
	podIPs, err := WaitPodIPs(ctx, c, PodNamespace, name, 60*time.Second)
	if err != nil {
		return Pod{}, fmt.Errorf("pod %s: %w; kubelet log: %s", name, err, logTail(KubeletLog(i)))
	}
	lp := Pod{NS: PodNetns(i, created.UID), Kind: KindLanekit}
	for _, a := range podIPs { // IPv4 first (dual-stack); an IPv6-only node's pod has only IPv6
		if strings.Contains(a, ":") {
			lp.IP6 = a
		} else {
			lp.IP = a
		}
	}
	return lp, nil
}

// WaitPodIPs waits until the Pod's status has its IPs (status.podIPs:
// primary family first).
func WaitPodIPs(ctx context.Context, c kubernetes.Interface, ns, name string, timeout time.Duration) ([]string, error) {
	if _, err := WaitPodIP(ctx, c, ns, name, timeout); err != nil {
		return nil, err
	}
	p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range p.Status.PodIPs {
		out = append(out, a.IP)
	}
	if len(out) == 0 {
		out = []string{p.Status.PodIP}
	}
	return out, nil
}

// WaitPodIP waits until the Pod's status has an IP.
func WaitPodIP(ctx context.Context, c kubernetes.Interface, ns, name string, timeout time.Duration) (string, error) {
	var got string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p.Status.PodIP
		return got != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("no pod IP after %s: %w", timeout, err)
	}
	return got, nil
}

// downK8s stops the control plane (lab down; idempotent).
func downK8s() {
	if srv, err := k8stest.Load(K8sDir); err == nil {
		srv.Stop()
	}
}
