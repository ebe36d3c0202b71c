package datapath

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/xsk"
)

// TestMigrateFDMaps: an upgrade that changes the shape of lk_xsks (an
// XSKMAP holding a VM's AF_XDP socket) or of a tail-call program array
// (lk_pod6_progs holding programs) does not stop the datapath from loading:
// the kernel gives no fd back for their entries (an XSKMAP answers
// EOPNOTSUPP, a program array a program id), so they are recreated empty
// in the new shape, the loader installs its tail call again, and the agent
// is told lk_xsks was emptied (it restarts the VMs' backends, which fetch
// their sockets into it again).
func TestMigrateFDMaps(t *testing.T) {
	testutil.RequireBPFFS(t)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-migfd-%d", os.Getpid()))
	t.Cleanup(func() { Unpin(dir) })
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A VM's AF_XDP socket on a veth of a namespace of the test.
	node := netnstest.New(t, "migfd")
	var sock *xsk.Socket
	err := node.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lk-mf0"}, PeerName: "lk-mf1"}); err != nil {
			return err
		}
		for _, n := range []string{"lk-mf0", "lk-mf1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("lk-mf0")
		if err != nil {
			return err
		}
		sock, err = xsk.Open(l.Attrs().Index, 0, xsk.Sizes{FrameSize: 2048, FrameCount: 64, FillSize: 64, CompSize: 64, RxSize: 64, TxSize: 64})
		return err
	})
	if err != nil {
		t.Fatalf("AF_XDP socket: %v", err)
	}
	t.Cleanup(func() { sock.Close() })

	// The "older" agent's lk_xsks: 16 slots, the socket in slot 3.
	oldXsks, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lk_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer oldXsks.Close()
	if err := oldXsks.Put(uint32(3), uint32(sock.FD)); err != nil {
		t.Fatalf("socket into the old lk_xsks: %v", err)
	}
	// Its lk_pod6_progs: two slots, both holding a program.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	oldProgs, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lk_pod6_progs", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer oldProgs.Close()
	for i := range uint32(2) {
		if err := oldProgs.Put(i, prog); err != nil {
			t.Fatal(err)
		}
	}
	for name, m := range map[string]*ebpf.Map{"lk_xsks": oldXsks, "lk_pod6_progs": oldProgs} {
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	oldInfo, err := oldXsks.Info()
	if err != nil {
		t.Fatal(err)
	}
	oldID, _ := oldInfo.ID()

	l, err := Open(Config{PinDir: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("open over an lk_xsks and a program array of another shape: %v", err)
	}
	defer l.Close()
	if got := l.vm.LkXsks.MaxEntries(); got != 1024 {
		t.Errorf("lk_xsks has %d slots, want the new shape's 1024", got)
	}
	if info, err := l.vm.LkXsks.Info(); err != nil {
		t.Error(err)
	} else if id, _ := info.ID(); id == oldID {
		t.Errorf("lk_xsks is still the old map (id %d)", id)
	}
	if got := l.pod.LkPod6Progs.MaxEntries(); got != 1 {
		t.Errorf("lk_pod6_progs has %d slots, want 1", got)
	}
	// The loader installed from_pod6 into the new program array.
	var id uint32
	if err := l.pod.LkPod6Progs.Lookup(uint32(0), &id); err != nil {
		t.Fatalf("lk_pod6_progs slot 0: %v", err)
	}
	pi, err := l.pod.FromPod6.Info()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := pi.ID(); ebpf.ProgramID(id) != want {
		t.Errorf("lk_pod6_progs slot 0 holds program %d, want from_pod6 (%d)", id, want)
	}
	emptied := l.EmptiedMaps()
	for _, name := range []string{"lk_xsks", "lk_pod6_progs"} {
		if !slices.Contains(emptied, name) {
			t.Errorf("EmptiedMaps() = %v, missing %s: the agent would not refill it", emptied, name)
		}
	}
	// The new lk_xsks takes the VM's socket again (what a backend's fetch
	// does through SetVMSocket).
	if err := l.SetVMSocket(VM{ID: 1, Queues: 1, XSKBase: 3}, 0, sock.FD); err != nil {
		t.Errorf("socket into the new lk_xsks: %v", err)
	}
}
