package agent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestVMRxGSOKernelReceivesWholePackets drives the real agent (BPF datapath),
// the real lanekit-vhost and a guest driver that receives with GUEST_TSO4/6 +
// MRG_RXBUF (lanekit-rx-guest): a pod sends 64,000-byte TCP GSO packets to the
// VM. With --rx-gso kernel on both sides the VM's device runs no XDP program,
// so each packet crosses the veth whole, the backend's AF_PACKET socket takes
// it with its GSO header and the guest gets it as one packet: the backend's
// rx_gso_kernel counter moves by one per packet and its AF_XDP coalescer
// (rx_gro_frames) not at all. With --rx-gso xdp (the old path) the host end
// cuts each packet into MTU-sized frames that steer_vm redirects into the
// AF_XDP socket and the backend glues back: rx_gro_frames moves,
// rx_gso_kernel does not. Both families, every payload byte checked in the
// guest. In kernel mode the VM netns' own stack never sees the VM's frames:
// with the VM's address on its device it still does not answer a ping
// (vm_rx_drop at tcx ingress), and its IP InReceives does not move. With
// BIG TCP, a 150,000-byte IPv4 packet reaches the guest as three GSO packets
// (bigTCPReachesGuestInChunks).
func TestVMRxGSOKernelReceivesWholePackets(t *testing.T) {
	testutil.RequireBPFFS(t)
	vhost, guest := vmTestBins(t, "lanekit-rx-guest")
	const (
		pkts    = 8
		payload = 64_000
		mss     = 1340 // 1400 MTU
	)
	for _, mode := range []string{RxGSOKernel, RxGSOXDP} {
		t.Run(mode, func(t *testing.T) {
			// BIG TCP on: the pod device takes IPv4 GSO packets above 64 KiB.
			l := startVMLane(t, "rxgso-"+mode, func(c *Config) { c.RxGSO, c.DeviceMode, c.BIGTCP = mode, "veth", true }, vhost, "--rx-gso", mode)
			podNS, pod, vmNS, ep, sock, metrics := l.podNS, l.pod, l.vmNS, l.ep, l.sock, l.metrics
			scrapeOffload(t, metrics, "rx_gso_kernel") // the backend took its sockets
			if xdp := vmDeviceXDP(t, vmNS); xdp != (mode == RxGSOXDP) {
				t.Fatalf("rx-gso %s: XDP program on the VM's device: %t", mode, xdp)
			}

			for i, fam := range []struct {
				name     string
				src, dst netip.Addr
			}{{"ipv4", pod.IP, ep.IP}, {"ipv6", pod.IP6, ep.IP}} {
				if fam.name == "ipv6" {
					fam.dst = ep.IP6
				}
				kernelBefore, groBefore := scrapeOffload(t, metrics, "rx_gso_kernel"), scrapeOffload(t, metrics, "rx_gro_frames")
				framesBefore := sumVhost(t, metrics, "lanekit_vhost_rx_packets_total", "")
				got := rxGuestReceives(t, guest, sock, fam.name, pkts*payload, func() {
					sendGSO(t, podNS, pod.MAC, pod.HostMAC, fam.src, fam.dst, uint16(5001+i), pkts, payload, mss)
				})
				kernel := scrapeOffload(t, metrics, "rx_gso_kernel") - kernelBefore
				gro := scrapeOffload(t, metrics, "rx_gro_frames") - groBefore
				frames := sumVhost(t, metrics, "lanekit_vhost_rx_packets_total", "") - framesBefore
				t.Logf("%s %s: guest: %s; rx_gso_kernel +%d, rx_gro_frames +%d, rx packets +%d", mode, fam.name, got[len(got)-1], kernel, gro, frames)
				whole := 0
				for _, l := range got {
					if strings.HasPrefix(l, "packet gso_type=") && strings.Contains(l, fmt.Sprintf(" len=%d ", payload+map[bool]int{true: 54, false: 74}[fam.dst.Is4()])) {
						whole++
					}
				}
				if mode == RxGSOKernel {
					if kernel != pkts || gro != 0 || whole != pkts {
						t.Errorf("%s: rx_gso_kernel +%d, rx_gro_frames +%d, %d whole packets in the guest; want %d, 0, %d",
							fam.name, kernel, gro, whole, pkts, pkts)
					}
				} else if kernel != 0 || frames < pkts*(payload/mss) || gro == 0 {
					// Every wire frame came through AF_XDP; how many of them the
					// coalescer glued depends on how many buffers the guest had
					// posted when a batch arrived (rx_gro_split passes the rest
					// one by one), so only "some" is certain.
					t.Errorf("%s: rx_gso_kernel +%d, rx packets +%d, rx_gro_frames +%d; want 0, at least %d (AF_XDP frames), some coalesced",
						fam.name, kernel, frames, gro, pkts*(payload/mss))
				}
			}
			if mode == RxGSOKernel {
				bigTCPReachesGuestInChunks(t, l, guest, mss)
				checkRxSockets(t, metrics, 2*pkts)
				checkVMNetnsSilent(t, podNS, vmNS, ep.IP)
			}
		})
	}
}

