package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/kubevirt"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/policy"
)

// claimLog is an EndpointRouteSink that keeps the last full set.
type claimLog struct {
	mu    sync.Mutex
	calls int
	last  []agent.EndpointRoute
}

func (l *claimLog) SyncEndpointRoutes(routes []agent.EndpointRoute) (int, []string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.last = append([]agent.EndpointRoute(nil), routes...)
	return len(routes), nil, nil
}

// String is the set as "addr>via@gen(vm,node)" lines joined by " ", "-" when
// empty, "unsynced" before the first call.
func (l *claimLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == 0 {
		return "unsynced"
	}
	return claimsString(l.last)
}

func claimsString(rs []agent.EndpointRoute) string {
	if len(rs) == 0 {
		return "-"
	}
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s>%s@%d(%s,%s)", r.Addr, r.Via, r.Generation, r.VM, r.Node))
	}
	return strings.Join(parts, " ")
}

// claimNode is a Node with ip as InternalIP and pod CIDR 10.244.N.0/24, N
// its name's position among node-a, node-b, node-c.
func claimNode(name, ip string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Spec.PodCIDR = fmt.Sprintf("10.244.%d.0/24", name[len(name)-1]-'a'+1)
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	}
	return n
}

// launcherStatus is a launcher pod's network-status: the cluster network
// and the lanekit network with ips, as Multus writes it.
func launcherStatus(ips ...string) string {
	st := []map[string]any{{"name": "k8s-pod-network", "ips": []string{"10.88.0.9"}, "default": true},
		{"name": "default/lanekit", "interface": "pod1a2b3c4d5e6", "ips": ips}}
	raw, _ := json.Marshal(st)
	return string(raw)
}

// launcherPods are vm1's launcher pods as fakeVMI's migrations name them
// (aaaaa on node-a, bbbbb on node-b, ccccc on node-a), each given ips; uid
// is the VMI's.
func launcherPods(uid string, ips ...string) map[string]*corev1.Pod {
	out := map[string]*corev1.Pod{}
	for name, node := range map[string]string{"virt-launcher-vm1-aaaaa": "node-a", "virt-launcher-vm1-bbbbb": "node-b", "virt-launcher-vm1-ccccc": "node-a"} {
		p := pod("default", name, node, map[string]string{"kubevirt.io": "virt-launcher", labelCreatedBy: uid})
		p.Annotations = map[string]string{annotationDomain: "vm1", k8sobj.NetworkStatusAnnotation: launcherStatus(ips...)}
		out[name] = p
	}
	return out
}

// podMap is a podCache over pods by name (one namespace).
type podMap map[string]*k8sobj.Pod

func (m podMap) Pod(_, name string) *k8sobj.Pod { return m[name] }

func (m podMap) Holding(a netip.Addr) []*k8sobj.Pod {
	var out []*k8sobj.Pod
	for _, p := range m {
		if slices.Contains(podAddrs(p), a) {
			out = append(out, p)
		}
	}
	return out
}

// lookupIn is a podCache over pods as the source's cache holds them.
func lookupIn(pods map[string]*corev1.Pod) podCache {
	m := podMap{}
	for name, p := range pods {
		m[name] = slimPod(p)
	}
	return m
}

// withIfaces sets status.interfaces: the lanekit-bound "fast" with addr and
// another network's "other" with 10.9.9.9 (never claimed).
func withIfaces(u *unstructured.Unstructured, addr string) *unstructured.Unstructured {
	st := u.Object["status"].(map[string]any)
	st["interfaces"] = []any{
		map[string]any{"name": "fast", "ipAddress": addr, "ipAddresses": []any{addr, "fd00::5"}, "mac": "02:00:00:00:00:05"},
		map[string]any{"name": "other", "ipAddress": "10.9.9.9"},
	}
	return u
}

