package tuning

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/lanekit/lanekit/internal/testutil"
)

// perNetns are the sysctls that exist per network namespace: the only ones a
// test may change on a real kernel (inside its own namespace).
var perNetns = []string{"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.core.somaxconn"}

func TestApplyRevertInNetns(t *testing.T) {
	testutil.RequireRoot(t)
	readReal := func(name string) string {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(b)), " ")
	}
	hostBefore := map[string]string{}
	for _, n := range perNetns {
		hostBefore[n] = readReal(n)
	}
	state := filepath.Join(t.TempDir(), "tuning.json")

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	tmp, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	defer tmp.Close()
	func() {
		defer func() {
			if err := netns.Set(orig); err != nil {
				t.Errorf("back to the test's netns: %v", err) // the thread stays locked and dies
				return
			}
			runtime.UnlockOSThread()
		}()
		// Start the namespace below the recommendation.
		low := map[string]string{"net.ipv4.tcp_rmem": "4096 65536 1048576", "net.ipv4.tcp_wmem": "4096 16384 1048576", "net.core.somaxconn": "128"}
		for n, v := range low {
			if err := os.WriteFile("/proc/sys/"+strings.ReplaceAll(n, ".", "/"), []byte(v), 0o644); err != nil {
				t.Fatalf("lower %s in test netns: %v", n, err)
			}
		}
		o := Options{Root: "/", Only: perNetns}
		items := Check(o)
		if len(items) != len(perNetns) {
			t.Fatalf("items = %+v", items)
		}
		for _, it := range items {
			if it.Status != StatusWarn || it.Current != low[it.Name] {
				t.Errorf("%s before apply: %s %q", it.Name, it.Status, it.Current)
			}
		}
		changes, err := Apply(o, items, state)
		if err != nil {
			t.Fatal(err)
		}
		if len(changes) != 3 {
			t.Errorf("changes = %+v", changes)
		}
		if v := readReal("net.core.somaxconn"); v != "4096" {
			t.Errorf("somaxconn in netns = %s after apply", v)
		}
		if v := readReal("net.ipv4.tcp_rmem"); v != "4096 131072 16777216" {
			t.Errorf("tcp_rmem in netns = %s after apply", v)
		}
		for _, it := range Check(o) {
			if it.Status != StatusOK {
				t.Errorf("%s after apply: %s %q", it.Name, it.Status, it.Current)
			}
		}
		if _, err := Revert(o, state); err != nil {
			t.Fatal(err)
		}
		for n, v := range low {
			if got := readReal(n); got != v {
				t.Errorf("%s in netns = %s after revert, want %s", n, got, v)
			}
		}
	}()
	for _, n := range perNetns {
		if got := readReal(n); got != hostBefore[n] {
			t.Errorf("%s changed outside the test netns: %s -> %s", n, hostBefore[n], got)
		}
	}
}