// rxGuestReceives runs the rx guest on sock until it has received bytes of
// TCP payload (checked byte by byte), with send sending them, and returns its
// lines (one per packet: "packet gso_type=T len=N ...").
func rxGuestReceives(t *testing.T, guest, sock, name string, bytes int, send func()) []string {
	t.Helper()
	g := exec.Command(guest, "--socket", sock, "--bytes", strconv.Itoa(bytes), "--timeout-ms", "15000")
	out, err := g.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var gerr strings.Builder
	g.Stderr = &gerr
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		g.Wait()
		t.Fatalf("%s: rx guest did not start: %q %s", name, lines.Text(), gerr.String())
	}
	send()
	var got []string
	for lines.Scan() {
		got = append(got, lines.Text())
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("%s: rx guest: %v: %s\n%s", name, err, gerr.String(), strings.Join(got, "\n"))
	}
	return got
}

// bigTCPReachesGuestInChunks: with BIG TCP on the pod's device, a 150,000-byte
// GSO packet (IPv4: total length 0; IPv6: a jumbo hop-by-hop header, as the
// kernel builds them) crosses the VM's host end whole (the agent gives it the
// BIG TCP sizes: at 64 KiB its transmit would cut the packet into MSS-sized
// frames in software) and reaches the guest as three GSO packets of at most
// 64 KiB, every byte in order.
func bigTCPReachesGuestInChunks(t *testing.T, l *vmLane, guest string, mss int) {
	t.Helper()
	const pkts, payload = 2, 150_000
	for i, fam := range []struct {
		name     string
		src, dst netip.Addr
		gsoType  int
	}{{"ipv4", l.pod.IP, l.ep.IP, 1}, {"ipv6", l.pod.IP6, l.ep.IP6, 4}} {
		kernelBefore, chunksBefore := scrapeOffload(t, l.metrics, "rx_gso_kernel"), scrapeOffload(t, l.metrics, "rx_gso_kernel_chunks")
		got := rxGuestReceives(t, guest, l.sock, fam.name+" BIG TCP", pkts*payload, func() {
			sendGSO(t, l.podNS, l.pod.MAC, l.pod.HostMAC, fam.src, fam.dst, uint16(5009+i), pkts, payload, mss)
		})
		kernel := scrapeOffload(t, l.metrics, "rx_gso_kernel") - kernelBefore
		chunks := scrapeOffload(t, l.metrics, "rx_gso_kernel_chunks") - chunksBefore
		gso := 0
		for _, line := range got {
			if strings.HasPrefix(line, fmt.Sprintf("packet gso_type=%d ", fam.gsoType)) {
				gso++
			}
		}
		t.Logf("%s BIG TCP: guest: %s; rx_gso_kernel +%d, rx_gso_kernel_chunks +%d, %d GSO packets in the guest", fam.name, got[len(got)-1], kernel, chunks, gso)
		if kernel != pkts || chunks != 3*pkts || gso != 3*pkts {
			t.Errorf("%s BIG TCP: rx_gso_kernel +%d, rx_gso_kernel_chunks +%d, %d GSO packets in the guest; want %d, %d, %d",
				fam.name, kernel, chunks, gso, pkts, 3*pkts, 3*pkts)
		}
	}
}

