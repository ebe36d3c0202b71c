package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/testutil"
)

// endpointDev matches a lanekit endpoint device: "lk" + 11 hex digits (a
// representor) or the lab VF's host name "lkv" + 11.
var endpointDev = regexp.MustCompile(`^lkv?[0-9a-f]{11}$`)

// datapathIn lists what of a lanekit datapath a namespace holds: tcx
// (ingress, egress) and XDP programs on its devices, endpoint devices, and
// routes to a pod address (a /32 inside podCIDR or any route through an
// endpoint device).
func datapathIn(ns, podCIDR string) ([]string, error) {
	_, pods, _ := net.ParseCIDR(podCIDR)
	var found []string
	err := testutil.InNetnsPath(netnsPath(ns), func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			a := l.Attrs()
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				q, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: at})
				if err != nil {
					return fmt.Errorf("query %s: %w", a.Name, err)
				}
				for _, p := range q.Programs {
					found = append(found, fmt.Sprintf("%s program %d on %s", at, p.ID, a.Name))
				}
			}
			if a.Xdp != nil && a.Xdp.Attached {
				found = append(found, fmt.Sprintf("XDP program %d on %s", a.Xdp.ProgId, a.Name))
			}
			if endpointDev.MatchString(a.Name) {
				found = append(found, "endpoint device "+a.Name)
			}
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			dev := ""
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				dev = l.Attrs().Name
			}
			if ones, _ := r.Dst.Mask.Size(); (ones == 32 && pods.Contains(r.Dst.IP)) || endpointDev.MatchString(dev) {
				found = append(found, fmt.Sprintf("pod route %s dev %s", r.Dst, dev))
			}
		}
		return nil
	})
	return found, err
}

// dpuCounters maps each endpoint IP of node i's DPU agent to its counters.
func dpuCounters(t *testing.T, i int) map[string]*apiv1.EndpointCounters {
	t.Helper()
	return countersOf(t, DPUSocket(i))
}

