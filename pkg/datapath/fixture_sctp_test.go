package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/policy"
)

// SCTP under NetworkPolicy. An object listing an SCTP port is kept (refusing
// a NetworkPolicy for its SCTP rule left the pods it selects open: the
// upstream e2e "should properly isolate pods that are selected by a policy
// allowing SCTP, even if the plugin doesn't support SCTP"). An SCTP rule is
// protocol 132 in the rule key, and the datapath reads SCTP's ports (the
// first 4 bytes of its common header, as TCP's and UDP's) and tracks SCTP
// associations in conntrack, so IP protocol 132 packets are judged exactly
// like TCP and UDP: an SCTP rule admits SCTP to its ports and nothing else,
// no TCP or UDP rule admits SCTP, and the replies of an admitted association
// (and ICMP errors quoting it) pass. This kernel has no SCTP sockets; the packets are raw IP protocol 132,
// which any pod can send.

const (
	// web allows SCTP to 8080 in and sends nothing new itself.
	polWebSCTP = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-sctp, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress, Egress]
  ingress:
  - ports:
    - {protocol: SCTP, port: 8080}
`
	polWebTCPOnly = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-tcp, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports:
    - {protocol: TCP, port: 8080}
`
	polWebSCTPAnyPort = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-sctp-any, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports:
    - {protocol: SCTP}
