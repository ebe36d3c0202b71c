package lab

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
)

// podVMTakesTheBPFPath is TestBulkTCPTakesTheBPFPath between a lanekit pod
// on node 1 and the fast-lane VM on node 2 (QEMU under TCG, so the guest
// bounds the rate; the packet counts are what matter): in both directions
// each node's kernel forwards at most 2 % of the packets, and the pod's and
// the VM's endpoint counters account for the rest. A subtest of
// TestVMLiveMigrationMovesAddress, on its lab (one VM on node 2), before the
// moves.
func podVMTakesTheBPFPath(t *testing.T, ctx context.Context, bins Bins, st *State) {
	if len(st.VMs) != 1 || st.VMs[0].Node != 2 {
		t.Fatalf("want one VM on node 2, got %+v", st.VMs)
	}
	vm := st.VMs[0]
	vmIP, err := netip.ParseAddr(vm.IP)
	if err != nil {
		t.Fatalf("vm address %q: %v", vm.IP, err)
	}
	pod := PodNS(1, 1, KindLanekit)
	podIPAddr, err := netip.ParseAddr(podIP(ctx, pod))
	if err != nil {
		t.Fatalf("pod address: %v", err)
	}
	con, err := guest.DialConsole(ctx, vm.SerialSocket)
	if err != nil {
		t.Fatalf("guest console: %v", err)
	}
	defer con.Close()

	podVMBulkPath(t, ctx, vm, con, pod, vmIP, podIPAddr, vm.IP, IPForwDatagrams, "datagrams")
	t.Run("guest checksums left to the kernel", func(t *testing.T) { vmChecksums(t, ctx, bins, vm, con) })
	t.Run("guest leases its address by DHCP from its link", func(t *testing.T) { vmDHCP(t, ctx, vm, con) })
}

// podVMBulkPath runs bulk TCP between the lanekit pod on node 1 and the
// guest vm on node 2 (its address vmAddr, of either family) in both
// directions and judges the path: fwd reads a node's kernel-forwarded
// counter of that family (IPForwDatagrams, IP6OutForwDatagrams), which must
// stay within maxKernelShare; the pod's and the VM's endpoint counters
// (keyed by their IPv4 addresses: one set per endpoint, both families) and
// lanekit-vhost's own frame counters account for the rest.
func podVMBulkPath(t *testing.T, ctx context.Context, vm LabVM, con *guest.Console, pod string, vmIP, podIPAddr netip.Addr,
	vmAddr string, fwd func(context.Context, string) (uint64, error), fwdWhat string) {
	t.Helper()
	for _, dir := range []struct {
		name    string
		reverse bool
	}{{"pod to VM", false}, {"VM to pod", true}} {
		t.Run(dir.name, func(t *testing.T) {
			b := takeVMPath(t, ctx, fwd, pod, podIPAddr, vmIP, vm.MetricsSocket)
			iperfPodToGuest(t, ctx, con, pod, vmAddr, dir.reverse)
			a := takeVMPath(t, ctx, fwd, pod, podIPAddr, vmIP, vm.MetricsSocket)
			podD, _ := judgePodVMPath(t, b, a, dir.reverse, maxKernelShare, fwdWhat)
			sent, recv := podD.sent, podD.recv
			// And the fast lane carried them: the backend moved them (its own
			// metrics: whole GSO packets through its packet sockets with
			// --rx-gso kernel, the default; AF_XDP frames with xdp).
			t.Logf("lanekit-vhost: %d frames into the guest, %d out", since(a.vhRX, b.vhRX), since(a.vhTX, b.vhTX))
			if rx := since(a.vhRX, b.vhRX); float64(rx) < (1-maxKernelShare)*float64(sent) {
				t.Errorf("lanekit-vhost moved %d frames into the guest, of the %d the pod sent", rx, sent)
			}
			if tx := since(a.vhTX, b.vhTX); float64(tx) < (1-maxKernelShare)*float64(recv) {
				t.Errorf("lanekit-vhost moved %d frames out of the guest, of the %d the pod received", tx, recv)
			}
		})
	}
}

// vmPathSample is one reading of the pod (node 1) ↔ VM (node 2) path:
// each node's kernel-forwarded counter, the pod's eth0 packets, the pod's
// and the VM's endpoint counters, and lanekit-vhost's frames into and out of
// the guest.
type vmPathSample struct {
	fwd1, fwd2 uint64
	tx, rx     uint64
	podC, vmC  datapath.Counters
	vhRX, vhTX uint64
}

// takeVMPath reads a vmPathSample; fwd reads a node's kernel-forwarded
// counter of the family in use.
func takeVMPath(t *testing.T, ctx context.Context, fwd func(context.Context, string) (uint64, error), pod string, podIP, vmIP netip.Addr, metricsSocket string) vmPathSample {
	t.Helper()
	var s vmPathSample
	var err error
	if s.fwd1, err = fwd(ctx, NodeNS(1)); err == nil {
		s.fwd2, err = fwd(ctx, NodeNS(2))
	}
	if err == nil {
		s.tx, s.rx, err = LinkPackets(ctx, pod, PodIfName)
	}
	if err == nil {
		_, s.podC, err = datapath.PinnedCounters(BPFDir(1), podIP)
	}
	if err == nil {
		_, s.vmC, err = datapath.PinnedCounters(BPFDir(2), vmIP)
	}
	if err == nil {
		s.vhRX, s.vhTX, err = bench.BackendPackets(ctx, metricsSocket)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// iperfPodToGuest runs 3 s of iperf3 from pod to a one-shot server started
// in the guest through its console (reverse: the guest sends), retrying the
// client while the server starts.
func iperfPodToGuest(t *testing.T, ctx context.Context, con *guest.Console, pod, vmAddr string, reverse bool) {
	t.Helper()
	if out, code, err := con.Run(ctx, "cd /tmp && timeout 40 iperf3 -s -1 -p 5201 >/tmp/lk-path.log 2>&1 </dev/null &"); err != nil || code != 0 {
		t.Fatalf("start iperf3 in the guest: %v (exit %d) %s", err, code, out)
	}
	args := []string{"iperf3", "-c", vmAddr, "-p", "5201", "-t", "3"}
	if reverse {
		args = append(args, "-R")
	}
	var out []byte
	var cerr error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if out, cerr = nsCommand(ctx, pod, args...).CombinedOutput(); cerr == nil {
			break
		}
	}
	if cerr != nil {
		t.Fatalf("iperf3 %v: %v\n%s", args, cerr, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "receiver") {
			t.Logf("iperf3: %s", strings.Join(strings.Fields(l), " "))
		}
	}
}

// judgePodVMPath judges both ends of a transfer between samples b and a:
// what the pod received the VM sent, and the other way round (the transfer
// is theirs alone); reverse: the VM sent.
func judgePodVMPath(t *testing.T, b, a vmPathSample, reverse bool, maxShare float64, fwdWhat string) (podD, vmD pathDelta) {
	t.Helper()
	podD = judgeBulkPath(t, "node1 pod", pathSample{fwd: b.fwd1, tx: b.tx, rx: b.rx, bpf: b.podC},
		pathSample{fwd: a.fwd1, tx: a.tx, rx: a.rx, bpf: a.podC}, !reverse, maxShare, fwdWhat)
	vmD = judgeBulkPath(t, "node2 VM", pathSample{fwd: b.fwd2, tx: b.rx, rx: b.tx, bpf: b.vmC},
		pathSample{fwd: a.fwd2, tx: a.rx, rx: a.tx, bpf: a.vmC}, reverse, maxShare, fwdWhat)
	return podD, vmD
}
