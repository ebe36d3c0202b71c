package datapath

import (
	"net/netip"
	"testing"
)

// ipBlocks that cover pods: a peer matches by identity or by address, the
// union (Kubernetes semantics; bpf/lib/policy.h's CIDR fallback). The
// fixture world's pods: 10.244.1.10 alpha client, .11 alpha web, .12 beta db
// (local); 10.244.2.5 beta client, .6 gamma client, .7 alpha client (remote).
const (
	// The client may reach node 1's pods on 80/TCP except the db VM, and
	// one remote pod by its /32 (the example).
	polClientToPodCIDR = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-to-pods, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.1.0/24, except: [10.244.1.12/32]}}]
    ports: [{protocol: TCP, port: 80}]
  - to: [{ipBlock: {cidr: 10.244.2.6/32}}]
`
	// web admits node 2's pods by address except the gamma client, and
	// its own namespace's clients by label on 8080.
	polWebFromPodCIDR = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-pods, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: 10.244.2.0/24, except: [10.244.2.6/32]}}]
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: TCP, port: 8080}]
`
)

func ipBlockScenarios() []policyScenario {
	return []policyScenario{
		{
			name: "egress: ipBlocks covering pod addresses, with except", policies: polClientToPodCIDR,
			cases: []policyCase{
				{name: "to the local web pod:80/TCP (in the /24): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 80), verdict: tcActRedirect, allowedBy: []string{"alpha/client-to-pods"}},
				{name: "to the local db VM:80/TCP (in the except): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.12", ipProtoTCP, 80), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-to-pods"},
				{name: "to the local web pod:81/TCP (the rule's port is 80): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 81), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-to-pods"},
				{name: "to the remote pod 10.244.2.6 (its /32, every port): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.2.6", ipProtoUDP, 53), verdict: tcActRedirect, allowedBy: []string{"alpha/client-to-pods"}},
				{name: "to the remote pod 10.244.2.5 (in no ipBlock): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.2.5", ipProtoTCP, 80), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-to-pods"},
			},
		},
		{
			name: "ingress: ipBlocks covering pod addresses, with except, or a podSelector (union)", policies: polWebFromPodCIDR,
			cases: []policyCase{
				{name: "from remote beta client (in the /24, no label match): allowed on any port", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.5", "10.244.1.11", ipProtoTCP, 9999), verdict: tcActRedirect, allowedBy: []string{"alpha/web-from-pods"}},
				{name: "from remote alpha client (in the /24 and the podSelector): allowed off 8080 by address", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.7", "10.244.1.11", ipProtoUDP, 53), verdict: tcActRedirect, allowedBy: []string{"alpha/web-from-pods"}},
				{name: "from remote gamma client (in the except): ingress denied", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.6", "10.244.1.11", ipProtoTCP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-from-pods"},
				{name: "from the local client to web:8080 (podSelector only): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/web-from-pods"}},
				{name: "from the local client to web:9999 (neither): ingress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 9999), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-from-pods"},
			},
		},
	}
}

// TestPolicyIPBlockCoversPods: an ipBlock matches every address in it, pods'
// included, in both directions, with except, through from_pod and
// from_uplink.
func TestPolicyIPBlockCoversPods(t *testing.T) {
	runPolicyScenarios(t, ipBlockScenarios())
}

// TestPolicyIPBlockCoversNode: the node's own addresses (the host identity
// in the ipcache) also match by address: an ipBlock lets a pod under an
// egress policy open connections to its node, with except.
func TestPolicyIPBlockCoversNode(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	applyWorldPolicies(t, e, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-to-nodes, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.77.0.0/24, except: [10.77.0.2/32]}}]
    ports: [{protocol: TCP, port: 10250}]
`)
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.77.0.2")}); err != nil {
		t.Fatal(err)
	}
	syn := func(dst string, dport uint16) []byte {
		return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", dst, ipProtoTCP, nextSport(), dport, tcpSYN)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		shot bool
	}{
		{"SYN to the node 10.77.0.1:10250 (in the ipBlock): allowed", syn("10.77.0.1", 10250), false},
		{"SYN to the node 10.77.0.2:10250 (in the except): egress denied", syn("10.77.0.2", 10250), true},
		{"SYN to the node 10.77.0.1:22 (the rule's port is 10250): egress denied", syn("10.77.0.1", 22), true},
	} {
		if ret := runPod(t, e, ifH2(e), tc.in); (ret == tcActShot) != tc.shot {
			t.Errorf("%s: verdict %d", tc.name, ret)
		}
	}
}
