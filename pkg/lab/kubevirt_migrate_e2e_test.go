package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// kubevirtMigrate live-migrates vm1 from node from to node to with a
// VirtualMachineInstanceMigration (name), as `virtctl migrate` does, while
// the client pod pings the guest every 20 ms and holds a TCP connection to
// it: the migration succeeds, the VMI runs on node to with the address it
// had, that node's agent holds its VM endpoint active on that address, the
// source's agent has taken its own out (moved, or gone with the source
// pod), the connection kept every echo in order, and the guest answers HTTP
// there. The network's blackout — from the replies' timestamps around the
// longest run of lost pings, and as pings lost at 20 ms — is logged beside
// the downtime libvirt measured for the switchover (the source
// virt-launcher's "Migration info" line, read from its log, which must have
// it): benchmark figures, not pass marks.
func kubevirtMigrate(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, client string, vmIP netip.Addr, from, to int, name string) {
	const interval, count = 20 * time.Millisecond, 6000 // 120 s at most
	// The source launcher's log, followed from before the move: the source
	// pod ends with the migration.
	launcher, err := waitVMILauncher(ctx, kc, "vm1")
	if err != nil {
		t.Fatal(err)
	}
	if launcher.Spec.NodeName != KubeNodeName(from) {
		t.Fatalf("vm1's launcher %s runs on %s, want %s", launcher.Name, launcher.Spec.NodeName, KubeNodeName(from))
	}
	source := launcher.Name
	logCtx, stopLog := context.WithCancel(ctx)
	defer stopLog()
	sourceLog := followLogs(logCtx, kc, "default", source, "compute")
	// The source node's agent: when it handed the address over.
	agents, err := kc.CoreV1().Pods(LanekitNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lanekit-agent",
		FieldSelector: "spec.nodeName=" + KubeNodeName(from)})
	if err != nil || len(agents.Items) != 1 {
		t.Fatalf("the agent pod on %s: %v", KubeNodeName(from), err)
	}
	sourceAgentLog := followLogs(logCtx, kc, LanekitNamespace, agents.Items[0].Name, "agent")
	pingCtx, stopPing := context.WithCancel(ctx)
	defer stopPing()
	pingOut, pingDone := podStream(t, pingCtx, nodeBins, client,
		"ping", "-D", "-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), "-c", strconv.Itoa(count), "-W", "1", vmIP.String())
	// A TCP connection held through the move: a line every 100 ms to the
	// guest's echo port, each echo stamped on arrival.
	const lines = 350
	streamOut, streamDone := podStream(t, ctx, nodeBins, client, "bash", "-c", "set -o pipefail; for i in $(seq 1 "+strconv.Itoa(lines)+"); do echo $i; sleep 0.1; done | "+
		"socat -t 10 - TCP:"+vmIP.String()+":7777 | while read -r l; do echo \"$l $(date +%s%N)\"; done")
	// A sequenced UDP stream through the move: a datagram every 20 ms to
	// the guest's UDP echo (UDPEchoPort), each echo stamped on arrival,
	// until the test touches the stop file (or 6,000 were sent).
	stopFile := "/tmp/lk-udp-stop-" + name
	udpOut, udpDone := podStream(t, ctx, nodeBins, client, "bash", "-c", "rm -f "+stopFile+"; for i in $(seq 1 6000); do [ -e "+stopFile+" ] && break; echo $i; sleep 0.02; done | "+
		"socat -t 1 - UDP-SENDTO:"+vmIP.String()+":"+strconv.Itoa(UDPEchoPort)+" | while read -r l; do echo \"$l $(date +%s%N)\"; done")
	time.Sleep(2 * time.Second) // a baseline before the move

	mig := `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata:
  name: ` + name + `
  namespace: default
spec:
  vmiName: vm1
`
	start := time.Now()
	if _, err := kubectl(ctx, nodeBins, []byte(mig), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	var phase string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := kubectl(ctx, nodeBins, nil, "get", "vmim", name, "-n", "default", "-o", "jsonpath={.status.phase}")
		phase = strings.TrimSpace(out)
		return err == nil && (phase == "Succeeded" || phase == "Failed"), nil
	}); err != nil || phase != "Succeeded" {
		st, _ := kubectl(ctx, nodeBins, nil, "get", "vmim", name, "-n", "default", "-o", "yaml")
		t.Fatalf("migration phase %q (%v):\n%s\npods: %s", phase, err, st, podSummary(ctx, kc, "default"))
	}
	took := time.Since(start)
	time.Sleep(3 * time.Second) // the pings after the move
	stopPing()
	<-pingDone
	if _, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "touch", stopFile); err != nil {
		t.Errorf("stopping the UDP stream: %v", err)
	}
	var udpErr error
	select {
	case udpErr = <-udpDone:
	case <-time.After(30 * time.Second):
		udpErr = errors.New("still running 30 s after its stop")
	}
	udpStats := readUDPStream(udpOut.String())
	if udpErr != nil || udpStats.Got == 0 || udpStats.Lost*2 > udpStats.Sent {
		t.Errorf("the UDP stream through the migration: %v; %s:\n%s", udpErr, udpStats, tail(udpOut.String(), 1500))
	}

	node, _ := kubectl(ctx, nodeBins, nil, "get", "vmi", "vm1", "-n", "default", "-o", "jsonpath={.status.nodeName} {.status.interfaces[0].ipAddress}")
	if f := strings.Fields(node); len(f) != 2 || f[0] != KubeNodeName(to) || f[1] != vmIP.String() {
		t.Errorf("after the migration the VMI reports node and address %q, want %s %s", node, KubeNodeName(to), vmIP)
	}
	vm := kvAgentVM(t, ctx, to)
	// The source's agent took its VM out of the datapath once the VMI said
	// the target runs it (moved; well before the migration object's
	// Succeeded and the 3 s since), or has let it go with the source pod:
	// not still delivering the address to the VM that left (a supersede
	// that failed kept it so until the source pod went, ~10 s).
	if sock, err := RealNodeAgentSocket(from); err == nil {
		var state string
		// Each look on the test's context (each agent call has its own
		// deadline), not the poll's: its end must not replace the state
		// seen with its own deadline error.
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Second, true, func(context.Context) (bool, error) {
			sv, err := findAgentVM(ctx, sock, k8s.VMName("default", "vm1"))
			state = "gone"
			if err == nil {
				state = sv.GetMigrationState()
			} else if !strings.Contains(err.Error(), "has no vm") {
				state = err.Error()
			}
			return state == "moved" || state == "gone", nil
		})
		if state != "moved" && state != "gone" {
			t.Errorf("node %d's agent after the migration: its VM is %q, want moved (superseded by node %d's claim) or gone", from, state, to)
		}
	}
	if a, _, _ := strings.Cut(vm.GetAddress(), "/"); a != vmIP.String() {
		t.Errorf("node %d's VM endpoint has %s, want the address the VM kept, %s", to, vm.GetAddress(), vmIP)
	}
	if _, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "curl", "-sS", "-m", "10", "-o", "/dev/null", "http://"+vmIP.String()+"/"); err != nil {
		t.Errorf("HTTP to the guest on node %d: %v", to, err)
	}
	var streamErr error
	select {
	case streamErr = <-streamDone:
	case <-time.After(90 * time.Second):
		streamErr = errors.New("still running 90 s after the migration")
	}
	got, tcpGap, err := echoGaps(streamOut.String(), lines)
	if streamErr != nil || err != nil {
		t.Errorf("the TCP connection held through the migration: %v, %v; got %d of %d echoes:\n%s", streamErr, err, got, lines, tail(streamOut.String(), 1500))
	} else {
		t.Logf("TCP connection held through the migration: %d/%d echoes in order, longest gap between echoes %v (100 ms apart without a move)", got, lines, tcpGap.Round(time.Millisecond))
	}
	sent, lost, gap := pingGaps(pingOut.String())
	// Where the blackout went: the last reply before the longest silence,
	// the target agent's activation (what told it, when), the first reply
	// after, and the source agent's hand-over.
	// The blackout is the silence around the switch-over: from the last
	// reply before the target agent's activation (the guest runs there
	// from its device start; none can answer between the source's stop
	// and that) to the first reply after it. The longest silence of the
	// whole run is logged beside it when it lies elsewhere (TCG guests
	// stall under a migration's load too).
	blackout := "unknown (no activation time or no replies around it)"
	replies := pingReplyTimes(pingOut.String())
	h, handed := handOverTime(sourceAgentLog(), k8s.VMName("default", "vm1"))
	if vm.GetActivatedUnixNano() != 0 {
		act := time.Unix(0, vm.GetActivatedUnixNano())
		if last, first, ok := around(replies, act); ok {
			blackout = fmt.Sprintf("%v without a reply around the switch-over", first.Sub(last).Round(time.Millisecond))
			t.Logf("the target agent activated the VM endpoint %v after the last reply before it (by %s), the first reply came %v after the activation",
				act.Sub(last).Round(time.Millisecond), vm.GetActivatedBy(), first.Sub(act).Round(time.Millisecond))
			if handed {
				r := func(at time.Time) time.Duration { return at.Sub(last).Round(time.Millisecond) }
				t.Logf("node %d's agent handed the address over to node %d %v after that last reply (its backend's device last seen running at %v, seen stopped at %v; logged at %v)",
					from, to, r(h.Switched), r(h.LastRunning), r(h.StopSeen), r(h.At))
				// The guest's device ran on neither node from the source's
				// stop to the target's start (the activation: device-start):
				// the pause as the two backends saw it, beside libvirt's.
				if vm.GetActivatedBy() == agent.ActivatedByDeviceStart {
					t.Logf("the VM's device ran on neither node for %v (the source's stop seen → the target's activation at its device start, both within a 10 ms poll)",
						act.Sub(h.StopSeen).Round(time.Millisecond))
				}
			}
			if l, f, ok := pingGapEdges(pingOut.String()); ok && !l.Equal(last) {
				blackout += fmt.Sprintf(" (the run's longest silence, %v, %v before it)", f.Sub(l).Round(time.Millisecond), last.Sub(l).Round(time.Millisecond))
			}
		}
		// The UDP stream's silence around the switch-over; it must have
		// gone on after it (the guest answering on the target).
		if last, first, ok := around(udpStats.Arrivals, act); ok {
			t.Logf("UDP stream: %v without an echo around the switch-over; %s", first.Sub(last).Round(time.Millisecond), udpStats)
		} else {
			t.Errorf("the UDP stream has no echo after the target's activation (or none before it): %s", udpStats)
		}
	}
	// The source routes the address to the target at the switch-over, not
	// when the VMI's status says completed (vmhandover.go).
	if !handed {
		t.Errorf("node %d's agent logged no hand-over of the VM's address to node %d:\n%s", from, to, tail(grepLines(sourceAgentLog(), "hand"), 3000))
	}
	// libvirt's own figures for the switchover, from the source launcher.
	stopLog()
	info, ok := parseMigrationInfo(sourceLog())
	if !ok {
		t.Errorf("the source launcher %s logged no \"Migration info\" line with the downtime:\n%s", source, tail(sourceLog(), 3000))
	}
	t.Logf("KubeVirt migration node %d -> node %d in %.1f s (VirtualMachineInstanceMigration %s Succeeded); network blackout %s; pings every %v: %d sent, %d lost, longest run %d (~%v); libvirt: %s",
		from, to, took.Seconds(), name, blackout, interval, sent, lost, gap, time.Duration(gap+1)*interval, info)
	if sent == 0 || lost*2 > sent {
		t.Errorf("pings: %d sent, %d lost:\n%s", sent, lost, tail(pingOut.String(), 2000))
	}
}

