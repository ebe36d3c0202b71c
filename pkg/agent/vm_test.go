package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/store"
	"github.com/lanekit/lanekit/pkg/xsk"
)

func TestFindSlots(t *testing.T) {
	r := func(base uint32, n int) slotRange { return slotRange{Base: base, Count: n, Owner: fmt.Sprint(base)} }
	for _, tc := range []struct {
		name string
		used []slotRange
		n    int
		want uint32
		err  string
	}{
		{"empty", nil, 4, 0, ""},
		{"after one", []slotRange{r(0, 2)}, 3, 2, ""},
		{"first gap that fits", []slotRange{r(0, 2), r(4, 1), r(8, 2)}, 2, 2, ""},
		{"gap too small", []slotRange{r(0, 2), r(3, 2)}, 2, 5, ""},
		{"unsorted input", []slotRange{r(8, 2), r(0, 4)}, 4, 4, ""},
		{"exact fit at end", []slotRange{r(0, 12)}, 4, 12, ""},
		{"full", []slotRange{r(0, 14)}, 4, 0, "no 4 free"},
		{"zero", nil, 0, 0, "0 socket slots"},
		{"beyond max", nil, 17, 0, "17 socket slots"},
	} {
		got, err := findSlots(tc.used, tc.n, 16)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: findSlots = %d %v, want %d", tc.name, got, err, tc.want)
		}
	}
	if _, err := findSlots([]slotRange{r(0, 16)}, 1, 16); !errors.Is(err, ErrExhausted) {
		t.Errorf("full map: %v, want ErrExhausted", err)
	}
}

// TestSlotAllocatorPersisted: ranges are reserved in the store, released by
// owner and by orphan collection, and reused first-fit.
func TestSlotAllocatorPersisted(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	alloc := func(owner string, n int) uint32 {
		t.Helper()
		var base uint32
		if err := st.Update(func(tx *store.Tx) error {
			var err error
			base, err = allocSlotsTx(tx, owner, n)
			return err
		}); err != nil {
			t.Fatalf("alloc %s: %v", owner, err)
		}
		return base
	}
	if a, b, c := alloc("a", 2), alloc("b", 4), alloc("c", 1); a != 0 || b != 2 || c != 6 {
		t.Fatalf("bases = %d %d %d, want 0 2 6", a, b, c)
	}
	if err := st.Update(func(tx *store.Tx) error {
		_, err := releaseSlotsTx(tx, func(o string) (bool, error) { return o == "b", nil })
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if d := alloc("d", 3); d != 2 {
		t.Fatalf("after releasing b: base %d, want 2 (first fit)", d)
	}
	if e := alloc("e", 2); e != 7 {
		t.Fatalf("base %d, want 7", e)
	}
	err = st.Update(func(tx *store.Tx) error {
		_, err := allocSlotsTx(tx, "huge", datapath.MaxXSKs)
		return err
	})
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("allocating every slot again = %v, want ErrExhausted", err)
	}
}

// vmBackend starts agents for one datapath flavour on fx's directories.
type vmBackend struct {
	name   string
	bpfDir string // empty: the memory datapath
}

func (b vmBackend) start(t *testing.T, fx *fixture, vmDir string) *Agent {
	t.Helper()
	cfg := Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: fx.nodeNS.Path(),
		VMSocketDir: vmDir,
	}
	if b.bpfDir != "" {
		cfg.BPFDir = b.bpfDir
	} else {
		cfg.OpenDatapath = func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return newFake(), nil }
	}
	a, err := New(cfg, quietLog())
	if err != nil {
		t.Fatalf("start agent (%s): %v", b.name, err)
	}
	return a
}

// vmBackends returns the memory datapath and, when it opens here, the BPF one.
func vmBackends(t *testing.T) []vmBackend {
	out := []vmBackend{{name: "memory"}}
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-agent-vm-%d", os.Getpid()))
	dp, err := datapath.Open(datapath.Config{PinDir: dir}, quietLog())
	if err != nil {
		datapath.Unpin(dir)
		// Root on a kernel without what the datapath needs: a failure, not a
		// quiet fallback to the memory datapath.
		t.Fatalf("BPF datapath does not open as root: %v", err)
	}
	dp.Close()
	datapath.Unpin(dir)
	return append(out, vmBackend{name: "bpf", bpfDir: dir})
}

func linkIn(t *testing.T, n ns.NetNS, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	n.Do(func(ns.NetNS) error {
		l, _ = netlink.LinkByName(name)
		return nil
	})
	return l
}

