package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

func toPod(e *fixtureEnv) *ebpf.Program { return e.dp.pod.ToPod }

// fromStack is a packet the node's stack sends into web (10.244.1.11, the
// fixture's endpoint 2) out of its host end.
func fromStack(src string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame(pod2MAC, e.ep2.HostMAC, src, "10.244.1.11", proto, nextSport(), dport)
	}
}

// TestToPodJudgesTheStackPath: what the host stack routes into a pod (the
// node, a second NIC, a tunnel, packets handed to the stack) meets the pod's
// ingress policy in to_pod; the node's own addresses pass there (kubelet's
// probes), but not when they arrive from the wire.
func TestToPodJudgesTheStackPath(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	c := applyWorldPolicies(t, e, polWebIngress)
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1")}); err != nil {
		t.Fatal(err)
	}
	for _, pc := range []policyCase{
		{name: "a beta client on node 2, routed by the stack, to web:80 (http is 8080): ingress denied", prog: toPod, ifindex: ifH2,
			in: fromStack("10.244.2.5", ipProtoTCP, 80), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
		{name: "the world through a second NIC to web:http: ingress denied", prog: toPod, ifindex: ifH2,
			in: fromStack("192.0.2.9", ipProtoTCP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
		{name: "an alpha client on node 2, routed by the stack, to web:http: allowed", prog: toPod, ifindex: ifH2,
			in: fromStack("10.244.2.7", ipProtoTCP, 8080), verdict: tcActOK, allowedBy: []string{"alpha/web-ingress"}},
		{name: "the node itself to web:9999 (a kubelet probe): allowed", prog: toPod, ifindex: ifH2,
			in: fromStack("10.77.0.1", ipProtoTCP, 9999), verdict: tcActOK},
		{name: "the node's address from the wire to web:9999: ingress denied", prog: fromUplink, ifindex: ifUp,
			in: fromWire("10.77.0.1", "10.244.1.11", ipProtoTCP, 9999), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
	} {
		t.Run(pc.name, func(t *testing.T) {
			e.enter(t)
			runPolicyCase(t, e, c, pc)
		})
	}
	// A destination that is no endpoint's address (the subnet broadcast)
	// is not judged.
	bcast := polFrame(pod2MAC, e.ep2.HostMAC, "192.0.2.9", "10.244.1.255", ipProtoUDP, nextSport(), 137)
	ret, err := toPod(e).Run(&ebpf.RunOptions{Data: bcast, Context: skbCtx{Ifindex: uint32(ifH2(e))}})
	if err != nil || ret != tcActOK {
		t.Errorf("broadcast through to_pod: verdict %d (%v), want pass", ret, err)
	}
}
