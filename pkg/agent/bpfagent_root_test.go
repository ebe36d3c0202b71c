package agent

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// startBPFAgent starts the agent in fx's node netns on the real BPF datapath,
// pinned under a directory of its own (name) that goes with the test: pod
// CIDR 10.77.0.0/28, MTU 1400, then tweak. It returns the agent and the
// datapath it opened.
func startBPFAgent(tb testing.TB, fx *fixture, name string, tweak func(*Config)) (*Agent, *datapath.Loader) {
	tb.Helper()
	pins := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-agent-%s-%d", name, os.Getpid()))
	tb.Cleanup(func() { datapath.Unpin(pins) })
	var dp *datapath.Loader
	cfg := Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: fx.nodeNS.Path(), BPFDir: pins,
		OpenDatapath: func(c datapath.Config, log *slog.Logger) (datapath.Datapath, error) {
			d, err := datapath.Open(c, log)
			dp = d
			return d, err
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := New(cfg, quietLog())
	if err != nil {
		tb.Fatalf("start agent with the BPF datapath: %v", err)
	}
	tb.Cleanup(func() { a.Close() })
	return a, dp
}

// vmTestBins returns lanekit-vhost and the test guest driver guest from
// $LANEKIT_BIN (a missing dependency otherwise).
func vmTestBins(t *testing.T, guest string) (vhostBin, guestBin string) {
	t.Helper()
	bin := os.Getenv("LANEKIT_BIN")
	if bin == "" {
		testutil.MissingDep(t, "LANEKIT_BIN not set (make test sets it to the built bin/ with lanekit-vhost and %s)", guest)
	}
	vhostBin, guestBin = filepath.Join(bin, "lanekit-vhost"), filepath.Join(bin, guest)
	for _, p := range []string{vhostBin, guestBin} {
		if _, err := os.Stat(p); err != nil {
			testutil.MissingDep(t, "%s: %v (make build-vhost)", p, err)
		}
	}
	return vhostBin, guestBin
}

// vmLane is one pod and one single-queue VM of an agent on the BPF datapath
// (dual-stack, MTU 1400), with the VM's lanekit-vhost backend running on the
// sockets the agent hands over: its vhost-user socket at sock, its metrics
// at metrics.
type vmLane struct {
	a     *Agent
	dp    *datapath.Loader
	podNS ns.NetNS
	pod   *endpoint.Endpoint
	vmNS  ns.NetNS
	ep    endpoint.Endpoint // the VM's
	sock  string
	// metrics is the backend's metrics socket (scrapeOffload).
	metrics string
}

// startVMLane starts a vmLane named name (pins, netns and container names),
// the agent's config tweaked by tweak, the backend vhostBin with backendArgs
// beside the lane's own.
func startVMLane(t *testing.T, name string, tweak func(*Config), vhostBin string, backendArgs ...string) *vmLane {
	t.Helper()
	fx := newFixture(t)
	l := &vmLane{}
	l.a, l.dp = startBPFAgent(t, fx, name, func(c *Config) {
		c.PodCIDR6 = netip.MustParsePrefix("fd77::/120")
		c.VMSocketDir = filepath.Join(fx.stateDir, "vm")
		if tweak != nil {
			tweak(c)
		}
	})
	podName := name + "pod"
	l.podNS = netnstest.New(t, podName)
	pod, err := l.a.Add(AddRequest{ContainerID: podName, IfName: "eth0", Netns: l.podNS.Path(),
		Labels: map[string]string{ArgPodNamespace: "default", ArgPodName: podName}})
	if err != nil {
		t.Fatalf("add pod: %v", err)
	}
	l.pod = pod
	l.vmNS = netnstest.New(t, name+"vm")
	v, err := l.a.AddVM(AddVMRequest{Name: "vm1", Netns: l.vmNS.Path(), Queues: 1})
	if err != nil {
		t.Fatalf("add vm: %v", err)
	}
	l.ep = v.Endpoint
	dir := t.TempDir()
	l.sock, l.metrics = filepath.Join(dir, "vhost.sock"), filepath.Join(dir, "metrics.sock")
	backend := exec.Command(vhostBin, append([]string{"--socket", l.sock, "--xsk-socket", l.ep.VM.Socket, "--vm", "vm1",
		"--queues", "1", "--mac", l.ep.MAC, "--mtu", "1400", "--metrics-listen", l.metrics}, backendArgs...)...)
	var logs strings.Builder
	backend.Stdout, backend.Stderr = &logs, &logs
	if err := backend.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		backend.Process.Signal(unix.SIGTERM)
		backend.Wait()
		if t.Failed() {
			t.Logf("lanekit-vhost:\n%s", logs.String())
		}
	})
	waitUntil(t, "the backend's vhost-user socket", func() bool { _, err := os.Stat(l.sock); return err == nil })
	return l
}
