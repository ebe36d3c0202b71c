package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/pkg/policy"
)

// Policy fixtures beyond the scenario tables of fixture_policy_test.go: drop
// events, Service flows judged after load balancing, host answers and replies
// into isolated clients.

// TestPolicyDropEvents: policy drops reach the flow events (lanekit observe)
// with their reason, the endpoint charged and the packet's ports.
func TestPolicyDropEvents(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	applyWorldPolicies(t, e, polWebIngress+"---"+polClientEgress)
	r, err := OpenEvents(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Configure(EventsConfig{Drops: true}); err != nil {
		t.Fatal(err)
	}
	toWeb80 := polFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", ipProtoTCP, 44000, 80)
	toExcept := polFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "192.168.1.5", ipProtoUDP, 44001, 53)
	fromRed := polFrame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.6", "10.244.1.11", ipProtoTCP, 44002, 8080)
	if ret := runPod(t, e, ifH1(e), toExcept); ret != tcActShot {
		t.Fatalf("to the except block: verdict %d", ret)
	}
	opts := &ebpf.RunOptions{Data: bytes.Clone(fromRed), DataOut: make([]byte, len(fromRed)+256), Context: skbCtx{Ifindex: uint32(ifUp(e))}}
	if ret, err := e.dp.uplink.FromUplink.Run(opts); err != nil || ret != tcActShot {
		t.Fatalf("from a red namespace: verdict %d, %v", ret, err)
	}
	// client-egress allows web:8000-8080 only, so this one is the
	// client's egress drop, not web's ingress.
	if ret := runPod(t, e, ifH1(e), toWeb80); ret != tcActShot {
		t.Fatalf("to web:80: verdict %d", ret)
	}
	evs := readEvents(t, r)
	type short struct {
		reason     DropReason
		ep         uint32
		src, dst   string
		sport, dpt uint16
	}
	var got []short
	for _, ev := range evs {
		got = append(got, short{ev.Reason, ev.EndpointID, ev.Src.String(), ev.Dst.String(), ev.SrcPort, ev.DstPort})
	}
	want := []short{
		{DropPolicyEgress, 1, "10.244.1.10", "192.168.1.5", 44001, 53},
		{DropPolicyIngress, 2, "10.244.2.6", "10.244.1.11", 44002, 8080},
		{DropPolicyEgress, 1, "10.244.1.10", "10.244.1.11", 44000, 80},
	}
	if len(got) != len(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] || evs[i].Kind != EventDrop {
			t.Errorf("event %d: %+v (%s), want %+v", i, got[i], evs[i].Kind, want[i])
		}
	}
}

