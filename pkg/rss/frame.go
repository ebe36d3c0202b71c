package rss

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// IP protocol numbers used in frames.
const (
	ProtoTCP = 6
	ProtoUDP = 17
	// ProtoNone is "no next header" (59): an IP packet with no L4 header.
	ProtoNone = 59
)

var (
	frameDst = []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	frameSrc = []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
)

// BuildFrame is an Ethernet frame carrying one IPv4 or IPv6 packet of flow f
// with protocol proto (ProtoTCP, ProtoUDP with a header holding the ports, or
// another protocol with 8 bytes of payload). Checksums are left zero: the
// hash does not read them.
func BuildFrame(f Flow, proto uint8) ([]byte, error) {
	if !f.Src.IsValid() || !f.Dst.IsValid() {
		return nil, fmt.Errorf("build frame: source and destination addresses are required")
	}
	if f.Src.Is4() != f.Dst.Is4() {
		return nil, fmt.Errorf("build frame: %s and %s are not the same family", f.Src, f.Dst)
	}
	var l4 []byte
	switch proto {
	case ProtoTCP:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], f.Sport)
		binary.BigEndian.PutUint16(l4[2:], f.Dport)
		l4[12] = 5 << 4 // data offset
		l4[13] = 0x10   // ACK
	case ProtoUDP:
		l4 = make([]byte, 8+8)
		binary.BigEndian.PutUint16(l4[0:], f.Sport)
		binary.BigEndian.PutUint16(l4[2:], f.Dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	default:
		l4 = make([]byte, 8)
	}
	frame := append([]byte{}, frameDst...)
	frame = append(frame, frameSrc...)
	if f.Src.Is4() {
		frame = binary.BigEndian.AppendUint16(frame, 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8] = 64
		ip[9] = proto
		s, d := f.Src.As4(), f.Dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		frame = append(frame, ip...)
	} else {
		frame = binary.BigEndian.AppendUint16(frame, 0x86dd)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = proto
		ip[7] = 64
		s, d := f.Src.As16(), f.Dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		frame = append(frame, ip...)
	}
	return append(frame, l4...), nil
}

// IPv6 extension headers FrameInput walks, and how many at most (the BPF
// bound, LK_RSS_IP6_EXT_MAX in bpf/lib/toeplitz.h).
const (
	ip6HopByHop = 0
	ip6Routing  = 43
	ip6Fragment = 44
	ip6DestOpts = 60
	ip6ExtMax   = 4
)

// FrameInput is the Go model of the BPF hash input builder (lk_rss_input in
// bpf/lib/toeplitz.h): the flow and report type of an Ethernet frame when
// types are enabled, ReportNone when it gets no hash. The rules, virtio 1.3
// 5.1.6.4.3 with no _EX type offered (IPv6 extension headers are skipped):
//   - TCP/UDP types apply when the ports are in the frame and the packet is
//     not a fragment (IPv4 MF or offset; any IPv6 fragment header, the first
//     fragment's included);
//   - IPv6 hop-by-hop, routing, destination-options and fragment headers are
//     walked, at most four; a longer chain, a truncated extension header,
//     AH/ESP or another payload (ICMPv6, no next header) leave only the
//     address type;
//   - the address type applies to every whole IP header (IPv4: 20 bytes,
//     version 4, IHL >= 5; IPv6: 40 bytes, version 6); anything else (ARP, a
//     broken header) gets no hash.
//
// Ports are zero unless the report is a TCP/UDP one.
func FrameInput(frame []byte, types HashTypes) (Flow, Report) {
	if len(frame) < 14 {
		return Flow{}, ReportNone
	}
	l3 := 14
	etype := binary.BigEndian.Uint16(frame[12:])
	if etype == 0x8100 || etype == 0x88a8 {
		if len(frame) < 18 {
			return Flow{}, ReportNone
		}
		etype = binary.BigEndian.Uint16(frame[16:])
		l3 = 18
	}
	ip := frame[l3:]
	var (
		f        Flow
		proto    uint8
		l4       int
		fragment bool
		v6       bool
	)
	switch etype {
	case 0x0800:
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[0]&0x0f < 5 {
			return Flow{}, ReportNone
		}
		f.Src, _ = netip.AddrFromSlice(ip[12:16])
		f.Dst, _ = netip.AddrFromSlice(ip[16:20])
		proto, l4 = ip[9], int(ip[0]&0x0f)*4
		fragment = binary.BigEndian.Uint16(ip[6:])&0x3fff != 0
	case 0x86dd:
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return Flow{}, ReportNone
		}
		v6 = true
		f.Src, _ = netip.AddrFromSlice(ip[8:24])
		f.Dst, _ = netip.AddrFromSlice(ip[24:40])
		proto, l4 = ip[6], 40
		for i := 0; i < ip6ExtMax; i++ {
			if proto != ip6HopByHop && proto != ip6Routing && proto != ip6DestOpts && proto != ip6Fragment {
				break
			}
			if len(ip) < l4+2 {
				proto = ProtoNone // truncated: addresses only
				break
			}
			next := ip[l4]
			if proto == ip6Fragment {
				fragment = true
				l4 += 8
			} else {
				l4 += (int(ip[l4+1]) + 1) * 8
			}
			proto = next
		}
	default:
		return Flow{}, ReportNone
	}
	tcp, udp, addr := TypeTCPv4, TypeUDPv4, TypeIPv4
	rtcp, rudp, raddr := ReportTCPv4, ReportUDPv4, ReportIPv4
	if v6 {
		tcp, udp, addr = TypeTCPv6, TypeUDPv6, TypeIPv6
		rtcp, rudp, raddr = ReportTCPv6, ReportUDPv6, ReportIPv6
	}
	if !fragment && len(ip) >= l4+4 {
		r := ReportNone
		if proto == ProtoTCP && types&tcp != 0 {
			r = rtcp
		} else if proto == ProtoUDP && types&udp != 0 {
			r = rudp
		}
		if r != ReportNone {
			f.Sport, f.Dport = binary.BigEndian.Uint16(ip[l4:]), binary.BigEndian.Uint16(ip[l4+2:])
			return f, r
		}
	}
	if types&addr == 0 {
		return Flow{}, ReportNone
	}
	return f, raddr
}
