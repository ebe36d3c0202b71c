package testutil

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Packet builders for BPF fixtures and AF_XDP tests.

// IPv4Frame builds Ethernet + IPv4 + a UDP header and payload, with a valid
// IPv4 header checksum.
func IPv4Frame(dst, src net.HardwareAddr, saddr, daddr string, ttl byte) []byte {
	return UDPFrame(dst, src, saddr, daddr, ttl, []byte("lanekit fixture payload"))
}

// EthIPv4 allocates a frame of Ethernet + IPv4 (no options, the given TTL
// and protocol, a valid header checksum) + l4len zero bytes for the caller's
// transport header and payload, which start at offset 34.
func EthIPv4(dst, src net.HardwareAddr, saddr, daddr string, ttl, proto byte, l4len int) []byte {
	b := make([]byte, 14+20+l4len)
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+l4len))
	ip[8] = ttl
	ip[9] = proto
	s4, d4 := netip.MustParseAddr(saddr).As4(), netip.MustParseAddr(daddr).As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], IPv4Checksum(ip))
	return b
}

// UDPFrame builds Ethernet + IPv4 + UDP (40000 -> 5201) around payload.
func UDPFrame(dst, src net.HardwareAddr, saddr, daddr string, ttl byte, payload []byte) []byte {
	b := EthIPv4(dst, src, saddr, daddr, ttl, 17, 8+len(payload))
	udp := b[34:42]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 5201)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(b[42:], payload)
	return b
}

// IPv4Checksum computes the header checksum with the checksum field as it is;
// over a header with a valid checksum it returns 0.
func IPv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		if i == 10 {
			continue
		}
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func IPv4HeaderValid(frame []byte) bool {
	h := frame[14:34]
	return binary.BigEndian.Uint16(h[10:]) == IPv4Checksum(h)
}

// ARPFrame builds an ARP packet (op 1 request, 2 reply).
func ARPFrame(op uint16, sha net.HardwareAddr, sip string, tha net.HardwareAddr, tip string) []byte {
	b := make([]byte, 14+28)
	dst := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if op == 2 {
		dst = tha
	}
	copy(b[0:6], dst)
	copy(b[6:12], sha)
	binary.BigEndian.PutUint16(b[12:], 0x0806)
	a := b[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], 0x0800)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], op)
	copy(a[8:14], sha)
	s4, t4 := netip.MustParseAddr(sip).As4(), netip.MustParseAddr(tip).As4()
	copy(a[14:18], s4[:])
	copy(a[18:24], tha)
	copy(a[24:28], t4[:])
	return b
}

// IPv6Frame is a minimal Ethernet + IPv6 header.
func IPv6Frame(dst, src net.HardwareAddr) []byte {
	b := make([]byte, 14+40)
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], 0x86dd)
	b[14] = 0x60
	b[14+7] = 64
	return b
}

// L4ChecksumValid reports whether the TCP or UDP checksum of an Ethernet +
// IPv4 frame is correct (a UDP checksum of 0 means "none" and is valid).
func L4ChecksumValid(frame []byte) bool {
	if len(frame) < 34 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
		return false
	}
	ihl := int(frame[14]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(frame[16:]))
	if len(frame) < 14+total || total < ihl {
		return false
	}
	proto := frame[23]
	l4 := frame[14+ihl : 14+total]
	if proto == 17 && len(l4) >= 8 && binary.BigEndian.Uint16(l4[6:]) == 0 {
		return true
	}
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(frame[26:34]) // source and destination addresses
	sum += uint32(proto) + uint32(len(l4))
	add(l4)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum) == 0xffff
}
