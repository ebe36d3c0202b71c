package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestLiveFragNeeded: a pod whose device MTU (9000) is larger than the
// uplink's (1500) sends a 3000-byte datagram with DF set. The datapath must
// not push it at the smaller device (where it would vanish): it hands it to
// the host stack, which answers with ICMP fragmentation needed, and the
// pod's path MTU to the destination drops to 1500.
func TestLiveFragNeeded(t *testing.T) {
	e := newLiveEnv(t)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	e.jumboPod1(t)
	// The remote counts datagrams of the probe's size that arrive.
	var ln *net.UDPConn
	e.in(t, e.remote, func() {
		var err error
		ln, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.244.2.1"), Port: 9})
		must("listen", err)
	})
	defer ln.Close()

	before, err := e.dp.Counters(e.ep1.ID)
	must("counters", err)
	var c *net.UDPConn
	e.in(t, e.pod1, func() {
		var err error
		c, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP("10.244.2.1"), Port: 9})
		must("dial", err)
	})
	defer c.Close()
	raw, err := c.SyscallConn()
	must("raw conn", err)
	sockopt := func(f func(fd int) error) {
		t.Helper()
		var ferr error
		must("control", raw.Control(func(fd uintptr) { ferr = f(int(fd)) }))
		must("sockopt", ferr)
	}
	sockopt(func(fd int) error {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	})
	probe := bytes.Repeat([]byte{0x5a}, 3000-28)
	if _, err := c.Write(probe); err != nil {
		t.Fatalf("first 3000-byte datagram (route MTU 9000) refused: %v", err)
	}
	mtu := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		sockopt(func(fd int) error {
			var err error
			mtu, err = unix.GetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU)
			return err
		})
		if mtu == 1500 {
			break
		}
	}
	if mtu != 1500 {
		t.Errorf("path MTU to the remote pod is %d after a DF datagram too big for the uplink, want 1500 (no ICMP fragmentation needed came back)", mtu)
	}
	after, err := e.dp.Counters(e.ep1.ID)
	must("counters", err)
	if after.StackPackets == before.StackPackets {
		t.Errorf("the oversize datagram was not handed to the host stack (to-stack counter unchanged)")
	}
	ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	buf := make([]byte, 9000)
	if n, err := ln.Read(buf); err == nil {
		t.Errorf("a %d-byte datagram with DF crossed a 1500-byte link", n)
	}
}

// TestLiveTSOSegmentsOverMTU: a pod with MTU 9000 sends bulk TCP to a jumbo
// peer across the node's 1500-byte uplink. Its first TSO packets carry ~9000-byte segments: the
// datapath must judge them by their segments (too big), hand them to the
// host stack (ICMP fragmentation needed), and once the pod's path MTU is
// 1500 its TSO packets fit and take the BPF path. A check on the total
// length instead would send every TSO packet to the stack; no check would
// push 9000-byte segments at a 1500-byte link.
func TestLiveTSOSegmentsOverMTU(t *testing.T) {
	e := newLiveEnv(t)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	e.jumboPod1(t)
	// The remote end is jumbo too, so it advertises a ~9000-byte MSS: only
	// the node's uplink hop is 1500 (TCP's MSS exchange cannot see it).
	var ln net.Listener
	e.in(t, e.remote, func() {
		l, err := netlink.LinkByName("lk-lv-wire")
		must("wire", err)
		must("wire mtu", netlink.LinkSetMTU(l, 9000))
		ln, err = net.Listen("tcp4", "10.244.2.1:0")
		must("listen", err)
	})
	defer ln.Close()
	const total = 32 << 20
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		var n int64
		buf := make([]byte, 1<<16)
		for {
			m, err := c.Read(buf)
			n += int64(m)
			if err != nil {
				got <- n
				return
			}
		}
	}()
	// What crosses the uplink, as the remote end receives it: the largest
	// IP packet a TSO packet's segments will be (from its GSO header).
	maxSeg := captureMaxSegment(t, e, "lk-lv-wire", net.ParseIP("10.244.1.10").To4())
	before, err := e.dp.Counters(e.ep1.ID)
	must("counters", err)
	var c net.Conn
	e.in(t, e.pod1, func() {
		c, err = net.DialTimeout("tcp4", ln.Addr().String(), 3*time.Second)
		must("dial", err)
	})
	c.SetDeadline(time.Now().Add(20 * time.Second))
	chunk := bytes.Repeat([]byte{0x5a}, 1<<20)
	for sent := 0; sent < total; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("send after %d bytes: %v", sent, err)
		}
	}
	mtu := 0
	raw, err := c.(*net.TCPConn).SyscallConn()
	must("raw conn", err)
	must("control", raw.Control(func(fd uintptr) { mtu, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU) }))
	must("IP_MTU", err)
	c.Close()
	if n := <-got; n != total {
		t.Fatalf("remote received %d of %d bytes", n, total)
	}
	after, err := e.dp.Counters(e.ep1.ID)
	must("counters", err)
	from, stack := after.FromPackets-before.FromPackets, after.StackPackets-before.StackPackets
	time.Sleep(100 * time.Millisecond) // the capture drains
	t.Logf("pod sent %d packets through the datapath, %d of them to the host stack; path MTU %d", from, stack, mtu)
	if mtu != 1500 {
		t.Errorf("path MTU %d, want 1500: the oversize segments never reached the stack's ICMP", mtu)
	}
	if stack == 0 {
		t.Errorf("no packet went to the host stack: 9000-byte segments were pushed at a 1500-byte link")
	}
	m := maxSeg()
	t.Logf("largest IP segment across the uplink: %d bytes", m)
	switch {
	case m == 0:
		t.Errorf("the capture on the remote end saw no TCP data")
	case m > 1500:
		t.Errorf("%d-byte IP segments crossed the 1500-byte uplink", m)
	}
	if float64(stack) > 0.02*float64(from) {
		t.Errorf("%d of %d packets went to the host stack: once the path MTU is known TSO packets must take the BPF path", stack, from)
	}
}

