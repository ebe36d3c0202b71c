package datapath

import (
	"bytes"
	"encoding/binary"
	"net"

	"github.com/lanekit/lanekit/internal/testutil"
)

// Edge-case fixtures: sizes against the MTU (GSO and not), IP options and
// fragments, broadcast/multicast, ARP corner cases, VLAN tags in the frame,
// and the L3 (netkit) endpoint mode.

// sizedFrame is a UDP frame whose IPv4 total length is ipLen.
func sizedFrame(dst, src net.HardwareAddr, saddr, daddr string, ipLen int) []byte {
	return testutil.UDPFrame(dst, src, saddr, daddr, 64, bytes.Repeat([]byte{0xa5}, ipLen-28))
}

// tcpFrame is sizedFrame carrying TCP (a 20-byte header: data offset 5).
func tcpFrame(dst, src net.HardwareAddr, saddr, daddr string, ipLen int) []byte {
	b := sizedFrame(dst, src, saddr, daddr, ipLen)
	b[14+9] = 6
	binary.BigEndian.PutUint16(b[24:], testutil.IPv4Checksum(b[14:34]))
	clear(b[34:54])
	b[34+12] = 0x50
	return b
}

// withOptions inserts a 4-byte IPv4 option field (NOP NOP NOP EOL): IHL 6.
func withOptions(in []byte) []byte {
	out := make([]byte, 0, len(in)+4)
	out = append(out, in[:34]...)
	out = append(out, 1, 1, 1, 0)
	out = append(out, in[34:]...)
	out[14] = 0x46
	binary.BigEndian.PutUint16(out[16:], binary.BigEndian.Uint16(out[16:])+4)
	binary.BigEndian.PutUint16(out[24:], testutil.IPv4Checksum(out[14:38]))
	return out
}

// fragment sets the IPv4 flags/fragment offset field.
func fragment(in []byte, flagsOff uint16) []byte {
	out := bytes.Clone(in)
	binary.BigEndian.PutUint16(out[20:], flagsOff)
	binary.BigEndian.PutUint16(out[24:], testutil.IPv4Checksum(out[14:34]))
	return out
}

// vlanTagged puts an in-band 802.1Q/802.1ad tag (VID 100) into the frame.
func vlanTagged(in []byte, tpid uint16) []byte {
	out := make([]byte, 0, len(in)+4)
	out = append(out, in[:12]...)
	out = binary.BigEndian.AppendUint16(out, tpid)
	out = binary.BigEndian.AppendUint16(out, 100)
	return append(out, in[12:]...)
}

func ifH4(e *fixtureEnv) int { return e.ep4.IfIndex }

