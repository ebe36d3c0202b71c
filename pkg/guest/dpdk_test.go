package guest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/internal/testutil"
)

// testpmd is DPDK's testpmd as a vhost-user backend in rxonly mode: it counts
// what the guest sends and sends nothing back.
type testpmd struct {
	cmd *exec.Cmd
	out limitedBuffer
}

var nicRxRE = regexp.MustCompile(`NIC statistics for port 0[^\n]*\n\s*RX-packets:\s*(\d+)`)

// rxPackets is port 0's RX-packets from the latest periodic stats block (-1: none yet).
func (tp *testpmd) rxPackets() int {
	m := nicRxRE.FindAllStringSubmatch(tp.out.String(), -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// startTestpmd runs testpmd with a vhost-user server socket; it is killed and
// reaped in t.Cleanup and by ctx.
func startTestpmd(t *testing.T, ctx context.Context, sock string, queues int) *testpmd {
	t.Helper()
	prefix := fmt.Sprintf("lkguest%d", os.Getpid())
	q := strconv.Itoa(queues)
	tp := &testpmd{}
	tp.out.max = 1 << 20
	tp.cmd = nsexec.GroupCommand(ctx, 5*time.Second, "dpdk-testpmd",
		"--no-huge", "-m", "512", "--no-pci", "--file-prefix", prefix, "-l", "0,1",
		"--vdev", "net_vhost0,iface="+sock+",queues="+q,
		"--", "--total-num-mbufs=16384", "--forward-mode=rxonly", "--nb-cores=1",
		"--rxq="+q, "--txq="+q, "--stats-period", "1")
	tp.cmd.Stdout, tp.cmd.Stderr = &tp.out, &tp.out
	if err := tp.cmd.Start(); err != nil {
		t.Fatalf("start dpdk-testpmd: %v", err)
	}
	done := make(chan struct{})
	go func() { tp.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-tp.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("dpdk-testpmd pid %d not reaped", tp.cmd.Process.Pid)
		}
		os.RemoveAll(filepath.Join("/var/run/dpdk", prefix))
		if t.Failed() {
			t.Logf("testpmd output (tail):\n%s", lastLines(tp.out.String(), 30))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return tp
		}
		select {
		case <-done:
			t.Fatalf("dpdk-testpmd exited before creating %s", sock)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dpdk-testpmd: no socket %s after 60s", sock)
		}
	}
}

// TestVhostUserDPDK boots the guest against DPDK's vhost PMD (the stand-in for
// lanekit-vhost): the virtio-net driver comes up over vhost-user with the
// requested queue pairs, and the guest's pings arrive at the backend.
func TestVhostUserDPDK(t *testing.T) {
	k, i := testImage(t)
	testutil.RequireBinary(t, "dpdk-testpmd")
	if os.Geteuid() != 0 {
		t.Skip("dpdk-testpmd needs root")
	}
	for _, queues := range []int{1, 2} {
		t.Run(fmt.Sprintf("q%d", queues), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			t.Cleanup(cancel)
			sock := filepath.Join(t.TempDir(), "vhost.sock")
			tp := startTestpmd(t, ctx, sock, queues)
			vm := startVM(t, ctx, Config{Kernel: k, Initrd: i, IP: "10.244.2.50/32", Gateway: "169.254.1.1",
				MAC: "52:54:00:4c:4b:02", Queues: queues, VhostSocket: sock})
			status := waitReady(t, vm)
			want := fmt.Sprintf("net=up if=eth0 ip=10.244.2.50/32 queues=%d", queues)
			if status != want {
				t.Fatalf("ready status %q, want %q", status, want)
			}
			before := tp.rxPackets()
			// A static neighbour makes the pings leave as ICMP, not ARP; the
			// backend answers nothing, so ping exits 1.
			out, code := run(t, vm, "arp -s 169.254.1.1 02:00:00:00:00:01 && ping -c 3 -i 0.2 -W 1 169.254.1.1")
			if code != 1 || !strings.Contains(out, "3 packets transmitted, 0 packets received") {
				t.Fatalf("ping via vhost-user = %q exit %d", out, code)
			}
			deadline := time.Now().Add(15 * time.Second)
			for tp.rxPackets() < before+3 {
				if time.Now().After(deadline) {
					t.Fatalf("testpmd rx packets %d (before ping %d), want >= %d", tp.rxPackets(), before, before+3)
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Logf("testpmd rx packets: %d before ping, %d after", before, tp.rxPackets())
		})
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
