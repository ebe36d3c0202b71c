package agent

import (
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/store"
)

// migNode is an agent on the memory datapath in its own node netns, whose
// "uplink" (a veth pair in that netns) reaches 192.0.2.0/24 and
// 2001:db8::/64.
type migNode struct {
	a  *Agent
	fx *fixture
	dp *fakeDatapath
}

// restart starts a new agent on n's state with a fresh memory datapath.
func (n *migNode) restart(t *testing.T) {
	t.Helper()
	n.dp = newFake()
	a, err := New(Config{
		StateDir: n.fx.stateDir, Socket: filepath.Join(n.fx.stateDir, "agent.sock"), PodCIDR: n.a.cfg.PodCIDR,
		PodCIDR6: n.a.cfg.PodCIDR6, MTU: 1400, HostNetns: n.fx.nodeNS.Path(), VMSocketDir: filepath.Join(n.fx.stateDir, "vm"),
		Uplink:       n.a.cfg.Uplink,
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return n.dp, nil },
	}, quietLog())
	if err != nil {
		t.Fatalf("restart agent: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	n.a = a
}

func startMigNode(t *testing.T, name, cidr string) *migNode {
	t.Helper()
	return startMigNode6(t, name, cidr, "")
}

// startMigNode6 is startMigNode with an IPv6 pod CIDR too (dual-stack;
// cidr6 "": IPv4 only).
func startMigNode6(t *testing.T, name, cidr, cidr6 string) *migNode {
	t.Helper()
	return startMigNodeUplink(t, name, cidr, cidr6, "")
}

// startMigNodeUplink is startMigNode6 with the agent's --uplink (up0 is
// there; "": none).
func startMigNodeUplink(t *testing.T, name, cidr, cidr6, uplink string) *migNode {
	t.Helper()
	fx := &fixture{stateDir: t.TempDir(), nodeNS: netnstest.New(t, name)}
	addMigUplink(t, fx, name)
	dp := newFake()
	var p6 netip.Prefix
	if cidr6 != "" {
		p6 = netip.MustParsePrefix(cidr6)
	}
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"), PodCIDR: netip.MustParsePrefix(cidr),
		PodCIDR6: p6, MTU: 1400, HostNetns: fx.nodeNS.Path(), VMSocketDir: filepath.Join(fx.stateDir, "vm"), Uplink: uplink,
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil },
	}, quietLog())
	if err != nil {
		t.Fatalf("start agent %s: %v", name, err)
	}
	t.Cleanup(func() { a.Close() })
	return &migNode{a: a, fx: fx, dp: dp}
}

// addMigUplink gives the node an uplink, up0 with 192.0.2.1/24 and
// 2001:db8::1/64, where the other nodes' claims are routed.
func addMigUplink(t *testing.T, fx *fixture, name string) {
	t.Helper()
	if err := fx.nodeNS.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "up0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "up1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("up0")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("192.0.2.1/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		addr6, _ := netlink.ParseAddr("2001:db8::1/64")
		addr6.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(l, addr6); err != nil {
			return err
		}
		for _, n := range []string{"up0", "up1"} {
			if l, err := netlink.LinkByName(n); err != nil || netlink.LinkSetUp(l) != nil {
				return errors.Join(err, errors.New("set "+n+" up"))
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("uplink in %s: %v", name, err)
	}
}

func (n *migNode) inDatapath(t *testing.T, id uint32) bool {
	t.Helper()
	ids, err := n.dp.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(ids, id)
}

// route returns the node's route to ip/32 (IPv6: /128; "" when none) as
// "dev N" or "via GW".
func (n *migNode) route(t *testing.T, ip netip.Addr) string {
	t.Helper()
	var out string
	n.fx.nodeNS.Do(func(ns.NetNS) error {
		fam := netlink.FAMILY_V4
		if ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: host32(ip)}, netlink.RT_FILTER_DST)
		if err != nil {
			t.Error(err)
			return nil
		}
		for _, r := range rs {
			if r.Gw != nil {
				out = "via " + r.Gw.String()
			} else if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				out = "dev " + l.Attrs().Name
			}
		}
		return nil
	})
	return out
}

func (n *migNode) forwarding(t *testing.T, dev string) string {
	t.Helper()
	var v []byte
	n.fx.nodeNS.Do(func(ns.NetNS) error {
		var err error
		v, err = os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", dev, "forwarding"))
		if err != nil {
			t.Error(err)
		}
		return nil
	})
	return strings.TrimSpace(string(v))
}

