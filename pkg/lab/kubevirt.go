package lab

// `lab up --k8s --kubelet --kubevirt`: the real-node lab plus real KubeVirt
// and real Multus, installed as a cluster admin installs them, and lanekit
// registered as a KubeVirt network binding plugin the way docs and
// deploy/kubevirt/ say:
//
//   - Multus' thick plugin: its deployments/multus-daemonset-thick.yml as
//     released (the image name pinned to the lab's tag);
//   - the NetworkAttachmentDefinition deploy/kubevirt/nad-example.yaml;
//   - KubeVirt's release kubevirt-operator.yaml and kubevirt-cr.yaml (rendered
//     by scripts/kubevirt-bins.sh as hack/build-manifests.sh renders them),
//     the CR then patched with deploy/kubevirt/binding-patch.yaml (kubectl
//     patch --type merge --patch-file, its comment's command) and with
//     kubevirtLabPatch (TCG guests, no virt-template components).
//
// The binaries and manifests come from scripts/kubevirt-bins.sh (make
// kubevirt-bins), the images from internal/tools/lkimages (make
// kubevirt-images), imported by every node's containerd at node start like
// the others. Everything KubeVirt and Multus write on a node is fenced as
// kubelet is: their hostPath directories are the node's bind mounts or in the
// node's /run tmpfs (virt-handler's /var/run/kubevirt*), the launcher pods'
// cgroups (where virt-handler writes device rules) nest under the lab's
// cgroup, and lab down ends every process of a node with its init.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Versions and places of scripts/kubevirt-bins.sh (TestKubeVirtBinDirMatchesScript
// keeps them equal).
const (
	// KubeVirtVersion is the KubeVirt release lab up --kubevirt runs.
	KubeVirtVersion = "v1.9.0"
	multusVersion   = "v4.2.3"
	// EnvKubeVirtBinDir overrides where the KubeVirt binaries are found.
	EnvKubeVirtBinDir = "LANEKIT_KUBEVIRT_BIN_DIR"
	// KubeVirtNamespace is the namespace of the release manifests.
	KubeVirtNamespace = "kubevirt"
	// kubevirtTimeout bounds the wait for the KubeVirt CR to be Deployed
	// (virt-operator creates virt-api, virt-controller and virt-handler,
	// whose node-labeller init container probes QEMU first).
	kubevirtTimeout = 8 * time.Minute
	// multusUpstreamImage is the image the released thick manifest names;
	// the lab's image is tagged multusLabImage (lkimages).
	multusUpstreamImage = "ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot-thick"
	multusLabImage      = "ghcr.io/k8snetworkplumbingwg/multus-cni:" + multusVersion + "-thick"
)

// KubeVirtBinDir is where scripts/kubevirt-bins.sh puts the KubeVirt and
// Multus binaries and the rendered manifests: beside the node binaries.
func KubeVirtBinDir() string {
	if d := os.Getenv(EnvKubeVirtBinDir); d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(NodeBinDir()), fmt.Sprintf("kubevirt-%s_multus-%s", KubeVirtVersion, multusVersion))
}

// KubeVirtImages are the image archives (lkimages) a --kubevirt node
// imports beside NodeImages; lanekit-guest is lanekit's test guest as a
// kernel-boot image, for the lab's VMIs.
var KubeVirtImages = []string{"virt-operator", "virt-api", "virt-controller", "virt-exportproxy", "virt-handler",
	"virt-launcher", "multus", "kubevirt-sidecar", "lanekit-guest"}

// kubevirtFiles are what lab up --kubevirt reads from KubeVirtBinDir.
var kubevirtFiles = []string{"virtctl", "manifests/kubevirt-operator.yaml", "manifests/kubevirt-cr.yaml",
	"manifests/multus-daemonset-thick.yml"}

// CheckKubeVirt returns the KubeVirt binary directory, or an error saying
// how to build what is missing (binaries, manifests, image archives).
func CheckKubeVirt(b Bins) (string, error) {
	d := KubeVirtBinDir()
	for _, f := range kubevirtFiles {
		if !regularFile(filepath.Join(d, f)) {
			return "", fmt.Errorf("%s missing in %s: run `make kubevirt-bins` (scripts/kubevirt-bins.sh)", f, d)
		}
	}
	for _, n := range KubeVirtImages {
		if !regularFile(filepath.Join(b.ImagesDir(), n+".tar")) {
			return "", fmt.Errorf("image archive %s.tar missing in %s: run `make kubevirt-images`", n, b.ImagesDir())
		}
	}
	return d, nil
}

