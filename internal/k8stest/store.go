package k8stest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/internal/workpool"
)

// Store is a bulk create for large test fills: objects are written to etcd
// under the API server's keys, encoded as the API server encodes them
// (protobuf), with the system fields a create sets (uid, creationTimestamp,
// the generation); the API server defaults them when it reads them (its
// storage decoder does, as for objects stored by an older version), and
// its watch cache and every informer see the writes as creates. The first
// object of each kind is created with dryRun first: admission and
// validation check what the rest look like.
//
// Why not creates: kube-apiserver (1.33+, the IPAddress allocator) lists
// every allocated ClusterIP twice for its metrics on each ClusterIP it
// allocates (ipallocator.Allocator.Used and Free), so N Services cost O(N²):
// 2,000 fill at ~120/s, 8,000 at ~40/s, 30,000 took 29 minutes; and a
// create per object (a dry run too) is a few ms of the API server's CPU.
// Store gives each ClusterIP-less Service a free address of the server's
// Service range (in order) and stores the IPAddress object the allocator
// would have created beside it.
//
// A status set on an object (a Pod's, a Node's) is stored as given, as a
// create and then a status update would leave it. Objects must not exist.
// Supported kinds: Namespace, Node, Pod, Service, EndpointSlice,
// NetworkPolicy, IPAddress.
func (s *Server) Store(ctx context.Context, objs []runtime.Object) error {
	c, err := kubernetes.NewForConfig(s.RESTConfig())
	if err != nil {
		return err
	}
	objs, err = s.withClusterIPs(ctx, c, objs)
	if err != nil {
		return err
	}
	generation := map[reflect.Type]int64{}
	for _, o := range objs {
		if _, seen := generation[reflect.TypeOf(o)]; seen {
			continue
		}
		dry, err := dryRunCreate(ctx, c, o)
		if err != nil {
			return fmt.Errorf("k8stest: store: %w", err)
		}
		generation[reflect.TypeOf(o)] = dry.(metav1.Object).GetGeneration()
	}
	now := metav1.Now()
	groups := storeGroups(objs)
	encoded := make([]struct {
		keys []string
		vals [][]byte
	}, len(groups))
	for g, group := range groups {
		for _, o := range group {
			o = o.DeepCopyObject()
			m := o.(metav1.Object)
			m.SetUID(uuid.NewUUID())
			m.SetCreationTimestamp(now)
			m.SetGeneration(generation[reflect.TypeOf(o)])
			if svc, ok := o.(*corev1.Service); ok && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone {
				// What the allocation sets (the create's REST storage, not
				// defaulting).
				svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
				svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
			}
			key, err := storageKey(o)
			if err != nil {
				return err
			}
			val, err := encodeStored(o)
			if err != nil {
				return err
			}
			encoded[g].keys, encoded[g].vals = append(encoded[g].keys, key), append(encoded[g].vals, val)
		}
	}
	// One transaction per group, storeWorkers at a time: each object gets
	// a revision of its own, as a create would give it. One client (its
	// connections reused) for all of them.
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DialContext: s.dialContext, MaxIdleConnsPerHost: storeWorkers}}
	defer hc.CloseIdleConnections()
	return workpool.Run(ctx, len(encoded), storeWorkers, func(ctx context.Context, g int) error {
		return s.etcdCreate(ctx, hc, encoded[g].keys, encoded[g].vals)
	})
}

// storeGroups cuts objs into the objects of one transaction each: one
// object, or a Service and the IPAddress after it (between two transactions
// the API server's repair controller would create the IPAddress of a
// Service it sees without one, and the second would fail). One object per
// etcd revision, as creates make them: several of one resource in one
// transaction share a revision, and a watcher the API server drops for
// falling behind (a burst of thousands) resumes after the revision it last
// saw, losing the rest of that revision's objects — an informer then never
// sees them (the lab's agents missed ~2 % of 30,000 Services that way).
func storeGroups(objs []runtime.Object) [][]runtime.Object {
	var out [][]runtime.Object
	for i := 0; i < len(objs); i++ {
		end := i + 1
		if _, ok := objs[i].(*corev1.Service); ok && i+1 < len(objs) {
			if _, ok := objs[i+1].(*networkingv1.IPAddress); ok {
				end = i + 2
			}
		}
		out = append(out, objs[i:end])
		i = end - 1
	}
	return out
}

// storeWorkers is how many transactions Store has in flight.
const storeWorkers = 8

