package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lanekit/lanekit/pkg/policy"
)

// TestLivePolicy: real TCP connections through the kernel under a policy
// that admits clients to web on one port and closes web's egress: the
// allowed connection completes (web's SYN-ACK and data pass its closed
// egress through conntrack), the others fail where the drop counters say,
// and the node reaches web on any port (pods cannot block their node).
func TestLivePolicy(t *testing.T) {
	e := newLiveEnv(t)
	open := e.echo(t, e.pod2, "10.244.1.11")
	closed := e.echo(t, e.pod2, "10.244.1.11")
	remote := e.echo(t, e.remote, "10.244.2.1")
	port := netip.MustParseAddrPort(open).Port()
	in := policy.Input{
		Endpoints: []policy.Endpoint{
			{Namespace: "alpha", Name: "client", IP: e.ep1.IP, Labels: map[string]string{"app": "client"}},
			{Namespace: "alpha", Name: "web", IP: e.ep2.IP, Labels: map[string]string{"app": "web"}},
		},
		Policies: decodePolicies(t, fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-locked, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
    ports:
    - {protocol: TCP, port: %d}
`, port)),
	}
	c, err := policy.Compile(in, policy.NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1")}); err != nil {
		t.Fatal(err)
	}
	fails := func(name string, from netns.NsHandle, addr string) {
		t.Helper()
		var err error
		e.in(t, from, func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp4", addr, time.Second); err == nil {
				c.Close()
			}
		})
		if err == nil {
			t.Errorf("%s: connected to %s, want the policy to block it", name, addr)
		}
	}
	before, _ := e.dp.Counters(2)
	if err := e.roundTrip(t, e.pod1, open); err != nil {
		t.Errorf("client to web on the open port: %v", err)
	}
	if err := e.roundTrip(t, e.node, closed); err != nil {
		t.Errorf("node to web on another port: %v", err)
	}
	fails("client to web on another port", e.pod1, closed)
	fails("remote address to web on the open port", e.remote, open)
	fails("web to the remote node", e.pod2, remote)
	// A second NIC: the node's stack routes it into web, past from_pod and
	// from_uplink; to_pod (tcx egress of web's host end) judges it.
	side := e.secondNIC(t)
	fails("an address behind a second NIC to web on the open port", side, open)
	after, _ := e.dp.Counters(2)
	if d := after.Drops[DropPolicyIngress] - before.Drops[DropPolicyIngress]; d < 3 {
		t.Errorf("web's policy-ingress drops grew by %d, want >= 3 (client, remote and second-NIC SYNs)", d)
	}
	if d := after.Drops[DropPolicyEgress] - before.Drops[DropPolicyEgress]; d < 1 {
		t.Errorf("web's policy-egress drops grew by %d, want >= 1", d)
	}
	v, err := e.dp.PolicyVerdicts()
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Allowed != 1 {
		t.Errorf("web-locked allowed %d connections, want exactly 1 (later packets and replies are not judged)", v[0].Allowed)
	}
}

// secondNIC adds a namespace behind a second device of the node (no lanekit
// program on it): 10.78.0.2 reaches the pods through the node's stack.
func (e *liveEnv) secondNIC(t *testing.T) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	side, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { side.Close() })
	netns.Set(e.orig)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("second NIC: %s: %v", what, err)
		}
	}
	e.in(t, e.node, func() {
		must("veth", netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lk-lv-side"}, PeerName: "eth1"}))
		p, err := netlink.LinkByName("eth1")
		must("peer", err)
		must("move peer", netlink.LinkSetNsFd(p, int(side)))
		l, err := netlink.LinkByName("lk-lv-side")
		must("link", err)
		must("up", netlink.LinkSetUp(l))
		a, _ := netlink.ParseAddr("10.78.0.1/24")
		must("addr", netlink.AddrAdd(l, a))
	})
	e.in(t, side, func() {
		lo, _ := netlink.LinkByName("lo")
		must("lo up", netlink.LinkSetUp(lo))
		l, err := netlink.LinkByName("eth1")
		must("eth1", err)
		must("eth1 up", netlink.LinkSetUp(l))
		a, _ := netlink.ParseAddr("10.78.0.2/24")
		must("addr", netlink.AddrAdd(l, a))
		_, pods, _ := net.ParseCIDR("10.244.1.0/24")
		must("route", netlink.RouteAdd(&netlink.Route{Dst: pods, Gw: net.ParseIP("10.78.0.1"), LinkIndex: l.Attrs().Index}))
	})
	// Ready when a connection to the node across it completes (link up,
	// neighbours resolved): a failure to reach a pod after this is a verdict.
	node := e.echo(t, e.node, "10.78.0.1")
	err = nil
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = e.roundTrip(t, side, node); err == nil {
			return side
		}
	}
	t.Fatalf("second NIC: the node is not reachable across it: %v", err)
	return side
}