func (c Config) checkKubeVirt() error {
	if !c.KubeVirt {
		return nil
	}
	if !c.Kubelet {
		return errors.New("--kubevirt needs --k8s --kubelet (real nodes)")
	}
	if c.CNI != "" && c.CNI != CNILanekit {
		return fmt.Errorf("--kubevirt registers lanekit's binding: not with --cni %s", c.CNI)
	}
	if c.IPFamily != "" && c.IPFamily != IPFamilyIPv4 {
		return fmt.Errorf("--kubevirt: IPv4 only for now, not --ip-family %s", c.IPFamily)
	}
	return nil
}

// installKubeVirt installs Multus, the lanekit NetworkAttachmentDefinition
// and KubeVirt with lanekit's binding, and waits until KubeVirt says
// Deployed (lab up --kubevirt, after lanekit and CoreDNS are up).
func installKubeVirt(ctx context.Context, cfg Config, nodes int, nodeBins, kvDir string, kc kubernetes.Interface) error {
	multus, err := os.ReadFile(filepath.Join(kvDir, "manifests/multus-daemonset-thick.yml"))
	if err != nil {
		return err
	}
	if !bytes.Contains(multus, []byte(multusUpstreamImage)) {
		return fmt.Errorf("multus-daemonset-thick.yml names no %s", multusUpstreamImage)
	}
	multus = bytes.ReplaceAll(multus, []byte(multusUpstreamImage), []byte(multusLabImage))
	if _, err := kubectl(ctx, nodeBins, multus, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("multus: %w", err)
	}
	if err := waitDaemonSet(ctx, kc, "kube-system", "kube-multus-ds", nodes); err != nil {
		return fmt.Errorf("multus: %w", err)
	}
	progress(cfg.Out, "lab: Multus %s (thick plugin) Ready on every node", multusVersion)
	kvDeploy := filepath.Join(cfg.Bins.DeployDir(), "kubevirt")
	if _, err := kubectl(ctx, nodeBins, nil, "apply", "-f", filepath.Join(kvDeploy, "nad-example.yaml")); err != nil {
		return err
	}
	// virt-operator (and virt-api, virt-controller) require a node labelled
	// control-plane (or master); the lab's control plane runs on the
	// underlay, not on a node: node 1 gets the label, as a kubeadm or kind
	// control-plane node has it (without the taint).
	if _, err := kubectl(ctx, nodeBins, nil, "label", "node", KubeNodeName(1), "node-role.kubernetes.io/control-plane=", "--overwrite"); err != nil {
		return err
	}
	if _, err := kubectl(ctx, nodeBins, nil, "apply", "-f", filepath.Join(kvDir, "manifests/kubevirt-operator.yaml")); err != nil {
		return fmt.Errorf("kubevirt operator: %w", err)
	}
	if err := waitDeployment(ctx, kc, KubeVirtNamespace, "virt-operator"); err != nil {
		return err
	}
	progress(cfg.Out, "lab: virt-operator %s available", KubeVirtVersion)
	if _, err := kubectl(ctx, nodeBins, nil, "apply", "-f", filepath.Join(kvDir, "manifests/kubevirt-cr.yaml")); err != nil {
		return fmt.Errorf("kubevirt CR: %w", err)
	}
	for _, patch := range [][]string{
		{"--patch-file", filepath.Join(kvDeploy, "binding-patch.yaml")},
		{"--patch", kubevirtLabPatch},
	} {
		args := append([]string{"patch", "kubevirt", "kubevirt", "-n", KubeVirtNamespace, "--type", "merge"}, patch...)
		if _, err := kubectl(ctx, nodeBins, nil, args...); err != nil {
			return err
		}
	}
	progress(cfg.Out, "lab: KubeVirt CR applied (useEmulation, no virt-template, ExternalNetResourceInjection off, lanekit binding registered); waiting for Deployed")
	start := time.Now()
	if err := waitKubeVirtDeployed(ctx, nodeBins, kc); err != nil {
		return err
	}
	progress(cfg.Out, "lab: KubeVirt %s Deployed %.0f s after the CR", KubeVirtVersion, time.Since(start).Seconds())
	return tcgMigrationLabels(ctx, nodeBins, kc, nodes)
}

