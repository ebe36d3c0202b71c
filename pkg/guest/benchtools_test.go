package guest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestGuestBenchTools boots the image with user-mode networking and checks the
// benchmark servers the lab bench starts in the guest: iperf3, sockperf and
// lk-bench run, and each listens when started in the background through the
// console the way the harness does.
func TestGuestBenchTools(t *testing.T) {
	kernel, initrd := testImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	vm := startVM(t, ctx, Config{Kernel: kernel, Initrd: initrd, IP: "10.0.2.15/24", Gateway: "10.0.2.2",
		UserNet: &UserNet{}})
	waitReady(t, vm)
	for _, c := range []struct{ cmd, want string }{
		{"iperf3 --version", "iperf 3"},
		{"sockperf --version", "sockperf"},
		{"lk-bench nope", "unknown subcommand"},
	} {
		out, _, err := vm.Run(ctx, c.cmd)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("%q: want %q in %q", c.cmd, c.want, out)
		}
	}
	for _, c := range []struct {
		cmd  string
		port string // hex, as in /proc/net/tcp
	}{
		{"iperf3 -s -1 -p 5201", ":1451 "},
		{"sockperf sr --tcp -i 10.0.2.15 -p 11111", ":2B67 "},
		{"lk-bench cps-server --listen 10.0.2.15:12865 --for 30s", ":3241 "},
	} {
		out, code, err := vm.Run(ctx, c.cmd+" >/tmp/srv.log 2>&1 & echo started")
		if err != nil || code != 0 || !strings.Contains(out, "started") {
			t.Fatalf("%q: %q exit %d: %v", c.cmd, out, code, err)
		}
		listening := false
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !listening; time.Sleep(200 * time.Millisecond) {
			out, _, err := vm.Run(ctx, "cat /proc/net/tcp /proc/net/tcp6")
			if errors.Is(err, ErrResultLost) {
				t.Logf("poll: %v; polling again", err)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(out, "\n") {
				f := strings.Fields(l)
				if len(f) > 3 && f[3] == "0A" && strings.HasSuffix(f[1]+" ", c.port) {
					listening = true
				}
			}
		}
		if !listening {
			log, _, _ := vm.Run(ctx, "cat /tmp/srv.log")
			t.Errorf("%q: not listening after 20s: %s", c.cmd, log)
		}
	}
}
