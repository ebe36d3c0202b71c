package datapath

import (
	"encoding/binary"
	"testing"
)

// TestHostPFFixture: from_host, on a DPU's host-facing PF representor
// (Config.HostPF), load-balances the host's own ClusterIP traffic like a
// pod's, without SNAT (the host keeps its address), hands the translated
// packet to the DPU's stack, and the backend's reply arriving on the uplink
// is translated back by from_uplink; what is no Service passes untouched.
func TestHostPFFixture(t *testing.T) {
	s := newSvcEnv(t)
	s.enter(t)
	s.apply(t, svcYAML("hostpf", "10.96.0.130", 80, "TCP", "", "10.244.2.5"))
	upMAC := s.up.Attrs().HardwareAddr
	before := s.stats(t)
	syn := l4Frame(upMAC, neighMAC, "10.77.0.50", 42000, "10.96.0.130", 80, 6, tcpSYN, 1, 0, nil)
	r := s.run(t, s.dp.uplink.FromHost, ifUp(s.fixtureEnv), syn)
	got := parseTuple(t, r.out)
	if r.verdict != tcActOK || got.src != ap("10.77.0.50:42000") || got.dst != ap("10.244.2.5:8080") {
		t.Fatalf("host SYN through from_host: verdict %d, %s -> %s; want 10.77.0.50:42000 -> 10.244.2.5:8080 to the stack", r.verdict, got.src, got.dst)
	}
	if l4Checksum(r.out) != binary.BigEndian.Uint16(r.out[50:]) {
		t.Fatal("TCP checksum invalid after DNAT")
	}
	if d := s.stats(t).NewFlows - before.NewFlows; d != 1 {
		t.Fatalf("new-flow counter grew by %d, want 1", d)
	}
	reply := l4Frame(upMAC, neighMAC, "10.244.2.5", 8080, "10.77.0.50", 42000, 6, tcpSYN|tcpACK, 5000, 2, nil)
	r = s.run(t, fromUplink(s.fixtureEnv), ifUp(s.fixtureEnv), reply)
	if got := parseTuple(t, r.out); got.src != ap("10.96.0.130:80") || got.dst != ap("10.77.0.50:42000") {
		t.Fatalf("reply through from_uplink: verdict %d, %s -> %s; want 10.96.0.130:80 -> 10.77.0.50:42000", r.verdict, got.src, got.dst)
	}
	if d := s.stats(t).RevNAT - before.RevNAT; d != 1 {
		t.Fatalf("rev-NAT counter grew by %d, want 1", d)
	}
	other := l4Frame(upMAC, neighMAC, "10.77.0.50", 42001, "10.244.2.5", 8080, 6, tcpSYN, 1, 0, nil)
	r = s.run(t, s.dp.uplink.FromHost, ifUp(s.fixtureEnv), other)
	if got := parseTuple(t, r.out); r.verdict != tcActOK || got.dst != ap("10.244.2.5:8080") {
		t.Fatalf("non-Service packet: verdict %d, dst %s; want untouched to the stack", r.verdict, got.dst)
	}
}
