package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/socktest"
	"github.com/lanekit/lanekit/pkg/lbipam"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// Services for every client (issue 23 item 5), in one lab: a host process,
// a hostNetwork "pod" and a pod reach the same ClusterIP and NodePort over
// TCP and UDP; externalTrafficPolicy Local from the other node and an
// external host keeps the client's address and never reaches a remote
// backend (and drops, counted, where no endpoint is local); 4,000-byte UDP
// both ways through a ClusterIP between nodes at MTU 1500; 1,000 NodePort
// flows whose client ports are NodePorts and the node's ephemeral ports.
// Each asserts the path: LB and socket-LB counters, drop reasons, the
// addresses the backend saw.

const (
	clVIP      = "10.96.121.10" // who: both backends
	clNodePort = 30170          // who http
	clUDPPort  = 30171          // who dns
	locVIP     = "10.96.121.11" // loc: eTP Local, LoadBalancer
	locPort    = 30172
	locHealth  = 31172
	locLBIP    = "192.0.2.80"
	noLocVIP   = "10.96.121.12" // noloc: eTP Local, only a backend on node 2
	noLocPort  = 30173
	bigVIP     = "10.96.121.13" // big: UDP, only node 2's backend
	snatVIP    = "10.96.121.14" // snat: NodePort, only node 2's backend
	snatPort   = 30174
)

// peerServer answers in netns ns: a TCP connection gets "NAME PEER\n" (PEER:
// the client address it sees), a UDP datagram "NAME PEER\n" padded with
// '.' to the request's length (so a large request gets an as large reply).
func peerServer(t *testing.T, ns, name string, tcpPort, udpPort int) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := inNetns(ns, func() error {
		var err error
		if ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", tcpPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", udpPort))
		return err
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("peer server %s: %v", name, err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
			c.Close()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			out := []byte(fmt.Sprintf("%s %s\n", name, from))
			for len(out) < n {
				out = append(out, '.')
			}
			_, _ = pc.WriteTo(out, from)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		pc.Close()
		wg.Wait()
	})
}

// dialFrom connects from netns ns (source port sport, 0: any) to addr and
// returns the first line the server sent.
func dialFrom(ns string, sport int, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	err := inNetns(ns, func() error {
		d := net.Dialer{Timeout: timeout}
		if sport != 0 {
			d.LocalAddr = &net.TCPAddr{Port: sport}
			// A fixed client port may still have a TIME_WAIT socket of an
			// earlier flow in this netns (one that took it as an ephemeral
			// port): bind over it, as a fixed-port client does.
			d.Control = func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
				}); err != nil {
					return err
				}
				return serr
			}
		}
		var err error
		c, err = d.Dial("tcp4", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// metricsDrops sums node i's datapath drops of reason (its number) not
// attributable to an endpoint (endpoint 0: what arrived on the uplink),
// read from the pinned lk_metrics.
func metricsDrops(t *testing.T, node int, reason uint32) uint64 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(node), "lk_metrics"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("lk_metrics of node %d: %v", node, err)
	}
	defer m.Close()
	type val struct{ Packets, Bytes uint64 }
	var vals []val
	key := struct{ EpID, Kind uint32 }{0, 0x100 + reason}
	if err := m.Lookup(key, &vals); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0
		}
		t.Fatal(err)
	}
	var n uint64
	for _, v := range vals {
		n += v.Packets
	}
	return n
}

// Drop reasons (bpf/lib/consts.h enum lk_drop_reason).
const (
	dropNoLocalBackend = 17
)

