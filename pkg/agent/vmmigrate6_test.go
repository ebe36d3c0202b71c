package agent

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestVMMigrationAddressMove6 moves a dual-stack VM's IPv6 address with its
// IPv4 one (native routing) and back: the target's incoming endpoint claims
// the source's IPv6 address in its IPv6 pool and has no /128 route until
// the switch; the source, superseded once by the two claims, routes the
// /128 via the target's IPv6 node address and holds the address as moved in
// its IPv6 pool (also across an agent restart and the VM's delete); the
// move back takes the holds and routes back, and a withdrawn claim removes
// the /128 route and the hold.
func TestVMMigrationAddressMove6(t *testing.T) {
	testutil.RequireRoot(t)
	src := startMigNode6(t, "mig6src", "10.77.0.0/28", "fd77::/120")
	dst := startMigNode6(t, "mig6dst", "10.78.0.0/28", "fd78::/120")
	srcNS, dstNS := netnstest.New(t, "mig6vm-a"), netnstest.New(t, "mig6vm-b")
	// Every node's uplink holds .1/::1: the other node is .3/::3 from here.
	srcVia4, srcVia6 := netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("2001:db8::3")
	dstVia4, dstVia6 := netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")

	sv, err := src.a.AddVM(AddVMRequest{Name: "vm1", Netns: srcNS.Path(), Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	vmIP, vmIP6 := sv.Endpoint.IP, sv.Endpoint.IP6
	if vmIP.String() != "10.77.0.1" || vmIP6.String() != "fd77::1" {
		t.Fatalf("source vm addresses %s %s", vmIP, vmIP6)
	}
	if r := src.route(t, vmIP6); r != "dev "+sv.Endpoint.HostIfName {
		t.Fatalf("source route to %s before the move: %q", vmIP6, r)
	}

	// Bad requests.
	for _, req := range []AddVMRequest{
		{Address: vmIP, Address6: netip.MustParseAddr("10.77.0.9")},        // IPv4 as Address6
		{Address: vmIP, Address6: netip.MustParseAddr("::ffff:10.77.0.9")}, // mapped
		{Address6: vmIP6}, // IPv6 without IPv4
	} {
		req.Name, req.Netns, req.Queues, req.Incoming = "vm1", dstNS.Path(), 1, true
		if _, err := dst.a.AddVM(req); !errors.Is(err, ErrInvalid) {
			t.Errorf("incoming %s %s: %v, want ErrInvalid", req.Address, req.Address6, err)
		}
	}
	v4only := startMigNode(t, "mig6v4", "10.79.0.0/28")
	if _, err := v4only.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "mig6vm-c").Path(), Queues: 1, Incoming: true,
		Address: vmIP, Address6: vmIP6}); !errors.Is(err, ErrInvalid) {
		t.Errorf("incoming IPv6 address on a node without an IPv6 pod CIDR: %v, want ErrInvalid", err)
	}

	// The target's incoming endpoint keeps both addresses; inactive.
	dv, err := dst.a.AddVM(AddVMRequest{Name: "vm1", Netns: dstNS.Path(), Queues: 1, MAC: sv.Endpoint.MAC,
		Incoming: true, Address: vmIP, Address6: vmIP6, Generation: 5, GatewayMAC: sv.Endpoint.HostMAC})
	if err != nil {
		t.Fatalf("incoming vm: %v", err)
	}
	dep := dv.Endpoint
	if dep.IP != vmIP || dep.IP6 != vmIP6 {
		t.Fatalf("incoming endpoint addresses %s %s, want %s %s", dep.IP, dep.IP6, vmIP, vmIP6)
	}
	if r := dst.route(t, vmIP6); r != "" {
		t.Errorf("target routes %s before the switch: %s", vmIP6, r)
	}
	if h := dst.holder(t, vmIP6); h != vmKey("vm1") {
		t.Errorf("target ipam6: %s held by %q", vmIP6, h)
	}
	if _, err := dst.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	if r := dst.route(t, vmIP6); r != "dev "+dep.HostIfName {
		t.Errorf("active target: route to %s %q", vmIP6, r)
	}

	claims := []EndpointRoute{
		{Addr: vmIP, Via: dstVia4, Generation: 5, VM: "vm1", Node: "b"},
		{Addr: vmIP6, Via: dstVia6, Generation: 5, VM: "vm1", Node: "b"},
	}
	if n, sup, err := dst.a.SyncEndpointRoutes(claims); err != nil || n != 0 || len(sup) != 0 {
		t.Errorf("target sync: %d routes, superseded %v, %v", n, sup, err)
	}
	// Two claims, one superseded VM; both addresses routed away and held.
	n, sup, err := src.a.SyncEndpointRoutes(claims)
	if err != nil || n != 2 || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("source sync: %d routes, superseded %v, %v", n, sup, err)
	}
	if src.inDatapath(t, sv.Endpoint.ID) {
		t.Error("the source endpoint stays in the datapath after the target's claims")
	}
	for ip, want := range map[netip.Addr]string{vmIP: "via 192.0.2.2", vmIP6: "via 2001:db8::2"} {
		if r := src.route(t, ip); r != want {
			t.Errorf("source route to %s: %q, want %q", ip, r, want)
		}
		if h := src.holder(t, ip); h != movedOwner("vm1") {
			t.Errorf("source ipam: %s held by %q", ip, h)
		}
	}
	// A restarted source keeps the routes; its pod goes, the holds stay.
	if err := src.a.Close(); err != nil {
		t.Fatal(err)
	}
	src.restart(t)
	if n, sup, err := src.a.SyncEndpointRoutes(claims); err != nil || n != 2 || len(sup) != 0 {
		t.Errorf("restarted source sync: %d routes, superseded %v, %v", n, sup, err)
	}
	if _, err := src.a.DelVM("vm1"); err != nil {
		t.Fatal(err)
	}
	if r, h := src.route(t, vmIP6), src.holder(t, vmIP6); r != "via 2001:db8::2" || h != movedOwner("vm1") {
		t.Errorf("source after the vm's delete: route %q, %s held by %q", r, vmIP6, h)
	}
	for i := range 20 {
		ip, err := src.a.ipam6.Allocate("pod-" + string(rune('a'+i)))
		if err != nil {
			break
		}
		if ip == vmIP6 {
			t.Fatalf("the source handed the moved address %s to a pod", vmIP6)
		}
	}

	// The move back: the source takes its holds, the target is superseded.
	sv2, err := src.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "mig6vm-d").Path(), Queues: 1, MAC: dep.MAC,
		Incoming: true, Address: vmIP, Address6: vmIP6, Generation: 9, GatewayMAC: dep.HostMAC})
	if err != nil {
		t.Fatalf("incoming vm on the source: %v", err)
	}
	if h := src.holder(t, vmIP6); h != vmKey("vm1") {
		t.Errorf("source ipam6 after the incoming vm: %s held by %q", vmIP6, h)
	}
	if r := src.route(t, vmIP6); r != "via 2001:db8::2" {
		t.Errorf("source route to %s before the switch back: %q (the target still delivers it)", vmIP6, r)
	}
	if _, err := src.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	if r := src.route(t, vmIP6); r != "dev "+sv2.Endpoint.HostIfName {
		t.Errorf("source route to %s after the switch back: %q", vmIP6, r)
	}
	back := []EndpointRoute{
		{Addr: vmIP, Via: srcVia4, Generation: 9, VM: "vm1", Node: "a"},
		{Addr: vmIP6, Via: srcVia6, Generation: 9, VM: "vm1", Node: "a"},
	}
	if n, sup, err := src.a.SyncEndpointRoutes(back); err != nil || n != 0 || len(sup) != 0 {
		t.Errorf("source sync of its own claims: %d routes, superseded %v, %v", n, sup, err)
	}
	if n, sup, err := dst.a.SyncEndpointRoutes(back); err != nil || n != 2 || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("target sync of the move back: %d routes, superseded %v, %v", n, sup, err)
	}
	if dst.inDatapath(t, dep.ID) || dst.route(t, vmIP6) != "via 2001:db8::3" {
		t.Errorf("target after the move back: datapath %v, route %q", dst.inDatapath(t, dep.ID), dst.route(t, vmIP6))
	}
	if got, err := dst.a.ListVMs(); err != nil || len(got) != 1 || got[0].Endpoint.VM.Migration.State != endpoint.VMMoved {
		t.Errorf("target vm after the move back: %+v, %v", got, err)
	}
	// fd78::/120 is not where the address lives: the target keeps no hold.
	if h := dst.holder(t, vmIP6); h != "" {
		t.Errorf("target ipam6 after the move back: %s held by %q", vmIP6, h)
	}

	// The claims go: the /128 route goes.
	if _, err := dst.a.DelVM("vm1"); err != nil {
		t.Fatal(err)
	}
	if n, _, err := dst.a.SyncEndpointRoutes(nil); err != nil || n != 0 {
		t.Fatalf("empty sync: %d, %v", n, err)
	}
	if r := dst.route(t, vmIP6); r != "" {
		t.Errorf("target route to %s after the claim went: %q", vmIP6, r)
	}
	// A withdrawn claim of a moved address of the source's pod CIDR
	// releases the hold there.
	if n, _, err := src.a.SyncEndpointRoutes(nil); err != nil || n != 0 {
		t.Fatalf("source empty sync: %d, %v", n, err)
	}
	if h := src.holder(t, vmIP6); h != vmKey("vm1") {
		t.Errorf("source ipam6 with the vm back: %s held by %q", vmIP6, h)
	}
}
