package lab

// lab bench --cni: the pod rows of the real-node lab with each network
// plugin, lab after lab (bench.RunGroups brings each up and down in turn,
// every repetition), with the same pods and the same commands: three pods
// the scheduler places through the API server (a client and a server on node
// 1, a server on node 2), whose sandboxes' network namespaces the bench
// enters by name (ip netns attach) to run its tools there.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/pkg/bench"
)

// The pod rows of a real-node lab.
const (
	BenchPodSameNode  = "pod-same-node"
	BenchPodCrossNode = "pod-cross-node"
)

// benchPod is one of the bench's pods: its name, node and the netns name
// the machine sees its sandbox's network namespace under.
type benchPod struct {
	Name  string
	Node  int
	Netns string
}

// benchPods: the client and the same-node server on node 1, the
// cross-node server on node 2.
var benchPods = []benchPod{
	{Name: "bench-client", Node: 1, Netns: "lk-n1-x1"},
	{Name: "bench-local", Node: 1, Netns: "lk-n1-x2"},
	{Name: "bench-remote", Node: 2, Netns: "lk-n2-x1"},
}

// benchPodNamespace holds the bench pods (bench.PolicyNamespace too).
const benchPodNamespace = "default"

// benchPodLabels are every bench pod's labels.
var benchPodLabels = map[string]string{"app": "lanekit-bench"}

// RivalBenchGroups returns one group per --cni value: a 2-node real-node
// lab in that routing mode with the bench pods; with policies, the
// cross-node row again with each count of NetworkPolicies (networks that
// enforce them; only those rows with policiesOnly).
func RivalBenchGroups(bins Bins, cnis []string, routing string, policies []int, policiesOnly bool, out io.Writer) ([]bench.Group, error) {
	if len(cnis) == 0 {
		return nil, errors.New("--cni: name at least one network")
	}
	for _, n := range policies {
		if n < 0 || n > bench.MaxPolicies {
			return nil, fmt.Errorf("--policies %d: want 0..%d", n, bench.MaxPolicies)
		}
	}
	seen := map[string]bool{}
	var groups []bench.Group
	for _, c := range cnis {
		cfg := Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, CNI: c, Routing: routing, Bins: bins, Out: out}
		if err := cfg.checkCNI(); err != nil {
			return nil, err
		}
		if err := cfg.checkRouting(); err != nil {
			return nil, err
		}
		if seen[c] {
			return nil, fmt.Errorf("--cni %s named twice", c)
		}
		seen[c] = true
		if len(policies) > 0 && policiesOnly && !enforcesPolicy(c, routing) {
			return nil, fmt.Errorf("--policies-only: %s enforces no NetworkPolicy (flannel): leave it out", c)
		}
		groups = append(groups, bench.Group{Name: c,
			Up: func(ctx context.Context) ([]bench.Path, []string, error) {
				st, _, pods, err := upBenchLab(ctx, cfg)
				if err != nil {
					return nil, nil, err
				}
				paths := st.rivalBenchPaths(c, pods)
				if len(policies) == 0 {
					return paths, nil, nil
				}
				if !enforcesPolicy(c, routing) {
					return paths, []string{c + ": no policy rows (flannel enforces no NetworkPolicy)"}, nil
				}
				kc, err := fastClient()
				if err != nil {
					return nil, nil, err
				}
				rp := &rivalPolicies{kc: kc, clientNS: benchPods[0].Netns, serverIP: pods[benchPods[2].Name].Status.PodIP,
					timeout: 2 * time.Minute, current: -1}
				return rp.policyRows(c, policies, policiesOnly, paths), nil, nil
			},
			Down: func(ctx context.Context) error { return Down(ctx, DownOptions{Bins: bins}) },
		})
	}
	return groups, nil
}