// captureMaxSegment captures (with virtio-net headers, which carry a GSO
// packet's segment size) what dev in the remote netns receives from src;
// the returned function stops and reports the largest IP packet seen or
// implied by a GSO packet's segments.
func captureMaxSegment(t *testing.T, e *liveEnv, dev string, src net.IP) func() int {
	t.Helper()
	var fd, ifx int
	e.in(t, e.remote, func() {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		ifx = l.Attrs().Index
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_IP))); err != nil {
			t.Fatal(err)
		}
	})
	for _, o := range [][2]int{{unix.SOL_PACKET, unix.PACKET_VNET_HDR}} {
		if err := unix.SetsockoptInt(fd, o[0], o[1], 1); err != nil {
			t.Fatalf("PACKET_VNET_HDR: %v", err)
		}
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifx}); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	stop := make(chan struct{})
	res := make(chan int, 1)
	go func() {
		defer unix.Close(fd)
		maxSeg := 0
		buf := make([]byte, 256) // headers only: the rest is truncated
		for {
			select {
			case <-stop:
				res <- maxSeg
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			ll, ok := from.(*unix.SockaddrLinklayer)
			if err != nil || !ok || ll.Pkttype == unix.PACKET_OUTGOING || n < 10+14+20 {
				continue
			}
			// struct virtio_net_hdr: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
			gsoSize := int(binary.LittleEndian.Uint16(buf[4:]))
			ip := buf[10+14 : n]
			if !bytes.Equal(ip[12:16], src) {
				continue
			}
			seg := int(binary.BigEndian.Uint16(ip[2:]))
			ihl := int(ip[0]&0xf) * 4
			if gsoSize > 0 && ip[9] == 6 && len(ip) >= ihl+13 {
				seg = ihl + int(ip[ihl+12]>>4)*4 + gsoSize
			}
			maxSeg = max(maxSeg, seg)
		}
	}()
	return func() int {
		close(stop)
		return <-res
	}
}

// jumboPod1 sets pod1's link (both ends: lk-lv-h1 on the node, eth0 in the
// pod) to MTU 9000; the node's uplink stays at 1500.
func (e *liveEnv) jumboPod1(t *testing.T) {
	t.Helper()
	for _, l := range []struct {
		ns   netns.NsHandle
		name string
	}{{e.node, "lk-lv-h1"}, {e.pod1, "eth0"}} {
		e.in(t, l.ns, func() {
			link, err := netlink.LinkByName(l.name)
			if err != nil {
				t.Fatalf("%s: %v", l.name, err)
			}
			if err := netlink.LinkSetMTU(link, 9000); err != nil {
				t.Fatalf("%s mtu: %v", l.name, err)
			}
		})
	}
}
