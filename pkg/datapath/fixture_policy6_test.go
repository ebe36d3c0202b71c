package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/policy"
)

// NetworkPolicy over IPv6 (bpf/lib/policy6.h): the policy fixtures' world
// with IPv6 addresses, judged through from_pod (its tail call into
// from_pod6), from_uplink (into from_uplink6) and to_pod: verdicts, drop
// reasons and counters, per-policy verdict counters, replies by IPv6
// conntrack.

// Remote pods' IPv6 addresses (routed via fd00:77::2 in newFixtureEnv6).
const (
	remoteBlue6  = "fd10:244:2::5" // beta/remote-client
	remoteRed6   = "fd10:244:2::6" // gamma/remote-client
	remoteAlpha6 = "fd10:244:2::7" // alpha/remote-client
	hostIP6      = "fd00:77::1"    // the fixture node's uplink address
)

// policyWorld6 is policyWorld with IPv6 addresses for the dual-stack
// endpoints (client and web locally; db stays IPv4-only) and the remote pods.
func policyWorld6(e *fixtureEnv) policy.Input {
	in := policyWorld(e)
	v6 := map[string]string{
		"alpha/client": pod1IP6, "alpha/web": pod2IP6,
		"beta/remote-client": remoteBlue6, "gamma/remote-client": remoteRed6, "alpha/remote-client": remoteAlpha6,
	}
	for i := range in.Endpoints {
		if a, ok := v6[in.Endpoints[i].Namespace+"/"+in.Endpoints[i].Name]; ok {
			in.Endpoints[i].IP6 = netip.MustParseAddr(a)
		}
	}
	return in
}

// polFrame6 is polFrameFlags for IPv6: TCP (flags), UDP, SCTP or an ICMPv6 echo
// request (id = sport) behind optional extension headers (ext wraps the L4
// header: ext6 calls; nil: none, next header is the L4 protocol).
func polFrame6(dst, src net.HardwareAddr, saddr, daddr string, proto uint8, sport, dport uint16, tcpFlags uint8) []byte {
	var l4 []byte
	nh := proto
	switch proto {
	case ipProtoTCP:
		l4 = make([]byte, 20+8)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		l4[12] = 5 << 4
		l4[13] = tcpFlags
	case ipProtoUDP:
		l4 = udp6(sport, dport)
	case ipProtoSCTP:
		l4 = make([]byte, 12+8)
		sctpHeader(l4, sport, dport)
	case nhICMP6:
		body := make([]byte, 4+8)
		binary.BigEndian.PutUint16(body[0:], sport)
		binary.BigEndian.PutUint16(body[2:], 1)
		l4 = icmp6(saddr, daddr, icmp6Echo, 0, body)
	}
	return eth6(dst, src, saddr, daddr, nh, 64, l4)
}

// icmp6ErrorFrame is an ICMPv6 packet too big from saddr to daddr quoting a
// TCP segment qsrc:sport -> qdst:dport.
func icmp6ErrorFrame(dst, src net.HardwareAddr, saddr, daddr, qsrc, qdst string, sport, dport uint16) []byte {
	return icmp6ErrorFrameProto(dst, src, saddr, daddr, qsrc, qdst, ipProtoTCP, sport, dport)
}

// icmp6ErrorFrameProto is icmp6ErrorFrame quoting a packet of protocol proto.
func icmp6ErrorFrameProto(dst, src net.HardwareAddr, saddr, daddr, qsrc, qdst string, proto uint8, sport, dport uint16) []byte {
	quoted := polFrame6(src, dst, qsrc, qdst, proto, sport, dport, tcpSYN)[14:]
	body := append([]byte{0, 0, 0x05, 0x00}, quoted...) // MTU 1280
	return eth6(dst, src, saddr, daddr, nhICMP6, 64, icmp6(saddr, daddr, 2, 0, body))
}

func fromPod1v6To(dst string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, dst, proto, nextSport(), dport, tcpSYN)
	}
}

func fromWire6(src, dst string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame6(e.up.Attrs().HardwareAddr, neighMAC, src, dst, proto, nextSport(), dport, tcpSYN)
	}
}

// fromStack6 is what the node's stack sends into web (to_pod).
func fromStack6(src string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		return polFrame6(pod2MAC, e.ep2.HostMAC, src, pod2IP6, proto, nextSport(), dport, tcpSYN)
	}
}

const (
	polClientEgress6 = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress6, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: "fd10:244:2::/64", except: ["fd10:244:2::100/120"]}
  - to:
    - podSelector: {matchLabels: {app: web}}
    ports:
    - {protocol: TCP, port: 8000, endPort: 8080}
  - to:
    - ipBlock: {cidr: 0.0.0.0/0}
`
	// The client isolated both ways, allowed out to one IPv6 range:
	// what comes back in passes only as a reply.
	polClientBoth6 = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-both6, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Ingress, Egress]
  egress:
  - to:
    - ipBlock: {cidr: "fd10:244:2::/64"}
`
)