// withClusterIPs gives each Service that would get a ClusterIP from the
// allocator a free address of the server's IPv4 Service range, and adds the
// IPAddress object the allocator would have created right after it.
func (s *Server) withClusterIPs(ctx context.Context, c kubernetes.Interface, objs []runtime.Object) ([]runtime.Object, error) {
	var need bool
	for _, o := range objs {
		if svc, ok := o.(*corev1.Service); ok && wantsClusterIP(svc) {
			need = true
			break
		}
	}
	if !need {
		return objs, nil
	}
	prefix, err := netip.ParsePrefix(strings.Split(s.ServiceCIDR, ",")[0])
	if err != nil || !prefix.Addr().Is4() {
		return nil, fmt.Errorf("k8stest: store: Service range %q: want an IPv4 range first", s.ServiceCIDR)
	}
	prefix = prefix.Masked()
	used := map[netip.Addr]bool{}
	ips, err := c.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("k8stest: store: list IPAddresses: %w", err)
	}
	for _, ip := range ips.Items {
		if a, err := netip.ParseAddr(ip.Name); err == nil {
			used[a] = true
		}
	}
	// The network address and the first (the kubernetes Service's) are
	// never handed out; neither is the broadcast address.
	a := prefix.Addr().Next().Next()
	out := make([]runtime.Object, 0, len(objs)+len(objs)/2)
	for _, o := range objs {
		svc, ok := o.(*corev1.Service)
		if !ok || !wantsClusterIP(svc) {
			out = append(out, o)
			continue
		}
		for used[a] {
			a = a.Next()
		}
		if !prefix.Contains(a) || !prefix.Contains(a.Next()) {
			return nil, fmt.Errorf("k8stest: store: Service range %s is full", prefix)
		}
		used[a] = true
		svc = svc.DeepCopy()
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = a.String(), []string{a.String()}
		out = append(out, svc, &networkingv1.IPAddress{
			ObjectMeta: metav1.ObjectMeta{Name: a.String(), Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol),
				networkingv1.LabelManagedBy:       "ipallocator.k8s.io", // the API server's allocator
			}},
			Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: svc.Namespace, Name: svc.Name}},
		})
	}
	return out, nil
}

// wantsClusterIP: a Service the API server would allocate a ClusterIP for.
func wantsClusterIP(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP == "" && svc.Spec.Type != corev1.ServiceTypeExternalName
}

// dryRunCreate creates obj with dryRun and returns what the API server
// would store (with obj's status, if it has one).
func dryRunCreate(ctx context.Context, c kubernetes.Interface, obj runtime.Object) (runtime.Object, error) {
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	switch o := obj.(type) {
	case *corev1.Namespace:
		return c.CoreV1().Namespaces().Create(ctx, o, dry)
	case *corev1.Node:
		out, err := c.CoreV1().Nodes().Create(ctx, o, dry)
		if err == nil && !isZero(o.Status) {
			out.Status = o.Status
		}
		return out, err
	case *corev1.Pod:
		out, err := c.CoreV1().Pods(o.Namespace).Create(ctx, o, dry)
		if err == nil && !isZero(o.Status) {
			qos := out.Status.QOSClass
			out.Status = o.Status
			out.Status.QOSClass = qos
		}
		return out, err
	case *corev1.Service:
		return c.CoreV1().Services(o.Namespace).Create(ctx, o, dry)
	case *discoveryv1.EndpointSlice:
		return c.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, dry)
	case *networkingv1.NetworkPolicy:
		return c.NetworkingV1().NetworkPolicies(o.Namespace).Create(ctx, o, dry)
	case *networkingv1.IPAddress:
		return c.NetworkingV1().IPAddresses().Create(ctx, o, dry)
	}
	return nil, fmt.Errorf("store: unsupported %T", obj)
}

func isZero(v any) bool { return reflect.ValueOf(v).IsZero() }

// storageKey is obj's etcd key under the API server's default prefix.
func storageKey(obj runtime.Object) (string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return "", fmt.Errorf("store: %T has no metadata", obj)
	}
	var res string
	switch obj.(type) {
	case *corev1.Namespace:
		res = "namespaces"
	case *corev1.Node:
		res = "minions"
	case *corev1.Pod:
		res = "pods"
	case *corev1.Service:
		res = "services/specs"
	case *discoveryv1.EndpointSlice:
		res = "endpointslices"
	case *networkingv1.NetworkPolicy:
		res = "networkpolicies"
	case *networkingv1.IPAddress:
		res = "ipaddresses"
	default:
		return "", fmt.Errorf("store: unsupported %T", obj)
	}
	if ns := m.GetNamespace(); ns != "" {
		return "/registry/" + res + "/" + ns + "/" + m.GetName(), nil
	}
	return "/registry/" + res + "/" + m.GetName(), nil
}

var storeCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// encodeStored encodes obj as the API server stores it: its kind and
// version in the envelope, no resourceVersion (etcd's revision is).
func encodeStored(obj runtime.Object) ([]byte, error) {
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		return nil, err
	}
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	obj.(metav1.Object).SetResourceVersion("")
	var b bytes.Buffer
	if err := storeCodec.Encode(obj, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// etcdCreate puts keys in one transaction if none of them exists (etcd's
// JSON gateway: no etcd client in this module).
func (s *Server) etcdCreate(ctx context.Context, hc *http.Client, keys []string, vals [][]byte) error {
	type kv = map[string]any
	var cmp, put []kv
	for i, k := range keys {
		bk := base64.StdEncoding.EncodeToString([]byte(k))
		cmp = append(cmp, kv{"key": bk, "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
		put = append(put, kv{"request_put": kv{"key": bk, "value": base64.StdEncoding.EncodeToString(vals[i])}})
	}
	body, err := json.Marshal(kv{"compare": cmp, "success": put})
	if err != nil {
		return err
	}
	url := "http://" + s.Address + ":" + strconv.Itoa(s.EtcdPort) + "/v3/kv/txn"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("k8stest: etcd txn: %w", err)
	}
	b, err := readAll(resp)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("k8stest: etcd txn: %s: %s", resp.Status, lastLine(b))
	}
	var r struct {
		Succeeded bool `json:"succeeded"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("k8stest: etcd txn: %w", err)
	}
	if !r.Succeeded {
		return fmt.Errorf("k8stest: store: one of %s..%s exists", keys[0], keys[len(keys)-1])
	}
	return nil
}
