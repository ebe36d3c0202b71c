package lab

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/internal/unixhttp"
	"github.com/lanekit/lanekit/pkg/guest"
)

// vmChecksums: the guest's TCP checksums that lanekit-vhost leaves to the
// kernel (AF_XDP TX metadata, CHECKSUM_PARTIAL) are right where they arrive:
// the guest sends to a pod on another node, to one on its own node and to a
// Service VIP (DNAT by the agent's BPF on the VM's device, with its own
// checksum updates) whose backend is on another node. On the receiving pod's
// eth0 a capture checks every data segment: complete ones must verify, ones
// still CHECKSUM_PARTIAL (TP_STATUS_CSUMNOTREADY: nothing on a veth path
// computes them) must carry exactly the pseudo-header sum of their final
// addresses and length, which is what the kernel completes when a device
// without checksum offload sends them; nstat's TcpInCsumErrors must not move
// and the transfer must complete. The backend's offload counter proves the
// path: its checksums went to the kernel, not computed in user space.
func vmChecksums(t *testing.T, ctx context.Context, bins Bins, vm LabVM, con *guest.Console) {
	pod1, pod2 := PodNS(1, 1, KindLanekit), PodNS(2, 1, KindLanekit)
	ip1, ip2 := podIP(ctx, pod1), podIP(ctx, pod2)
	svc := writeTemp(t, "svc.yaml", e2eService(ip1))
	for _, node := range []int{1, 2} {
		out, err := exec.CommandContext(ctx, filepath.Join(bins.Dir, "lanekit"), "service", "apply", "-f", svc,
			"--socket", AgentSocket(node)).CombinedOutput()
		if err != nil {
			t.Fatalf("service apply on node %d: %v\n%s", node, err, out)
		}
	}
	for _, c := range []struct {
		name, pod, dst string
		port, dport    int
	}{
		{"VM to pod across nodes", pod1, ip1, 5301, 5301},
		{"VM to pod on its node", pod2, ip2, 5302, 5302},
		{"VM to Service VIP, backend across nodes", pod1, e2eVIP, 8080, 80},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := nsCommand(ctx, c.pod, "timeout", "40", "iperf3", "-s", "-1", "-p", strconv.Itoa(c.port))
			if err := srv.Start(); err != nil {
				t.Fatalf("iperf3 server in %s: %v", c.pod, err)
			}
			defer func() { srv.Process.Kill(); srv.Wait() }()
			fd, err := openCapture(c.pod, PodIfName)
			if err != nil {
				t.Fatalf("capture in %s: %v", c.pod, err)
			}
			defer unix.Close(fd)
			errs0 := tcpCsumErrors(t, ctx, c.pod)
			kinds := []string{"tx_csum", "tx_gso", "tx_csum_kernel", "tx_gso_kernel"}
			off0 := map[string]uint64{}
			for _, k := range kinds {
				off0[k] = backendOffload(t, ctx, vm.MetricsSocket, k)
			}
			var res captureResult
			var wg sync.WaitGroup
			stop := make(chan struct{})
			wg.Add(1)
			go func() { defer wg.Done(); res = captureTCP(fd, uint16(c.port), stop) }()
			var out string
			var code int
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
				cmd := fmt.Sprintf("iperf3 -c %s -p %d -t 2 -f m 2>&1 | tail -4", c.dst, c.dport)
				if out, code, err = con.Run(ctx, cmd); err == nil && code == 0 && strings.Contains(out, "receiver") {
					break
				}
			}
			close(stop)
			wg.Wait()
			if !strings.Contains(out, "receiver") {
				t.Fatalf("iperf3 in the guest to %s:%d: %v (exit %d)\n%s", c.dst, c.dport, err, code, out)
			}
			t.Logf("guest iperf3: %s; capture: %+v", strings.Join(strings.Fields(lastLine(out, "receiver")), " "), res)
			if d := tcpCsumErrors(t, ctx, c.pod) - errs0; d != 0 {
				t.Errorf("TcpInCsumErrors grew by %d in %s", d, c.pod)
			}
			if all := res.bad + res.partial + res.complete; res.bad != 0 || all < 100 {
				t.Errorf("capture: %d segments with a wrong checksum of %d (%d right and partial); want 0 of >= 100",
					res.bad, all, res.partial)
			}
			// The guest's checksum requests (frames with NEEDS_CSUM, TSO
			// chains) reach the kernel unfilled: frames and the segments the
			// backend cuts through AF_XDP TX metadata (tx_csum_kernel), whole
			// chains as one GSO packet (tx_gso_kernel, --tx-gso kernel).
			d := map[string]uint64{}
			for _, k := range kinds {
				d[k] = backendOffload(t, ctx, vm.MetricsSocket, k) - off0[k]
			}
			t.Logf("lanekit-vhost: %+v", d)
			if reqs, kernel := d["tx_csum"]+d["tx_gso"], d["tx_csum_kernel"]+d["tx_gso_kernel"]; reqs == 0 || kernel < reqs/2 {
				t.Errorf("lanekit-vhost left %d of the guest's %d checksum requests (frames and TSO chains) to the kernel: computed in user space",
					kernel, reqs)
			}
		})
	}
}