`
)

// sctpFamily is one address family of the SCTP fixtures: its environment,
// cluster world, addresses and frame builder.
type sctpFamily struct {
	name               string
	env                func(t *testing.T) *fixtureEnv
	world              func(*fixtureEnv) policy.Input
	client, web, peer  string // local client (pod1), local web (pod2), a remote pod
	frame              func(dst, src net.HardwareAddr, saddr, daddr string, proto uint8, sport, dport uint16) []byte
	icmpErr            func(dst, src net.HardwareAddr, saddr, daddr, qsrc, qdst string, proto uint8, sport, dport uint16) []byte
	hostAddrsForPolicy []netip.Addr
}

var sctpFamilies = []sctpFamily{
	{name: "IPv4", env: newFixtureEnv, world: policyWorld, client: "10.244.1.10", web: "10.244.1.11", peer: "10.244.2.5",
		frame: func(dst, src net.HardwareAddr, saddr, daddr string, proto uint8, sport, dport uint16) []byte {
			return polFrameFlags(dst, src, saddr, daddr, proto, sport, dport, tcpSYN)
		},
		icmpErr: icmpErrorFrameProto},
	{name: "IPv6", env: newFixtureEnv6, world: policyWorld6, client: pod1IP6, web: pod2IP6, peer: remoteBlue6,
		frame: func(dst, src net.HardwareAddr, saddr, daddr string, proto uint8, sport, dport uint16) []byte {
			return polFrame6(dst, src, saddr, daddr, proto, sport, dport, tcpSYN)
		},
		icmpErr:            icmp6ErrorFrameProto,
		hostAddrsForPolicy: []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr(hostIP6)}},
}

// TestPolicySCTPRuleIsolates judges TCP, UDP and IP protocol 132 packets
// through from_pod, from_uplink and conntrack under policies with and
// without SCTP rules, in both families: the pods a policy allowing only
// SCTP selects stay isolated (TCP and UDP to the SCTP port dropped by
// ingress policy, counted against web and that policy), SCTP passes only to
// the rule's port, its replies pass by conntrack, a TCP rule admits no SCTP,
// a port-less SCTP rule admits every SCTP port and no TCP or UDP, and a pod
// no policy selects takes SCTP unjudged.
func TestPolicySCTPRuleIsolates(t *testing.T) {
	for _, fam := range sctpFamilies {
		t.Run(fam.name, func(t *testing.T) {
			e := fam.env(t)
			if fam.hostAddrsForPolicy != nil {
				e.enter(t)
				if err := e.dp.SetPolicyHostAddrs(fam.hostAddrsForPolicy); err != nil {
					t.Fatal(err)
				}
			}
			runPolicyScenariosIn(t, e, fam.world, sctpScenarios(fam))
		})
	}
}

func sctpScenarios(fam sctpFamily) []policyScenario {
	// Packets with fixed ports (a connection and its reply) or fresh source
	// ports (each its own connection: sport 0).
	fromClient := func(proto uint8, sport, dport uint16) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			if sport == 0 {
				sport = nextSport()
			}
			return fam.frame(e.ep1.HostMAC, pod1MAC, fam.client, fam.web, proto, sport, dport)
		}
	}
	fromWeb := func(proto uint8, sport, dport uint16) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			return fam.frame(e.ep2.HostMAC, pod2MAC, fam.web, fam.client, proto, sport, dport)
		}
	}
	fromPeer := func(dst string, proto uint8, dport uint16) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			return fam.frame(e.up.Attrs().HardwareAddr, neighMAC, fam.peer, dst, proto, nextSport(), dport)
		}
	}
	local := func(name string, in func(e *fixtureEnv) []byte) policyCase {
		return policyCase{name: name, prog: fromPod, ifindex: ifH1, in: in}
	}
	remote := func(name string, in func(e *fixtureEnv) []byte) policyCase {
		return policyCase{name: name, prog: fromUplink, ifindex: ifUp, in: in}
	}
	denied := func(c policyCase, by string) policyCase {
		c.verdict, c.dropEP, c.dropReason, c.deniedBy = tcActShot, 2, DropPolicyIngress, by
		return c
	}
	allowed := func(c policyCase, by string) policyCase {
		c.verdict = tcActRedirect
		if by != "" {
			c.allowedBy = []string{by}
		}
		return c
	}
	return []policyScenario{
		{
			name: "a policy allowing only SCTP/8080 isolates its pods", policies: polWebSCTP,
			cases: []policyCase{
				denied(local("client to web:8080/TCP: ingress denied", fromClient(ipProtoTCP, 0, 8080)), "alpha/web-sctp"),
				denied(local("client to web:8080/UDP: ingress denied", fromClient(ipProtoUDP, 0, 8080)), "alpha/web-sctp"),
				denied(remote("remote pod to web:8080/TCP: ingress denied", fromPeer(fam.web, ipProtoTCP, 8080)), "alpha/web-sctp"),
				denied(remote("remote pod to web:8080/UDP: ingress denied", fromPeer(fam.web, ipProtoUDP, 8080)), "alpha/web-sctp"),
				denied(local("client to web:9090/SCTP (another port): ingress denied", fromClient(ipProtoSCTP, 0, 9090)), "alpha/web-sctp"),
				allowed(local("client:41000 to web:8080/SCTP: allowed", fromClient(ipProtoSCTP, 41000, 8080)), "alpha/web-sctp"),
				allowed(remote("remote pod to web:8080/SCTP: allowed", fromPeer(fam.web, ipProtoSCTP, 8080)), "alpha/web-sctp"),
				// web is egress-isolated without rules: only conntrack lets
				// its answers out.
				allowed(policyCase{name: "web:8080 to client:41000/SCTP (the association's reply): passes unjudged",
					prog: fromPod, ifindex: ifH2, in: fromWeb(ipProtoSCTP, 8080, 41000)}, ""),
				allowed(policyCase{name: "web's ICMP error quoting the admitted association: passes with it", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return fam.icmpErr(e.ep2.HostMAC, pod2MAC, fam.web, fam.client, fam.client, fam.web, ipProtoSCTP, 41000, 8080)
					}}, ""),
				{name: "web's ICMP error quoting an association nobody admitted: egress denied", prog: fromPod, ifindex: ifH2,
					in: func(e *fixtureEnv) []byte {
						return fam.icmpErr(e.ep2.HostMAC, pod2MAC, fam.web, fam.client, fam.client, fam.web, ipProtoSCTP, 41999, 8080)
					},
					verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-sctp"},
				{name: "web:8080 to client:41001/SCTP (a new association from web): egress denied", prog: fromPod, ifindex: ifH2,
					in: fromWeb(ipProtoSCTP, 8080, 41001), verdict: tcActShot, dropEP: 2, dropReason: DropPolicyEgress, deniedBy: "alpha/web-sctp"},
				allowed(remote("remote pod to client/SCTP (no policy selects client): passes unjudged", fromPeer(fam.client, ipProtoSCTP, 8080)), ""),
			},
		},
		{
			name: "a TCP rule admits no SCTP", policies: polWebTCPOnly,
			cases: []policyCase{
				allowed(local("client to web:8080/TCP: allowed", fromClient(ipProtoTCP, 0, 8080)), "alpha/web-tcp"),
				denied(local("client to web:8080/SCTP: ingress denied", fromClient(ipProtoSCTP, 0, 8080)), "alpha/web-tcp"),
				denied(remote("remote pod to web:8080/SCTP: ingress denied", fromPeer(fam.web, ipProtoSCTP, 8080)), "alpha/web-tcp"),
			},
		},
		{
			name: "an SCTP rule without a port admits every SCTP port, no TCP or UDP", policies: polWebSCTPAnyPort,
			cases: []policyCase{
				allowed(local("client to web:9/SCTP: allowed", fromClient(ipProtoSCTP, 0, 9)), "alpha/web-sctp-any"),
				allowed(local("client to web:65535/SCTP: allowed", fromClient(ipProtoSCTP, 0, 65535)), "alpha/web-sctp-any"),
				denied(local("client to web:9/TCP: ingress denied", fromClient(ipProtoTCP, 0, 9)), "alpha/web-sctp-any"),
				denied(local("client to web:9/UDP: ingress denied", fromClient(ipProtoUDP, 0, 9)), "alpha/web-sctp-any"),
			},
		},
	}
}

// sctpHeader writes an SCTP common header (RFC 9260 3.1) into b[:12]: the
// ports where TCP and UDP have them, a verification tag.
func sctpHeader(b []byte, sport, dport uint16) {
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], 0x5c7a9001)
}
