package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
)

// IP protocol numbers in policy fixtures.
const (
	ipProtoICMP = 1
	ipProtoTCP  = 6
	ipProtoUDP  = 17
	ipProtoSCTP = 132
)

// polFrame builds Ethernet + IPv4 (TTL 64, valid header checksum) + a TCP SYN,
// a UDP header, an SCTP common header or an ICMP echo request (id = sport)
// with a short payload.
func polFrame(dst, src net.HardwareAddr, saddr, daddr string, proto uint8, sport, dport uint16) []byte {
	return polFrameFlags(dst, src, saddr, daddr, proto, sport, dport, tcpSYN)
}

// polFrameFlags is polFrame with the TCP flags given.
func polFrameFlags(dst, src net.HardwareAddr, saddr, daddr string, proto uint8, sport, dport uint16, tcpFlags uint8) []byte {
	l4len := map[uint8]int{ipProtoTCP: 20, ipProtoUDP: 8, ipProtoSCTP: 12, ipProtoICMP: 8}[proto]
	payload := []byte("policy fixture")
	b := testutil.EthIPv4(dst, src, saddr, daddr, 64, proto, l4len+len(payload))
	l4 := b[34:]
	switch proto {
	case ipProtoTCP:
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		l4[12] = 5 << 4
		l4[13] = tcpFlags
	case ipProtoUDP:
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
	case ipProtoSCTP: // common header: ports, verification tag, CRC32c (unchecked by the datapath)
		sctpHeader(l4, sport, dport)
	case ipProtoICMP:
		l4[0] = 8 // echo request
		binary.BigEndian.PutUint16(l4[4:], sport)
	}
	copy(b[14+20+l4len:], payload)
	return b
}

// icmpErrorFrame builds an ICMP "fragmentation needed" from saddr to daddr
// quoting a TCP segment qsrc:sport -> qdst:dport.
func icmpErrorFrame(dst, src net.HardwareAddr, saddr, daddr, qsrc, qdst string, sport, dport uint16) []byte {
	return icmpErrorFrameProto(dst, src, saddr, daddr, qsrc, qdst, ipProtoTCP, sport, dport)
}

// icmpErrorFrameProto is icmpErrorFrame quoting a packet of protocol proto.
func icmpErrorFrameProto(dst, src net.HardwareAddr, saddr, daddr, qsrc, qdst string, proto uint8, sport, dport uint16) []byte {
	b := polFrame(dst, src, saddr, daddr, ipProtoICMP, 0, 0)[:34]
	quoted := polFrameFlags(src, dst, qsrc, qdst, proto, sport, dport, tcpSYN)[14 : 14+28]
	icmp := append([]byte{3, 4, 0, 0, 0, 0, 0x05, 0xdc}, quoted...)
	b = append(b, icmp...)
	binary.BigEndian.PutUint16(b[16:], uint16(20+len(icmp)))
	binary.BigEndian.PutUint16(b[24:], testutil.IPv4Checksum(b[14:34]))
	return b
}

// decodePolicies decodes NetworkPolicy YAML the way the CLI does.
func decodePolicies(t *testing.T, yaml string) []*networkingv1.NetworkPolicy {
	t.Helper()
	objs, err := k8sobj.Decode([]byte(yaml))
	if err != nil {
		t.Fatalf("decode policies: %v", err)
	}
	_, _, pols := k8sobj.Split(objs)
	return pols
}

