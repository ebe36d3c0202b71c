package k8s

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	kvv1 "kubevirt.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// VMSink is the agent's VM API (pkg/agent vm.go) plus the pod endpoints, in
// which the VMs' launcher pods are found.
type VMSink interface {
	AddVM(req agent.AddVMRequest) (*agent.VMInfo, error)
	DelVM(name string) (bool, error)
	ListVMs() ([]agent.VMInfo, error)
	List() ([]endpoint.Endpoint, error)
}

var (
	_ VMSink     = (*agent.Agent)(nil)
	_ ObjectSink = (*agent.Agent)(nil)
)

// VMIResource is KubeVirt's kubevirt.io/v1 virtualmachineinstances.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// Labels on the VM endpoints the source creates.
const (
	// LabelVMI marks a VM endpoint as the source's: "namespace/name" of
	// its VMI. VMs without it (`lanekit vm add`) are left alone.
	LabelVMI = "lanekit.io/vmi"
	// CNI_ARGS keys the CNI plugin stores in a pod endpoint's labels.
	argPodNamespace = "K8S_POD_NAMESPACE"
	argPodName      = "K8S_POD_NAME"
)

// VMIfName is the VM device the agent creates in the virt-launcher pod's
// netns (its eth0 is the pod network's).
const VMIfName = "lkvm0"

type vmiWatch struct {
	s    *Source
	dc   dynamic.Interface
	vms  VMSink
	inf  cache.SharedIndexInformer
	kick func()
	q    chan struct{}
}

func newVMIWatch(s *Source, dc dynamic.Interface, vms VMSink) *vmiWatch {
	w := &vmiWatch{s: s, dc: dc, vms: vms, q: make(chan struct{}, 1)}
	w.kick = func() {
		select {
		case w.q <- struct{}{}:
		default:
		}
	}
	return w
}

// kick asks for a reconcile (nil-safe: no VMI watch, nothing to do).
func (w *vmiWatch) kickSafe() {
	if w != nil {
		w.kick()
	}
}

// start creates the informer for this node's VMIs (KubeVirt labels each
// with kubevirt.io/nodeName) if the API server serves them.
func (w *vmiWatch) start(ctx context.Context) error {
	if _, err := w.dc.Resource(VMIResource).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("list %s: %w", VMIResource, err)
	}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.dc, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = kvv1.NodeNameLabel + "=" + w.s.cfg.NodeName
	})
	w.inf = f.ForResource(VMIResource).Informer()
	if _, err := w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.kick() },
		UpdateFunc: func(any, any) { w.kick() },
		DeleteFunc: func(any) { w.kick() },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	return nil
}

// run waits until the API server serves VMIs (KubeVirt may be installed
// after lanekit), then reconciles on every change and every VMResync.
func (w *vmiWatch) run(ctx context.Context) {
	for logged := false; ; {
		err := w.start(ctx)
		if err == nil {
			break
		}
		if !logged {
			w.s.log.Info("not watching VirtualMachineInstances yet (retrying every 10s)", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.inf.HasSynced) {
		return
	}
	w.s.log.Info("watching VirtualMachineInstances", "node", w.s.cfg.NodeName)
	t := time.NewTicker(w.s.cfg.VMResync)
	defer t.Stop()
	w.kick()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.q:
		case <-t.C:
		}
		if err := w.reconcile(); err != nil {
			w.s.log.Error("reconcile VMs", "err", err)
		}
	}
}

// VMName is the VM endpoint name of a VMI: namespace.name, or a hash when
// that is longer than a VM name may be.
func VMName(namespace, name string) string {
	n := namespace + "." + name
	if len(n) <= endpoint.MaxVMNameLen {
		return n
	}
	h := sha256.Sum256([]byte(namespace + "/" + name))
	return "vmi-" + hex.EncodeToString(h[:])[:32]
}

