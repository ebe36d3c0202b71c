package xsk_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/xsk"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestVMSteering: a pod sends to the VM's IP; the datapath delivers into the
// VM's device, the steering program redirects into the AF_XDP socket the
// agent created and handed over; frames the "VM" transmits reach the pod
// datapath (here: its ARP responder answers, back into the socket).
func TestVMSteering(t *testing.T) {
	testutil.RequireBPFFS(t)
	var node, pod, vm netns.NsHandle
	node, pod, vm = newTestNS(t), newTestNS(t), newTestNS(t)

	var hostPod, hostVM netlink.Link
	must(t, "node setup", testutil.InNetns(node, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		// A VM device has exactly one rx queue per VM queue pair: every
		// queue a frame can arrive on has a socket bound to it.
		mk := func(name string, peerNS netns.NsHandle) (netlink.Link, error) {
			attrs := netlink.LinkAttrs{Name: name, NumTxQueues: 1, NumRxQueues: 1}
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0"}); err != nil {
				return nil, err
			}
			p, err := netlink.LinkByName("eth0")
			if err != nil {
				return nil, err
			}
			if err := netlink.LinkSetNsFd(p, int(peerNS)); err != nil {
				return nil, err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return nil, err
			}
			if err := netdev.SetTxChecksum(name, false); err != nil { // as the agent does for VM devices
				return nil, err
			}
			return l, netlink.LinkSetUp(l)
		}
		var err error
		if hostPod, err = mk("lk-sv-hp", pod); err != nil {
			return err
		}
		hostVM, err = mk("lk-sv-hv", vm)
		return err
	}))
	var podMAC, vmMAC net.HardwareAddr
	var vmIfindex int
	must(t, "pod setup", testutil.InNetns(pod, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		podMAC = l.Attrs().HardwareAddr
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("10.244.1.10/32")
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		gw := datapath.DefaultGatewayIP.AsSlice()
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw})
	}))
	must(t, "vm setup", testutil.InNetns(vm, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		vmMAC, vmIfindex = l.Attrs().HardwareAddr, l.Attrs().Index
		return netlink.LinkSetUp(l)
	}))

	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-test-xsk-%d", os.Getpid()))
	t.Cleanup(func() { datapath.Unpin(pinDir) })
	var dp *datapath.Loader
	vmEP := datapath.Endpoint{ID: 7, Mode: datapath.ModeVeth, IfName: "lk-sv-hv", IfIndex: hostVM.Attrs().Index,
		IP: netip.MustParseAddr("10.244.1.50"), MAC: vmMAC, HostMAC: hostVM.Attrs().HardwareAddr, Queues: 1, VM: true}
	must(t, "open datapath", testutil.InNetns(node, func() error {
		var err error
		if dp, err = datapath.Open(datapath.Config{PinDir: pinDir}, nil); err != nil {
			return err
		}
		if err := dp.UpsertEndpoint(datapath.Endpoint{ID: 1, Mode: datapath.ModeVeth, IfName: "lk-sv-hp", IfIndex: hostPod.Attrs().Index,
			IP: netip.MustParseAddr("10.244.1.10"), MAC: podMAC, HostMAC: hostPod.Attrs().HardwareAddr}); err != nil {
			return err
		}
		return dp.UpsertEndpoint(vmEP)
	}))
	t.Cleanup(func() { dp.Close() })
	dvm := datapath.VM{ID: 7, IfIndex: vmIfindex, MAC: vmMAC, Queues: 1, XSKBase: 0}
	must(t, "attach vm", testutil.InNetns(vm, func() error { return dp.AttachVM(dvm) }))

	sock := filepath.Join(t.TempDir(), "vm1.xsk.sock")
	sizes := xsk.Sizes{FrameSize: 2048, FrameCount: 256, FillSize: 128, CompSize: 128, RxSize: 128, TxSize: 128}
	srv, err := xsk.Listen(sock, "vm1", func(req xsk.Request) ([]*xsk.Socket, error) {
		var socks []*xsk.Socket
		err := testutil.InNetns(vm, func() error {
			var err error
			if socks, err = xsk.OpenQueues(vmIfindex, dvm.Queues, sizes); err != nil {
				return err
			}
			for q, s := range socks {
				if err := dp.SetVMSocket(dvm, q, s.FD); err != nil {
					xsk.CloseAll(socks)
					return err
				}
			}
			return nil
		})
		return socks, err
	}, nil)
	must(t, "listen", err)
	t.Cleanup(func() { srv.Close() })
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket file mode: %v %v", st.Mode(), err)
	}

	// Protocol errors are answered, not fatal to the server.
	if _, _, err := xsk.Fetch(sock, "other-vm", 2*time.Second); err == nil {
		t.Fatal("fetch for the wrong vm succeeded")
	}
	offer, fds, err := xsk.Fetch(sock, "vm1", 5*time.Second)
	must(t, "fetch", err)
	if len(offer.Queues) != 1 || offer.Queues[0].FrameSize != 2048 {
		t.Fatalf("offer %+v", offer)
	}
	q0 := offer.Queues[0]
	be, err := newTestBackend(fds[0], fds[1], q0.UmemSize, q0.FrameSize, q0.FrameCount, q0.RxSize)
	must(t, "map rings", err)
	t.Cleanup(func() {
		be.close()
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	be.fillFrames(64)

	waitFrame := func(match func([]byte) bool) []byte {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			for _, f := range be.recv() {
				if match(f) {
					return f
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}

	// pod -> VM
	payload := []byte("hello vm over af_xdp")
	must(t, "pod send", testutil.InNetns(pod, func() error {
		c, err := net.Dial("udp4", "10.244.1.50:9999")
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < 3; i++ { // the first may wait on the gateway's ARP
			if _, err := c.Write(payload); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}))
	f := waitFrame(func(f []byte) bool { return len(f) > 42 && bytes.Equal(f[30:34], []byte{10, 244, 1, 50}) })
	if f == nil {
		c, _ := dp.Counters(7)
		t.Fatalf("no frame for the VM arrived on its AF_XDP socket (VM endpoint counters %+v)", c)
	}
	if !bytes.Equal(f[0:6], vmMAC) || !bytes.Equal(f[42:], payload) {
		t.Fatalf("frame for the VM is wrong: %x", f)
	}
	// A guest without checksum offload drops a frame whose checksum the
	// sender left to "hardware" (CHECKSUM_PARTIAL): it must arrive complete.
	if !testutil.L4ChecksumValid(f) {
		t.Fatalf("UDP checksum of the frame for the VM is not complete: %x", f[34:42])
	}

	// VM -> datapath: an ARP request for the gateway is answered into the VM.
	gw := datapath.DefaultGatewayIP.String()
	must(t, "vm send", be.send(testutil.ARPFrame(1, vmMAC, "10.244.1.50", make(net.HardwareAddr, 6), gw)))
	reply := waitFrame(func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2
	})
	if reply == nil {
		c, _ := dp.Counters(7)
		t.Fatalf("the VM's ARP request for its gateway got no reply (VM endpoint counters %+v)", c)
	}
	if !bytes.Equal(reply[22:28], hostVM.Attrs().HardwareAddr) {
		t.Fatalf("ARP reply names %x, want the host-side MAC %s", reply[22:28], hostVM.Attrs().HardwareAddr)
	}

	// Backend gone: its sockets close, frames for the VM are dropped and counted.
	be.close()
	for _, fd := range fds {
		unix.Close(fd)
	}
	fds = nil
	before, _ := dp.Counters(7)
	must(t, "pod send", testutil.InNetns(pod, func() error {
		c, err := net.Dial("udp4", "10.244.1.50:9999")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	}))
	deadline := time.Now().Add(2 * time.Second)
	for {
		after, _ := dp.Counters(7)
		if after.Drops[datapath.DropNoSocket] > before.Drops[datapath.DropNoSocket] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no vm-socket-missing drop counted: %+v", after)
		}
		time.Sleep(20 * time.Millisecond)
	}

	must(t, "detach", testutil.InNetns(vm, func() error { return dp.DetachVM(dvm) }))
	must(t, "detach again", testutil.InNetns(vm, func() error { return dp.DetachVM(dvm) }))
}
