package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/vishvananda/netlink"
)

// IPv6 fixtures (bpf/lib/ipv6.h, ndp.h, ip6_ext.h): every IPv6 verdict of
// from_pod (through its tail call into from_pod6), from_uplink and to_pod.

const (
	pod1IP6      = "fd10:244:1::a"
	pod2IP6      = "fd10:244:1::b"
	pod4IP6      = "fd10:244:1::d" // the L3 (netkit) endpoint
	pod1LL       = "fe80::a"
	remoteIP6    = "fd10:244:2::5" // via fd00:77::2, neighbour known
	noNeighIP6   = "fd10:244:3::5" // via fd00:77::3, no neighbour
	blackholeIP6 = "fd10:99::1"
	gwIP6        = "fe80::1"
	solicitedGW  = "ff02::1:ff00:1" // solicited-node multicast of fe80::1
)

// IPv6 next headers and ICMPv6 types used below.
const (
	nhHop, nhTCP, nhUDP, nhRouting, nhFrag, nhICMP6, nhDstOpts = 0, 6, 17, 43, 44, 58, 60
	icmp6Echo, icmp6RA, icmp6NS, icmp6NA, icmp6Redirect        = 128, 134, 135, 136, 137
)

var solicitedGWMAC = mustMAC("33:33:ff:00:00:01")

// eth6 builds Ethernet + IPv6 (next header nh, hop limit hop) + payload.
func eth6(dst, src net.HardwareAddr, saddr, daddr string, nh, hop byte, payload []byte) []byte {
	b := make([]byte, 14+40+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], 0x86dd)
	ip := b[14:54]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(payload)))
	ip[6] = nh
	ip[7] = hop
	s, d := netip.MustParseAddr(saddr).As16(), netip.MustParseAddr(daddr).As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	copy(b[54:], payload)
	return b
}

// ext6 is an 8-byte extension header (hop-by-hop, destination options or
// routing: the same layout) naming next, padded with a PadN option, in
// front of rest.
func ext6(next byte, rest []byte) []byte {
	return append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, rest...)
}

// frag6 is a fragment header (offset in 8-byte units, more fragments) in
// front of rest.
func frag6(next byte, offset uint16, more bool, rest []byte) []byte {
	h := []byte{next, 0, 0, 0, 0, 0, 0, 42}
	v := offset << 3
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(h[2:], v)
	return append(h, rest...)
}

func udp6(sport, dport uint16) []byte {
	b := make([]byte, 8+16)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	copy(b[8:], "lanekit fixture.")
	return b
}

// tcp6 is a 20-byte TCP header (ACK) and n payload bytes.
func tcp6(n int) []byte {
	b := make([]byte, 20+n)
	binary.BigEndian.PutUint16(b[0:], 40000)
	binary.BigEndian.PutUint16(b[2:], 5201)
	b[12] = 5 << 4
	b[13] = 0x10
	return b
}

// icmp6 is an ICMPv6 message (type, code, body after the checksum) with a
// valid checksum for saddr -> daddr.
func icmp6(saddr, daddr string, typ, code byte, body []byte) []byte {
	m := append([]byte{typ, code, 0, 0}, body...)
	binary.BigEndian.PutUint16(m[2:], icmp6Checksum(saddr, daddr, m))
	return m
}

