package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/service"
)

// TestLiveSockLB6: a process in the node's netns and cgroup reaches an
// IPv6 ClusterIP (lk_lb_svc6) over TCP, connected and unconnected UDP from
// IPv6 sockets, and a NodePort on the node's IPv6 address over TCP: the socket LB translates the call to an IPv6 backend (two
// listeners on the node's own addresses: no pod path involved), both
// backends serve it, the client sees the service address (getpeername,
// recvfrom), and the IPv6 hooks count every call. No backend:
// ECONNREFUSED. A process outside the cgroup is not translated.
func TestLiveSockLB6(t *testing.T) {
	e := newLiveEnv(t)
	backends := []string{"fd00:99::1", "fd00:99::2"}
	e.in(t, e.node, func() {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range backends {
			a, _ := netlink.ParseAddr(b + "/128")
			a.Flags = 0x02 // IFA_F_NODAD
			if err := netlink.AddrAdd(lo, a); err != nil {
				t.Fatalf("add %s: %v", b, err)
			}
		}
	})
	for _, b := range backends {
		hp := net.JoinHostPort(b, "8080")
		e.in(t, e.node, func() {
			ln, err := net.Listen("tcp6", hp)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s\n", b)
					c.Close()
				}
			}()
			pc, err := net.ListenPacket("udp6", hp)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 128)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo([]byte(b+"\n"), from)
				}
			}()
		})
	}
	m := service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("fd00:99::9")}})
	tables := service.NewTables()
	for _, y := range []string{
		v6SvcYAML("web6", "fd00:96::30", 80, "TCP", backends...),
		v6SvcYAML("dns6", "fd00:96::31", 53, "UDP", backends...),
		v6SvcYAML("empty6", "fd00:96::32", 80, "TCP"),
		lbSvcYAML("np6", "fd00:96::33", "TCP", 30090, "", "", backends...),
	} {
		applyYAML(t, e.dp, m, tables, y)
	}
	cg, stats := attachSockLB(t, e)
	const n = 16
	for _, c := range []struct {
		name, op, peer string
		fwd, rev       string
	}{
		{"tcp", "tcp6 [fd00:96::30]:80", "[fd00:96::30]:80", "connect6", "getpeername6"},
		{"connected udp", "udpc6 [fd00:96::31]:53", "[fd00:96::31]:53", "connect6", "getpeername6"},
		{"unconnected udp", "udp6 [fd00:96::31]:53", "[fd00:96::31]:53", "sendmsg6", "recvmsg6"},
		{"tcp to the NodePort on the node's IPv6 address", "tcp6 [fd00:99::9]:30090", "[fd00:99::9]:30090", "connect6", "getpeername6"},
	} {
		before := stats()
		seen := map[string]int{}
		for _, line := range runClient(t, e.node, cg, repeat(c.op, n)...) {
			f := strings.Fields(line)
			if len(f) != 3 || f[0] != "ok" {
				t.Errorf("%s: %q, want a reply", c.name, line)
				continue
			}
			seen[f[1]]++
			if f[2] != c.peer {
				t.Errorf("%s: the client sees %s, want the service address %s", c.name, f[2], c.peer)
			}
		}
		if seen[backends[0]] == 0 || seen[backends[1]] == 0 {
			t.Errorf("%s: backends reached %v, want both", c.name, seen)
		}
		after := stats()
		for _, h := range []string{c.fwd, c.rev} {
			if d := after[h].Translated - before[h].Translated; d < n {
				t.Errorf("%s: %s translated %d, want >= %d", c.name, h, d, n)
			}
		}
	}
	if got := runClient(t, e.node, cg, "tcp6 [fd00:96::32]:80")[0]; got != "err ECONNREFUSED" {
		t.Errorf("no backend: %q, want err ECONNREFUSED", got)
	}
	// loadBalancerSourceRanges on an IPv6 ingress IP: the node's processes
	// are refused (EPERM, counted) unless a range holds a node address.
	lbSrc := func(ranges string) string {
		return lbSvcYAML("lbsrc6", "fd00:96::34", "TCP", 30091, "  loadBalancerSourceRanges: ["+ranges+"]",
			"  loadBalancer: {ingress: [{ip: \"2001:db8:e::34\"}]}", backends[0])
	}
	applyYAML(t, e.dp, m, tables, lbSrc(`"2001:db8:1::/48"`))
	before := stats()
	if got := runClient(t, e.node, cg, "tcp6 [2001:db8:e::34]:80")[0]; got != "err EPERM" {
		t.Errorf("ranges without the node: %q, want err EPERM", got)
	}
	if d := stats()["connect6"].SrcRange - before["connect6"].SrcRange; d != 1 {
		t.Errorf("connect6 src-range refusals +%d, want 1", d)
	}
	applyYAML(t, e.dp, m, tables, lbSrc(`"2001:db8:1::/48", "fd00:99::/64"`))
	if got := runClient(t, e.node, cg, "tcp6 [2001:db8:e::34]:80")[0]; got != "ok "+backends[0]+" [2001:db8:e::34]:80" {
		t.Errorf("ranges holding the node's address: %q, want served through the ingress IP", got)
	}
	if got := runClient(t, e.node, "", "tcp6 [fd00:96::30]:80")[0]; !strings.HasPrefix(got, "err ") {
		t.Errorf("process outside the cgroup: %q, want an error (not translated)", got)
	}
}

// v6SvcYAML is an IPv6 single-stack Service with an IPv6 EndpointSlice.
func v6SvcYAML(name, vip string, port int, proto string, backends ...string) string {
	y := fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: fx}
spec:
  clusterIP: "%s"
  ipFamilies: [IPv6]
  ports: [{name: p, port: %d, protocol: %s, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s-a, namespace: fx, labels: {kubernetes.io/service-name: %s}}
addressType: IPv6
ports: [{name: p, port: 8080, protocol: %s}]
endpoints:
`, name, vip, port, proto, name, name, proto)
	for _, b := range backends {
		y += fmt.Sprintf("- addresses: [\"%s\"]\n  conditions: {ready: true}\n", b)
	}
	if len(backends) == 0 {
		y = y[:len(y)-1] + " []\n"
	}
	return y
}
