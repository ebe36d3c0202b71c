package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// offlineEnv runs the built lanekitd against a real API server.
type offlineEnv struct {
	bin, plugins, dir, sock, state, bpf, kubeconfig, metrics string
	node                                                     string   // netns path: the agent's --host-netns
	env                                                      []string // added to the agent's environment
}

// TestStartWithoutAPIServer: a node agent restarted while the API server is
// unreachable (its pod CIDR stored by the previous run) starts at once from
// the stored pod CIDR instead of waiting for the Node (where the liveness
// probe killed it, and with it every VM backend of the node): its socket
// serves CNI ADD from that CIDR, /healthz is OK, /readyz and Status say the
// API server is not reachable; when the API server comes back it becomes
// ready. The first start (nothing stored) took the CIDR from the Node.
func TestStartWithoutAPIServer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBPFFS(t)
	srv := k8stest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	e := nodeEnv(t, ctx, srv, admin)

	// First start: from the Node, which is stored.
	agent, log := e.start(t)
	e.waitReady(t, log, 60*time.Second)
	e.stop(t, agent, log)

	// The API server goes away; the agent restarts.
	srv.KillAPIServer()
	started := time.Now()
	agent, log = e.start(t)
	defer e.stop(t, agent, log)
	st := e.waitStatus(t, log, 30*time.Second)
	t.Logf("serving %s after the restart", time.Since(started).Round(time.Millisecond))
	// The stored control plane's background restore (milliseconds here) is
	// a not-ready reason of its own that wins while it runs: what the
	// agent says once it serves from the store comes after it.
	for deadline := time.Now().Add(30 * time.Second); strings.Contains(st.Reason, "restoring the stored") && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		st = e.waitStatus(t, log, 10*time.Second)
	}
	if st.Ready || !strings.Contains(st.Reason, "API server not reachable") || st.PodCidr != "10.244.7.0/24" {
		t.Fatalf("status without the API server: ready %v (%q), pod CIDR %s; want not ready, API server not reachable, the stored 10.244.7.0/24\n%s",
			st.Ready, st.Reason, st.PodCidr, log)
	}
	if code, body := e.probe(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz without the API server: %d %q, want 200 (liveness must not kill the agent)", code, body)
	}
	if code, body := e.probe(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "API server not reachable") {
		t.Errorf("/readyz without the API server: %d %q, want 503 saying the API server is not reachable", code, body)
	}
	// CNI ADD through the real plugin: an address of the stored pod CIDR.
	list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(
		`{"cniVersion":"1.1.0","name":"lk","plugins":[{"type":"lanekit","agentSocket":%q}]}`, e.sock)))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{e.plugins}, t.TempDir(), nil)
	pod := netnstest.New(t, "offpod")
	rt := &libcni.RuntimeConf{ContainerID: "offline-1", NetNS: pod.Path(), IfName: "eth0"}
	r, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatalf("CNI ADD without the API server: %v\n%s", err, log)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil || len(res.IPs) == 0 || !strings.HasPrefix(res.IPs[0].Address.String(), "10.244.7.") {
		t.Fatalf("CNI ADD result %+v %v, want an address of 10.244.7.0/24", res, err)
	}
	defer cni.DelNetworkList(context.Background(), list, rt) //nolint:errcheck // cleanup

	// The API server is back: the agent finds the same pod CIDR and gets ready.
	if err := srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, log, 60*time.Second)
	if !strings.Contains(log.String(), "the Node's pod CIDR is the stored one") {
		t.Errorf("no log of the API server's return:\n%s", log)
	}
}

// TestStartWithoutAPIServerCIDRChanged: the Node came back with another pod
// CIDR while the agent ran from the stored one. With no address allocated
// from the stored CIDR, the agent says so and exits, and its restart takes
// the Node's; with addresses allocated (pods and VMs hold them) it keeps
// serving them, not ready with the reason, as the store refuses a CIDR
// change under allocations (ipam.ErrCIDRChanged).
func TestStartWithoutAPIServerCIDRChanged(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBPFFS(t)
	srv := k8stest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	node := func(cidr string) {
		t.Helper()
		err := admin.CoreV1().Nodes().Delete(ctx, "n7", metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n7"},
			Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e := newOfflineEnv(t)
	if err := srv.WriteKubeconfig(e.kubeconfig); err != nil {
		t.Fatal(err)
	}
	node("10.244.7.0/24")
	agent, log := e.start(t)
	e.waitReady(t, log, 60*time.Second)
	e.stop(t, agent, log)

	// The Node is now 10.244.8.0/24; the agent starts from the stored
	// 10.244.7.0/24 with nothing allocated, then reaches the API server.
	node("10.244.8.0/24")
	srv.KillAPIServer()
	agent, log = e.start(t)
	e.waitStatus(t, log, 30*time.Second)
	if err := srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(log.String(), "POD CIDR CHANGED") || !strings.Contains(log.String(), "restarting to take the Node's") {
			t.Fatalf("agent exit %v, want an error saying the pod CIDR changed:\n%s", err, log)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent kept serving the stored pod CIDR with nothing allocated:\n%s", log)
	}
	// Its restart takes the Node's.
	agent, log = e.start(t)
	e.waitReady(t, log, 60*time.Second)
	if st := e.waitStatus(t, log, 10*time.Second); st.PodCidr != "10.244.8.0/24" {
		t.Fatalf("pod CIDR after the restart %s, want the Node's 10.244.8.0/24", st.PodCidr)
	}
	// An address is allocated (not deleted: a pod holds it).
	list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(
		`{"cniVersion":"1.1.0","name":"lk","plugins":[{"type":"lanekit","agentSocket":%q}]}`, e.sock)))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{e.plugins}, t.TempDir(), nil)
	pod := netnstest.New(t, "offpod")
	if _, err := cni.AddNetworkList(ctx, list, &libcni.RuntimeConf{ContainerID: "held", NetNS: pod.Path(), IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	e.stop(t, agent, log)

	// Again another CIDR, now with an address allocated: serving, not ready.
	node("10.244.9.0/24")
	srv.KillAPIServer()
	agent, log = e.start(t)
	defer e.stop(t, agent, log)
	e.waitStatus(t, log, 30*time.Second)
	if err := srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	var st *apiv1.StatusResponse
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if st = e.waitStatus(t, log, 10*time.Second); strings.Contains(st.Reason, "pod CIDR differs") {
			break
		}
	}
	if st.Ready || !strings.Contains(st.Reason, "10.244.9.0/24") || st.PodCidr != "10.244.8.0/24" || st.IpsAllocated != 1 {
		t.Fatalf("status after a CIDR change under allocations: ready %v (%q), pod CIDR %s, %d allocated; want not ready saying so, serving 10.244.8.0/24\n%s",
			st.Ready, st.Reason, st.PodCidr, st.IpsAllocated, log)
	}
	if code, _ := e.probe(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after a CIDR change: %d, want 200 (the agent keeps its pods' and VMs' network)", code)
	}
}