// upBenchLab brings up cfg's real-node lab with the bench pods.
func upBenchLab(ctx context.Context, cfg Config) (*State, kubernetes.Interface, map[string]corev1.Pod, error) {
	st, err := Up(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	_, kc, err := K8s()
	if err != nil {
		return nil, nil, nil, err
	}
	pods, err := startBenchPods(ctx, kc, benchPods)
	if err != nil {
		return nil, nil, nil, err
	}
	if cfg.Out != nil {
		fmt.Fprintf(cfg.Out, "lab bench: %s lab up with its bench pods; load average %s\n", cfg.CNI, loadAverage())
	}
	return st, kc, pods, nil
}

// RunRivalServices measures the Service rows of each network's real-node
// lab, lab after lab (each up, its rows measured --repeat times, down),
// and returns their rows in one report (ratios are per repetition index:
// the labs are not interleaved).
func RunRivalServices(ctx context.Context, bins Bins, cnis []string, routing string, counts []int, o bench.SvcOptions, out io.Writer) (*bench.SvcReport, error) {
	var all *bench.SvcReport
	for _, c := range cnis {
		cfg := Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, CNI: c, Routing: routing, Bins: bins, Out: out}
		if err := cfg.checkCNI(); err != nil {
			return nil, err
		}
		rep, err := func() (*bench.SvcReport, error) {
			defer func() {
				if err := Down(context.WithoutCancel(ctx), DownOptions{Bins: bins}); err != nil && out != nil {
					fmt.Fprintf(out, "lab bench: %s lab down: %v\n", c, err)
				}
			}()
			st, _, pods, err := upBenchLab(ctx, cfg)
			if err != nil {
				return nil, err
			}
			// The services are written as fast as the API server takes them.
			fast, err := fastClient()
			if err != nil {
				return nil, err
			}
			prog := &APIProgrammer{Client: fast, Self: o.Self, ClientNS: benchPods[0].Netns, Workers: 16, Metrics: proxyScrapeFor(c)}
			rows, err := rivalServiceRows(c, counts, pods, prog, st.svcRaw())
			if err != nil {
				return nil, err
			}
			rep, err := bench.RunServices(ctx, rows, o)
			if out != nil {
				fmt.Fprintf(out, "lab bench: %s service rows done; load average %s\n", c, loadAverage())
			}
			return rep, err
		}()
		if err != nil {
			return nil, fmt.Errorf("%s lab: %w", c, err)
		}
		if all == nil {
			all = rep
		} else {
			all.Rows = append(all.Rows, rep.Rows...)
		}
	}
	all.Compute()
	return all, nil
}

// RivalCross are the cross-lab ratios of a --cni run: lanekit's pod rows
// (and policy rows, against the networks that enforce policy) against each
// rival's (same repetition).
func RivalCross(cnis []string, routing string, policies []int, policiesOnly bool) []bench.CrossRef {
	if !slices.Contains(cnis, CNILanekit) {
		return nil
	}
	var out []bench.CrossRef
	for _, c := range cnis {
		if c == CNILanekit {
			continue
		}
		var rows []string
		if !policiesOnly || len(policies) == 0 {
			rows = []string{BenchPodSameNode, BenchPodCrossNode}
		}
		if enforcesPolicy(c, routing) {
			for _, n := range policies {
				rows = append(rows, fmt.Sprintf("%s+%d-policies", BenchPodCrossNode, n))
			}
		}
		for _, p := range rows {
			out = append(out, bench.CrossRef{Path: p, Group: CNILanekit, Ref: p, RefGroup: c})
		}
	}
	return out
}

// fastClient is an admin client of the lab's API server without
// client-side rate limits (objects written as fast as the server takes them).
func fastClient() (kubernetes.Interface, error) {
	srv, _, err := K8s()
	if err != nil {
		return nil, err
	}
	rc := srv.RESTConfig()
	rc.QPS = -1
	return kubernetes.NewForConfig(rc)
}

// svcRaw is the lab's raw-host pair for the service rows' ceiling (nil:
// the lab has none).
func (s *State) svcRaw() *bench.SvcRaw {
	if len(s.Nodes) < 2 || s.Nodes[0].RawNS == "" || s.Nodes[1].RawNS == "" {
		return nil
	}
	return &bench.SvcRaw{ClientNS: s.Nodes[0].RawNS, ServerNS: s.Nodes[1].RawNS, ServerIP: s.Nodes[1].RawIP}
}

