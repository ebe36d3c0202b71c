package lab

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// TestRoutedUnderlayNativeFails: on the routed underlay (a router that knows
// no pod CIDR) native routing cannot carry pod traffic between nodes: the
// lab the tunnel test below passes on is one native routing fails on. Root
// only; brings up the global lab.
func TestRoutedUnderlayNativeFails(t *testing.T) {
	bins := pathTestBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() { Down(context.Background(), DownOptions{Bins: bins}) })
	if _, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, Routing: RoutingNative, Underlay: UnderlayRouted, Bins: bins, Out: testLog{t}}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	p1, p2 := PodNS(1, 1, KindLanekit), PodNS(2, 1, KindLanekit)
	ip2 := podIP(ctx, p2)
	if out, err := inNS(ctx, p1, "busybox", "ping", "-c", "2", "-W", "1", ip2); err == nil {
		t.Fatalf("native routing reached %s across a router that knows no pod CIDR:\n%s", ip2, out)
	}
	// The underlay itself works: node to node through the router.
	if out, err := inNS(ctx, NodeNS(1), "busybox", "ping", "-c", "1", "-W", "2", UnderlayIP(2)); err != nil {
		t.Fatalf("underlay node1 -> node2: %v\n%s", err, out)
	}
}

// TestTunnelPathTruth: in tunnel mode on the routed underlay, bulk TCP between
// lanekit pods on two nodes in both directions is carried by the BPF tunnel:
// the nodes' kernels forward nothing (IpForwDatagrams), the pods' BPF
// counters account for the packets, the tunnel counters grow on both sides
// with the sender's identity mapped from the VNI on the receiver, fewer
// encapsulations than packets on the wire (GSO skbs through the tunnel,
// segmented below it), several UDP source ports for parallel flows (the
// flow hash), pod MTU = uplink - 50, and a too-big DF packet answered with
// ICMP fragmentation needed. Root only; brings up the global lab.
func TestTunnelPathTruth(t *testing.T) {
	bins := pathTestBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 1, Routing: RoutingTunnel, Bins: bins})
	pods := map[int]string{1: PodNS(1, 1, KindLanekit), 2: PodNS(2, 1, KindLanekit)}
	ips := map[int]netip.Addr{}
	for n, pod := range pods {
		a, err := netip.ParseAddr(podIP(ctx, pod))
		if err != nil {
			t.Fatalf("address of %s: %v", pod, err)
		}
		ips[n] = a
		out, err := inNS(ctx, pod, "cat", "/sys/class/net/eth0/mtu")
		if err != nil || strings.TrimSpace(out) != "1450" {
			t.Fatalf("%s MTU %q (%v), want 1450 (uplink 1500 - 50)", pod, out, err)
		}
	}
	// The router has routes to the underlay subnets only.
	if out, _ := run(ctx, "ip", "-n", WireNS, "route"); strings.Contains(out, "10.244.") {
		t.Fatalf("the router knows pod CIDRs:\n%s", out)
	}

	for _, dir := range []struct{ client, server int }{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("node%d pod to node%d pod", dir.client, dir.server), func(t *testing.T) {
			before := map[int]pathSample{}
			tunBefore := map[int]datapath.TunnelStats{}
			upBefore := map[int]linkCount{}
			for n := range pods {
				before[n] = samplePath(t, ctx, n, pods[n], ips[n])
				tunBefore[n] = tunnelStats(t, n)
				upBefore[n] = uplinkTx(t, ctx, n)
			}
			bulkTCP(t, ctx, pods[dir.client], pods[dir.server], ips[dir.server].String())
			for n := range pods {
				// The tunnel path: the kernel forwards nothing at all.
				d := judgeBulkPath(t, fmt.Sprintf("node%d pod", n), before[n], samplePath(t, ctx, n, pods[n], ips[n]),
					n == dir.client, 0, "datagrams")
				bpfFwd, bpfTo := d.bpfFwd, d.bpfTo
				ts, tb := tunnelStats(t, n), tunBefore[n]
				encap, decap := since(ts[datapath.TunnelEncap], tb[datapath.TunnelEncap]), since(ts[datapath.TunnelDecap], tb[datapath.TunnelDecap])
				vni := since(ts[datapath.TunnelVNIIdentity], tb[datapath.TunnelVNIIdentity])
				upDecap := since(ts[datapath.TunnelDecapUplink], tb[datapath.TunnelDecapUplink])
				up := uplinkTx(t, ctx, n)
				wireTx, wireBytes := since(up.packets, upBefore[n].packets), since(up.bytes, upBefore[n].bytes)
				perSkb := uint64(0)
				if wireTx > 0 {
					perSkb = wireBytes / wireTx
				}
				t.Logf("node%d: tunnel encap %d (uplink sent %d skbs, %d bytes each on average), decap %d (%d with a VNI identity, %d in from_uplink)",
					n, encap, wireTx, perSkb, decap, vni, upDecap)
				// What BPF encapsulates itself is what is no GSO packet:
				// the receiver's ACKs, not the sender's segments.
				bpfEnc := since(ts[datapath.TunnelEncapBPF], tb[datapath.TunnelEncapBPF])
				t.Logf("node%d: %d of the encapsulations in BPF", n, bpfEnc)
				if n == dir.client && bpfEnc > encap/2 {
					t.Errorf("node%d: %d of %d encapsulations in BPF: bulk TCP's GSO packets must go through the VXLAN device", n, bpfEnc, encap)
				}
				if n == dir.server && float64(bpfEnc) < (1-maxKernelShare)*float64(encap) {
					t.Errorf("node%d: %d of %d encapsulations (ACKs) in BPF", n, bpfEnc, encap)
				}
				if float64(encap) < (1-maxKernelShare)*float64(bpfFwd) {
					t.Errorf("node%d: %d encapsulations for %d packets BPF forwarded off the node", n, encap, bpfFwd)
				}
				if float64(decap) < (1-maxKernelShare)*float64(bpfTo) || float64(vni) < (1-maxKernelShare)*float64(decap) {
					t.Errorf("node%d: decap %d (%d with an identity from the VNI) for %d packets delivered", n, decap, vni, bpfTo)
				}
				// GSO through the tunnel: the encapsulated skbs leave the
				// uplink as UDP-tunnel GSO packets far above its 1500-byte
				// MTU (segmented by the device, or not at all over veth),
				// not one encapsulation per segment.
				if n == dir.client && perSkb < 3000 {
					t.Errorf("node%d: the uplink sent %d skbs of %d bytes on average for %d encapsulations: bulk TCP is segmented before the tunnel", n, wireTx, perSkb, encap)
				}
			}
		})
	}

	// Packets that are no GSO aggregate (pings here; requests, replies, a
	// connection's handshake, bulk TCP's ACKs) are encapsulated by
	// tunnel_bpf_encap and decapsulated in from_uplink: the nodes' VXLAN
	// devices send and receive none of them.
	t.Run("small packets encapsulated and decapsulated in BPF, not by the VXLAN device", func(t *testing.T) {
		const pings = 50
		tb := map[int]datapath.TunnelStats{}
		vb, vtb := map[int]uint64{}, map[int]uint64{}
		for n := range pods {
			tb[n], vb[n], vtb[n] = tunnelStats(t, n), vxlanRx(t, ctx, n), vxlanTx(t, ctx, n)
		}
		if out, err := ping(ctx, pods[1], ips[2].String(), pings, "0.02"); err != nil {
			t.Fatalf("ping node1 pod -> node2 pod: %v\n%s", err, out)
		}
		for n := range pods {
			ts := tunnelStats(t, n)
			up := since(ts[datapath.TunnelDecapUplink], tb[n][datapath.TunnelDecapUplink])
			decap := since(ts[datapath.TunnelDecap], tb[n][datapath.TunnelDecap])
			dev := since(vxlanRx(t, ctx, n), vb[n])
			bpfEnc := since(ts[datapath.TunnelEncapBPF], tb[n][datapath.TunnelEncapBPF])
			encap := since(ts[datapath.TunnelEncap], tb[n][datapath.TunnelEncap])
			devTx := since(vxlanTx(t, ctx, n), vtb[n])
			t.Logf("node%d: %d decapsulated, %d of them in from_uplink; %s received %d; %d encapsulated, %d of them in BPF; %s sent %d",
				n, decap, up, agent.TunnelDevice, dev, encap, bpfEnc, agent.TunnelDevice, devTx)
			if up < pings || up != decap || dev > up/10 {
				t.Errorf("node%d: %d pings' packets: %d decapsulated in from_uplink of %d, the VXLAN device received %d", n, pings, up, decap, dev)
			}
			if bpfEnc < pings || bpfEnc != encap || devTx > bpfEnc/10 {
				t.Errorf("node%d: %d pings' packets: %d encapsulated in BPF of %d, the VXLAN device sent %d", n, pings, bpfEnc, encap, devTx)
			}
		}
	})

	t.Run("parallel flows spread over UDP source ports", func(t *testing.T) {
		ports := captureVXLANSourcePorts(t, fmt.Sprintf("lk-w%d", 1), func() {
			bulkTCPParallel(t, ctx, pods[1], pods[2], ips[2].String(), 8)
		})
		t.Logf("VXLAN UDP source ports seen from node1: %d distinct", len(ports))
		if len(ports) < 3 {
			t.Fatalf("8 flows used %d UDP source ports (%v): the outer port does not follow the flow hash", len(ports), ports)
		}
		// One port per flow (8 and iperf3's control connection), whichever
		// path encapsulated a packet (GSO segments through the VXLAN
		// device, the rest in BPF): else ECMP could reorder a flow.
		used := len(flowPorts(ports))
		if used > 9 {
			t.Fatalf("8 flows (and a control connection) used %d UDP source ports (%v): a flow's packets leave on more than one", used, ports)
		}
	})

	// The node's local port range changed after the agent started (an
	// admin's sysctl): tunnel_bpf_encap and the VXLAN device must still
	// give a flow one outer port, from the range the device was made with.
	t.Run("local port range changed: still one outer port per flow", func(t *testing.T) {
		lo, hi := vxlanSourcePortRange(t, ctx, 1)
		const key = "/proc/sys/net/ipv4/ip_local_port_range"
		old, err := inNS(ctx, NodeNS(1), "cat", key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inNS(ctx, NodeNS(1), "sh", "-c", "echo 20000 24999 > "+key); err != nil {
			t.Fatal(err)
		}
		defer inNS(ctx, NodeNS(1), "sh", "-c", "echo "+strings.Join(strings.Fields(old), " ")+" > "+key)
		ports := captureVXLANSourcePorts(t, "lk-w1", func() {
			bulkTCPParallel(t, ctx, pods[1], pods[2], ips[2].String(), 8)
		})
		used := flowPorts(ports)
		for _, p := range used {
			if p < lo || p >= hi {
				t.Errorf("outer source port %d (%d packets) outside the device's range %d-%d", p, ports[p], lo, hi)
			}
		}
		t.Logf("range %d-%d, node's local port range now 20000-24999: %d ports with more than 2 packets %v", lo, hi, len(used), ports)
		if len(used) > 9 {
			t.Fatalf("8 flows (and a control connection) used %d UDP source ports (%v): BPF and the VXLAN device draw from different ranges", len(used), ports)
		}
	})

	t.Run("DF packet over the tunnel MTU: ICMP fragmentation needed", func(t *testing.T) {
		tb := tunnelStats(t, 1)
		// The pod's MTU is 1450; raise it (both ends of its veth) so that a
		// 1500-byte DF datagram leaves the pod and meets the tunnel.
		host := hostEnd(t, ctx, 1, pods[1])
		for _, args := range [][]string{{"-n", NodeNS(1), "link", "set", host, "mtu", "1500"}, {"-n", pods[1], "link", "set", "eth0", "mtu", "1500"}} {
			if err := ip(ctx, args...); err != nil {
				t.Fatal(err)
			}
		}
		defer func() {
			ip(ctx, "-n", pods[1], "link", "set", "eth0", "mtu", "1450")
			ip(ctx, "-n", NodeNS(1), "link", "set", host, "mtu", "1450")
		}()
		script := `import socket,sys
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP,10,2) # IP_MTU_DISCOVER=IP_PMTUDISC_DO
s.connect((sys.argv[1],9))
s.send(b"x"*1472)
import time; time.sleep(0.5)
try:
    s.send(b"x"*1472); print("sent")
except OSError as e: print("err", e.errno)
print("mtu", s.getsockopt(socket.IPPROTO_IP,14)) # IP_MTU
`
		out, err := inNS(ctx, pods[1], "python3", "-c", script, ips[2].String())
		if err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		t.Logf("DF probe: %s", strings.Join(strings.Fields(out), " "))
		if !strings.Contains(out, "err 90") || !strings.Contains(out, "mtu 1450") {
			t.Fatalf("no ICMP fragmentation needed with MTU 1450 for a 1500-byte DF datagram: %s", out)
		}
		if d := tunnelStats(t, 1)[datapath.TunnelOversize] - tb[datapath.TunnelOversize]; d < 1 {
			t.Fatalf("oversize counter grew by %d", d)
		}
	})
}