// nodeEnv registers Node n7 (pod CIDR 10.244.7.0/24) on srv and returns an
// offline env whose kubeconfig points at srv.
func nodeEnv(t *testing.T, ctx context.Context, srv *k8stest.Server, admin kubernetes.Interface) *offlineEnv {
	t.Helper()
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n7"},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e := newOfflineEnv(t)
	if err := srv.WriteKubeconfig(e.kubeconfig); err != nil {
		t.Fatal(err)
	}
	return e
}

func newOfflineEnv(t *testing.T) *offlineEnv {
	t.Helper()
	dir := t.TempDir()
	e := &offlineEnv{dir: dir, bin: filepath.Join(dir, "bin"), plugins: filepath.Join(dir, "cni"),
		sock: filepath.Join(dir, "agent.sock"), state: filepath.Join(dir, "state"), kubeconfig: filepath.Join(dir, "kubeconfig")}
	for _, d := range []string{e.bin, e.plugins} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	testutil.GoBuild(t, "../..", e.bin, nil, []string{"./cmd/lanekitd", "./cmd/lanekit-cni"}) // once per run
	if err := os.Rename(filepath.Join(e.bin, "lanekit-cni"), filepath.Join(e.plugins, "lanekit")); err != nil {
		t.Fatal(err)
	}
	e.node = netnstest.New(t, "offnode").Path()
	// A bpffs of the test's own, outliving each agent process.
	fs := filepath.Join(dir, "bpffs")
	if err := os.MkdirAll(fs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", fs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", fs, err)
	}
	t.Cleanup(func() { unix.Unmount(fs, unix.MNT_DETACH) })
	e.bpf = filepath.Join(fs, "lanekit")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.metrics = ln.Addr().String()
	ln.Close()
	return e
}

// start runs lanekitd (its process in the test's network namespace, where
// the API server and the probes are; its datapath in the node namespace).
func (e *offlineEnv) start(t *testing.T, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	log := &bytes.Buffer{}
	cmd := exec.Command(filepath.Join(e.bin, "lanekitd"), append([]string{"--state-dir", e.state, "--socket", e.sock,
		"--host-netns", e.node, "--uplink", "lo", "--mtu", "1500", "--bpf-dir", e.bpf,
		"--vm-socket-dir", filepath.Join(e.dir, "vm"), "--socket-lb=false", "--service-health-checks=false",
		"--node-name", "n7", "--kubeconfig", e.kubeconfig, "--metrics-listen", e.metrics, "--log-json=false"}, extra...)...)
	cmd.Stderr = log
	if len(e.env) > 0 {
		cmd.Env = append(os.Environ(), e.env...)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, log
}

func (e *offlineEnv) stop(t *testing.T, cmd *exec.Cmd, log *bytes.Buffer) {
	t.Helper()
	if cmd.ProcessState != nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v\n%s", err, log)
	}
}

func (e *offlineEnv) status() (*apiv1.StatusResponse, error) {
	conn, err := grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return apiv1.NewAgentClient(conn).Status(ctx, &apiv1.StatusRequest{})
}

// waitStatus waits until the agent's socket answers Status.
func (e *offlineEnv) waitStatus(t *testing.T, log *bytes.Buffer, limit time.Duration) *apiv1.StatusResponse {
	t.Helper()
	var err error
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var st *apiv1.StatusResponse
		if st, err = e.status(); err == nil {
			return st
		}
	}
	t.Fatalf("the agent's socket did not answer within %s (%v): the agent does not serve without the API server\n%s", limit, err, log)
	return nil
}

// waitReady waits until /readyz says ready.
func (e *offlineEnv) waitReady(t *testing.T, log *bytes.Buffer, limit time.Duration) {
	t.Helper()
	code, body := 0, ""
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body = e.probe(t, "/readyz"); code == http.StatusOK {
			return
		}
	}
	t.Fatalf("not ready within %s: /readyz %d %q\n%s", limit, code, body, log)
}

// probe GETs path on the metrics listener (what kubelet's probes ask).
func (e *offlineEnv) probe(t *testing.T, path string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + e.metrics + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
