package datapath

import (
	"bytes"
	"fmt"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/xsk"
	"github.com/vishvananda/netlink"
)

// XDP verdicts (linux/bpf.h).
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

// xdpCtx is struct xdp_md. BPF_PROG_TEST_RUN takes ingress_ifindex and
// rx_queue_index (a queue of that device with XDP rx info registered);
// data_end must be the frame length.
type xdpCtx struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// loadSteer loads a steer_vm instance configured for vm (queues 0: an
// unconfigured instance), sharing the fixture's pinned maps.
func (e *fixtureEnv) loadSteer(t *testing.T, vm VM) *vmObjects {
	t.Helper()
	spec, err := loadVm()
	if err != nil {
		t.Fatal(err)
	}
	sizeMetrics(spec) // as AttachVM does: the pinned lk_metrics is shared
	var mac [6]byte
	copy(mac[:], vm.MAC)
	for name, v := range map[string]any{"vm_id": vm.ID, "vm_xsk_base": vm.XSKBase, "vm_queues": uint32(vm.Queues),
		"vm_mac": mac, "trace_redirects": uint8(1)} {
		if err := spec.Variables[name].Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	var objs vmObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: e.pinDir}}); err != nil {
		t.Fatalf("load steer_vm: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return &objs
}

// attachSteer attaches steer_vm to ifx in native mode until the test ends:
// native XDP registers the device's rx queue info, which a test run on a
// given rx queue needs.
func attachSteer(t *testing.T, ifx int, steer *vmObjects) {
	t.Helper()
	xl, err := link.AttachXDP(link.XDPOptions{Interface: ifx, Program: steer.SteerVm, Flags: link.XDPDriverMode})
	if err != nil {
		t.Fatalf("attach steer_vm: %v", err)
	}
	t.Cleanup(func() { xl.Close() })
}

// TestSteerVMFixtures runs every branch of steer_vm. (Its "shorter than an
// Ethernet header" branch is a bounds guard no device or test run can
// reach: BPF_PROG_TEST_RUN refuses frames under 14 bytes.)
func TestSteerVMFixtures(t *testing.T) {
	e := newFixtureEnv(t)
	// The VM device: two rx queues, so that a frame can arrive on a queue
	// the VM has no socket for.
	ifx := addVethSpec(t, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lk-fx-vm", NumRxQueues: 2, NumTxQueues: 2},
		PeerName: "lk-fx-vmp", PeerNumRxQueues: 2, PeerNumTxQueues: 2}).Attrs().Index
	vmMAC := mustMAC("02:00:00:01:00:1a")
	oneQ := VM{ID: 7, IfIndex: ifx, MAC: vmMAC, Queues: 1, XSKBase: 10}
	steer := e.loadSteer(t, oneQ)
	attachSteer(t, ifx, steer)
	unconfigured := e.loadSteer(t, VM{ID: 8, MAC: vmMAC})
	// Drop events on: each drop must report exactly one, for the VM.
	events, err := OpenEvents(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close() })
	if err := events.Configure(EventsConfig{Drops: true}); err != nil {
		t.Fatal(err)
	}

	toVM := testutil.IPv4Frame(vmMAC, neighMAC, "10.244.2.5", "10.244.1.12", 63)
	run := func(t *testing.T, prog *ebpf.Program, frame []byte, queue uint32) uint32 {
		t.Helper()
		if err := steer.LastRedirect.Set(vmRedirectTrace{}); err != nil {
			t.Fatal(err)
		}
		ret, err := prog.Run(&ebpf.RunOptions{Data: bytes.Clone(frame),
			Context: xdpCtx{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifx), RxQueueIndex: queue}})
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		return ret
	}
	expectDrop := func(t *testing.T, frame []byte, queue uint32, reason DropReason) {
		t.Helper()
		before, _ := e.dp.Counters(oneQ.ID)
		if ret := run(t, steer.SteerVm, frame, queue); ret != xdpDrop {
			t.Fatalf("verdict %d, want XDP_DROP", ret)
		}
		after, _ := e.dp.Counters(oneQ.ID)
		if d := after.Drops[reason] - before.Drops[reason]; d != 1 {
			t.Fatalf("drop counter %s grew by %d, want 1", reason, d)
		}
		evs := readEvents(t, events)
		if len(evs) != 1 || evs[0].Kind != EventDrop || evs[0].Reason != reason || evs[0].EndpointID != oneQ.ID ||
			evs[0].IfIndex != uint32(ifx) || evs[0].Len != uint32(len(frame)) {
			t.Fatalf("drop events %+v, want one %s drop of VM %d on ifindex %d", evs, reason, oneQ.ID, ifx)
		}
	}
	expectRedirect := func(t *testing.T, frame []byte) {
		t.Helper()
		if ret := run(t, steer.SteerVm, frame, 0); ret != xdpRedirect {
			t.Fatalf("verdict %d, want XDP_REDIRECT", ret)
		}
		if evs := readEvents(t, events); len(evs) != 0 {
			t.Fatalf("delivered frame reported: %+v", evs)
		}
		var tr vmRedirectTrace
		if err := steer.LastRedirect.Get(&tr); err != nil {
			t.Fatal(err)
		}
		if tr.Ifindex != oneQ.XSKBase || tr.Kind != uint32(podLkRedirectKindREDIR_XSK) {
			t.Fatalf("redirect to slot %d kind %d, want slot %d kind %d", tr.Ifindex, tr.Kind, oneQ.XSKBase, podLkRedirectKindREDIR_XSK)
		}
	}

	t.Run("not configured for a VM: pass", func(t *testing.T) {
		e.enter(t)
		if ret := run(t, unconfigured.SteerVm, toVM, 0); ret != xdpPass {
			t.Fatalf("verdict %d, want XDP_PASS", ret)
		}
	})
	t.Run("unicast for another MAC: drop", func(t *testing.T) {
		e.enter(t)
		expectDrop(t, testutil.IPv4Frame(pod2MAC, neighMAC, "10.244.2.5", "10.244.1.12", 63), 0, DropNotForVM)
	})
	t.Run("no socket on the queue (backend down): drop", func(t *testing.T) {
		e.enter(t)
		expectDrop(t, toVM, 0, DropNoSocket)
	})

	sock, err := xsk.Open(ifx, 0, xsk.Sizes{FrameSize: 2048, FrameCount: 64, FillSize: 64, CompSize: 64, RxSize: 64, TxSize: 64})
	if err != nil {
		t.Fatalf("open AF_XDP socket: %v", err)
	}
	t.Cleanup(func() { sock.Close() })
	if err := e.dp.SetVMSocket(oneQ, 0, sock.FD); err != nil {
		t.Fatal(err)
	}
	// The next slot holds a socket too (another VM's, say): a frame on
	// rx queue 1 must not reach it.
	sock1, err := xsk.Open(ifx, 1, xsk.Sizes{FrameSize: 2048, FrameCount: 64, FillSize: 64, CompSize: 64, RxSize: 64, TxSize: 64})
	if err != nil {
		t.Fatalf("open AF_XDP socket: %v", err)
	}
	t.Cleanup(func() { sock1.Close() })
	if err := e.dp.SetVMSocket(VM{ID: 9, XSKBase: oneQ.XSKBase + 1, Queues: 1}, 0, sock1.FD); err != nil {
		t.Fatal(err)
	}
	t.Run("rx queue beyond the VM's queues: drop, never into the next slot", func(t *testing.T) {
		e.enter(t)
		expectDrop(t, toVM, 1, DropNoSocket)
	})
	t.Run("the VM's frame with its socket: redirect into the socket", func(t *testing.T) {
		e.enter(t)
		expectRedirect(t, toVM)
	})
	t.Run("broadcast (ARP request): the VM's too", func(t *testing.T) {
		e.enter(t)
		expectRedirect(t, testutil.ARPFrame(1, neighMAC, "10.244.2.5", make(net.HardwareAddr, 6), "10.244.1.12"))
	})
	t.Run("multicast: the VM's too", func(t *testing.T) {
		e.enter(t)
		expectRedirect(t, testutil.IPv4Frame(mustMAC("01:00:5e:00:00:fb"), neighMAC, "10.244.2.5", "224.0.0.251", 1))
	})
}