func slotCount(t *testing.T, a *Agent) int {
	t.Helper()
	var n int
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		n, err = tx.Count(store.XSKSlots)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// fetchVM fetches the VM's sockets as a backend that does not know the RSS
// map (it must get none) and as one that does; it returns whether the
// latter got the map.
func fetchVM(t *testing.T, path, name string, queues int) bool {
	t.Helper()
	if fetchVMOffer(t, path, name, queues, false) {
		t.Fatal("the RSS map was handed to a backend that did not ask for it")
	}
	return fetchVMOffer(t, path, name, queues, true)
}

func fetchVMOffer(t *testing.T, path, name string, queues int, rss bool) bool {
	t.Helper()
	offer, fds, err := xsk.FetchRSS(path, name, rss, 10*time.Second)
	if err != nil {
		t.Fatalf("fetch sockets of %s: %v", name, err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	// The BPF datapath hands the VM's RSS map too (its fd last).
	want := 2 * queues
	if offer.RSS != nil {
		want++
		if offer.RSS.ValueSize != datapath.VMRSSValueSize {
			t.Fatalf("rss map value size %d, want %d", offer.RSS.ValueSize, datapath.VMRSSValueSize)
		}
	}
	if len(offer.Queues) != queues || len(fds) != want {
		t.Fatalf("offer %+v with %d fds, want %d queues and %d fds", offer, len(fds), queues, want)
	}
	for i, q := range offer.Queues {
		if q.Queue != uint32(i) || q.FrameSize != xsk.DefaultSizes.FrameSize || q.UmemSize == 0 {
			t.Fatalf("queue %d config %+v", i, q)
		}
	}
	// fds alternate xsk, umem memfd; then the RSS map, a BPF map.
	if offer.RSS != nil {
		m, err := ebpf.NewMapFromFD(fds[len(fds)-1])
		if err != nil {
			t.Fatalf("rss map fd: %v", err)
		}
		if m.ValueSize() != datapath.VMRSSValueSize || m.MaxEntries() != 1 {
			t.Fatalf("rss map %v: value size %d, %d entries", m, m.ValueSize(), m.MaxEntries())
		}
		fds = fds[:len(fds)-1] // NewMapFromFD took this fd over
		m.Close()
	}
	for i, fd := range fds {
		dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		if i%2 == 0 && (err != nil || dom != unix.AF_XDP) {
			t.Fatalf("fd %d is not an AF_XDP socket: %d %v", i, dom, err)
		}
		if i%2 == 1 && err == nil {
			t.Fatalf("fd %d (umem) is a socket", i)
		}
	}
	return offer.RSS != nil
}

// TestVMLifecycle: add a 2-queue VM, fetch its sockets, restart the agent
// (the VM is re-adopted and served again), delete it and find nothing left;
// then a VM whose netns disappears is still deleted cleanly.
func TestVMLifecycle(t *testing.T) {
	for _, b := range vmBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			fx := newFixture(t)
			if b.bpfDir != "" {
				t.Cleanup(func() { datapath.Unpin(b.bpfDir) })
			}
			vmDir := filepath.Join(fx.stateDir, "vm")
			a := b.start(t, fx, vmDir)
			defer func() { a.Close() }()
			vmNS := netnstest.New(t, "vm-"+b.name)

			nobody := uint32(65534)
			v, err := a.AddVM(AddVMRequest{Name: "vm1", Netns: vmNS.Path(), Queues: 2, SocketUID: &nobody, SocketGID: &nobody})
			if err != nil {
				t.Fatalf("add vm: %v", err)
			}
			ep := v.Endpoint
			eth0 := linkIn(t, vmNS, "eth0")
			if eth0 == nil {
				t.Fatal("no eth0 in the vm netns")
			}
			at := eth0.Attrs()
			if ep.IP.String() != "10.77.0.1" || ep.MAC != at.HardwareAddr.String() || ep.IfIndex != at.Index ||
				ep.VM.Queues != 2 || ep.VM.Socket != filepath.Join(vmDir, "vm1.sock") || !v.Serving {
				t.Fatalf("vm = %+v %+v, eth0 %s index %d", ep, ep.VM, at.HardwareAddr, at.Index)
			}
			if at.NumTxQueues != 2 || at.NumRxQueues != 2 {
				t.Fatalf("eth0 has %d tx / %d rx queues, want 2", at.NumTxQueues, at.NumRxQueues)
			}
			host := linkIn(t, fx.nodeNS, ep.HostIfName)
			if host == nil || host.Attrs().NumTxQueues != 2 || host.Attrs().NumRxQueues != 2 {
				t.Fatalf("host end %s: %+v", ep.HostIfName, host)
			}
			if fi, err := os.Stat(ep.VM.Socket); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
				t.Fatalf("socket %s: %v %v", ep.VM.Socket, fi, err)
			} else if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody || st.Gid != nobody {
				t.Fatalf("socket owned by %d:%d, want the backend's user %d", st.Uid, st.Gid, nobody)
			}
			// Traversable, not listable: each socket is private to its backend's user.
			if fi, err := os.Stat(vmDir); err != nil || fi.Mode().Perm() != 0o711 {
				t.Fatalf("socket dir: %v %v", fi, err)
			}
			// What the host end sends to the VM leaves with complete checksums.
			if err := fx.nodeNS.Do(func(ns.NetNS) error {
				on, err := netdev.TxChecksum(ep.HostIfName)
				if err == nil && on {
					err = fmt.Errorf("tx checksum offload is on")
				}
				return err
			}); err != nil {
				t.Fatalf("host end %s: %v", ep.HostIfName, err)
			}
			if gotRSS := fetchVM(t, ep.VM.Socket, "vm1", 2); gotRSS != (b.name == "bpf") {
				t.Fatalf("%s datapath: RSS map handed = %t", b.name, gotRSS)
			}
			fetchVM(t, ep.VM.Socket, "vm1", 2) // a reconnecting backend gets fresh sockets
			if _, _, err := xsk.Fetch(ep.VM.Socket, "vm2", 2*time.Second); err == nil {
				t.Fatal("the socket of vm1 served vm2")
			}
			checkVMInDatapath(t, a, b, ep.ID, ep.IfIndex, true)

			// Restart: a new agent on the same state (and pins) serves the VM again.
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			a = b.start(t, fx, vmDir)
			vms, err := a.ListVMs()
			if err != nil || len(vms) != 1 || vms[0].Endpoint.VM.Name != "vm1" || !vms[0].Serving || vms[0].Endpoint.ID != ep.ID {
				t.Fatalf("vms after restart = %+v %v", vms, err)
			}
			fetchVM(t, ep.VM.Socket, "vm1", 2)
			checkVMInDatapath(t, a, b, ep.ID, ep.IfIndex, true)

			existed, err := a.DelVM("vm1")
			if err != nil || !existed {
				t.Fatalf("del vm = %v %v", existed, err)
			}
			checkVMGone(t, fx, a, b, vmNS, ep.HostIfName, ep.VM.Socket, ep.ID, ep.IfIndex)
			if existed, err := a.DelVM("vm1"); err != nil || existed {
				t.Fatalf("second del = %v %v", existed, err)
			}

			// A VM whose netns vanishes (virt-launcher gone) is still deleted cleanly.
			gone := fmt.Sprintf("lk-t-vmgone-%s-%d", b.name, os.Getpid())
			if out, err := exec.Command("ip", "netns", "add", gone).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add: %v %s", err, out)
			}
			t.Cleanup(func() { exec.Command("ip", "netns", "del", gone).Run() })
			v, err = a.AddVM(AddVMRequest{Name: "vm2", Netns: "/run/netns/" + gone, Queues: 1})
			if err != nil {
				t.Fatalf("add vm2: %v", err)
			}
			checkVMInDatapath(t, a, b, v.Endpoint.ID, v.Endpoint.IfIndex, true)
			if out, err := exec.Command("ip", "netns", "del", gone).CombinedOutput(); err != nil {
				t.Fatalf("ip netns del: %v %s", err, out)
			}
			if existed, err := a.DelVM("vm2"); err != nil || !existed {
				t.Fatalf("del vm2 without its netns = %v %v", existed, err)
			}
			checkVMGone(t, fx, a, b, nil, v.Endpoint.HostIfName, v.Endpoint.VM.Socket, v.Endpoint.ID, v.Endpoint.IfIndex)

			// The netns vanishes while the agent is down: the restarted agent
			// drops the VM and cleans the datapath.
			if out, err := exec.Command("ip", "netns", "add", gone).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add: %v %s", err, out)
			}
			v, err = a.AddVM(AddVMRequest{Name: "vm3", Netns: "/run/netns/" + gone, Queues: 2})
			if err != nil {
				t.Fatalf("add vm3: %v", err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("ip", "netns", "del", gone).CombinedOutput(); err != nil {
				t.Fatalf("ip netns del: %v %s", err, out)
			}
			// Namespaces are torn down asynchronously: wait for the host end to go.
			for deadline := time.Now().Add(5 * time.Second); fx.hostLinkExists(t, v.Endpoint.HostIfName); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("host end of vm3 outlived its netns")
				}
			}
			a = b.start(t, fx, vmDir)
			checkVMGone(t, fx, a, b, nil, v.Endpoint.HostIfName, v.Endpoint.VM.Socket, v.Endpoint.ID, v.Endpoint.IfIndex)
		})
	}
}

