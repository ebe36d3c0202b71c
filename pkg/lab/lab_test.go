package lab

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func TestNames(t *testing.T) {
	tests := []struct{ got, want string }{
		{NodeNS(3), "lk-node3"},
		{PodNS(2, 1, KindLanekit), "lk-n2-p1"},
		{PodNS(2, 4, KindBaseline), "lk-n2-b4"},
		{UnderlayIP(7), "10.77.0.7"},
		{PodCIDR(2), "10.244.2.0/24"},
		{BaseCIDR(2), "10.245.2.0/24"},
		{AgentSocket(1), "/run/lanekit/lab/lk-node1/agent.sock"},
		{BPFDir(1), "/sys/fs/bpf/lanekit/lk-node1"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
	for ns, want := range map[string]bool{"lk-wire": true, "lk-node12": true, "lk-n1-p2": true, "lk-n3-b1": true,
		"lk-p-web-1": true, "lk-p-": false, "lk-p-Web": false, "lk-p-a-": false,
		"lk-t-veth-123": false, "lk-nodex": false, "lk-": false, "node1": false} {
		if got := labNetnsRe.MatchString(ns); got != want {
			t.Errorf("lab netns %q: got %v, want %v", ns, got, want)
		}
	}
	// The lab kubelet's pod namespaces are lab namespaces (lab down removes them).
	if ns := PodNetns(3, "0b6c1f0e-5a57-4a8c-9d3c-2f1e0c6b7a11"); !labNetnsRe.MatchString(ns) {
		t.Errorf("kubelet pod netns %q is not a lab netns", ns)
	}
	args := strings.Join(agentArgs(2, false), " ")
	want := "--state-dir /run/lanekit/lab/lk-node2/state --socket /run/lanekit/lab/lk-node2/agent.sock --uplink eth0 --pod-cidr 10.244.2.0/24 --bpf-dir /sys/fs/bpf/lanekit/lk-node2 --cgroup-root /run/lanekit/cgroupv2/lanekit-lab/lk-node2 --vm-socket-dir /run/lanekit/lab/lk-node2/vm --kubelet-root-dir /run/lanekit/lab/kubelet --vhost-user 65534:65534 --device-plugin-dir "
	if args != want {
		t.Errorf("agent args = %q, want %q", args, want)
	}
	args = strings.Join(agentArgs(2, true), " ")
	want = "--state-dir /run/lanekit/lab/lk-node2/state --socket /run/lanekit/lab/lk-node2/agent.sock --uplink eth0 --kubeconfig /run/lanekit/lab/k8s/kubeconfig --node-name lk-node2 --metrics-listen 10.77.0.2:9964 --bpf-dir /sys/fs/bpf/lanekit/lk-node2 --cgroup-root /run/lanekit/cgroupv2/lanekit-lab/lk-node2 --vm-socket-dir /run/lanekit/lab/lk-node2/vm --kubelet-root-dir /run/lanekit/lab/kubelet --vhost-user 65534:65534 --device-plugin-dir "
	if args != want {
		t.Errorf("k8s agent args = %q, want %q", args, want)
	}
}

func TestKubeProxyRules(t *testing.T) {
	rules := kubeProxyRules(3)
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
		"-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
		"--ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-j MARK --or-mark 0x4000",
		"-j MASQUERADE --random-fully",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("rules lack %q", want)
		}
	}
	if n := strings.Count(rules, "-A KUBE-SERVICES -d 10.96."); n != kubeServices {
		t.Errorf("%d ClusterIP rules, want %d", n, kubeServices)
	}
	if strings.Count(rules, "COMMIT") != 2 {
		t.Error("want nat and filter tables committed")
	}
	// Every DNAT target stays inside the lab's pod ranges.
	for _, line := range strings.Split(rules, "\n") {
		if i := strings.Index(line, "--to-destination "); i >= 0 {
			dst := line[i+len("--to-destination "):]
			if !strings.HasPrefix(dst, "10.244.") && !strings.HasPrefix(dst, "10.245.") {
				t.Errorf("DNAT outside the lab: %s", line)
			}
		}
	}
}