// TestPolicyServiceFlows: policy judges a service flow after load
// balancing, against the chosen backend pod and its target port (not the
// ClusterIP and service port), and the rev-NATed reply passes.
func TestPolicyServiceFlows(t *testing.T) {
	s := newSvcEnv(t)
	e := s.fixtureEnv
	s.apply(t, svcYAML("web", "10.96.0.10", 80, "TCP", "", "10.244.1.11"))
	ids := policy.NewIdentities()
	compile := func(y string) *policy.Compiled {
		in := policyWorld(e)
		in.Policies = decodePolicies(t, y)
		c, err := policy.Compile(in, ids)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The client may only talk to web pods on 8000-8080 (the VIP is in
	// no ipBlock); web admits clients on its named port http (8080).
	c := compile(polClientEgress + "---" + polWebIngress)
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
	before, err := e.dp.PolicyVerdicts()
	if err != nil {
		t.Fatal(err)
	}
	created := s.stats(t).ConntrackCreated
	r := s.run(t, fromPod(e), ifH1(e), s.fromPod1("10.96.0.10", 80, 45000, tcpSYN))
	if r.verdict != tcActRedirect || r.redirIf != ifH2(e) {
		t.Fatalf("client to the service: verdict %d to ifindex %d, want redirect into web", r.verdict, r.redirIf)
	}
	// The service entry and one flow entry (policy's, which load balancing
	// completes with its rev-NAT: the reply below needs it).
	if d := s.stats(t).ConntrackCreated - created; d != 2 {
		t.Errorf("an allowed service flow created %d conntrack entries, want 2", d)
	}
	if dst := netip.AddrFrom4([4]byte(r.out[30:34])); dst != e.ep2.IP || binary.BigEndian.Uint16(r.out[36:]) != 8080 {
		t.Fatalf("service flow not translated to the backend: %s:%d", dst, binary.BigEndian.Uint16(r.out[36:]))
	}
	after, err := e.dp.PolicyVerdicts()
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range c.Policies { // both sides judged: each policy allowed one connection
		if d := after[uint32(i)].Allowed - before[uint32(i)].Allowed; d != 1 {
			t.Errorf("policy %s allowed %d connections, want 1", name, d)
		}
	}
	// web's reply (web is ingress-isolated; replies never need a rule)
	// leaves rev-NATed from the service address.
	r = s.run(t, fromPod(e), ifH2(e), l4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.244.1.10", 45000, ipProtoTCP, tcpSYN|tcpACK, 5000, 1001, nil))
	if r.verdict != tcActRedirect || r.redirIf != ifH1(e) {
		t.Fatalf("web's reply: verdict %d to ifindex %d, want redirect into the client", r.verdict, r.redirIf)
	}
	if src := netip.AddrFrom4([4]byte(r.out[26:30])); src.String() != "10.96.0.10" || binary.BigEndian.Uint16(r.out[34:]) != 80 {
		t.Fatalf("reply not rev-NATed: from %s:%d", src, binary.BigEndian.Uint16(r.out[34:]))
	}

	// A policy that admits the service port (80) admits nothing here: the
	// pod is reached on its target port 8080.
	next := compile(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-port-80, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports: [{port: 80}]
`)
	if err := e.dp.ApplyPolicy(policy.Diff(c, next)); err != nil {
		t.Fatal(err)
	}
	drops, err := e.dp.Counters(2)
	if err != nil {
		t.Fatal(err)
	}
	created = s.stats(t).ConntrackCreated
	r = s.run(t, fromPod(e), ifH1(e), s.fromPod1("10.96.0.10", 80, 45001, tcpSYN))
	if r.verdict != tcActShot {
		t.Fatalf("client to the service under web-port-80: verdict %d, want drop", r.verdict)
	}
	// A packet policy drops leaves no conntrack state (a denied pod
	// spraying SYNs at a ClusterIP would churn the shared table).
	if d := s.stats(t).ConntrackCreated - created; d != 0 {
		t.Errorf("a service flow policy dropped created %d conntrack entries, want 0", d)
	}
	if a, err := e.dp.Counters(2); err != nil || a.Drops[DropPolicyIngress]-drops.Drops[DropPolicyIngress] != 1 {
		t.Fatalf("web's policy-ingress drops grew by %d (%v), want 1", a.Drops[DropPolicyIngress]-drops.Drops[DropPolicyIngress], err)
	}
}

// TestPolicyHostAnswers: a pod whose egress is closed still answers its
// node (kubelet probes reach it through the host stack, past these
// programs), but opens nothing to it; other addresses get nothing.
func TestPolicyHostAnswers(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	c := applyWorldPolicies(t, e, polWebLocked)
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1")}); err != nil {
		t.Fatal(err)
	}
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("::ffff:10.77.0.1")}); err == nil {
		t.Fatal("an IPv4-mapped host address was accepted")
	}
	web := func(dst string, proto uint8, sport, dport uint16, flags uint8) []byte {
		if proto == ipProtoICMP {
			b := polFrame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", dst, proto, sport, dport)
			b[34] = flags // ICMP type
			return b
		}
		return polFrameFlags(e.ep2.HostMAC, pod2MAC, "10.244.1.11", dst, proto, sport, dport, flags)
	}
	cases := []struct {
		name    string
		in      []byte
		verdict uint32
	}{
		{"SYN-ACK to the node: passes (to the host stack)", web("10.77.0.1", ipProtoTCP, 8080, 50000, tcpSYN|tcpACK), tcActOK},
		{"ACK to the node: passes", web("10.77.0.1", ipProtoTCP, 8080, 50000, tcpACK), tcActOK},
		{"ICMP echo reply to the node: passes", web("10.77.0.1", ipProtoICMP, 9, 0, 0), tcActOK},
		{"SYN to the node (a new connection): egress denied", web("10.77.0.1", ipProtoTCP, 50001, 10250, tcpSYN), tcActShot},
		{"SYN on the tuple an ACK passed on: still denied (answers leave no state)", web("10.77.0.1", ipProtoTCP, 8080, 50000, tcpSYN), tcActShot},
		{"ICMP echo request to the node: egress denied", web("10.77.0.1", ipProtoICMP, 9, 0, 8), tcActShot},
		{"UDP to the node: egress denied", web("10.77.0.1", ipProtoUDP, 53, 50000, 0), tcActShot},
		{"ACK to another address: egress denied", web("10.77.0.2", ipProtoTCP, 8080, 50000, tcpACK), tcActShot},
	}
	for _, tc := range cases {
		if ret := runPod(t, e, ifH2(e), tc.in); ret != tc.verdict {
			t.Errorf("%s: verdict %d, want %d", tc.name, ret, tc.verdict)
		}
	}
	dumped, err := e.dp.DumpPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if u := policy.Diff(dumped, c); u.Ops() != 0 {
		t.Fatalf("host addresses leak into the dump: %s", u)
	}
	// An agent restart re-adopts the pinned maps: the policy is still there
	// for the new agent to diff against.
	if err := e.dp.Close(); err != nil {
		t.Fatal(err)
	}
	if e.dp, err = Open(Config{PinDir: e.pinDir, Uplink: "lk-fx-up", traceRedirects: true}, nil); err != nil {
		t.Fatal(err)
	}
	if dumped, err = e.dp.DumpPolicy(); err != nil {
		t.Fatal(err)
	}
	if u := policy.Diff(dumped, c); u.Ops() != 0 {
		t.Fatalf("after re-adopting the pinned maps: %s", u)
	}
	if ret := runPod(t, e, ifH2(e), web("10.77.0.2", ipProtoTCP, 8080, 50003, tcpACK)); ret != tcActShot {
		t.Fatalf("after re-adopting the pinned maps, web's egress is open (verdict %d)", ret)
	}
	if err := e.dp.SetPolicyHostAddrs(nil); err != nil {
		t.Fatal(err)
	}
	if ret := runPod(t, e, ifH2(e), web("10.77.0.1", ipProtoTCP, 8080, 50002, tcpACK)); ret != tcActShot {
		t.Fatalf("host addresses removed, but an ACK to 10.77.0.1 still passes (verdict %d)", ret)
	}
}

// TestPolicyServiceReplyIntoIsolatedClient: a client whose ingress a policy
// isolates (it admits nobody) opens a connection to a ClusterIP; the
// backend's reply, rev-NATed to come from the service address, belongs to
// that allowed connection and reaches the client. (Judged after rev-NAT the
// reply looked like a new connection from the VIP and was dropped: the
// upstream e2e NetworkPolicy tests, which probe through Services, failed.)
func TestPolicyServiceReplyIntoIsolatedClient(t *testing.T) {
	s := newSvcEnv(t)
	e := s.fixtureEnv
	s.apply(t, svcYAML("web", "10.96.0.10", 80, "TCP", "", "10.244.1.11"))
	in := policyWorld(e)
	in.Policies = decodePolicies(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-no-ingress, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Ingress]
`)
	c, err := policy.Compile(in, policy.NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
	r := s.run(t, fromPod(e), ifH1(e), s.fromPod1("10.96.0.10", 80, 45100, tcpSYN))
	if r.verdict != tcActRedirect || r.redirIf != ifH2(e) {
		t.Fatalf("client to the service: verdict %d to ifindex %d, want redirect into web", r.verdict, r.redirIf)
	}
	drops, err := e.dp.Counters(1)
	if err != nil {
		t.Fatal(err)
	}
	r = s.run(t, fromPod(e), ifH2(e), l4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.244.1.10", 45100, ipProtoTCP, tcpSYN|tcpACK, 5000, 1001, nil))
	if r.verdict != tcActRedirect || r.redirIf != ifH1(e) {
		a, _ := e.dp.Counters(1)
		t.Fatalf("web's reply into the isolated client: verdict %d to ifindex %d, want redirect (client drops %v, before %v)",
			r.verdict, r.redirIf, a.Drops, drops.Drops)
	}
	if src := netip.AddrFrom4([4]byte(r.out[26:30])); src.String() != "10.96.0.10" || binary.BigEndian.Uint16(r.out[34:]) != 80 {
		t.Fatalf("reply not rev-NATed: from %s:%d", src, binary.BigEndian.Uint16(r.out[34:]))
	}
	// A backend on another node: the reply is rev-NATed on the uplink and
	// delivered into the client (its ingress policy admits nobody).
	s.apply(t, svcYAML("remote", "10.96.0.12", 80, "TCP", "", "10.244.2.5"))
	r = s.run(t, fromPod(e), ifH1(e), s.fromPod1("10.96.0.12", 80, 45101, tcpSYN))
	if r.verdict != tcActRedirect || r.redirIf != ifUp(e) {
		t.Fatalf("client to the remote service: verdict %d to ifindex %d, want the uplink", r.verdict, r.redirIf)
	}
	r = s.run(t, fromUplink(e), ifUp(e), l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.244.1.10", 45101, ipProtoTCP, tcpSYN|tcpACK, 5000, 1001, nil))
	if r.verdict != tcActRedirect || r.redirIf != ifH1(e) {
		t.Fatalf("remote backend's reply into the isolated client: verdict %d to ifindex %d, want redirect", r.verdict, r.redirIf)
	}
	if src := netip.AddrFrom4([4]byte(r.out[26:30])); src.String() != "10.96.0.12" {
		t.Fatalf("remote reply not rev-NATed: from %s", src)
	}
	// A new connection from web to the client is still refused.
	r = s.run(t, fromPod(e), ifH2(e), l4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", 45200, "10.244.1.10", 80, ipProtoTCP, tcpSYN, 7000, 0, nil))
	if r.verdict != tcActShot {
		t.Fatalf("web opening a connection to the isolated client: verdict %d, want drop", r.verdict)
	}
}
