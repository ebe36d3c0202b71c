package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/k8s"
	"github.com/lanekit/lanekit/pkg/kubevirt"
	"github.com/lanekit/lanekit/pkg/rss"
)

// nodeAgent dials node i's agent API.
func nodeAgent(t *testing.T, i int) apiv1.AgentClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+AgentSocket(i), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return apiv1.NewAgentClient(conn)
}

// endpointFor returns node i's endpoint of pod ns/name, if any.
func endpointFor(t *testing.T, i int, ns, name string) *apiv1.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := nodeAgent(t, i).ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range resp.GetEndpoints() {
		if ep.GetLabels()["K8S_POD_NAMESPACE"] == ns && ep.GetLabels()["K8S_POD_NAME"] == name {
			return ep
		}
	}
	return nil
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, what)
		}
	}
}

// ping sends count pings from netns ns to addr; it returns the loss.
func ping(ctx context.Context, ns, addr string, count int, interval string) (string, error) {
	argv := append(pingCommand(), "-q", "-c", fmt.Sprint(count), "-i", interval, "-W", "1", addr)
	return inNS(ctx, ns, argv...)
}

// TestLabK8s runs the lab against a real API server (`lab up --k8s`): the
// agents take their pod CIDRs and routes from Node objects, lab kubelets
// attach Pods created through the API (CNI ADD via libcni with kubelet's
// CNI_ARGS) and detach deleted ones; traffic keeps flowing while the API
// server is down, and after its restart new Pods work again; KubeVirt VMs
// (a QEMU guest from lab up --k8s --vm, and a VMI whose socket a virtio test
// frontend takes) come through the CNI on the fast lane. Root only; uses the global lab: run it under
// flock /tmp/lanekit-lab.lock.
func TestLabK8s(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	lockLab()
	k8stest.RequireBins(t)
	testutil.RequireTools(t, "ip", "iptables-restore", "nsenter", pingCommand()[0])
	root := repoRoot(t)
	binDir := os.Getenv("LANEKIT_BIN")
	if binDir == "" {
		binDir = filepath.Join(root, "bin")
	}
	bins := Bins{Dir: binDir, CNIDir: filepath.Join(binDir, "cni")}
	for _, check := range []func() error{bins.checkBaseline, bins.checkLanekit} {
		if err := check(); err != nil {
			if os.Getenv("LANEKIT_BIN") != "" {
				t.Fatalf("%v (make test builds them first)", err)
			}
			testutil.MissingDep(t, "%v", err)
		}
	}
	bins.Self = CLIForTests(t)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var upLog bytes.Buffer
	st, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, K8s: true, VM: true, VMQueues: 2, NoStdVM: true, Bins: bins, Out: &upLog})
	t.Cleanup(func() {
		if t.Failed() {
			for i := 1; i <= 2; i++ {
				t.Logf("agent %d log: %s", i, logTail(AgentLog(i)))
				t.Logf("kubelet %d log: %s", i, logTail(KubeletLog(i)))
			}
			t.Logf("kube-apiserver log: %s", logTail(filepath.Join(K8sDir, "kube-apiserver.log")))
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if err := Down(dctx, DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := listLabNetns(); len(left) > 0 {
			t.Errorf("netns left after down: %v", left)
		}
		if out, _ := exec.Command("pgrep", "-x", "kube-apiserver").Output(); len(out) > 0 {
			// Other helpers' tests may run their own; ours is stopped by pid.
			t.Logf("kube-apiserver processes after down: %s", out)
		}
	})
	t.Logf("lab up:\n%s", upLog.String())
	if err != nil {
		t.Fatal(err)
	}
	srv, c, err := K8s()
	if err != nil {
		t.Fatal(err)
	}
	var status bytes.Buffer
	if err := WriteStatus(ctx, &status); err != nil || !strings.Contains(status.String(), "k8s: kube-apiserver https://"+APIAddress) {
		t.Errorf("lab status: %v\n%s", err, status.String())
	}

	// Routes to the other node's pods come from its Node object: lanekit's
	// route protocol, no static route.
	for i, other := range map[int]int{1: 2, 2: 1} {
		out, err := run(ctx, "ip", "-n", NodeNS(i), "-4", "route", "show", PodCIDR(other))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s via %s dev %s proto %d", PodCIDR(other), UnderlayIP(other), Uplink, k8s.RouteProtocol)
		if !strings.Contains(out, want) {
			t.Errorf("%s: route to %s is %q, want %q (from the Node, not static)", NodeNS(i), PodCIDR(other), strings.TrimSpace(out), want)
		}
	}
	lk := st.PodsOf(KindLanekit)
	if len(lk) != 2 {
		t.Fatalf("lanekit pods %+v, want one per node", lk)
	}
	p1, p2 := lk[0], lk[1]
	if out, err := ping(ctx, p1.NS, p2.IP, 3, "0.2"); err != nil {
		t.Fatalf("lab pod %s -> %s across nodes: %v\n%s", p1.NS, p2.IP, err, out)
	}

	// A Pod through the API: the kubelet attaches it, the agent has it
	// under its CNI args, and it answers across nodes.
	mk := func(name string, node int) *corev1.Pod {
		p, err := c.CoreV1().Pods(PodNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: PodNamespace, Labels: map[string]string{"app": name}},
			Spec:       corev1.PodSpec{NodeName: KubeNodeName(node), Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	web := mk("web", 2)
	webIP, err := WaitPodIP(ctx, c, PodNamespace, "web", time.Minute)
	if err != nil {
		t.Fatalf("%v; kubelet: %s", err, logTail(KubeletLog(2)))
	}
	ep := endpointFor(t, 2, PodNamespace, "web")
	if ep == nil || len(ep.GetIps()) == 0 || !strings.HasPrefix(ep.GetIps()[0].GetAddress(), webIP+"/") {
		t.Fatalf("node 2 agent endpoint for default/web: %v, want IP %s", ep, webIP)
	}
	if got := ep.GetAttachment().GetContainerId(); got != InfraContainerID(web.UID) {
		t.Errorf("endpoint container ID %q, want the sandbox ID %q", got, InfraContainerID(web.UID))
	}
	if out, err := ping(ctx, p1.NS, webIP, 3, "0.2"); err != nil {
		t.Fatalf("ping new pod %s from node 1: %v\n%s", webIP, err, out)
	}

	// Deleting it (gracefully, as kubectl does): CNI DEL, endpoint and netns
	// gone, the Pod finally deleted by the kubelet.
	webNS := PodNetns(2, web.UID)
	if err := c.CoreV1().Pods(PodNamespace).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod web gone from the API", 30*time.Second, func() bool {
		_, err := c.CoreV1().Pods(PodNamespace).Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if endpointFor(t, 2, PodNamespace, "web") != nil {
		t.Error("the agent still has web's endpoint after the Pod is deleted")
	}
	if netnsExists(webNS) {
		t.Errorf("web's netns %s survives the Pod", webNS)
	}
	if _, err := ping(ctx, p1.NS, webIP, 1, "0.2"); err == nil {
		t.Errorf("%s still answers after its Pod is deleted", webIP)
	}

	// The API server dies mid-run: traffic continues (0 loss across the
	// kill), the agents stay ready. After the restart, a new Pod works.
	pingDone := make(chan error, 1)
	var pingOut string
	go func() {
		var err error
		pingOut, err = ping(ctx, p1.NS, p2.IP, 40, "0.1")
		pingDone <- err
	}()
	time.Sleep(time.Second)
	srv.KillAPIServer()
	t.Log("kube-apiserver killed")
	time.Sleep(2 * time.Second)
	for i := 1; i <= 2; i++ {
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		stResp, err := nodeAgent(t, i).Status(sctx, &apiv1.StatusRequest{})
		scancel()
		if err != nil || !stResp.GetReady() {
			t.Errorf("agent %d with the API server down: ready=%v reason=%q err=%v", i, stResp.GetReady(), stResp.GetReason(), err)
		}
	}
	if err := <-pingDone; err != nil || !strings.Contains(pingOut, " 0% packet loss") {
		t.Errorf("traffic across the API server kill: %v\n%s", err, pingOut)
	}
	if out, err := ping(ctx, p2.NS, p1.IP, 3, "0.2"); err != nil {
		t.Errorf("new flow while the API server is down: %v\n%s", err, out)
	}
	if err := srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	_, c, err = K8s()
	if err != nil {
		t.Fatal(err)
	}
	mk("after", 1)
	afterIP, err := WaitPodIP(ctx, c, PodNamespace, "after", time.Minute)
	if err != nil {
		t.Fatalf("pod after the API server restart: %v; kubelet: %s", err, logTail(KubeletLog(1)))
	}
	if out, err := ping(ctx, p2.NS, afterIP, 3, "0.2"); err != nil {
		t.Errorf("ping the pod created after the restart: %v\n%s", err, out)
	}

	t.Run("KubeVirtGuest", func(t *testing.T) { testLabKubeVirtGuest(ctx, t, bins, st, p1) })
	t.Run("VMI", func(t *testing.T) { testLabVMI(ctx, t, srv, c, bins, p1) })
	t.Run("ServicesAndPolicies", func(t *testing.T) { testLabServices(ctx, t, bins, c, p1, p2) })
}

// dial connects from ns to addr through `lanekit lab tcp-dial` (a TCP echo
// round trip); it returns the error or "".
func dial(ctx context.Context, t *testing.T, b Bins, ns, addr string) string {
	t.Helper()
	out, err := nsCommand(ctx, ns, b.Self, "lab", "tcp-dial", "--timeout", "1s", addr).Output()
	if err != nil {
		t.Fatalf("tcp-dial in %s: %v", ns, err)
	}
	rs, err := ParseDialResults(out)
	if err != nil || len(rs) != 1 {
		t.Fatalf("tcp-dial output %q: %v", out, err)
	}
	if rs[0].OK {
		return ""
	}
	return rs[0].Error
}

// testLabServices: a Service + EndpointSlice created through the API makes
// the VIP connect (lb datapath, fed by the agent's object seam); deleting
// the slice while node 1's agent is down is converged by its resync after
// the restart; a NetworkPolicy through the API isolates the backend pod.
func testLabServices(ctx context.Context, t *testing.T, b Bins, c kubernetes.Interface, client, backend Pod) {
	echo, err := startEcho(ctx, b, backend.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-echo.Process.Pid, syscall.SIGKILL)
		_ = echo.Wait()
	}()
	direct := net.JoinHostPort(backend.IP, strconv.Itoa(EchoPort))
	if e := dial(ctx, t, b, client.NS, direct); e != "" {
		t.Fatalf("echo %s from %s: %s", direct, client.NS, e)
	}
	svc, err := c.CoreV1().Services(PodNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: PodNamespace},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "lab"},
			Ports: []corev1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(EchoPort), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No endpointslice controller runs here: the test writes the slice.
	_, err = c.DiscoveryV1().EndpointSlices(PodNamespace).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Namespace: PodNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{backend.IP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("echo"), Port: ptr.To[int32](EchoPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	var last string
	waitFor(t, "VIP "+vip+" connects from node 1", 30*time.Second, func() bool { last = dial(ctx, t, b, client.NS, vip); return last == "" })

	// Node 1's agent is down while the slice is deleted: the pinned
	// service maps keep the VIP working until the restarted agent's
	// resync removes it.
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	terminate(st.Nodes[0].AgentPID, 5*time.Second)
	if err := c.DiscoveryV1().EndpointSlices(PodNamespace).Delete(ctx, "echo-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if e := dial(ctx, t, b, client.NS, vip); e != "" {
		t.Errorf("VIP stopped with the agent (the datapath should keep it): %s", e)
	}
	pid, err := startAgent(ctx, b, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	st.Nodes[0].AgentPID = pid
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "VIP without backends refused after the agent's resync", 30*time.Second, func() bool {
		return dial(ctx, t, b, client.NS, vip) != ""
	})

	// Default-deny ingress for the lab pods, through the API.
	_, err = c.NetworkingV1().NetworkPolicies(PodNamespace).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-lab", Namespace: PodNamespace},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "lab"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "policy isolates the backend", 30*time.Second, func() bool { return dial(ctx, t, b, client.NS, direct) != "" })
	if err := c.NetworkingV1().NetworkPolicies(PodNamespace).Delete(ctx, "deny-lab", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "backend reachable once the policy is deleted", 30*time.Second, func() bool { return dial(ctx, t, b, client.NS, direct) == "" })
}

// testLabKubeVirtGuest: `lab up --k8s --vm` made its QEMU guest the
// KubeVirt way (VMI + launcher pod through the API, VM endpoint and backend
// from the CNI, QEMU on the device-info socket). The guest's only NIC is
// vhost-user to the agent's lanekit-vhost, whose only port is the VM
// endpoint's AF_XDP sockets: a pod on node 1 and the guest reach each other
// both ways, and the VM endpoint's datapath counters saw it. The agent
// SIGKILLed: the guest stays reachable (the backend outlives it); restarted:
// it adopts the same backend process.
func testLabKubeVirtGuest(ctx context.Context, t *testing.T, b Bins, st *State, client Pod) {
	if len(st.VMs) != 1 {
		t.Fatalf("lab VMs %+v, want the KubeVirt guest", st.VMs)
	}
	v := st.VMs[0]
	vm, err := labVMEndpoint(ctx, v.Node, k8s.VMName(PodNamespace, v.Name))
	if err != nil {
		t.Fatal(err)
	}
	if vm.GetBackend().GetPid() == 0 || vm.GetQueues() != 2 {
		t.Fatalf("VM endpoint %v: want the agent's backend running and 2 queues", vm)
	}
	if out, err := ping(ctx, client.NS, v.IP, 3, "0.2"); err != nil {
		t.Errorf("pod %s -> guest %s: %v\n%s", client.IP, v.IP, err, out)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	con, err := guest.DialConsole(cctx, v.SerialSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	if err := guestRun(cctx, con, "ping -c 2 -W 2 "+client.IP, ""); err != nil {
		t.Errorf("guest -> pod %s: %v", client.IP, err)
	}
	// The agent-run backend moved them (its metrics socket, also part of the
	// agent's /metrics).
	if rx, tx, err := bench.BackendPackets(cctx, vm.GetBackend().GetMetricsSocket()); err != nil || rx < 3 || tx < 3 {
		t.Errorf("backend packets rx %d tx %d (%v): the guest's traffic did not cross lanekit-vhost", rx, tx, err)
	}
	eps, err := nodeAgent(t, v.Node).ListEndpoints(cctx, &apiv1.ListEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps.GetEndpoints() {
		if ep.GetId() == vm.GetEndpoint().GetId() {
			if c := ep.GetCounters(); c.GetToPackets() < 3 || c.GetFromPackets() < 3 {
				t.Errorf("VM endpoint counters %v: the datapath did not carry the pings", c)
			}
		}
	}

	n := &st.Nodes[v.Node-1]
	if err := syscall.Kill(n.AgentPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "agent gone", 5*time.Second, func() bool { return !alive(n.AgentPID) })
	if out, err := ping(ctx, client.NS, v.IP, 3, "0.2"); err != nil {
		t.Errorf("pod -> guest with its node's agent down: %v\n%s", err, out)
	}
	pid, err := startAgent(ctx, b, v.Node, true)
	if err != nil {
		t.Fatal(err)
	}
	n.AgentPID = pid
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	after, err := labVMEndpoint(ctx, v.Node, vm.GetName())
	if err != nil {
		t.Fatal(err)
	}
	if after.GetBackend().GetPid() != vm.GetBackend().GetPid() || !after.GetServing() {
		t.Errorf("after the agent restart: backend %v serving %v, want pid %d adopted", after.GetBackend(), after.GetServing(), vm.GetBackend().GetPid())
	}
	if out, err := ping(ctx, client.NS, v.IP, 3, "0.2"); err != nil {
		t.Errorf("pod -> guest after the agent restart: %v\n%s", err, out)
	}

	// The backend crashes: the agent starts a new one, QEMU reconnects (as
	// the sidecar's domain asks) and the guest is reachable again.
	if err := syscall.Kill(int(after.GetBackend().GetPid()), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var restarted *apiv1.VM
	waitFor(t, "backend restarted by the agent", 20*time.Second, func() bool {
		restarted, _ = labVMEndpoint(ctx, v.Node, vm.GetName())
		return restarted != nil && restarted.GetBackend().GetPid() != 0 && restarted.GetBackend().GetPid() != after.GetBackend().GetPid()
	})
	if restarted.GetBackend().GetRestarts() != 1 {
		t.Errorf("backend restarts %d, want 1", restarted.GetBackend().GetRestarts())
	}
	waitFor(t, "guest reachable through the new backend", 30*time.Second, func() bool {
		_, err := ping(ctx, client.NS, v.IP, 1, "0.2")
		return err == nil
	})
}

// testLabVMI: a KubeVirt VM on lanekit's fast lane, as a cluster sets it up.
// A VMI with a lanekit-bound interface, its launcher pod asking for the
// lanekit-vm network (a NetworkAttachmentDefinition with "vhostUser") and
// carrying KubeVirt's "sockets" emptyDir: the lab kubelet (as kubelet +
// Multus) runs the lanekit CNI for it, the agent makes the VM endpoint on
// the Multus ifname with the VMI's queue count and MAC and starts
// lanekit-vhost in the pod's volume; the plugin's device-info reaches
// network-status; the binding sidecar's planner turns it (as network-info)
// into the domain's vhost-user interface; a virtio frontend (rss_guest) on
// that socket receives what a pod on node 1 sends to the VM's address, which
// only the fast lane delivers there, each datagram with the RSS hash the BPF
// reference gives its flow under the guest's key (on the default --rx-gso
// kernel path lanekit-vhost computes it). Deleting the pod removes it all.
func testLabVMI(ctx context.Context, t *testing.T, srv *k8stest.Server, c kubernetes.Interface, bins Bins, client Pod) {
	dc, err := SetupKubeVirt(ctx, srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	const mac = "02:00:00:aa:00:01"
	kvm, err := CreateKubeVirtVM(ctx, c, dc, 2, "vm-rx", 2, mac, map[string]string{"app": "vm-rx"})
	if err != nil {
		t.Fatal(err)
	}
	launcher, created, ifname := kvm.Launcher, kvm.VMI, kvm.IfName
	name := k8s.VMName(PodNamespace, "vm-rx")
	findVM := func() *apiv1.VM {
		vm, err := labVMEndpoint(ctx, 2, name)
		if errors.Is(err, errNoVM) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return vm
	}
	vm := findVM()
	if vm == nil {
		t.Fatalf("no VM endpoint %s on node 2", name)
	}
	sockPath := "/var/run/kubevirt/sockets/lanekit-" + ifname + ".sock"
	hostSock := filepath.Join(PodVolumeDir(launcher.UID, "sockets"), "lanekit-"+ifname+".sock")
	be := vm.GetBackend()
	if vm.GetQueues() != 2 || vm.GetMac() != mac || be.GetPid() == 0 || be.GetSocket() != sockPath || be.GetHostSocket() != hostSock {
		t.Fatalf("VM endpoint %v: want 2 queues (multiqueue, 2 vCPUs), the VMI's MAC and a running backend on %s", vm, hostSock)
	}
	launcherNS := PodNetns(2, launcher.UID)
	if out, err := run(ctx, "ip", "-n", launcherNS, "-o", "link", "show", ifname); err != nil || !strings.Contains(out, mac) {
		t.Errorf("%s in %s: %v %s", ifname, launcherNS, err, out)
	}

	// Multus' network-status carries the plugin's device-info, which
	// virt-controller copies into the sidecar's network-info.
	if st := kvm.Status; len(st.IPs) != 1 || st.IPs[0]+"/32" != vm.GetAddress() || st.MAC != mac {
		t.Errorf("network-status entry %+v: want the VM's address %s and MAC", st, vm.GetAddress())
	}
	var dev kubevirt.DeviceInfo
	if err := json.Unmarshal(kvm.Status.DeviceInfo, &dev); err != nil || dev.Type != "vhost-user" || dev.VhostUser == nil ||
		dev.VhostUser.Mode != "client" || dev.VhostUser.Path != sockPath || kvm.Socket.Path != sockPath || kvm.HostSocket != hostSock {
		t.Fatalf("network-status entry %+v device-info %s (host %s): want vhost-user client on %s", kvm.Status, kvm.Status.DeviceInfo, kvm.HostSocket, sockPath)
	}
	// The sidecar plans the domain's interface from network-info and the VMI.
	sock := kvm.Socket
	raw, _ := json.Marshal(created.Object)
	kv, err := kubevirt.ParseVMI(raw)
	if err != nil {
		t.Fatal(err)
	}
	atts, err := kubevirt.Plan(kv, kubevirt.BindingName, map[string]kubevirt.VhostSocket{"fast": sock})
	if err != nil {
		t.Fatal(err)
	}
	domain, err := os.ReadFile(filepath.Join(repoRoot(t), "pkg/kubevirt/testdata/pod-and-secondary.xml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := kubevirt.Rewrite(domain, atts)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`type="vhostuser"`, `path="` + sockPath + `"`, `mode="client"`, `queues="2"`, `address="` + mac + `"`} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("domain after the sidecar lacks %s", want)
		}
	}

	// A virtio frontend where QEMU would be: it sees what pods send the VM.
	vmIP, _, _ := strings.Cut(vm.GetAddress(), "/")
	// Through a short link, as the compute container's mount is (kubelet's
	// volume path is longer than a unix socket path may be).
	mount := filepath.Join(t.TempDir(), "sockets")
	if err := os.Symlink(PodVolumeDir(launcher.UID, "sockets"), mount); err != nil {
		t.Fatal(err)
	}
	// --rss: RSS and hash report negotiated, the RSS verification key, types
	// IPv4/TCPv4/UDPv4; the backend computes each packet's hash itself on
	// the default --rx-gso kernel path (no steer_vm).
	guest := exec.CommandContext(ctx, filepath.Join(bins.Dir, "lanekit-rss-guest"), "--socket", filepath.Join(mount, filepath.Base(hostSock)), "--queues", "2",
		"--rss", "--stdin-stop", "--duration", "60")
	var report bytes.Buffer
	guest.Stdout = &report
	stop, err := guest.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := guest.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := guest.Start(); err != nil {
		t.Fatal(err)
	}
	defer guest.Process.Kill()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var lines []string
		for sc.Scan() {
			if strings.Contains(sc.Text(), "ready") {
				ready <- nil
				io.Copy(io.Discard, stderr)
				return
			}
			lines = append(lines, sc.Text())
		}
		ready <- fmt.Errorf("rss_guest ended before ready: %s", strings.Join(lines, " | "))
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("rss_guest not ready after 20s")
	}
	send := `for p in 1 2 3 4 5 6 7 8; do echo lanekit > /dev/udp/` + vmIP + `/$((9000 + p)); sleep 0.05; done`
	if out, err := nsCommand(ctx, client.NS, "bash", "-c", send).CombinedOutput(); err != nil {
		t.Fatalf("send from %s: %v %s", client.NS, err, out)
	}
	time.Sleep(time.Second)
	fmt.Fprintln(stop)
	if err := guest.Wait(); err != nil {
		t.Fatalf("rss_guest: %v; backend log: %s", err, logTail(filepath.Join(NodeDir(2), "state", "vhost", name+".log")))
	}
	var rep struct {
		HashReport bool   `json:"hash_report"`
		Frames     uint64 `json:"frames"`
		Flows      []struct {
			Flow    string            `json:"flow"`
			Frames  uint64            `json:"frames"`
			Hashes  map[string]uint64 `json:"hashes"`
			Reports map[string]uint64 `json:"reports"`
		} `json:"flows"`
	}
	if err := json.Unmarshal(report.Bytes(), &rep); err != nil {
		t.Fatalf("rss_guest report %q: %v", report.String(), err)
	}
	t.Logf("rss_guest: %s", report.String())
	if !rep.HashReport {
		t.Errorf("the frontend did not get VIRTIO_NET_F_HASH_REPORT: %s", report.String())
	}
	hasher, err := rss.NewHasher()
	if err != nil {
		t.Fatal(err)
	}
	defer hasher.Close()
	fromClient := uint64(0)
	for _, f := range rep.Flows {
		// "udp SRC:SPORT DST:DPORT"
		fields := strings.Fields(f.Flow)
		if len(fields) != 3 || fields[0] != "udp" || !strings.HasPrefix(fields[1], client.IP+":") || !strings.HasPrefix(fields[2], vmIP+":") {
			continue
		}
		fromClient += f.Frames
		src, err1 := netip.ParseAddrPort(fields[1])
		dst, err2 := netip.ParseAddrPort(fields[2])
		if err1 != nil || err2 != nil {
			t.Fatalf("flow %q: %v %v", f.Flow, err1, err2)
		}
		want, err := hasher.Hash(rss.DefaultKey, rss.TypeUDPv4, rss.Flow{Src: src.Addr(), Dst: dst.Addr(), Sport: src.Port(), Dport: dst.Port()})
		if err != nil {
			t.Fatal(err)
		}
		// Every frame of the flow carries the BPF reference's hash, type UDPv4.
		wantHash := fmt.Sprintf("0x%08x", want.Hash)
		if len(f.Hashes) != 1 || f.Hashes[wantHash] != f.Frames || len(f.Reports) != 1 || f.Reports[strconv.Itoa(int(rss.ReportUDPv4))] != f.Frames {
			t.Errorf("flow %s: hashes %v, reports %v; want {%s: %d}, {%d: %d}", f.Flow, f.Hashes, f.Reports, wantHash, f.Frames, rss.ReportUDPv4, f.Frames)
		}
	}
	if fromClient < 8 {
		t.Errorf("the VM's frontend got %d of the 8 datagrams from pod %s (report %s)", fromClient, client.IP, report.String())
	}

	if err := c.CoreV1().Pods(PodNamespace).Delete(ctx, launcher.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "VM endpoint removed with its launcher pod", 60*time.Second, func() bool { return findVM() == nil })
	if err := syscall.Kill(int(be.GetPid()), 0); err == nil {
		t.Errorf("backend pid %d still runs after the pod's DEL", be.GetPid())
	}
	waitFor(t, "the pod's volume removed with it", 30*time.Second, func() bool {
		_, err := os.Stat(PodVolumeDir(launcher.UID, "sockets"))
		return os.IsNotExist(err)
	})
}