func TestDesiredClaims(t *testing.T) {
	nodes := []any{claimNode("node-a", "192.168.0.1"), claimNode("node-b", "192.168.0.2"), claimNode("node-c", "")}
	pods := lookupIn(launcherPods("6a1b3d5e", "10.244.1.5"))
	done := func() map[string]any {
		m := running()
		m["completed"], m["endTimestamp"] = true, "2026-11-26T01:00:07Z"
		return m
	}
	failed := running()
	failed["failed"], failed["endTimestamp"] = true, "2026-11-26T01:00:03Z"
	toC := done()
	toC["targetNode"] = "node-c"
	start, end := "1795654800000000000", "1795654807000000001" // 01:00:00 and 01:00:07 UTC in ns, a completion +1 ns (claimGeneration)
	cases := []struct {
		name, self string
		state      map[string]any
		want       string
		errs       int
	}{
		{"never migrated", "node-c", nil, "-", 0},
		{"completed, seen elsewhere", "node-c", done(), "10.244.1.5>192.168.0.2@" + end + "(default.vm1,node-b)", 0},
		{"completed, seen by the source", "node-a", done(), "10.244.1.5>192.168.0.2@" + end + "(default.vm1,node-b)", 0},
		{"completed, the owner has no route", "node-b", done(), "-", 0},
		{"in progress: the source still runs it", "node-b", running(), "10.244.1.5>192.168.0.1@" + start + "(default.vm1,node-a)", 0},
		{"failed: the source still runs it", "node-b", failed, "10.244.1.5>192.168.0.1@" + start + "(default.vm1,node-a)", 0},
		{"owner without InternalIP", "node-a", toC, "-", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, errs := desiredClaims(c.self, []any{withIfaces(fakeVMI(nil, c.state), "10.244.1.5")}, nodes, pods)
			if s := claimsString(got); s != c.want || len(errs) != c.errs {
				t.Errorf("claims %s (errors %v), want %s (%d errors)", s, errs, c.want, c.errs)
			}
		})
	}
	// The slimmed VMI the follower caches gives the same claims.
	slim, err := slimVMI(withIfaces(fakeVMI(nil, done()), "10.244.1.5"))
	if err != nil {
		t.Fatal(err)
	}
	got, errs := desiredClaims("node-c", []any{slim}, nodes, pods)
	if s := claimsString(got); s != "10.244.1.5>192.168.0.2@"+end+"(default.vm1,node-b)" || len(errs) != 0 {
		t.Errorf("slim VMI's claims %s, %v", s, errs)
	}
}

// TestDesiredClaimsTrustOnlyLanekit: from the guest's side. The guest fills
// its VMI's status.interfaces; after a completed migration to node-b it
// names another pod's address (on node-c), a reserved address, or the
// address it really has plus a victim's: no node claims anything but what
// node-b's launcher pod was given by lanekit (its network-status), and
// nothing at all when the launcher pod is missing, is another VMI's, runs
// elsewhere, or was given an address outside every pod CIDR.
func TestDesiredClaimsTrustOnlyLanekit(t *testing.T) {
	nodes := []any{claimNode("node-a", "192.168.0.1"), claimNode("node-b", "192.168.0.2"), claimNode("node-c", "192.168.0.3")}
	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	vmi := func(addrs ...any) *unstructured.Unstructured {
		u := fakeVMI(nil, done)
		u.Object["status"].(map[string]any)["interfaces"] = []any{map[string]any{"name": "fast", "ipAddresses": addrs}}
		return u
	}
	honest := lookupIn(launcherPods("6a1b3d5e", "10.244.1.5"))
	other := launcherPods("6a1b3d5e", "10.244.1.5")
	other["virt-launcher-vm1-bbbbb"].Labels[labelCreatedBy] = "another-vmi"
	moved := launcherPods("6a1b3d5e", "10.244.1.5")
	moved["virt-launcher-vm1-bbbbb"].Spec.NodeName = "node-c"
	// A namespace editor rewrote the launcher pods' network-status to name
	// a running pod's address on node-c, or another VM's: the victims' own
	// records (the pod's status.podIPs from kubelet, the other VMI's
	// launcher's network-status) still say whose it is.
	victim := pod("default", "victim", "node-c", nil)
	victim.Status.Phase, victim.Status.PodIPs = corev1.PodRunning, []corev1.PodIP{{IP: "10.244.3.7"}}
	otherVM := pod("default", "virt-launcher-vm2-xxxxx", "node-c", map[string]string{labelCreatedBy: "another-vmi"})
	otherVM.Annotations = map[string]string{k8sobj.NetworkStatusAnnotation: launcherStatus("10.244.3.8")}
	forged := launcherPods("6a1b3d5e", "10.244.3.7", "10.244.3.8")
	forged["victim"], forged["virt-launcher-vm2-xxxxx"] = victim, otherVM
	// The pod that had the address before has terminated: it holds nothing.
	gone := launcherPods("6a1b3d5e", "10.244.1.5")
	gone["victim"] = victim.DeepCopy()
	gone["victim"].Status.Phase, gone["victim"].Status.PodIPs = corev1.PodSucceeded, []corev1.PodIP{{IP: "10.244.1.5"}}
	outside := lookupIn(launcherPods("6a1b3d5e", "10.99.0.5"))
	bcast := lookupIn(launcherPods("6a1b3d5e", "10.244.1.255"))
	const ok = "10.244.1.5>192.168.0.2@1795654807000000001(default.vm1,node-b)"
	for _, c := range []struct {
		name   string
		vmi    *unstructured.Unstructured
		pods   podCache
		want   string
		errSub string
	}{
		{"honest", vmi("10.244.1.5"), honest, ok, ""},
		{"a pod's address on node-c", vmi("10.244.3.7"), honest, "-", "not trusted"},
		{"its own and a victim's", vmi("10.244.1.5", "10.244.3.7"), honest, "-", "not trusted"},
		{"no launcher pod", vmi("10.244.1.5"), lookupIn(nil), "-", "not found"},
		{"another VMI's launcher", vmi("10.244.1.5"), lookupIn(other), "-", "not a launcher pod of this VMI"},
		{"a launcher on another node", vmi("10.244.1.5"), lookupIn(moved), "-", "runs on"},
		{"a running pod's address, network-status forged", vmi("10.244.3.7"), lookupIn(forged), "-", "held by pod default/victim"},
		{"another VM's address, network-status forged", vmi("10.244.3.8"), lookupIn(forged), "-", "held by pod default/virt-launcher-vm2-xxxxx"},
		{"a terminated pod's old address", vmi("10.244.1.5"), lookupIn(gone), ok, ""},
		{"outside every pod CIDR", vmi("10.99.0.5"), outside, "-", "not a usable address"},
		{"a broadcast address", vmi("10.244.1.255"), bcast, "-", "not a usable address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, errs := desiredClaims("node-a", []any{c.vmi}, nodes, c.pods)
			if s := claimsString(got); s != c.want {
				t.Errorf("claims %s, want %s (errors %v)", s, c.want, errs)
			}
			if c.errSub != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), c.errSub)) {
				t.Errorf("errors %v, want one with %q", errs, c.errSub)
			}
		})
	}
}

