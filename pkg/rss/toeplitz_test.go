package rss

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
)

// refToeplitz is an independent model of the hash, written from the
// Microsoft pseudocode ("RSS hashing functions"): for every input bit from the
// left, when the bit is 1 xor the left-most 32 bits of K into the result, then
// shift K left by one bit. K is kept as a 320-bit big number in five u64s.
func refToeplitz(key Key, input []byte) uint32 {
	var k [5]uint64
	for i := range k {
		k[i] = binary.BigEndian.Uint64(key[i*8:])
	}
	var result uint32
	for _, b := range input {
		for bit := 7; bit >= 0; bit-- {
			if b>>bit&1 == 1 {
				result ^= uint32(k[0] >> 32)
			}
			for i := 0; i < 4; i++ {
				k[i] = k[i]<<1 | k[i+1]>>63
			}
			k[4] <<= 1
		}
	}
	return result
}

// msVector is one row of Microsoft's "Verifying the RSS Hash Calculation"
// suite (learn.microsoft.com/windows-hardware/drivers/network/verifying-the-rss-hash-calculation,
// also the Intel 82599 datasheet section 7.1.2.8.3 "RSS Verification Suite"),
// key DefaultKey: the hash of the addresses alone and of addresses + TCP ports.
type msVector struct {
	src, dst     string
	sport, dport uint16
	ip, tcp      uint32
}

var msVectors = []msVector{
	{"66.9.149.187", "161.142.100.80", 2794, 1766, 0x323e8fc2, 0x51ccc178},
	{"199.92.111.2", "65.69.140.83", 14230, 4739, 0xd718262a, 0xc626b0ea},
	{"24.19.198.95", "12.22.207.184", 12898, 38024, 0xd2d0a5de, 0x5c2b394a},
	{"38.27.205.30", "209.142.163.6", 48228, 2217, 0x82989176, 0xafc7327f},
	{"153.39.163.191", "202.188.127.2", 44251, 1303, 0x5d1809c5, 0x10e828a2},
	{"3ffe:2501:200:1fff::7", "3ffe:2501:200:3::1", 2794, 1766, 0x2cc18cd5, 0x40207d3d},
	{"3ffe:501:8::260:97ff:fe40:efab", "ff02::1", 14230, 4739, 0x0f0c461c, 0xdde51bbf},
	{"3ffe:1900:4545:3:200:f8ff:fe21:67cf", "fe80::200:f8ff:fe21:67cf", 44251, 38024, 0x4b61e985, 0x02d1feef},
}

func (v msVector) flow() Flow {
	return Flow{Src: netip.MustParseAddr(v.src), Dst: netip.MustParseAddr(v.dst), Sport: v.sport, Dport: v.dport}
}

// TestReferenceVectors checks the Go model against the published suite, so
// the model can judge the BPF code on random input.
func TestReferenceVectors(t *testing.T) {
	for _, v := range msVectors {
		f := v.flow()
		ipR, tcpR := ReportIPv4, ReportTCPv4
		if f.Src.Is6() {
			ipR, tcpR = ReportIPv6, ReportTCPv6
		}
		if got := refToeplitz(DefaultKey, f.Input(ipR)); got != v.ip {
			t.Errorf("%s -> %s addresses: 0x%08x, want 0x%08x", v.src, v.dst, got, v.ip)
		}
		if got := refToeplitz(DefaultKey, f.Input(tcpR)); got != v.tcp {
			t.Errorf("%s -> %s tcp: 0x%08x, want 0x%08x", v.src, v.dst, got, v.tcp)
		}
	}
}

