package k8s

// KubeVirt VMIs: a VM attachment (the lanekit CNI on a virt-launcher pod's
// network, KubeVirt binding "lanekit") asks the agent for a VM endpoint and
// its backend; the agent asks this resolver which VMI the launcher pod runs,
// for the queue count (one pair per vCPU with networkInterfaceMultiqueue,
// the count the binding sidecar gives QEMU), the interface's MAC and the
// VMI's labels (policy identities).
//
// Live migrations: a follower watches VMIs and hands the agent each change of
// a migration this node is the source or target of (MigrationSink).

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	kvv1 "kubevirt.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
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

// VMIMResource is KubeVirt's VirtualMachineInstanceMigration.
var VMIMResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}

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
	if err := incomingOf(ctx, r, &info, kv, u, pod); err != nil {
		return agent.VMIInfo{}, false, err
	}
	return info, true, nil
}

// incomingOf marks info incoming when podName is the target pod of the
// VMI's migration in progress: the target's attachment takes the address
// and MAC the VM has on the source instead of new ones. The address is the
// one status.interfaces reports for the lanekit interface only if the
// source launcher pod was given it by lanekit (its network-status), it is
// a usable address of some Node's pod CIDR and no other pod holds it
// (vmitrust.go): the guest fills status.interfaces and could name another
// pod's address. A target whose VMI reports no such IPv4 address is an
// error (the ADD is retried: a new address would break the VM's
// connections); so is a dual-stack VM, whose IPv6 address cannot move
// through this path.
func incomingOf(ctx context.Context, r *vmiResolver, info *agent.VMIInfo, kv *kubevirt.VMI, u *unstructured.Unstructured, pod *k8sobj.Pod) error {
	podName := pod.Name
	m, err := kv.Migration()
	if err != nil {
		return err
	}
	if m == nil || m.TargetPod != podName || m.Completed || m.Failed {
		// KubeVirt names the target pod in the VMI's migrationState only
		// once that pod runs, after its CNI ADD: the pod's migration job
		// label says it first.
		if m, err = r.pendingTarget(ctx, u, pod); err != nil || m == nil {
			return err
		}
	}
	addrs := vmiAddrs(u)
	if len(addrs) != 1 {
		return fmt.Errorf("vmi %s/%s migrates to launcher pod %s but reports %d IPv4 addresses for its lanekit interface (want 1: the address it keeps)",
			u.GetNamespace(), u.GetName(), podName, len(addrs))
	}
	var src *k8sobj.Pod
	if m.SourcePod != "" {
		if src, err = r.launcherPod(ctx, u.GetNamespace(), m.SourcePod, ""); err != nil {
			return fmt.Errorf("vmi %s/%s migrates to %s: source launcher pod: %w", u.GetNamespace(), u.GetName(), podName, err)
		}
	}
	_, held, err := launcherAddrs(addrs, src, u.GetUID(), m.SourceNode)
	if err != nil {
		return fmt.Errorf("vmi %s/%s migrates to %s: source launcher pod %q: %w", u.GetNamespace(), u.GetName(), podName, m.SourcePod, err)
	}
	// The address lanekit gave the VM came from the IPAM of the node it
	// first ran on: a usable address of that Node's pod CIDR (spec.podCIDRs,
	// which only the node IPAM controller writes). Anything else (another
	// network's address, a pod CIDR's network or broadcast address) is
	// refused before the target claims it.
	if !usableInPodCIDRs(addrs[0], r.s.nodes.GetStore().List()) {
		return fmt.Errorf("vmi %s/%s migrates to %s: %s is not a usable address of any Node's pod CIDR: refused",
			u.GetNamespace(), u.GetName(), podName, addrs[0])
	}
	if err := heldByOther(addrs[0], u.GetUID(), cachedPods{r.s.pods.GetIndexer()}.Holding(addrs[0])); err != nil {
		return fmt.Errorf("vmi %s/%s migrates to %s: %w", u.GetNamespace(), u.GetName(), podName, err)
	}
	for _, a := range held[0] {
		if a.Is6() {
			return fmt.Errorf("vmi %s/%s migrates to %s: its lanekit interface also has IPv6 address %s, which cannot move through KubeVirt (IPv4 only): refused rather than moved without it",
				u.GetNamespace(), u.GetName(), podName, a)
		}
	}
	if info.MAC == "" {
		for _, i := range kv.BoundInterfaces(kubevirt.BindingName) {
			if mac := kv.GuestMAC(i.Name); mac != "" {
				info.MAC = mac
			}
		}
	}
	info.Incoming, info.Address, info.Generation = true, addrs[0], incomingGeneration(m)
	return nil
}

