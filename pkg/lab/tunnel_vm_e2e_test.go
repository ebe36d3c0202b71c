package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
)

// TestTunnelVMPath: the fast-lane VM in tunnel mode on the routed underlay.
// The guest gets the tunnel MTU (1450); lab check passes with the VM rows
// (guest to pods on both nodes and to the nodes, pods and nodes to the
// guest); bulk TCP between a pod on node 1 and the guest on node 2, both
// ways, is carried by BPF: 0 kernel-forwarded datagrams on both nodes, the
// pod's and the VM's endpoint counters account for the packets, node 2's
// tunnel counters encapsulate what the VM sent (tunnel_route from the VM's
// host end, not the node's route into the tunnel: the host-encap counter
// stays put, and node 1 gets the VM's identity from the VNI) and
// decapsulate what it received, and lanekit-vhost moved the frames. Then Services both ways: the guest reaches a ClusterIP whose
// backend is the pod on node 1 (load-balanced on node 2, then tunnelled),
// and the pod reaches a ClusterIP whose backend is the guest. QEMU runs
// under TCG: transfers are 3 s, every probe bounded. Root only; brings up
// the global lab.
func TestTunnelVMPath(t *testing.T) {
	bins := pathTestBins(t)
	bins.Self = CLIForTests(t)
	testutil.RequireBinary(t, "qemu-system-x86_64")
	if !executable(filepath.Join(bins.Dir, "lanekit-vhost")) {
		if os.Getenv("LANEKIT_BIN") != "" {
			t.Fatalf("lanekit-vhost missing in %s", bins.Dir)
		}
		testutil.MissingDep(t, "lanekit-vhost missing in %s", bins.Dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st := upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 1, VM: true, VMQueues: 1, NoStdVM: true, Routing: RoutingTunnel, Bins: bins})
	if len(st.VMs) != 1 || st.VMs[0].Node != 2 {
		t.Fatalf("want one VM on node 2, got %+v", st.VMs)
	}
	vm := st.VMs[0]
	vmIP := netip.MustParseAddr(vm.IP)
	pod := PodNS(1, 1, KindLanekit)
	podAddr, err := netip.ParseAddr(podIP(ctx, pod))
	if err != nil {
		t.Fatalf("pod address: %v", err)
	}
	// lab check first: it takes the guest console, which serves one client.
	t.Run("lab check", func(t *testing.T) {
		var out bytes.Buffer
		err := Check(ctx, bins, &out)
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "lanekit VMs") {
			t.Fatal("lab check printed no VM matrix")
		}
	})

	con, err := guest.DialConsole(ctx, vm.SerialSocket)
	if err != nil {
		t.Fatalf("guest console: %v", err)
	}
	defer con.Close()
	if out, code, err := con.Run(ctx, "cat /sys/class/net/eth0/mtu"); err != nil || code != 0 || strings.TrimSpace(out) != "1450" {
		t.Fatalf("guest MTU %q (exit %d, %v), want 1450 (the tunnel's)", out, code, err)
	}

	// One sample: node 1's kernel and pod, node 2's kernel and VM, the
	// backend's frames, and both nodes' tunnel counters.
	type sample struct {
		vmPathSample
		tun1, tun2 datapath.TunnelStats
	}
	take := func(t *testing.T) sample {
		t.Helper()
		return sample{takeVMPath(t, ctx, IPForwDatagrams, pod, podAddr, vmIP, vm.MetricsSocket), tunnelStats(t, 1), tunnelStats(t, 2)}
	}
	tunDelta := func(a, b datapath.TunnelStats, k datapath.TunnelStat) uint64 { return since(a[k], b[k]) }

	for _, dir := range []struct {
		name    string
		reverse bool
	}{{"pod to VM", false}, {"VM to pod", true}} {
		t.Run("bulk TCP "+dir.name, func(t *testing.T) {
			b := take(t)
			iperfPodToGuest(t, ctx, con, pod, vm.IP, dir.reverse)
			a := take(t)
			podD, vmD := judgePodVMPath(t, b.vmPathSample, a.vmPathSample, dir.reverse, 0, "datagrams")
			enc1, dec1 := tunDelta(a.tun1, b.tun1, datapath.TunnelEncap), tunDelta(a.tun1, b.tun1, datapath.TunnelDecap)
			enc2, dec2 := tunDelta(a.tun2, b.tun2, datapath.TunnelEncap), tunDelta(a.tun2, b.tun2, datapath.TunnelDecap)
			host2 := tunDelta(a.tun2, b.tun2, datapath.TunnelHostEncap)
			vhRX, vhTX := since(a.vhRX, b.vhRX), since(a.vhTX, b.vhTX)
			t.Logf("tunnel: node1 encap %d decap %d (VNI identity %d); node2 encap %d decap %d (VNI identity %d), host-encap %d; lanekit-vhost %d frames into the guest, %d out",
				enc1, dec1, tunDelta(a.tun1, b.tun1, datapath.TunnelVNIIdentity), enc2, dec2,
				tunDelta(a.tun2, b.tun2, datapath.TunnelVNIIdentity), host2, vhRX, vhTX)
			// Node 2 encapsulated what the VM sent and decapsulated what it
			// received; node 1 the same for its pod.
			for _, c := range []struct {
				what      string
				got, want uint64
			}{
				{"node2 encapsulations for what BPF forwarded from the VM", enc2, vmD.bpfFwd},
				{"node2 decapsulations for what BPF delivered to the VM", dec2, vmD.bpfTo},
				{"node1 encapsulations for what BPF forwarded from the pod", enc1, podD.bpfFwd},
				{"node1 decapsulations for what BPF delivered to the pod", dec1, podD.bpfTo},
				{"node1 decapsulations with the VM's identity from the VNI", tunDelta(a.tun1, b.tun1, datapath.TunnelVNIIdentity), dec1},
				{"frames lanekit-vhost moved into the guest, of the packets the pod sent", vhRX, podD.sent},
				{"frames lanekit-vhost moved out of the guest, of the packets the pod received", vhTX, podD.recv},
			} {
				if float64(c.got) < (1-maxKernelShare)*float64(c.want) {
					t.Errorf("%s: %d of %d", c.what, c.got, c.want)
				}
			}
			// The VM's frames took tunnel_route, not node 2's own route into
			// the tunnel device (to_tunnel's host-encap).
			if float64(host2) > maxKernelShare*float64(vmD.sent) {
				t.Errorf("node2: %d packets keyed by to_tunnel (the node's route into the tunnel) of the %d the VM sent", host2, vmD.sent)
			}
		})
	}

	// Services: the guest to a pod's Service, a pod to the guest's.
	podName, podSvcVIP, vmSvcVIP := "tun-vm-be", "10.96.121.10", "10.96.121.11"
	startNameServer(t, pod, podName, []int{8080}, nil)
	svc := clusterIPService("to-pod", podSvcVIP, podAddr.String()) + "---\n" + clusterIPService("to-vm", vmSvcVIP, vm.IP)
	if err := ApplyEverywhere(ctx, []byte(svc)); err != nil {
		t.Fatalf("apply services: %v", err)
	}
	lbNew := func(node int) uint64 {
		return agentStatus(t, node).GetControlPlane().GetLbCounters()["new-flow"]
	}

	t.Run("guest to a ClusterIP with its backend on node 1", func(t *testing.T) {
		lb2, tb := lbNew(2), tunnelStats(t, 2)
		fwd2, err := IPForwDatagrams(ctx, NodeNS(2))
		if err != nil {
			t.Fatal(err)
		}
		const n = 3
		for i := range n {
			cmd := fmt.Sprintf("echo vm-%d | nc -w 3 %s 80", i, podSvcVIP)
			var out string
			var code int
			for try := 0; try < 3; try++ { // the agents apply the Service asynchronously
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				out, code, err = con.Run(cctx, cmd)
				cancel()
				if err == nil && code == 0 && strings.Contains(out, podName+" vm-") {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil || code != 0 || !strings.Contains(out, podName+" vm-") {
				t.Fatalf("%q in the guest: exit %d, %v: %q (want the answer of %s)", cmd, code, err, out, podName)
			}
		}
		d, enc := since(lbNew(2), lb2), since(tunnelStats(t, 2)[datapath.TunnelEncap], tb[datapath.TunnelEncap])
		fwd, _ := IPForwDatagrams(ctx, NodeNS(2))
		t.Logf("node2: LB new-flow +%d, tunnel encap +%d, kernel forwarded +%d for %d connections from the guest", d, enc, since(fwd, fwd2), n)
		if d < n {
			t.Errorf("node2 load-balanced %d new flows for the guest's %d connections", d, n)
		}
		if enc < n*3 { // at least SYN, ACK + data, FIN of each
			t.Errorf("node2 encapsulated %d packets for %d connections", enc, n)
		}
		if since(fwd, fwd2) != 0 {
			t.Errorf("node2's kernel forwarded %d datagrams", since(fwd, fwd2))
		}
	})

	t.Run("pod on node 1 to a ClusterIP with the guest as its backend", func(t *testing.T) {
		lb1, tb := lbNew(1), tunnelStats(t, 2)
		const n = 3
		for i := range n {
			var out string
			var err error
			for try := 0; try < 3; try++ {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second) // busybox nc -w bounds the connect only
				out, err = inNS(cctx, pod, "busybox", "sh", "-c", fmt.Sprintf("echo pod-%d | busybox nc -w 3 %s 80", i, vmSvcVIP))
				cancel()
				if err == nil && strings.Contains(out, "LK-HELLO") {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil || !strings.Contains(out, "LK-HELLO") {
				t.Fatalf("pod -> %s:80 (the guest's responder): %v: %q", vmSvcVIP, err, out)
			}
		}
		d, dec := since(lbNew(1), lb1), since(tunnelStats(t, 2)[datapath.TunnelDecap], tb[datapath.TunnelDecap])
		t.Logf("node1: LB new-flow +%d; node2: tunnel decap +%d for %d connections to the guest", d, dec, n)
		if d < n {
			t.Errorf("node1 load-balanced %d new flows for the pod's %d connections", d, n)
		}
		if dec < n*3 {
			t.Errorf("node2 decapsulated %d packets for %d connections to the guest", dec, n)
		}
	})

	// Last (it moves the guest): live migration through the tunnel and back.
	con.Close()
	for _, mv := range [][2]int{{2, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("live migration node %d to node %d through the tunnel", mv[0], mv[1]), func(t *testing.T) {
			tunnelVMMigration(ctx, t, bins, vm, mv[0], mv[1])
		})
	}
}

// tunnelVMMigration live-migrates the guest from node from to node to with
// `lab vm migrate`'s code in the tunnel lab (issue 27): pods on both nodes
// ping it every 10 ms and one holds a TCP connection to it; each pinger
// loses at most maxMigrationLoss pings and the connection survives. Then
// the path: the source's node map sends the address to the target's
// underlay (a /32 claim entry next to the CIDRs; node 2 → 1: an address of
// node 2's own pod CIDR), the target's has no entry for it, and pings from
// the pod on the source node are encapsulated by BPF there (tunnel_route,
// not the node's own route into the tunnel: host-encap stays), decapsulated
// on the target and delivered to the target endpoint (its counters grow),
// with 0 datagrams forwarded by either kernel: the source relays none of it.
func tunnelVMMigration(ctx context.Context, t *testing.T, bins Bins, vm LabVM, from, to int) {
	began := time.Now()
	vmIP := netip.MustParseAddr(vm.IP)
	rep, err := MigrateVM(ctx, MigrateOptions{VM: vm.Name, To: to, Bins: bins, Out: testLog{t}})
	if rep != nil {
		t.Logf("report:\n%s", rep)
	}
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if rep.IP != vm.IP || rep.MAC != vm.MAC || rep.From != from || rep.To != to {
		t.Fatalf("report %+v: want %s %s from %d to %d", rep, vm.IP, vm.MAC, from, to)
	}
	if rep.TCP.Error != "" || rep.TCP.Exchanges < 10 {
		t.Errorf("tcp connection: %+v", rep.TCP)
	}
	if len(rep.Pings) != 2 {
		t.Fatalf("want a pinger on each node, got %+v", rep.Pings)
	}
	for _, p := range rep.Pings {
		if p.Sent < 100 || p.Lost > maxMigrationLoss {
			t.Errorf("pings from %s: %d sent, %d lost (at most %d)", p.From, p.Sent, p.Lost, maxMigrationLoss)
		}
	}
	// The source's node map: the claim, with the target's underlay; the
	// target's: none.
	claim := func(node int) string {
		for _, n := range agentStatus(t, node).GetRouting().GetTunnelNodes() {
			if n.GetPodCidr() == vm.IP+"/32" {
				return n.GetUnderlay()
			}
		}
		return ""
	}
	if c := claim(from); c != UnderlayIP(to) {
		t.Errorf("node %d's node map: %s/32 -> %q, want node %d's underlay %s", from, vm.IP, c, to, UnderlayIP(to))
	}
	if c := claim(to); c != "" {
		t.Errorf("node %d (the owner) has a node map entry %s/32 -> %s", to, vm.IP, c)
	}
	id, c0, err := datapath.PinnedCounters(BPFDir(to), vmIP)
	if err != nil || id != rep.TargetID {
		t.Fatalf("node %d endpoint map: %s is endpoint %d (%v), want the target's %d", to, vmIP, id, err, rep.TargetID)
	}
	if _, _, err := datapath.PinnedCounters(BPFDir(from), vmIP); err == nil {
		t.Errorf("node %d still has %s in its endpoint map", from, vmIP)
	}
	fwd := func(node int) uint64 {
		v, err := IPForwDatagrams(ctx, NodeNS(node))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	fFrom, fTo, tunFrom, tunTo := fwd(from), fwd(to), tunnelStats(t, from), tunnelStats(t, to)
	const n = 20
	pod := PodNS(from, 1, KindLanekit)
	if out, err := nsCommand(ctx, pod, append(pingCommand(), "-c", fmt.Sprint(n), "-i", "0.05", "-W", "2", vm.IP)...).CombinedOutput(); err != nil {
		t.Errorf("ping %s from %s after the migration: %v\n%s", vm.IP, pod, err, out)
	}
	_, c1, err := datapath.PinnedCounters(BPFDir(to), vmIP)
	if err != nil {
		t.Fatal(err)
	}
	aFrom, aTo := tunnelStats(t, from), tunnelStats(t, to)
	d := func(a, b datapath.TunnelStats, k datapath.TunnelStat) uint64 { return since(a[k], b[k]) }
	enc, host, dec := d(aFrom, tunFrom, datapath.TunnelEncap), d(aFrom, tunFrom, datapath.TunnelHostEncap), d(aTo, tunTo, datapath.TunnelDecap)
	delivered := since(c1.ToPackets, c0.ToPackets)
	gFrom, gTo := since(fwd(from), fFrom), since(fwd(to), fTo)
	t.Logf("%d pings from node %d's pod: node%d encap +%d host-encap +%d, node%d decap +%d, target endpoint %d delivered +%d; kernel forwarded node%d +%d node%d +%d",
		n, from, from, enc, host, to, dec, id, delivered, from, gFrom, to, gTo)
	for _, c := range []struct {
		what string
		got  uint64
	}{
		{fmt.Sprintf("node %d encapsulations (tunnel_route)", from), enc},
		{fmt.Sprintf("node %d decapsulations", to), dec},
		{fmt.Sprintf("packets delivered to the target endpoint on node %d", to), delivered},
	} {
		if c.got < n {
			t.Errorf("%s: %d for %d pings from node %d's pod", c.what, c.got, n, from)
		}
	}
	if host != 0 {
		t.Errorf("node %d keyed %d packets by its own route into the tunnel (to_tunnel), want 0: the pod's pings take tunnel_route", from, host)
	}
	if gFrom != 0 || gTo != 0 {
		t.Errorf("kernel forwarded %d datagrams on node %d and %d on node %d, want 0 (BPF carries the moved address)", gFrom, from, gTo, to)
	}
	t.Logf("migration check took %s", time.Since(began).Round(time.Millisecond))
}

// clusterIPService renders a ClusterIP Service (TCP 80 → 8080) in namespace
// tunvm and its EndpointSlice with one backend.
func clusterIPService(name, vip, backend string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: tunvm}
spec:
  clusterIP: %[2]s
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: tunvm, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [%[3]s]
`, name, vip, backend)
}