// rivalBenchPaths are a real-node lab's rows: host-raw, host, and the pod
// rows between the bench pods (pod IP by pod IP).
func (s *State) rivalBenchPaths(cni string, pods map[string]corev1.Pod) []bench.Path {
	n1, n2 := s.Nodes[0], s.Nodes[1]
	var paths []bench.Path
	if n1.RawNS != "" && n2.RawNS != "" {
		paths = append(paths, bench.Path{Name: bench.RawPath, ClientNS: n1.RawNS, ServerNS: n2.RawNS, ServerIP: n2.RawIP, Includes: IncludesRaw})
	}
	inc := IncludesLanekitPod
	if r, ok, _ := rivalFor(cni, s.Routing); ok {
		inc = r.podPath()
	}
	hostInc := bench.Includes{Detail: "node to node, the nodes' own rules"}
	paths = append(paths, bench.Path{Name: bench.HostPath, ClientNS: n1.NS, ServerNS: n2.NS, ServerIP: n2.UnderlayIP, Includes: hostInc})
	client := benchPods[0]
	for _, row := range []struct {
		name   string
		server benchPod
	}{{BenchPodSameNode, benchPods[1]}, {BenchPodCrossNode, benchPods[2]}} {
		paths = append(paths, bench.Path{Name: row.name, ClientNS: client.Netns, ServerNS: row.server.Netns,
			ServerIP: pods[row.server.Name].Status.PodIP, Includes: inc,
			Note: fmt.Sprintf("%s: real pods (containerd sandboxes) on %s", cni, strings.Join([]string{NodeNS(client.Node), NodeNS(row.server.Node)}, " -> "))})
	}
	return paths
}

// startBenchPods creates the bench pods, waits until they run and attaches
// their network namespaces under their Netns names.
func startBenchPods(ctx context.Context, kc kubernetes.Interface, pods []benchPod) (map[string]corev1.Pod, error) {
	for _, bp := range pods {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: bp.Name, Namespace: benchPodNamespace, Labels: benchPodLabels},
			Spec: corev1.PodSpec{
				NodeSelector:                  map[string]string{"kubernetes.io/hostname": KubeNodeName(bp.Node)},
				TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
					Args: []string{"pause"}}},
			},
		}
		if _, err := kc.CoreV1().Pods(benchPodNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("bench pod %s: %w", bp.Name, err)
		}
	}
	out := map[string]corev1.Pod{}
	for _, bp := range pods {
		var pod *corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, time.Second, realNodeTimeout, true, func(ctx context.Context) (bool, error) {
			p, err := kc.CoreV1().Pods(benchPodNamespace).Get(ctx, bp.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			pod = p
			return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
		})
		if err != nil {
			return nil, fmt.Errorf("bench pod %s not running: %w; %s", bp.Name, err, podSummary(ctx, kc, benchPodNamespace))
		}
		pid, err := podSandboxPID(bp.Node, pod.UID)
		if err != nil {
			return nil, fmt.Errorf("bench pod %s: %w", bp.Name, err)
		}
		if err := ip(ctx, "netns", "attach", bp.Netns, strconv.Itoa(pid)); err != nil {
			return nil, fmt.Errorf("bench pod %s: %w", bp.Name, err)
		}
		out[bp.Name] = *pod
	}
	return out, nil
}

// podSandboxPID returns a process of the pod on node i, as the machine
// numbers it: one listed in the pod's cgroup (kubelet's cgroupfs layout,
// pod<UID> below the node's cgroup root) or its containers'.
func podSandboxPID(i int, uid types.UID) (int, error) {
	_, cg2, err := cgroupHierarchies()
	if err != nil {
		return 0, err
	}
	root, err := KubeletCgroupRoot(i)
	if err != nil {
		return 0, err
	}
	if len(cg2) == 0 {
		return 0, errors.New("no cgroup2 hierarchy")
	}
	base := filepath.Join(cg2[0], root)
	pid := 0
	found := errors.New("found")
	err = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || !strings.Contains(p, "/pod"+string(uid)) {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				pid = n
				return found
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, found) {
		return 0, err
	}
	if pid == 0 {
		return 0, fmt.Errorf("no process of pod %s under %s", uid, base)
	}
	return pid, nil
}

// loadAverage is the machine's 1, 5 and 15 minute load average.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