// checkRxSockets reads the kernel's view of the backend's packet sockets (the
// ones the agent made): together they took at least want packets and dropped
// none (the guest kept buffers posted), and each has the receive buffer the
// agent forced (the kernel doubles SO_RCVBUFFORCE's value).
func checkRxSockets(t *testing.T, metrics string, want uint64) {
	t.Helper()
	var got uint64
	for _, v := range scrapeVhost(t, metrics, "lanekit_vhost_rx_socket_packets_total", "") {
		got += v
	}
	full := scrapeVhost(t, metrics, "lanekit_vhost_dropped_total", `reason="socket_full"`)
	bufs := scrapeVhost(t, metrics, "lanekit_vhost_rx_socket_rcvbuf_bytes", "")
	t.Logf("packet sockets: %d packets, socket_full %v, rcvbuf %v", got, full, bufs)
	if got < want {
		t.Errorf("packet sockets took %d packets, want at least %d", got, want)
	}
	if len(bufs) == 0 || len(full) != len(bufs) {
		t.Fatalf("rcvbuf of %d sockets, socket_full of %d", len(bufs), len(full))
	}
	for i := range bufs {
		if full[i] != 0 || bufs[i] != 2*rxGSORcvBufWant {
			t.Errorf("queue %d: socket_full %d, rcvbuf %d; want 0 and %d", i, full[i], bufs[i], 2*rxGSORcvBufWant)
		}
	}
}

// rxGSORcvBufWant is what xsk.OpenRxGSO forces.
const rxGSORcvBufWant = 8 << 20

// vmDeviceXDP reports whether the VM's device (eth0 in vmNS) runs an XDP program.
func vmDeviceXDP(t *testing.T, vmNS ns.NetNS) bool {
	t.Helper()
	var on bool
	if err := vmNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		on = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return on
}

