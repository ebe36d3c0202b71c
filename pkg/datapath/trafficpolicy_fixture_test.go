package datapath

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/service"
)

// Traffic policy and external address fixtures (bpf/lib/lb.h: LB_SVC_F_LOCAL,
// LB_SVC_F_EXTERNAL; translation in pkg/service): externalTrafficPolicy Local
// keeps uplink flows on this node's endpoints with the client's address and
// drops them (no-local-backend) when it has none, while pods reach the same
// NodePort cluster-wide; internalTrafficPolicy Local keeps a pod's ClusterIP
// flows local; external and LoadBalancer IPs are frontends on the uplink,
// source-NATed to the node's own address towards a remote backend.

// newPolicySvcEnv is a svcEnv whose translation knows the node's pod CIDR
// (10.244.1.0/24: the fixture's endpoints 1-5 are local, 10.244.2.0/24 is
// another node's).
func newPolicySvcEnv(t *testing.T) *svcEnv {
	s := newSvcEnv(t)
	s.model = service.NewModel(service.Options{NodeAddrs: []netip.Addr{s.node},
		LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}})
	return s
}

// policySvcYAML is lbSvcYAML for TCP.
func policySvcYAML(name, vip string, nodePort int, spec, status string, backends ...string) string {
	return lbSvcYAML(name, vip, "TCP", nodePort, spec, status, backends...)
}

// lbSvcYAML is a Service of vip's family with spec lines extra (indented
// two spaces), status lines status (type LoadBalancer), port 80 -> 8080
// (proto; nodePort 0: none, a ClusterIP Service), and one ready endpoint
// per backend address.
func lbSvcYAML(name, vip, proto string, nodePort int, spec, status string, backends ...string) string {
	typ, np, fam := "ClusterIP", "", "IPv4"
	if nodePort != 0 {
		typ, np = "NodePort", fmt.Sprintf(", nodePort: %d", nodePort)
	}
	if status != "" {
		typ = "LoadBalancer"
	}
	if netip.MustParseAddr(vip).Is6() {
		fam = "IPv6"
	}
	y := fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: fx}
spec:
  type: %s
  clusterIP: "%s"
  ipFamilies: [%s]
  ports: [{name: p, port: 80, protocol: %s, targetPort: 8080%s}]