// vxlanRx and vxlanTx read node n's VXLAN device's packet counters (what the
// kernel decapsulated, encapsulated).
func vxlanRx(t *testing.T, ctx context.Context, n int) uint64 {
	return vxlanCount(t, ctx, n, "rx_packets")
}
func vxlanTx(t *testing.T, ctx context.Context, n int) uint64 {
	return vxlanCount(t, ctx, n, "tx_packets")
}

func vxlanCount(t *testing.T, ctx context.Context, n int, name string) uint64 {
	t.Helper()
	out, err := inNS(ctx, NodeNS(n), "cat", "/sys/class/net/"+agent.TunnelDevice+"/statistics/"+name)
	if err != nil {
		t.Fatalf("node%d %s %s: %v", n, agent.TunnelDevice, name, err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("node%d %s %s %q: %v", n, agent.TunnelDevice, name, out, err)
	}
	return v
}

func tunnelStats(t *testing.T, node int) datapath.TunnelStats {
	t.Helper()
	st, err := datapath.PinnedTunnelStats(BPFDir(node))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// captureVXLANSourcePorts records the UDP source ports of VXLAN packets
// (destination port TunnelPort) the router receives on port dev while fn
// runs: an AF_PACKET socket in the router namespace.
func captureVXLANSourcePorts(t *testing.T, dev string, fn func()) map[uint16]int {
	t.Helper()
	ports := map[uint16]int{}
	var mu sync.Mutex
	ready, done := make(chan error, 1), make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // the thread dies with its namespace changed: not unlocked
		h, err := netns.GetFromPath(netnsPath(WireNS))
		if err != nil {
			ready <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ready <- err
			return
		}
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			ready <- err
			return
		}
		proto := uint16(unix.ETH_P_IP)
		proto = proto<<8 | proto>>8
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(proto))
		if err != nil {
			ready <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifc.Index}); err != nil {
			ready <- err
			return
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
		ready <- nil
		buf := make([]byte, 128)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
			if err != nil || n < 28 {
				continue
			}
			ihl := int(buf[0]&0xf) * 4
			if buf[9] != unix.IPPROTO_UDP || len(buf) < ihl+4 {
				continue
			}
			if binary.BigEndian.Uint16(buf[ihl+2:]) != TunnelPort {
				continue
			}
			mu.Lock()
			ports[binary.BigEndian.Uint16(buf[ihl:])]++
			mu.Unlock()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("capture on %s in %s: %v", dev, WireNS, err)
	}
	fn()
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	return ports
}

