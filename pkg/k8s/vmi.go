package k8s

// KubeVirt VMIs: a VM attachment (the lanekit CNI on a virt-launcher pod's
// network, KubeVirt binding "lanekit") asks the agent for a VM endpoint and
// its backend; the agent asks this resolver which VMI the launcher pod runs,
// for the queue count (one pair per vCPU with networkInterfaceMultiqueue,
// the count the binding sidecar gives QEMU), the interface's MAC and the
// VMI's labels (policy identities).

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	kvv1 "kubevirt.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// VMSink is the agent's VM attachment seam: it asks the source about VMIs.
type VMSink interface {
	SetVMIResolver(agent.VMIResolver)
}

var (
	_ VMSink     = (*agent.Agent)(nil)
	_ ObjectSink = (*agent.Agent)(nil)
)

// VMIResource is KubeVirt's kubevirt.io/v1 virtualmachineinstances.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// LabelVMI marks a VM endpoint with the "namespace/name" of its VMI.
const LabelVMI = agent.LabelVMI

// Launcher pod metadata KubeVirt sets.
const (
	// labelCreatedBy is the VMI's UID on its launcher pods.
	labelCreatedBy = kvv1.CreatedByLabel
	// annotationDomain is the VMI's name on its launcher pods.
	annotationDomain = kvv1.DomainAnnotation
	// labelVMName is the VMI's name on launcher pods of newer KubeVirt.
	labelVMName = "vm.kubevirt.io/name"
)

// resolveTimeout bounds the API reads of one resolution.
const resolveTimeout = 5 * time.Second

// VMName is the VM endpoint name of a VMI: namespace.name, or a hash when
// that is longer than a VM name may be.
func VMName(namespace, name string) string { return endpoint.VMName(namespace, name) }

// vmiResolver finds launcher pods' VMIs, from the pod cache and the API.
type vmiResolver struct {
	s  *Source
	dc dynamic.Interface
}

// resolve is an agent.VMIResolver. A pod that is not a launcher pod is
// ok=false without error; a launcher pod whose VMI cannot be read now is an
// error (the ADD is retried: guessing the queue count would give QEMU a
// backend with fewer queues than the sidecar configures).
func (r *vmiResolver) resolve(podNamespace, podName, podUID string) (agent.VMIInfo, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	pod, err := r.launcherPod(ctx, podNamespace, podName, podUID)
	if err != nil || pod == nil {
		return agent.VMIInfo{}, false, err
	}
	name := pod.Annotations[annotationDomain]
	if name == "" {
		name = pod.Labels[labelVMName]
	}
	if name == "" {
		return agent.VMIInfo{}, false, fmt.Errorf("launcher pod %s/%s names no VMI (%s annotation)", podNamespace, podName, annotationDomain)
	}
	u, err := r.dc.Resource(VMIResource).Namespace(podNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return agent.VMIInfo{}, false, fmt.Errorf("vmi %s/%s of launcher pod %s: %w", podNamespace, name, podName, err)
	}
	if uid := pod.Labels[labelCreatedBy]; uid != "" && string(u.GetUID()) != uid {
		return agent.VMIInfo{}, false, fmt.Errorf("vmi %s/%s is %s, launcher pod %s was created by %s (recreated VMI?)",
			podNamespace, name, u.GetUID(), podName, uid)
	}
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return agent.VMIInfo{}, false, err
	}
	kv, err := kubevirt.ParseVMI(raw)
	if err != nil {
		return agent.VMIInfo{}, false, fmt.Errorf("vmi %s/%s: %w", podNamespace, name, err)
	}
	info := agent.VMIInfo{Namespace: podNamespace, Name: name, Queues: int(kv.Queues()), Labels: u.GetLabels()}
	if ifs := kv.BoundInterfaces(kubevirt.BindingName); len(ifs) == 1 {
		info.MAC = ifs[0].MacAddress
	}
	return info, true, nil
}

// launcherPod returns the pod if it is a KubeVirt launcher pod (nil if it is
// another pod), from the cache or else the API.
func (r *vmiResolver) launcherPod(ctx context.Context, namespace, name, uid string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	if r.s.pods != nil {
		if o, ok, _ := r.s.pods.GetIndexer().GetByKey(namespace + "/" + name); ok {
			if p, _ := o.(*corev1.Pod); p != nil && (uid == "" || string(p.UID) == uid) {
				pod = p
			}
		}
	}
	if pod == nil {
		p, err := r.s.cfg.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
		}
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		if uid != "" && string(p.UID) != uid {
			return nil, fmt.Errorf("pod %s/%s is %s, CNI_ARGS say %s", namespace, name, p.UID, uid)
		}
		pod = p
	}
	if pod.Labels[kvv1.AppLabel] != "virt-launcher" && pod.Labels[labelCreatedBy] == "" {
		return nil, nil
	}
	return pod, nil
}