// kubevirtMigrateTightDowntime moves vm1 back, node 1 to node 2, under a
// MigrationPolicy selecting it by kubevirt.io/domain with maxDowntimeMs 50:
// what a cluster admin sets for a shorter switchover than KubeVirt's default
// (QEMU's 300 ms downtime target). KubeVirt 1.9 accepts that field only with
// its alpha MigrationStallDetection feature gate, so the gate is turned on
// in the KubeVirt CR for this move and off again after it. The migration
// must have run under the policy (the VMI's migrationState names it and
// carries its maxDowntimeMs); the blackout and libvirt's downtime are logged
// as for the first move.
func kubevirtMigrateTightDowntime(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, client string, vmIP netip.Addr) {
	const name, policy = "lanekit-lab-downtime", `apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata:
  name: lanekit-lab-downtime
spec:
  maxDowntimeMs: 50
  selectors:
    virtualMachineInstanceSelector:
      kubevirt.io/domain: vm1
`
	gate := func(ctx context.Context, gates string) error {
		_, err := kubectl(ctx, nodeBins, nil, "patch", "kubevirt", "kubevirt", "-n", KubeVirtNamespace, "--type", "merge", "-p",
			`{"spec":{"configuration":{"developerConfiguration":{"featureGates":`+gates+`}}}}`)
		return err
	}
	if err := gate(ctx, `["MigrationStallDetection"]`); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx := context.WithoutCancel(ctx)
		kubectl(ctx, nodeBins, nil, "delete", "migrationpolicy", name, "--ignore-not-found")
		if err := gate(ctx, "null"); err != nil {
			t.Errorf("feature gate off again: %v", err)
		}
	}()
	// virt-api's admission sees the gate once its configuration has it.
	var applyErr error
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, applyErr = kubectl(ctx, nodeBins, []byte(policy), "apply", "-f", "-")
		return applyErr == nil, nil
	}); err != nil {
		t.Fatalf("MigrationPolicy %s: %v", name, applyErr)
	}
	kubevirtMigrate(t, ctx, kc, nodeBins, client, vmIP, 1, 2, "vm1-back")
	out, err := kubectl(ctx, nodeBins, nil, "get", "vmi", "vm1", "-n", "default", "-o",
		"jsonpath={.status.migrationState.migrationPolicyName} {.status.migrationState.migrationConfiguration.maxDowntimeMs}")
	if f := strings.Fields(out); err != nil || len(f) != 2 || f[0] != name || f[1] != "50" {
		t.Errorf("the migration's policy and max downtime %q (%v), want %s 50", out, err, name)
	}
}

