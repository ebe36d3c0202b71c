package lab

// Cilium on the real-node lab (`lab up --k8s --kubelet --cni cilium`): the
// agent, operator and CNI plugin built from github.com/cilium/cilium
// (scripts/k8s-node-bins.sh), their images from internal/tools/lkimages, and
// the install its users run: its Helm chart (from the same module) rendered
// with `helm template` and applied. What differs from a stock install, and
// why, is in ciliumValues.

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// CNICilium is the --cni value of Cilium.
const CNICilium = "cilium"

// The Cilium the lab runs (scripts/k8s-node-bins.sh CILIUM_VERSION) and the
// image names its chart renders (lkimages writes them).
const (
	ciliumVersion       = "v1.19.0"
	ciliumImageRepo     = "quay.io/cilium/cilium"
	ciliumOperatorRepo  = "quay.io/cilium/operator"
	ciliumNamespace     = "kube-system"
	ciliumChartSubdir   = "cilium/chart" // in the node binaries' directory
	ciliumAgentDS       = "cilium"
	ciliumOperatorDeplo = "cilium-operator"
)

// ciliumValues are the chart values of the lab's Cilium. Kube-proxy
// replacement, native routing with direct node routes (or VXLAN with
// --routing tunnel), BPF masquerading and the podCIDRs kube-controller-manager
// allocates (ipam kubernetes), as a kube-proxy-free install runs. Differences
// from a stock install, each forced by the machine or the lab:
//   - l7Proxy and envoy off: Envoy (C++) cannot be built here, so no L7
//     policy, no Ingress/Gateway API;
//   - hubble and the endpoint health checks (cilium-health-responder) off;
//   - socket LB for the node's host-network processes only
//     (socketLB.hostNamespaceOnly, as Cilium runs beside Istio): pods'
//     Service connections are translated per packet at their veth
//     (bpf_lxc), not at connect(). The bench runs its tools in the pods'
//     network namespaces from the machine, outside the node's cgroup, where
//     a pod-wide socket LB would not see them; lanekit's rows are per
//     packet at the pod too. The socket LB is attached to the node's own
//     cgroup2 directory (cgroup.hostRoot: the lab binds it at
//     /run/lanekit/cgroupv2 in the node), never to a cgroup2 root holding
//     the machine's processes; cgroup.autoMount off (nothing mounted in the
//     machine's namespaces);
//   - sysctlfix off: it writes /etc/sysctl.d through PID 1's mount namespace,
//     which would be the machine's /etc; the agent's own sysctl writes land
//     in the node's network namespace or on the node's fenced files
//     (kernelTunables);
//   - the containers' capabilities are the chart's less those the machine's
//     bounding set lacks (this one has no CAP_SYS_RESOURCE, which the agent
//     and clean-cilium-state ask for: runc refuses to start them);
//   - the images are the lab's (pullPolicy Never, no digests).
func ciliumValues(routing string, srv *k8stest.Server) map[string]any {
	v := map[string]any{
		"kubeProxyReplacement": true,
		"k8sServiceHost":       srv.Address,
		"k8sServicePort":       srv.APIPort,
		"ipam":                 map[string]any{"mode": "kubernetes"},
		"ipv4":                 map[string]any{"enabled": true},
		"ipv6":                 map[string]any{"enabled": false},
		"bpf":                  map[string]any{"masquerade": true},
		"l7Proxy":              false,
		"envoy":                map[string]any{"enabled": false},
		"hubble":               map[string]any{"enabled": false},
		// The agent's metrics (off in a stock install, on in most), with
		// its BPF map reconcilers' write times: the bench reads the load
		// balancer's beside its own first-answer time (proxymetrics.go).
		"prometheus": map[string]any{"enabled": true, "port": ciliumMetricsPort,
			"metrics": []string{"+" + ciliumReconcilerDur}},
		"endpointHealthChecking": map[string]any{"enabled": false},
		"socketLB":               map[string]any{"enabled": true, "hostNamespaceOnly": true},
		"cgroup":                 map[string]any{"autoMount": map[string]any{"enabled": false}, "hostRoot": CgroupMount},
		"sysctlfix":              map[string]any{"enabled": false},
		// The node's one device: its netns has no default route, from which
		// the agent would pick it.
		"devices":  Uplink,
		"nodePort": map[string]any{"directRoutingDevice": Uplink},
		"securityContext": map[string]any{"capabilities": map[string]any{
			"ciliumAgent":      boundedCaps(ciliumAgentCaps),
			"cleanCiliumState": boundedCaps(ciliumCleanStateCaps),
		}},
		"image": map[string]any{"repository": ciliumImageRepo, "tag": ciliumVersion, "useDigest": false,
			"pullPolicy": "Never"},
		"operator": map[string]any{"replicas": 1, "image": map[string]any{"repository": ciliumOperatorRepo,
			"tag": ciliumVersion, "useDigest": false, "pullPolicy": "Never"}},
	}
	if routing == RoutingTunnel {
		v["routingMode"] = "tunnel"
		v["tunnelProtocol"] = "vxlan"
	} else {
		v["routingMode"] = "native"
		v["ipv4NativeRoutingCIDR"] = ClusterCIDR
		v["autoDirectNodeRoutes"] = true
	}
	return v
}