type linkCount struct{ packets, bytes uint64 }

// uplinkTx reads node n's uplink transmit counters (skbs, as veth counts
// them: a GSO packet is one).
func uplinkTx(t *testing.T, ctx context.Context, n int) linkCount {
	t.Helper()
	out, err := run(ctx, "ip", "-n", NodeNS(n), "-s", "-j", "link", "show", "dev", Uplink)
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Stats struct {
			TX struct {
				Packets uint64 `json:"packets"`
				Bytes   uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("uplink stats of node%d: %v: %s", n, err, out)
	}
	return linkCount{links[0].Stats.TX.Packets, links[0].Stats.TX.Bytes}
}

// hostEnd names the node-side device of a pod's eth0 (its veth peer).
func hostEnd(t *testing.T, ctx context.Context, node int, pod string) string {
	t.Helper()
	out, err := inNS(ctx, pod, "cat", "/sys/class/net/eth0/iflink")
	if err != nil {
		t.Fatal(err)
	}
	idx := strings.TrimSpace(out)
	links, err := run(ctx, "ip", "-n", NodeNS(node), "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(links, "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && f[0] == idx+":" {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			return name
		}
	}
	t.Fatalf("no device with ifindex %s in %s", idx, NodeNS(node))
	return ""
}

// routedLab reports whether the lab that is up runs on the routed underlay
// (LANEKIT_LAB_ROUTING=tunnel).
func routedLab() bool {
	st, err := LoadState()
	return err == nil && st.Underlay == UnderlayRouted
}

// TestTunnelPolicyByVNI: ingress policy on the receiving node takes the
// sender's identity from the VNI. A policy on node 1 admits role=client pods
// to app=web; the client on node 2 gets through. Then node 1 forgets the
// client's address (its lk_policy_ipcache entry is deleted): new connections
// still pass, on the identity the VNI carries. Then node 1 forgets the VNI's
// identity too (lk_tunnel_ident emptied): the same connections are denied —
// the VNI, not the address, was what admitted them. Before those, the
// attacker's side (testForgedVXLAN): a pod, a host that is no node and a
// node speaking for a pod not its own all fail to borrow the client's VNI.
// Root only; brings up the global lab in tunnel mode.
func TestTunnelPolicyByVNI(t *testing.T) {
	t.Setenv(RoutingEnv, RoutingTunnel)
	lk, cli := upLabCLI(t)
	if st, err := LoadState(); err != nil || st.Routing != RoutingTunnel {
		t.Fatalf("lab not in tunnel mode: %+v %v", st, err)
	}
	for _, p := range [][]string{{"web", "1", "app=web"}, {"client", "2", "role=client"}, {"mallory", "2", "role=guest"}} {
		if _, err := lk(t, "lab", "pod", "add", p[0], "--node", p[1], "--namespace", "shop", "--labels", p[2], "--port", "http=8080/TCP"); err != nil {
			t.Fatal(err)
		}
	}
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	web, client, mallory := st.NamedPods[0].IP, st.NamedPods[1].IP, st.NamedPods[2].IP
	webFromClientsPolicy(t, lk, cli)
	askFrom := func(from string) int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := inNS(ctx, NamedPodNS(from), cli, "lab", "tcp-ask", web+":8080", "--count", "3", "--timeout", "1s")
		if err != nil {
			t.Fatalf("tcp-ask: %v: %s", err, out)
		}
		var got map[string]int
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
			t.Fatal(err)
		}
		return got[web+":8080"]
	}
	ask := func() int { return askFrom("client") }
	if n := ask(); n != 3 {
		t.Fatalf("client -> web with the policy: %d answers, want 3", n)
	}
	// The VNI is no one's to claim but the client's node (tunnel_forge_e2e_test.go).
	testForgedVXLAN(t, askFrom, web, client, mallory)
	ipcache, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(1), "lk_policy_ipcache"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ipcache.Close()
	key := binary.NativeEndian.Uint32(netip.MustParseAddr(client).AsSlice())
	if err := ipcache.Delete(key); err != nil {
		t.Fatalf("forget %s on node 1: %v", client, err)
	}
	before := tunnelStats(t, 1)[datapath.TunnelVNIIdentity]
	if n := ask(); n != 3 {
		t.Fatalf("client -> web, node 1 not knowing the client's address: %d answers, want 3 (identity from the VNI)", n)
	}
	if d := tunnelStats(t, 1)[datapath.TunnelVNIIdentity] - before; d == 0 {
		t.Fatalf("no packet on node 1 took its identity from the VNI")
	}
	ident, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(1), "lk_tunnel_ident"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ident.Close()
	var k, v uint32
	var keys []uint32
	for it := ident.Iterate(); it.Next(&k, &v); {
		keys = append(keys, k)
	}
	for _, k := range keys {
		ident.Delete(k)
	}
	if n := ask(); n != 0 {
		t.Fatalf("client -> web with neither the address nor the VNI's identity known on node 1: %d answers, want 0", n)
	}
}

// flowPorts are the captured outer source ports that carried a flow: a port
// with one or two packets is not counted, since TCP draws a socket a new
// hash when it retransmits after a timeout (a SYN on a busy machine) and
// the outer port follows it, as the device's would.
func flowPorts(ports map[uint16]int) []uint16 {
	var out []uint16
	for p, n := range ports {
		if n > 2 {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// vxlanSourcePortRange reads node n's VXLAN device's outer source port range
// ([lo, hi), udp_flow_src_port's); 0, 0 when it has none of its own.
func vxlanSourcePortRange(t *testing.T, ctx context.Context, n int) (uint16, uint16) {
	t.Helper()
	out, err := run(ctx, "ip", "-n", NodeNS(n), "-d", "-j", "link", "show", "dev", agent.TunnelDevice)
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Info struct {
			Data struct {
				Range struct {
					Low  uint16 `json:"low"`
					High uint16 `json:"high"`
				} `json:"port_range"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("%s of node%d: %v: %s", agent.TunnelDevice, n, err, out)
	}
	r := links[0].Info.Data.Range
	return r.Low, r.High
}