// checkVMInDatapath checks the VM's registration (and for BPF its pinned link).
func checkVMInDatapath(t *testing.T, a *Agent, b vmBackend, id uint32, ifindex int, want bool) {
	t.Helper()
	ids, err := a.dp.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	has := false
	for _, i := range ids {
		has = has || i == id
	}
	if has != want {
		t.Fatalf("endpoint %d in the datapath = %v, want %v (%v)", id, has, want, ids)
	}
	if b.bpfDir == "" {
		vm, ok := a.dp.(*fakeDatapath).VM(id)
		if ok != want || ok && vm.IfIndex != ifindex {
			t.Fatalf("vm %d registered = %v %+v, want %v", id, ok, vm, want)
		}
		return
	}
	_, err = os.Stat(filepath.Join(b.bpfDir, fmt.Sprintf("lk_vm_%d", id)))
	if (err == nil) != want {
		t.Fatalf("pin lk_vm_%d present = %v, want %v", id, err == nil, want)
	}
}

func checkVMGone(t *testing.T, fx *fixture, a *Agent, b vmBackend, vmNS ns.NetNS, hostIf, sock string, id uint32, ifindex int) {
	t.Helper()
	checkVMInDatapath(t, a, b, id, ifindex, false)
	if b.bpfDir != "" {
		pins, _ := filepath.Glob(filepath.Join(b.bpfDir, "lk_vm_*"))
		if len(pins) != 0 {
			t.Fatalf("pins left: %v", pins)
		}
	} else if n := a.dp.(*fakeDatapath).SocketSlots(); n != 0 {
		t.Fatalf("%d socket slots left in the datapath", n)
	}
	if fx.hostLinkExists(t, hostIf) {
		t.Fatalf("host device %s left", hostIf)
	}
	if vmNS != nil && linkIn(t, vmNS, "eth0") != nil {
		t.Fatal("eth0 left in the vm netns")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket %s left: %v", sock, err)
	}
	if n := allocCount(t, a); n != 0 {
		t.Fatalf("%d addresses left", n)
	}
	if n := slotCount(t, a); n != 0 {
		t.Fatalf("%d socket slot ranges left in the store", n)
	}
	if vms, _ := a.ListVMs(); len(vms) != 0 {
		t.Fatalf("vms left: %+v", vms)
	}
}