// followLogs follows a container's log until ctx ends; the returned
// function gives what arrived so far.
func followLogs(ctx context.Context, kc kubernetes.Interface, namespace, pod, container string) func() string {
	var mu sync.Mutex
	var b strings.Builder
	go func() {
		rc, err := kc.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true}).Stream(ctx)
		if err != nil {
			mu.Lock()
			fmt.Fprintf(&b, "follow %s/%s: %v\n", pod, container, err)
			mu.Unlock()
			return
		}
		defer rc.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := rc.Read(buf)
			mu.Lock()
			b.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return b.String()
	}
}

// launcherMigrationInfo is what virt-launcher logs of a completed outgoing
// migration (its LogMigrationInfo, as `virsh domjobinfo --completed`).
type launcherMigrationInfo struct {
	elapsed, downtime, downtimeNet time.Duration
}

func (m launcherMigrationInfo) String() string {
	if m.elapsed == 0 && m.downtime == 0 {
		return "no figures"
	}
	s := fmt.Sprintf("downtime %v (guest paused, source to target), migration %v", m.downtime, m.elapsed)
	if m.downtimeNet > 0 {
		s += fmt.Sprintf(", of the downtime %v the switchover's network transfer", m.downtimeNet)
	}
	return s
}

// parseMigrationInfo reads the last "Migration info for <uid>:" line with a
// downtime: the completed job's (virt-launcher logs the same line while the
// migration runs, with the downtime QEMU expects).
func parseMigrationInfo(log string) (launcherMigrationInfo, bool) {
	re := regexp.MustCompile(`Migration info for [^:]+: TimeElapsed:(\d+)ms.*?\b(Expected)?Downtime:(\d+)ms(?: DowntimeNet:(\d+)ms)?`)
	var m launcherMigrationInfo
	found := false
	for _, l := range strings.Split(log, "\n") {
		g := re.FindStringSubmatch(l)
		if g == nil {
			continue
		}
		ms := func(s string) time.Duration {
			n, _ := strconv.ParseInt(s, 10, 64)
			return time.Duration(n) * time.Millisecond
		}
		m = launcherMigrationInfo{elapsed: ms(g[1]), downtime: ms(g[3])}
		if g[4] != "" {
			m.downtimeNet = ms(g[4])
		}
		found = true
	}
	return m, found
}