// TestMultiqueueChoice: for a VM endpoint with 4 queues, the datapath picks
// each flow's rx queue from the flow hash (queue_mapping = queue + 1): every
// choice is a valid queue, a flow keeps its queue, and flows spread.
func TestMultiqueueChoice(t *testing.T) {
	e := newFixtureEnv(t)
	queueOf := func(t *testing.T, sport uint16, dst string) uint32 {
		t.Helper()
		frame := testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", dst, 63)
		frame[34], frame[35] = byte(sport>>8), byte(sport)
		if err := e.dp.uplink.LastRedirect.Set(uplinkRedirectTrace{}); err != nil {
			t.Fatal(err)
		}
		ret, err := e.dp.uplink.FromUplink.Run(&ebpf.RunOptions{Data: frame, Context: skbCtx{Ifindex: uint32(ifUp(e))}})
		if err != nil || ret != tcActRedirect {
			t.Fatalf("run: verdict %d, %v; want redirect", ret, err)
		}
		var tr uplinkRedirectTrace
		if err := e.dp.uplink.LastRedirect.Get(&tr); err != nil {
			t.Fatal(err)
		}
		return tr.QueueMapping
	}
	seen := map[uint32]int{}
	for sport := uint16(40000); sport < 40064; sport++ {
		q := queueOf(t, sport, e.ep5.IP.String())
		if q < 1 || q > uint32(e.ep5.Queues) {
			t.Fatalf("flow from port %d: queue_mapping %d, want 1..%d (rx queue + 1)", sport, q, e.ep5.Queues)
		}
		if again := queueOf(t, sport, e.ep5.IP.String()); again != q {
			t.Fatalf("flow from port %d moved from queue_mapping %d to %d", sport, q, again)
		}
		seen[q]++
	}
	if len(seen) < 2 {
		t.Fatalf("64 flows all on one queue: %v", seen)
	}
	t.Logf("64 flows over %d queues: %v", e.ep5.Queues, seen)
	// A single-queue VM's frames keep queue_mapping untouched.
	if q := queueOf(t, 40000, e.ep3.IP.String()); q != 0 {
		t.Fatal(fmt.Errorf("single-queue VM: queue_mapping set to %d", q))
	}
}