func icmp6Checksum(saddr, daddr string, m []byte) uint16 {
	s, d := netip.MustParseAddr(saddr).As16(), netip.MustParseAddr(daddr).As16()
	var sum uint32
	add := func(b []byte) {
		for i := 0; i < len(b); i += 2 {
			v := uint32(b[i]) << 8
			if i+1 < len(b) {
				v |= uint32(b[i+1])
			}
			sum += v
		}
	}
	add(s[:])
	add(d[:])
	var ph [8]byte
	binary.BigEndian.PutUint32(ph[0:], uint32(len(m)))
	ph[7] = nhICMP6
	add(ph[:])
	c := bytes.Clone(m)
	c[2], c[3] = 0, 0
	add(c)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// ndBody is an NS/NA body after the checksum: flags (4 bytes), target and a
// link-layer address option (optType 0: none).
func ndBody(flags uint32, target string, optType byte, mac net.HardwareAddr) []byte {
	b := make([]byte, 4, 4+16+8)
	binary.BigEndian.PutUint32(b, flags)
	t := netip.MustParseAddr(target).As16()
	b = append(b, t[:]...)
	if optType != 0 {
		b = append(b, optType, 1)
		b = append(b, mac...)
	}
	return b
}

// ns6 is the endpoint's neighbour solicitation for target, from saddr.
func ns6(hostMAC, srcMAC net.HardwareAddr, saddr, daddr, target string, sllao net.HardwareAddr, hop byte) []byte {
	var opt byte
	if sllao != nil {
		opt = 1
	}
	dst := hostMAC
	if daddr == solicitedGW {
		dst = solicitedGWMAC
	}
	return eth6(dst, srcMAC, saddr, daddr, nhICMP6, hop, icmp6(saddr, daddr, icmp6NS, 0, ndBody(0, target, opt, sllao)))
}

// naFromGateway is the advertisement the datapath answers a solicitation
// for the gateway with.
func naFromGateway(podMAC, hostMAC net.HardwareAddr, podAddr string, withOpt bool) []byte {
	var opt byte
	if withOpt {
		opt = 2
	}
	return eth6(podMAC, hostMAC, gwIP6, podAddr, nhICMP6, 255,
		icmp6(gwIP6, podAddr, icmp6NA, 0, ndBody(0xe0000000, gwIP6, opt, hostMAC)))
}

// routed6 returns in with new MACs and the hop limit decremented.
func routed6(in []byte, dst, src net.HardwareAddr) []byte {
	out := bytes.Clone(in)
	copy(out[0:6], dst)
	copy(out[6:12], src)
	out[14+7]--
	return out
}

// bigTCP6 is pod 1's TCP packet to daddr as the kernel's BIG TCP marks it:
// payload_len 0 and a hop-by-hop header with one option of type opt
// (0xc2: jumbo payload) giving the real payload length.
func bigTCP6(daddr string, opt byte) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte {
		b := eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, daddr, nhHop, 64, append([]byte{nhTCP, 0, opt, 4, 0, 0, 0, 0}, tcp6(2880)...))
		binary.BigEndian.PutUint16(b[14+4:], 0)
		binary.BigEndian.PutUint32(b[14+40+4:], uint32(len(b)-14-40))
		return b
	}
}

func fromPod1v6(daddr string, nh byte, payload []byte) func(e *fixtureEnv) []byte {
	return func(e *fixtureEnv) []byte { return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, daddr, nh, 64, payload) }
}

// newFixtureEnv6 is newFixtureEnv with IPv6: forwarding on, an uplink
// address, a permanent neighbour fd00:77::2, routes like the IPv4 ones, and
// IPv6 addresses for endpoints 1, 2 and 4 (3 and 5 stay IPv4-only). Only the
// uplink has IPv6 enabled, so the kernel's own neighbour discovery on the pod
// devices cannot add to the counters the fixtures read.
func newFixtureEnv6(t *testing.T) *fixtureEnv {
	t.Helper()
	return withIPv6(t, newFixtureEnv(t))
}

