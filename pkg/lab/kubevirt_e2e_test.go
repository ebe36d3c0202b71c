package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

func TestKubeVirtBinDirMatchesScript(t *testing.T) {
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts", "kubevirt-bins.sh"), "dir").Output()
	if err != nil {
		t.Fatalf("kubevirt-bins.sh dir: %v", err)
	}
	if got, want := KubeVirtBinDir(), strings.TrimSpace(string(out)); got != want {
		t.Errorf("KubeVirtBinDir() = %s, scripts/kubevirt-bins.sh dir = %s", got, want)
	}
}

func TestCheckKubeVirtConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{KubeVirt: true, K8s: true}, "--kubevirt needs --k8s --kubelet"},
		{Config{KubeVirt: true, K8s: true, Kubelet: true, CNI: CNIKubeProxyIptables}, "not with --cni"},
		{Config{KubeVirt: true, K8s: true, Kubelet: true, IPFamily: IPFamilyDual}, "IPv4 only"},
		{Config{KubeVirt: true, K8s: true, Kubelet: true}, ""},
	} {
		err := c.cfg.checkKubeVirt()
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: checkKubeVirt() = %v, want %q", c.cfg, err, c.want)
		}
	}
}

const kubevirtTestMAC = "02:00:00:aa:00:01"

// TestLabKubeVirt brings up the real-node lab with real KubeVirt and Multus
// (lab up --k8s --kubelet --kubevirt) and boots a VMI on lanekit's binding:
//   - KubeVirt reaches Deployed (lab up waits for it) with lanekit
//     registered, virt-api started (it needs the request-header CA the API
//     server publishes) and virt-exportproxy available;
//   - the VMI gets a virt-launcher pod with lanekit's hook sidecar, which
//     turns the interface of the domain virt-launcher hands it into a
//     vhost-user NIC, and libvirt runs the domain with it;
//   - the VMI Running, the guest booted (its serial console answers), on the
//     address lanekit's IPAM gave the VM endpoint, answers ping and TCP from
//     a pod on the other node, the frames through the VM's lanekit-vhost and
//     the BPF programs (kubevirtGuestNet), then its Service, policy, agent
//     restart, KubeVirt migration and deletion;
//   - a VirtualMachine whose launcher pod is deleted is on the fast lane in
//     its next VMI (kubevirtLauncherRestart);
//   - `lab bench` measures the KubeVirt rows (kubevirtBench).
//
// Opt-in (LANEKIT_KUBEVIRT_LAB=1): a run takes about 10 minutes on two busy
// cores; skips when the KubeVirt binaries are not cached (make kubevirt-bins).
func TestLabKubeVirt(t *testing.T) {
	if os.Getenv("LANEKIT_KUBEVIRT_LAB") != "1" {
		t.Skip("set LANEKIT_KUBEVIRT_LAB=1: the KubeVirt lab takes ~10 min")
	}
	kvDir := KubeVirtBinDir()
	for _, f := range kubevirtFiles {
		if !regularFile(filepath.Join(kvDir, f)) {
			t.Skipf("KubeVirt binaries not cached (%s missing in %s): make kubevirt-bins", f, kvDir)
		}
	}
	bins, nodeBins := realNodeTestBins(t)
	requireGuestImage(t)
	imgs := exec.Command("go", append([]string{"run", "./internal/tools/lkimages", "-out", bins.ImagesDir(), "-bin", bins.Dir,
		"-node-bins", nodeBins, "-kubevirt-bins", kvDir, "-guest", GuestCacheDir}, KubeVirtImages...)...)
	imgs.Dir = repoRoot(t)
	if out, err := imgs.CombinedOutput(); err != nil {
		t.Fatalf("lkimages (KubeVirt images): %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	defer cancel()
	upStart := time.Now()
	_, kc, _ := upRealNodeLab(t, ctx, bins, Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, KubeVirt: true})
	t.Logf("lab up --kubevirt: %.0f s to KubeVirt Deployed", time.Since(upStart).Seconds())

	t.Run("KubeVirt deployed", func(t *testing.T) {
		phase, err := kubectl(ctx, nodeBins, nil, "get", "kubevirt", "kubevirt", "-n", KubeVirtNamespace, "-o", "jsonpath={.status.phase}")
		if err != nil || strings.TrimSpace(phase) != "Deployed" {
			t.Errorf("KubeVirt phase %q, %v", phase, err)
		}
		for _, d := range []string{"virt-api", "virt-controller", "virt-exportproxy"} {
			if err := waitDeployment(ctx, kc, KubeVirtNamespace, d); err != nil {
				t.Error(err)
			}
		}
		if ds, err := kc.AppsV1().DaemonSets(KubeVirtNamespace).Get(ctx, "virt-handler", metav1.GetOptions{}); err != nil || ds.Status.NumberReady != 2 {
			t.Errorf("virt-handler ready on %v nodes, want 2 (%v)", ds, err)
		}
		// Switched off by the lab's CR patch (no images of them).
		for _, d := range []string{"virt-template-apiserver", "virt-template-controller"} {
			if _, err := kc.AppsV1().Deployments(KubeVirtNamespace).Get(ctx, d, metav1.GetOptions{}); err == nil {
				t.Errorf("deployment %s exists; the CR says virtTemplateDeployment.enabled false", d)
			}
		}
	})
	t.Run("lanekit registered as a binding plugin", func(t *testing.T) {
		out, err := kubectl(ctx, nodeBins, nil, "get", "kubevirt", "kubevirt", "-n", KubeVirtNamespace,
			"-o", "jsonpath={.spec.configuration.network.binding.lanekit}")
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			SidecarImage string `json:"sidecarImage"`
			NAD          string `json:"networkAttachmentDefinition"`
			DownwardAPI  string `json:"downwardAPI"`
		}
		if err := json.Unmarshal([]byte(out), &b); err != nil {
			t.Fatalf("binding %q: %v", out, err)
		}
		if b.SidecarImage == "" || b.NAD != "" || b.DownwardAPI != "device-info" {
			t.Errorf("binding lanekit = %+v", b)
		}
	})

	vmiStart := time.Now()
	if _, err := kubectl(ctx, nodeBins, []byte(KubeVirtVMI("vm1", KubeNodeName(2), BindingLanekit, kubevirtTestMAC)), "apply", "-f", "-"); err != nil {
		t.Fatalf("create VMI: %v", err)
	}
	launcher := waitLauncherPod(t, ctx, kc)
	if !t.Run("sidecar made the vhost-user NIC", func(t *testing.T) {
		var logs string
		err := wait.PollUntilContextTimeout(ctx, 3*time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
			logs = containerLogs(ctx, kc, launcher, "hook-sidecar-0")
			if strings.Contains(logs, `"vhost-user interface"`) || strings.Contains(logs, `"OnDefineDomain"`) {
				return true, nil
			}
			// virt-launcher pods are not restarted: a compute container
			// that ended will not call the sidecar.
			return false, computeEnded(ctx, kc, launcher)
		})
		if err != nil || !strings.Contains(logs, `"vhost-user interface"`) || !strings.Contains(logs, `"vmi":"default/vm1"`) {
			t.Fatalf("sidecar log has no vhost-user interface for default/vm1 (%v):\n%s\ncompute: %s", err, logs,
				tail(containerLogs(ctx, kc, launcher, "compute"), 3000))
		}
	}) {
		return
	}
	t.Run("libvirt runs the domain with the vhost-user NIC", func(t *testing.T) {
		var xml string
		err := wait.PollUntilContextTimeout(ctx, 3*time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			out, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", launcher, "-c", "compute", "--",
				"virsh", "-c", "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock", "dumpxml", "default_vm1")
			xml = out
			return err == nil, nil
		})
		if err != nil || !strings.Contains(xml, "<interface type='vhostuser'>") || !strings.Contains(xml, kubevirtTestMAC) {
			t.Fatalf("domain default_vm1 (%v):\n%s", err, xml)
		}
	})
	if !t.Run("VMI Running", func(t *testing.T) {
		waitVMIRunning(t, ctx, kc, launcher)
		t.Logf("VMI vm1 Running %.0f s after it was created", time.Since(vmiStart).Seconds())
	}) {
		return
	}
	t.Run("guest on lanekit's fast lane", func(t *testing.T) { kubevirtGuestNet(t, ctx, kc, nodeBins, launcher) })
	t.Run("lanekit connectivity test --vm", func(t *testing.T) { kubevirtConnectivity(t, ctx, bins) })
	t.Run("virt-launcher pod of a VirtualMachine deleted: its next VMI is on the fast lane", func(t *testing.T) {
		kubevirtLauncherRestart(t, ctx, kc, nodeBins)
	})
	t.Run("lab bench: KubeVirt's bindings beside lanekit's", func(t *testing.T) { kubevirtBench(t, ctx, bins) })
}

