package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/internal/unixhttp"
	"github.com/lanekit/lanekit/pkg/datapath"
	lkendpoint "github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/guest"
)

// maxMigrationLoss bounds the pings one pinger may lose in a migration
// (10 ms apart: one second of outage). Measured here: 3-9.
const maxMigrationLoss = 100

// TestVMLiveMigrationMovesAddress live-migrates the lab's fast-lane guest
// node 2 -> node 1 -> node 2 with `lab vm migrate`'s code while a pod on
// each node pings it every 10 ms and a pod holds a TCP connection to it.
// The agents do the address move (the lab only reports the migration state
// and hands the agents each other's claims): after each move the VM's
// address is in the target's endpoint map under the target's endpoint ID
// and its counters grow with traffic from both nodes, the source has no
// map entry, endpoint, device, netns or process left and routes the
// address to the target, the TCP connection survived, and each pinger lost
// at most maxMigrationLoss pings. A ClusterIP Service whose backend is the
// VM and a NetworkPolicy selecting it (applied once, before the first move)
// work before and after every move: migrationObjects.check. Before the moves,
// the same lab shows pod <-> VM bulk TCP taking the BPF path
// (podVMTakesTheBPFPath). Root only; brings up the global lab with a VM (under
// the lab lock).
func TestVMLiveMigrationMovesAddress(t *testing.T) {
	bins := pathTestBins(t)
	testutil.RequireBinary(t, "qemu-system-x86_64")
	if !executable(filepath.Join(bins.Dir, "lanekit-vhost")) {
		if os.Getenv("LANEKIT_BIN") != "" {
			t.Fatalf("lanekit-vhost missing in %s", bins.Dir)
		}
		testutil.MissingDep(t, "lanekit-vhost missing in %s", bins.Dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st := upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 1, VM: true, VMQueues: 1, NoStdVM: true, Bins: bins})
	if len(st.VMs) != 1 || st.VMs[0].Node != 2 {
		t.Fatalf("want one VM on node 2, got %+v", st.VMs)
	}
	vmIP := netip.MustParseAddr(st.VMs[0].IP)
	mac := st.VMs[0].MAC
	// The path first, on the same lab (one VM boot for both): bulk TCP pod <-> VM
	// through the BPF programs, before any policy or move.
	t.Run("pod and VM take the BPF path", func(t *testing.T) { podVMTakesTheBPFPath(t, ctx, bins, st) })
	objs := setupMigrationObjects(t, ctx, bins, st)
	t.Run("service and policy before the moves", func(t *testing.T) { objs.check(t, 2) })

	for _, to := range []int{1, 2} {
		t.Run(fmt.Sprintf("to node %d", to), func(t *testing.T) {
			before, err := LoadState()
			if err != nil {
				t.Fatal(err)
			}
			old := before.VMs[0]
			from := old.Node
			rep, err := MigrateVM(ctx, MigrateOptions{VM: old.Name, To: to, Bins: bins, Out: testLog{t}})
			if rep != nil {
				t.Logf("report:\n%s", rep)
			}
			if err != nil {
				migrationDiagnostics(t, ctx, old.Name, vmIP, from, to)
				t.Fatalf("migrate: %v", err)
			}
			if rep.IP != vmIP.String() || rep.MAC != mac || rep.From != from || rep.To != to {
				t.Fatalf("report %+v: want %s %s from %d to %d", rep, vmIP, mac, from, to)
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
			if rep.ActivatedBy == "" || rep.Generation == 0 {
				t.Errorf("target endpoint: activated by %q, generation %d", rep.ActivatedBy, rep.Generation)
			}

			// The target delivers the address: its map entry is the target's
			// endpoint, whose counters grow with pings from both nodes.
			id, c0, err := datapath.PinnedCounters(BPFDir(to), vmIP)
			if err != nil || id != rep.TargetID {
				t.Fatalf("node %d endpoint map: %s is endpoint %d (%v), want the target's %d", to, vmIP, id, err, rep.TargetID)
			}
			for _, n := range []int{1, 2} {
				pod := PodNS(n, 1, KindLanekit)
				if out, err := nsCommand(ctx, pod, append(pingCommand(), "-c", "3", "-W", "2", vmIP.String())...).CombinedOutput(); err != nil {
					t.Errorf("ping %s from %s after the migration: %v\n%s", vmIP, pod, err, out)
				}
			}
			_, c1, err := datapath.PinnedCounters(BPFDir(to), vmIP)
			if err != nil {
				t.Fatal(err)
			}
			if got := c1.ToPackets - c0.ToPackets; got < 6 {
				t.Errorf("node %d endpoint %d: %d packets delivered for 6 pings from both nodes", to, id, got)
			}
			lv := vmOf(t, old.Name)
			if lv.Node != to || lv.NS != VMNS(to, 1) {
				t.Fatalf("lab state: vm on node %d in %s, want node %d", lv.Node, lv.NS, to)
			}
			con, err := guest.DialConsole(ctx, lv.SerialSocket)
			if err != nil {
				t.Fatalf("guest console on node %d: %v", to, err)
			}
			out, _, err := con.Run(ctx, "ip -4 addr show eth0; ip link show eth0")
			con.Close()
			if err != nil || !strings.Contains(out, vmIP.String()+"/32") || !strings.Contains(out, mac) {
				t.Errorf("guest after the migration: %v\n%s", err, out)
			}

			// Nothing of the VM is left on the source: no map entry, no
			// endpoint, no netns, no QEMU or backend; the address routes to
			// the target.
			if _, _, err := datapath.PinnedCounters(BPFDir(from), vmIP); err == nil {
				t.Errorf("node %d still has %s in its endpoint map", from, vmIP)
			}
			if _, err := findAgentVM(ctx, AgentSocket(from), old.Name); err == nil {
				t.Errorf("node %d's agent still lists vm %s", from, old.Name)
			}
			if _, ok := endpointCounters(t, from)[vmIP.String()]; ok {
				t.Errorf("node %d's agent still has an endpoint with %s", from, vmIP)
			}
			if netnsExists(old.NS) {
				t.Errorf("netns %s is left", old.NS)
			}
			for _, pid := range []int{old.QEMUPID, old.BackendPID} {
				if pid > 0 && nsexec.Alive(pid) {
					t.Errorf("source process %d is left", pid)
				}
			}
			out2, err := run(ctx, "ip", "-n", NodeNS(from), "route", "get", vmIP.String())
			if err != nil || !strings.Contains(out2, "via "+UnderlayIP(to)+" ") {
				t.Errorf("node %d routes %s: %q (%v), want via %s", from, vmIP, out2, err, UnderlayIP(to))
			}
			hostIf := lkendpoint.HostIfName(lkendpoint.VMContainerID(old.Name), lkendpoint.VMIfName)
			if out3, err := run(ctx, "ip", "-n", NodeNS(from), "-o", "link", "show"); err != nil || strings.Contains(out3, hostIf) {
				t.Errorf("node %d still has the vm's device %s (%v)", from, hostIf, err)
			}

			// The Service and the policy selecting the VM, as applied before
			// the first move, work on the new node.
			objs.check(t, to)
		})
	}
}

// vmOf is VM name from the lab state.
func vmOf(t *testing.T, name string) LabVM {
	t.Helper()
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.VMs {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no vm %s in the lab state", name)
	return LabVM{}
}

// migrationDiagnostics logs what a failed move leaves to look at: both
// nodes' endpoint counters and routes for the VM address and their agents'
// logs, the target backend's metrics and log, the virtio rings as the target
// QEMU sees them (x-query-virtio-*: avail and used indexes in guest memory)
// and the guest's own counters (serial console).
func migrationDiagnostics(t *testing.T, ctx context.Context, name string, vmIP netip.Addr, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, n := range []int{from, to} {
		id, c, err := datapath.PinnedCounters(BPFDir(n), vmIP)
		t.Logf("diag node %d: endpoint %d counters %+v (%v)", n, id, c, err)
		out, _ := run(ctx, "ip", "-n", NodeNS(n), "route", "get", vmIP.String())
		t.Logf("diag node %d: route get %s: %s", n, vmIP, out)
		t.Logf("diag node %d agent log:\n%s", n, nsexec.LogTail(AgentLog(n), 40))
	}
	lv := vmOf(t, name)
	if body, err := unixhttp.Get(ctx, lv.MetricsSocket, "/metrics"); err == nil {
		var keep []string
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "lanekit_vhost") && !strings.HasSuffix(l, " 0") {
				keep = append(keep, l)
			}
		}
		t.Logf("diag target backend metrics:\n%s", strings.Join(keep, "\n"))
	} else {
		t.Logf("diag target backend metrics: %v", err)
	}
	out, _ := run(ctx, "ip", "-n", lv.NS, "-s", "link")
	t.Logf("diag %s links:\n%s", lv.NS, out)
	if data, err := os.ReadFile(vmFile(to, name, "vhost.log")); err == nil {
		s := string(data)
		if i := strings.LastIndex(s, "serving metrics on"); i > 0 {
			s = s[i:]
		}
		t.Logf("diag target backend log:\n%s", s)
	}
	t.Logf("diag target qemu log:\n%s", nsexec.LogTail(vmFile(to, name, "qemu.log"), 20))
	if q, err := dialQMP(ctx, vmQMPSocket(to, name)); err != nil {
		t.Logf("diag target qmp: %v", err)
	} else {
		devs, err := q.call(ctx, "x-query-virtio", nil)
		t.Logf("diag x-query-virtio: %s (%v)", devs, err)
		var list []struct {
			Path string `json:"path"`
			Name string `json:"name"`
		}
		json.Unmarshal(devs, &list)
		for _, d := range list {
			if d.Name != "virtio-net" {
				continue
			}
			for _, qi := range []int{0, 1} {
				for _, cmd := range []string{"x-query-virtio-queue-status", "x-query-virtio-vhost-queue-status", "x-query-virtio-queue-element"} {
					out, err := q.call(ctx, cmd, map[string]any{"path": d.Path, "queue": qi})
					t.Logf("diag %s queue %d: %s (%v)", cmd, qi, out, err)
				}
			}
		}
		q.Close()
	}
	con, err := guest.DialConsole(ctx, lv.SerialSocket)
	if err != nil {
		t.Logf("diag guest console: %v", err)
		return
	}
	defer con.Close()
	out, _, err = con.Run(ctx, "cd /sys/class/net/eth0/statistics && for f in rx_packets tx_packets rx_dropped tx_dropped; do echo $f $(cat $f); done; ip neigh; grep virtio /proc/interrupts; dmesg | tail -20")
	t.Logf("diag guest (%v):\n%s", err, out)
}