// withIPv6 adds newFixtureEnv6's IPv6 set-up to an environment.
func withIPv6(t *testing.T, e *fixtureEnv) *fixtureEnv {
	t.Helper()
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		testutil.MissingDep(t, "IPv6 is off in this kernel (ipv6.disable=1?): %v", err)
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("ipv6 forwarding", os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644))
	must("ipv6 on the uplink", os.WriteFile("/proc/sys/net/ipv6/conf/lk-fx-up/disable_ipv6", []byte("0"), 0o644))
	addr, _ := netlink.ParseAddr("fd00:77::1/64")
	addr.Flags = 0x02 // IFA_F_NODAD
	must("uplink addr6", netlink.AddrAdd(e.up, addr))
	must("neigh6", netlink.NeighAdd(&netlink.Neigh{LinkIndex: e.up.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("fd00:77::2"), HardwareAddr: neighMAC, Family: netlink.FAMILY_V6}))
	route := func(cidr, gw string, typ int) {
		_, dst, _ := net.ParseCIDR(cidr)
		r := &netlink.Route{Dst: dst, Type: typ, Family: netlink.FAMILY_V6}
		if gw != "" {
			r.Gw = net.ParseIP(gw)
			r.LinkIndex = e.up.Attrs().Index
		}
		must("route "+cidr, netlink.RouteAdd(r))
	}
	route("fd10:244:2::/64", "fd00:77::2", 0)
	route("fd10:244:3::/64", "fd00:77::3", 0) // no neighbour: NO_NEIGH
	route("fd10:99::/32", "", 6)              // RTN_BLACKHOLE
	e.ep1.IP6 = mustAddr(pod1IP6)
	e.ep2.IP6 = mustAddr(pod2IP6)
	must("upsert ep1", e.dp.UpsertEndpoint(e.ep1))
	must("upsert ep2", e.dp.UpsertEndpoint(e.ep2))
	e.ep4.IP6 = mustAddr(pod4IP6)
	info := e.ep4.info()
	must("ep4 by ifindex", e.dp.pod.LkEpByIfindex.Put(uint32(e.ep4.IfIndex), info))
	must("ep4 by ipv6", e.dp.pod.LkEndpoints6.Put(e.ep4.IP6.As16(), info))
	return e
}