// desiredVM is the VM endpoint a VMI asks for, or ok=false (not here yet,
// not running, no lanekit interface, no launcher pod endpoint).
func (w *vmiWatch) desiredVM(u *unstructured.Unstructured, podEps map[string]endpoint.Endpoint) (req agent.AddVMRequest, ok bool, why string) {
	var vmi kvv1.VirtualMachineInstance
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vmi); err != nil {
		return req, false, "decode: " + err.Error()
	}
	if vmi.Status.NodeName != w.s.cfg.NodeName {
		return req, false, "not on this node"
	}
	if vmi.IsFinal() || vmi.DeletionTimestamp != nil {
		return req, false, "final or deleted"
	}
	// The binding's view of the VMI: the same queue count and interface the
	// sidecar gives QEMU.
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return req, false, err.Error()
	}
	kv, err := kubevirt.ParseVMI(raw)
	if err != nil {
		return req, false, err.Error()
	}
	ifs := kv.BoundInterfaces(kubevirt.BindingName)
	if len(ifs) == 0 {
		return req, false, "no interface bound to " + kubevirt.BindingName
	}
	// The launcher pod that runs now: status.activePods (pod UID → node).
	var launcher *corev1.Pod
	for _, o := range w.s.pods.GetIndexer().List() {
		p := o.(*corev1.Pod)
		if p.Namespace == vmi.Namespace && vmi.Status.ActivePods[p.UID] == w.s.cfg.NodeName && p.DeletionTimestamp == nil {
			launcher = p
			break
		}
	}
	if launcher == nil {
		return req, false, "no active launcher pod on this node"
	}
	ep, found := podEps[launcher.Namespace+"/"+launcher.Name]
	if !found {
		return req, false, "launcher pod " + launcher.Namespace + "/" + launcher.Name + " has no endpoint here yet"
	}
	labels := map[string]string{}
	maps.Copy(labels, vmi.Labels)
	labels[LabelVMI] = vmi.Namespace + "/" + vmi.Name
	return agent.AddVMRequest{
		Name:   VMName(vmi.Namespace, vmi.Name),
		Netns:  ep.Netns,
		IfName: VMIfName,
		Queues: int(kv.Queues()),
		MAC:    ifs[0].MacAddress,
		Labels: labels,
	}, true, ""
}

// reconcile makes this node's VM endpoints those its VMIs ask for: missing
// ones are added, changed ones (other netns, queues or MAC) recreated, and
// the source's VMs without a VMI removed.
func (w *vmiWatch) reconcile() error {
	eps, err := w.vms.List()
	if err != nil {
		return err
	}
	podEps := map[string]endpoint.Endpoint{}
	for _, ep := range eps {
		if ep.Kind == endpoint.KindPod && ep.Labels[argPodName] != "" {
			podEps[ep.Labels[argPodNamespace]+"/"+ep.Labels[argPodName]] = ep
		}
	}
	want := map[string]agent.AddVMRequest{}
	for _, o := range w.inf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		req, ok, why := w.desiredVM(u, podEps)
		if !ok {
			w.s.log.Debug("no VM endpoint for VMI", "vmi", u.GetNamespace()+"/"+u.GetName(), "why", why)
			continue
		}
		want[req.Name] = req
	}
	have, err := w.vms.ListVMs()
	if err != nil {
		return err
	}
	var errs []error
	for _, vm := range have {
		ep := vm.Endpoint
		if ep.VM == nil || ep.Labels[LabelVMI] == "" {
			continue
		}
		req, ok := want[ep.VM.Name]
		if ok && req.Netns == ep.Netns && req.IfName == ep.IfName && req.Queues == ep.VM.Queues && (req.MAC == "" || equalMAC(req.MAC, ep.MAC)) {
			delete(want, ep.VM.Name)
			continue
		}
		w.s.log.Info("removing VM endpoint", "vm", ep.VM.Name, "vmi", ep.Labels[LabelVMI], "still_wanted", ok)
		if _, err := w.vms.DelVM(ep.VM.Name); err != nil {
			errs = append(errs, fmt.Errorf("delete vm %s: %w", ep.VM.Name, err))
			delete(want, ep.VM.Name)
		}
	}
	for name, req := range want {
		info, err := w.vms.AddVM(req)
		if err != nil {
			errs = append(errs, fmt.Errorf("add vm %s (vmi %s): %w", name, req.Labels[LabelVMI], err))
			continue
		}
		w.s.log.Info("added VM endpoint", "vm", name, "vmi", req.Labels[LabelVMI], "ip", info.Endpoint.IP, "queues", req.Queues)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d VM changes failed: %v", len(errs), errs)
	}
	return nil
}
