package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// TestVMGuestTSOLeavesAsOneGSOPacket drives the real agent (BPF datapath),
// the real lanekit-vhost (sockets handed over by the agent) and a guest
// driver (lanekit-tso-guest) that transmits 64,000-byte TCP TSO segments to
// a pod, as a Linux guest with HOST_TSO4/6 does. With --tx-gso kernel (the
// default) each segment leaves the backend as ONE GSO packet through the
// queue's AF_PACKET socket: tcx from_pod counts one packet per segment on the
// VM's endpoint, the backend's tx_gso_kernel counter moves, and the pod
// receives every byte in order. With --tx-gso software the backend cuts each
// segment into MSS-sized AF_XDP frames: from_pod counts every one of them.
// Both families; a segment from a spoofed source is dropped by from_pod whole.
func TestVMGuestTSOLeavesAsOneGSOPacket(t *testing.T) {
	testutil.RequireBPFFS(t)
	vhost, guest := vmTestBins(t, "lanekit-tso-guest")
	const (
		segs    = 8
		payload = 64_000
		mss     = 1340 // 1400 MTU: 1340 + 40 (IPv6) + 20 = 1400
	)
	frames := (payload + mss - 1) / mss
	for _, mode := range []string{TxGSOKernel, TxGSOSoftware} {
		t.Run(mode, func(t *testing.T) {
			l := startVMLane(t, "gso-"+mode, func(c *Config) { c.TxGSO = mode }, vhost)
			dp, rcvNS, rcv, ep, sock, metrics := l.dp, l.podNS, l.pod, l.ep, l.sock, l.metrics

			for _, fam := range []struct {
				name     string
				src, dst netip.Addr
			}{{"ipv4", ep.IP, rcv.IP}, {"ipv6", ep.IP6, rcv.IP6}} {
				before, err := dp.Counters(ep.ID)
				if err != nil {
					t.Fatal(err)
				}
				kernelBefore := scrapeOffload(t, metrics, "tx_gso_kernel")
				capFD := captureTCP(t, rcvNS)
				port := uint16(5001)
				out, err := exec.Command(guest, "--socket", sock, "--src-mac", ep.MAC, "--dst-mac", ep.HostMAC,
					"--src", netip.AddrPortFrom(fam.src, 40000).String(), "--dst", netip.AddrPortFrom(fam.dst, port).String(),
					"--count", strconv.Itoa(segs), "--payload", strconv.Itoa(payload), "--mss", strconv.Itoa(mss)).CombinedOutput()
				if err != nil {
					t.Fatalf("%s: tso guest: %v: %s", fam.name, err, out)
				}
				got, pkts := readStream(t, capFD, fam.dst, port, segs*payload)
				for k, b := range got {
					if b != byte(k%251) {
						t.Fatalf("%s: the pod received byte %d = %d, want %d", fam.name, k, b, k%251)
					}
				}
				after, err := dp.Counters(ep.ID)
				if err != nil {
					t.Fatal(err)
				}
				from := after.FromPackets - before.FromPackets
				kernel := scrapeOffload(t, metrics, "tx_gso_kernel") - kernelBefore
				t.Logf("%s %s: from_pod counted %d packets (%d bytes) for %d TSO segments; pod got %d packets; tx_gso_kernel +%d",
					mode, fam.name, from, after.FromBytes-before.FromBytes, segs, pkts, kernel)
				want, wantKernel := uint64(segs), uint64(segs)
				if mode == TxGSOSoftware {
					want, wantKernel = uint64(segs*frames), 0
				}
				// A few more may be the guest's ARP/ND; never a segment's worth.
				if from < want || from > want+4 {
					t.Errorf("%s: from_pod counted %d packets from the VM, want %d (%d segments of %d frames, tx-gso %s)",
						fam.name, from, want, segs, frames, mode)
				}
				if kernel != wantKernel {
					t.Errorf("%s: tx_gso_kernel moved by %d, want %d", fam.name, kernel, wantKernel)
				}
			}

			// The VM's identity holds on the GSO path: a segment from an address
			// that is not the VM's leaves the backend (its headers are valid) and
			// from_pod drops it whole as spoofed: one drop, not one per frame.
			before, err := dp.Counters(ep.ID)
			if err != nil {
				t.Fatal(err)
			}
			kernelBefore := scrapeOffload(t, metrics, "tx_gso_kernel")
			spoofed := netip.AddrPortFrom(netip.MustParseAddr("10.77.0.13"), 40000)
			if out, err := exec.Command(guest, "--socket", sock, "--src-mac", ep.MAC, "--dst-mac", ep.HostMAC,
				"--src", spoofed.String(), "--dst", netip.AddrPortFrom(rcv.IP, 5002).String(),
				"--count", "1", "--payload", strconv.Itoa(payload), "--mss", strconv.Itoa(mss)).CombinedOutput(); err != nil {
				t.Fatalf("spoofed: tso guest: %v: %s", err, out)
			}
			want, wantKernel := uint64(1), uint64(1)
			if mode == TxGSOSoftware {
				want, wantKernel = uint64(frames), 0
			}
			var drops uint64
			waitUntil(t, "the spoofed segment's drops", func() bool {
				after, err := dp.Counters(ep.ID)
				drops = after.Drops[datapath.DropSpoofedIP] - before.Drops[datapath.DropSpoofedIP]
				return err == nil && drops >= want
			})
			if kernel := scrapeOffload(t, metrics, "tx_gso_kernel") - kernelBefore; drops != want || kernel != wantKernel {
				t.Errorf("spoofed segment: %d spoofed-IP drops, tx_gso_kernel +%d; want %d and %d", drops, kernel, want, wantKernel)
			}
		})
	}
}

