package lab

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// kubevirtService: a ClusterIP Service selecting the VM by the label KubeVirt
// copies to its launcher pod. The endpointslice controller lists the launcher
// pod's own address; the agents hand the datapath the VM's (pkg/k8s
// vmsvc.go), so a pod on node 1 reaches the guest's HTTP server through the
// ClusterIP, every request counted by the VM endpoint (node 2's BPF).
// Without the substitution the requests go to the launcher pod's own
// address, where nothing listens.
func kubevirtService(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, client string, vmIP netip.Addr) {
	const svc = `apiVersion: v1
kind: Service
metadata:
  name: kv-vm1
  namespace: default
spec:
  selector:
    kubevirt.io/domain: vm1
  ports:
    - {name: http, port: 8081, targetPort: 80, protocol: TCP}
`
	if _, err := kubectl(ctx, nodeBins, []byte(svc), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kubectl(context.Background(), nodeBins, nil, "delete", "service", "kv-vm1", "-n", "default", "--ignore-not-found") //nolint:errcheck
	})
	var slice string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := kubectl(ctx, nodeBins, nil, "get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kv-vm1",
			"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		slice = strings.TrimSpace(out)
		return err == nil && slice != "", nil
	}); err != nil {
		t.Fatalf("no endpoint for Service kv-vm1: %q", slice)
	}
	ip, err := kubectl(ctx, nodeBins, nil, "get", "service", "kv-vm1", "-n", "default", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	vmIn := func() uint64 { return kvEndpointCounters(t, 2, vmIP).ToPackets }
	url := "http://" + strings.TrimSpace(ip) + ":8081/"
	// The agents apply the slice, then again once the launcher's
	// network-status is read: allow them a moment.
	var got string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "curl", "-sS", "-m", "3", url)
		return err == nil && strings.Contains(got, "lanekit guest"), nil
	}); err != nil {
		t.Fatalf("%s from %s (slice lists the launcher pod's %s; the VM is %s): %q, %v", url, client, slice, vmIP, got, err)
	}
	before := vmIn()
	const requests = 5
	for range requests {
		if got, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "curl", "-sS", "-m", "5", url); err != nil || !strings.Contains(got, "lanekit guest") {
			t.Fatalf("%s: %q, %v", url, got, err)
		}
	}
	in := vmIn() - before
	t.Logf("ClusterIP %s → VM %s (the slice lists %s): %d requests answered, %d packets into the VM endpoint", url, vmIP, slice, requests, in)
	// Each request is a TCP connection: SYN, ACK, request, FIN at least.
	if in < requests*3 {
		t.Errorf("the VM endpoint received %d packets for %d requests through the ClusterIP", in, requests)
	}
}

// kubevirtAgentRestart deletes the lanekit agent pod of the VM's node (an
// upgrade or crash of the DaemonSet's pod: the container's cgroup, and the
// VM's lanekit-vhost in it, goes), and waits for the guest to answer the
// client again: the new agent restores the VM endpoint from its store and
// starts a backend, and QEMU reconnects to it (the sidecar's <reconnect>).
// The time from the delete to the first answer is reported.
func kubevirtAgentRestart(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, client string, vmIP netip.Addr) {
	pods, err := kc.CoreV1().Pods(LanekitNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lanekit-agent",
		FieldSelector: "spec.nodeName=" + KubeNodeName(2)})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the agent pod on %s: %v (%d pods)", KubeNodeName(2), err, len(pods.Items))
	}
	old := pods.Items[0].Name
	vm := kvAgentVM(t, ctx, 2)
	oldPid := vm.GetBackend().GetPid()
	start := time.Now()
	if err := kc.CoreV1().Pods(LanekitNamespace).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var out string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err = kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "ping", "-c", "1", "-W", "1", vmIP.String())
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the guest at %s did not answer within 3 min of deleting agent pod %s: %s", vmIP, old, out)
	}
	back := time.Since(start)
	if err := waitDaemonSet(ctx, kc, LanekitNamespace, "lanekit-agent", 2); err != nil {
		t.Fatal(err)
	}
	vm = kvAgentVM(t, ctx, 2)
	if a, _, _ := strings.Cut(vm.GetAddress(), "/"); a != vmIP.String() {
		t.Errorf("after the restart the VM endpoint has %s, want %s", vm.GetAddress(), vmIP)
	}
	if got, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "curl", "-sS", "-m", "10", "http://"+vmIP.String()+"/"); err != nil || !strings.Contains(got, "lanekit guest") {
		t.Errorf("HTTP to the guest after the restart: %q, %v", got, err)
	}
	t.Logf("agent pod %s deleted: the guest answered again after %s (backend pid %d → %d)", old, back.Round(100*time.Millisecond), oldPid, vm.GetBackend().GetPid())
}

// kvAgentVM is VMI default/vm1's VM endpoint as lab node n's agent lists it.
func kvAgentVM(t *testing.T, ctx context.Context, n int) *apiv1.VM {
	t.Helper()
	sock, err := RealNodeAgentSocket(n)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := findAgentVM(ctx, sock, k8s.VMName("default", "vm1"))
	if err != nil {
		t.Fatalf("node %d's agent: %v", n, err)
	}
	return vm
}