func ipv6Fixtures() []fixture {
	zero := make(net.HardwareAddr, 6)
	spoofMAC := mustMAC("02:00:00:66:66:66")
	return []fixture{
		// Routing.
		{
			name: "v6 pod to local pod: redirect_peer into pod 2, hop limit - 1", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhUDP, udp6(40000, 5201)),
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, pod2MAC, e.ep2.HostMAC) },
		},
		{
			name: "v6 pod to remote pod (neighbour known): fib redirect out of the uplink", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(remoteIP6, nhTCP, tcp6(100)),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, neighMAC, e.up.Attrs().HardwareAddr) },
		},
		{
			name: "v6 pod to remote pod (no neighbour): redirect_neigh", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(noNeighIP6, nhUDP, udp6(40000, 5201)),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 3,
			out: func(e *fixtureEnv, in []byte) []byte {
				out := bytes.Clone(in)
				out[14+7]--
				return out
			},
		},
		{
			name: "v6 blackhole route: drop fib-failed", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(blackholeIP6, nhUDP, udp6(40000, 5201)),
			verdict: tcActShot, dropEP: 1, dropReason: DropFIBFailed,
		},
		{
			name: "v6 hop limit 1: to the stack (ICMPv6 time exceeded)", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, remoteIP6, nhUDP, 1, udp6(40000, 5201))
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 multicast: to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(mustMAC("33:33:00:00:00:fb"), pod1MAC, pod1IP6, "ff02::fb", nhUDP, 255, udp6(5353, 5353))
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 to the node (no forwarding route: NOT_FWDED): to the stack", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6("fd00:77::1", nhICMP6, icmp6(pod1IP6, "fd00:77::1", icmp6Echo, 0, []byte{0, 1, 0, 1})),
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 GSO TCP whose segments fit the uplink MTU: redirected", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(remoteIP6, nhTCP, tcp6(2880)),
			gsoSize: 1440, // 40 + 20 + 1440 = 1500
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, neighMAC, e.up.Attrs().HardwareAddr) },
		},
		{
			name: "v6 GSO TCP whose segments exceed the uplink MTU (extension header counted): to the stack (Packet Too Big)",
			prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(remoteIP6, nhDstOpts, ext6(nhTCP, tcp6(2880))),
			gsoSize: 1440, // 40 + 8 + 20 + 1440 = 1508
			verdict: tcActOK, stackEP: 1,
		},
		// BIG TCP: the kernel's jumbo hop-by-hop header on a GSO packet
		// (payload_len 0). Fixtures are a few KiB; the length check is the
		// same as for 192 KiB.
		{
			name: "v6 BIG TCP GSO packet (jumbo hop-by-hop) to a local pod: forwarded by the datapath", prog: fromPod, ifindex: ifH1,
			in: bigTCP6(pod2IP6, 0xc2), gsoSize: 1440,
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, pod2MAC, e.ep2.HostMAC) },
		},
		{
			name: "v6 BIG TCP GSO packet to a remote node: routed, the jumbo header not counted against the MTU",
			prog: fromPod, ifindex: ifH1,
			in:      bigTCP6(remoteIP6, 0xc2),
			gsoSize: 1440, // 40 + 20 + 1440 = 1500 once segmented (the 8-byte header goes)
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, neighMAC, e.up.Attrs().HardwareAddr) },
		},
		{
			name: "v6 BIG TCP GSO packet whose segments exceed the uplink MTU by a byte: to the stack (Packet Too Big)",
			prog: fromPod, ifindex: ifH1,
			in:      bigTCP6(remoteIP6, 0xc2),
			gsoSize: 1441, // 40 + 20 + 1441 = 1501
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 jumbo hop-by-hop on a packet that is not GSO: to the stack", prog: fromPod, ifindex: ifH1,
			in: bigTCP6(pod2IP6, 0xc2), verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 GSO packet whose hop-by-hop option is not jumbo: to the stack", prog: fromPod, ifindex: ifH1,
			in: bigTCP6(pod2IP6, 0x05), gsoSize: 1440, verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 packet larger than the uplink MTU: to the stack (Packet Too Big)", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(remoteIP6, nhTCP, tcp6(1600)),
			verdict: tcActOK, stackEP: 1,
		},
		// Extension headers.
		{
			name: "v6 destination options + routing header before TCP: walked and routed", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhDstOpts, ext6(nhRouting, ext6(nhTCP, tcp6(10)))),
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, pod2MAC, e.ep2.HostMAC) },
		},
		{
			name: "v6 hop-by-hop options: to the stack (a router must read them)", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhHop, ext6(nhUDP, udp6(40000, 5201))),
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "v6 chain of 9 extension headers (limit 8): drop ipv6-ext-headers", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				p := udp6(40000, 5201)
				next := byte(nhUDP)
				for i := 0; i < 9; i++ {
					p = ext6(next, p)
					next = nhDstOpts
				}
				return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, pod2IP6, nhDstOpts, 64, p)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropIPv6ExtHdrs,
		},
		{
			name: "v6 extension header running past the packet: drop ipv6-ext-headers", prog: fromPod, ifindex: ifH1,
			in: fromPod1v6(pod2IP6, nhDstOpts, func() []byte {
				h := ext6(nhUDP, nil)
				h[1] = 4 // claims 40 bytes, the packet has 8
				return h
			}()),
			verdict: tcActShot, dropEP: 1, dropReason: DropIPv6ExtHdrs,
		},
		{
			name: "v6 fragment header cut short: drop ipv6-ext-headers", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhFrag, []byte{nhUDP, 0, 0}),
			verdict: tcActShot, dropEP: 1, dropReason: DropIPv6ExtHdrs,
		},
		{
			name: "v6 later fragment (no L4 header): routed", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhFrag, frag6(nhICMP6, 10, false, make([]byte, 16))),
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, pod2MAC, e.ep2.HostMAC) },
		},
		{
			name: "v6 EtherType with IP version 5 in the header: drop malformed", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				b := fromPod1v6(pod2IP6, nhUDP, udp6(40000, 5201))(e)
				b[14] = 0x50
				return b
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		// Anti-spoofing.
		{
			name: "v6 spoofed source address: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, pod1MAC, pod2IP6, remoteIP6, nhUDP, 64, udp6(40000, 5201))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "v6 link-local source to a routed destination: drop spoofed-ip", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, pod1MAC, pod1LL, remoteIP6, nhUDP, 64, udp6(40000, 5201))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "v6 spoofed source MAC: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, spoofMAC, pod1IP6, remoteIP6, nhUDP, 64, udp6(40000, 5201))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedMAC,
		},
		{
			name: "v6 from an IPv4-only endpoint: drop unsupported-l3", prog: fromPod, ifindex: ifH3,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep3.HostMAC, vm3MAC, pod1IP6, remoteIP6, nhUDP, 64, udp6(40000, 5201))
			},
			verdict: tcActShot, dropEP: 3, dropReason: DropUnsupported,
		},
		{
			name: "v6 router advertisement from a pod: drop router-message", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(mustMAC("33:33:00:00:00:01"), pod1MAC, pod1LL, "ff02::1", nhICMP6, 255,
					icmp6(pod1LL, "ff02::1", icmp6RA, 0, make([]byte, 12)))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropRouterMsg,
		},
		{
			name: "v6 router advertisement behind a destination-options header: drop router-message", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(mustMAC("33:33:00:00:00:01"), pod1MAC, pod1LL, "ff02::1", nhDstOpts, 255,
					ext6(nhICMP6, icmp6(pod1LL, "ff02::1", icmp6RA, 0, make([]byte, 12))))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropRouterMsg,
		},
		{
			name: "v6 ICMPv6 redirect from a pod: drop router-message", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhICMP6, icmp6(pod1IP6, pod2IP6, icmp6Redirect, 0, make([]byte, 36))),
			verdict: tcActShot, dropEP: 1, dropReason: DropRouterMsg,
		},
		{
			name: "v6 DHCPv6 server reply (547 -> 546) from a pod: drop router-message", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhUDP, udp6(547, 546)),
			verdict: tcActShot, dropEP: 1, dropReason: DropRouterMsg,
		},
		{
			name: "v6 ICMPv6 type not in the packet: drop malformed", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(pod2IP6, nhICMP6, nil),
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "v6 MLD report from the pod's link-local address: to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(mustMAC("33:33:00:00:00:16"), pod1MAC, pod1LL, "ff02::16", nhHop, 1,
					ext6(nhICMP6, icmp6(pod1LL, "ff02::16", 143, 0, make([]byte, 4))))
			},
			verdict: tcActOK, stackEP: 1,
		},
		// Neighbour discovery.
		{
			name: "NS for the gateway (multicast, SLLAO): answered with NA + TLLA, back into the pod", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, pod1LL, solicitedGW, gwIP6, pod1MAC, 255)
			},
			verdict: tcActRedirect, redirIf: ifH1, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return naFromGateway(pod1MAC, e.ep1.HostMAC, pod1LL, true) },
		},
		{
			name: "NS for the gateway (unicast NUD, no SLLAO) from the global address: NA without TLLA", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, pod1IP6, gwIP6, gwIP6, nil, 255)
			},
			verdict: tcActRedirect, redirIf: ifH1, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return naFromGateway(pod1MAC, e.ep1.HostMAC, pod1IP6, false) },
		},
		{
			name: "NS with another MAC in its SLLAO: drop spoofed-mac", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, pod1LL, solicitedGW, gwIP6, spoofMAC, 255)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedMAC,
		},
		{
			name: "NS from another pod's address: drop spoofed-ip", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, pod2IP6, solicitedGW, gwIP6, pod1MAC, 255)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "NS with hop limit 64 (not from the link): drop malformed", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, pod1LL, solicitedGW, gwIP6, pod1MAC, 64)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "NS with a zero-length option: drop malformed", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				b := ns6(e.ep1.HostMAC, pod1MAC, pod1LL, solicitedGW, gwIP6, pod1MAC, 255)
				b[len(b)-7] = 0
				return b
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "NS in a fragment: drop malformed (RFC 6980)", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				m := icmp6(pod1LL, solicitedGW, icmp6NS, 0, ndBody(0, gwIP6, 1, pod1MAC))
				return eth6(solicitedGWMAC, pod1MAC, pod1LL, solicitedGW, nhFrag, 255, frag6(nhICMP6, 0, false, m))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "NS resolving the host's link-local address: to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, pod1LL, "ff02::1:ff00:99", "fe80::99", pod1MAC, 255)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "DAD NS (source ::) for the pod's own address: to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, "::", "ff02::1:ff00:a", pod1IP6, nil, 255)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "DAD NS (source ::) claiming another pod's address: drop spoofed-ip", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return ns6(e.ep1.HostMAC, pod1MAC, "::", "ff02::1:ff00:b", pod2IP6, nil, 255)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "NA for the pod's own address (answering the host): to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fe80::99", nhICMP6, 255,
					icmp6(pod1IP6, "fe80::99", icmp6NA, 0, ndBody(0x60000000, pod1IP6, 2, pod1MAC)))
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "NA claiming another pod's address: drop spoofed-ip", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fe80::99", nhICMP6, 255,
					icmp6(pod1IP6, "fe80::99", icmp6NA, 0, ndBody(0x20000000, pod2IP6, 2, pod1MAC)))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "NA claiming the gateway's address: drop spoofed-ip", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(mustMAC("33:33:00:00:00:01"), pod1MAC, pod1LL, "ff02::1", nhICMP6, 255,
					icmp6(pod1LL, "ff02::1", icmp6NA, 0, ndBody(0x20000000, gwIP6, 2, pod1MAC)))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "NA with another MAC in its TLLA: drop spoofed-mac", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fe80::99", nhICMP6, 255,
					icmp6(pod1IP6, "fe80::99", icmp6NA, 0, ndBody(0x60000000, pod1IP6, 2, spoofMAC)))
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedMAC,
		},
		{
			name: "NS from an L3 endpoint (crafted: L3 devices have no neighbours): drop", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return ns6(zero, zero, pod4IP6, solicitedGW, gwIP6, nil, 255)
			},
			verdict: tcActShot, dropEP: 4, dropReason: DropUnsupported,
		},
		{
			name: "v6 from an L3 endpoint (all-zero MACs): routed by source address", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return eth6(zero, zero, pod4IP6, pod2IP6, nhUDP, 64, udp6(40000, 5201))
			},
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, pod2MAC, e.ep2.HostMAC) },
		},
		// The uplink and the stack's side.
		{
			name: "uplink: v6 for a local pod goes straight into it", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.up.Attrs().HardwareAddr, neighMAC, remoteIP6, pod1IP6, nhTCP, 63, tcp6(10))
			},
			verdict: tcActRedirect, redirIf: ifH1, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, pod1MAC, e.ep1.HostMAC) },
		},
		{
			name: "uplink: v6 for a local pod with hop limit 1: to the stack", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.up.Attrs().HardwareAddr, neighMAC, remoteIP6, pod1IP6, nhTCP, 1, tcp6(10))
			},
			verdict: tcActOK,
		},
		{
			name: "uplink: v6 for no local endpoint: to the stack", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return eth6(e.up.Attrs().HardwareAddr, neighMAC, remoteIP6, "fd10:244:1::99", nhTCP, 63, tcp6(10))
			},
			verdict: tcActOK,
		},
		{
			name: "to_pod: v6 from the stack to a pod no policy selects: passes", prog: toPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return eth6(pod1MAC, e.ep1.HostMAC, "fd00:77::1", pod1IP6, nhTCP, 64, tcp6(10))
			},
			verdict: tcActOK,
		},
	}
}

// TestIPv6Fixtures runs every IPv6 verdict through the programs.
func TestIPv6Fixtures(t *testing.T) {
	runFixtures(t, newFixtureEnv6(t), ipv6Fixtures())
}
