package datapath

import (
	"fmt"
	"net/netip"
	"testing"
)

// NodePort SNAT fixtures (bpf/lib/lb.h lb_snat_flow, lb4): the source port
// range is the configured one, allocation never reuses a live translated
// tuple, and replies arriving at the node are translated back before the
// frontend lookup.

// snatFirstPick mirrors lb_snat_flow's first try for a flow.
func snatFirstPick(client string, sport uint16, node netip.Addr, nodePort uint16, lo, hi uint16) uint16 {
	h := lbFlowHash(netip.MustParseAddr(client), sport, node, nodePort, ipProtoTCP)
	return lo + uint16(h%uint32(hi-lo+1))
}

func TestNodePortSNATDefaultRange(t *testing.T) {
	s := newSvcEnv(t)
	up := fromUplink(s.fixtureEnv)
	s.enter(t)
	s.apply(t, svcYAML("snat-range", "10.96.0.40", 80, "TCP", "nodePort=30100", "10.244.2.5"))
	// Clients on NodePorts, on the node's ephemeral range and above it:
	// none keeps its port, all get one from 61000-65535.
	for i, sport := range []uint16{30100, 32768, 45000, 60999, 61000, 65535, 1024, 50000} {
		client := fmt.Sprintf("10.77.0.%d", 10+i)
		in := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, client, sport, "10.77.0.1", 30100, ipProtoTCP, tcpSYN, 1, 0, nil)
		r := s.run(t, up, ifUp(s.fixtureEnv), in)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || got.src.Addr() != s.node || got.dst != ap("10.244.2.5:8080") {
			t.Fatalf("client %s:%d: verdict %d, %s -> %s", client, sport, r.verdict, got.src, got.dst)
		}
		if p := got.src.Port(); p < DefaultSNATPortMin || p > DefaultSNATPortMax {
			t.Fatalf("client %s:%d SNATed to port %d, outside %d-%d", client, sport, p, DefaultSNATPortMin, DefaultSNATPortMax)
		}
	}
}

func TestNodePortSNATConfiguredRange(t *testing.T) {
	const lo, hi = 30110, 30111 // both NodePorts below: every SNAT port is one
	s := newSvcEnvCfg(t, func(c *Config) { c.SNATPortMin, c.SNATPortMax = lo, hi })
	e := s.fixtureEnv
	up := fromUplink(e)
	s.enter(t)
	s.apply(t, svcYAML("snat-a", "10.96.0.41", 80, "TCP", "nodePort=30110", "10.244.2.5"))
	s.apply(t, svcYAML("snat-b", "10.96.0.42", 80, "TCP", "nodePort=30111", "10.244.3.5"))

	nodePort := func(client string, sport uint16) runResult {
		return s.run(t, up, ifUp(e), l4Frame(e.up.Attrs().HardwareAddr, neighMAC, client, sport, "10.77.0.1", 30110, ipProtoTCP, tcpSYN, 1, 0, nil))
	}
	// Client A, then a client B whose first pick is A's port: B must get
	// the other one (the translated tuple node:port -> backend is taken).
	ra := nodePort("10.77.0.20", 40000)
	a := parseTuple(t, ra.out)
	if ra.verdict != tcActRedirect || a.src.Addr() != s.node || a.src.Port() < lo || a.src.Port() > hi {
		t.Fatalf("client A: verdict %d, SNATed to %s; want the node on %d-%d", ra.verdict, a.src, lo, hi)
	}
	var bport uint16
	for p := uint16(40001); p < 41000; p++ {
		if snatFirstPick("10.77.0.21", p, s.node, 30110, lo, hi) == a.src.Port() {
			bport = p
			break
		}
	}
	if bport == 0 {
		t.Fatal("no client port whose first SNAT pick collides with A's")
	}
	rb := nodePort("10.77.0.21", bport)
	b := parseTuple(t, rb.out)
	if rb.verdict != tcActRedirect || b.src.Addr() != s.node || b.src.Port() < lo || b.src.Port() > hi || b.src.Port() == a.src.Port() {
		t.Fatalf("client B (first pick %d, taken by A): verdict %d, SNATed to %s; want the other port in %d-%d",
			a.src.Port(), rb.verdict, b.src, lo, hi)
	}
	// The range is full: a third client is dropped, counted.
	before, err := e.dp.Counters(0)
	if err != nil {
		t.Fatal(err)
	}
	if r := nodePort("10.77.0.22", 40000); r.verdict != tcActShot {
		t.Fatalf("third client with the range full: verdict %d, want drop", r.verdict)
	}
	if after, err := e.dp.Counters(0); err != nil || after.Drops[DropNATNoPort]-before.Drops[DropNATNoPort] != 1 {
		t.Fatalf("nat-no-port drops grew by %d (%v), want 1", after.Drops[DropNATNoPort]-before.Drops[DropNATNoPort], err)
	}
	// Replies arrive at the node on SNAT ports that are NodePorts: they are
	// translated back to their clients, not load-balanced as new flows.
	for _, c := range []struct {
		snat   netip.AddrPort
		client string
	}{{a.src, "10.77.0.20:40000"}, {b.src, fmt.Sprintf("10.77.0.21:%d", bport)}} {
		before := s.stats(t)
		reply := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.77.0.1", c.snat.Port(), ipProtoTCP, tcpSYN|tcpACK, 9, 2, nil)
		r := s.run(t, up, ifUp(e), reply)
		back := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || back.src != ap("10.77.0.1:30110") || back.dst != ap(c.client) {
			t.Fatalf("reply to SNAT port %d: verdict %d, %s -> %s; want 10.77.0.1:30110 -> %s", c.snat.Port(), r.verdict, back.src, back.dst, c.client)
		}
		if st := s.stats(t); st.NewFlows != before.NewFlows || st.RevNAT-before.RevNAT != 1 {
			t.Fatalf("reply to SNAT port %d: %d new flows, %d rev-NATs; want 0 and 1", c.snat.Port(), st.NewFlows-before.NewFlows, st.RevNAT-before.RevNAT)
		}
	}
}

func TestSNATPortsConfig(t *testing.T) {
	for _, c := range []struct {
		lo, hi   uint16
		wlo, whi uint16
		wantErr  bool
	}{
		{0, 0, DefaultSNATPortMin, DefaultSNATPortMax, false},
		{40000, 40010, 40000, 40010, false},
		{0, 10, 0, 0, true},
		{500, 400, 0, 0, true},
	} {
		lo, hi, err := Config{SNATPortMin: c.lo, SNATPortMax: c.hi}.snatPorts()
		if (err != nil) != c.wantErr || lo != c.wlo || hi != c.whi {
			t.Errorf("%d-%d: got %d-%d, %v", c.lo, c.hi, lo, hi, err)
		}
	}
}