%s
status:
%s
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s-a, namespace: fx, labels: {kubernetes.io/service-name: %s}}
addressType: %s
ports: [{name: p, port: 8080, protocol: %s}]
endpoints:
`, name, typ, vip, fam, proto, np, spec, status, name, name, fam, proto)
	for _, b := range backends {
		y += fmt.Sprintf("- addresses: [\"%s\"]\n  conditions: {ready: true}\n", b)
	}
	if len(backends) == 0 {
		y = y[:len(y)-1] + " []\n"
	}
	return y
}

func TestTrafficPolicyFixtures(t *testing.T) {
	s := newPolicySvcEnv(t)
	e := s.fixtureEnv
	up, pod := fromUplink(e), fromPod(e)
	upSYN := func(client string, sport uint16, dst string, dport uint16) []byte {
		return l4Frame(e.up.Attrs().HardwareAddr, neighMAC, client, sport, dst, dport, ipProtoTCP, tcpSYN, 1, 0, nil)
	}
	dropped := func(t *testing.T, ep uint32, reason DropReason, f func()) {
		t.Helper()
		before, err := e.dp.Counters(ep)
		if err != nil {
			t.Fatal(err)
		}
		f()
		after, err := e.dp.Counters(ep)
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Drops[reason] - before.Drops[reason]; d != 1 {
			t.Fatalf("%s drops on endpoint %d grew by %d, want 1", reason, ep, d)
		}
	}

	t.Run("eTP Local NodePort from the uplink: only the local endpoint, client address kept", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("etp", "10.96.1.1", 30200, "  externalTrafficPolicy: Local", "", "10.244.1.11", "10.244.2.5", "10.244.2.6"))
		before := s.stats(t)
		for i := range 24 {
			client := fmt.Sprintf("10.77.0.%d", 50+i)
			r := s.run(t, up, ifUp(e), upSYN(client, uint16(40000+i), "10.77.0.1", 30200))
			got := parseTuple(t, r.out)
			if r.verdict != tcActRedirect || r.redirIf != ifH2(e) || got.dst != ap("10.244.1.11:8080") ||
				got.src != netip.AddrPortFrom(netip.MustParseAddr(client), uint16(40000+i)) {
				t.Fatalf("client %s: verdict %d to %d, %s -> %s; want %s kept -> the local 10.244.1.11:8080",
					client, r.verdict, r.redirIf, got.src, got.dst, client)
			}
		}
		st := s.stats(t)
		if st.NodePortLocal-before.NodePortLocal != 24 || st.NodePortSNAT != before.NodePortSNAT {
			t.Fatalf("nodeport local %d, snat %d; want 24 and 0", st.NodePortLocal-before.NodePortLocal, st.NodePortSNAT-before.NodePortSNAT)
		}
	})

	t.Run("eTP Local NodePort from a local pod: cluster-wide (the ClusterIP scope twin)", func(t *testing.T) {
		s.enter(t)
		twin := s.frontend(t, "10.77.0.1", 30200, service.TCP, service.ScopeClusterIP)
		seen := map[netip.AddrPort]bool{}
		for sport := uint16(53000); sport < 53040; sport++ {
			want := expectBackend(t, twin, "10.244.1.10", sport)
			r := s.run(t, pod, ifH1(e), s.fromPod1("10.77.0.1", 30200, sport, tcpSYN))
			got := parseTuple(t, r.out)
			if r.verdict != tcActRedirect || got.dst != want || got.src != netip.AddrPortFrom(netip.MustParseAddr("10.244.1.10"), sport) {
				t.Fatalf("sport %d: verdict %d, %s -> %s; want -> %s", sport, r.verdict, got.src, got.dst, want)
			}
			seen[got.dst] = true
		}
		if !seen[ap("10.244.2.5:8080")] && !seen[ap("10.244.2.6:8080")] {
			t.Fatalf("a pod's 40 flows reached only %v: the remote endpoints are not used", seen)
		}
	})

	t.Run("eTP Local NodePort without a local endpoint: dropped silently, no-local-backend", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("etpnone", "10.96.1.2", 30201, "  externalTrafficPolicy: Local", "", "10.244.2.5"))
		before := s.stats(t)
		dropped(t, 0, DropNoLocalBackend, func() {
			if r := s.run(t, up, ifUp(e), upSYN("10.77.0.9", 41000, "10.77.0.1", 30201)); r.verdict != tcActShot {
				t.Fatalf("verdict %d, want drop (no reset)", r.verdict)
			}
		})
		if st := s.stats(t); st.NoBackend != before.NoBackend || st.NewFlows != before.NewFlows {
			t.Fatal("counted as no-backend or a new flow")
		}
		// The node's pods still reach it (cluster-wide twin).
		r := s.run(t, pod, ifH1(e), s.fromPod1("10.77.0.1", 30201, 53100, tcpSYN))
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.dst != ap("10.244.2.5:8080") {
			t.Fatalf("pod: verdict %d, -> %s", r.verdict, got.dst)
		}
	})

	t.Run("eTP Local with no endpoint anywhere: a reset, as any frontend without backends", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("etpempty", "10.96.1.3", 30202, "  externalTrafficPolicy: Local", ""))
		dropped(t, 0, DropNoBackend, func() {
			r := s.run(t, up, ifUp(e), upSYN("10.77.0.9", 41001, "10.77.0.1", 30202))
			if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.flags&tcpRST == 0 {
				t.Fatalf("verdict %d, %+v; want a reset", r.verdict, got)
			}
		})
	})

	t.Run("iTP Local ClusterIP from a pod: only the local endpoint; none: no-local-backend", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("itp", "10.96.1.4", 0, "  internalTrafficPolicy: Local", "", "10.244.1.11", "10.244.2.5", "10.244.2.6"))
		for sport := uint16(54000); sport < 54024; sport++ {
			r := s.run(t, pod, ifH1(e), s.fromPod1("10.96.1.4", 80, sport, tcpSYN))
			if got := parseTuple(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifH2(e) || got.dst != ap("10.244.1.11:8080") {
				t.Fatalf("sport %d: verdict %d to %d, -> %s; want the local 10.244.1.11:8080", sport, r.verdict, r.redirIf, got.dst)
			}
		}
		s.apply(t, policySvcYAML("itp", "10.96.1.4", 0, "  internalTrafficPolicy: Local", "", "10.244.2.5", "10.244.2.6"))
		dropped(t, 1, DropNoLocalBackend, func() {
			if r := s.run(t, pod, ifH1(e), s.fromPod1("10.96.1.4", 80, 54100, tcpSYN)); r.verdict != tcActShot {
				t.Fatalf("verdict %d, want drop", r.verdict)
			}
		})
	})

	t.Run("external IP from the uplink, remote backend: SNAT to the node's address, reply translated back", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("extip", "10.96.1.5", 0, "  externalIPs: [192.0.2.10]", "", "10.244.2.5"))
		before := s.stats(t)
		r := s.run(t, up, ifUp(e), upSYN("10.77.0.2", 42000, "192.0.2.10", 80))
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) || got.dst != ap("10.244.2.5:8080") || got.src.Addr() != s.node {
			t.Fatalf("verdict %d to %d, %s -> %s; want the node 10.77.0.1 (not 192.0.2.10) -> 10.244.2.5:8080",
				r.verdict, r.redirIf, got.src, got.dst)
		}
		if s.stats(t).NodePortSNAT-before.NodePortSNAT != 1 {
			t.Fatal("SNAT not counted")
		}
		reply := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.77.0.1", got.src.Port(), ipProtoTCP, tcpSYN|tcpACK, 9, 2, nil)
		r = s.run(t, up, ifUp(e), reply)
		if back := parseTuple(t, r.out); r.verdict != tcActRedirect || back.src != ap("192.0.2.10:80") || back.dst != ap("10.77.0.2:42000") {
			t.Fatalf("reply: verdict %d, %s -> %s; want 192.0.2.10:80 -> 10.77.0.2:42000", r.verdict, back.src, back.dst)
		}
		// A pod reaches the external IP too (NodePort scope after ClusterIP).
		r = s.run(t, pod, ifH1(e), s.fromPod1("192.0.2.10", 80, 55000, tcpSYN))
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.dst != ap("10.244.2.5:8080") || got.src != ap("10.244.1.10:55000") {
			t.Fatalf("pod: verdict %d, %s -> %s", r.verdict, got.src, got.dst)
		}
	})

	t.Run("external IP with no route to the backend: fib-failed, not SNATed to the external IP", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("extnoroute", "10.96.1.6", 0, "  externalIPs: [192.0.2.11]", "", "10.99.0.5"))
		dropped(t, 0, DropFIBFailed, func() {
			if r := s.run(t, up, ifUp(e), upSYN("10.77.0.2", 42001, "192.0.2.11", 80)); r.verdict != tcActShot {
				t.Fatalf("verdict %d, want drop", r.verdict)
			}
		})
	})

	t.Run("LoadBalancer ingress IP with eTP Local and ClientIP affinity", func(t *testing.T) {
		s.enter(t)
		s.apply(t, policySvcYAML("lb", "10.96.1.7", 30203,
			"  externalTrafficPolicy: Local\n  sessionAffinity: ClientIP\n  healthCheckNodePort: 31200",
			"  loadBalancer: {ingress: [{ip: 198.51.100.7}, {ip: 198.51.100.8, ipMode: Proxy}, {hostname: lb.example}]}",
			"10.244.1.10", "10.244.1.11", "10.244.2.5"))
		before := s.stats(t)
		var first netip.AddrPort
		for i := range 8 {
			r := s.run(t, up, ifUp(e), upSYN("10.77.0.2", uint16(43000+i), "198.51.100.7", 80))
			got := parseTuple(t, r.out)
			if r.verdict != tcActRedirect || got.src != netip.AddrPortFrom(netip.MustParseAddr("10.77.0.2"), uint16(43000+i)) ||
				(got.dst != ap("10.244.1.10:8080") && got.dst != ap("10.244.1.11:8080")) {
				t.Fatalf("flow %d: verdict %d, %s -> %s; want the client kept -> a local endpoint", i, r.verdict, got.src, got.dst)
			}
			if i == 0 {
				first = got.dst
			} else if got.dst != first {
				t.Fatalf("flow %d went to %s, the first to %s: ClientIP affinity not kept", i, got.dst, first)
			}
		}
		if st := s.stats(t); st.AffinityHits-before.AffinityHits != 7 {
			t.Fatalf("affinity hits %d, want 7", st.AffinityHits-before.AffinityHits)
		}
		// ipMode Proxy: the load balancer proxies to the NodePort; the
		// address is not the node's to serve.
		if f := s.model.Frontend(service.FrontendKey{Addr: netip.MustParseAddr("198.51.100.8"), Port: 80, Proto: service.TCP, Scope: service.ScopeNodePort}); f != nil {
			t.Fatal("an ipMode Proxy ingress IP was programmed")
		}
		if r := s.run(t, up, ifUp(e), upSYN("10.77.0.2", 43100, "198.51.100.8", 80)); r.verdict != tcActOK {
			t.Fatalf("ipMode Proxy address: verdict %d, want to the stack untouched", r.verdict)
		}
	})
}