// checkVMNetnsSilent gives the VM netns' device the VM's address and pings it
// from the pod: the netns stack must neither answer nor count the packets.
func checkVMNetnsSilent(t *testing.T, podNS, vmNS ns.NetNS, vmIP netip.Addr) {
	t.Helper()
	if err := vmNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		err = netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: vmIP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		if errors.Is(err, unix.EEXIST) {
			return nil // the netns has it already
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	before := ipInReceives(t, vmNS)
	replies := pingFrom(t, podNS, vmIP, 3)
	if after := ipInReceives(t, vmNS); replies != 0 || after != before {
		t.Errorf("the VM netns stack answered %d of 3 pings to %s and counted %d IP packets; want none", replies, vmIP, after-before)
	}
}

// ipInReceives is Ip InReceives of n (/proc/net/snmp of the calling thread).
func ipInReceives(t *testing.T, n ns.NetNS) uint64 {
	t.Helper()
	var v uint64
	if err := n.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp") // this thread is in n
		if err != nil {
			return err
		}
		var names []string
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || f[0] != "Ip:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i, name := range names {
				if name == "InReceives" {
					v, err = strconv.ParseUint(f[i], 10, 64)
					return err
				}
			}
		}
		return fmt.Errorf("no Ip InReceives in /proc/net/snmp")
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// pingFrom sends count ICMP echo requests from n to dst (200 ms apart) and
// counts the replies that arrive within a second of the last.
func pingFrom(t *testing.T, n ns.NetNS, dst netip.Addr, count int) int {
	t.Helper()
	var c net.PacketConn
	if err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for seq := 0; seq < count; seq++ {
		m := []byte{8, 0, 0, 0, 0x4c, 0x4b, 0, byte(seq), 'l', 'k'}
		binary.BigEndian.PutUint16(m[2:], ^csumFold(m))
		if _, err := c.WriteTo(m, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	replies := 0
	buf := make([]byte, 1500)
	c.SetReadDeadline(time.Now().Add(time.Second))
	for {
		k, from, err := c.ReadFrom(buf)
		if err != nil {
			return replies
		}
		if k >= 8 && buf[0] == 0 && from.String() == dst.String() && buf[4] == 0x4c && buf[5] == 0x4b {
			replies++
		}
	}
}

func csumFold(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// sendGSO sends count TCP GSO packets of payload bytes (gso_size mss) of one
// flow src -> dst:port out of the pod's eth0 through an AF_PACKET socket with
// PACKET_VNET_HDR, as a pod's TCP stack with TSO hands them to its device:
// NEEDS_CSUM with the pseudo-header sum in the checksum field. Sequence
// numbers from 1, payload byte k of the stream = k % 251.
func sendGSO(t *testing.T, n ns.NetNS, srcMAC, dstMAC string, src, dst netip.Addr, port uint16, count, payload, mss int) {
	t.Helper()
	smac, err1 := net.ParseMAC(srcMAC)
	dmac, err2 := net.ParseMAC(dstMAC)
	if err1 != nil || err2 != nil {
		t.Fatalf("sender MACs %q %q", srcMAC, dstMAC)
	}
	var fd int
	if err := n.Do(func(ns.NetNS) error {
		l, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: l.Index})
	}); err != nil {
		t.Fatalf("sender socket: %v", err)
	}
	defer unix.Close(fd)
	v4 := src.Is4()
	// IPv6 BIG TCP: a hop-by-hop header with the jumbo payload option, as
	// the kernel builds such packets (RFC 2675).
	jumbo := !v4 && 20+payload > 0xffff
	l3len := map[bool]int{true: 20, false: 40}[v4]
	if jumbo {
		l3len += 8
	}
	l4 := 14 + l3len
	for k := 0; k < count; k++ {
		f := make([]byte, 10+l4+20+payload)
		vh, e := f[:10], f[10:]
		vh[0] = 1 // NEEDS_CSUM
		vh[1] = map[bool]byte{true: 1, false: 4}[v4]
		binary.LittleEndian.PutUint16(vh[2:], uint16(l4+20))
		binary.LittleEndian.PutUint16(vh[4:], uint16(mss))
		binary.LittleEndian.PutUint16(vh[6:], uint16(l4))
		binary.LittleEndian.PutUint16(vh[8:], 16)
		copy(e[0:6], dmac)
		copy(e[6:12], smac)
		ip := e[14:]
		var pseudo []byte
		if v4 {
			binary.BigEndian.PutUint16(e[12:], unix.ETH_P_IP)
			ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
			if n := 20 + 20 + payload; n <= 0xffff {
				binary.BigEndian.PutUint16(ip[2:], uint16(n))
			} // else 0: a BIG TCP packet, its length is the skb's
			copy(ip[12:16], src.AsSlice())
			copy(ip[16:20], dst.AsSlice())
			binary.BigEndian.PutUint16(ip[10:], ^csumFold(ip[:20]))
			pseudo = append([]byte{}, ip[12:20]...)
		} else {
			binary.BigEndian.PutUint16(e[12:], unix.ETH_P_IPV6)
			ip[0], ip[6], ip[7] = 0x60, unix.IPPROTO_TCP, 64
			if jumbo {
				ip[6] = 0 // hop-by-hop; the payload length stays 0
				copy(ip[40:44], []byte{unix.IPPROTO_TCP, 0, 0xc2, 4})
				binary.BigEndian.PutUint32(ip[44:], uint32(8+20+payload))
			} else {
				binary.BigEndian.PutUint16(ip[4:], uint16(20+payload))
			}
			copy(ip[8:24], src.AsSlice())
			copy(ip[24:40], dst.AsSlice())
			pseudo = append([]byte{}, ip[8:40]...)
		}
		tcp := e[l4:]
		binary.BigEndian.PutUint16(tcp[0:], 40000)
		binary.BigEndian.PutUint16(tcp[2:], port)
		binary.BigEndian.PutUint32(tcp[4:], uint32(1+k*payload))
		tcp[12], tcp[13] = 5<<4, 0x18
		binary.BigEndian.PutUint16(tcp[14:], 0xffff)
		for j := range payload {
			tcp[20+j] = byte((k*payload + j) % 251)
		}
		pseudo = binary.BigEndian.AppendUint16(append(pseudo, 0, unix.IPPROTO_TCP), uint16(20+payload))
		binary.BigEndian.PutUint16(tcp[16:], csumFold(pseudo))
		if _, err := unix.Write(fd, f); err != nil {
			t.Fatalf("send gso packet %d: %v", k, err)
		}
	}
}
