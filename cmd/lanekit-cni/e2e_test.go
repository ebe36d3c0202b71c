package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// e2e holds one end-to-end environment: built binaries, a node namespace
// running lanekitd, a CNI plugin dir and a network config dir.
type e2e struct {
	bin, pluginDir, confDir, stateDir, sock string
	bpfDir                                  string // on a bpffs mounted for the test (host mount namespace)
	node                                    ns.NetNS
	agent                                   *exec.Cmd
	agentLog                                *bytes.Buffer
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// requireBPF fails the test unless datapath.Open works in the node
// namespace: as root, a kernel or build that cannot load the programs is a
// failure, never a quiet switch to a datapath that forwards nothing.
func requireBPF(t *testing.T, node ns.NetNS) {
	t.Helper()
	pin := fmt.Sprintf("/sys/fs/bpf/lk-t-probe-%d", os.Getpid())
	var openErr error
	node.Do(func(ns.NetNS) error {
		dp, err := datapath.Open(datapath.Config{PinDir: pin, Uplink: "lo"}, slog.Default())
		if err == nil {
			dp.Close()
		}
		openErr = err
		return nil
	})
	datapath.Unpin(pin)
	if openErr != nil {
		t.Fatalf("BPF datapath does not open as root: %v", openErr)
	}
}

// libcni returns a libcni client that finds the plugin in the test's plugin
// dir, and the "lk" network list pointing at the test's agent.
func (e *e2e) libcni(t *testing.T) (*libcni.CNIConfig, *libcni.NetworkConfigList) {
	t.Helper()
	list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(
		`{"cniVersion":"1.1.0","name":"lk","plugins":[{"type":"lanekit","agentSocket":%q}]}`, e.sock)))
	if err != nil {
		t.Fatal(err)
	}
	return libcni.NewCNIConfigWithCacheDir([]string{e.pluginDir}, t.TempDir(), nil), list
}

func setup(t *testing.T) *e2e {
	t.Helper()
	testutil.RequireRoot(t)
	cnitool := filepath.Join(moduleRoot(t), "bin", "cni", "cnitool")
	if _, err := os.Stat(cnitool); err != nil {
		testutil.MissingDep(t, "%s missing", cnitool)
	}
	dir := t.TempDir()
	e := &e2e{bin: filepath.Join(dir, "bin"), pluginDir: filepath.Join(dir, "cni"), confDir: filepath.Join(dir, "net.d"),
		stateDir: filepath.Join(dir, "state"), sock: filepath.Join(dir, "agent.sock")}
	for _, d := range []string{e.bin, e.pluginDir, e.confDir} {
		os.MkdirAll(d, 0o755)
	}
	// lanekit_testhooks: the agent reads agent.CrashEnv (crash tests).
	// One build for every test of the package (TestMain removes it).
	testutil.GoBuild(t, moduleRoot(t), e.bin, []string{"-tags", "lanekit_testhooks"}, []string{"./cmd/lanekitd", "./cmd/lanekit-cni", "./cmd/lanekit"})
	if err := os.Rename(filepath.Join(e.bin, "lanekit-cni"), filepath.Join(e.pluginDir, "lanekit")); err != nil {
		t.Fatal(err)
	}
	e.node = netnstest.New(t, "enode")
	requireBPF(t, e.node)
	// A bpffs of our own, in the host mount namespace so it outlives each
	// agent process: a restarted agent finds its pins.
	fs := filepath.Join(dir, "bpffs")
	os.MkdirAll(fs, 0o700)
	if err := unix.Mount("bpf", fs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", fs, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(fs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", fs, err)
		}
	})
	e.bpfDir = filepath.Join(fs, "lanekit")
	e.writeConf(t, "lk", `{"cniVersion":"1.1.0","name":"lk","plugins":[{"type":"lanekit","agentSocket":%q}]}`)
	e.startAgent(t)
	return e
}