// TestDPULab: a mixed lab, node 1 with a DPU, node 2 plain. The connectivity
// matrix passes; node 1's namespace holds no lanekit datapath (no tcx or XDP
// program, no endpoint device, no pod route) while its pods reach node 2's
// pods and a Service, through the BPF programs on the DPU (the endpoint's
// counters there grow, the DPU's stack forwards nothing of it); both agents'
// status say where the datapath runs; a CNI ADD with the DPU agent down
// fails with code 11 and leaves nothing; the DPU agent dies by SIGKILL under
// an iperf3 transfer that keeps going on the pinned programs, and its
// restart keeps the endpoints, with the host agent reconnecting.
func TestDPULab(t *testing.T) {
	bins := requireLabBins(t, "creates network namespaces", "ip", "iptables-restore", "nsenter", "iperf3", "sysctl")
	bins.Self = filepath.Join(bins.Dir, "lanekit") // the tcp echo helper
	lk := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(bins.Dir, "lanekit"), args...).CombinedOutput()
		t.Logf("lanekit %s:\n%s", strings.Join(args, " "), out)
		return string(out), err
	}
	t.Cleanup(func() {
		if _, err := lk(t, "lab", "down"); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if netnsExists(DPUNS(1)) {
			t.Errorf("lab down left %s", DPUNS(1))
		}
		if _, err := os.Stat(DPUBPFDir(1)); err == nil {
			t.Errorf("lab down left the DPU's pins %s", DPUBPFDir(1))
		}
	})
	requireGuestImage(t)
	if _, err := lk(t, "lab", "up", "--nodes", "2", "--pods-per-node", "1", "--dpu-nodes", "1", "--vm", "--vm-node", "1", "--no-std-vm"); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	st, err := LoadState()
	if err != nil || len(st.VMs) != 1 {
		t.Fatalf("lab state: %v, want one fast-lane VM: %+v", err, st)
	}
	vm := st.VMs[0]
	if _, err := lk(t, "lab", "check"); err != nil {
		t.Fatalf("lab check on the mixed lab: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Where the datapath is: nothing on node 1, everything on its DPU;
	// the VM's fast lane too (its QEMU stays on the host).
	dpuVMPlacement(t, vm)
	found, err := datapathIn(NodeNS(1), PodCIDR(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Errorf("node 1 (with a DPU) holds lanekit datapath: %v", found)
	}
	if _, err := os.Stat(BPFDir(1)); err == nil {
		t.Errorf("node 1 has pins at %s", BPFDir(1))
	}
	for ns, cidr := range map[string]string{DPUNS(1): PodCIDR(1), NodeNS(2): PodCIDR(2)} {
		// The same probe sees the datapath where it runs.
		found, err := datapathIn(ns, cidr)
		if err != nil || len(found) < 3 {
			t.Errorf("%s: datapath seen %v (%v), want the uplink's and the endpoint's programs and routes", ns, found, err)
		}
	}

	// Node 1's pod -> node 2's pod: the BPF path on the DPU.
	client, server := PodNS(1, 1, KindLanekit), PodNS(2, 1, KindLanekit)
	clientIP, serverIP := podIP(ctx, client), podIP(ctx, server)
	before := dpuCounters(t, 1)[clientIP]
	fwdDPU, _ := IPForwDatagrams(ctx, DPUNS(1))
	fwdHost, _ := IPForwDatagrams(ctx, NodeNS(1))
	if _, err := inNS(ctx, client, append(pingCommand(), "-c", "20", "-i", "0.05", "-W", "2", serverIP)...); err != nil {
		t.Fatalf("node 1 pod -> node 2 pod: %v", err)
	}
	after := dpuCounters(t, 1)[clientIP]
	fwdDPU2, _ := IPForwDatagrams(ctx, DPUNS(1))
	fwdHost2, _ := IPForwDatagrams(ctx, NodeNS(1))
	if sent := after.GetFromPackets() - before.GetFromPackets(); sent < 20 {
		t.Errorf("DPU counted %d packets from %s for 20 pings, want >= 20", sent, clientIP)
	}
	if got := after.GetToPackets() - before.GetToPackets(); got < 20 {
		t.Errorf("DPU delivered %d packets to %s for 20 replies, want >= 20", got, clientIP)
	}
	if d := fwdDPU2 - fwdDPU; d > 5 {
		t.Errorf("the DPU's stack forwarded %d datagrams of 40: not the BPF path", d)
	}
	if d := fwdHost2 - fwdHost; d != 0 {
		t.Errorf("node 1's stack forwarded %d datagrams: pod traffic went through the host", d)
	}

	// A Service, applied through the host agent (forwarded to the DPU) and
	// on node 2, with its backend on node 2.
	echo, err := startEchoOn(ctx, bins, server, 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-echo.Process.Pid, syscall.SIGKILL); echo.Wait() }()
	svc := writeTemp(t, "svc.yaml", e2eService(serverIP))
	for _, sock := range []string{AgentSocket(1), AgentSocket(2)} {
		if _, err := lk(t, "service", "apply", "-f", svc, "--socket", sock); err != nil {
			t.Fatalf("service apply on %s: %v", sock, err)
		}
	}
	if out, err := lk(t, "service", "list", "--socket", DPUSocket(1)); err != nil || !strings.Contains(out, e2eVIP) {
		t.Errorf("the DPU agent does not hold the Service applied through the host: %v", err)
	}
	if got, err := echoVia(client, net.JoinHostPort(e2eVIP, "80"), "via-dpu"); err != nil || !strings.Contains(got, "via-dpu") {
		t.Errorf("node 1 pod -> Service %s:80 -> node 2 pod: %q %v", e2eVIP, got, err)
	}
	if n := conntrackEntries(t, DPUSocket(1)); n == 0 {
		t.Error("the DPU's conntrack has no entry after a Service connection: not load-balanced there")
	}

	// Status on each side.
	if out, _ := lk(t, "status", "--socket", AgentSocket(1)); !strings.Contains(out, "datapath:     dpu (DPU agent at "+DPUIP(1)) || !strings.Contains(out, "connected") {
		t.Errorf("host status does not say the datapath runs on the connected DPU")
	}
	if out, _ := lk(t, "status", "--socket", DPUSocket(1)); !strings.Contains(out, "for host "+NodeNS(1)) {
		t.Errorf("DPU status does not name its host")
	}
	// The link's certificates, each side's view (issue 36): who the other
	// side must be, and every certificate's notAfter and days left.
	for sock, want := range map[string][]string{
		AgentSocket(1): {`DPU link:     host side, the DPU's certificate must name "` + DPUIP(1) + `"`, "cert peer   CN=" + DPUIP(1) + ", notAfter "},
		DPUSocket(1):   {`DPU link:     dpu side, the host's certificate must name "` + NodeNS(1) + `"`, "cert peer   CN=" + NodeNS(1) + ", notAfter "},
	} {
		out, _ := lk(t, "status", "--socket", sock)
		for _, w := range append(want, "cert local", "cert ca", "days left") {
			if !strings.Contains(out, w) {
				t.Errorf("status at %s lacks %q", sock, w)
			}
		}
	}

	dpuVMStatus(t, lk, vm)

	t.Run("NetworkPolicy on a pod of the DPU node", func(t *testing.T) { dpuPolicyAcrossKinds(t, lk, bins.Self) })
	dpuVMServicesPolicy(t, ctx, bins.Self, vm)

	dpuKilledDuringTransfer(t, bins, lk, client, serverIP, vm)
}

// echoVia sends token over TCP from netns to addr (a lab tcp-echo behind
// it) and returns the line that comes back.
func echoVia(netns, addr, token string) (string, error) {
	var got string
	err := inNetns(netns, func() error {
		c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte(token + "\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		got = strings.TrimSpace(line)
		return err
	})
	return got, err
}

func conntrackEntries(t *testing.T, sock string) uint32 {
	t.Helper()
	return agentStatusOf(t, sock).GetControlPlane().GetConntrackEntries()
}

// dpuKilledDuringTransfer: the DPU agent dies by SIGKILL two seconds into a
// 6 s iperf3 transfer from node 1's pod; the DPU's pinned programs keep
// counting and every second with the agent dead carries traffic. With it
// dead, a CNI ADD on node 1 fails with code 11 and leaves no device, and the
// host says the DPU is unreachable. The restarted DPU agent keeps the
// endpoint and its tcx links, the host reconnects, and an ADD works again.
func dpuKilledDuringTransfer(t *testing.T, bins Bins, lk func(*testing.T, ...string) (string, error), client, serverIP string, vm LabVM) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	linksBefore, err := tcxLinkIDs(DPUNS(1))
	if err != nil || len(linksBefore) < 2 {
		t.Fatalf("tcx links of the DPU: %v %v", linksBefore, err)
	}
	endpoints := len(dpuCounters(t, 1))
	devsBefore, err := datapathIn(DPUNS(1), PodCIDR(1))
	if err != nil {
		t.Fatal(err)
	}
	finish := iperfAcrossKill(t, ctx, PodNS(2, 1, KindLanekit), client, serverIP, "the DPU agent killed")
	pidFile := filepath.Join(DPUDir(1), "agent.pid")
	pid := readPID(pidFile)
	if pid <= 0 || !alive(pid) {
		t.Fatalf("DPU agent not running (pid %d)", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	p0, err := pinnedPackets(DPUBPFDir(1))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	p1, err := pinnedPackets(DPUBPFDir(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DPU BPF counters with its agent dead: +%d packets in 1.5 s", p1-p0)
	if p1-p0 < minDeadPackets {
		t.Errorf("DPU counters grew by %d packets in 1.5 s with its agent dead, want >= %d", p1-p0, minDeadPackets)
	}
	finish()

	// CNI ADD with the DPU agent down: try again later, nothing left.
	podNS := PodNS(1, 9, KindLanekit)
	_, err = addPod(ctx, bins, 1, podNS, KindLanekit)
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrTryAgainLater {
		t.Errorf("CNI ADD with the DPU agent down: %v, want CNI code 11", err)
	}
	if found, err := datapathIn(NodeNS(1), PodCIDR(1)); err != nil || len(found) > 0 {
		t.Errorf("node 1 after the refused ADD: %v %v", found, err)
	}
	if out, err := exec.Command("ip", "-n", podNS, "-br", "link").Output(); err != nil || strings.Contains(string(out), PodIfName) {
		t.Errorf("the refused ADD left a device in the pod: %v %s", err, out)
	}
	if out, _ := lk(t, "status", "--socket", AgentSocket(1)); !strings.Contains(out, "unreachable") {
		t.Errorf("host status with the DPU agent dead does not say unreachable")
	}

	if _, err := StartDPUAgent(ctx, bins, 1); err != nil {
		t.Fatalf("restart the DPU agent: %v", err)
	}
	log, _ := os.ReadFile(DPULog(1))
	if m := keptRe.FindAllStringSubmatch(string(log), -1); len(m) == 0 || m[len(m)-1][1] != fmt.Sprint(endpoints) {
		t.Errorf("restarted DPU agent did not keep its %d endpoints (pods and the VM): %v; log: %s", endpoints, m, logTail(DPULog(1)))
	}
	linksAfter, err := tcxLinkIDs(DPUNS(1))
	if err != nil || fmt.Sprint(linksAfter) != fmt.Sprint(linksBefore) {
		t.Errorf("DPU tcx links changed across the restart: %v -> %v (%v)", linksBefore, linksAfter, err)
	}
	var out string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if out, _ = lk(t, "status", "--socket", AgentSocket(1)); strings.Contains(out, "connected, 2 reconnects") {
			break
		}
	}
	if !strings.Contains(out, "connected, 2 reconnects") {
		t.Errorf("host agent did not reconnect to the restarted DPU agent")
	}
	if _, err := inNS(ctx, client, append(pingCommand(), "-c", "1", "-W", "2", serverIP)...); err != nil {
		t.Errorf("pod traffic after the DPU restart: %v", err)
	}
	// The VM on the DPU, re-adopted: node 2's pod still reaches its echo.
	if !echoDial(t, ctx, bins.Self, PodNS(2, 1, KindLanekit), net.JoinHostPort(vm.IP, fmt.Sprint(EchoPort))) {
		t.Errorf("node 2 pod -> the VM on the DPU after the DPU agent's restart: no answer")
	}
	// The namespace the refused ADD made: now it attaches.
	cni, list, err := cniFor(bins, 1, KindLanekit)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cni.AddNetworkList(ctx, list, runtimeConf(podNS)); err != nil {
		t.Errorf("CNI ADD after the restart: %v", err)
	} else if err := delPod(ctx, bins, 1, podNS, KindLanekit); err != nil {
		t.Errorf("CNI DEL: %v", err)
	} else if found, err := datapathIn(DPUNS(1), PodCIDR(1)); err != nil ||
		strings.Count(fmt.Sprint(found), "endpoint device") != strings.Count(fmt.Sprint(devsBefore), "endpoint device") {
		t.Errorf("after DEL the DPU should hold the representors it held before the ADD (%v): %v %v", devsBefore, found, err)
	}
}
