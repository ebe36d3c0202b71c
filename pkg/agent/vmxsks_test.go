package agent

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// xsksEmptiedDatapath is a datapath whose load replaced lk_xsks with an
// empty map of a new shape (an upgrade changed it: datapath migrate.go).
type xsksEmptiedDatapath struct{ *fakeDatapath }

func (xsksEmptiedDatapath) EmptiedMaps() []string { return []string{"lk_pod6_progs", "lk_xsks"} }

// TestVMBackendRestartedWhenXSKsEmptied: a running VM backend is adopted by
// a restarted agent (its AF_XDP sockets stay in the pinned lk_xsks), except
// when the new datapath recreated lk_xsks empty: then nobody would put the
// backend's sockets back and the VM would receive nothing, so the agent
// restarts the backend, which fetches its sockets into the new map.
func TestVMBackendRestartedWhenXSKsEmptied(t *testing.T) {
	e := newAttachEnv(t)
	start := func(dp datapath.Datapath) *Agent {
		t.Helper()
		a, err := New(Config{
			StateDir: e.fx.stateDir, Socket: filepath.Join(e.fx.stateDir, "agent.sock"),
			PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: e.fx.nodeNS.Path(),
			VMSocketDir: e.vmDir, VhostBin: e.bin, VhostUID: &e.root, VhostGID: &e.root, KubeletRootDir: e.kubelet,
			VMHostSocketRoots: []string{e.hostRoot},
			OpenDatapath:      func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil },
		}, quietLog())
		if err != nil {
			t.Fatalf("start agent: %v", err)
		}
		return a
	}
	a := start(newFake())
	defer func() { a.Close() }()
	vmNS := netnstest.New(t, "launcher")
	sockets := filepath.Join(e.hostRoot, "sockets")
	if err := os.MkdirAll(sockets, 0o777); err != nil {
		t.Fatal(err)
	}
	va, err := a.AttachVM(VMAttachRequest{
		ContainerID: "c0ffee", IfName: "pod1a2b", Netns: vmNS.Path(), Network: "lanekit-vm",
		Labels: map[string]string{argPodNamespace: "default", argPodName: "virt-launcher-vm1-x"},
		Queues: 1, MAC: "02:00:00:aa:00:07", SocketDir: "/var/run/kubevirt/sockets", HostSocketDir: sockets,
	})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	name := va.VM.Endpoint.VM.Name
	first := backendOf(t, a, name)

	// Same datapath shape: adopted.
	a.Close()
	a = start(newFake())
	if n := backendOf(t, a, name); n.PID != first.PID {
		t.Fatalf("restart without a map change: backend %+v, want pid %d adopted", n, first.PID)
	}
	// lk_xsks recreated: a new backend.
	a.Close()
	a = start(xsksEmptiedDatapath{newFake()})
	n := backendOf(t, a, name)
	if n.PID == first.PID || n.PID == 0 || !nsexec.Alive(n.PID) {
		t.Fatalf("after lk_xsks was recreated: backend %+v, want a new process (old pid %d)", n, first.PID)
	}
	if nsexec.Alive(first.PID) {
		t.Errorf("the old backend (pid %d) still runs, holding sockets no map has", first.PID)
	}
}