// launcherPod returns the pod if it is a KubeVirt launcher pod (nil if it is
// another pod), from the cache or else the API.
func (r *vmiResolver) launcherPod(ctx context.Context, namespace, name, uid string) (*k8sobj.Pod, error) {
	var pod *k8sobj.Pod
	if r.s.pods != nil {
		if o, ok, _ := r.s.pods.GetIndexer().GetByKey(namespace + "/" + name); ok {
			if p, _ := o.(*k8sobj.Pod); p != nil && (uid == "" || string(p.UID) == uid) {
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
		pod = slimPod(p)
	}
	if pod.Labels[kvv1.AppLabel] != "virt-launcher" && pod.Labels[labelCreatedBy] == "" {
		return nil, nil
	}
	return pod, nil
}

// MigrationSink is the agent's seam for KubeVirt live migrations: the
// source hands it every change of a migration this node takes part in
// (agent.VMIMigrationChanged: a target's completed state activates its
// incoming endpoint, a failed one removes it). The address's route follows
// from the claims (vmiclaims.go, EndpointRouteSink).
type MigrationSink interface {
	VMIMigrationChanged(agent.VMIMigration)
}

var _ MigrationSink = (*agent.Agent)(nil)

// migrationRecheck is how often the follower looks again for the VMI
// resource (KubeVirt installed later) or for RBAC that lets it watch VMIs.
const migrationRecheck = time.Minute

// migrationFollower watches VMIs and tells the sink about the migrations
// this node takes part in (as source or target), once per change. It
// watches every VMI, as the source watches every Pod: selecting by KubeVirt's
// node labels (kubevirt.io/nodeName, kubevirt.io/migrationTargetNodeName,
// what virt-handler selects) loses the end of a migration on the source,
// whose VMI leaves the selector when its node label moves to the target,
// possibly before the status says completed.
type migrationFollower struct {
	node string
	dc   dynamic.Interface
	sink MigrationSink
	log  *slog.Logger

	mu   sync.Mutex
	last map[string]agent.VMIMigration // by VMI namespace/name

	// Moved VM addresses (vmiclaims.go); claims nil: not fed.
	claims  EndpointRouteSink
	nodes   cache.Store   // the source's Nodes, for the owners' InternalIPs
	pods    cache.Indexer // the source's Pods (podAddrIndexers), for the launcher pods' network-status
	claimsQ chan struct{}
}

func newMigrationFollower(node string, dc dynamic.Interface, sink MigrationSink, log *slog.Logger) *migrationFollower {
	return &migrationFollower{node: node, dc: dc, sink: sink, log: log.With("follow", "vmi-migrations"), last: map[string]agent.VMIMigration{}}
}

// run waits until VMIs can be listed (no KubeVirt, or RBAC without
// list/watch, is logged once and rechecked), then follows them until ctx
// ends. It never holds readiness: a cluster without KubeVirt is normal.
func (f *migrationFollower) run(ctx context.Context) {
	var said string
	for {
		_, err := f.dc.Resource(VMIResource).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			break
		}
		msg, level := "cannot list VMIs: not following live migrations", slog.LevelWarn
		switch {
		case apierrors.IsNotFound(err):
			// A cluster without KubeVirt: normal.
			msg, level = "kubevirt.io/v1 virtualmachineinstances not served (no KubeVirt): not following live migrations", slog.LevelInfo
		case apierrors.IsForbidden(err):
			msg = "RBAC does not let the agent list/watch virtualmachineinstances: not following live migrations"
		}
		if msg != said {
			f.log.Log(ctx, level, msg, "err", err, "recheck", migrationRecheck)
			said = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(migrationRecheck):
		}
	}
	inf := dynamicinformer.NewFilteredDynamicInformer(f.dc, VMIResource, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	// Every VMI of the cluster is cached: keep only what migrationOf reads.
	if err := inf.SetTransform(slimVMI); err != nil {
		f.log.Error("VMI informer", "err", err)
		return
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { f.observe(o, false) },
		UpdateFunc: func(_, o any) { f.observe(o, false) },
		DeleteFunc: func(o any) { f.observe(o, true) },
	}); err != nil {
		f.log.Error("VMI informer", "err", err)
		return
	}
	f.log.Info("following VMI live migrations", "node", f.node, "moved-addresses", f.claims != nil)
	var wg sync.WaitGroup
	if f.claims != nil {
		wg.Go(func() { f.claimLoop(ctx, inf) })
	}
	inf.Run(ctx.Done())
	wg.Wait()
}

// observe hands the sink a VMI's migration when its typed state changed;
// a deleted VMI reports its last state.
func (f *migrationFollower) observe(o any, gone bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	m, err := migrationOf(u, f.node)
	key := u.GetNamespace() + "/" + u.GetName()
	if err != nil {
		f.log.Warn("VMI migration state", "vmi", key, "err", err)
		return
	}
	if m != nil && m.Role == kubevirt.RoleSource && f.nodes != nil {
		// Where the source hands the address over at the switch-over
		// (agent vmhandover.go): the node map's and the claims' address.
		if o, ok, _ := f.nodes.GetByKey(m.TargetNode); ok {
			if n, ok := o.(*corev1.Node); ok {
				m.TargetVia = nodeInternalIPv4(n)
			}
		}
	}
	f.mu.Lock()
	prev, seen := f.last[key]
	changed := m != nil && (!seen || !sameMigration(prev, *m))
	switch {
	case gone || m == nil:
		delete(f.last, key)
	case changed:
		f.last[key] = *m
	}
	f.mu.Unlock()
	if changed {
		f.sink.VMIMigrationChanged(*m)
	}
	f.kickClaims()
}

func sameMigration(a, b agent.VMIMigration) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.VM == b.VM && a.Role == b.Role &&
		a.UID == b.UID && a.SourceNode == b.SourceNode && a.SourcePod == b.SourcePod &&
		a.TargetNode == b.TargetNode && a.TargetPod == b.TargetPod && a.Start.Equal(b.Start) && a.End.Equal(b.End) &&
		a.Completed == b.Completed && a.Failed == b.Failed && a.AbortRequested == b.AbortRequested && a.FailureReason == b.FailureReason &&
		a.TargetVia == b.TargetVia
}

