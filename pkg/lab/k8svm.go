package lab

// A VM made the KubeVirt way in `lab up --k8s`: what virt-controller would
// create (a VMI with an interface bound to lanekit on a Multus network, and
// its virt-launcher pod with KubeVirt's labels, annotation and "sockets"
// emptyDir), attached by the lab kubelet (Multus' part) through the lanekit
// CNI, which makes the VM endpoint and starts the VM's lanekit-vhost. The
// socket comes back as device-info in the pod's network-status, as the
// binding sidecar reads it.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/k8s"
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

const (
	// VMNetwork is the lab's NetworkAttachmentDefinition for VMs.
	VMNetwork = "lanekit-vm"
	// vmiNetwork is the VMI's name for that network.
	vmiNetwork = "fast"
	// socketVolume is virt-launcher's emptyDir for sockets.
	socketVolume = "sockets"
)

// KubeVirtVM is a VM created through the API.
type KubeVirtVM struct {
	VMI      *unstructured.Unstructured
	Launcher *corev1.Pod
	// IfName is the launcher pod's interface for the VM network.
	IfName string
	// Status is that network's entry in the pod's network-status.
	Status NetworkStatus
	// Socket is the vhost-user socket as QEMU sees it (from device-info).
	Socket kubevirt.VhostSocket
	// HostSocket is the same socket on the node.
	HostSocket string
}

// KubeVirtIfName is KubeVirt's interface name for a secondary network:
// "pod" and the start of the network name's SHA-256.
func KubeVirtIfName(network string) string {
	h := sha256.Sum256([]byte(network))
	return "pod" + hex.EncodeToString(h[:])[:11]
}

// SetupKubeVirt installs the VMI and NetworkAttachmentDefinition CRDs and the
// lab's VM network (a lanekit config with "vhostUser"), idempotently.
func SetupKubeVirt(ctx context.Context, cfg *rest.Config) (dynamic.Interface, error) {
	for _, install := range []func(context.Context, *rest.Config) error{k8stest.InstallKubeVirtCRD, k8stest.InstallNADCRD} {
		if err := install(ctx, cfg); err != nil {
			return nil, err
		}
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	conf := mustJSON(map[string]any{
		"cniVersion": "1.1.0", "name": VMNetwork,
		"plugins": []any{map[string]any{
			"type": "lanekit", "agentSocket": "/run/lanekit/agent.sock", "vhostUser": map[string]any{},
			"capabilities": map[string]any{"mac": true, "CNIDeviceInfoFile": true},
		}},
	})
	nad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": VMNetwork, "namespace": PodNamespace},
		"spec":     map[string]any{"config": string(conf)},
	}}
	if _, err := dc.Resource(k8stest.NADResource).Namespace(PodNamespace).Create(ctx, nad, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("network %s: %w", VMNetwork, err)
	}
	return dc, nil
}

// CreateKubeVirtVM creates VMI name (vcpus vCPUs with multiqueue, the MAC on
// its lanekit interface, labels) and its launcher pod on node i, waits for
// the pod's network and returns where its backend listens.
func CreateKubeVirtVM(ctx context.Context, c kubernetes.Interface, dc dynamic.Interface, i int, name string, vcpus int, mac string, labels map[string]string) (*KubeVirtVM, error) {
	lbl := map[string]any{}
	for k, v := range labels {
		lbl[k] = v
	}
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": name, "namespace": PodNamespace, "labels": lbl},
		"spec": map[string]any{
			"domain": map[string]any{
				"cpu": map[string]any{"cores": int64(vcpus)},
				"devices": map[string]any{"networkInterfaceMultiqueue": vcpus > 1, "interfaces": []any{
					map[string]any{"name": vmiNetwork, "binding": map[string]any{"name": kubevirt.BindingName}, "macAddress": mac}}},
			},
			"networks": []any{map[string]any{"name": vmiNetwork, "multus": map[string]any{"networkName": VMNetwork}}},
		},
	}}
	created, err := dc.Resource(k8s.VMIResource).Namespace(PodNamespace).Create(ctx, vmi, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("vmi %s: %w", name, err)
	}
	ifname := KubeVirtIfName(vmiNetwork)
	sel, _ := json.Marshal([]NetworkSelection{{Name: VMNetwork, Namespace: PodNamespace, Interface: ifname, MAC: mac}})
	launcher, err := c.CoreV1().Pods(PodNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "virt-launcher-" + name + "-", Namespace: PodNamespace,
			Labels:      map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(created.GetUID())},
			Annotations: map[string]string{"kubevirt.io/domain": name, NetworksAnnotation: string(sel)}},
		Spec: corev1.PodSpec{NodeName: KubeNodeName(i), Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}},
			Volumes: []corev1.Volume{{Name: socketVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("launcher pod of %s: %w", name, err)
	}
	if _, err := WaitPodIP(ctx, c, PodNamespace, launcher.Name, time.Minute); err != nil {
		return nil, fmt.Errorf("launcher pod %s: %w; kubelet log: %s; agent log: %s", launcher.Name, err, logTail(KubeletLog(i)), logTail(AgentLog(i)))
	}
	if launcher, err = c.CoreV1().Pods(PodNamespace).Get(ctx, launcher.Name, metav1.GetOptions{}); err != nil {
		return nil, err
	}
	out := &KubeVirtVM{VMI: created, Launcher: launcher, IfName: ifname}
	var status []NetworkStatus
	if err := json.Unmarshal([]byte(launcher.Annotations[NetworkStatusAnnotation]), &status); err != nil {
		return nil, fmt.Errorf("launcher pod %s network-status: %w", launcher.Name, err)
	}
	for _, st := range status {
		if st.Name == PodNamespace+"/"+VMNetwork && st.Interface == ifname {
			out.Status = st
		}
	}
	// What virt-controller hands the binding sidecar as network-info.
	var dev kubevirt.DeviceInfo
	if err := json.Unmarshal(out.Status.DeviceInfo, &dev); err != nil {
		return nil, fmt.Errorf("launcher pod %s: device-info of %s %q: %w", launcher.Name, VMNetwork, out.Status.DeviceInfo, err)
	}
	info := kubevirt.NetworkInfo{Interfaces: []kubevirt.NetworkInfoInterface{{Network: vmiNetwork, DeviceInfo: &dev}}}
	if out.Socket, err = info.Socket(vmiNetwork); err != nil {
		return nil, fmt.Errorf("launcher pod %s: %w", launcher.Name, err)
	}
	rel, ok := strings.CutPrefix(out.Socket.Path, agent.DefaultVMSocketMountDir+"/")
	if !ok {
		return nil, fmt.Errorf("socket %s is not in the launcher's %s", out.Socket.Path, agent.DefaultVMSocketMountDir)
	}
	out.HostSocket = filepath.Join(PodVolumeDir(launcher.UID, socketVolume), rel)
	return out, nil
}

