package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// The memory datapath serves VM endpoints (agenttest does not import the
// agent, so the assertion is here).
var _ VMDatapath = (*agenttest.MemoryDatapath)(nil)

// fakeDatapath records calls and can be told to fail.
type fakeDatapath struct {
	*agenttest.MemoryDatapath
	mu        sync.Mutex
	upserts   []datapath.Endpoint
	deletes   []uint32
	failNext  error
	failVM    error // fails the next AttachVM
	closeHits int
}

func (f *fakeDatapath) AttachVM(vm datapath.VM) error {
	f.mu.Lock()
	if err := f.failVM; err != nil {
		f.failVM = nil
		f.mu.Unlock()
		return err
	}
	f.mu.Unlock()
	return f.MemoryDatapath.AttachVM(vm)
}

func newFake() *fakeDatapath {
	return &fakeDatapath{MemoryDatapath: agenttest.NewMemoryDatapath()}
}

func (f *fakeDatapath) UpsertEndpoint(ep datapath.Endpoint) error {
	f.mu.Lock()
	if err := f.failNext; err != nil {
		f.failNext = nil
		f.mu.Unlock()
		return err
	}
	f.upserts = append(f.upserts, ep)
	f.mu.Unlock()
	return f.MemoryDatapath.UpsertEndpoint(ep)
}

func (f *fakeDatapath) DeleteEndpoint(ep datapath.Endpoint) error {
	f.mu.Lock()
	f.deletes = append(f.deletes, ep.ID)
	f.mu.Unlock()
	return f.MemoryDatapath.DeleteEndpoint(ep)
}

func (f *fakeDatapath) Close() error { f.closeHits++; return nil }

func quietLog() *slog.Logger {
	if os.Getenv("LK_DEBUG_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type fixture struct {
	stateDir string
	nodeNS   ns.NetNS
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	testutil.RequireRoot(t)
	return &fixture{stateDir: t.TempDir(), nodeNS: netnstest.New(t, "anode")}
}

func (fx *fixture) start(t *testing.T, dp datapath.Datapath) *Agent {
	t.Helper()
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"),
		MTU:     1400, HostNetns: fx.nodeNS.Path(),
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil },
	}, quietLog())
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	return a
}

func (fx *fixture) hostLinkExists(t *testing.T, name string) bool {
	t.Helper()
	found := false
	fx.nodeNS.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName(name)
		found = err == nil
		return nil
	})
	return found
}

func allocCount(t *testing.T, a *Agent) int {
	t.Helper()
	all, err := a.ipam.Allocations()
	if err != nil {
		t.Fatal(err)
	}
	return len(all)
}