func (n *migNode) holder(t *testing.T, ip netip.Addr) string {
	t.Helper()
	var h string
	if err := n.a.st.View(func(tx *store.Tx) error {
		var err error
		h, _, err = n.a.poolOf(ip).HolderTx(tx, ip)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestVMMigrationAddressMove walks one VM's address from a source agent to
// a target agent: the target's incoming endpoint claims the address but is
// in no datapath map, has no route and forwards nothing until the migration
// completes; then the target delivers it and a sync of the claims makes the
// source drop its endpoint from the datapath, route the address to the
// target and keep it held in its IPAM (no pod gets it) until the claim goes.
func TestVMMigrationAddressMove(t *testing.T) {
	testutil.RequireRoot(t)
	src := startMigNode(t, "migsrc", "10.77.0.0/28")
	dst := startMigNode(t, "migdst", "10.78.0.0/28")
	srcNS, dstNS := netnstest.New(t, "migvm-a"), netnstest.New(t, "migvm-b")
	labels := map[string]string{"app": "db"}

	sv, err := src.a.AddVM(AddVMRequest{Name: "vm1", Netns: srcNS.Path(), Queues: 1, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	vmIP := sv.Endpoint.IP
	if vmIP.String() != "10.77.0.1" {
		t.Fatalf("source vm address %s", vmIP)
	}

	// Bad requests.
	if _, err := dst.a.AddVM(AddVMRequest{Name: "vm1", Netns: dstNS.Path(), Queues: 1, Incoming: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("incoming without address: %v, want ErrInvalid", err)
	}
	if _, err := dst.a.AddVM(AddVMRequest{Name: "vm1", Netns: dstNS.Path(), Queues: 1, Incoming: true,
		Address: netip.MustParseAddr("fd00::5")}); !errors.Is(err, ErrInvalid) {
		t.Errorf("incoming with an IPv6 address: %v, want ErrInvalid", err)
	}
	if _, err := dst.a.AddVM(AddVMRequest{Name: "vm1", Netns: dstNS.Path(), Queues: 1, Incoming: true, Address: vmIP,
		GatewayMAC: "01:00:5e:00:00:01"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("multicast gateway mac: %v, want ErrInvalid", err)
	}

	// The target's incoming endpoint: same address, MAC, labels; inactive.
	dv, err := dst.a.AddVM(AddVMRequest{Name: "vm1", Netns: dstNS.Path(), Queues: 1, MAC: sv.Endpoint.MAC, Labels: labels,
		Incoming: true, Address: vmIP, Generation: 5, GatewayMAC: sv.Endpoint.HostMAC})
	if err != nil {
		t.Fatalf("incoming vm: %v", err)
	}
	dep := dv.Endpoint
	if dep.IP != vmIP || dep.MAC != sv.Endpoint.MAC || dep.HostMAC != sv.Endpoint.HostMAC || dep.Labels["app"] != "db" ||
		dep.VM.Migration == nil || dep.VM.Migration.State != endpoint.VMIncoming || !dv.Serving {
		t.Fatalf("incoming endpoint %+v %+v", dep, dep.VM.Migration)
	}
	if dst.inDatapath(t, dep.ID) {
		t.Error("the incoming endpoint is in the datapath before the switch")
	}
	if r := dst.route(t, vmIP); r != "" {
		t.Errorf("target routes %s before the switch: %s", vmIP, r)
	}
	if f := dst.forwarding(t, dep.HostIfName); f != "0" {
		t.Errorf("incoming host end forwards (%s)", f)
	}
	if h := dst.holder(t, vmIP); h != vmKey("vm1") {
		t.Errorf("target ipam: %s held by %q", vmIP, h)
	}
	// A second claim of the address on the target is refused.
	other := netnstest.New(t, "migvm-c")
	if _, err := dst.a.AddVM(AddVMRequest{Name: "vm2", Netns: other.Path(), Queues: 1, Incoming: true, Address: vmIP}); !errors.Is(err, ErrConflict) {
		t.Errorf("second claim of %s: %v, want ErrConflict", vmIP, err)
	}

	// The migration completes: the target delivers the address.
	v, err := dst.a.VMMigrationEvent("vm1", "target", "completed")
	if err != nil {
		t.Fatal(err)
	}
	if v.Endpoint.VM.Migration.State != endpoint.VMActive || v.Endpoint.VM.Migration.ActivatedBy != ActivatedByMigrationState {
		t.Fatalf("after completion: %+v", v.Endpoint.VM.Migration)
	}
	if !dst.inDatapath(t, dep.ID) || dst.route(t, vmIP) != "dev "+dep.HostIfName || dst.forwarding(t, dep.HostIfName) != "1" {
		t.Errorf("active target: datapath %v, route %q, forwarding %s", dst.inDatapath(t, dep.ID), dst.route(t, vmIP),
			dst.forwarding(t, dep.HostIfName))
	}

	claims := []EndpointRoute{{Addr: vmIP, Via: netip.MustParseAddr("192.0.2.2"), Generation: 5, VM: "vm1", Node: "b"}}
	// The target's own claim wins on the target: no route away.
	if n, sup, err := dst.a.SyncEndpointRoutes(claims); err != nil || n != 0 || len(sup) != 0 {
		t.Errorf("target sync: %d routes, superseded %v, %v", n, sup, err)
	}
	if r := dst.route(t, vmIP); r != "dev "+dep.HostIfName {
		t.Errorf("target route after its own claim: %q", r)
	}
	// The source learns the higher claim: out of the datapath, routed away,
	// the address held as moved.
	n, sup, err := src.a.SyncEndpointRoutes(claims)
	if err != nil || n != 1 || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("source sync: %d routes, superseded %v, %v", n, sup, err)
	}
	if src.inDatapath(t, sv.Endpoint.ID) {
		t.Error("the source endpoint stays in the datapath after the target's claim")
	}
	if r := src.route(t, vmIP); r != "via 192.0.2.2" {
		t.Errorf("source route: %q", r)
	}
	if h := src.holder(t, vmIP); h != movedOwner("vm1") {
		t.Errorf("source ipam: %s held by %q", vmIP, h)
	}
	// A restarted source agent does not put the moved VM back.
	if err := src.a.Close(); err != nil {
		t.Fatal(err)
	}
	src.restart(t)
	if src.inDatapath(t, sv.Endpoint.ID) {
		t.Error("a restarted source agent put the moved vm back in the datapath")
	}
	// The source's pod goes; the address stays held and routed away.
	if _, err := src.a.DelVM("vm1"); err != nil {
		t.Fatal(err)
	}
	if h := src.holder(t, vmIP); h != movedOwner("vm1") {
		t.Errorf("source ipam after the vm's delete: %s held by %q", vmIP, h)
	}
	if r := src.route(t, vmIP); r != "via 192.0.2.2" {
		t.Errorf("source route after the vm's delete: %q", r)
	}
	// No new pod on the source gets the address while the claim lasts.
	for i := range 13 {
		ip, err := src.a.ipam.Allocate("pod-" + string(rune('a'+i)))
		if err != nil {
			break
		}
		if ip == vmIP {
			t.Fatalf("the source handed the moved address %s to a pod", vmIP)
		}
	}
	// A lower, older claim does not take the address back.
	if _, sup, err := dst.a.SyncEndpointRoutes(append(claims, EndpointRoute{Addr: vmIP, Via: netip.MustParseAddr("192.0.2.3"),
		Generation: 4, VM: "vm1", Node: "a"})); err != nil || len(sup) != 0 || !dst.inDatapath(t, dep.ID) {
		t.Errorf("older claim: superseded %v, %v", sup, err)
	}
	// The claim goes (the VM was deleted on the target): route and hold go.
	if n, _, err := src.a.SyncEndpointRoutes(nil); err != nil || n != 0 {
		t.Fatalf("empty sync: %d, %v", n, err)
	}
	if r := src.route(t, vmIP); r != "" {
		t.Errorf("source route after the claim went: %q", r)
	}
	if h := src.holder(t, vmIP); h != "" {
		t.Errorf("source ipam after the claim went: %s held by %q", vmIP, h)
	}
	if _, _, err := src.a.SyncEndpointRoutes([]EndpointRoute{{Addr: netip.MustParseAddr("fd00::1"), Via: netip.MustParseAddr("192.0.2.2"),
		VM: "vm1"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("IPv6 claim via an IPv4 node address: %v, want ErrInvalid", err)
	}
}

// vmRecords counts the stored endpoint records of VM name.
func (n *migNode) vmRecords(t *testing.T, name string) int {
	t.Helper()
	eps, err := n.a.endpoints()
	if err != nil {
		t.Fatal(err)
	}
	c := 0
	for _, ep := range eps {
		if ep.Kind == endpoint.KindVM && ep.VM != nil && ep.VM.Name == name {
			c++
		}
	}
	return c
}

// TestVMMigrationKubeVirtIfName: a KubeVirt attachment's VM device is named
// like the launcher pod's interface ("pod" and a hash), not
// endpoint.VMIfName, while the agent stores one record per VM under its
// name. A VM moved away from the node whose pod CIDR its address is in must
// be superseded there (the address held as moved), and one moved away from
// another node must leave one record, which its DelVM removes: moved a → b
// and back, neither agent lists the VM once both pods went. (With the
// record's attachment key the owner's supersede failed, "held by another
// owner", and left the VM delivered locally until its pod went; the other
// node wrote a second record that no DelVM removed.)
func TestVMMigrationKubeVirtIfName(t *testing.T) {
	testutil.RequireRoot(t)
	a := startMigNode(t, "kvmiga", "10.77.0.0/28")
	b := startMigNode(t, "kvmigb", "10.78.0.0/28")
	const ifn = "pod115dc3606fb"
	av, err := a.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "kvvm-a").Path(), Queues: 1, IfName: ifn})
	if err != nil {
		t.Fatal(err)
	}
	vmIP, mac, gw := av.Endpoint.IP, av.Endpoint.MAC, av.Endpoint.HostMAC
	// a -> b.
	bv, err := b.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "kvvm-b").Path(), Queues: 1, IfName: ifn, MAC: mac,
		Incoming: true, Address: vmIP, Generation: 5, GatewayMAC: gw})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	toB := EndpointRoute{Addr: vmIP, Via: netip.MustParseAddr("192.0.2.2"), Generation: 5, VM: "vm1", Node: "b"}
	if n, sup, err := a.a.SyncEndpointRoutes([]EndpointRoute{toB}); err != nil || n != 1 || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("a (the address's pod CIDR) learns b's claim: %d routes, superseded %v, %v", n, sup, err)
	}
	if a.inDatapath(t, av.Endpoint.ID) || a.holder(t, vmIP) != movedOwner("vm1") || a.vmRecords(t, "vm1") != 1 {
		t.Errorf("a after the move: in its datapath %v, %s held by %q, %d records of vm1", a.inDatapath(t, av.Endpoint.ID), vmIP,
			a.holder(t, vmIP), a.vmRecords(t, "vm1"))
	}
	if _, err := a.a.DelVM("vm1"); err != nil { // the source pod goes
		t.Fatal(err)
	}
	// b -> a.
	_, err = a.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "kvvm-a2").Path(), Queues: 1, IfName: ifn, MAC: mac,
		Incoming: true, Address: vmIP, Generation: 9, GatewayMAC: gw})
	if err != nil {
		t.Fatalf("a's incoming endpoint for the move back: %v", err)
	}
	if _, err := a.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	toA := EndpointRoute{Addr: vmIP, Via: netip.MustParseAddr("192.0.2.1"), Generation: 9, VM: "vm1", Node: "a"}
	if _, sup, err := b.a.SyncEndpointRoutes([]EndpointRoute{toA}); err != nil || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("b learns a's claim: superseded %v, %v", sup, err)
	}
	if b.inDatapath(t, bv.Endpoint.ID) || b.vmRecords(t, "vm1") != 1 {
		t.Errorf("b after the move back: in its datapath %v, %d records of vm1", b.inDatapath(t, bv.Endpoint.ID), b.vmRecords(t, "vm1"))
	}
	if _, err := b.a.DelVM("vm1"); err != nil { // b's pod goes
		t.Fatal(err)
	}
	if _, err := a.a.DelVM("vm1"); err != nil { // the VMI is deleted
		t.Fatal(err)
	}
	for _, n := range []*migNode{a, b} {
		vms, err := n.a.ListVMs()
		if err != nil || len(vms) != 0 || n.vmRecords(t, "vm1") != 0 {
			t.Errorf("%s after both pods went: %d vms listed (%v), %d records", n.fx.nodeNS.Path(), len(vms), err, n.vmRecords(t, "vm1"))
		}
	}
}

// TestVMAdoptKubeVirtIfName: a restarted agent that finds a KubeVirt
// attachment's VM device gone forgets the VM's one record (by the key it is
// stored under, not its attachment key), its address with it.
func TestVMAdoptKubeVirtIfName(t *testing.T) {
	testutil.RequireRoot(t)
	n := startMigNode(t, "kvadopt", "10.77.0.0/28")
	v, err := n.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "kvadopt-vm").Path(), Queues: 1, IfName: "pod115dc3606fb"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(v.Endpoint.HostIfName)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	n.restart(t)
	if c := n.vmRecords(t, "vm1"); c != 0 {
		t.Errorf("%d records of vm1 after its device went", c)
	}
	if h := n.holder(t, v.Endpoint.IP); h != "" {
		t.Errorf("%s still held by %q", v.Endpoint.IP, h)
	}
}