// slimVMI keeps a VMI's name, namespace, uid, resourceVersion,
// status.migrationState, status.nodeName and the status.interfaces of its
// lanekit-bound interfaces (their addresses, for vmiclaims.go).
func slimVMI(o any) (any, error) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return o, nil
	}
	slim := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind()}}
	slim.SetName(u.GetName())
	slim.SetNamespace(u.GetNamespace())
	slim.SetUID(u.GetUID())
	slim.SetResourceVersion(u.GetResourceVersion())
	st := map[string]any{}
	if ms, ok, _ := unstructured.NestedMap(u.Object, "status", "migrationState"); ok {
		st["migrationState"] = ms
	}
	if n, ok, _ := unstructured.NestedString(u.Object, "status", "nodeName"); ok {
		st["nodeName"] = n
	}
	bound := boundNames(u)
	ifs, _, _ := unstructured.NestedSlice(u.Object, "status", "interfaces")
	var keep []any
	for _, i := range ifs {
		m, ok := i.(map[string]any)
		if !ok {
			continue
		}
		if name, _ := m["name"].(string); bound[name] {
			k := map[string]any{"name": name}
			for _, f := range []string{"ipAddress", "ipAddresses"} {
				if v, ok := m[f]; ok {
					k[f] = v
				}
			}
			keep = append(keep, k)
		}
	}
	if keep != nil {
		st["interfaces"] = keep
	}
	if len(st) > 0 {
		slim.Object["status"] = st
	}
	return slim, nil
}

