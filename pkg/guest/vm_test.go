package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// bootTimeout bounds boot-to-ready under TCG on a loaded 2-core machine.
const bootTimeout = 90 * time.Second

// testImage skips without QEMU and builds (or reuses) the guest image.
func testImage(t *testing.T) (kernel, initrd string) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM: skipped with -short")
	}
	testutil.RequireBinary(t, "qemu-system-x86_64")
	dir := os.Getenv("LANEKIT_GUEST_CACHE")
	if dir == "" {
		dir = DefaultCacheDir
		if os.Geteuid() != 0 {
			c, err := os.UserCacheDir()
			if err != nil {
				t.Fatalf("user cache dir: %v", err)
			}
			dir = filepath.Join(c, "lanekit", "guest")
		}
	}
	start := time.Now()
	k, i, err := EnsureImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest image ready in %s: %s %s", time.Since(start).Round(time.Millisecond), k, i)
	return k, i
}

// startVM boots cfg, stops it in t.Cleanup and dumps the console on failure.
func startVM(t *testing.T, ctx context.Context, cfg Config) *VM {
	t.Helper()
	vm, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest console:\n%s", vm.Console())
		}
		if err := vm.Stop(); err != nil {
			t.Error(err)
		}
	})
	return vm
}

func waitReady(t *testing.T, vm *VM) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	status, err := vm.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest ready after %s: %s", vm.BootTime().Round(time.Millisecond), status)
	return status
}