// TestMovedAddressClaimsAgainstAPIServer: three nodes' sources on a real
// API server follow a VMI migrating node-a -> node-b (the test writes the
// VMI's status as virt-controller/virt-handler do) and each ends with the
// other nodes' claims of its address: none before it completes (the
// address is in node-a's pod CIDR), a /32 via node-b's InternalIP on node-a
// and node-c after, nothing on node-b (the owner), then a claim via node-a
// when it migrates back, and nothing once the VMI is gone.
func TestMovedAddressClaimsAgainstAPIServer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := k8stest.InstallKubeVirtCRD(ctx, e.srv.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		n := claimNode(name, fmt.Sprintf("192.168.0.%d", i+1))
		st := n.Status
		out := mustCreate(t, e.c.CoreV1().Nodes().Create, n)
		out.Status = st
		if _, err := e.c.CoreV1().Nodes().UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	vmis := e.dc.Resource(VMIResource).Namespace("default")
	created, err := vmis.Create(ctx, withIfaces(fakeVMI(map[string]string{labelVMINode: "node-a"}, nil), "10.244.1.5"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range launcherPods(string(created.GetUID()), "10.244.1.5") {
		mustCreate(t, e.c.CoreV1().Pods("default").Create, p)
	}
	// The API server drops status on create (status subresource): write it.
	created.Object["status"] = withIfaces(fakeVMI(nil, nil), "10.244.1.5").Object["status"]
	if _, err := vmis.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sinks := map[string]*claimLog{"node-a": {}, "node-b": {}, "node-c": {}}
	for node, l := range sinks {
		run(t, Config{NodeName: node, Client: e.c, Dynamic: e.dc, VMs: vmsWithMigrations{&vmStore{}, &migrationLog{}}, EndpointRoutes: l})
	}
	want := func(what string, per map[string]string) {
		t.Helper()
		for node, w := range per {
			eventually(t, what+" on "+node, func() bool { return sinks[node].String() == w })
		}
	}
	want("never migrated", map[string]string{"node-a": "-", "node-b": "-", "node-c": "-"})
	set := func(nodeName string, state map[string]any) {
		t.Helper()
		cur, err := vmis.Get(ctx, "vm1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(cur.Object, state, "status", "migrationState"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(cur.Object, nodeName, "status", "nodeName"); err != nil {
			t.Fatal(err)
		}
		if _, err := vmis.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set("node-a", running())
	viaA := "10.244.1.5>192.168.0.1@1795654800000000000(default.vm1,node-a)"
	want("in progress", map[string]string{"node-a": "-", "node-b": viaA, "node-c": viaA})
	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	set("node-b", done)
	viaB := "10.244.1.5>192.168.0.2@1795654807000000001(default.vm1,node-b)"
	want("completed", map[string]string{"node-a": viaB, "node-b": "-", "node-c": viaB})
	back := map[string]any{"migrationUid": "mig-2", "sourceNode": "node-b", "sourcePod": "virt-launcher-vm1-bbbbb",
		"targetNode": "node-a", "targetPod": "virt-launcher-vm1-ccccc", "startTimestamp": "2026-11-26T02:00:00Z",
		"endTimestamp": "2026-11-26T02:00:05Z", "completed": true}
	set("node-a", back)
	viaA2 := "10.244.1.5>192.168.0.1@1795658405000000001(default.vm1,node-a)"
	want("migrated back", map[string]string{"node-a": "-", "node-b": viaA2, "node-c": viaA2})
	if err := vmis.Delete(ctx, "vm1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("VMI deleted", map[string]string{"node-a": "-", "node-b": "-", "node-c": "-"})
}

// TestMovedAddressRoutesOnAgents: the same migration drives three real
// agents (memory datapath, each in its own network namespace with its
// InternalIP on a link; the VM on node-a, its incoming endpoint on
// node-b): once it completes, node-b activates its endpoint and routes the
// address to it, node-a's VM is superseded and node-a and node-c route the
// address to node-b with a /32; node-c's route goes with the VMI.
func TestMovedAddressRoutesOnAgents(t *testing.T) { movedAddressOnAgents(t, false) }

// TestMovedAddressTunnelOnAgents: the same in tunnel routing mode, where
// the agents take the other nodes' pod CIDRs from the Node objects into
// their node maps: node-a and node-c put the moved address in the node map
// as a /32 claim whose underlay is node-b's InternalIP, the address their
// map has for node-b's pod CIDR too, and route it into the tunnel device;
// node-b has no claim entry; node-c's entry and route go with the VMI.
func TestMovedAddressTunnelOnAgents(t *testing.T) { movedAddressOnAgents(t, true) }

// tunnelMemDatapath is the memory datapath with a tunnel node map (what the
// agent's tunnel mode writes into lk_tunnel_nodes).
type tunnelMemDatapath struct {
	*agenttest.MemoryDatapath
	mu    sync.Mutex
	nodes []datapath.TunnelNode
}

func (d *tunnelMemDatapath) SetTunnelNodes(n []datapath.TunnelNode) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes = append([]datapath.TunnelNode(nil), n...)
	return nil
}

func (d *tunnelMemDatapath) TunnelNodes() ([]datapath.TunnelNode, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]datapath.TunnelNode(nil), d.nodes...), nil
}

func (d *tunnelMemDatapath) TunnelStats() (datapath.TunnelStats, error) {
	return datapath.TunnelStats{}, nil
}

func (d *tunnelMemDatapath) SetTunnelIdentities(map[policy.Identity]policy.IdentityInfo) error {
	return nil
}

// underlay is the node map's underlay for prefix p ("" when none), "claim "
// before it for a claim entry.
func (d *tunnelMemDatapath) underlay(p string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.nodes {
		if n.PodCIDR.String() == p {
			if n.Claim {
				return "claim " + n.Underlay.String()
			}
			return n.Underlay.String()
		}
	}
	return ""
}

// peerSink hands the Node objects' pod CIDRs to the agent's node map (what
// lanekitd does in tunnel mode).
type peerSink struct{ a *agent.Agent }

func (p peerSink) SyncRoutes(routes []Route) error {
	var peers []datapath.TunnelNode
	for _, r := range routes {
		peers = append(peers, datapath.TunnelNode{PodCIDR: r.Dst, Underlay: r.Via})
	}
	return p.a.SetTunnelPeers(peers)
}

// claimAgent starts a real agent (memory datapath) for Node n in a network
// namespace of its own where the Node's InternalIP is on a link; tunnel
// mode with dp, native routing when dp is nil.
func claimAgent(t *testing.T, n *corev1.Node, dp *tunnelMemDatapath) (*agent.Agent, string) {
	t.Helper()
	testutil.RequireRoot(t)
	ip := nodeInternalIPv4(n).String()
	path := netnstest.New(t, "claims"+n.Name[len(n.Name)-1:]).Path()
	dir := t.TempDir()
	cfg := agent.Config{
		StateDir: dir, PodCIDR: netip.MustParsePrefix(n.Spec.PodCIDR), MTU: 1500, HostNetns: path,
		VMSocketDir: dir + "/vm",
		NodeAddrs:   []netip.Addr{netip.MustParseAddr(ip)},
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) {
			return agenttest.NewMemoryDatapath(), nil
		},
	}
	if dp != nil {
		cfg.RoutingMode, cfg.MTU = agent.RoutingTunnel, 1450
		cfg.OpenDatapath = func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil }
	}
	a, err := agent.New(cfg, testLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	for _, args := range [][]string{
		{"link", "add", "lkt0", "type", "veth", "peer", "name", "lkt1"},
		{"addr", "add", ip + "/24", "dev", "lkt0"},
		{"link", "set", "lkt0", "up"}, {"link", "set", "lkt1", "up"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + path, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%s: ip %v: %v %s", n.Name, args, err, out)
		}
	}
	return a, path
}

