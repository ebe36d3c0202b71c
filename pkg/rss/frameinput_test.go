package rss

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
)

// ext6 is one IPv6 extension header for withExt6: its type, its length in
// bytes (a multiple of 8) and, for a fragment header, the offset/M field.
type ext6 struct {
	typ   uint8
	len   int
	fragw uint16
}

var (
	hbh8  = ext6{typ: ip6HopByHop, len: 8}
	rt24  = ext6{typ: ip6Routing, len: 24}
	dst16 = ext6{typ: ip6DestOpts, len: 16}
)

// withExt6 inserts exts between the IPv6 header of frame (from BuildFrame)
// and its payload, chaining the next-header fields.
func withExt6(frame []byte, exts ...ext6) []byte {
	const l3 = 14
	payload := frame[l3+40:]
	out := append([]byte{}, frame[:l3+40]...)
	next := out[l3+6]
	if len(exts) > 0 {
		out[l3+6] = exts[0].typ
	}
	for i, e := range exts {
		nh := next
		if i+1 < len(exts) {
			nh = exts[i+1].typ
		}
		h := make([]byte, e.len)
		h[0] = nh
		if e.typ == ip6Fragment {
			binary.BigEndian.PutUint16(h[2:], e.fragw)
			binary.BigEndian.PutUint32(h[4:], 0x1234)
		} else {
			h[1] = uint8(e.len/8 - 1)
			if e.len > 2 {
				h[2], h[3] = 1, uint8(e.len-4) // PadN over the rest
			}
		}
		out = append(out, h...)
	}
	out = append(out, payload...)
	binary.BigEndian.PutUint16(out[l3+4:], uint16(len(out)-l3-40))
	return out
}

