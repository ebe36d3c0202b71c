package lab

// The lab "kubelet": one per node in `lab up --k8s`. It watches the Pods
// bound to its node (spec.nodeName) and does what kubelet and its container
// runtime do for the network: a network namespace per pod, the CNI plugin
// called through libcni with kubelet's CNI_ARGS (ADD when the pod appears,
// DEL when it is deleted), the pod IP written to the Pod's status, and the
// final delete (grace period 0) once the network is torn down. No containers
// run: the namespace is the pod.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Kubelet attaches the pods of lab node Index.
type Kubelet struct {
	Index  int
	Client kubernetes.Interface
	// Dynamic reads NetworkAttachmentDefinitions (secondary networks,
	// multus.go); nil: pods asking for them fail.
	Dynamic dynamic.Interface
	Bins    Bins
	Log     *slog.Logger

	pods   cache.SharedIndexInformer
	queue  workqueue.TypedRateLimitingInterface[string]
	netns  map[string]types.UID // attached pods: "ns/name" → UID
	byUID  map[types.UID]string // UID → netns
	nodeIP string
}

// KubeNodeName is node i's Node name in `lab up --k8s`.
func KubeNodeName(i int) string { return NodeNS(i) }

// PodNetns is the network namespace the lab kubelet creates for a pod on
// node i: lk-n<i>-k<number from the pod UID> (a lab namespace that
// `lab down` removes).
func PodNetns(i int, uid types.UID) string {
	h := sha256.Sum256([]byte(uid))
	return fmt.Sprintf("lk-n%d-k%d", i, binary.BigEndian.Uint32(h[:4])>>4)
}

// InfraContainerID is the sandbox ("infra container") ID kubelet would pass
// as CNI_CONTAINERID and K8S_POD_INFRA_CONTAINER_ID.
func InfraContainerID(uid types.UID) string {
	h := sha256.Sum256([]byte("sandbox/" + uid))
	return hex.EncodeToString(h[:])
}

// Run watches the node's pods until ctx ends.
func (k *Kubelet) Run(ctx context.Context) error {
	if k.Log == nil {
		k.Log = slog.Default()
	}
	k.netns, k.byUID = map[string]types.UID{}, map[types.UID]string{}
	k.nodeIP = UnderlayIP(k.Index)
	node := KubeNodeName(k.Index)
	f := informers.NewSharedInformerFactoryWithOptions(k.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	k.pods = f.Core().V1().Pods().Informer()
	k.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 10*time.Second))
	defer k.queue.ShutDown()
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok {
			k.queue.Add(p.Namespace + "/" + p.Name)
		}
	}
	if _, err := k.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), k.pods.HasSynced) {
		return ctx.Err()
	}
	k.Log.Info("lab kubelet running", "node", node)
	go func() {
		<-ctx.Done()
		k.queue.ShutDown()
	}()
	for {
		key, quit := k.queue.Get()
		if quit {
			return nil
		}
		if err := k.sync(ctx, key); err != nil {
			k.Log.Error("sync pod", "pod", key, "err", err)
			k.queue.AddRateLimited(key)
		} else {
			k.queue.Forget(key)
		}
		k.queue.Done(key)
	}
}

// sync brings one pod's network to what the API says.
func (k *Kubelet) sync(ctx context.Context, key string) error {
	o, exists, err := k.pods.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		// Deleted with grace period 0 (or by us): tear down if attached.
		if uid, ok := k.netns[key]; ok {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			return k.teardown(ctx, ns, name, uid)
		}
		return nil
	}
	p := o.(*corev1.Pod)
	if old, ok := k.netns[key]; ok && old != p.UID {
		// The same name, a new pod: the old one's network goes first.
		if err := k.teardown(ctx, p.Namespace, p.Name, old); err != nil {
			return err
		}
	}
	if p.DeletionTimestamp != nil {
		if _, ok := k.netns[key]; ok {
			if err := k.teardown(ctx, p.Namespace, p.Name, p.UID); err != nil {
				return err
			}
		}
		// What kubelet does once the pod's containers and sandbox are gone.
		err := k.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("final delete: %w", err)
		}
		return nil
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil
	}
	if _, ok := k.netns[key]; ok {
		return nil
	}
	if ns := PodNetns(k.Index, p.UID); p.Status.PodIP != "" && netnsExists(ns) {
		// Attached by this kubelet before a restart.
		k.netns[key], k.byUID[p.UID] = p.UID, ns
		return nil
	}
	return k.setup(ctx, p)
}

func (k *Kubelet) cniArgs(p *corev1.Pod, uid types.UID) *libcni.RuntimeConf {
	ns := PodNetns(k.Index, uid)
	return &libcni.RuntimeConf{
		ContainerID: InfraContainerID(uid),
		NetNS:       netnsPath(ns),
		IfName:      PodIfName,
		// As kubelet's dockershim/CRI runtimes pass them.
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", p.Namespace},
			{"K8S_POD_NAME", p.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", InfraContainerID(uid)},
			{"K8S_POD_UID", string(uid)},
		},
	}
}

