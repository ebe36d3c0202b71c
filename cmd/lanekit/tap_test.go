package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/rss"
)

// TestTapSteerCommands drives `lanekit tap steer|show|unsteer` on a
// persistent multiqueue tap in a test netns.
func TestTapSteerCommands(t *testing.T) {
	testutil.RequireRoot(t)
	netnstest.New(t, "clitap")
	nsName := netnstest.Name("clitap")
	if out, err := exec.Command("ip", "-n", nsName, "tuntap", "add", "dev", "vmtap0", "mode", "tap", "multi_queue").CombinedOutput(); err != nil {
		t.Fatalf("tuntap add: %v: %s", err, out)
	}
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lanekit-test-clitap-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(pin) })
	run := func(args ...string) (string, error) {
		tapOpts.tap, tapOpts.netns, tapOpts.key, tapOpts.table, tapOpts.types = "", "", "", "", "all"
		tapOpts.queues, tapOpts.defaultQueue = 0, 0
		return runCLI(t, append(append([]string{"tap"}, args...), "--pin-dir", pin)...)
	}

	if _, err := run("steer", "--tap", "nosuch", "--netns", nsName, "--queues", "2"); err == nil ||
		!strings.Contains(err.Error(), "find tap nosuch") {
		t.Fatalf("steer of a missing tap: %v, want a not-found error", err)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Fatalf("failed steer left maps in %s", pin)
	}
	if _, err := run("steer", "--tap", "vmtap0", "--netns", nsName); err == nil {
		t.Fatal("steer without --queues or --table: no error")
	}
	if _, err := run("steer", "--tap", "vmtap0", "--netns", nsName, "--queues", "4", "--types", "tcpv4,udpv4", "--default-queue", "2"); err != nil {
		t.Fatal(err)
	}
	out, err := run("show", "--tap", "vmtap0", "--netns", nsName)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hash types:    tcpv4,udpv4", "default queue: 2", "table (128):", "key:           " + rss.DefaultKey.String()} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}
	if _, err := run("steer", "--tap", "vmtap0", "--netns", nsName, "--table", "3,1"); err != nil {
		t.Fatal(err)
	}
	if out, _ := run("show", "--tap", "vmtap0", "--netns", nsName); !strings.Contains(out, "table (2):    [3 1]") {
		t.Errorf("after re-steer, show:\n%s", out)
	}
	if _, err := run("unsteer", "--tap", "vmtap0", "--netns", nsName); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("unsteer left %s", pin)
	}
}