// TestClaimOutranksSameSecondIncoming: KubeVirt's migration timestamps have
// one-second resolution. A VM migrated node-a -> node-b and straight back
// within one second: node-b's agent holds the VM active with the generation
// its incoming endpoint got (the first migration's start, T), and the claim
// of the migration back (started and completed in second T) must still
// outrank it, so node-b steps aside and routes the address to node-a rather
// than both nodes delivering it.
func TestClaimOutranksSameSecondIncoming(t *testing.T) {
	nodes := []any{claimNode("node-a", "192.168.0.1"), claimNode("node-b", "192.168.0.2")}
	nodes[1].(*corev1.Node).Spec.PodCIDR = "10.244.2.0/24"
	a, path := claimAgent(t, nodes[1].(*corev1.Node), nil)
	first, err := kubevirt.ParseVMI(mustJSON(t, fakeVMI(nil, running()).Object))
	if err != nil {
		t.Fatal(err)
	}
	m, err := first.Migration()
	if err != nil {
		t.Fatal(err)
	}
	vm := VMName("default", "vm1")
	if _, err := a.AddVM(agent.AddVMRequest{Name: vm, Netns: netnstest.New(t, "claimsvmb").Path(), Queues: 1,
		Address: netip.MustParseAddr("10.244.1.5"), Incoming: true, Generation: incomingGeneration(m)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ActivateVM(vm, "test"); err != nil {
		t.Fatal(err)
	}
	back := map[string]any{"migrationUid": "mig-2", "sourceNode": "node-b", "sourcePod": "virt-launcher-vm1-bbbbb",
		"targetNode": "node-a", "targetPod": "virt-launcher-vm1-ccccc", "startTimestamp": running()["startTimestamp"],
		"endTimestamp": running()["startTimestamp"], "completed": true}
	claims, errs := desiredClaims("node-b", []any{withIfaces(fakeVMI(nil, back), "10.244.1.5")}, nodes,
		lookupIn(launcherPods("6a1b3d5e", "10.244.1.5")))
	if len(claims) != 1 || len(errs) != 0 {
		t.Fatalf("claims %s, errors %v: want node-a's", claimsString(claims), errs)
	}
	_, superseded, err := a.SyncEndpointRoutes(claims)
	if err != nil || len(superseded) != 1 || superseded[0] != vm {
		t.Errorf("node-b superseded %v (%v) by node-a's claim %s: want %s to step aside", superseded, err, claimsString(claims), vm)
	}
	out, err := exec.Command("nsenter", "--net="+path, "ip", "-4", "route", "show", "10.244.1.5/32").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "via 192.168.0.1") {
		t.Errorf("node-b routes the address %q (%v), want via node-a", out, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func movedAddressOnAgents(t *testing.T, tunnel bool) {
	e := newEnv(t)
	ctx := context.Background()
	if err := k8stest.InstallKubeVirtCRD(ctx, e.srv.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{}
	agents := map[string]*agent.Agent{}
	maps := map[string]*tunnelMemDatapath{}
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		ip := fmt.Sprintf("192.168.0.%d", i+1)
		n := claimNode(name, ip)
		n.Spec.PodCIDR = fmt.Sprintf("10.244.%d.0/24", i+1)
		st := n.Status
		out := mustCreate(t, e.c.CoreV1().Nodes().Create, n)
		out.Status = st
		if _, err := e.c.CoreV1().Nodes().UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		var dp *tunnelMemDatapath
		if tunnel {
			dp = &tunnelMemDatapath{MemoryDatapath: agenttest.NewMemoryDatapath()}
			maps[name] = dp
		}
		a, path := claimAgent(t, n, dp)
		paths[name], agents[name] = path, a
		srcCfg := Config{NodeName: name, Client: e.c, Dynamic: e.dc, VMs: a, EndpointRoutes: a}
		if tunnel {
			srcCfg.Routes = peerSink{a}
		}
		run(t, srcCfg)
	}
	route := func(node string) string {
		out, err := exec.Command("nsenter", "--net="+paths[node], "ip", "-4", "route", "show", "10.244.1.5/32").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: ip route: %v %s", node, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// The VM runs on node-a; node-b has its incoming endpoint (the target
	// launcher's ADD, TestVMIResolverMigrationTarget/TestVMAttachmentIncoming).
	vm := VMName("default", "vm1")
	moved := netip.MustParseAddr("10.244.1.5")
	if _, err := agents["node-a"].AddVM(agent.AddVMRequest{Name: vm, Netns: netnstest.New(t, "claimsvma").Path(), Queues: 1, Address: moved}); err != nil {
		t.Fatal(err)
	}
	if _, err := agents["node-b"].AddVM(agent.AddVMRequest{Name: vm, Netns: netnstest.New(t, "claimsvmb").Path(), Queues: 1, Address: moved,
		Incoming: true, Generation: 1795654800_000000000}); err != nil {
		t.Fatal(err)
	}
	state := func(node string) string {
		vms, err := agents[node].ListVMs()
		if err != nil || len(vms) != 1 || vms[0].Endpoint.VM.Migration == nil {
			return fmt.Sprintf("%+v %v", vms, err)
		}
		return string(vms[0].Endpoint.VM.Migration.State)
	}
	if tunnel {
		for _, n := range []string{"node-a", "node-c"} {
			eventually(t, n+"'s node map has node-b's pod CIDR", func() bool { return maps[n].underlay("10.244.2.0/24") == "192.168.0.2" })
		}
	}
	vmis := e.dc.Resource(VMIResource).Namespace("default")
	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	// migrated creates a VMI named name whose launcher pods were given
	// given, and writes its status as after a completed migration to
	// node-b, with reported as its lanekit interface's address (what the
	// guest says).
	migrated := func(name, given, reported string) {
		t.Helper()
		u := fakeVMI(nil, nil)
		u.SetName(name)
		created, err := vmis.Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range launcherPods(string(created.GetUID()), given) {
			p.Name = strings.Replace(p.Name, "vm1", name, 1)
			mustCreate(t, e.c.CoreV1().Pods("default").Create, p)
		}
		st := done
		if name != "vm1" {
			st = map[string]any{}
			for k, v := range done {
				st[k] = v
			}
			st["sourcePod"] = strings.Replace(done["sourcePod"].(string), "vm1", name, 1)
			st["targetPod"] = strings.Replace(done["targetPod"].(string), "vm1", name, 1)
		}
		created.Object["status"] = withIfaces(fakeVMI(nil, st), reported).Object["status"]
		created.Object["status"].(map[string]any)["nodeName"] = "node-b"
		if _, err := vmis.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The attacks first (issue 36): a guest that was given 10.244.1.6 reports
	// a running pod's address on node-c after its migration to node-b; and a
	// namespace editor also rewrote their launcher pods' network-status to
	// name it (kubelet's status.podIPs of the victim still says whose it is).
	victim := pod("default", "victim", "node-c", nil)
	victim = mustCreate(t, e.c.CoreV1().Pods("default").Create, victim)
	victim.Status.Phase, victim.Status.PodIPs = corev1.PodRunning, []corev1.PodIP{{IP: "10.244.3.7"}}
	victim.Status.PodIP = "10.244.3.7"
	if _, err := e.c.CoreV1().Pods("default").UpdateStatus(ctx, victim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	migrated("evil", "10.244.1.6", "10.244.3.7")
	migrated("forger", "10.244.3.7", "10.244.3.7")
	migrated("vm1", "10.244.1.5", "10.244.1.5")
	for _, n := range []string{"node-a", "node-c"} {
		if !tunnel {
			eventually(t, n+" routes the moved address to node-b", func() bool { return strings.Contains(route(n), "via 192.168.0.2") })
			continue
		}
		// The claim's underlay is the one the node map has for node-b's
		// pod CIDR; the node's own traffic goes into the tunnel.
		eventually(t, n+"'s node map sends the moved address to node-b's underlay", func() bool {
			return maps[n].underlay("10.244.1.5/32") == "claim "+maps[n].underlay("10.244.2.0/24")
		})
		if r := route(n); !strings.Contains(r, "dev "+agent.TunnelDevice) {
			t.Errorf("%s routes the moved address %q, want into %s", n, r, agent.TunnelDevice)
		}
	}
	// The claims of all VMIs were computed together: the claims of node-c's
	// pod address made no node route it anywhere.
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		out, err := exec.Command("nsenter", "--net="+paths[n], "ip", "-4", "route", "show", "10.244.3.7/32").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("%s routes the victim's address 10.244.3.7, which a guest reported: %q %v", n, out, err)
		}
		if tunnel && maps[n].underlay("10.244.3.7/32") != "" {
			t.Errorf("%s's node map sends the victim's address to %s", n, maps[n].underlay("10.244.3.7/32"))
		}
	}
	eventually(t, "node-b activates its incoming endpoint", func() bool { return state("node-b") == string(endpoint.VMActive) })
	eventually(t, "node-a's VM is superseded", func() bool { return state("node-a") == string(endpoint.VMMoved) })
	if r := route("node-b"); strings.Contains(r, "via") || !strings.Contains(r, "dev lk") || strings.Contains(r, agent.TunnelDevice) {
		t.Errorf("node-b (the owner) routes its VM's address %q, want to its own endpoint", r)
	}
	if tunnel && maps["node-b"].underlay("10.244.1.5/32") != "" {
		t.Errorf("node-b (the owner) has a node map entry for its VM's address: %s", maps["node-b"].underlay("10.244.1.5/32"))
	}
	if err := vmis.Delete(ctx, "vm1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node-c drops the route with the VMI", func() bool { return route("node-c") == "" })
	if tunnel && maps["node-c"].underlay("10.244.1.5/32") != "" {
		t.Errorf("node-c's node map keeps the claim after the VMI went: %s", maps["node-c"].underlay("10.244.1.5/32"))
	}
}

// TestClaimInputsChanged: a pod update recomputes the claims only when it
// changes what they read (the launcher label, the node, the network-status,
// the addresses the pod holds), not on every status heartbeat.
func TestClaimInputsChanged(t *testing.T) {
	base := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n", Labels: map[string]string{labelCreatedBy: "uid-1"},
			Annotations: map[string]string{k8sobj.NetworkStatusAnnotation: `[{"name":"lanekit","ips":["10.244.1.6"]}]`}},
		Spec:   corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}}},
	}
	for name, change := range map[string]func(*corev1.Pod){
		"launcher label": func(p *corev1.Pod) { p.Labels[labelCreatedBy] = "uid-2" },
		"node":           func(p *corev1.Pod) { p.Spec.NodeName = "node-b" },
		"network-status": func(p *corev1.Pod) {
			p.Annotations[k8sobj.NetworkStatusAnnotation] = `[{"name":"lanekit","ips":["10.244.1.7"]}]`
		},
		// The same addresses, in other networks: what launcherNetworks returns changes.
		"networks": func(p *corev1.Pod) {
			p.Annotations[k8sobj.NetworkStatusAnnotation] = `[{"name":"lanekit","ips":["10.244.1.6"]},{"name":"other","ips":["10.244.1.5"]}]`
		},
		"pod IPs":  func(p *corev1.Pod) { p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.8"}} },
		"finished": func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded },
	} {
		cur := base.DeepCopy()
		change(cur)
		if !claimInputsChanged(slimPod(base), slimPod(cur)) {
			t.Errorf("%s changed: claims not recomputed", name)
		}
	}
	cur := base.DeepCopy()
	cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	cur.ResourceVersion = "7"
	if claimInputsChanged(slimPod(base), slimPod(cur)) {
		t.Error("a status update that changes no claim input recomputed the claims")
	}
}