func TestAddCheckDelIdempotent(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a := fx.start(t, fake)
	defer a.Close()
	pod := netnstest.New(t, "apod")

	req := AddRequest{ContainerID: "c1", IfName: "eth0", Netns: pod.Path(), Network: "lk"}
	ep, err := a.Add(req)
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID != 1 || ep.IP.String() != "10.77.0.1" || ep.Mode != probedMode(a) || ep.MTU != 1400 {
		t.Fatalf("endpoint = %+v, want mode %s", ep, probedMode(a))
	}
	// The host device is of the kind the probe chose.
	fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ep.HostIfName)
		if err != nil {
			t.Fatalf("host device: %v", err)
		}
		if l.Type() != string(ep.Mode) {
			t.Errorf("host device %s is %s, endpoint mode %s", ep.HostIfName, l.Type(), ep.Mode)
		}
		return nil
	})
	if len(fake.upserts) != 1 || fake.upserts[0].IfIndex != ep.HostIfIndex || fake.upserts[0].HostMAC.String() != ep.HostMAC ||
		fake.upserts[0].MAC.String() != ep.MAC || fake.upserts[0].IP != ep.IP {
		t.Fatalf("datapath got %+v for %+v", fake.upserts, ep)
	}
	again, err := a.Add(req)
	if err != nil || again.ID != ep.ID || again.IP != ep.IP {
		t.Fatalf("duplicate add = %+v %v", again, err)
	}
	if allocCount(t, a) != 1 || len(fake.upserts) != 1 {
		t.Fatalf("duplicate add allocated again: %d ips, %d upserts", allocCount(t, a), len(fake.upserts))
	}
	other := netnstest.New(t, "apod2")
	if _, err := a.Add(AddRequest{ContainerID: "c1", IfName: "eth0", Netns: other.Path()}); !errors.Is(err, ErrConflict) {
		t.Fatalf("add in another netns = %v, want ErrConflict", err)
	}
	if _, err := a.Check("c1", "eth0", pod.Path()); err != nil {
		t.Fatalf("check: %v", err)
	}
	// The datapath losing the entry makes CHECK fail.
	fake.MemoryDatapath.DeleteEndpoint(datapath.Endpoint{ID: ep.ID})
	if _, err := a.Check("c1", "eth0", pod.Path()); err == nil || !strings.Contains(err.Error(), "missing from the datapath") {
		t.Fatalf("check without datapath entry = %v", err)
	}
	fake.MemoryDatapath.UpsertEndpoint(fake.upserts[0])

	existed, err := a.Del("c1", "eth0")
	if err != nil || !existed {
		t.Fatalf("del = %v %v", existed, err)
	}
	if len(fake.deletes) != 1 || fake.deletes[0] != ep.ID {
		t.Fatalf("datapath deletes = %v", fake.deletes)
	}
	if fx.hostLinkExists(t, ep.HostIfName) {
		t.Fatal("host device survived DEL")
	}
	existed, err = a.Del("c1", "eth0")
	if err != nil || existed {
		t.Fatalf("second del = %v %v", existed, err)
	}
	if _, err := a.Check("c1", "eth0", pod.Path()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("check after del = %v, want ErrNotFound", err)
	}
	if n := allocCount(t, a); n != 0 {
		t.Fatalf("%d addresses leaked", n)
	}
}

func TestAddUndoesOnFailure(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a := fx.start(t, fake)
	defer a.Close()
	pod := netnstest.New(t, "upod")

	fake.failNext = errors.New("injected attach failure")
	_, err := a.Add(AddRequest{ContainerID: "c1", IfName: "eth0", Netns: pod.Path()})
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("add = %v, want the injected failure", err)
	}
	if fx.hostLinkExists(t, hostIfOf("c1", "eth0")) {
		t.Fatal("failed add left its host device")
	}
	pod.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Error("failed add left eth0 in the pod")
		}
		return nil
	})
	if n := allocCount(t, a); n != 0 {
		t.Fatalf("failed add leaked %d addresses", n)
	}
	if eps, _ := a.List(); len(eps) != 0 {
		t.Fatalf("failed add left records: %+v", eps)
	}
	// The ID is free again; the address rotates on (host-local style).
	ep, err := a.Add(AddRequest{ContainerID: "c1", IfName: "eth0", Netns: pod.Path()})
	if err != nil || ep.ID != 1 || ep.IP.String() != "10.77.0.2" {
		t.Fatalf("add after undo = %+v %v", ep, err)
	}
	// A clashing ifname fails inside the pod: everything is undone too.
	if _, err := a.Add(AddRequest{ContainerID: "c2", IfName: "lo", Netns: pod.Path()}); err == nil {
		t.Fatal("add with ifname lo succeeded")
	}
	if n := allocCount(t, a); n != 1 {
		t.Fatalf("allocations = %d after failed add, want 1", n)
	}
}

// probedMode is the device mode the netdev probe leads an auto agent to:
// netkit where the kernel has it, veth otherwise.
func probedMode(a *Agent) datapath.DeviceMode {
	if a.features.Netkit.Supported {
		return datapath.ModeNetkit
	}
	return datapath.ModeVeth
}

func hostIfOf(cid, ifname string) string {
	return endpoint.HostIfName(cid, ifname)
}