func lastLine(s, with string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, with) {
			return l
		}
	}
	return ""
}

// tcpCsumErrors reads TcpInCsumErrors in a namespace (nstat's absolute value).
func tcpCsumErrors(t *testing.T, ctx context.Context, ns string) uint64 {
	t.Helper()
	out, err := inNS(ctx, ns, "nstat", "-az", "TcpInCsumErrors")
	if err != nil {
		t.Fatalf("nstat in %s: %v", ns, err)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "TcpInCsumErrors" {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("nstat: %q: %v", l, err)
			}
			return v
		}
	}
	t.Fatalf("nstat in %s: no TcpInCsumErrors in\n%s", ns, out)
	return 0
}

// backendOffload sums lanekit_vhost_offloads_total{kind=kind} over the queues.
func backendOffload(t *testing.T, ctx context.Context, sock, kind string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := unixhttp.Get(ctx, sock, "/metrics")
	if err != nil {
		t.Fatalf("backend metrics: %v", err)
	}
	var sum uint64
	found := false
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "lanekit_vhost_offloads_total{") || !strings.Contains(l, `kind="`+kind+`"`) {
			continue
		}
		f := strings.Fields(l[strings.LastIndex(l, "}")+1:])
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("backend metrics: %q: %v", l, err)
		}
		sum, found = sum+uint64(v), true
	}
	if !found {
		t.Fatalf("backend metrics have no offloads of kind %s", kind)
	}
	return sum
}

// openCapture opens an AF_PACKET socket for IPv4 on ifname inside netns ns,
// with PACKET_AUXDATA (the kernel reports CHECKSUM_PARTIAL packets) and a
// 100 ms receive timeout.
func openCapture(ns, ifname string) (int, error) {
	fd := -1
	err := testutil.InNetnsPath(netnsPath(ns), func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_IP))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index}); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20); err != nil {
			return err
		}
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
	}
	return fd, err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

type captureResult struct{ complete, partial, bad int }

// captureTCP judges every IPv4 TCP segment with payload to dport until stop.
func captureTCP(fd int, dport uint16, stop <-chan struct{}) captureResult {
	var r captureResult
	buf, oob := make([]byte, 70000), make([]byte, 256)
	for {
		select {
		case <-stop:
			return r
		default:
		}
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil || n < 14+20+20 {
			continue
		}
		partial := false
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= 4 {
					partial = binary.NativeEndian.Uint32(m.Data)&unix.TP_STATUS_CSUMNOTREADY != 0
				}
			}
		}
		switch tcpSegmentCsum(buf[:n], dport, partial) {
		case csumNone:
		case csumComplete:
			r.complete++
		case csumPartial:
			r.partial++
		default:
			r.bad++
		}
	}
}

const (
	csumNone = iota
	csumComplete
	csumPartial
	csumBad
)

// tcpSegmentCsum checks the TCP checksum of an Ethernet + IPv4 + TCP frame to
// dport carrying data: complete and right, partial (the field holds the
// folded pseudo-header sum the kernel completes), or bad; csumNone for
// anything else.
func tcpSegmentCsum(f []byte, dport uint16, partial bool) int {
	ip := f[14:]
	ihl := int(ip[0]&0xf) * 4
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_TCP || ihl < 20 || tot > len(ip) || tot < ihl+20 {
		return csumNone
	}
	tcp := ip[ihl:tot]
	doff := int(tcp[12]>>4) * 4
	if binary.BigEndian.Uint16(tcp[2:]) != dport || len(tcp) <= doff {
		return csumNone
	}
	pseudo := onesSum(0, ip[12:20]) + uint32(unix.IPPROTO_TCP) + uint32(len(tcp))
	if partial {
		field := uint32(binary.BigEndian.Uint16(tcp[16:]))
		if fold(pseudo)%0xffff == field%0xffff {
			return csumPartial
		}
		return csumBad
	}
	if fold(onesSum(pseudo, tcp)) == 0xffff {
		return csumComplete
	}
	return csumBad
}

func onesSum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint32 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum
}