// captureTCP opens a packet socket on eth0 of n that sees every IP packet
// the pod receives (a GSO packet whole).
func captureTCP(t *testing.T, n ns.NetNS) int {
	t.Helper()
	var fd int
	if err := n.Do(func(ns.NetNS) error {
		l, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Index})
	}); err != nil {
		t.Fatalf("capture socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// readStream reads TCP packets to dst:port from the capture until want
// payload bytes arrived (or 10 s passed) and returns the stream they carry
// (placed by sequence number from 1) and how many packets carried it.
func readStream(t *testing.T, fd int, dst netip.Addr, port uint16, want int) ([]byte, int) {
	t.Helper()
	stream := make([]byte, want)
	have, pkts := 0, 0
	buf := make([]byte, 1<<17)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000})
	for deadline := time.Now().Add(10 * time.Second); have < want && time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		p := buf[:n]
		var l4 int
		var d netip.Addr
		switch {
		case dst.Is4() && n >= 20 && p[0]>>4 == 4 && p[9] == unix.IPPROTO_TCP:
			l4, d = int(p[0]&0xf)*4, netip.AddrFrom4([4]byte(p[16:20]))
		case dst.Is6() && n >= 40 && p[0]>>4 == 6 && p[6] == unix.IPPROTO_TCP:
			l4, d = 40, netip.AddrFrom16([16]byte(p[24:40]))
		default:
			continue
		}
		if d != dst || n < l4+20 || binary.BigEndian.Uint16(p[l4+2:]) != port {
			continue
		}
		seq := int(binary.BigEndian.Uint32(p[l4+4:])) - 1
		data := p[l4+int(p[l4+12]>>4)*4:]
		if seq < 0 || seq+len(data) > want {
			t.Fatalf("segment at %d of %d bytes outside the %d sent", seq, len(data), want)
		}
		copy(stream[seq:], data)
		have += len(data)
		pkts++
	}
	if have != want {
		t.Fatalf("the pod received %d of %d bytes to %s port %d in %d packets", have, want, dst, port, pkts)
	}
	return stream, pkts
}

// scrapeOffload reads lanekit_vhost_offloads_total{kind=kind} from the backend's
// metrics on a unix socket (summed over queues).
func scrapeOffload(t *testing.T, sock, kind string) uint64 {
	t.Helper()
	return sumVhost(t, sock, "lanekit_vhost_offloads_total", `kind="`+kind+`"`)
}

// sumVhost is the sum over the queues of the backend's metric name (samples
// whose labels contain label; "": all).
func sumVhost(t *testing.T, sock, name, label string) uint64 {
	t.Helper()
	var sum uint64
	for _, v := range scrapeVhost(t, sock, name, label) {
		sum += v
	}
	return sum
}

// scrapeVhost reads every sample of the backend's metric name whose labels
// contain label (one per queue, in order) from its metrics on a unix socket.
func scrapeVhost(t *testing.T, sock, name, label string) []uint64 {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	var resp *http.Response
	waitUntil(t, "the backend's metrics", func() bool {
		var err error
		resp, err = c.Get("http://vhost/metrics")
		return err == nil
	})
	defer resp.Body.Close()
	var vals []uint64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		vals = append(vals, uint64(v))
	}
	return vals
}