func run(t *testing.T, vm *VM, cmd string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, code, err := vm.Run(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return out, code
}

func TestBootNoNetwork(t *testing.T) {
	k, i := testImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	vm := startVM(t, ctx, Config{Kernel: k, Initrd: i})
	if status := waitReady(t, vm); status != "net=none" {
		t.Fatalf("ready status %q, want net=none", status)
	}
	if bt := vm.BootTime(); bt <= 0 || bt > bootTimeout {
		t.Fatalf("boot time %s", bt)
	}
	fmt.Printf("guest boot (QEMU start to LK-READY, TCG, no NIC): %s\n", vm.BootTime().Round(time.Millisecond))

	// A second EnsureImage reuses the cache: same paths, initrd not rewritten.
	st1, err := os.Stat(i)
	if err != nil {
		t.Fatal(err)
	}
	k2, i2, err := EnsureImage(filepath.Dir(i))
	if err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(i2)
	if err != nil {
		t.Fatal(err)
	}
	if k2 != k || i2 != i || !st2.ModTime().Equal(st1.ModTime()) {
		t.Fatalf("second EnsureImage: %s %s (mtime %s -> %s): rebuilt or moved", k2, i2, st1.ModTime(), st2.ModTime())
	}

	kver, err := os.ReadFile(filepath.Join(filepath.Dir(k), "kernel.version"))
	if err != nil {
		t.Fatal(err)
	}
	out, code := run(t, vm, "uname -r")
	if code != 0 || out != strings.TrimSpace(string(kver))+"\n" {
		t.Fatalf("uname -r = %q exit %d, want %q", out, code, kver)
	}
	if out, code := run(t, vm, "echo out; echo err >&2; exit 3"); code != 3 || out != "out\nerr\n" {
		t.Fatalf("exit/stderr command = %q exit %d", out, code)
	}
	if out, code := run(t, vm, "test -e /sys/class/net/eth0; echo $?; cat /proc/modules | cut -d' ' -f1 | sort | tr '\\n' ' '"); code != 0 ||
		out != "1\nfailover net_failover virtio virtio_net virtio_pci virtio_pci_legacy_dev virtio_pci_modern_dev virtio_ring " {
		t.Fatalf("modules/nic check = %q exit %d", out, code)
	}
	// Commands read /dev/null, not the control console.
	if out, code := run(t, vm, "cat"); code != 0 || out != "" {
		t.Fatalf("cat = %q exit %d", out, code)
	}

	// A Run whose context ends returns; the VM stays usable afterwards.
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	_, _, err = vm.Run(short, "sleep 3")
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run past its deadline: %v", err)
	}
	if out, code := run(t, vm, "echo after"); code != 0 || out != "after\n" {
		t.Fatalf("after a timed-out command: %q exit %d", out, code)
	}

	// A quiet command is pinged; its result still comes, and the pongs the
	// loop sends after it do not disturb the next command.
	old := pingEvery
	pingEvery = 300 * time.Millisecond
	out, code = run(t, vm, "sleep 2; echo slept")
	pingEvery = old
	if code != 0 || out != "slept\n" {
		t.Fatalf("pinged command = %q exit %d", out, code)
	}
	if out, code := run(t, vm, "echo next"); code != 0 || out != "next\n" {
		t.Fatalf("after a pinged command: %q exit %d", out, code)
	}
	if !strings.Contains(vm.Console(), "LKPONG") {
		t.Fatal("the guest answered no ping")
	}

	pid, dir := vm.Pid(), vm.dir
	if err := vm.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("qemu pid %d after Stop: kill 0 = %v", pid, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s after Stop: %v", dir, err)
	}
	if _, _, err := vm.Run(ctx, "true"); !errors.Is(err, ErrExited) {
		t.Fatalf("Run after Stop: %v", err)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestUserNetResponders boots with QEMU user-mode networking (restrict=on:
// nothing leaves QEMU) and reaches the guest's TCP responders from 127.0.0.1.
func TestUserNetResponders(t *testing.T) {
	k, i := testImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	echoPort, httpPort := freePort(t), freePort(t)
	vm := startVM(t, ctx, Config{Kernel: k, Initrd: i, IP: "10.0.2.15/32", Gateway: "10.0.2.2",
		UserNet: &UserNet{Forwards: map[int]int{echoPort: 8080, httpPort: 80}}})
	status := waitReady(t, vm)
	if ReadyField(status, "net") != "up" || ReadyField(status, "if") != "eth0" || ReadyField(status, "queues") != "1" {
		t.Fatalf("ready status %q", status)
	}
	out, code := run(t, vm, "ip -4 route; cat /sys/class/net/eth0/address")
	want := "default via 10.0.2.2 dev eth0 \n10.0.2.2 dev eth0 scope link \n" + DefaultMAC + "\n"
	if code != 0 || out != want {
		t.Fatalf("routes/mac = %q exit %d, want %q", out, code, want)
	}
	if out, code := run(t, vm, "ping -c 1 -W 2 10.0.2.15"); code != 0 || !strings.Contains(out, "1 packets received") {
		t.Fatalf("ping own address = %q exit %d", out, code)
	}

	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", echoPort), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	if l, err := r.ReadString('\n'); err != nil || l != "LK-HELLO lk-guest\n" {
		t.Fatalf("tcp 8080 greeting %q: %v", l, err)
	}
	if _, err := io.WriteString(c, "lanekit-echo\n"); err != nil {
		t.Fatal(err)
	}
	if l, err := r.ReadString('\n'); err != nil || l != "lanekit-echo\n" {
		t.Fatalf("tcp 8080 echo %q: %v", l, err)
	}

	hc := http.Client{Timeout: 20 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || string(body) != "lanekit guest\n" {
		t.Fatalf("http = %d %q %v", resp.StatusCode, body, err)
	}

	// The context given to Start bounds the VM: cancelling it ends QEMU.
	pid := vm.Pid()
	cancel()
	select {
	case <-vm.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("qemu pid %d still running 15s after its context ended", pid)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("qemu pid %d after cancel: kill 0 = %v", pid, err)
	}
}

// TestNetworkSetupFailure: lk.ip with no matching NIC must surface as an error
// from WaitReady while the control loop keeps answering.
func TestNetworkSetupFailure(t *testing.T) {
	k, i := testImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	// The NIC is 52:54:00:4c:4b:01; the later lk.mac on the command line wins in /init.
	vm := startVM(t, ctx, Config{Kernel: k, Initrd: i, IP: "10.0.2.15/32", UserNet: &UserNet{},
		ExtraAppend: []string{"lk.mac=02:00:00:00:00:09"}})
	wctx, wcancel := context.WithTimeout(ctx, bootTimeout)
	defer wcancel()
	status, err := vm.WaitReady(wctx)
	if err == nil || !strings.Contains(err.Error(), "no nic (mac 02:00:00:00:00:09) after 10s") {
		t.Fatalf("WaitReady = %q, %v; want the missing-nic failure", status, err)
	}
	if out, code := run(t, vm, "cat /sys/class/net/eth0/address"); code != 0 || out != DefaultMAC+"\n" {
		t.Fatalf("control loop after LK-FAIL: %q exit %d", out, code)
	}
}