// TestFrameInputRules is the table of hash-input decisions, written by hand
// from the rules (virtio 1.3 5.1.6.4.3, no _EX types): every case is checked
// against the Go model (FrameInput) and, as root, against the BPF program
// (bpf/lib/toeplitz.h through rss_hash.c) with the hash of the expected input.
func TestFrameInputRules(t *testing.T) {
	v4 := msVectors[0].flow()
	v6 := msVectors[5].flow()
	addrs4, addrs6 := Flow{Src: v4.Src, Dst: v4.Dst}, Flow{Src: v6.Src, Dst: v6.Dst}
	build := func(f Flow, proto uint8) []byte {
		b, err := BuildFrame(f, proto)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tcp4, udp4, icmp4 := build(v4, ProtoTCP), build(v4, ProtoUDP), build(v4, 1)
	tcp6, udp6, none6 := build(v6, ProtoTCP), build(v6, ProtoUDP), build(v6, ProtoNone)
	icmp6 := build(v6, 58)
	set := func(b []byte, at int, v byte) []byte { b = append([]byte{}, b...); b[at] = v; return b }
	frag4 := set(tcp4, 14+6, 0x20)                       // MF, offset 0: the first fragment
	frag4later := set(set(tcp4, 14+6, 0x00), 14+7, 0x10) // offset 16 (x 8 bytes), the last fragment
	vlan := append(append(append([]byte{}, tcp4[:12]...), 0x81, 0x00, 0x00, 0x07), tcp4[12:]...)
	qinq := append(append(append([]byte{}, udp6[:12]...), 0x88, 0xa8, 0x00, 0x07), udp6[12:]...)
	mld := withExt6(icmp6, hbh8)
	mld = append([]byte{}, mld...)
	clear(mld[14+8 : 14+24]) // source :: (an MLD report before the link-local address is valid)
	mldFlow := Flow{Src: netip.IPv6Unspecified(), Dst: v6.Dst}
	arp := append(append(append([]byte{}, tcp4[:12]...), 0x08, 0x06), make([]byte, 28)...)

	cases := []struct {
		name  string
		frame []byte
		types HashTypes
		want  Report
		flow  Flow
	}{
		// IPv4
		{"tcp4", tcp4, AllTypes, ReportTCPv4, v4},
		{"udp4", udp4, AllTypes, ReportUDPv4, v4},
		{"icmp4: addresses", icmp4, AllTypes, ReportIPv4, addrs4},
		{"tcp4, only udp4 on", tcp4, TypeUDPv4, ReportNone, Flow{}},
		{"udp4, tcp4+ipv4 on", udp4, TypeTCPv4 | TypeIPv4, ReportIPv4, addrs4},
		{"tcp4, only v6 types", tcp4, TypeIPv6 | TypeTCPv6 | TypeUDPv6, ReportNone, Flow{}},
		{"first fragment4: addresses", frag4, AllTypes, ReportIPv4, addrs4},
		{"later fragment4: addresses", frag4later, AllTypes, ReportIPv4, addrs4},
		{"fragment4, ipv4 off", frag4, TypeTCPv4, ReportNone, Flow{}},
		{"vlan tcp4", vlan, AllTypes, ReportTCPv4, v4},
		{"tcp4 ports cut off: addresses", tcp4[:14+20+2], AllTypes, ReportIPv4, addrs4},
		{"ipv4 header cut off (tagged: see testRunRefuses)", vlan[:18+19], AllTypes, ReportNone, Flow{}},
		{"ipv4 ihl 4", set(tcp4, 14, 0x44), AllTypes, ReportNone, Flow{}},
		{"ipv4 version 6 in an ipv4 frame", set(tcp4, 14, 0x65), AllTypes, ReportNone, Flow{}},
		{"arp", arp, AllTypes, ReportNone, Flow{}},
		{"runt", tcp4[:13], AllTypes, ReportNone, Flow{}},
		// IPv6 without extension headers
		{"tcp6", tcp6, AllTypes, ReportTCPv6, v6},
		{"udp6", udp6, AllTypes, ReportUDPv6, v6},
		{"icmp6: addresses", icmp6, AllTypes, ReportIPv6, addrs6},
		{"no next header: addresses", none6, AllTypes, ReportIPv6, addrs6},
		{"icmp6, only tcp6 on", icmp6, TypeTCPv6, ReportNone, Flow{}},
		{"udp6, only v4 types", udp6, TypeIPv4 | TypeUDPv4, ReportNone, Flow{}},
		{"qinq udp6", qinq, AllTypes, ReportUDPv6, v6},
		{"ipv6 header cut off (tagged)", qinq[:18+39], AllTypes, ReportNone, Flow{}},
		{"tcp6 ports cut off: addresses", tcp6[:14+40+3], AllTypes, ReportIPv6, addrs6},
		// IPv6 extension headers: skipped (no _EX type), at most four
		{"hop-by-hop udp6", withExt6(udp6, hbh8), AllTypes, ReportUDPv6, v6},
		{"routing tcp6", withExt6(tcp6, rt24), AllTypes, ReportTCPv6, v6},
		{"dest-opts udp6", withExt6(udp6, dst16), AllTypes, ReportUDPv6, v6},
		{"four headers tcp6", withExt6(tcp6, hbh8, dst16, rt24, dst16), AllTypes, ReportTCPv6, v6},
		{"five headers tcp6: addresses", withExt6(tcp6, hbh8, dst16, rt24, dst16, dst16), AllTypes, ReportIPv6, addrs6},
		{"hop-by-hop udp6, tcp6+ipv6 on", withExt6(udp6, hbh8), TypeTCPv6 | TypeIPv6, ReportIPv6, addrs6},
		{"hop-by-hop udp6, only udp6 on", withExt6(udp6, hbh8), TypeUDPv6, ReportUDPv6, v6},
		{"mld report (hop-by-hop, icmp6, from ::)", mld, AllTypes, ReportIPv6, mldFlow},
		{"mld report, only tcp6/udp6 on", mld, TypeTCPv6 | TypeUDPv6, ReportNone, Flow{}},
		{"first fragment6: addresses", withExt6(udp6, ext6{typ: ip6Fragment, len: 8, fragw: 1}), AllTypes, ReportIPv6, addrs6},
		{"later fragment6: addresses", withExt6(udp6, ext6{typ: ip6Fragment, len: 8, fragw: 0x100}), AllTypes, ReportIPv6, addrs6},
		{"hop-by-hop then fragment6", withExt6(tcp6, hbh8, ext6{typ: ip6Fragment, len: 8, fragw: 1}), AllTypes, ReportIPv6, addrs6},
		{"fragment6, ipv6 off", withExt6(udp6, ext6{typ: ip6Fragment, len: 8, fragw: 1}), TypeUDPv6 | TypeTCPv6, ReportNone, Flow{}},
		{"ah tcp6 (not walked): addresses", withExt6(tcp6, ext6{typ: 51, len: 16}), AllTypes, ReportIPv6, addrs6},
		{"extension header cut off: addresses", withExt6(udp6, hbh8)[:14+40+1], AllTypes, ReportIPv6, addrs6},
		{"extension header longer than the frame: addresses", set(withExt6(udp6, hbh8), 14+40+1, 200), AllTypes, ReportIPv6, addrs6},
	}
	var h *Hasher
	if os.Geteuid() == 0 {
		h = newHasher(t)
	} else {
		t.Log("not root: checking the Go model only (the BPF half needs CAP_BPF)")
	}
	for _, c := range cases {
		f, r := FrameInput(c.frame, c.types)
		if r != c.want || f != c.flow {
			t.Errorf("%s: model says %s %v, want %s %v", c.name, r, f, c.want, c.flow)
		}
		if h == nil || testRunRefuses(c.frame) {
			continue
		}
		res, err := h.HashFrame(DefaultKey, c.types, c.frame)
		if err != nil {
			t.Fatalf("%s (%d bytes): %v", c.name, len(c.frame), err)
		}
		if res.Report != c.want {
			t.Errorf("%s: bpf says %s, want %s", c.name, res.Report, c.want)
			continue
		}
		if c.want == ReportNone {
			continue
		}
		in := c.flow.Input(c.want)
		if want := refToeplitz(DefaultKey, in); res.Hash != want || res.InputLen != len(in) {
			t.Errorf("%s: bpf hash 0x%08x over %d bytes, want 0x%08x over %d", c.name, res.Hash, res.InputLen, want, len(in))
		}
	}
}

// testRunRefuses reports whether BPF_PROG_TEST_RUN refuses frame: the
// kernel wants a whole Ethernet header, and a whole IP header after an
// untagged IPv4/IPv6 ethertype. The same truncations behind a VLAN tag run.
func testRunRefuses(frame []byte) bool {
	if len(frame) < 14 {
		return true
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		return len(frame) < 14+20
	case 0x86dd:
		return len(frame) < 14+40
	}
	return false
}

// randomFrame is a frame of random shape for the differential test: IPv4 or
// IPv6, an optional VLAN tag, random protocol, IPv6 extension-header chains
// of 0-6 random headers, fragments, and random truncation or a random byte
// flipped in the headers.
func randomFrame(rng *rand.Rand) []byte {
	v4 := rng.IntN(2) == 0
	f := randomFlow(rng, v4)
	protos := []uint8{ProtoTCP, ProtoUDP, ProtoNone, 1, 58, 132}
	frame, _ := BuildFrame(f, protos[rng.IntN(len(protos))])
	if v4 {
		if rng.IntN(4) == 0 {
			binary.BigEndian.PutUint16(frame[14+6:], uint16(rng.Uint32())&0x3fff)
		}
	} else {
		var exts []ext6
		types := []uint8{ip6HopByHop, ip6Routing, ip6DestOpts, ip6Fragment, 51}
		for n := rng.IntN(7); n > 0; n-- {
			e := ext6{typ: types[rng.IntN(len(types))], len: 8 * (1 + rng.IntN(3))}
			if e.typ == ip6Fragment {
				e.len, e.fragw = 8, uint16(rng.Uint32())
			}
			exts = append(exts, e)
		}
		frame = withExt6(frame, exts...)
	}
	if rng.IntN(4) == 0 {
		frame = append(append(append([]byte{}, frame[:12]...), 0x81, 0x00, 0x00, 0x01), frame[12:]...)
	}
	switch rng.IntN(6) {
	case 0:
		frame = frame[:rng.IntN(len(frame)+1)]
	case 1:
		if n := min(len(frame), 14+40+40); n > 12 {
			frame[12+rng.IntN(n-12)] = byte(rng.Uint32())
		}
	}
	return frame
}

// TestBPFFrameInputDifferential runs the BPF program and the Go model on
// thousands of random frames with random enabled types: they must agree on
// the report type and the hash.
func TestBPFFrameInputDifferential(t *testing.T) {
	h := newHasher(t)
	rng := rand.New(rand.NewPCG(21, 6))
	byReport := map[Report]int{}
	for i := 0; i < 4000; i++ {
		frame := randomFrame(rng)
		types := HashTypes(rng.Uint32()) & AllTypes
		if i%2 == 0 {
			types = AllTypes
		}
		f, r := FrameInput(frame, types)
		if testRunRefuses(frame) {
			continue
		}
		res, err := h.HashFrame(DefaultKey, types, frame)
		if err != nil {
			t.Fatal(err)
		}
		byReport[r]++
		if res.Report != r {
			t.Fatalf("frame %x types %s: bpf %s, model %s %v", frame, types, res.Report, r, f)
		}
		if r != ReportNone {
			if want := refToeplitz(DefaultKey, f.Input(r)); res.Hash != want {
				t.Fatalf("frame %x types %s: bpf 0x%08x, model 0x%08x", frame, types, res.Hash, want)
			}
		}
	}
	for _, r := range []Report{ReportNone, ReportIPv4, ReportTCPv4, ReportUDPv4, ReportIPv6, ReportTCPv6, ReportUDPv6} {
		if byReport[r] == 0 {
			t.Errorf("no random frame got %s: the generator misses a case (%v)", r, byReport)
		}
	}
}

// FuzzFrameInput checks the model on arbitrary bytes: no panic, and a report
// only of an enabled type, with ports only for TCP/UDP reports.
func FuzzFrameInput(f *testing.F) {
	for _, p := range []uint8{ProtoTCP, ProtoUDP, ProtoNone} {
		b4, _ := BuildFrame(msVectors[0].flow(), p)
		b6, _ := BuildFrame(msVectors[5].flow(), p)
		f.Add(b4, uint32(AllTypes))
		f.Add(withExt6(b6, hbh8, rt24), uint32(AllTypes))
	}
	f.Fuzz(func(t *testing.T, frame []byte, types uint32) {
		ty := HashTypes(types)
		fl, r := FrameInput(frame, ty)
		need := map[Report]HashTypes{ReportIPv4: TypeIPv4, ReportTCPv4: TypeTCPv4, ReportUDPv4: TypeUDPv4,
			ReportIPv6: TypeIPv6, ReportTCPv6: TypeTCPv6, ReportUDPv6: TypeUDPv6}
		if r != ReportNone && ty&need[r] == 0 {
			t.Fatalf("report %s with types %s", r, ty)
		}
		if (r == ReportIPv4 || r == ReportIPv6 || r == ReportNone) && (fl.Sport != 0 || fl.Dport != 0) {
			t.Fatalf("report %s with ports %v", r, fl)
		}
	})
}