func edgeFixtures() []fixture {
	gw := DefaultGatewayIP.String()
	bcast := mustMAC("ff:ff:ff:ff:ff:ff")
	zero := make(net.HardwareAddr, 6)
	toRemote := func(ipLen int) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			return sizedFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", ipLen)
		}
	}
	toUnresolved := func(ipLen int) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			return sizedFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.3.5", ipLen)
		}
	}
	tcpToRemote := func(ipLen int) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			return tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", ipLen)
		}
	}
	viaNeigh := func(e *fixtureEnv, in []byte) []byte { return routed(in, e.neighMAC, e.up.Attrs().HardwareAddr) }
	return []fixture{
		// The uplink's MTU is 1500.
		{
			name: "MTU-sized packet (IP length 1500): redirected", prog: fromPod, ifindex: ifH1, in: toRemote(1500),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: viaNeigh,
		},
		{
			// bpf_fib_lookup alone (tot_len 0) lets 4 bytes of VLAN slack through.
			name: "non-GSO packet 1 byte over the MTU: host stack (ICMP frag needed / fragmentation)", prog: fromPod, ifindex: ifH1,
			in: toRemote(1501), verdict: tcActOK, stackEP: 1,
		},
		{
			name: "non-GSO packet well over the MTU: host stack", prog: fromPod, ifindex: ifH1,
			in: toRemote(3000), verdict: tcActOK, stackEP: 1,
		},
		{
			name: "non-GSO packet over the MTU, neighbour unresolved: host stack", prog: fromPod, ifindex: ifH1,
			in: toUnresolved(3000), verdict: tcActOK, stackEP: 1,
		},
		{
			name: "TSO packet (3000 bytes, 1400-byte segments): redirected whole", prog: fromPod, ifindex: ifH1,
			in: tcpToRemote(3000), gsoSize: 1400,
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: viaNeigh,
		},
		{
			name: "TSO packet with MTU-sized segments (20 + 20 + 1460): redirected whole", prog: fromPod, ifindex: ifH1,
			in: tcpToRemote(3600), gsoSize: 1460,
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: viaNeigh,
		},
		{
			name: "TSO packet, neighbour unresolved: redirect_neigh", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.3.5", 3000)
			},
			gsoSize: 1400, verdict: tcActRedirect, redirIf: ifUp, redirKind: 3,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, nil, nil) },
		},
		{
			name: "TSO packet to a local VM: whole into its device (segmented on its transmit path)", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.12", 3000)
			},
			gsoSize: 1448, verdict: tcActRedirect, redirIf: ifH3, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, vm3MAC, e.ep3.HostMAC) },
		},
		{
			name: "uplink: GRO/TSO packet for a local pod: redirect_peer whole", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return tcpFrame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 3000)
			},
			gsoSize: 1448, verdict: tcActRedirect, redirIf: ifH1, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, pod1MAC, e.ep1.HostMAC) },
		},
		{
			name: "TSO packet whose segments exceed the MTU by 1 byte: host stack", prog: fromPod, ifindex: ifH1,
			in: tcpToRemote(3600), gsoSize: 1461, verdict: tcActOK, stackEP: 1,
		},
		{
			name: "non-GSO TCP packet over the MTU: host stack", prog: fromPod, ifindex: ifH1,
			in: tcpToRemote(3000), verdict: tcActOK, stackEP: 1,
		},
		{
			name: "IP options (IHL 6): host stack (record route, source routing policy)", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return withOptions(testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64))
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "uplink: IP options for a local pod: host stack", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return withOptions(testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 63))
			},
			verdict: tcActOK,
		},
		{
			name: "first fragment (MF): routed as is", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return fragment(testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64), 0x2000)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: viaNeigh,
		},
		{
			// Its first fragment never passed: no ports (frag_fixture_test.go
			// has datagrams whose first fragment did).
			name: "last fragment (offset 185) without its first: dropped", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return fragment(testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", 64), 185)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropFragNotFound,
		},
		{
			name: "broadcast destination MAC: host stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(bcast, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "limited broadcast IP: host stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "255.255.255.255", 64)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "multicast (224.0.0.251, 01:00:5e MAC): host stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(mustMAC("01:00:5e:00:00:fb"), pod1MAC, "10.244.1.10", "224.0.0.251", 64)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "multicast IP behind a unicast MAC: host stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "239.1.2.3", 64)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "ARP probe (sender IP 0) for its own address: pass", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, pod1MAC, "0.0.0.0", make(net.HardwareAddr, 6), "10.244.1.10")
			},
			verdict: tcActOK,
		},
		{
			name: "truncated ARP (20 of 28 bytes): drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, pod1MAC, "10.244.1.10", make(net.HardwareAddr, 6), gw)[:14+20]
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "ARP for another hardware type: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				b := testutil.ARPFrame(1, pod1MAC, "10.244.1.10", make(net.HardwareAddr, 6), gw)
				b[15] = 6 // ar_hrd IEEE 802
				return b
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "prohibit route: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.97.1.1", 64)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropFIBFailed,
		},
		{
			name: "uplink: malformed IPv4 for a local pod: host stack judges it", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				b := testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 63)
				b[14] = 0x44
				return b
			},
			verdict: tcActOK,
		},
		{
			name: "802.1Q tag in the frame: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return vlanTagged(testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64), 0x8100)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropVLAN,
		},
		{
			name: "802.1ad (QinQ outer) tag in the frame: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return vlanTagged(testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64), 0x88a8)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropVLAN,
		},
		{
			name: "uplink: 802.1Q-tagged frame for a local pod: host stack, never into the pod", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return vlanTagged(testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 63), 0x8100)
			},
			verdict: tcActOK,
		},
		// netkit L3: both MACs are zero, there is no ARP.
		{
			name: "L3 endpoint (zero MACs) to remote pod: routed", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(zero, zero, "10.244.1.13", "10.244.2.5", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: viaNeigh,
		},
		{
			name: "L3 endpoint with a crafted source MAC: not an identity there, routed with MACs rewritten", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(zero, pod2MAC, "10.244.1.13", "10.244.2.5", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: viaNeigh,
		},
		{
			name: "L3 endpoint to local pod: redirect_peer", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(zero, zero, "10.244.1.13", "10.244.1.11", 64)
			},
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, pod2MAC, e.ep2.HostMAC) },
		},
		{
			name: "L3 endpoint with a spoofed source IP: drop", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(zero, zero, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActShot, dropEP: 4, dropReason: DropSpoofedIP,
		},
		{
			name: "L3 endpoint sending ARP (crafted: L3 devices do not ARP): drop", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, zero, "10.244.1.13", zero, gw)
			},
			verdict: tcActShot, dropEP: 4, dropReason: DropUnsupported,
		},
		{
			name: "L3 endpoint sending a VLAN tag: drop", prog: fromPod, ifindex: ifH4,
			in: func(e *fixtureEnv) []byte {
				return vlanTagged(testutil.IPv4Frame(zero, zero, "10.244.1.13", "10.244.2.5", 64), 0x8100)
			},
			verdict: tcActShot, dropEP: 4, dropReason: DropVLAN,
		},
		{
			name: "pod to L3 endpoint: redirect_peer with its zero MACs", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.13", 64)
			},
			verdict: tcActRedirect, redirIf: ifH4, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, zero, zero) },
		},
		{
			name: "uplink to L3 endpoint: redirect_peer", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.13", 63)
			},
			verdict: tcActRedirect, redirIf: ifH4, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, zero, zero) },
		},
	}
}