func (e *e2e) writeConf(t *testing.T, name, format string) {
	t.Helper()
	body := fmt.Sprintf(format, e.sock)
	if err := os.WriteFile(filepath.Join(e.confDir, name+".conflist"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *e2e) startAgent(t *testing.T) {
	t.Helper()
	e.startAgentEnv(t)
}

// startAgentEnv starts lanekitd in the node namespace (nsenter: the host's
// mount namespace, unlike ip netns exec) with extra environment variables.
func (e *e2e) startAgentEnv(t *testing.T, env ...string) {
	t.Helper()
	e.agentLog = &bytes.Buffer{}
	e.agent = e.agentCmd(env...)
	if err := e.agent.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := e.agent
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", e.agentLog)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := e.status()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not come up (status: %v):\n%s", err, e.agentLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *e2e) agentCmd(env ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", "--net="+e.node.Path(), "--", filepath.Join(e.bin, "lanekitd"),
		"--state-dir", e.stateDir, "--socket", e.sock, "--uplink", "lo", "--mtu", "1500",
		"--pod-cidr", "10.66.0.0/24", "--bpf-dir", e.bpfDir,
		// Not the socket LB: its default cgroup is the cgroup2 root, every
		// process of the machine (the lab and its tests use a child cgroup).
		"--socket-lb=false")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = e.agentLog
	return cmd
}

func (e *e2e) stopAgent(t *testing.T) {
	t.Helper()
	if err := e.agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.agent.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v\n%s", err, e.agentLog)
	}
	if !strings.Contains(e.agentLog.String(), `"msg":"stopped"`) {
		t.Fatalf("agent did not stop gracefully:\n%s", e.agentLog)
	}
}

func (e *e2e) client() (apiv1.AgentClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return apiv1.NewAgentClient(conn), func() { conn.Close() }, nil
}

func (e *e2e) status() (*apiv1.StatusResponse, error) {
	c, closeFn, err := e.client()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Status(ctx, &apiv1.StatusRequest{})
}

func (e *e2e) endpoints(t *testing.T) []*apiv1.Endpoint {
	t.Helper()
	c, closeFn, err := e.client()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	resp, err := c.ListEndpoints(context.Background(), &apiv1.ListEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetEndpoints()
}

// assertClean checks that nothing leaked: no endpoint records, no
// allocations, no lk* devices on the node and, with the BPF datapath, no
// endpoint map entries, counters or pinned links.
func (e *e2e) assertClean(t *testing.T) {
	t.Helper()
	st, err := datapath.InspectPins(e.bpfDir)
	if err != nil {
		t.Fatalf("inspect pins: %v", err)
	}
	if err := st.Leaks(); err != nil {
		t.Errorf("datapath leaked: %v", err)
	}
	if eps := e.endpoints(t); len(eps) != 0 {
		t.Errorf("%d endpoint records leaked", len(eps))
	}
	as, err := e.status()
	if err != nil {
		t.Fatal(err)
	}
	if as.GetIpsAllocated() != 0 || as.GetEndpointCount() != 0 {
		t.Errorf("leaked: %d addresses, %d endpoints", as.GetIpsAllocated(), as.GetEndpointCount())
	}
	e.node.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "lk") {
				t.Errorf("device %s leaked", l.Attrs().Name)
			}
		}
		return nil
	})
}