// waitLauncherPod waits for the VMI's virt-launcher pod to be scheduled and
// its containers to start, and returns its name.
func waitLauncherPod(t *testing.T, ctx context.Context, kc kubernetes.Interface) string {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 3*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := kc.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher"})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		last = &pods.Items[0]
		for _, cs := range last.Status.ContainerStatuses {
			if cs.Name == "compute" && cs.State.Running != nil {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		vmi, _ := kubectlOut(ctx, "get", "vmi", "vm1", "-n", "default", "-o", "yaml")
		t.Fatalf("no running virt-launcher pod for vm1 (%v): %s\nVMI:\n%s\nkubevirt: %s", err, podSummary(ctx, kc, "default"),
			vmi, podSummary(ctx, kc, KubeVirtNamespace))
	}
	t.Logf("virt-launcher pod %s on %s", last.Name, last.Spec.NodeName)
	return last.Name
}

// computeEnded returns an error when the launcher pod's compute container
// has terminated.
func computeEnded(ctx context.Context, kc kubernetes.Interface, launcher string) error {
	p, err := kc.CoreV1().Pods("default").Get(ctx, launcher, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "compute" && cs.State.Terminated != nil {
			return fmt.Errorf("compute container of %s ended: exit %d %s", launcher, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
		}
	}
	return nil
}

// kubectlOut is kubectl with the node binaries' kubectl.
func kubectlOut(ctx context.Context, args ...string) (string, error) {
	return kubectl(ctx, NodeBinDir(), nil, args...)
}

func containerLogs(ctx context.Context, kc kubernetes.Interface, pod, container string) string {
	data, err := kc.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return "logs: " + err.Error()
	}
	return string(data)
}
