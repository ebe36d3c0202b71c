package datapath

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
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
	e.in(t, e.node, func() {
		l, err := netlink.LinkByName("lk-lv-h1")
		must("h1", err)
		must("h1 mtu", netlink.LinkSetMTU(l, 9000))
	})
	e.in(t, e.pod1, func() {
		l, err := netlink.LinkByName("eth0")
		must("eth0", err)
		must("eth0 mtu", netlink.LinkSetMTU(l, 9000))
	})
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
