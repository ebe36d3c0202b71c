package agent

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
)

const bpffsChildEnv = "LANEKIT_TEST_BPFFS_CHILD"

// TestEnsureBPFFSInFreshSysfs runs TestBPFFSChild in a private mount
// namespace (unshare -m), where it replaces /sys with a fresh sysfs the way
// `ip netns exec` does: no bpffs at /sys/fs/bpf.
func TestEnsureBPFFSInFreshSysfs(t *testing.T) {
	testutil.RequireRoot(t)
	unshare := testutil.RequireBinary(t, "unshare")
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0], "-test.run", "^TestBPFFSChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), bpffsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestBPFFSChild") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	// The child's mounts stayed in its namespace.
	if ok, _, err := onBPFFS(DefaultBPFFS); err != nil || !ok {
		t.Fatalf("host %s after the child: bpffs %v %v", DefaultBPFFS, ok, err)
	}
}

func TestBPFFSChild(t *testing.T) {
	if os.Getenv(bpffsChildEnv) == "" {
		t.Skip("runs inside TestEnsureBPFFSInFreshSysfs's mount namespace")
	}
	if err := unix.Unmount("/sys", unix.MNT_DETACH); err != nil {
		t.Fatalf("umount /sys: %v", err)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		t.Fatalf("mount sysfs: %v", err)
	}
	pinDir := filepath.Join(DefaultBPFFS, "lanekit-test")
	if ok, _, err := onBPFFS(pinDir); err != nil || ok {
		t.Fatalf("fresh sysfs: bpffs %v %v, want none", ok, err)
	}
	if err := ensureBPFFS(pinDir, quietLog()); err != nil {
		t.Fatalf("ensure bpffs: %v", err)
	}
	if ok, checked, err := onBPFFS(pinDir); err != nil || !ok || checked != DefaultBPFFS {
		t.Fatalf("after ensure: bpffs %v at %s %v", ok, checked, err)
	}
	// Idempotent: a second call finds it.
	if err := ensureBPFFS(pinDir, quietLog()); err != nil {
		t.Fatalf("second ensure: %v", err)
	}
	// Outside /sys/fs/bpf the agent does not mount: it says what to do.
	other := filepath.Join(t.TempDir(), "pins")
	err := ensureBPFFS(other, quietLog())
	if err == nil || !strings.Contains(err.Error(), "mount -t bpf bpf") {
		t.Fatalf("ensure on %s = %v, want instructions", other, err)
	}
}

// TestNewFailsWhenBPFCannotOpen: without an injected datapath the agent
// opens BPF or fails; it never falls back to forwarding nothing.
func TestNewFailsWhenBPFCannotOpen(t *testing.T) {
	fx := newFixture(t)
	pins := filepath.Join(t.TempDir(), "not-bpffs", "lanekit")
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: fx.nodeNS.Path(), BPFDir: pins,
	}, quietLog())
	if err == nil {
		a.Close()
		t.Fatal("agent started without a BPF filesystem for its pins")
	}
	if !strings.Contains(err.Error(), "not on a BPF filesystem") || !strings.Contains(err.Error(), "mount -t bpf bpf") {
		t.Fatalf("error %q does not say what to do", err)
	}
}