func TestCNIConfigs(t *testing.T) {
	list, err := libcni.ConfListFromBytes(lanekitConf(2))
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "lanekit" {
		t.Fatalf("lanekit conf = %+v", list)
	}
	var lk map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &lk); err != nil {
		t.Fatal(err)
	}
	if lk["agentSocket"] != AgentSocket(2) || list.Name != "lanekit" || lk["subnet"] != PodCIDR(2) {
		t.Errorf("lanekit plugin conf = %v", lk)
	}

	list, err = libcni.ConfListFromBytes(baselineConf(3))
	if err != nil {
		t.Fatal(err)
	}
	var br struct {
		Bridge    string `json:"bridge"`
		IsGateway bool   `json:"isGateway"`
		IPAM      struct {
			Type    string                `json:"type"`
			DataDir string                `json:"dataDir"`
			Ranges  [][]map[string]string `json:"ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &br); err != nil {
		t.Fatal(err)
	}
	if br.Bridge != BaseBridge || !br.IsGateway || br.IPAM.Type != "host-local" ||
		!strings.HasPrefix(br.IPAM.DataDir, RunDir) ||
		br.IPAM.Ranges[0][0]["subnet"] != "10.245.3.0/24" || br.IPAM.Ranges[0][0]["gateway"] != "10.245.3.1" {
		t.Errorf("baseline conf = %+v", br)
	}
}

func TestPluginErr(t *testing.T) {
	var e *types.Error
	err := pluginErr(errors.New("exit status 1"), []byte(`{"code":11,"msg":"no ipam"}`), nil)
	if !errors.As(err, &e) || e.Code != 11 || e.Msg != "no ipam" {
		t.Errorf("json error = %#v", err)
	}
	err = pluginErr(errors.New("exit status 1"), nil, []byte("boom\n"))
	if !strings.Contains(err.Error(), "boom") {
		t.Errorf("stderr error = %v", err)
	}
	err = pluginErr(errors.New("exit status 2"), nil, nil)
	if !strings.Contains(err.Error(), "exit status 2") {
		t.Errorf("silent error = %v", err)
	}
}

func TestBenchPaths(t *testing.T) {
	st := &State{Nodes: []Node{
		{Index: 1, NS: "lk-node1", UnderlayIP: "10.77.0.1", RawNS: RawNS(1), RawIP: RawIP(1), Pods: []Pod{
			{NS: "lk-n1-p1", Kind: KindLanekit, IP: "10.244.1.2"},
			{NS: "lk-n1-b1", Kind: KindBaseline, IP: "10.245.1.2"}}},
		{Index: 2, NS: "lk-node2", UnderlayIP: "10.77.0.2", RawNS: RawNS(2), RawIP: RawIP(2), Pods: []Pod{
			{NS: "lk-n2-b1", Kind: KindBaseline, IP: "10.245.2.2"}}},
	}}
	paths, skipped := st.BenchPaths()
	if len(paths) != 3 || len(skipped) != 1 {
		t.Fatalf("paths %v skipped %v", paths, skipped)
	}
	if p := paths[0]; p.Name != "host-raw" || p.ClientNS != "lk-n1-r1" || p.ServerNS != "lk-n2-r1" || p.ServerIP != "10.77.0.252" ||
		p.Includes.Netfilter || p.Includes.Conntrack || p.Includes.BPF {
		t.Errorf("host-raw path = %+v", p)
	}
	if p := paths[1]; p.Name != "host" || p.ClientNS != "lk-node1" || p.ServerNS != "lk-node2" || p.ServerIP != "10.77.0.2" ||
		!p.Includes.Netfilter || !p.Includes.Conntrack {
		t.Errorf("host path = %+v", p)
	}
	if p := paths[2]; p.Name != "bridge-iptables" || p.ClientNS != "lk-n1-b1" || p.ServerNS != "lk-n2-b1" || p.ServerIP != "10.245.2.2" {
		t.Errorf("bridge path = %+v", p)
	}
	if !labNetnsRe.MatchString(RawNS(1)) {
		t.Errorf("lab down would leave %s behind", RawNS(1))
	}
	if !strings.Contains(skipped[0], "lanekit-pod") {
		t.Errorf("skipped = %v", skipped)
	}
	if got := len(st.PodsOf(KindBaseline)); got != 2 {
		t.Errorf("PodsOf(baseline) = %d", got)
	}
}

func TestEchoLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeEcho(ctx, ln) }()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := closed.Addr().String()
	closed.Close()
	res := EchoDial(context.Background(), []string{ln.Addr().String(), deadAddr}, time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeEcho: %v", err)
	}
	if !res[0].OK || res[1].OK || res[1].Error == "" {
		t.Fatalf("results = %+v", res)
	}
	data, _ := json.Marshal(res)
	back, err := ParseDialResults(data)
	if err != nil || len(back) != 2 || back[0] != res[0] {
		t.Errorf("round trip = %+v, %v", back, err)
	}
}

func TestParsePodFlags(t *testing.T) {
	l, err := ParseLabels("app=web, tier=front,empty=")
	if err != nil || len(l) != 3 || l["app"] != "web" || l["tier"] != "front" || l["empty"] != "" {
		t.Errorf("ParseLabels = %v, %v", l, err)
	}
	for _, bad := range []string{"app", "=x", "a=1,a=2"} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("ParseLabels(%q) succeeded", bad)
		}
	}
	p, err := ParsePorts("http=8080/tcp,dns=53/UDP,metrics=9090")
	if err != nil || len(p) != 3 || p[0] != (PodPort{"http", 8080, "TCP"}) || p[1] != (PodPort{"dns", 53, "UDP"}) || p[2].Protocol != "TCP" {
		t.Errorf("ParsePorts = %v, %v", p, err)
	}
	for _, bad := range []string{"8080", "http=x", "=80"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) succeeded", bad)
		}
	}
	// The Pod object a named pod gets carries labels, node and named ports.
	np := NamedPod{Name: "web", Namespace: "shop", Node: 2, IP: "10.244.2.5", Labels: map[string]string{"app": "web"}, Ports: p[:1]}
	o := np.podObject()
	if o.Pod.Spec.NodeName != "lk-node2" || o.Pod.Status.PodIP != "10.244.2.5" || o.Pod.Spec.Containers[0].Ports[0].Name != "http" || o.Pod.Labels["app"] != "web" {
		t.Errorf("pod object %+v", o.Pod)
	}
	args := map[string]string{}
	for _, kv := range np.cniArgs() {
		args[kv[0]] = kv[1]
	}
	if args["K8S_POD_NAMESPACE"] != "shop" || args["K8S_POD_NAME"] != "web" || args["LANEKIT_LABEL_app"] != "web" {
		t.Errorf("cni args %v", args)
	}
}
