package datapath

import (
	"bytes"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// vlanMarker is the payload of every probe frame, so that captures count
// only them.
var vlanMarker = []byte("lanekit-vlan-probe")

// TestLiveVLANTagged: a pod with CAP_NET_RAW writes 802.1Q-tagged IPv4 for a
// remote pod onto its eth0 (a packet socket: this kernel has no VLAN
// devices). On receive the kernel moves the tag into skb metadata before tc
// (skb_vlan_untag), where BPF_PROG_TEST_RUN cannot put it, so this runs live.
// The datapath must drop and count every frame, and nothing may reach the
// underlay. Tagged frames arriving from the underlay for a local pod go to
// the host stack, never into the pod.
func TestLiveVLANTagged(t *testing.T) {
	e := newLiveEnv(t)
	const frames = 20
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	link := func(ns netns.NsHandle, name string) (l netlink.Link) {
		e.in(t, ns, func() {
			var err error
			l, err = netlink.LinkByName(name)
			must("link "+name, err)
		})
		return l
	}
	// capture opens a packet socket on dev in ns; count() then returns how
	// many probe frames dev received (ICMP errors quoting a probe, going
	// out, are not counted) within a short window.
	capture := func(ns netns.NsHandle, dev string) (count func() int) {
		var fd int
		ifx := link(ns, dev).Attrs().Index
		e.in(t, ns, func() {
			var err error
			fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
			must("packet socket", err)
			must("bind", unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifx}))
		})
		t.Cleanup(func() { unix.Close(fd) })
		tv := unix.NsecToTimeval((300 * time.Millisecond).Nanoseconds())
		must("timeout", unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
		return func() int {
			n := 0
			buf := make([]byte, 2048)
			for {
				m, from, err := unix.Recvfrom(fd, buf, 0)
				if err != nil {
					return n
				}
				ll, ok := from.(*unix.SockaddrLinklayer)
				if ok && ll.Pkttype != unix.PACKET_OUTGOING && bytes.Contains(buf[:m], vlanMarker) {
					n++
				}
			}
		}
	}
	// sendTagged writes frames with an in-band 802.1Q tag (VID 100) on dev.
	sendTagged := func(ns netns.NsHandle, dev string, frame []byte) {
		ifx := link(ns, dev).Attrs().Index
		tagged := vlanTagged(frame, 0x8100)
		e.in(t, ns, func() {
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			must("packet socket", err)
			defer unix.Close(fd)
			to := &unix.SockaddrLinklayer{Ifindex: ifx, Halen: 6}
			copy(to.Addr[:], frame[0:6])
			for i := 0; i < frames; i++ {
				must("send", unix.Sendto(fd, tagged, 0, to))
			}
		})
	}

	t.Run("pod sends tagged frames: dropped and counted, none on the underlay", func(t *testing.T) {
		wire := capture(e.remote, "lk-lv-wire")
		before, err := e.dp.Counters(e.ep1.ID)
		must("counters", err)
		sendTagged(e.pod1, "eth0", testutil.UDPFrame(e.ep1.HostMAC, e.ep1.MAC, "10.244.1.10", "10.244.2.1", 64, vlanMarker))
		seen := wire()
		after, err := e.dp.Counters(e.ep1.ID)
		must("counters", err)
		if d := after.Drops[DropVLAN] - before.Drops[DropVLAN]; d != frames {
			t.Errorf("vlan-tagged drop counter grew by %d, want %d", d, frames)
		}
		if seen != 0 {
			t.Errorf("%d of %d tagged frames from the pod reached the underlay", seen, frames)
		}
	})

	t.Run("tagged frames from the underlay for a pod: host stack, not the pod", func(t *testing.T) {
		pod := capture(e.pod1, "eth0")
		upMAC := link(e.node, "lk-lv-up").Attrs().HardwareAddr
		wireMAC := link(e.remote, "lk-lv-wire").Attrs().HardwareAddr
		before, err := e.dp.Counters(e.ep1.ID)
		must("counters", err)
		sendTagged(e.remote, "lk-lv-wire", testutil.UDPFrame(upMAC, wireMAC, "10.244.2.1", "10.244.1.10", 64, vlanMarker))
		if n := pod(); n != 0 {
			t.Errorf("%d of %d frames sent tagged from the underlay entered the pod", n, frames)
		}
		after, err := e.dp.Counters(e.ep1.ID)
		must("counters", err)
		if after.ToPackets != before.ToPackets {
			t.Errorf("the datapath delivered %d tagged frames to the pod", after.ToPackets-before.ToPackets)
		}
	})

	// The same frames untagged do take the BPF path (the capture works).
	t.Run("control: untagged frames from the pod reach the underlay", func(t *testing.T) {
		wire := capture(e.remote, "lk-lv-wire")
		frame := testutil.UDPFrame(e.ep1.HostMAC, e.ep1.MAC, "10.244.1.10", "10.244.2.1", 64, vlanMarker)
		e.in(t, e.pod1, func() {
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			must("packet socket", err)
			defer unix.Close(fd)
			to := &unix.SockaddrLinklayer{Ifindex: link(e.pod1, "eth0").Attrs().Index, Halen: 6}
			copy(to.Addr[:], frame[0:6])
			for i := 0; i < frames; i++ {
				must("send", unix.Sendto(fd, frame, 0, to))
			}
		})
		if n := wire(); n != frames {
			t.Errorf("%d of %d untagged probe frames reached the underlay", n, frames)
		}
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