func policy6Scenarios() []policyScenario {
	tcp := func(e *fixtureEnv, from int, sport, dport uint16, flags uint8) []byte {
		if from == 1 {
			return polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, pod2IP6, ipProtoTCP, sport, dport, flags)
		}
		return polFrame6(e.ep2.HostMAC, pod2MAC, pod2IP6, pod1IP6, ipProtoTCP, sport, dport, flags)
	}
	return []policyScenario{
		{
			name: "v6: identities (named port, namespaceSelector AND podSelector)", policies: polWebIngress,
			cases: []policyCase{
				{name: "local client to web:http over IPv6: allowed", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/web-ingress"}},
				{name: "local client to web:80 over IPv6: ingress denied, charged to web", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 80), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "local client to web:8080/UDP over IPv6: ingress denied", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoUDP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "local client to web:http behind a destination-options header: allowed (ports after the chain)", prog: fromPod, ifindex: ifH1,
					in: func(e *fixtureEnv) []byte {
						b := polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, pod2IP6, ipProtoTCP, nextSport(), 8080, tcpSYN)
						return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, pod2IP6, nhDstOpts, 64, ext6(nhTCP, b[54:]))
					},
					verdict: tcActRedirect, allowedBy: []string{"alpha/web-ingress"}},
				{name: "remote blue client to web:http over the wire: allowed", prog: fromUplink, ifindex: ifUp,
					in: fromWire6(remoteBlue6, pod2IP6, ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/web-ingress"}},
				{name: "remote red client to web:http over the wire: ingress denied", prog: fromUplink, ifindex: ifUp,
					in: fromWire6(remoteRed6, pod2IP6, ipProtoTCP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "an external IPv6 address to web:http: ingress denied (world6)", prog: fromUplink, ifindex: ifUp,
					in: fromWire6("fd99::7", pod2IP6, ipProtoTCP, 8080), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "to_pod: the node's own IPv6 address to web:80: passes (the node reaches its pods)", prog: toPod, ifindex: ifH2,
					in: fromStack6(hostIP6, ipProtoTCP, 80), verdict: tcActOK},
				{name: "to_pod: another address through the stack to web:80: ingress denied", prog: toPod, ifindex: ifH2,
					in: fromStack6("fd00:77::9", ipProtoTCP, 80), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyIngress, deniedBy: "alpha/web-ingress"},
				{name: "to_pod: an extension-header chain it cannot walk, for web: dropped", prog: toPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						p := udp6(1, 2)
						for range 9 {
							p = ext6(nhDstOpts, p)
						}
						return eth6(pod2MAC, e.ep2.HostMAC, hostIP6, pod2IP6, nhDstOpts, 64, p)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropIPv6ExtHdrs},
				{name: "web to the client (neither isolated that way): passes uncounted", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.ep2.HostMAC, pod2MAC, pod2IP6, pod1IP6, ipProtoUDP, nextSport(), 9999, 0)
					},
					verdict: tcActRedirect},
			},
		},
		{
			name: "v6: egress ipBlock with except, port range, the IPv4 world admits no IPv6", policies: polClientEgress6,
			cases: []policyCase{
				{name: "to fd10:244:2::5 (in the ipBlock): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To("fd10:244:2::5", ipProtoUDP, 53), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress6"}},
				{name: "to fd10:244:2::105 (in the except): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To("fd10:244:2::105", ipProtoUDP, 53), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress6"},
				{name: "to fd10:244:3::5 (outside; 0.0.0.0/0 is IPv4 only): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(noNeighIP6, ipProtoTCP, 443), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress6"},
				{name: "ICMPv6 echo to fd10:244:2::5 (ipBlock, no ports): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To("fd10:244:2::5", nhICMP6, 0), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress6"}},
				{name: "to web:8000/TCP (range start): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 8000), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress6"}},
				{name: "to web:8080/TCP (range end): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 8080), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress6"}},
				{name: "to web:7999/TCP (below the range): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 7999), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress6"},
				{name: "to web:8081/TCP (above the range): egress denied", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 8081), verdict: tcActShot, dropEP: 1, dropReason: DropPolicyEgress, deniedBy: "alpha/client-egress6"},
				{name: "IPv4 to 172.16.0.1 (0.0.0.0/0): allowed", prog: fromPod, ifindex: ifH1,
					in: fromPodTo("172.16.0.1", ipProtoTCP, 443), verdict: tcActRedirect, allowedBy: []string{"alpha/client-egress6"}},
			},
		},
		{
			name: "v6 conntrack: replies of allowed connections pass, new connections the other way do not", policies: polWebLocked,
			cases: []policyCase{
				{name: "client:41000 to web:8080 (SYN): allowed", prog: fromPod, ifindex: ifH1,
					in:      func(e *fixtureEnv) []byte { return tcp(e, 1, 41000, 8080, tcpSYN) },
					verdict: tcActRedirect, allowedBy: []string{"alpha/web-locked"}},
				{name: "web:8080 to client:41000 (SYN-ACK, a reply): passes unjudged", prog: fromPod, ifindex: ifH2,
					in:      func(e *fixtureEnv) []byte { return tcp(e, 2, 8080, 41000, tcpSYN|tcpACK) },
					verdict: tcActRedirect},
				{name: "client:41000 to web:8080 (ACK, later packet): passes unjudged", prog: fromPod, ifindex: ifH1,
					in:      func(e *fixtureEnv) []byte { return tcp(e, 1, 41000, 8080, tcpACK) },
					verdict: tcActRedirect},
				{name: "web's ICMPv6 packet too big quoting the allowed connection: passes with it", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return icmp6ErrorFrame(e.ep2.HostMAC, pod2MAC, pod2IP6, pod1IP6, pod1IP6, pod2IP6, 41000, 8080)
					},
					verdict: tcActRedirect},
				{name: "web's ICMPv6 error quoting a connection nobody allowed: egress denied", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return icmp6ErrorFrame(e.ep2.HostMAC, pod2MAC, pod2IP6, pod1IP6, pod1IP6, pod2IP6, 41999, 8080)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
				{name: "web:8080 to client:41001 (a new connection from web): egress denied", prog: fromPod, ifindex: ifH2,
					in:      func(e *fixtureEnv) []byte { return tcp(e, 2, 8080, 41001, tcpSYN) },
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
				{name: "remote client:42000 to web:8080 over the wire: allowed", prog: fromUplink, ifindex: ifUp,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.up.Attrs().HardwareAddr, neighMAC, remoteAlpha6, pod2IP6, ipProtoTCP, 42000, 8080, tcpSYN)
					},
					verdict: tcActRedirect, allowedBy: []string{"alpha/web-locked"}},
				{name: "web's reply to the remote client: passes unjudged, out of the uplink", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.ep2.HostMAC, pod2MAC, pod2IP6, remoteAlpha6, ipProtoTCP, 8080, 42000, tcpSYN|tcpACK)
					},
					verdict: tcActRedirect},
				{name: "web to the remote client on a new port: egress denied", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.ep2.HostMAC, pod2MAC, pod2IP6, remoteAlpha6, ipProtoTCP, 8080, 42001, tcpSYN)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
				{name: "a denied connection left no state: its retry is judged (and denied) again", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.ep2.HostMAC, pod2MAC, pod2IP6, remoteAlpha6, ipProtoTCP, 8080, 42001, tcpSYN)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-locked"},
			},
		},
		{
			name: "v6 conntrack: an ICMPv6 echo's reply passes into the ingress-isolated sender", policies: polClientBoth6,
			cases: []policyCase{
				{name: "client's echo request (id 777) to a remote pod: allowed", prog: fromPod, ifindex: ifH1,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, remoteBlue6, nhICMP6, 777, 0, 0)
					},
					verdict: tcActRedirect, allowedBy: []string{"alpha/client-both6"}},
				{name: "its echo reply over the wire: passes into the client", prog: fromUplink, ifindex: ifUp,
					in: func(e *fixtureEnv) []byte {
						body := make([]byte, 4+8)
						binary.BigEndian.PutUint16(body[0:], 777)
						return eth6(e.up.Attrs().HardwareAddr, neighMAC, remoteBlue6, pod1IP6, nhICMP6, 64,
							icmp6(remoteBlue6, pod1IP6, 129, 0, body))
					},
					verdict: tcActRedirect},
				{name: "the remote pod's own echo request (id 778): ingress denied", prog: fromUplink, ifindex: ifUp,
					in: func(e *fixtureEnv) []byte {
						return polFrame6(e.up.Attrs().HardwareAddr, neighMAC, remoteBlue6, pod1IP6, nhICMP6, 778, 0, 0)
					},
					verdict: tcActShot, dropEP: 1, dropReason: DropPolicyIngress, deniedBy: "alpha/client-both6"},
				{name: "the client's own IPv6 neighbour solicitation for the gateway: still answered", prog: fromPod, ifindex: ifH1,
					in: func(e *fixtureEnv) []byte {
						return ns6(e.ep1.HostMAC, pod1MAC, pod1LL, solicitedGW, gwIP6, pod1MAC, 255)
					},
					verdict: tcActRedirect},
			},
		},
		{
			name: "v6: no policies, everything passes", policies: "",
			cases: []policyCase{
				{name: "client to web:80 over IPv6 passes once the policies are gone", prog: fromPod, ifindex: ifH1,
					in: fromPod1v6To(pod2IP6, ipProtoTCP, 80), verdict: tcActRedirect},
			},
		},
	}
}

// TestIPv6PolicyFixtures: NetworkPolicy over IPv6, each verdict through the
// programs with the drop reason, the endpoint charged and the deciding
// policy's verdict counter (runPolicyCase).
func TestIPv6PolicyFixtures(t *testing.T) {
	e := newFixtureEnv6(t)
	e.enter(t)
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr(hostIP6)}); err != nil {
		t.Fatal(err)
	}
	runPolicyScenariosIn(t, e, policyWorld6, policy6Scenarios())
}