// policyWorld is the cluster the policy fixtures compile against: the
// fixture env's three local endpoints plus pods on other nodes.
func policyWorld(e *fixtureEnv) policy.Input {
	return policy.Input{
		NamespaceLabels: map[string]map[string]string{
			"alpha": {"team": "blue"},
			"beta":  {"team": "blue"},
			"gamma": {"team": "red"},
		},
		Endpoints: []policy.Endpoint{
			{Namespace: "alpha", Name: "client", IP: e.ep1.IP, Labels: map[string]string{"app": "client"}},
			{Namespace: "alpha", Name: "web", IP: e.ep2.IP, Labels: map[string]string{"app": "web"},
				NamedPorts: []policy.NamedPort{{Name: "http", Proto: policy.ProtoTCP, Port: 8080}}},
			{Namespace: "beta", Name: "db", IP: e.ep3.IP, Labels: map[string]string{"app": "db"}},
			{Namespace: "beta", Name: "remote-client", IP: netip.MustParseAddr("10.244.2.5"), Labels: map[string]string{"app": "client"}},
			{Namespace: "gamma", Name: "remote-client", IP: netip.MustParseAddr("10.244.2.6"), Labels: map[string]string{"app": "client"}},
			{Namespace: "alpha", Name: "remote-client", IP: netip.MustParseAddr("10.244.2.7"), Labels: map[string]string{"app": "client"}},
		},
	}
}

// applyWorldPolicies compiles the fixture world (policyWorld) under the
// NetworkPolicies in yaml and applies the result to the maps.
func applyWorldPolicies(t *testing.T, e *fixtureEnv, yaml string) *policy.Compiled {
	t.Helper()
	in := policyWorld(e)
	in.Policies = decodePolicies(t, yaml)
	c, err := policy.Compile(in, policy.NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
	return c
}

// policyCase is one packet through one program under a policy set.
type policyCase struct {
	name    string
	prog    func(e *fixtureEnv) *ebpf.Program
	ifindex func(e *fixtureEnv) int
	in      func(e *fixtureEnv) []byte
	verdict uint32
	// Drops: the endpoint charged and the reason.
	dropEP     uint32
	dropReason DropReason
	// The verdict counters that must grow by one ("ns/name"); none: no
	// policy counter may change (a direction that is not isolated).
	allowedBy []string
	deniedBy  string
}

// policyScenario is a policy set and the packets judged under it.
type policyScenario struct {
	name     string
	policies string // NetworkPolicy YAML
	cases    []policyCase
}

// fixtureSport hands out source ports (ICMP echo ids): every packet of the
// fixtures opens a connection of its own, so that conntrack (which lets
// later packets of an allowed connection pass unjudged) does not carry
// verdicts from one case to the next.
var fixtureSport uint16 = 30000

func nextSport() uint16 {
	fixtureSport++
	return fixtureSport
}

func fromPodTo(dst string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", dst, proto, nextSport(), dport)
	}
}

func fromPod2To(dst string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", dst, proto, nextSport(), dport)
	}
}

func fromWire(src, dst string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame(e.up.Attrs().HardwareAddr, neighMAC, src, dst, proto, nextSport(), dport)
	}
}

const (
	polWebIngress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: blue}}
      podSelector: {matchLabels: {app: client}}
    ports:
    - port: http
`
	polPodVsNamespace = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-own-namespace-clients, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-red-namespaces, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: red}}
`
	polClientEgress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 192.168.0.0/16, except: [192.168.1.0/24]}
  - to:
    - podSelector: {matchLabels: {app: web}}
    ports:
    - {protocol: TCP, port: 8000, endPort: 8080}
`
	polWebLocked = `
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
    - {protocol: TCP, port: 8080}
`
	polDBOpen = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-open, namespace: beta}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress, Egress]
  ingress:
  - {}
`
	polDBAnyProto = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-alpha, namespace: beta}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: alpha}}