// upKubeVirtVM is `lab up --k8s --vm`: VM "vm1" on node i made through the
// API (CreateKubeVirtVM), its QEMU guest booted in the launcher pod's netns
// on the socket device-info reported, as the binding sidecar configures it.
func upKubeVirtVM(ctx context.Context, cfg Config, st *State, i int, c kubernetes.Interface) error {
	const name = "vm1"
	queues := max(cfg.VMQueues, 1)
	progress(cfg.Out, "lab: vm %s: building or reusing the guest image in %s", name, GuestCacheDir)
	kernel, initrd, err := guest.EnsureImage(GuestCacheDir)
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	srv, _, err := K8s()
	if err != nil {
		return err
	}
	dc, err := SetupKubeVirt(ctx, srv.RESTConfig())
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	mac := fmt.Sprintf("02:00:00:aa:%02x:01", i)
	kv, err := CreateKubeVirtVM(ctx, c, dc, i, name, queues, mac, map[string]string{"app": name})
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	vm, err := labVMEndpoint(ctx, i, k8s.VMName(PodNamespace, name))
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	// QEMU reaches the socket through a short link, as the compute
	// container's mount of the volume (sun_path holds 107 bytes).
	link := vmFile(i, name, "sockets")
	_ = os.Remove(link)
	if err := os.Symlink(filepath.Dir(kv.HostSocket), link); err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	lv := LabVM{Name: name, Node: i, NS: PodNetns(i, kv.Launcher.UID), MAC: vm.GetMac(), Queues: int(vm.GetQueues()),
		XSKSocket: vm.GetSocket(), VhostSocket: filepath.Join(link, filepath.Base(kv.HostSocket)),
		SerialSocket: vmFile(i, name, "serial.sock"), BackendPID: int(vm.GetBackend().GetPid())}
	lv.IP, _, _ = strings.Cut(vm.GetAddress(), "/")
	progress(cfg.Out, "lab: vm %s: VMI %s/%s, launcher pod %s, endpoint %s mac %s, %d queue pair(s), lanekit-vhost pid %d on %s (device-info %s)",
		name, PodNamespace, name, kv.Launcher.Name, lv.IP, lv.MAC, lv.Queues, lv.BackendPID, kv.HostSocket, kv.Socket.Path)
	backendLog := filepath.Join(NodeDir(i), "state", "vhost", vm.GetName()+".log")
	// QEMU reconnects to a restarted backend, as the sidecar's domain says.
	return bootLabVM(ctx, cfg, st, lv, guest.Config{Kernel: kernel, Initrd: initrd, VhostReconnect: kubevirt.ReconnectSeconds}, backendLog)
}

// errNoVM: the agent has no VM endpoint of that name.
var errNoVM = errors.New("no vm endpoint")

// labVMEndpoint returns node i's VM endpoint name (errNoVM if none).
func labVMEndpoint(ctx context.Context, i int, name string) (*apiv1.VM, error) {
	c, closeFn, err := agentClient(AgentSocket(i))
	if err != nil {
		return nil, err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.ListVMs(cctx, &apiv1.ListVMsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list vms on node %d: %w", i, err)
	}
	for _, vm := range resp.GetVms() {
		if vm.GetName() == name {
			return vm, nil
		}
	}
	return nil, fmt.Errorf("%w %s on node %d", errNoVM, name, i)
}