// migrationOf is a VMI's migration as node sees it: nil when the VMI has
// no migration state or node takes no part in it.
func migrationOf(u *unstructured.Unstructured, node string) (*agent.VMIMigration, error) {
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	kv, err := kubevirt.ParseVMI(raw)
	if err != nil {
		return nil, err
	}
	m, err := kv.Migration()
	if err != nil || m == nil {
		return nil, err
	}
	role := m.Role(node)
	if role == kubevirt.RoleNone {
		return nil, nil
	}
	return &agent.VMIMigration{Namespace: u.GetNamespace(), Name: u.GetName(), VM: VMName(u.GetNamespace(), u.GetName()),
		Role: role, Migration: *m}, nil
}

// pendingTarget is the migration a launcher pod is the target of before the
// VMI's migrationState names it: the pod carries KubeVirt's migration job
// label and name (virt-controller sets both on the target pod it creates),
// the VirtualMachineInstanceMigration of that name and UID exists, is for
// this VMI and is not over, and the VMI runs on another node, in its
// launcher pod there (the source). nil without the label. The generation is
// the migration object's creation: after the source's own (its VM was
// active before the migration was asked for), before the claim of any
// later migration.
func (r *vmiResolver) pendingTarget(ctx context.Context, u *unstructured.Unstructured, pod *k8sobj.Pod) (*kubevirt.Migration, error) {
	uid, name := pod.Labels[kvv1.MigrationJobLabel], pod.Annotations[kvv1.MigrationJobNameAnnotation]
	if uid == "" {
		return nil, nil
	}
	where := fmt.Sprintf("launcher pod %s/%s (migration %s)", pod.Namespace, pod.Name, name)
	if name == "" {
		return nil, fmt.Errorf("%s: %s label without the %s annotation", where, kvv1.MigrationJobLabel, kvv1.MigrationJobNameAnnotation)
	}
	mig, err := r.dc.Resource(VMIMResource).Namespace(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	vmiName, _, _ := unstructured.NestedString(mig.Object, "spec", "vmiName")
	phase, _, _ := unstructured.NestedString(mig.Object, "status", "phase")
	switch {
	case string(mig.GetUID()) != uid:
		return nil, fmt.Errorf("%s: the migration is %s, the pod's label says %s", where, mig.GetUID(), uid)
	case vmiName != u.GetName():
		return nil, fmt.Errorf("%s: the migration moves vmi %q, not %q", where, vmiName, u.GetName())
	case phase == "Succeeded" || phase == "Failed":
		return nil, nil // over: an ordinary attachment
	}
	source, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
	if source == "" || source == pod.Spec.NodeName {
		return nil, fmt.Errorf("%s: vmi %s/%s runs on node %q, not on another node to migrate from", where, u.GetNamespace(), u.GetName(), source)
	}
	m := &kubevirt.Migration{UID: uid, SourceNode: source, TargetNode: pod.Spec.NodeName, TargetPod: pod.Name, Start: mig.GetCreationTimestamp().Time}
	pods, err := r.s.cfg.Client.CoreV1().Pods(pod.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labelCreatedBy + "=" + string(u.GetUID())})
	if err != nil {
		return nil, fmt.Errorf("%s: launcher pods: %w", where, err)
	}
	for _, p := range pods.Items {
		if p.Name != pod.Name && p.Spec.NodeName == source && p.DeletionTimestamp == nil {
			m.SourcePod = p.Name
		}
	}
	if m.SourcePod == "" {
		return nil, fmt.Errorf("%s: no launcher pod of vmi %s/%s on node %s", where, u.GetNamespace(), u.GetName(), source)
	}
	return m, nil
}
