package xsk_test

import (
	"encoding/binary"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/xsk"
)

// TestRxGSOSocketTakesWholePacketsForTheVMOnly: a veth whose peer runs no XDP
// program carries a 64,000-byte TCP GSO packet whole, and the VM device's
// receive socket (OpenRxGSO) gets it as ONE packet behind a virtio_net_hdr
// with its GSO type and size; a frame for another MAC, and what the VM netns
// sends out of the device itself, never reach it.
func TestRxGSOSocketTakesWholePacketsForTheVMOnly(t *testing.T) {
	testutil.RequireRoot(t)
	host, vm := newTestNS(t), newTestNS(t)
	var vmIdx int
	var vmMAC net.HardwareAddr
	hostIdx := vethToVM(t, host, vm, "lk-rx-h", 0)
	var rx, out int
	must(t, "vm side", testutil.InNetns(vm, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		vmIdx, vmMAC = l.Attrs().Index, l.Attrs().HardwareAddr
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if rx, err = xsk.OpenRxGSO(vmIdx, 7); err != nil {
			return err
		}
		// What the VM netns sends out of the device: through the stack's
		// transmit path, where the packet taps see it.
		if out, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Bind(out, &unix.SockaddrLinklayer{Ifindex: vmIdx})
	}))
	t.Cleanup(func() { unix.Close(rx); unix.Close(out) })
	var tx int
	must(t, "host side", testutil.InNetns(host, func() error {
		var err error
		if tx, err = xsk.OpenGSO(hostIdx); err != nil {
			return err
		}
		return nil
	}))
	t.Cleanup(func() { unix.Close(tx) })

	const payload, mss = 64_000, 1448
	frame := func(dst net.HardwareAddr, id byte) []byte {
		f := make([]byte, 10+54+payload)
		vh, e := f[:10], f[10:]
		vh[0], vh[1] = 1, 1 // NEEDS_CSUM, TCPV4
		binary.LittleEndian.PutUint16(vh[2:], 54)
		binary.LittleEndian.PutUint16(vh[4:], mss)
		binary.LittleEndian.PutUint16(vh[6:], 34)
		binary.LittleEndian.PutUint16(vh[8:], 16)
		copy(e, dst)
		copy(e[6:], []byte{2, 0, 0, 0, 0, id})
		binary.BigEndian.PutUint16(e[12:], unix.ETH_P_IP)
		ip := e[14:]
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
		binary.BigEndian.PutUint16(ip[2:], 40+payload)
		copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
		tcp := ip[20:]
		tcp[12], tcp[13] = 5<<4, 0x10
		return f
	}
	foreign := net.HardwareAddr{2, 9, 9, 9, 9, 9}
	for _, f := range [][]byte{frame(foreign, 1), frame(vmMAC, 2)} {
		if _, err := unix.Write(tx, f); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	if _, err := unix.Write(out, frame(foreign, 3)[10:10+54+100]); err != nil {
		t.Fatalf("send from the vm netns: %v", err)
	}
	buf := make([]byte, 1<<17)
	unix.SetsockoptTimeval(rx, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 300_000})
	var got [][]byte
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(rx, buf, 0)
		if err != nil {
			break
		}
		if n >= 10+14 && binary.BigEndian.Uint16(buf[10+12:]) == unix.ETH_P_IP {
			got = append(got, append([]byte(nil), buf[:n]...))
		}
	}
	if len(got) != 1 {
		t.Fatalf("received %d IPv4 packets, want 1 (the one for the VM's MAC)", len(got))
	}
	p := got[0]
	if len(p) != 10+54+payload || p[10+11] != 2 {
		t.Fatalf("received %d bytes from sender %d, want %d from 2 (whole)", len(p), p[10+11], 10+54+payload)
	}
	if p[1] != 1 || binary.LittleEndian.Uint16(p[4:]) != mss || p[0]&1 == 0 {
		t.Fatalf("virtio_net_hdr % x: want NEEDS_CSUM, GSO TCPV4, gso_size %d", p[:10], mss)
	}
}

// TestRxGSOFanoutFollowsTheRxQueue: the receive sockets of a 2-queue VM
// device, joined in queue order (AddRxGSO), each get exactly the frames the
// host end transmitted on their queue: the veth hands a frame to the peer's
// rx queue of the same index, and PACKET_FANOUT_QM picks member
// queue_mapping % members. (The datapath picks the host end's queue from the
// guest's RSS table or the flow hash; here the sender's CPU picks it: a
// PACKET_QDISC_BYPASS socket transmits on queue cpu % queues.)
func TestRxGSOFanoutFollowsTheRxQueue(t *testing.T) {
	testutil.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs to pick 2 tx queues")
	}
	host, vm := newTestNS(t), newTestNS(t)
	var vmMAC net.HardwareAddr
	hostIdx := vethToVM(t, host, vm, "lk-rxq-h", 2)
	socks := []*xsk.Socket{{FD: -1, UmemFD: -1, GSOFD: -1, RxGSOFD: -1}, {FD: -1, UmemFD: -1, GSOFD: -1, RxGSOFD: -1}}
	must(t, "vm side", testutil.InNetns(vm, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		vmMAC = l.Attrs().HardwareAddr
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return xsk.AddRxGSO(socks, l.Attrs().Index)
	}))
	t.Cleanup(func() { xsk.CloseAll(socks) })
	var tx int
	must(t, "host side", testutil.InNetns(host, func() error {
		var err error
		tx, err = xsk.OpenGSO(hostIdx)
		return err
	}))
	t.Cleanup(func() { unix.Close(tx) })
	for cpu := 0; cpu < 2; cpu++ {
		err := func() error {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return err
			}
			f := make([]byte, 10+60)
			e := f[10:]
			copy(e, vmMAC)
			copy(e[6:], []byte{2, 0, 0, 0, 0, byte(cpu)})
			binary.BigEndian.PutUint16(e[12:], 0x88b5) // local experimental EtherType
			_, err := unix.Write(tx, f)
			return err
		}()
		must(t, "send", err)
	}
	for q, s := range socks {
		buf := make([]byte, 2048)
		unix.SetsockoptTimeval(s.RxGSOFD, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 300_000})
		var from []byte
		for {
			n, _, err := unix.Recvfrom(s.RxGSOFD, buf, 0)
			if err != nil {
				break
			}
			if n >= 10+14 && binary.BigEndian.Uint16(buf[10+12:]) == 0x88b5 {
				from = append(from, buf[10+11])
			}
		}
		if len(from) != 1 || int(from[0]) != q {
			t.Errorf("queue %d's socket received frames sent on tx queues %v, want [%d]", q, from, q)
		}
	}
}