// stampedEcho is one line of a stream's output: an echo's sequence number
// and its arrival (unix ns), as the in-pod loop stamps it.
type stampedEcho struct {
	seq int
	ns  int64
}

// stampedEchoes reads the "<seq> <unix ns>" lines of out, in order; other
// lines are skipped.
func stampedEchoes(out string) []stampedEcho {
	var es []stampedEcho
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		seq, err1 := strconv.Atoi(f[0])
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 == nil && err2 == nil {
			es = append(es, stampedEcho{seq, ns})
		}
	}
	return es
}

// echoGaps reads the stamped echoes ("<seq> <unix ns>" lines): how many
// came back, and the longest time between two consecutive ones; an echo
// out of order or missing is an error.
func echoGaps(out string, want int) (got int, longest time.Duration, err error) {
	var last int64
	for _, e := range stampedEchoes(out) {
		seq, ts := e.seq, e.ns
		if seq != got+1 {
			return got, longest, fmt.Errorf("echo %d after %d", seq, got)
		}
		if last != 0 {
			longest = max(longest, time.Duration(ts-last))
		}
		got, last = seq, ts
	}
	if got != want {
		return got, longest, fmt.Errorf("%d of %d echoes", got, want)
	}
	return got, longest, nil
}

// handOver is the source agent's log of a hand-over: when it was done,
// and the polls of the backend around the device's stop.
type handOver struct {
	At          time.Time `json:"time"`
	LastRunning time.Time `json:"last_running"`
	StopSeen    time.Time `json:"stop_seen"`
	Switched    time.Time `json:"switched"` // the datapath stopped delivering locally
}