func TestAddVMValidation(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a := fx.start(t, fake)
	defer a.Close()
	a.cfg.VMSocketDir = filepath.Join(fx.stateDir, "vm")
	vmNS := netnstest.New(t, "vmval")
	for _, tc := range []struct {
		name string
		req  AddVMRequest
		want error
	}{
		{"queues 0", AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 0}, ErrInvalid},
		{"queues 17", AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 17}, ErrInvalid},
		{"no name", AddVMRequest{Netns: vmNS.Path(), Queues: 1}, ErrInvalid},
		{"bad name", AddVMRequest{Name: "../x", Netns: vmNS.Path(), Queues: 1}, ErrInvalid},
		{"bad mac", AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 1, MAC: "nope"}, ErrInvalid},
		{"multicast mac", AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 1, MAC: "01:00:5e:00:00:01"}, ErrInvalid},
		{"mtu too big for a umem frame", AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 1, MTU: 9000}, ErrInvalid},
		{"no netns", AddVMRequest{Name: "v", Queues: 1}, ErrBadNetns},
		{"unknown netns", AddVMRequest{Name: "v", Netns: "/run/netns/lk-t-nope", Queues: 1}, ErrBadNetns},
		{"netns is a dir", AddVMRequest{Name: "v", Netns: fx.stateDir, Queues: 1}, ErrBadNetns},
	} {
		if _, err := a.AddVM(tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := allocCount(t, a); n != 0 {
		t.Fatalf("refused adds allocated %d addresses", n)
	}

	v, err := a.AddVM(AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 1, MAC: "02:11:22:33:44:55"})
	if err != nil {
		t.Fatal(err)
	}
	if v.Endpoint.MAC != "02:11:22:33:44:55" || linkIn(t, vmNS, "eth0").Attrs().HardwareAddr.String() != v.Endpoint.MAC {
		t.Fatalf("requested mac not on eth0: %+v", v.Endpoint)
	}
	if v.Endpoint.MTU != 1400 {
		t.Fatalf("mtu %d, want the agent's 1400", v.Endpoint.MTU)
	}
	other := netnstest.New(t, "vmval2")
	if _, err := a.AddVM(AddVMRequest{Name: "v", Netns: other.Path(), Queues: 1}); !errors.Is(err, ErrConflict) {
		t.Fatalf("duplicate name = %v, want ErrConflict", err)
	}
	if _, err := a.AddVM(AddVMRequest{Name: "v", Netns: vmNS.Path(), Queues: 1}); !errors.Is(err, ErrConflict) {
		t.Fatalf("duplicate name, same netns = %v, want ErrConflict", err)
	}
	// A VM is no CNI attachment: pod DEL refuses it and GC leaves it alone.
	if _, err := a.Del("vm:v", "eth0"); !errors.Is(err, ErrConflict) {
		t.Fatalf("pod del of a vm = %v, want ErrConflict", err)
	}
	if removed, err := a.GC(nil); err != nil || len(removed) != 0 {
		t.Fatalf("gc = %v %v, want the vm kept", removed, err)
	}
	if existed, err := a.DelVM("never-added"); err != nil || existed {
		t.Fatalf("del of an unknown vm = %v %v, want success", existed, err)
	}
	if _, err := a.DelVM("bad/name"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("del with a bad name = %v, want ErrInvalid", err)
	}
	if vms, err := a.ListVMs(); err != nil || len(vms) != 1 {
		t.Fatalf("vms = %+v %v", vms, err)
	}
	if eps, _ := a.List(); len(eps) != 1 || eps[0].Kind != "vm" {
		t.Fatalf("endpoints = %+v", eps)
	}
}

