// Package netnstest creates named network namespaces for tests
// (lk-t-<what>-<pid>) and deletes them in t.Cleanup, links included.
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Name returns the namespace name tests use for what.
func Name(what string) string { return fmt.Sprintf("lk-t-%s-%d", what, os.Getpid()) }

// New creates the namespace lk-t-<what>-<pid> with lo up, and deletes it when
// the test ends. Callers must have checked for root.
func New(t testing.TB, what string) ns.NetNS {
	t.Helper()
	name := Name(what)
	// A leftover from a crashed run of the same pid would make add fail.
	exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("set lo up in %s: %v: %s", name, err, out)
	}
	n, err := ns.GetNS("/run/netns/" + name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}