// tcgMigrationLabels lets TCG guests live-migrate. A migration target pod
// must run on a node labelled cpu-model-migration.node.kubevirt.io/<the
// source's host CPU model>; under emulation that model is kvm64, which
// KubeVirt counts obsolete and its node labeller never lists as a migration
// model, so no node could take a migrating VM. Once the labeller has
// labelled a node (host-model-cpu.node.kubevirt.io/<model>), the lab tells
// it to leave the node alone (node-labeller.kubevirt.io/skip-node, as an
// admin does for hand-kept labels) and adds the migration label for that
// model, which every node of the lab shares.
func tcgMigrationLabels(ctx context.Context, nodeBins string, kc kubernetes.Interface, nodes int) error {
	for i := 1; i <= nodes; i++ {
		name := KubeNodeName(i)
		var model string
		err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			n, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for k := range n.Labels {
				if m, ok := strings.CutPrefix(k, "host-model-cpu.node.kubevirt.io/"); ok {
					model = m
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("node %s: KubeVirt's node labeller gave no host-model-cpu label: %w", name, err)
		}
		if _, err := kubectl(ctx, nodeBins, nil, "annotate", "node", name, "node-labeller.kubevirt.io/skip-node=true", "--overwrite"); err != nil {
			return err
		}
		if _, err := kubectl(ctx, nodeBins, nil, "label", "node", name, "cpu-model-migration.node.kubevirt.io/"+model+"=true", "--overwrite"); err != nil {
			return err
		}
	}
	return nil
}

// kubevirtLabPatch is the lab's own merge patch of the KubeVirt CR, what an
// admin of such a cluster sets:
//   - useEmulation: TCG guests (the machine's /dev/kvm is unusable here);
//   - virtTemplateDeployment.enabled false: virt-operator deploys
//     virt-template-apiserver and -controller while the Template feature
//     gate (beta, on by default in v1.9.0) is on, unless this says no; their
//     module (kubevirt.io/virt-template) is refused by the module proxy, so
//     the lab has no images of them. virt-exportproxy, which virt-operator
//     always deploys, has one (make kubevirt-images);
//   - ExternalNetResourceInjection off: with the gate on (beta, on by
//     default since v1.9.0) virt-controller leaves the resource requests of
//     a NetworkAttachmentDefinition's k8s.v1.cni.cncf.io/resourceName to
//     k8snetworkplumbingwg/network-resources-injector, an admission webhook
//     the module proxy refuses (403), so the lab has none; off, virt-controller
//     requests lanekit.io/vhost-user itself for each lanekit interface (the
//     device ID for which Multus takes lanekit's device-info).
const kubevirtLabPatch = `{"spec":{"configuration":{"developerConfiguration":{"useEmulation":true,` +
	`"disabledFeatureGates":["ExternalNetResourceInjection"]},"virtTemplateDeployment":{"enabled":false}}}}`

// waitKubeVirtDeployed waits for the KubeVirt CR's status.phase Deployed.
func waitKubeVirtDeployed(ctx context.Context, nodeBins string, kc kubernetes.Interface) error {
	var phase string
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, kubevirtTimeout, true, func(ctx context.Context) (bool, error) {
		out, err := kubectl(ctx, nodeBins, nil, "get", "kubevirt", "kubevirt", "-n", KubeVirtNamespace, "-o", "jsonpath={.status.phase}")
		if err != nil {
			return false, nil
		}
		phase = strings.TrimSpace(out)
		return phase == "Deployed", nil
	})
	if err != nil {
		conds, _ := kubectl(ctx, nodeBins, nil, "get", "kubevirt", "kubevirt", "-n", KubeVirtNamespace, "-o", "jsonpath={.status.conditions}")
		return fmt.Errorf("KubeVirt not Deployed after %s (phase %q, conditions %s): %w; %s%s", kubevirtTimeout, phase,
			strings.TrimSpace(conds), err, podSummary(ctx, kc, KubeVirtNamespace), unreadyLogs(ctx, kc, KubeVirtNamespace))
	}
	return nil
}

// unreadyLogs returns the last lines of every container that is not ready
// in namespace ns (for lab up's errors: where KubeVirt stops).
func unreadyLogs(ctx context.Context, kc kubernetes.Interface, ns string) string {
	pods, err := kc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range pods.Items {
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if cs.Ready || cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0 {
				continue
			}
			data, err := kc.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: ptr.To[int64](15)}).DoRaw(ctx)
			if err != nil {
				continue
			}
			fmt.Fprintf(&b, "\n--- %s/%s:\n%s", p.Name, cs.Name, data)
		}
	}
	return b.String()
}
