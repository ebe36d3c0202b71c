package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// ciliumChart is Cilium's chart at the version the lab runs: the node
// binaries' copy (scripts/k8s-node-bins.sh) or the module cache's.
func ciliumChart(t *testing.T) string {
	t.Helper()
	if d, err := exec.Command(filepath.Join(repoRoot(t), "scripts/k8s-node-bins.sh"), "dir").Output(); err == nil {
		if c := filepath.Join(strings.TrimSpace(string(d)), ciliumChartSubdir); regularFile(filepath.Join(c, "Chart.yaml")) {
			return c
		}
	}
	if mc, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		c := filepath.Join(strings.TrimSpace(string(mc)), "github.com/cilium/cilium@"+ciliumVersion, "install/kubernetes/cilium")
		if regularFile(filepath.Join(c, "Chart.yaml")) {
			return c
		}
	}
	t.Skipf("Cilium %s's chart is neither in the node binaries nor in the module cache: run make k8s-node-bins", ciliumVersion)
	return ""
}

// renderedObjects splits a rendered chart into its objects by kind/name.
func renderedObjects(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	r := k8syaml.NewYAMLReader(bufioReader(data))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != "" {
			out[meta.Kind+"/"+meta.Metadata.Name] = doc
		}
	}
}

// TestCiliumChartRender renders Cilium's own chart with the lab's values
// through bin/helm and checks what the agents get: kube-proxy replacement,
// the routing mode, socket LB on the node's cgroup (no cgroup2 mount, no
// sysctlfix touching the machine), no Envoy or Hubble, the lab's images and
// the API server, in both routing modes.
func TestCiliumChartRender(t *testing.T) {
	helm := filepath.Join(repoRoot(t), "bin", "helm")
	if b := os.Getenv("LANEKIT_BIN"); b != "" {
		helm = filepath.Join(b, "helm")
	}
	if !executable(helm) {
		t.Skipf("%s not built (make helm)", helm)
	}
	chart := ciliumChart(t)
	// The capabilities the lab filters are the chart's own defaults.
	raw, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var defaults struct {
		SecurityContext struct {
			Capabilities map[string][]string `json:"capabilities"`
		} `json:"securityContext"`
	}
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	if got := defaults.SecurityContext.Capabilities["ciliumAgent"]; !slices.Equal(got, ciliumAgentCaps) {
		t.Errorf("chart's ciliumAgent capabilities %v, the lab filters %v", got, ciliumAgentCaps)
	}
	if got := defaults.SecurityContext.Capabilities["cleanCiliumState"]; !slices.Equal(got, ciliumCleanStateCaps) {
		t.Errorf("chart's cleanCiliumState capabilities %v, the lab filters %v", got, ciliumCleanStateCaps)
	}
	srv := &k8stest.Server{Address: "10.77.0.254", APIPort: 6443}
	for _, routing := range []string{RoutingNative, RoutingTunnel} {
		t.Run(routing, func(t *testing.T) {
			data, err := renderCilium(context.Background(), helm, chart, routing, srv)
			if err != nil {
				t.Fatal(err)
			}
			objs := renderedObjects(t, data)
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal(objs["ConfigMap/cilium-config"], &cm); err != nil {
				t.Fatalf("cilium-config: %v", err)
			}
			want := map[string]string{
				"kube-proxy-replacement": "true", "bpf-lb-sock": "true", "bpf-lb-sock-hostns-only": "true", "cgroup-root": CgroupMount,
				"enable-l7-proxy": "false", "enable-hubble": "false", "ipam": "kubernetes",
				"enable-bpf-masquerade": "true", "enable-ipv6": "false", "enable-endpoint-health-checking": "false",
				"routing-mode": routing, "devices": Uplink, "direct-routing-device": Uplink,
				// The bench's scrape (proxymetrics.go).
				"prometheus-serve-addr": fmt.Sprintf(":%d", ciliumMetricsPort),
			}
			if m := strings.Fields(cm.Data["metrics"]); !slices.Contains(m, "+"+ciliumReconcilerDur) {
				t.Errorf("cilium-config metrics %q: the reconciler's durations (the bench reads them) are not enabled", cm.Data["metrics"])
			}
			if routing == RoutingTunnel {
				want["tunnel-protocol"] = "vxlan"
			} else {
				want["ipv4-native-routing-cidr"] = ClusterCIDR
				want["auto-direct-node-routes"] = "true"
			}
			for k, v := range want {
				if got, ok := cm.Data[k]; !ok || got != v {
					t.Errorf("cilium-config %s = %q (set %v), want %q", k, got, ok, v)
				}
			}
			for _, k := range []string{"DaemonSet/cilium-envoy", "Deployment/hubble-relay"} {
				if _, ok := objs[k]; ok {
					t.Errorf("%s rendered: Envoy and Hubble are off in the lab", k)
				}
			}
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal(objs["DaemonSet/cilium"], &ds); err != nil {
				t.Fatalf("DaemonSet/cilium: %v", err)
			}
			var inits []string
			for _, c := range ds.Spec.Template.Spec.InitContainers {
				inits = append(inits, c.Name)
			}
			for _, bad := range []string{"mount-cgroup", "apply-sysctl-overwrites"} {
				if slices.Contains(inits, bad) {
					t.Errorf("init container %s rendered (it acts in PID 1's namespaces: the machine's): %v", bad, inits)
				}
			}
			agent := ds.Spec.Template.Spec.Containers[0]
			// No capability the machine cannot give (runc refuses the container).
			for _, c := range append(ds.Spec.Template.Spec.InitContainers, agent) {
				if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil {
					continue
				}
				for _, cp := range c.SecurityContext.Capabilities.Add {
					if n, ok := capNumbers[string(cp)]; ok && !inBoundingSet(n) {
						t.Errorf("container %s gets CAP_%s, not in this machine's bounding set", c.Name, cp)
					}
				}
			}
			if want := ds.Spec.Template.Spec.Containers[0]; want.Name != "cilium-agent" {
				t.Fatalf("first container %s", want.Name)
			}
			if agent.Image != ciliumImageRepo+":"+ciliumVersion || agent.ImagePullPolicy != corev1.PullNever {
				t.Errorf("agent image %s (%s), want the lab's %s:%s, Never", agent.Image, agent.ImagePullPolicy, ciliumImageRepo, ciliumVersion)
			}
			env := map[string]string{}
			for _, e := range agent.Env {
				env[e.Name] = e.Value
			}
			if env["KUBERNETES_SERVICE_HOST"] != srv.Address || env["KUBERNETES_SERVICE_PORT"] != "6443" {
				t.Errorf("agent API server %s:%s, want %s:6443", env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"], srv.Address)
			}
			var op appsv1.Deployment
			if err := yaml.Unmarshal(objs["Deployment/cilium-operator"], &op); err != nil {
				t.Fatalf("Deployment/cilium-operator: %v", err)
			}
			if img := op.Spec.Template.Spec.Containers[0].Image; img != "quay.io/cilium/operator-generic:"+ciliumVersion || *op.Spec.Replicas != 1 {
				t.Errorf("operator image %s replicas %d, want quay.io/cilium/operator-generic:%s x1", img, *op.Spec.Replicas, ciliumVersion)
			}
		})
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// checkCiliumPath checks, in node 1's Cilium agent, that the Service went
// through Cilium's datapath: its service map holds the ClusterIP with both
// web pods as backends, its BPF conntrack holds a service entry for the
// ClusterIP (per-packet LB at the client's veth) and the client pod's
// translated connections to both pods' port (RevNAT set), and the node has
// no kube-proxy rule.
func checkCiliumPath(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, clusterIP string, pods []corev1.Pod) {
	t.Helper()
	lb, err := ciliumDbg(ctx, kc, nodeBins, 1, "bpf", "lb", "list")
	if err != nil {
		t.Fatalf("cilium-dbg bpf lb list: %v", err)
	}
	for _, p := range pods {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(clusterIP) + `:80/TCP \(\d+\)\s+` + regexp.QuoteMeta(p.Status.PodIP) + `:8080/TCP`)
		if !re.MatchString(lb) {
			t.Errorf("Cilium's service map on %s: no backend %s:8080 for %s:80:\n%s", NodeNS(1), p.Status.PodIP, clusterIP, lb)
		}
	}
	ct, err := ciliumDbg(ctx, kc, nodeBins, 1, "bpf", "ct", "list", "global")
	if err != nil {
		t.Fatalf("cilium-dbg bpf ct list global: %v", err)
	}
	// Per-packet LB at the client's veth: a service entry for the ClusterIP.
	if !regexp.MustCompile(`(?m)^TCP SVC .*` + regexp.QuoteMeta(clusterIP) + `:`).MatchString(ct) {
		t.Errorf("Cilium's conntrack on %s: no service entry for %s:\n%s", NodeNS(1), clusterIP, ct)
	}
	// The translated connections to each backend (RevNAT: the service's
	// reverse NAT index); to the client itself (hairpin) from Cilium's
	// loopback address 169.254.42.1.
	for _, p := range pods {
		re := regexp.MustCompile(`(?m)^TCP OUT (` + regexp.QuoteMeta(pods[0].Status.PodIP) + `|169\.254\.42\.1):\d+ -> ` +
			regexp.QuoteMeta(p.Status.PodIP) + `:8080 .*RevNAT=[1-9]`)
		if !re.MatchString(ct) {
			t.Errorf("Cilium's conntrack on %s: no translated %s -> %s:8080:\n%s", NodeNS(1), pods[0].Status.PodIP, p.Status.PodIP, ct)
		}
	}
	nat, err := nsCommand(ctx, NodeNS(1), "iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(nat), "KUBE-SVC-") || strings.Contains(string(nat), "KUBE-SERVICES") {
		t.Errorf("kube-proxy rules on a Cilium node %s:\n%s", NodeNS(1), nat)
	}
}