func newHasher(t *testing.T) *Hasher {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("BPF_PROG_TEST_RUN needs root (CAP_BPF): skipping the BPF hash")
	}
	h, err := NewHasher()
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestBPFVectors runs the published suite through bpf/lib/toeplitz.h: every
// row for the address-only type, TCP, and UDP (the same input as TCP).
func TestBPFVectors(t *testing.T) {
	h := newHasher(t)
	for _, v := range msVectors {
		f := v.flow()
		types := []struct {
			t    HashTypes
			want uint32
			r    Report
		}{{TypeIPv4, v.ip, ReportIPv4}, {TypeTCPv4, v.tcp, ReportTCPv4}, {TypeUDPv4, v.tcp, ReportUDPv4}}
		if f.Src.Is6() {
			types = []struct {
				t    HashTypes
				want uint32
				r    Report
			}{{TypeIPv6, v.ip, ReportIPv6}, {TypeTCPv6, v.tcp, ReportTCPv6}, {TypeUDPv6, v.tcp, ReportUDPv6}}
		}
		for _, ty := range types {
			res, err := h.Hash(DefaultKey, ty.t, f)
			if err != nil {
				t.Fatalf("%s %s -> %s: %v", ty.t, v.src, v.dst, err)
			}
			if res.Hash != ty.want || res.Report != ty.r {
				t.Errorf("%s %s:%d -> %s:%d: 0x%08x (%s), want 0x%08x (%s)", ty.t, v.src, v.sport, v.dst, v.dport, res.Hash, res.Report, ty.want, ty.r)
			}
		}
	}
}

// TestBPFTypeSelection checks which input a frame gets for a set of enabled
// types, as the virtio spec orders them: TCP/UDP when enabled and the packet
// has that header, else the addresses when enabled, else no hash.
func TestBPFTypeSelection(t *testing.T) {
	h := newHasher(t)
	v4 := msVectors[0].flow()
	v6 := msVectors[5].flow()
	cases := []struct {
		name  string
		f     Flow
		proto uint8
		types HashTypes
		want  Report
	}{
		{"tcp4 all", v4, ProtoTCP, AllTypes, ReportTCPv4},
		{"tcp4 ip only", v4, ProtoTCP, TypeIPv4, ReportIPv4},
		{"tcp4 udp only", v4, ProtoTCP, TypeUDPv4, ReportNone},
		{"udp4 all", v4, ProtoUDP, AllTypes, ReportUDPv4},
		{"udp4 tcp+ip", v4, ProtoUDP, TypeTCPv4 | TypeIPv4, ReportIPv4},
		{"tcp4 v6 types", v4, ProtoTCP, TypeIPv6 | TypeTCPv6, ReportNone},
		{"tcp6 all", v6, ProtoTCP, AllTypes, ReportTCPv6},
		{"udp6 all", v6, ProtoUDP, AllTypes, ReportUDPv6},
		{"none6 all", v6, ProtoNone, AllTypes, ReportIPv6},
		{"udp6 v4 types", v6, ProtoUDP, TypeIPv4 | TypeUDPv4, ReportNone},
	}
	for _, c := range cases {
		frame, err := BuildFrame(c.f, c.proto)
		if err != nil {
			t.Fatal(err)
		}
		res, err := h.HashFrame(DefaultKey, c.types, frame)
		if err != nil {
			t.Fatal(err)
		}
		if res.Report != c.want {
			t.Errorf("%s: report %s, want %s", c.name, res.Report, c.want)
			continue
		}
		if c.want != ReportNone {
			if want := refToeplitz(DefaultKey, c.f.Input(c.want)); res.Hash != want {
				t.Errorf("%s: 0x%08x, want 0x%08x", c.name, res.Hash, want)
			}
		}
	}

	// An IPv4 fragment hashes on addresses only, even with TCP enabled.
	frame, _ := BuildFrame(v4, ProtoTCP)
	frame[14+6] = 0x20 // MF
	if res, _ := h.HashFrame(DefaultKey, AllTypes, frame); res.Report != ReportIPv4 || res.Hash != msVectors[0].ip {
		t.Errorf("fragment: %s 0x%08x, want ipv4 0x%08x", res.Report, res.Hash, msVectors[0].ip)
	}
	// Headers the parser has to walk: an 802.1Q tag, IPv4 options, IPv6
	// extension headers (a fragment header means addresses only).
	insert := func(b []byte, at int, ins ...byte) []byte {
		return append(append(append([]byte{}, b[:at]...), ins...), b[at:]...)
	}
	tcp4, _ := BuildFrame(v4, ProtoTCP)
	udp6, _ := BuildFrame(v6, ProtoUDP)
	vlan := insert(tcp4, 12, 0x81, 0x00, 0x00, 0x07)
	opts := insert(tcp4, 14+20, 1, 1, 1, 0) // NOP NOP NOP EOL
	opts[14] = 0x46
	hbh := insert(udp6, 14+40, ProtoUDP, 0, 1, 4, 0, 0, 0, 0)     // PadN
	hbh[14+6] = 0                                                 // next header: hop-by-hop
	fragHdr := insert(udp6, 14+40, ProtoUDP, 0, 0, 1, 0, 0, 0, 9) // offset 0, M=1
	fragHdr[14+6] = 44
	for _, c := range []struct {
		name  string
		frame []byte
		want  Report
		hash  uint32
	}{
		{"vlan tcp4", vlan, ReportTCPv4, msVectors[0].tcp},
		{"tcp4 with ip options", opts, ReportTCPv4, msVectors[0].tcp},
		{"udp6 after hop-by-hop", hbh, ReportUDPv6, msVectors[5].tcp},
		{"udp6 fragment", fragHdr, ReportIPv6, msVectors[5].ip},
	} {
		res, err := h.HashFrame(DefaultKey, AllTypes, c.frame)
		if err != nil {
			t.Fatal(err)
		}
		if res.Report != c.want || res.Hash != c.hash {
			t.Errorf("%s: %s 0x%08x, want %s 0x%08x", c.name, res.Report, res.Hash, c.want, c.hash)
		}
	}

	// ARP gets no hash.
	arp := append(append([]byte{}, frame[:12]...), 0x08, 0x06)
	arp = append(arp, make([]byte, 28)...)
	if res, _ := h.HashFrame(DefaultKey, AllTypes, arp); res.Report != ReportNone {
		t.Errorf("arp: report %s, want none", res.Report)
	}
}