func TestAddVMUndoesOnFailure(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a := fx.start(t, fake)
	defer a.Close()
	a.cfg.VMSocketDir = filepath.Join(fx.stateDir, "vm")
	vmNS := netnstest.New(t, "vmundo")

	fake.failVM = errors.New("injected attach failure")
	_, err := a.AddVM(AddVMRequest{Name: "u", Netns: vmNS.Path(), Queues: 2})
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("add = %v, want the injected failure", err)
	}
	if fx.hostLinkExists(t, vmHostIf("u")) || linkIn(t, vmNS, "eth0") != nil {
		t.Fatal("failed add left its devices")
	}
	if n, s := allocCount(t, a), slotCount(t, a); n != 0 || s != 0 {
		t.Fatalf("failed add leaked %d addresses, %d slot ranges", n, s)
	}
	if ids, _ := fake.Endpoints(); len(ids) != 0 {
		t.Fatalf("failed add left datapath endpoints %v", ids)
	}
	if _, err := os.Stat(a.vmSocketPath("u")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed add left its socket: %v", err)
	}

	// A listen failure (the socket path is a directory) is undone too, after AttachVM.
	if err := os.MkdirAll(filepath.Join(a.vmSocketPath("u"), "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AddVM(AddVMRequest{Name: "u", Netns: vmNS.Path(), Queues: 2}); err == nil {
		t.Fatal("add with an unusable socket path succeeded")
	}
	if _, ok := fake.VM(1); ok {
		t.Fatal("failed add left the vm attached")
	}
	if n, s := allocCount(t, a), slotCount(t, a); n != 0 || s != 0 {
		t.Fatalf("failed add leaked %d addresses, %d slot ranges", n, s)
	}
	os.RemoveAll(a.vmSocketPath("u"))

	// Everything is free again: same id and slots; the address rotates on
	// (two failed adds reserved .1 and .2).
	v, err := a.AddVM(AddVMRequest{Name: "u", Netns: vmNS.Path(), Queues: 2})
	if err != nil || v.Endpoint.ID != 1 || v.Endpoint.IP.String() != "10.77.0.3" || v.Endpoint.VM.XSKBase != 0 {
		t.Fatalf("add after undo = %+v %v", v, err)
	}
	w, err := a.AddVM(AddVMRequest{Name: "w", Netns: netnstest.New(t, "vmundo2").Path(), Queues: 3})
	if err != nil || w.Endpoint.VM.XSKBase != 2 || w.Endpoint.IfIndex == v.Endpoint.IfIndex {
		t.Fatalf("second vm = %+v %v, want slots from 2 and its own ifindex", w, err)
	}
}
