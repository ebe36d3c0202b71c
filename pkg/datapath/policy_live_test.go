package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

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
	after, _ := e.dp.Counters(2)
	if d := after.Drops[DropPolicyIngress] - before.Drops[DropPolicyIngress]; d < 2 {
		t.Errorf("web's policy-ingress drops grew by %d, want >= 2 (client and remote SYNs)", d)
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