`
)

func policyScenarios() []policyScenario {
	return []policyScenario{
		{
			name: "named port, namespaceSelector AND podSelector", policies: polWebIngress,
			cases: []policyCase{
				{name: "local client to web:http (8080/TCP): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/web-ingress"}},
				{name: "local client to web:80/TCP (not the named port): ingress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 80), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "local client to web:8080/UDP (http is TCP): ingress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoUDP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "remote client in a blue namespace to web:http: allowed", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.5", "10.244.1.11", ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/web-ingress"}},
				{name: "remote client in a red namespace to web:http: ingress denied", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.6", "10.244.1.11", ipProtoTCP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "external address to web:http: ingress denied", prog: fromUplink, ifindex: ifUp,
					in: fromWire("192.168.7.7", "10.244.1.11", ipProtoTCP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "web to the client (neither isolated that way): passes uncounted", prog: fromPod, ifindex: ifH2,
					in: fromPod2To("10.244.1.10", ipProtoUDP, 9999), verdict: tcActRedirect},
				{name: "non-isolated client to anywhere: passes uncounted", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("8.8.8.8", ipProtoICMP, 0), verdict: tcActRedirect},
				{name: "remote pod to the non-isolated db VM: passes uncounted", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.6", "10.244.1.12", ipProtoTCP, 5432), verdict: tcActRedirect},
			},
		},
		{
			name: "podSelector alone is the policy's namespace; namespaceSelector alone is every pod there", policies: polPodVsNamespace,
			cases: []policyCase{
				{name: "client in the policy's namespace: allowed on any port", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 1), verdict: tcActRedirect, allowedBy: []string{"alpha/from-own-namespace-clients"}},
				{name: "client of another (blue) namespace: ingress denied", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.5", "10.244.1.11", ipProtoTCP, 80), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/from-own-namespace-clients"},
				{name: "pod of a red namespace: allowed by the namespaceSelector policy", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.6", "10.244.1.11", ipProtoUDP, 53), verdict: tcActRedirect, allowedBy: []string{"alpha/from-red-namespaces"}},
			},
		},
		{
			name: "egress: ipBlock with except, port range edges", policies: polClientEgress,
			cases: []policyCase{
				{name: "to 192.168.2.5 (in the ipBlock): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("192.168.2.5", ipProtoUDP, 53), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress"}},
				{name: "to 192.168.1.5 (in the except): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("192.168.1.5", ipProtoUDP, 53), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress"},
				{name: "to 172.16.0.1 (outside the ipBlock): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("172.16.0.1", ipProtoTCP, 443), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress"},
				{name: "to web:8000/TCP (range start): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 8000), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress"}},
				{name: "to web:8080/TCP (range end): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress"}},
				{name: "to web:7999/TCP (below the range): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 7999), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress"},
				{name: "to web:8081/TCP (above the range): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 8081), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress"},
				{name: "to web:8000/UDP (the range is TCP): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoUDP, 8000), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress"},
				{name: "ICMP to web (the rule has ports): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoICMP, 0), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress"},
				{name: "the isolated client still receives (ingress not isolated)", prog: fromPod, ifindex: ifH2,
					in: fromPod2To("10.244.1.10", ipProtoTCP, 40000), verdict: tcActRedirect},
			},
		},
		{
			name: "a rule without ports allows every protocol", policies: polDBAnyProto,
			cases: []policyCase{
				{name: "ICMP from alpha to the db VM: allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.12", ipProtoICMP, 0), verdict: tcActRedirect, allowedBy: []string{"beta/db-from-alpha"}},
				{name: "UDP from alpha to the db VM: allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.12", ipProtoUDP, 9999), verdict: tcActRedirect, allowedBy: []string{"beta/db-from-alpha"}},
				{name: "TCP from alpha to the db VM: allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.12", ipProtoTCP, 5432), verdict: tcActRedirect, allowedBy: []string{"beta/db-from-alpha"}},
				{name: "ICMP from gamma to the db VM: ingress denied", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.6", "10.244.1.12", ipProtoICMP, 0), verdict: tcActShot, dropEP: 3, dropReason: DropPolicyIngress, deniedBy: "beta/db-from-alpha"},
			},
		},
		{
			name: "an empty rule allows every peer, port and protocol; no egress rule denies all", policies: polDBOpen,
			cases: []policyCase{
				{name: "ICMP from an external address to the db VM: allowed", prog: fromUplink, ifindex: ifUp,
					in: fromWire("8.8.8.8", "10.244.1.12", ipProtoICMP, 0), verdict: tcActRedirect, allowedBy: []string{"beta/db-open"}},
				{name: "TCP from a gamma pod to the db VM: allowed", prog: fromUplink, ifindex: ifUp,
					in: fromWire("10.244.2.6", "10.244.1.12", ipProtoTCP, 65535), verdict: tcActRedirect, allowedBy: []string{"beta/db-open"}},
				{name: "the db VM's own new connection: egress denied", prog: fromPod, ifindex: ifH3,
					in: func(e *fixtureEnv) []byte {
						return polFrame(e.ep3.HostMAC, vm3MAC, "10.244.1.12", "10.244.1.10", ipProtoUDP, nextSport(), 53)
					},
					verdict: tcActShot, dropEP: 3, dropReason: DropPolicyEgress, deniedBy: "beta/db-open"},
			},
		},
		{
			// web may receive on 8080 from clients and send nothing
			// (egress isolated without rules): only replies of the
			// connections it accepted leave it.
			name: "conntrack: replies of allowed connections pass, new connections the other way do not", policies: polWebLocked,
			cases: []policyCase{
				{name: "client:41000 to web:8080 (SYN): allowed", prog: fromPod, ifindex: ifH1,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", ipProtoTCP, 41000, 8080, tcpSYN)
					},
					verdict: tcActRedirect, allowedBy: []string{"alpha/web-locked"}},
				{name: "web:8080 to client:41000 (SYN-ACK, a reply): passes unjudged", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.1.10", ipProtoTCP, 8080, 41000, tcpSYN|tcpACK)
					},
					verdict: tcActRedirect},
				{name: "client:41000 to web:8080 (ACK, later packet): passes unjudged", prog: fromPod, ifindex: ifH1,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", ipProtoTCP, 41000, 8080, tcpACK)
					},
					verdict: tcActRedirect},
				{name: "web's ICMP error quoting the allowed connection: passes with it", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return icmpErrorFrame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.1.10", "10.244.1.10", "10.244.1.11", 41000, 8080)
					},
					verdict: tcActRedirect},
				{name: "web's ICMP error quoting a connection nobody allowed: egress denied", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return icmpErrorFrame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.1.10", "10.244.1.10", "10.244.1.11", 41999, 8080)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
				{name: "web:8080 to client:41001 (a new connection from web): egress denied", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.1.10", ipProtoTCP, 8080, 41001, tcpSYN)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
				{name: "remote client:42000 to web:8080 over the wire: allowed", prog: fromUplink, ifindex: ifUp,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.7", "10.244.1.11", ipProtoTCP, 42000, 8080, tcpSYN)
					},
					verdict: tcActRedirect, allowedBy: []string{"alpha/web-locked"}},
				{name: "web's reply to the remote client: passes unjudged, out of the uplink", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.2.7", ipProtoTCP, 8080, 42000, tcpSYN|tcpACK)
					},
					verdict: tcActRedirect},
				{name: "web to the remote client on a new port: egress denied", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.2.7", ipProtoTCP, 8080, 42001, tcpSYN)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
				{name: "a denied connection left no state: its retry is judged (and denied) again", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.2.7", ipProtoTCP, 8080, 42001, tcpSYN)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
			},
		},
		{
			name: "no policies: everything passes", policies: "",
			cases: []policyCase{
				{name: "client to web:80 again passes once the policy is gone", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("10.244.1.11", ipProtoTCP, 80), verdict: tcActRedirect},
				{name: "client to 172.16.0.1 passes", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("172.16.0.1", ipProtoTCP, 443), verdict: tcActRedirect},
			},
		},
	}
}

// runPolicyCase runs one case and checks its verdict and counters.
func runPolicyCase(t *testing.T, e *fixtureEnv, c *policy.Compiled, pc policyCase) {
	t.Helper()
	index := func(name string) uint32 {
		for i, p := range c.Policies {
			if p.String() == name {
				return uint32(i)
			}
		}
		t.Fatalf("no policy %s", name)
		return 0
	}
	name := func(idx uint32) string {
		if int(idx) < len(c.Policies) {
			return c.Policies[idx].String()
		}
		return "not in this compilation"
	}
	verdictsBefore, err := e.dp.PolicyVerdicts()
	if err != nil {
		t.Fatal(err)
	}
	var dropsBefore Counters
	if pc.dropReason != DropNone {
		if dropsBefore, err = e.dp.Counters(pc.dropEP); err != nil {
			t.Fatal(err)
		}
	}
	in := pc.in(e)
	opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: make([]byte, len(in)+256), Context: skbCtx{Ifindex: uint32(pc.ifindex(e))}}
	ret, err := pc.prog(e).Run(opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if ret != pc.verdict {
		t.Fatalf("verdict %d, want %d", ret, pc.verdict)
	}
	if pc.dropReason != DropNone {
		after, err := e.dp.Counters(pc.dropEP)
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Drops[pc.dropReason] - dropsBefore.Drops[pc.dropReason]; d != 1 {
			t.Fatalf("drop counter %s of endpoint %d grew by %d, want 1", pc.dropReason, pc.dropEP, d)
		}
	}
	verdictsAfter, err := e.dp.PolicyVerdicts()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]PolicyVerdict{}
	for _, n := range pc.allowedBy {
		v := want[index(n)]
		v.Allowed++
		want[index(n)] = v
	}
	if pc.deniedBy != "" {
		v := want[index(pc.deniedBy)]
		v.Denied++
		want[index(pc.deniedBy)] = v
	}
	for idx := range verdictsAfter {
		got := PolicyVerdict{verdictsAfter[idx].Allowed - verdictsBefore[idx].Allowed, verdictsAfter[idx].Denied - verdictsBefore[idx].Denied}
		if got != want[idx] {
			t.Errorf("policy %d (%s): verdicts grew by %+v, want %+v", idx, name(idx), got, want[idx])
		}
	}
	for idx, w := range want {
		if _, ok := verdictsAfter[idx]; !ok {
			t.Errorf("policy %d (%s): no verdicts counted, want %+v", idx, name(idx), w)
		}
	}
}

// TestPolicyFixtures compiles real NetworkPolicy objects with pkg/policy,
// applies each set as a Diff from the previous one, and judges packets
// through from_pod and from_uplink: verdict, drop reason and counter, and
// the per-policy verdict counter of the deciding policy.
func TestPolicyFixtures(t *testing.T) {
	runPolicyScenarios(t, policyScenarios())
}

// runPolicyScenarios runs scenarios in order on one fixture env, each
// policy set applied as a Diff from the previous one.
func runPolicyScenarios(t *testing.T, scenarios []policyScenario) {
	runPolicyScenariosIn(t, newFixtureEnv(t), policyWorld, scenarios)
}

// runPolicyScenariosIn is runPolicyScenarios on the env e, compiling the
// cluster world(e).
func runPolicyScenariosIn(t *testing.T, e *fixtureEnv, world func(*fixtureEnv) policy.Input, scenarios []policyScenario) {
	ids := policy.NewIdentities()
	var prev *policy.Compiled
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			e.enter(t)
			in := world(e)
			if sc.policies != "" {
				in.Policies = decodePolicies(t, sc.policies)
			}
			c, err := policy.Compile(in, ids)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.dp.ApplyPolicy(policy.Diff(prev, c)); err != nil {
				t.Fatal(err)
			}
			prev = c
			dumped, err := e.dp.DumpPolicy()
			if err != nil {
				t.Fatal(err)
			}
			if u := policy.Diff(dumped, c); u.Ops() != 0 {
				t.Fatalf("maps after applying the diff differ from the compilation: %s", u)
			}
			for _, pc := range sc.cases {
				t.Run(pc.name, func(t *testing.T) {
					e.enter(t)
					runPolicyCase(t, e, c, pc)
				})
			}
		})
	}
}