// setup creates the pod's netns, runs CNI ADD and reports the IP.
func (k *Kubelet) setup(ctx context.Context, p *corev1.Pod) error {
	key := p.Namespace + "/" + p.Name
	ns := PodNetns(k.Index, p.UID)
	if !netnsExists(ns) {
		if err := addNetns(ctx, ns); err != nil {
			return fmt.Errorf("pod %s: %w", key, err)
		}
	}
	if err := makeVolumes(p); err != nil {
		return fmt.Errorf("pod %s: volumes: %w", key, err)
	}
	cni, list, err := cniFor(k.Bins, k.Index, KindLanekit)
	if err != nil {
		return err
	}
	rt := k.cniArgs(p, p.UID)
	res, err := cni.AddNetworkList(ctx, list, rt)
	var statuses []NetworkStatus
	if err == nil {
		// Multus: the cluster network, then the pod's secondary networks.
		if statuses, err = k.addSecondary(ctx, p, rt); err != nil {
			_ = k.delSecondary(ctx, p.UID, rt)
		}
	}
	if err != nil {
		// Like kubelet: the sandbox is torn down and retried.
		_ = cni.DelNetworkList(ctx, list, rt)
		_ = ip(ctx, "netns", "del", ns)
		return fmt.Errorf("pod %s: cni add: %w", key, err)
	}
	k.netns[key], k.byUID[p.UID] = p.UID, ns
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("pod %s: cni result: %w", key, err)
	}
	podIPs, err := resultPodIPs(r)
	if err != nil {
		return fmt.Errorf("pod %s: %w", key, err)
	}
	k.Log.Info("pod attached", "pod", key, "netns", ns, "ips", podIPs)
	if len(statuses) > 0 {
		all := append([]NetworkStatus{{Name: list.Name, Interface: PodIfName, IPs: podIPs, Default: true}}, statuses...)
		raw, err := json.Marshal(all)
		if err != nil {
			return err
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{NetworkStatusAnnotation: string(raw)}}})
		if err != nil {
			return err
		}
		if _, err := k.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("pod %s: network-status: %w", key, err)
		}
	}
	return k.reportRunning(ctx, p, podIPs)
}

// resultPodIPs are a CNI result's pod addresses as kubelet reports them:
// the IPv4 one first (the lab's primary family), then the IPv6 one of a
// dual-stack node; at most one per family.
func resultPodIPs(r *current.Result) ([]string, error) {
	var v4, v6 string
	for _, ipc := range r.IPs {
		switch a := ipc.Address.IP; {
		case a.To4() != nil && v4 == "":
			v4 = a.To4().String()
		case a.To4() == nil && a.To16() != nil && v6 == "":
			v6 = a.String()
		}
	}
	switch {
	case v4 == "" && v6 == "":
		return nil, fmt.Errorf("cni result has no pod address")
	case v4 == "": // an IPv6-only node's pod
		return []string{v6}, nil
	case v6 == "":
		return []string{v4}, nil
	}
	return []string{v4, v6}, nil
}

// reportRunning writes the pod IPs and a running, ready status; a pod with
// an IPv6 address is on a dual-stack node, whose host IPs are both too.
func (k *Kubelet) reportRunning(ctx context.Context, p *corev1.Pod, podIPs []string) error {
	hostIPs := []corev1.HostIP{{IP: k.nodeIP}}
	if len(podIPs) > 1 || strings.Contains(podIPs[0], ":") { // dual-stack or IPv6-only
		hostIPs = append(hostIPs, corev1.HostIP{IP: UnderlayIP6(k.Index)})
	}
	statusIPs := make([]corev1.PodIP, 0, len(podIPs))
	for _, a := range podIPs {
		statusIPs = append(statusIPs, corev1.PodIP{IP: a})
	}
	now := metav1.Now()
	for attempt := 0; ; attempt++ {
		cur, err := k.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if cur.UID != p.UID {
			return nil
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.HostIP, cur.Status.HostIPs = k.nodeIP, hostIPs
		cur.Status.PodIP, cur.Status.PodIPs = podIPs[0], statusIPs
		cur.Status.StartTime = &now
		cur.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		_, err = k.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) || attempt > 5 {
			if err != nil {
				return fmt.Errorf("pod %s/%s status: %w", p.Namespace, p.Name, err)
			}
			return nil
		}
	}
}

// teardown runs CNI DEL and removes the pod's netns.
func (k *Kubelet) teardown(ctx context.Context, namespace, name string, uid types.UID) error {
	key := namespace + "/" + name
	cni, list, err := cniFor(k.Bins, k.Index, KindLanekit)
	if err != nil {
		return err
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rt := k.cniArgs(p, uid)
	if err := k.delSecondary(dctx, uid, rt); err != nil {
		return fmt.Errorf("pod %s: %w", key, err)
	}
	if err := cni.DelNetworkList(dctx, list, rt); err != nil {
		return fmt.Errorf("pod %s: cni del: %w", key, err)
	}
	// The pod's volumes go with it.
	if err := os.RemoveAll(podDir(uid)); err != nil {
		return fmt.Errorf("pod %s: volumes: %w", key, err)
	}
	ns := PodNetns(k.Index, uid)
	if netnsExists(ns) {
		if err := ip(ctx, "netns", "del", ns); err != nil {
			return fmt.Errorf("pod %s: %w", key, err)
		}
	}
	delete(k.netns, key)
	delete(k.byUID, uid)
	k.Log.Info("pod detached", "pod", key, "netns", ns)
	return nil
}

// errNoLabK8s means the lab runs without --k8s.
var errNoLabK8s = errors.New("the lab is not up with --k8s")
