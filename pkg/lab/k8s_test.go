package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"net"
	"strconv"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/k8s"
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
// server is down, and after its restart new Pods work again; a VMI becomes
// a VM endpoint. Root only; uses the global lab: run it under
// flock /tmp/lanekit-lab.lock.
func TestLabK8s(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	k8stest.RequireBins(t)
	for _, tool := range []string{"ip", "iptables-restore", "nsenter", pingCommand()[0]} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (run ./scripts/deps.sh)", tool)
		}
	}
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
			t.Skipf("skipping: %v", err)
		}
	}
	bins.Self = filepath.Join(t.TempDir(), "lanekit")
	build := exec.Command("go", "build", "-o", bins.Self, "./cmd/lanekit")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build lanekit: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var upLog bytes.Buffer
	st, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, K8s: true, Bins: bins, Out: &upLog})
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

	t.Run("VMI", func(t *testing.T) { testLabVMI(ctx, t, srv, c) })
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

// testLabVMI: a VMI scheduled to node 2 with its launcher pod there becomes
// a VM endpoint in the launcher pod's netns; deleting the VMI removes it.
func testLabVMI(ctx context.Context, t *testing.T, srv *k8stest.Server, c kubernetes.Interface) {
	cfg := srv.RESTConfig()
	if err := k8stest.InstallKubeVirtCRD(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	launcher, err := c.CoreV1().Pods(PodNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-vm1", Namespace: PodNamespace, Labels: map[string]string{"kubevirt.io": "virt-launcher"}},
		Spec:       corev1.PodSpec{NodeName: KubeNodeName(2), Containers: []corev1.Container{{Name: "compute", Image: "none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WaitPodIP(ctx, c, PodNamespace, launcher.Name, time.Minute); err != nil {
		t.Fatal(err)
	}
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm1", "namespace": PodNamespace,
			"labels": map[string]any{"kubevirt.io/nodeName": KubeNodeName(2), "app": "vm1"}},
		"spec": map[string]any{"domain": map[string]any{
			"cpu": map[string]any{"cores": int64(2)},
			"devices": map[string]any{"networkInterfaceMultiqueue": true, "interfaces": []any{
				map[string]any{"name": "fast", "binding": map[string]any{"name": "lanekit"}, "macAddress": "02:00:00:aa:00:01"}}},
		}},
	}}
	created, err := dc.Resource(k8s.VMIResource).Namespace(PodNamespace).Create(ctx, vmi, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Object["status"] = map[string]any{"nodeName": KubeNodeName(2), "phase": "Running",
		"activePods": map[string]any{string(launcher.UID): KubeNodeName(2)}}
	if _, err := dc.Resource(k8s.VMIResource).Namespace(PodNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	name := k8s.VMName(PodNamespace, "vm1")
	findVM := func() *apiv1.VM {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := nodeAgent(t, 2).ListVMs(lctx, &apiv1.ListVMsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, vm := range resp.GetVms() {
			if vm.GetName() == name {
				return vm
			}
		}
		return nil
	}
	waitFor(t, "VM endpoint "+name+" on node 2", 60*time.Second, func() bool { return findVM() != nil })
	vm := findVM()
	if vm.GetQueues() != 2 || vm.GetMac() != "02:00:00:aa:00:01" {
		t.Errorf("VM endpoint %v: want 2 queues (multiqueue, 2 vCPUs) and the VMI interface's MAC", vm)
	}
	// The VM's device sits beside the launcher pod's eth0.
	launcherNS := PodNetns(2, launcher.UID)
	if out, err := run(ctx, "ip", "-n", launcherNS, "-o", "link", "show", k8s.VMIfName); err != nil || !strings.Contains(out, "02:00:00:aa:00:01") {
		t.Errorf("%s in %s: %v %s", k8s.VMIfName, launcherNS, err, out)
	}
	if ip := podIP(ctx, launcherNS); ip == "" {
		t.Errorf("the launcher pod's eth0 lost its address")
	}
	if err := dc.Resource(k8s.VMIResource).Namespace(PodNamespace).Delete(ctx, "vm1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "VM endpoint removed with its VMI", 60*time.Second, func() bool { return findVM() == nil })
}