// handOverTime is the last hand-over of VM vm's address to its
// migration's target in the agent's JSON log.
func handOverTime(log, vm string) (handOver, bool) {
	var last handOver
	for _, l := range strings.Split(log, "\n") {
		var rec struct {
			handOver
			Msg string `json:"msg"`
			VM  string `json:"vm"`
		}
		if json.Unmarshal([]byte(l), &rec) != nil || rec.VM != vm || !strings.HasPrefix(rec.Msg, "vm handed over") {
			continue
		}
		last = rec.handOver
	}
	return last, !last.At.IsZero()
}

// grepLines are log's lines that contain s.
func grepLines(log, s string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHandOverTime(t *testing.T) {
	log := `{"time":"2026-12-01T23:50:01.5Z","level":"INFO","msg":"vm hand-over: watching the source backend for the switch-over","vm":"default.vm1"}
not json
{"time":"2026-12-01T23:50:02.25Z","level":"INFO","msg":"vm handed over: its backend's device stopped, the address goes to the migration's target","vm":"default.vm2"}
{"time":"2026-12-01T23:50:03.125Z","level":"INFO","msg":"vm handed over: its backend's device stopped, the address goes to the migration's target","vm":"default.vm1","last_running":"2026-12-01T23:50:03.1Z","stop_seen":"2026-12-01T23:50:03.11Z"}
`
	if h, ok := handOverTime(log, "default.vm1"); !ok || !h.At.Equal(time.Date(2026, 12, 1, 23, 50, 3, 125e6, time.UTC)) ||
		!h.LastRunning.Equal(time.Date(2026, 12, 1, 23, 50, 3, 100e6, time.UTC)) || !h.StopSeen.Equal(time.Date(2026, 12, 1, 23, 50, 3, 110e6, time.UTC)) {
		t.Errorf("handOverTime = %+v %v", h, ok)
	}
	if _, ok := handOverTime(log, "default.vm3"); ok {
		t.Error("a hand-over of a VM the log does not name")
	}
}

// pingGaps reads ping's output: the echoes sent (the highest sequence
// seen or the summary's count), how many got no reply, and the longest
// run of consecutive sequence numbers without one.
func pingGaps(out string) (sent, lost, longest int) {
	got := map[int]bool{}
	for _, m := range regexp.MustCompile(`icmp_seq=(\d+)`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		got[n] = true
		sent = max(sent, n)
	}
	if m := regexp.MustCompile(`(\d+) packets transmitted`).FindStringSubmatch(out); m != nil {
		n, _ := strconv.Atoi(m[1])
		sent = max(sent, n)
	}
	lost, longest = missing(got, sent)
	return sent, lost, longest
}

// missing counts the sequence numbers 1..sent that got lacks, and the
// longest run of them in a row.
func missing(got map[int]bool, sent int) (lost, longest int) {
	run := 0
	for seq := 1; seq <= sent; seq++ {
		if got[seq] {
			run = 0
			continue
		}
		lost++
		run++
		longest = max(longest, run)
	}
	return lost, longest
}

// pingReplyTimes are the arrival times of `ping -D`'s replies, in order.
func pingReplyTimes(out string) []time.Time {
	re := regexp.MustCompile(`^\[(\d+)\.(\d+)\] .*icmp_seq=(\d+)`)
	var ts []time.Time
	for _, l := range strings.Split(out, "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		sec, _ := strconv.ParseInt(m[1], 10, 64)
		frac := (m[2] + "000000000")[:9]
		ns, _ := strconv.ParseInt(frac, 10, 64)
		ts = append(ts, time.Unix(sec, ns))
	}
	return ts
}

// around is the last reply before at and the first after it.
func around(replies []time.Time, at time.Time) (last, first time.Time, ok bool) {
	for i, r := range replies {
		if r.After(at) {
			if i == 0 {
				return last, first, false
			}
			return replies[i-1], r, true
		}
	}
	return last, first, false
}

// pingGapEdges reads `ping -D` output: the arrival of the reply before the
// longest silence (no reply arriving) and of the reply that ended it. By
// arrival, not by sequence: echoes sent while the guest was paused can be
// answered late (frames the source's backend put into the guest's rings
// move with its memory), so the longest run of lost sequence numbers can
// sit elsewhere than the client's longest wait.
func pingGapEdges(out string) (last, first time.Time, ok bool) {
	var prev time.Time
	var longest time.Duration
	for _, ts := range pingReplyTimes(out) {
		if !prev.IsZero() && ts.Sub(prev) > longest {
			longest, last, first, ok = ts.Sub(prev), prev, ts, true
		}
		prev = ts
	}
	return last, first, ok
}

func TestPingGapEdges(t *testing.T) {
	out := "[1000.100000] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=63 time=1 ms\n[1000.150000] 64 bytes from 10.0.0.1: icmp_seq=2 ttl=63 time=1 ms\n" +
		"[1000.500000] 64 bytes from 10.0.0.1: icmp_seq=9 ttl=63 time=1 ms\n[1000.600000] 64 bytes from 10.0.0.1: icmp_seq=11 ttl=63 time=1 ms\n"
	last, first, ok := pingGapEdges(out)
	if !ok || !last.Equal(time.Unix(1000, 150000000)) || !first.Equal(time.Unix(1000, 500000000)) {
		t.Errorf("pingGapEdges = %v %v %v", last, first, ok)
	}
	// Late replies (seq 3 and 4 answered after the pause) end the silence,
	// not the later single loss.
	late := "[1000.100000] x icmp_seq=1 ttl=63\n[1000.120000] x icmp_seq=2 ttl=63\n[1000.400000] x icmp_seq=3 ttl=63\n" +
		"[1000.401000] x icmp_seq=4 ttl=63\n[1000.420000] x icmp_seq=5 ttl=63\n[1000.460000] x icmp_seq=7 ttl=63\n"
	if last, first, ok := pingGapEdges(late); !ok || !last.Equal(time.Unix(1000, 120000000)) || !first.Equal(time.Unix(1000, 400000000)) {
		t.Errorf("pingGapEdges(late replies) = %v %v %v", last, first, ok)
	}
	if last, first, ok := around(pingReplyTimes(late), time.Unix(1000, 410000000)); !ok || !last.Equal(time.Unix(1000, 401000000)) ||
		!first.Equal(time.Unix(1000, 420000000)) {
		t.Errorf("around(410 ms) = %v %v %v", last, first, ok)
	}
	if _, _, ok := around(pingReplyTimes(late), time.Unix(1000, 500000000)); ok {
		t.Error("around a time after the last reply")
	}
	if _, _, ok := pingGapEdges("no replies\n"); ok {
		t.Error("edges without replies")
	}
}

func TestEchoGaps(t *testing.T) {
	if got, gap, err := echoGaps("1 1000000000\n2 1100000000\njunk\n3 1600000000\n", 3); err != nil || got != 3 || gap != 500*time.Millisecond {
		t.Errorf("echoGaps = %d, %v, %v; want 3, 500ms, nil", got, gap, err)
	}
	if _, _, err := echoGaps("1 1\n3 2\n", 3); err == nil {
		t.Error("a missing echo passed")
	}
	if _, _, err := echoGaps("1 1\n2 2\n", 3); err == nil {
		t.Error("a short stream passed")
	}
}

func TestPingGaps(t *testing.T) {
	out := "64 bytes from 10.0.0.1: icmp_seq=1 ttl=63 time=1 ms\n64 bytes from 10.0.0.1: icmp_seq=2 ttl=63 time=1 ms\n" +
		"64 bytes from 10.0.0.1: icmp_seq=6 ttl=63 time=1 ms\n64 bytes from 10.0.0.1: icmp_seq=8 ttl=63 time=1 ms\n"
	if sent, lost, gap := pingGaps(out); sent != 8 || lost != 4 || gap != 3 {
		t.Errorf("pingGaps = %d sent, %d lost, gap %d; want 8, 4, 3", sent, lost, gap)
	}
	if sent, lost, gap := pingGaps(out + "10 packets transmitted, 4 received, 60% packet loss\n"); sent != 10 || lost != 6 || gap != 3 {
		t.Errorf("with the summary: %d sent, %d lost, gap %d; want 10, 6, 3", sent, lost, gap)
	}
}

func TestParseMigrationInfo(t *testing.T) {
	const inflight = `{"component":"virt-launcher","level":"info","msg":"Migration info for 5c1c6a6e-1f3e-4f0e-9d8e-0d7a3b1c2e4f: TimeElapsed:3021ms DataProcessed:120MiB DataRemaining:90MiB DataTotal:264MiB MemoryProcessed:120MiB MemoryRemaining:90MiB MemoryTotal:256MiB MemoryBandwidth:320Mbps DirtyRate:12Mbps Iteration:1 PostcopyRequests:0 ConstantPages:30000 NormalPages:30000 NormalData:117MiB ExpectedDowntime:300ms DiskMbps:0","pos":"live-migration-source.go:929","timestamp":"2026-12-01T21:00:00.000000Z"}`
	const done = `{"component":"virt-launcher","level":"info","msg":"Migration info for 5c1c6a6e-1f3e-4f0e-9d8e-0d7a3b1c2e4f: TimeElapsed:5123ms DataProcessed:270MiB DataRemaining:0MiB DataTotal:264MiB MemoryProcessed:270MiB MemoryRemaining:0MiB MemoryTotal:256MiB MemoryBandwidth:410Mbps DirtyRate:0Mbps Iteration:3 PostcopyRequests:0 ConstantPages:31000 NormalPages:69000 NormalData:269MiB Downtime:87ms DowntimeNet:4ms DiskMbps:0 CompressionRatio:1.01x","pos":"client.go:715","timestamp":"2026-12-01T21:00:02.000000Z"}`
	got, ok := parseMigrationInfo("noise\n" + inflight + "\n" + done + "\n")
	if want := (launcherMigrationInfo{elapsed: 5123 * time.Millisecond, downtime: 87 * time.Millisecond, downtimeNet: 4 * time.Millisecond}); !ok || got != want {
		t.Errorf("parseMigrationInfo = %+v, %v; want %+v", got, ok, want)
	}
	// Without DowntimeNet the completed line says ExpectedDowntime: the last
	// line's figure is the one.
	got, ok = parseMigrationInfo(inflight + "\n" + strings.Replace(done, "Downtime:87ms DowntimeNet:4ms", "ExpectedDowntime:91ms", 1))
	if !ok || got.downtime != 91*time.Millisecond || got.downtimeNet != 0 || got.elapsed != 5123*time.Millisecond {
		t.Errorf("without DowntimeNet: %+v, %v", got, ok)
	}
	if _, ok := parseMigrationInfo("level=info msg=\"migration done\"\n"); ok {
		t.Error("a log without the line parsed")
	}
}

// podStream starts argv in pod (namespace default; kubectl exec from the
// lab's wire netns) in the background: its output (stdout and stderr; read
// it once done has answered) and its end.
func podStream(t *testing.T, ctx context.Context, nodeBins, pod string, argv ...string) (*strings.Builder, <-chan error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsPath(WireNS), "--", filepath.Join(nodeBins, "kubectl"),
		"--kubeconfig", Kubeconfig, "exec", "-n", "default", pod, "--"}, argv...)...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return out, done
}