func (e *e2e) run(cmd *exec.Cmd) (string, error) {
	cmd.Env = append(os.Environ(), "CNI_PATH="+e.pluginDir, "NETCONFPATH="+e.confDir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	return te.Code
}

func TestE2ECnitool(t *testing.T) {
	e := setup(t)
	cnitool := filepath.Join(moduleRoot(t), "bin", "cni", "cnitool")
	tool := func(args ...string) (string, error) { return e.run(exec.Command(cnitool, args...)) }
	pod := netnstest.New(t, "etpod")

	out, err := tool("add", "lk", pod.Path())
	if err != nil {
		t.Fatalf("cnitool add: %v\n%s", err, out)
	}
	var res current.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("decode result: %v\n%s", err, out)
	}
	if len(res.IPs) != 1 || !strings.HasPrefix(res.IPs[0].Address.String(), "10.66.0.") || len(res.Interfaces) != 2 ||
		res.Interfaces[1].Sandbox != pod.Path() {
		t.Fatalf("result = %s", out)
	}
	again, err := tool("add", "lk", pod.Path())
	if err != nil || !strings.Contains(again, res.IPs[0].Address.String()) {
		t.Fatalf("duplicate add: %v\n%s", err, again)
	}
	if out, err := tool("check", "lk", pod.Path()); err != nil {
		t.Fatalf("cnitool check: %v\n%s", err, out)
	}
	if out, err := tool("status", "lk", pod.Path()); err != nil {
		t.Fatalf("cnitool status: %v\n%s", err, out)
	}
	// The CLI sees the endpoint and the agent.
	cli := filepath.Join(e.bin, "lanekit")
	if out, err := e.run(exec.Command(cli, "endpoint", "list", "--socket", e.sock)); err != nil ||
		!strings.Contains(out, strings.TrimSuffix(res.IPs[0].Address.String(), "")) {
		t.Fatalf("lanekit endpoint list: %v\n%s", err, out)
	}
	out, err = e.run(exec.Command(cli, "status", "--socket", e.sock))
	if err != nil || !strings.Contains(out, "device mode:  veth") && !strings.Contains(out, "device mode:  netkit") ||
		!strings.Contains(out, "tcx") || !strings.Contains(out, "BTF") {
		t.Fatalf("lanekit status: %v\n%s", err, out)
	}
	for range 2 {
		if out, err := tool("del", "lk", pod.Path()); err != nil {
			t.Fatalf("cnitool del: %v\n%s", err, out)
		}
	}
	e.assertClean(t)

	// Malformed plugin config: cnitool fails with the plugin's message.
	e.writeConf(t, "bad", `{"cniVersion":"1.1.0","name":"bad","plugins":[{"type":"lanekit","agentSocket":%q,"mtu":"big"}]}`)
	if out, err := tool("add", "bad", pod.Path()); err == nil || !strings.Contains(out, "decode") {
		t.Fatalf("add with malformed config: %v\n%s", err, out)
	}

	// 200 ADD/DEL cycles through cnitool leave nothing behind. cnitool
	// derives the container ID from the netns path: each cycle reaches the
	// pod's namespace through its own bind mount, so every cycle is a new
	// container (nothing is overwritten by reuse), and a sample of them
	// carries traffic to an anchor pod through the datapath.
	anchorNS := netnstest.New(t, "etanchor")
	out, err = tool("add", "lk", anchorNS.Path())
	if err != nil {
		t.Fatalf("cnitool add anchor: %v\n%s", err, out)
	}
	anchor := resultOf(t, out)
	start := time.Now()
	seen := map[string]bool{}
	for i := range 200 {
		path := bindNetns(t, pod.Path(), filepath.Join(t.TempDir(), fmt.Sprintf("ns-%d", i)))
		out, err := tool("add", "lk", path)
		if err != nil {
			t.Fatalf("cycle %d add: %v\n%s", i, err, out)
		}
		r := resultOf(t, out)
		if i%40 == 0 {
			eps := e.endpoints(t)
			cid := ""
			for _, ep := range eps {
				if ep.GetNetns() == path {
					cid = ep.GetAttachment().GetContainerId()
				}
			}
			if cid == "" || seen[cid] {
				t.Fatalf("cycle %d: container id %q not new (seen %v)", i, cid, seen)
			}
			seen[cid] = true
			e.talkThrough(t, path, r.IPs[0].Address.IP.String(), anchorNS.Path(), anchor.IPs[0].Address.IP.String())
		}
		if out, err := tool("del", "lk", path); err != nil {
			t.Fatalf("cycle %d del: %v\n%s", i, err, out)
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", path, err)
		}
	}
	t.Logf("200 cnitool ADD/DEL cycles in %v", time.Since(start).Round(time.Millisecond))
	if out, err := tool("del", "lk", anchorNS.Path()); err != nil {
		t.Fatalf("cnitool del anchor: %v\n%s", err, out)
	}
	e.assertClean(t)

	// The uplink program goes away under the agent (its pinned link is
	// removed): STATUS says not ready with the reason; a restarted agent
	// loads it again and is ready.
	if err := os.Remove(filepath.Join(e.bpfDir, "lk_uplink_tc")); err != nil {
		t.Fatal(err)
	}
	if out, err := tool("status", "lk", pod.Path()); err == nil || !strings.Contains(out, "not ready") || !strings.Contains(out, "uplink") {
		t.Fatalf("status with the uplink program gone: %v\n%s", err, out)
	}
	e.stopAgent(t)
	e.startAgent(t)
	if out, err := tool("status", "lk", pod.Path()); err != nil {
		t.Fatalf("status after restart: %v\n%s", err, out)
	}

	// Agent down: ADD fails, STATUS says the plugin is not available.
	e.stopAgent(t)
	if out, err := tool("add", "lk", pod.Path()); err == nil || !strings.Contains(out, "agent") {
		t.Fatalf("add with agent down: %v\n%s", err, out)
	}
	if out, err := tool("status", "lk", pod.Path()); err == nil || !strings.Contains(out, "agent") {
		t.Fatalf("status with agent down: %v\n%s", err, out)
	}
}

