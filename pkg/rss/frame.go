package rss

import (
	"encoding/binary"
	"fmt"
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