func clientsYAML(be1, be2 string) string {
	slice := func(name, svc string, ports string, addrs ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s, namespace: svc, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: %s\nendpoints:\n", name, svc, ports)
		for _, a := range addrs {
			fmt.Fprintf(&b, "- addresses: [%s]\n", a)
		}
		return b.String()
	}
	both := "[{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]"
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: who, namespace: svc}
spec:
  type: NodePort
  clusterIP: %s
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: %d}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: %d}
---
apiVersion: v1
kind: Service
metadata: {name: loc, namespace: svc}
spec:
  type: LoadBalancer
  clusterIP: %s
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: %d}]
status: {loadBalancer: {ingress: [{ip: %s}]}}
---
apiVersion: v1
kind: Service
metadata: {name: noloc, namespace: svc}
spec:
  type: LoadBalancer
  clusterIP: %s
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: %d}]
---
apiVersion: v1
kind: Service
metadata: {name: big, namespace: svc}
spec:
  clusterIP: %s
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 5353}]
---
apiVersion: v1
kind: Service
metadata: {name: snat, namespace: svc}
spec:
  type: NodePort
  clusterIP: %s
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: %d}]
`, clVIP, clNodePort, clUDPPort, locVIP, locHealth, locPort, locLBIP, noLocVIP, locHealth+1, noLocPort, bigVIP, snatVIP, snatPort) +
		slice("who-1", "who", both, be1, be2) +
		slice("loc-1", "loc", "[{name: http, port: 8080}]", be1, be2) +
		slice("noloc-1", "noloc", "[{name: http, port: 8080}]", be2) +
		slice("big-1", "big", "[{name: dns, port: 5353, protocol: UDP}]", be2) +
		slice("snat-1", "snat", "[{name: http, port: 8080}]", be2)
}

func TestLabServiceClients(t *testing.T) {
	lk, _ := upLabCLI(t)
	// Raw host 1 dials from fixed ports in 30000-30499 and 32768-33267 below.
	// An earlier flow of its own that took one of them as an ephemeral port
	// would hold it in TIME_WAIT (without SO_REUSEADDR, so the bind fails):
	// keep its own ephemeral ports out of those ranges.
	if err := inNetns(RawNS(1), func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 60999"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	pods := addLabPods(t, lk, []labPodSpec{
		{name: "be1", ns: "svc", node: 1, labels: "app=who"},
		{name: "be2", ns: "svc", node: 2, labels: "app=who"},
		{name: "cl1", ns: "svc", node: 1, labels: "app=client"},
	})
	for _, b := range []string{"be1", "be2"} {
		peerServer(t, pods[b].NS, b, 8080, 5353)
	}
	be1, be2 := pods["be1"].IP, pods["be2"].IP
	if _, err := lk(t, "lab", "apply", "-f", writeTemp(t, "clients.yaml", clientsYAML(be1, be2))); err != nil {
		t.Fatal(err)
	}
	counters := func(t *testing.T, node int) map[string]uint64 {
		return agentStatus(t, node).GetControlPlane().GetLbCounters()
	}
	node1 := UnderlayIP(1)

	// The wire must not cut the agents' BIG TCP packets (wireBIGTCP): every
	// node's bridge port takes GSO packets as large as that node's uplink
	// builds.
	t.Run("the wire forwards the nodes' BIG TCP packets whole", func(t *testing.T) {
		for i := 1; i <= 2; i++ {
			up, wire := gsoMaxSize(t, NodeNS(i), Uplink), gsoMaxSize(t, WireNS, fmt.Sprintf("lk-w%d", i))
			if up <= netdev.LegacyGSOMaxSize {
				t.Fatalf("node %d's uplink has gso_max_size %d: the agent did not turn BIG TCP on", i, up)
			}
			if wire < up {
				t.Errorf("wire port lk-w%d has gso_max_size %d, node %d's uplink %d: the bridge segments its packets", i, wire, i, up)
			}
		}
	})

	t.Run("host process, hostNetwork pod and pod reach the same ClusterIP and NodePort", func(t *testing.T) {
		// A hostNetwork pod: the node's netns, a cgroup of its own below
		// the node's (as kubelet puts pods below the cgroup root).
		hostPodCg := filepath.Join(NodeCgroup(1), "hostnet-pod")
		if err := os.Mkdir(hostPodCg, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(hostPodCg) })
		const n = 24
		targets := []struct{ what, op, addr string }{
			{"ClusterIP TCP", "tcp", clVIP + ":80"},
			{"ClusterIP UDP", "udp", clVIP + ":53"},
			{"NodePort TCP", "tcp", fmt.Sprintf("%s:%d", node1, clNodePort)},
			{"NodePort UDP", "udp", fmt.Sprintf("%s:%d", node1, clUDPPort)},
			// eTP Local: from inside the node, cluster-wide (the twin).
			{"LoadBalancer IP (eTP Local) TCP", "tcp", locLBIP + ":80"},
		}
		for _, tg := range targets {
			for _, client := range []string{"host process", "hostNetwork pod", "pod"} {
				before := counters(t, 1)
				seen := map[string]int{}
				switch client {
				case "pod":
					var probes []netProbe
					for range n {
						probes = append(probes, netProbe{From: pods["cl1"].NS, Proto: tg.op, Addr: tg.addr})
					}
					for _, r := range askAll(probes, 8, 2*time.Second, 3) {
						if r.Err != nil {
							seen["error"]++
							continue
						}
						seen[strings.Fields(r.Answer)[0]]++
					}
				default:
					cg := NodeCgroup(1)
					if client == "hostNetwork pod" {
						cg = hostPodCg
					}
					ops := make([]string, n)
					for i := range ops {
						ops[i] = tg.op + " " + tg.addr
					}
					lines, err := socktest.Run(netnsPath(NodeNS(1)), cg, ops...)
					if err != nil {
						t.Fatal(err)
					}
					for _, l := range lines {
						f := strings.Fields(l)
						if len(f) != 3 || f[0] != "ok" || f[2] != tg.addr {
							seen["error"]++
							t.Logf("%s %s: %q", client, tg.what, l)
							continue
						}
						seen[f[1]]++
					}
				}
				after := counters(t, 1)
				if seen["error"] > 0 || seen["be1"] == 0 || seen["be2"] == 0 || seen["be1"]+seen["be2"] != n {
					t.Errorf("%s, %s: answers %v; want all %d answered, by both backends", client, tg.what, seen, n)
				}
				// The path: the socket LB for node processes, the packet LB for the pod.
				fwd := "socket-connect4-translated"
				if tg.op == "udp" {
					fwd = "socket-sendmsg4-translated"
				}
				sock, flows := after[fwd]-before[fwd], after["new-flow"]-before["new-flow"]
				// A UDP client can reuse an ephemeral port within n
				// requests (the flow's conntrack entry then answers): at
				// least n/2 new flows, and none through the socket LB.
				if client == "pod" && (sock != 0 || flows < uint64(n)/2) {
					t.Errorf("pod, %s: %d socket translations, %d new LB flows; want 0 and >= %d", tg.what, sock, flows, n/2)
				}
				if client != "pod" && (sock < n || flows != 0) {
					t.Errorf("%s, %s: %d socket translations, %d new LB flows; want >= %d and 0", client, tg.what, sock, flows, n)
				}
				t.Logf("%s, %s: %v", client, tg.what, seen)
			}
		}
	})

	t.Run("externalTrafficPolicy Local: only the local endpoint, the client's address kept", func(t *testing.T) {
		// The external host routes the LoadBalancer IP to node 1 (as a
		// load balancer in front of the nodes would); on the routed
		// underlay (tunnel) through the router, which routes it to node 1.
		via := node1
		if routedLab() {
			if err := ip(t.Context(), "-n", WireNS, "route", "replace", locLBIP+"/32", "via", node1); err != nil {
				t.Fatal(err)
			}
			via = RouterIP
		}
		if err := ip(t.Context(), "-n", RawNS(1), "route", "replace", locLBIP+"/32", "via", via); err != nil {
			t.Fatal(err)
		}
		before := counters(t, 1)
		const n = 32
		clients := []struct{ ns, addr string }{{NodeNS(2), UnderlayIP(2)}, {RawNS(1), RawIP(1)}}
		got := 0
		for _, c := range clients {
			for _, dst := range []string{fmt.Sprintf("%s:%d", node1, locPort), locLBIP + ":80"} {
				if c.ns == NodeNS(2) && !strings.HasPrefix(dst, node1) {
					continue // node 2 has no route to the LB IP
				}
				for range n / 2 {
					line, err := dialFrom(c.ns, 0, dst, 3*time.Second)
					f := strings.Fields(line)
					if err != nil || len(f) != 2 {
						t.Fatalf("%s -> %s: %q, %v", c.ns, dst, line, err)
					}
					peer, perr := netip.ParseAddrPort(f[1])
					if f[0] != "be1" || perr != nil || peer.Addr().String() != c.addr {
						t.Fatalf("%s -> %s: answered by %s seeing %s; want be1 (the local endpoint) seeing %s", c.ns, dst, f[0], f[1], c.addr)
					}
					got++
				}
			}
		}
		after := counters(t, 1)
		if d := after["nodeport-local"] - before["nodeport-local"]; d < uint64(got) || after["nodeport-snat"] != before["nodeport-snat"] {
			t.Errorf("nodeport-local +%d, nodeport-snat +%d; want >= %d and 0", d, after["nodeport-snat"]-before["nodeport-snat"], got)
		}
		// Node 1 has no endpoint of noloc: dropped there, counted, no answer.
		drops := metricsDrops(t, 1, dropNoLocalBackend)
		if line, err := dialFrom(RawNS(1), 0, fmt.Sprintf("%s:%d", node1, noLocPort), time.Second); err == nil {
			t.Fatalf("noloc on node 1 answered %q; want a drop", line)
		}
		if d := metricsDrops(t, 1, dropNoLocalBackend) - drops; d == 0 {
			t.Error("no no-local-backend drop counted on node 1")
		}
		// ... while node 2, which has one, answers.
		if line, err := dialFrom(RawNS(1), 0, fmt.Sprintf("%s:%d", UnderlayIP(2), noLocPort), 3*time.Second); err != nil || !strings.HasPrefix(line, "be2 "+RawIP(1)+":") {
			t.Fatalf("noloc on node 2: %q, %v; want be2 seeing %s", line, err, RawIP(1))
		}
		// healthCheckNodePort: 200 with one local endpoint for loc, 503 with none for noloc.
		for _, hc := range []struct {
			port, code, local int
		}{{locHealth, 200, 1}, {locHealth + 1, 503, 0}} {
			var code, local int
			err := func() error {
				// The transport dials in goroutines of its own: each
				// connection is made on a thread in the external host's netns.
				cl := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
					DisableKeepAlives: true,
					DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
						var c net.Conn
						err := inNetns(RawNS(1), func() error {
							var err error
							c, err = net.DialTimeout(network, addr, 3*time.Second)
							return err
						})
						return c, err
					}}}
				resp, err := cl.Get(fmt.Sprintf("http://%s:%d/", node1, hc.port))
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				var b struct {
					LocalEndpoints int `json:"localEndpoints"`
				}
				code = resp.StatusCode
				err = json.NewDecoder(resp.Body).Decode(&b)
				local = b.LocalEndpoints
				return err
			}()
			if err != nil || code != hc.code || local != hc.local {
				t.Errorf("health check port %d: %d with %d local endpoints (%v); want %d with %d", hc.port, code, local, err, hc.code, hc.local)
			}
		}
	})

	t.Run("LoadBalancer IP announced by ARP from node 1 (lbipam responder on its uplink)", func(t *testing.T) {
		if routedLab() {
			t.Skip("the routed underlay puts the external host on another link: L2 announcements do not reach it")
		}
		// The external host has the LB IP on its link (no route via a node):
		// it asks who has it, node 1's responder answers with node 1's MAC,
		// and node 1's uplink program load-balances what arrives.
		r, err := lbipam.OpenResponder("/run/netns/"+NodeNS(1), Uplink, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		if err := r.Set([]netip.Addr{netip.MustParseAddr(locLBIP)}); err != nil {
			t.Fatal(err)
		}
		if err := ip(t.Context(), "-n", RawNS(1), "route", "replace", locLBIP+"/32", "dev", Uplink); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ip(context.Background(), "-n", RawNS(1), "route", "replace", locLBIP+"/32", "via", node1) })
		before := counters(t, 1)
		const n = 8
		for range n {
			line, err := dialFrom(RawNS(1), 0, locLBIP+":80", 3*time.Second)
			if f := strings.Fields(line); err != nil || len(f) != 2 || f[0] != "be1" || !strings.HasPrefix(f[1], RawIP(1)+":") {
				t.Fatalf("%s -> %s:80 on-link: %q, %v; want be1 seeing %s", RawNS(1), locLBIP, line, err, RawIP(1))
			}
		}
		after := counters(t, 1)
		if d := after["nodeport-local"] - before["nodeport-local"]; d < n {
			t.Errorf("nodeport-local +%d on node 1, want >= %d (the uplink program's LoadBalancer path)", d, n)
		}
		var mac, want string
		if err := inNetns(NodeNS(1), func() error {
			l, err := netlink.LinkByName(Uplink)
			if err == nil {
				want = l.Attrs().HardwareAddr.String()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := inNetns(RawNS(1), func() error {
			ns, err := netlink.NeighList(0, netlink.FAMILY_V4)
			for _, e := range ns {
				if e.IP.String() == locLBIP {
					mac = e.HardwareAddr.String()
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if mac != want {
			t.Errorf("the external host resolved %s to %q, want node 1's uplink %s", locLBIP, mac, want)
		}
	})

	t.Run("4000-byte UDP through a ClusterIP between nodes at MTU 1500, both ways", func(t *testing.T) {
		before := counters(t, 1)
		req := make([]byte, 4000)
		for i := range req {
			req[i] = byte('a' + i%26)
		}
		var reply []byte
		err := inNetns(pods["cl1"].NS, func() error {
			c, err := net.Dial("udp4", bigVIP+":53")
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 65536)
			for range 3 {
				if _, err := c.Write(req); err != nil {
					return err
				}
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, err := c.Read(buf)
				if err == nil {
					reply = buf[:n]
					return nil
				}
			}
			return errors.New("no reply")
		})
		if err != nil || len(reply) != len(req) || !strings.HasPrefix(string(reply), "be2 "+pods["cl1"].IP+":") {
			t.Fatalf("reply of %d bytes (%.40q), %v; want 4000 bytes from be2 seeing the pod's address", len(reply), reply, err)
		}
		after := counters(t, 1)
		// The reply came back in 3 fragments at MTU 1500, each translated
		// back (source -> the ClusterIP) on node 1's uplink.
		if d := after["rev-nat"] - before["rev-nat"]; d < 3 {
			t.Errorf("rev-nat +%d on node 1, want >= 3 (every fragment of the reply)", d)
		}
	})

	t.Run("1000 NodePort flows from client ports that are NodePorts and the node's ephemeral ports", func(t *testing.T) {
		// The node's own sockets on some of those ports.
		var held []net.Listener
		err := inNetns(NodeNS(1), func() error {
			for p := 32768; p < 32768+16; p++ {
				ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p))
				if err != nil {
					return err
				}
				held = append(held, ln)
			}
			return nil
		})
		for _, ln := range held {
			defer ln.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		var ports []int
		for p := 30000; p < 30500; p++ { // the NodePort range, the lab's NodePorts included
			ports = append(ports, p)
		}
		for p := 32768; p < 32768+500; p++ { // the node's ephemeral range
			ports = append(ports, p)
		}
		before := counters(t, 1)
		start := time.Now()
		type res struct {
			line string
			err  error
		}
		out := make([]res, len(ports))
		sem := make(chan struct{}, 32)
		var wg sync.WaitGroup
		for i, p := range ports {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				out[i].line, out[i].err = dialFrom(RawNS(1), p, fmt.Sprintf("%s:%d", node1, snatPort), 5*time.Second)
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		bad := 0
		for i, r := range out {
			f := strings.Fields(r.line)
			var sp int
			if len(f) == 2 {
				_, ps, _ := strings.Cut(f[1], ":")
				sp, _ = strconv.Atoi(ps)
			}
			// The backend sees node 1 on a port of the SNAT range.
			if r.err != nil || len(f) != 2 || f[0] != "be2" || !strings.HasPrefix(f[1], node1+":") || sp < 61000 || sp > 65535 {
				if bad < 5 {
					t.Errorf("client port %d: %q, %v; want be2 seeing %s on a port in 61000-65535", ports[i], r.line, r.err, node1)
				}
				bad++
			}
		}
		after := counters(t, 1)
		if bad > 0 {
			t.Errorf("%d of %d flows failed", bad, len(ports))
		}
		if d := after["nodeport-snat"] - before["nodeport-snat"]; d < uint64(len(ports)) {
			t.Errorf("nodeport-snat +%d, want >= %d", d, len(ports))
		}
		if elapsed > 60*time.Second {
			t.Errorf("%d flows took %s", len(ports), elapsed)
		}
		t.Logf("%d NodePort flows in %s", len(ports), elapsed.Round(time.Millisecond))
	})
}

// gsoMaxSize reads the gso_max_size of device name in netns ns.
func gsoMaxSize(t *testing.T, ns, name string) int {
	t.Helper()
	var size int
	if err := inNetns(ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", name, ns, err)
		}
		size = int(l.Attrs().GSOMaxSize)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return size
}