// TestBPFRandomCrossCheck compares the BPF hash with the Go model on random
// keys and flows of every type.
func TestBPFRandomCrossCheck(t *testing.T) {
	h := newHasher(t)
	rng := rand.New(rand.NewPCG(14, 1))
	all := []HashTypes{TypeIPv4, TypeTCPv4, TypeUDPv4, TypeIPv6, TypeTCPv6, TypeUDPv6}
	reports := map[HashTypes]Report{TypeIPv4: ReportIPv4, TypeTCPv4: ReportTCPv4, TypeUDPv4: ReportUDPv4,
		TypeIPv6: ReportIPv6, TypeTCPv6: ReportTCPv6, TypeUDPv6: ReportUDPv6}
	for i := 0; i < 600; i++ {
		var key Key
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		ty := all[i%len(all)]
		f := randomFlow(rng, ty&(TypeIPv4|TypeTCPv4|TypeUDPv4) != 0)
		res, err := h.Hash(key, ty, f)
		if err != nil {
			t.Fatal(err)
		}
		if want := refToeplitz(key, f.Input(reports[ty])); res.Hash != want {
			t.Fatalf("key %s %s %v: bpf 0x%08x, model 0x%08x", key, ty, f, res.Hash, want)
		}
	}
}

func randomFlow(rng *rand.Rand, v4 bool) Flow {
	addr := func() netip.Addr {
		if v4 {
			var a [4]byte
			binary.BigEndian.PutUint32(a[:], rng.Uint32())
			return netip.AddrFrom4(a)
		}
		var a [16]byte
		binary.BigEndian.PutUint64(a[:8], rng.Uint64())
		binary.BigEndian.PutUint64(a[8:], rng.Uint64())
		return netip.AddrFrom16(a)
	}
	return Flow{Src: addr(), Dst: addr(), Sport: uint16(rng.Uint32()), Dport: uint16(rng.Uint32())}
}

// BenchmarkBPFHash measures the BPF hash program per frame in the kernel
// (BPF_PROG_TEST_RUN repeat), parse + Toeplitz, for the shortest and the
// longest input.
func BenchmarkBPFHash(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("BPF_PROG_TEST_RUN needs root (CAP_BPF)")
	}
	h, err := NewHasher()
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	for _, c := range []struct {
		name string
		v    msVector
		t    HashTypes
		p    uint8
	}{{"ipv4", msVectors[0], TypeIPv4, ProtoNone}, {"tcpv6", msVectors[5], TypeTCPv6, ProtoTCP}} {
		b.Run(c.name, func(b *testing.B) {
			frame, err := BuildFrame(c.v.flow(), c.p)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := h.HashFrame(DefaultKey, c.t, frame); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			if _, _, err := h.objs.RssHash.Benchmark(frame, b.N, b.ResetTimer); err != nil {
				b.Fatal(err)
			}
		})
	}
}
