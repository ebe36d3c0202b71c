package cniplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

func conf(socket string, extra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"lk","type":"lanekit","agentSocket":%q%s}`, socket, extra))
}

func code(t *testing.T, err error) uint {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	return te.Code
}

func TestParseConf(t *testing.T) {
	t.Setenv(DeviceInfoDirEnv, "") // Multus' directory
	for _, tc := range []struct {
		name string
		in   string
		want uint
	}{
		{"not json", `{"cniVersion":`, types.ErrDecodingFailure},
		{"wrong type", `{"cniVersion":"1.1.0","name":"lk","type":"bridge"}`, types.ErrInvalidNetworkConfig},
		{"no name", `{"cniVersion":"1.1.0","type":"lanekit"}`, types.ErrInvalidNetworkConfig},
		{"empty socket", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","agentSocket":""}`, types.ErrInvalidNetworkConfig},
		{"bad mtu", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","mtu":10}`, types.ErrInvalidNetworkConfig},
		{"bad subnet", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","subnet":"10.0.0.0"}`, types.ErrInvalidNetworkConfig},
		{"mtu not a number", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","mtu":"big"}`, types.ErrDecodingFailure},
		{"vm queues", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","vhostUser":{"queues":17}}`, types.ErrInvalidNetworkConfig},
		{"vm relative dir", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","vhostUser":{"socketDir":"run/x"}}`, types.ErrInvalidNetworkConfig},
		{"vm unclean dir", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","vhostUser":{"hostSocketDir":"/a/../b"}}`, types.ErrInvalidNetworkConfig},
		{"vm volume and dir", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","vhostUser":{"podVolume":"s","hostSocketDir":"/b"}}`, types.ErrInvalidNetworkConfig},
		{"vm volume path", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","vhostUser":{"podVolume":"../etc"}}`, types.ErrInvalidNetworkConfig},
		{"vm not an object", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","vhostUser":true}`, types.ErrDecodingFailure},
		{"runtime mac", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","runtimeConfig":{"mac":"02:00"}}`, types.ErrInvalidNetworkConfig},
		{"device-info path", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","runtimeConfig":{"CNIDeviceInfoFile":"x.json"}}`, types.ErrInvalidNetworkConfig},
		{"device-info elsewhere", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","runtimeConfig":{"CNIDeviceInfoFile":"/etc/cron.d/x"}}`, types.ErrInvalidNetworkConfig},
		{"device-info dotdot", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo/../../../etc/x"}}`, types.ErrInvalidNetworkConfig},
		{"device-info the dir", `{"cniVersion":"1.1.0","name":"lk","type":"lanekit","runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo"}}`, types.ErrInvalidNetworkConfig},
	} {
		_, err := ParseConf([]byte(tc.in))
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if got := code(t, err); got != tc.want {
			t.Errorf("%s: code %d, want %d (%v)", tc.name, got, tc.want, err)
		}
	}
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"lk","type":"lanekit","mtu":1400,"subnet":"10.0.0.0/8"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket() != DefaultAgentSocket || c.MTU != 1400 || c.Subnet != "10.0.0.0/8" {
		t.Errorf("conf = %+v socket %s", c, c.Socket())
	}
}

func TestAgentDownCodes(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")
	// A socket file nobody listens on: the agent died without cleaning up.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	for _, sock := range []string{missing, stale} {
		args := &skel.CmdArgs{ContainerID: "c", IfName: "eth0", Netns: "/proc/self/ns/net", StdinData: conf(sock, "")}
		for name, fn := range map[string]func(*skel.CmdArgs) error{"add": CmdAdd, "del": CmdDel, "check": CmdCheck, "gc": CmdGC} {
			if got := code(t, fn(args)); got != types.ErrTryAgainLater {
				t.Errorf("%s with %s: code %d, want 11", name, filepath.Base(sock), got)
			}
		}
		if got := code(t, CmdStatus(args)); got != types.ErrPluginNotAvailable {
			t.Errorf("status with %s: code %d, want 50", filepath.Base(sock), got)
		}
	}
}

// startAgent runs an agent in-process on a temp socket, its node side in a
// test namespace, with the in-memory datapath.
func startAgent(t *testing.T) string {
	t.Helper()
	return startAgentWith(t, agenttest.NewMemoryDatapath())
}

// healthDatapath is the memory datapath with a health check the test sets.
type healthDatapath struct {
	*agenttest.MemoryDatapath
	mu  sync.Mutex
	err error
}

func (h *healthDatapath) Health() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *healthDatapath) set(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

// TestStatusFollowsDatapath: STATUS succeeds while the datapath is loaded
// and answers code 50 with the agent's reason once it is not.
func TestStatusFollowsDatapath(t *testing.T) {
	dp := &healthDatapath{MemoryDatapath: agenttest.NewMemoryDatapath()}
	sock := startAgentWith(t, dp)
	args := &skel.CmdArgs{StdinData: conf(sock, "")}
	// The socket is up before the agent has restored its stored Services
	// and policies; until then STATUS says so (not ready). Wait that out.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := CmdStatus(args)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status with a loaded datapath: %v", err)
		}
	}
	dp.set(errors.New("uplink lk0 program is detached"))
	err := CmdStatus(args)
	if got := code(t, err); got != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "detached") {
		t.Fatalf("status with the datapath gone: %v (code %d), want 50 with the reason", err, got)
	}
	dp.set(nil)
	if err := CmdStatus(args); err != nil {
		t.Fatalf("status after recovery: %v", err)
	}
}

func startAgentWith(t *testing.T, dp datapath.Datapath, tweak ...func(*agent.Config)) string {
	t.Helper()
	dir := t.TempDir()
	node := netnstest.New(t, "cnode")
	sock := filepath.Join(dir, "agent.sock")
	cfg := agent.Config{
		StateDir: dir, Socket: sock, PodCIDR: netip.MustParsePrefix("10.88.1.0/24"),
		MTU: 1450, HostNetns: node.Path(),
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil },
	}
	for _, f := range tweak {
		f(&cfg)
	}
	a, err := agent.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sock
}

// mustAdd runs CmdAdd as a runtime would and returns its result.
func mustAdd(t *testing.T, args *skel.CmdArgs) *current.Result {
	t.Helper()
	r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestInProcessAddCheckDel(t *testing.T) {
	testutil.RequireRoot(t)
	sock := startAgent(t)
	pod := netnstest.New(t, "cpod")
	args := &skel.CmdArgs{ContainerID: "ctr1", IfName: "eth0", Netns: pod.Path(), Args: "K8S_POD_NAME=p1", StdinData: conf(sock, "")}

	res := mustAdd(t, args)
	if len(res.Interfaces) != 2 || res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != pod.Path() ||
		res.Interfaces[0].Sandbox != "" || res.Interfaces[0].Mac == "" || res.Interfaces[1].Mac == "" || res.Interfaces[1].Mtu != 1450 {
		t.Fatalf("interfaces = %+v", res.Interfaces)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.88.1.1/32" || *res.IPs[0].Interface != 1 ||
		res.IPs[0].Gateway.String() != "169.254.1.1" {
		t.Fatalf("ips = %+v", res.IPs)
	}
	if len(res.Routes) != 2 {
		t.Fatalf("routes = %+v", res.Routes)
	}

	// Duplicate ADD: same address, no second allocation.
	res2 := mustAdd(t, args)
	if res2.IPs[0].Address.String() != "10.88.1.1/32" {
		t.Fatalf("duplicate add got %s", res2.IPs[0].Address.String())
	}

	// CHECK with the ADD result as prevResult.
	withPrev := conf(sock, `,"prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.88.1.1/32","interface":1}]}`)
	chk := &skel.CmdArgs{ContainerID: "ctr1", IfName: "eth0", Netns: pod.Path(), StdinData: withPrev}
	if err := testutils.CmdCheckWithArgs(chk, func() error { return CmdCheck(chk) }); err != nil {
		t.Fatalf("check: %v", err)
	}
	wrongPrev := conf(sock, `,"prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.88.1.9/32","interface":1}]}`)
	chk.StdinData = wrongPrev
	if err := CmdCheck(chk); err == nil {
		t.Fatal("check with a different prevResult address passed")
	}
	unknown := &skel.CmdArgs{ContainerID: "nope", IfName: "eth0", Netns: pod.Path(), StdinData: conf(sock, "")}
	if got := code(t, CmdCheck(unknown)); got != types.ErrUnknownContainer {
		t.Fatalf("check unknown container: code %d, want 3", got)
	}
	conflict := &skel.CmdArgs{ContainerID: "ctr2", IfName: "eth0", Netns: pod.Path(), StdinData: conf(sock, `,"subnet":"192.168.0.0/16"`)}
	if got := code(t, CmdAdd(conflict)); got != types.ErrInvalidNetworkConfig {
		t.Fatalf("conflicting subnet: code %d, want 7", got)
	}
	noNetns := &skel.CmdArgs{ContainerID: "ctr3", IfName: "eth0", Netns: "/run/netns/lk-t-gone", StdinData: conf(sock, "")}
	if got := code(t, CmdAdd(noNetns)); got != types.ErrInvalidEnvironmentVariables {
		t.Fatalf("missing netns: code %d, want 4", got)
	}
	if err := testutils.CmdStatus(func() error { return CmdStatus(args) }); err != nil {
		t.Fatalf("status: %v", err)
	}

	// GC keeping nothing removes the endpoint; DEL afterwards still succeeds twice.
	gc := &skel.CmdArgs{StdinData: conf(sock, `,"cni.dev/valid-attachments":[{"containerID":"other","ifname":"eth0"}]`)}
	if err := CmdGC(gc); err != nil {
		t.Fatalf("gc: %v", err)
	}
	if got := code(t, CmdCheck(&skel.CmdArgs{ContainerID: "ctr1", IfName: "eth0", Netns: pod.Path(), StdinData: conf(sock, "")})); got != types.ErrUnknownContainer {
		t.Fatalf("check after gc: code %d, want 3", got)
	}
	for range 2 {
		if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
			t.Fatalf("del: %v", err)
		}
	}
}

// TestInProcessVMAttachment: a network with "vhostUser" makes the CNI ifname
// a VM endpoint with its backend running, returns the VM's device and
// address (no routes: a secondary network) and writes the vhost-user
// device-info where Multus asked; DEL removes both, twice.
func TestInProcessVMAttachment(t *testing.T) {
	testutil.RequireRoot(t)
	fake := testutil.FakeVhost(t)
	root := uint32(0)
	dir := t.TempDir()
	sockets := filepath.Join(dir, "sockets")
	if err := os.Mkdir(sockets, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := startAgentWith(t, agenttest.NewMemoryDatapath(), func(c *agent.Config) {
		c.VhostBin, c.VhostUID, c.VhostGID = fake, &root, &root
		c.VMSocketDir = filepath.Join(c.StateDir, "vm")
		c.VMHostSocketRoots = []string{dir}
	})
	pod := netnstest.New(t, "clauncher")
	t.Setenv(DeviceInfoDirEnv, filepath.Join(dir, "devinfo"))
	devinfo := filepath.Join(dir, "devinfo", "cni", "net1.json")
	vmConf := conf(sock, fmt.Sprintf(`,"vhostUser":{"hostSocketDir":%q},"runtimeConfig":{"mac":"02:00:00:cc:00:01","CNIDeviceInfoFile":%q}`, sockets, devinfo))
	args := &skel.CmdArgs{ContainerID: "launcher1", IfName: "net1", Netns: pod.Path(),
		Args: "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=virt-launcher-a", StdinData: vmConf}
	res := mustAdd(t, args)
	if len(res.Interfaces) != 2 || res.Interfaces[1].Name != "net1" || res.Interfaces[1].Mac != "02:00:00:cc:00:01" ||
		res.Interfaces[1].Sandbox != pod.Path() || len(res.IPs) != 1 || len(res.Routes) != 0 || res.IPs[0].Gateway != nil {
		t.Fatalf("result %+v ips %+v routes %+v", res.Interfaces, res.IPs, res.Routes)
	}
	raw, err := os.ReadFile(devinfo)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"vhost-user","version":"1.1.0","vhost-user":{"mode":"client","path":"/var/run/kubevirt/sockets/lanekit-net1.sock"}}`
	if string(raw) != want {
		t.Fatalf("device-info %s, want %s", raw, want)
	}
	if fi, err := os.Stat(filepath.Join(sockets, "lanekit-net1.sock")); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("backend socket: %v", err)
	}
	if err := testutils.CmdCheckWithArgs(args, func() error { return CmdCheck(args) }); err != nil {
		t.Fatalf("check: %v", err)
	}
	// The same attachment through a pod-network config is not a second endpoint.
	podArgs := *args
	podArgs.StdinData = conf(sock, "")
	if err := CmdDel(&podArgs); err != nil {
		t.Fatalf("DEL without vhostUser: %v", err)
	}
	if got := code(t, CmdCheck(args)); got != types.ErrUnknownContainer {
		t.Fatalf("check after DEL: code %d, want 3 (unknown)", got)
	}
	if err := CmdAdd(args); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
			t.Fatalf("del: %v", err)
		}
	}
	if _, err := os.Stat(devinfo); !os.IsNotExist(err) {
		t.Errorf("device-info left after DEL: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sockets, "lanekit-net1.sock")); !os.IsNotExist(err) {
		t.Errorf("backend socket left after DEL: %v", err)
	}
}