func TestE2ELibcni(t *testing.T) {
	e := setup(t)
	cni, list := e.libcni(t)
	ctx := context.Background()
	pod := netnstest.New(t, "elpod")
	rt := &libcni.RuntimeConf{ContainerID: "libcni-1", NetNS: pod.Path(), IfName: "eth0"}

	r, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatal(err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatal(err)
	}
	res2, _ := current.NewResultFromResult(r2)
	if res.IPs[0].Address.String() != res2.IPs[0].Address.String() {
		t.Fatalf("duplicate add: %s then %s", res.IPs[0].Address.String(), res2.IPs[0].Address.String())
	}
	if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("check: %v", err)
	}
	if err := cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("status: %v", err)
	}
	unknown := &libcni.RuntimeConf{ContainerID: "libcni-unknown", NetNS: pod.Path(), IfName: "eth0"}
	// CHECK needs a cached result; give it one, for a container the agent never saw.
	if err := cni.CheckNetworkList(ctx, list, unknown); err == nil {
		t.Fatal("check of an unknown container passed")
	}

	// Malformed plugin configs: decode failure (6) and invalid config (7).
	for _, tc := range []struct {
		extra string
		code  uint
	}{
		{`,"mtu":"big"`, types.ErrDecodingFailure},
		{`,"mtu":10`, types.ErrInvalidNetworkConfig},
		{`,"subnet":"192.168.0.0/16"`, types.ErrInvalidNetworkConfig},
	} {
		bad, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(
			`{"cniVersion":"1.1.0","name":"lk","plugins":[{"type":"lanekit","agentSocket":%q%s}]}`, e.sock, tc.extra)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cni.AddNetworkList(ctx, bad, &libcni.RuntimeConf{ContainerID: "bad", NetNS: pod.Path(), IfName: "eth1"})
		if got := cniCode(t, err); got != tc.code {
			t.Errorf("config %s: code %d, want %d (%v)", tc.extra, got, tc.code, err)
		}
	}

	// GC keeps only the valid attachment.
	pod2 := netnstest.New(t, "elpod2")
	rt2 := &libcni.RuntimeConf{ContainerID: "libcni-2", NetNS: pod2.Path(), IfName: "eth0"}
	if _, err := cni.AddNetworkList(ctx, list, rt2); err != nil {
		t.Fatal(err)
	}
	err = cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "libcni-1", IfName: "eth0"}}})
	if err != nil {
		t.Fatalf("gc: %v", err)
	}
	if eps := e.endpoints(t); len(eps) != 1 || eps[0].GetAttachment().GetContainerId() != "libcni-1" {
		t.Fatalf("after gc: %v", eps)
	}
	for range 2 {
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			t.Fatalf("del: %v", err)
		}
	}
	if err := cni.DelNetworkList(ctx, list, rt2); err != nil {
		t.Fatalf("del of a gc'd attachment: %v", err)
	}
	e.assertClean(t)

	// 200 ADD/DEL cycles with distinct container IDs leave nothing behind;
	// a sample carries traffic to an anchor pod through the datapath.
	anchorRT := &libcni.RuntimeConf{ContainerID: "libcni-anchor", NetNS: pod2.Path(), IfName: "eth0"}
	ar, err := cni.AddNetworkList(ctx, list, anchorRT)
	if err != nil {
		t.Fatal(err)
	}
	anchor, _ := current.NewResultFromResult(ar)
	start := time.Now()
	for i := range 200 {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("cycle-%d", i), NetNS: pod.Path(), IfName: "eth0"}
		r, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			t.Fatalf("cycle %d add: %v", i, err)
		}
		if i%40 == 0 {
			res, _ := current.NewResultFromResult(r)
			e.talkThrough(t, pod.Path(), res.IPs[0].Address.IP.String(), pod2.Path(), anchor.IPs[0].Address.IP.String())
		}
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			t.Fatalf("cycle %d del: %v", i, err)
		}
	}
	t.Logf("200 libcni ADD/DEL cycles in %v", time.Since(start).Round(time.Millisecond))
	if err := cni.DelNetworkList(ctx, list, anchorRT); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)

	// Restart: an endpoint added before is re-adopted and still checks out.
	if _, err := cni.AddNetworkList(ctx, list, rt); err != nil {
		t.Fatal(err)
	}
	e.stopAgent(t)
	if _, err := cni.AddNetworkList(ctx, list, rt2); cniCode(t, err) != types.ErrTryAgainLater {
		t.Fatalf("add with agent down: %v, want code 11", err)
	}
	if err := cni.GetStatusNetworkList(ctx, list); cniCode(t, err) != types.ErrPluginNotAvailable {
		t.Fatalf("status with agent down: %v, want code 50", err)
	}
	if err := cni.DelNetworkList(ctx, list, rt); cniCode(t, err) != types.ErrTryAgainLater {
		t.Fatalf("del with agent down: %v, want code 11", err)
	}
	e.startAgent(t)
	if !strings.Contains(e.agentLog.String(), `"kept":1`) {
		t.Fatalf("restarted agent did not re-adopt the endpoint:\n%s", e.agentLog)
	}
	if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("check after restart: %v", err)
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)
}