// udpStream is what readUDPStream found in the UDP stream's output.
type udpStream struct {
	Sent, Got, Lost int // sent: the highest sequence echoed
	LongestLost     int // the longest run of consecutive sequences lost
	Reordered       int // echoes that arrived after a higher one
	Arrivals        []time.Time
}

func (u udpStream) String() string {
	return fmt.Sprintf("%d of %d datagrams echoed, %d lost (longest run %d), %d out of order, echoes %v apart (median)",
		u.Got, u.Sent, u.Lost, u.LongestLost, u.Reordered, u.Spacing().Round(time.Millisecond))
}

// Spacing is the median time between two echoes' arrivals (the stream's
// pace: a 20 ms sleep per datagram plus the shell's forks).
func (u udpStream) Spacing() time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(u.Arrivals); i++ {
		gaps = append(gaps, u.Arrivals[i].Sub(u.Arrivals[i-1]))
	}
	if len(gaps) == 0 {
		return 0
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2]
}

// readUDPStream reads the UDP stream's output: one "SEQ UNIXNANO" line per
// echo, in arrival order (other lines are ignored). Sequences never echoed
// below the highest one echoed count as lost; a duplicate counts once.
func readUDPStream(out string) udpStream {
	var u udpStream
	seen := map[int]bool{}
	for _, e := range stampedEchoes(out) {
		seq, ns := e.seq, e.ns
		if seq < 1 || seen[seq] {
			continue
		}
		if seq < u.Sent {
			u.Reordered++
		}
		seen[seq] = true
		u.Sent = max(u.Sent, seq)
		u.Arrivals = append(u.Arrivals, time.Unix(0, ns))
	}
	u.Got = len(seen)
	u.Lost, u.LongestLost = missing(seen, u.Sent)
	return u
}