// The chart's default capabilities (values.yaml securityContext.capabilities;
// TestCiliumChartRender compares them with the chart).
var (
	ciliumAgentCaps = []string{"CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_MODULE", "SYS_ADMIN",
		"SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID", "SYSLOG"}
	ciliumCleanStateCaps = []string{"NET_ADMIN", "SYS_MODULE", "SYS_ADMIN", "SYS_RESOURCE"}
)

// boundedCaps returns the capabilities (names without CAP_) that are in
// this process's bounding set: a container cannot get more than the node.
func boundedCaps(caps []string) []string {
	var out []string
	for _, c := range caps {
		if v, ok := capNumbers[c]; !ok || inBoundingSet(v) {
			out = append(out, c)
		}
	}
	return out
}

// capNumbers are the capabilities the chart asks for.
var capNumbers = map[string]uintptr{"CHOWN": unix.CAP_CHOWN, "KILL": unix.CAP_KILL, "NET_ADMIN": unix.CAP_NET_ADMIN,
	"NET_RAW": unix.CAP_NET_RAW, "IPC_LOCK": unix.CAP_IPC_LOCK, "SYS_MODULE": unix.CAP_SYS_MODULE,
	"SYS_ADMIN": unix.CAP_SYS_ADMIN, "SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"FOWNER": unix.CAP_FOWNER, "SETGID": unix.CAP_SETGID, "SETUID": unix.CAP_SETUID, "SYSLOG": unix.CAP_SYSLOG}

func inBoundingSet(c uintptr) bool {
	r, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, c, 0, 0, 0)
	return err != nil || r == 1 // unknown: leave it to runc
}

// renderCilium renders Cilium's chart (a directory) with the lab's values
// (`helm template`, the objects `helm install` would create).
func renderCilium(ctx context.Context, helm, chart, routing string, srv *k8stest.Server) ([]byte, error) {
	values, err := yaml.Marshal(ciliumValues(routing, srv))
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "lanekit-cilium-values-*.yaml")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(values); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm, "template", "cilium", chart,
		"--namespace", ciliumNamespace, "--kube-version", nodeKubeVersion, "--values", f.Name())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template cilium: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// installCilium renders and applies Cilium's chart and waits for its agents
// and operator.
func installCilium(ctx context.Context, r rival, st *State, nodeBins string, b Bins, srv *k8stest.Server, kc kubernetes.Interface, out io.Writer) error {
	m, err := renderCilium(ctx, filepath.Join(b.Dir, "helm"), filepath.Join(nodeBins, ciliumChartSubdir), r.Routing, srv)
	if err != nil {
		return err
	}
	if _, err := kubectl(ctx, nodeBins, m, "apply", "-f", "-"); err != nil {
		return err
	}
	if err := waitDaemonSet(ctx, kc, ciliumNamespace, ciliumAgentDS, len(st.Nodes)); err != nil {
		return fmt.Errorf("%w (agent logs: %s)", err, ciliumLogHint)
	}
	if err := waitDeployment(ctx, kc, ciliumNamespace, ciliumOperatorDeplo); err != nil {
		return err
	}
	mode := "native routing"
	if r.Routing == RoutingTunnel {
		mode = "VXLAN"
	}
	progress(out, "lab: Cilium %s (kube-proxy replacement, %s, no Envoy) Ready on every node", ciliumVersion, mode)
	return nil
}

// ciliumLogHint says where the agents' logs are.
var ciliumLogHint = "kubectl -n " + ciliumNamespace + " logs ds/" + ciliumAgentDS + "; " +
	"the nodes' containers: " + filepath.Join(NodeDir(1), "node") + "/log-containers"

// ciliumDbg runs cilium-dbg in node i's agent pod (kubectl exec).
func ciliumDbg(ctx context.Context, kc kubernetes.Interface, nodeBins string, i int, args ...string) (string, error) {
	pods, err := kc.CoreV1().Pods(ciliumNamespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=cilium",
		FieldSelector: "spec.nodeName=" + KubeNodeName(i)})
	if err != nil {
		return "", err
	}
	if len(pods.Items) != 1 {
		return "", fmt.Errorf("node %s: %d Cilium agent pods", NodeNS(i), len(pods.Items))
	}
	return kubectl(ctx, nodeBins, nil, append([]string{"-n", ciliumNamespace, "exec", pods.Items[0].Name,
		"-c", "cilium-agent", "--", "cilium-dbg"}, args...)...)
}