func TestAddValidation(t *testing.T) {
	fx := newFixture(t)
	a := fx.start(t, newFake())
	defer a.Close()
	pod := netnstest.New(t, "vpod")
	for _, tc := range []struct {
		name string
		req  AddRequest
		want error
	}{
		{"no container", AddRequest{IfName: "eth0", Netns: pod.Path()}, ErrInvalid},
		{"no netns", AddRequest{ContainerID: "c", IfName: "eth0"}, ErrBadNetns},
		{"missing netns", AddRequest{ContainerID: "c", IfName: "eth0", Netns: "/run/netns/lk-t-nope"}, ErrBadNetns},
		{"vm kind", AddRequest{Kind: "vm", ContainerID: "c", IfName: "eth0", Netns: pod.Path()}, ErrInvalid},
		{"bad mtu", AddRequest{ContainerID: "c", IfName: "eth0", Netns: pod.Path(), MTU: 20}, ErrInvalid},
		{"disjoint subnet", AddRequest{ContainerID: "c", IfName: "eth0", Netns: pod.Path(), Subnet: "192.168.0.0/24"}, ErrInvalid},
		{"narrower subnet", AddRequest{ContainerID: "c", IfName: "eth0", Netns: pod.Path(), Subnet: "10.77.0.0/30"}, ErrInvalid},
		{"bad subnet", AddRequest{ContainerID: "c", IfName: "eth0", Netns: pod.Path(), Subnet: "nope"}, ErrInvalid},
	} {
		if _, err := a.Add(tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := a.Add(AddRequest{ContainerID: "c", IfName: "eth0", Netns: pod.Path(), Subnet: "10.77.0.0/16"}); err != nil {
		t.Errorf("containing subnet refused: %v", err)
	}
	if n := allocCount(t, a); n != 1 {
		t.Errorf("allocations = %d, want 1", n)
	}
}

func TestExhaustionAndIDReuse(t *testing.T) {
	fx := newFixture(t)
	a := fx.start(t, newFake())
	defer a.Close()
	// /28: 14 usable addresses, 14 pods.
	for i := range 14 {
		pod := netnstest.New(t, fmt.Sprintf("xpod%d", i))
		ep, err := a.Add(AddRequest{ContainerID: "c", IfName: fmt.Sprintf("eth%d", i), Netns: pod.Path()})
		if err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
		if ep.ID != uint32(i+1) {
			t.Fatalf("add %d got id %d", i, ep.ID)
		}
	}
	if _, err := a.Add(AddRequest{ContainerID: "c", IfName: "eth14", Netns: netnstest.New(t, "xpod14").Path()}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("15th add = %v, want ErrExhausted", err)
	}
	if _, err := a.Del("c", "eth4"); err != nil {
		t.Fatal(err)
	}
	ep, err := a.Add(AddRequest{ContainerID: "d", IfName: "eth0", Netns: netnstest.New(t, "xpodd").Path()})
	if err != nil || ep.ID != 5 || ep.IP.String() != "10.77.0.5" {
		t.Fatalf("add after del = %+v %v, want id 5 and 10.77.0.5", ep, err)
	}
}

func TestReadoptAfterRestart(t *testing.T) {
	fx := newFixture(t)
	a := fx.start(t, newFake())
	podA := netnstest.New(t, "rpoda")
	podB := netnstest.New(t, "rpodb")
	epA, err := a.Add(AddRequest{ContainerID: "a", IfName: "eth0", Netns: podA.Path()})
	if err != nil {
		t.Fatal(err)
	}
	epB, err := a.Add(AddRequest{ContainerID: "b", IfName: "eth0", Netns: podB.Path()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// While the agent is down, b's device disappears.
	fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(epB.HostIfName)
		if err != nil {
			t.Fatal(err)
		}
		return netlink.LinkDel(l)
	})

	fake := newFake()
	a = fx.start(t, fake)
	defer a.Close()
	if len(fake.upserts) != 1 || fake.upserts[0].ID != epA.ID || fake.upserts[0].IfIndex != epA.HostIfIndex {
		t.Fatalf("re-adoption upserts = %+v, want only endpoint %d", fake.upserts, epA.ID)
	}
	if len(fake.deletes) != 1 || fake.deletes[0] != epB.ID {
		t.Fatalf("re-adoption deletes = %v, want [%d]", fake.deletes, epB.ID)
	}
	eps, _ := a.List()
	if len(eps) != 1 || eps[0].ID != epA.ID {
		t.Fatalf("endpoints after restart = %+v", eps)
	}
	if n := allocCount(t, a); n != 1 {
		t.Fatalf("allocations = %d, want 1 (b's released)", n)
	}
	if _, err := a.Check("a", "eth0", podA.Path()); err != nil {
		t.Fatalf("check re-adopted endpoint: %v", err)
	}
	ep, err := a.Add(AddRequest{ContainerID: "c", IfName: "eth0", Netns: podB.Path()})
	if err != nil || ep.ID != epB.ID || ep.IP.String() != "10.77.0.3" {
		t.Fatalf("add after restart = %+v %v, want b's id back and the next address (10.77.0.3)", ep, err)
	}
}

func TestGC(t *testing.T) {
	fx := newFixture(t)
	a := fx.start(t, newFake())
	defer a.Close()
	for _, n := range []string{"eth0", "eth1", "eth2"} {
		pod := netnstest.New(t, "gpod"+n)
		if _, err := a.Add(AddRequest{ContainerID: "g", IfName: n, Netns: pod.Path()}); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := a.GC([]Attachment{{"g", "eth1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Fatalf("removed = %v, want eth0 and eth2", removed)
	}
	eps, _ := a.List()
	if len(eps) != 1 || eps[0].IfName != "eth1" {
		t.Fatalf("left = %+v", eps)
	}
	if n := allocCount(t, a); n != 1 {
		t.Fatalf("allocations = %d, want 1", n)
	}
}

func TestServeSocketAndStatus(t *testing.T) {
	fx := newFixture(t)
	sock := filepath.Join(fx.stateDir, "agent.sock")
	// A stale socket file from a previous run is replaced.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	a := fx.start(t, newFake())
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var conn *grpc.ClientConn
	deadline := time.Now().Add(5 * time.Second)
	for {
		fi, err := os.Stat(sock)
		if err == nil && fi.Mode()&os.ModeSocket != 0 && fi.Mode().Perm() == 0o600 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket not ready with mode 0600: %v %v", fi, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := apiv1.NewAgentClient(conn)
	var st *apiv1.StatusResponse
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// Ready once the control plane's background restore is done.
		if st, err = c.Status(ctx, &apiv1.StatusRequest{}); err != nil {
			t.Fatal(err)
		}
		if st.Ready || time.Now().After(deadline) {
			break
		}
	}
	if st.PodCidr != "10.77.0.0/28" || st.Datapath.DeviceMode != string(probedMode(a)) || st.Datapath.DeviceModeReason == "" ||
		st.Kernel.Release == "" || st.IpsCapacity != 14 || !st.Ready || st.Datapath.Backend != "test" {
		t.Fatalf("status = %v, want device mode %s", st, probedMode(a))
	}
	if st.Kernel.Netkit.Supported != (st.Datapath.DeviceMode == "netkit") {
		t.Fatalf("device mode %s with netkit probe %v", st.Datapath.DeviceMode, st.Kernel.Netkit)
	}
	_, err = c.CheckEndpoint(ctx, &apiv1.CheckEndpointRequest{Attachment: &apiv1.Attachment{ContainerId: "x", Ifname: "eth0"}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("check unknown = %v, want NotFound", err)
	}
	_, err = c.AddEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: &apiv1.Attachment{ContainerId: "x", Ifname: "eth0"}, Netns: "/nonexistent"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("add with bad netns = %v, want FailedPrecondition", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop")
	}
}