func TestReadUDPStream(t *testing.T) {
	out := "1 1000000000\n2 1020000000\nwarning: something\n5 1500000000\n4 1510000000\n4 1510000001\n7 1600000000\n"
	u := readUDPStream(out)
	if u.Sent != 7 || u.Got != 5 || u.Lost != 2 || u.LongestLost != 1 || u.Reordered != 1 || len(u.Arrivals) != 5 {
		t.Errorf("readUDPStream = %+v", u)
	}
	if last, first, ok := around(u.Arrivals, time.Unix(1, 100000000)); !ok || !last.Equal(time.Unix(1, 20000000)) || !first.Equal(time.Unix(1, 500000000)) {
		t.Errorf("around the stream's gap: %v %v %v", last, first, ok)
	}
	if u := readUDPStream("1 1000000000\n2 1000000001\n3 1000000002\n6 1100000000\n"); u.Lost != 2 || u.LongestLost != 2 {
		t.Errorf("two in a row lost: %+v", u)
	}
	if d := u.Spacing(); d != 90*time.Millisecond { // gaps 20, 480, 10, 90 ms
		t.Errorf("median spacing %v, want 90ms", d)
	}
	if u := readUDPStream(""); u.Sent != 0 || u.Got != 0 || u.Lost != 0 || u.Spacing() != 0 {
		t.Errorf("no output: %+v", u)
	}
}
