// Package k8s is the agent's Kubernetes source: client-go informers on the
// API server feed the agent. Namespaces, Pods (cluster-wide: remote pods give
// identities), Services, EndpointSlices and NetworkPolicies go to the agent's
// object seam (UpsertObjects/DeleteObject, ReplaceObjects after each initial
// list); other Nodes' pod CIDRs become native routes via their InternalIP;
// KubeVirt VirtualMachineInstances on this node become VM endpoints in their
// virt-launcher pod's network namespace.
//
// An object the agent cannot take — invalid, or a Service claiming a
// frontend an older Service holds — is refused on its own: logged, counted
// (Agent.Refused, the lanekit_k8s_objects_refused metric), and everything
// else applies; the source is ready all the same. A change to a refused
// object, or to an object it clashes with (the agent says which), hands the
// agent the kind's full set again (coalesced), so the refused object applies
// once the clash is gone; the full set decides as at start-up (the oldest of
// clashing Services keeps the frontend).
//
// A lost watch or a restarted API server is a relist: client-go turns it
// into the adds, updates and deletes that converge the agent. While the API
// server is down nothing is removed: the datapath keeps forwarding on what
// it has.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// ObjectSink is the agent's object seam (SEAMS.md §2).
type ObjectSink interface {
	UpsertObjects(objs []k8sobj.Object) error                    // all-or-nothing
	DeleteObject(kind k8sobj.Kind, namespace, name string) error // idempotent
	DeleteObjects(refs []agent.ObjectRef) error                  // idempotent, all-or-nothing
	// ReplaceObjects takes the full set of a kind, refusing objects on
	// their own (agent.ErrInvalid) and applying the rest; the error is for
	// what is not about one object.
	ReplaceObjects(kind k8sobj.Kind, objs []k8sobj.Object) ([]agent.Refusal, error)
}

// resyncDelay coalesces the changes that hand the agent a kind's full set
// again because they may settle a refusal.
const resyncDelay = time.Second

// Config is what a Source watches and where it sends what it sees.
type Config struct {
	NodeName string
	Client   kubernetes.Interface
	// Dynamic watches KubeVirt VMIs; nil, or an API server without the
	// kubevirt.io CRD, leaves VMs alone.
	Dynamic dynamic.Interface
	// Objects receives the objects; nil: only Nodes (routes) and VMIs.
	Objects ObjectSink
	// VMs asks which VMI a launcher pod runs (VM attachments); nil: no
	// VMI lookups.
	VMs VMSink
	// Routes receives the other nodes' pod CIDRs; nil: no routes.
	Routes RouteSink
	// EndpointRoutes receives the other nodes' claims of moved VM addresses
	// (from the VMIs' migration states; vmiclaims.go) when the VMs seam
	// follows migrations; nil: no claims.
	EndpointRoutes EndpointRouteSink
	// Latency records how long each change took to reach the datapath
	// (latency.go); nil: not measured.
	Latency LatencyObserver
	// OnSynced runs once, when the agent first has the full set of every
	// kind (after a restart, its restore of the stored objects too: the
	// full sets wait for it): the initial sync's transient garbage is dead
	// then. nil: nothing runs.
	OnSynced func()
	Log      *slog.Logger
}

// Source runs the informers. Create it with New, then Run.
type Source struct {
	cfg     Config
	log     *slog.Logger
	factory informers.SharedInformerFactory
	kinds   map[k8sobj.Kind]cache.SharedIndexInformer
	queue   workqueue.TypedRateLimitingInterface[objKey]
	nodes   cache.SharedIndexInformer
	pods    cache.SharedIndexInformer
	routesQ chan struct{}
	migs    *migrationFollower // VMI live migrations (nil: no KubeVirt seam)
	latency *latencyTracker    // nil: Config.Latency is nil
	// capacity reports Services the agent's full maps could not take (nil:
	// the ObjectSink does not say).
	capacity *capacityWatcher

	mu       sync.Mutex
	synced   bool
	syncErr  error
	replaced map[k8sobj.Kind]bool
	// refused: the objects the agent refused, by kind.
	refused map[k8sobj.Kind]map[objKey]refusal
}

// refusal is why the agent refused an object, and the objects whose change
// may settle it (nil: any object of its kind).
type refusal struct {
	reason string
	by     []objKey
}

// objKey names a queued object, or with all the full set of its kind.
type objKey struct {
	kind      k8sobj.Kind
	namespace string
	name      string
	all       bool
}

func (k objKey) String() string {
	switch {
	case k.all:
		return string(k.kind) + " (all)"
	case k.namespace == "":
		return string(k.kind) + " " + k.name
	}
	return string(k.kind) + " " + k.namespace + "/" + k.name
}

// New sets up the informers (nothing runs until Run).
func New(cfg Config) (*Source, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("k8s source: node name is required")
	}
	if cfg.Client == nil {
		return nil, errors.New("k8s source: client is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Source{
		cfg: cfg, log: cfg.Log.With("source", "k8s"),
		kinds:    map[k8sobj.Kind]cache.SharedIndexInformer{},
		routesQ:  make(chan struct{}, 1),
		replaced: map[k8sobj.Kind]bool{},
		refused:  map[k8sobj.Kind]map[objKey]refusal{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[objKey](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[objKey]{Name: "lanekit-k8s"}),
	}
	if u, ok := cfg.Objects.(UnprogrammedSource); ok {
		s.capacity = newCapacityWatcher(s, u)
	}
	if cfg.Latency != nil {
		s.latency = newLatencyTracker(cfg.Latency, time.Now())
	}
	// Only what the agent reads enters the caches (slim.go).
	s.factory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithTransform(slim))
	f := s.factory
	// Without the factory's namespace index: nothing here looks objects up
	// by namespace, and it held an entry per object.
	all, none := metav1.NamespaceAll, cache.Indexers{}
	s.kinds[k8sobj.KindNamespace] = f.InformerFor(&corev1.Namespace{}, func(c kubernetes.Interface, r time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewNamespaceInformer(c, r, none)
	})
	s.kinds[k8sobj.KindPod] = f.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, r time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewPodInformer(c, all, r, none)
	})
	s.kinds[k8sobj.KindService] = f.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, r time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewServiceInformer(c, all, r, none)
	})
	s.kinds[k8sobj.KindEndpointSlice] = f.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, r time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewEndpointSliceInformer(c, all, r, none)
	})
	s.kinds[k8sobj.KindNetworkPolicy] = f.InformerFor(&networkingv1.NetworkPolicy{}, func(c kubernetes.Interface, r time.Duration) cache.SharedIndexInformer {
		return networkinginformers.NewNetworkPolicyInformer(c, all, r, none)
	})
	s.pods = s.kinds[k8sobj.KindPod]
	if err := s.pods.AddIndexers(podAddrIndexers); err != nil { // vmitrust.go
		return nil, fmt.Errorf("k8s source: pod index: %w", err)
	}
	if err := s.kinds[k8sobj.KindEndpointSlice].AddIndexers(sliceIndexers); err != nil { // vmsvc.go
		return nil, fmt.Errorf("k8s source: slice index: %w", err)
	}
	for kind, inf := range s.kinds {
		if _, err := inf.AddEventHandler(s.handler(kind)); err != nil {
			return nil, fmt.Errorf("k8s source: %s handler: %w", kind, err)
		}
	}
	s.nodes = f.InformerFor(&corev1.Node{}, func(c kubernetes.Interface, r time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewNodeInformer(c, r, none)
	})
	if _, err := s.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.kickNodes() },
		UpdateFunc: func(any, any) { s.kickNodes() },
		DeleteFunc: func(any) { s.kickNodes() },
	}); err != nil {
		return nil, fmt.Errorf("k8s source: node handler: %w", err)
	}
	if cfg.VMs != nil && cfg.Dynamic != nil {
		r := &vmiResolver{s: s, dc: cfg.Dynamic}
		cfg.VMs.SetVMIResolver(r.resolve)
		if ms, ok := cfg.VMs.(MigrationSink); ok {
			s.migs = newMigrationFollower(cfg.NodeName, cfg.Dynamic, ms, s.log)
			if cfg.EndpointRoutes != nil {
				s.migs.claims, s.migs.nodes, s.migs.claimsQ = cfg.EndpointRoutes, s.nodes.GetStore(), make(chan struct{}, 1)
				s.migs.pods = s.pods.GetIndexer()
			}
		}
	}
	if err := s.watchLaunchers(); err != nil {
		return nil, err
	}
	return s, nil
}

// watchLaunchers runs again what reads a launcher pod's network-status (its
// VM's address), which arrives after the pod and after the slices that name
// it: the slices naming the pod (vmsvc.go) and the claims of moved VM
// addresses (vmiclaims.go). A pod update changing none of that wakes
// neither. The initial list kicks no slices: their full set is made after
// every cache synced (Run).
func (s *Source) watchLaunchers() error {
	reapply, claims := s.cfg.Objects != nil, s.migs != nil && s.migs.claimsQ != nil
	if !reapply && !claims {
		return nil
	}
	kick := func(o any, slicesToo bool) {
		if reapply && slicesToo {
			s.kickSlicesOf(podOf(o))
		}
		if claims {
			s.migs.kickClaims()
		}
	}
	if _, err := s.pods.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(o any, initial bool) { kick(o, !initial) },
		UpdateFunc: func(old, cur any) {
			if claimInputsChanged(old, cur) {
				kick(cur, true)
			}
		},
		DeleteFunc: func(o any) { kick(o, true) },
	}); err != nil {
		return fmt.Errorf("k8s source: pod handler: %w", err)
	}
	return nil
}

// kickNodes wakes what reads the Nodes: the routes and the claims of moved
// VM addresses (the owners' InternalIPs).
func (s *Source) kickNodes() {
	s.kickRoutes()
	if s.migs != nil {
		s.migs.kickClaims()
	}
}

// handler queues each add, update and delete of kind by name; the worker
// reads the current state from the informer's store.
// With a latency tracker, each change's trigger time is noted before the
// object is queued.
func (s *Source) handler(kind k8sobj.Kind) cache.ResourceEventHandler {
	enqueue := func(old, obj any, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		m, ok := obj.(metav1.Object)
		if !ok {
			return
		}
		if s.cfg.Objects != nil {
			k := objectKey(kind, m)
			if lt := s.latency; lt != nil {
				if deleted {
					lt.drop(k)
				} else if t, ok := lt.changeTrigger(kind, old, obj, time.Now(), s.kinds[k8sobj.KindService].GetStore()); ok {
					lt.add(k, t)
				}
			}
			s.queue.Add(k)
			for _, kind := range s.maySettle(k) {
				s.queue.AddAfter(objKey{kind: kind, all: true}, resyncDelay)
			}
		}
	}
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			// The initial list reaches the agent as the kind's full set
			// once the caches are synced (Run): queued too, each object
			// would be applied a second time, one by one.
			if !initial {
				enqueue(nil, obj, false)
			}
		},
		UpdateFunc: func(old, obj any) { enqueue(old, obj, false) },
		DeleteFunc: func(obj any) { enqueue(nil, obj, true) },
	}
}

// Run starts the informers, hands the agent the full set of each kind once
// the caches are synced, then applies changes until ctx ends.
func (s *Source) Run(ctx context.Context) error {
	defer s.queue.ShutDown()
	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	s.log.Info("waiting for the API caches", "node", s.cfg.NodeName)
	syncs := []cache.InformerSynced{s.nodes.HasSynced}
	for _, inf := range s.kinds {
		syncs = append(syncs, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return ctx.Err()
	}
	// The agent's store may hold objects deleted while it was down: the
	// first apply of each kind is the full set. Objects the agent refuses
	// do not hold readiness back, nor does a datapath that refused part of
	// the set (the agent has it, programs the rest and retries that part
	// alone, as for any later change); any other failure is retried.
	for _, kind := range k8sobj.Kinds {
		inf, ok := s.kinds[kind]
		if !ok || s.cfg.Objects == nil {
			continue
		}
		for attempt := 0; ; attempt++ {
			err := s.replace(kind, inf)
			if err == nil {
				break
			}
			if errors.Is(err, agent.ErrDatapathPending) {
				s.log.Warn("initial sync: the agent has the full set; part of it is not programmed yet (retried by the agent)", "kind", kind, "err", err)
				break
			}
			s.setSyncErr(err)
			s.log.Error("initial sync", "kind", kind, "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(min(time.Duration(attempt+1)*time.Second, 10*time.Second)):
			}
		}
	}
	s.mu.Lock()
	s.synced, s.syncErr = true, nil
	s.mu.Unlock()
	s.log.Info("API caches synced", "node", s.cfg.NodeName)
	if s.cfg.OnSynced != nil {
		s.cfg.OnSynced()
	}

	var wg sync.WaitGroup
	wg.Go(func() { s.work(ctx) })
	if s.cfg.Routes != nil {
		wg.Go(func() { s.routeLoop(ctx) })
	}
	if s.migs != nil {
		wg.Go(func() { s.migs.run(ctx) })
	}
	if s.capacity != nil {
		wg.Go(func() { s.capacity.run(ctx) })
	}
	<-ctx.Done()
	s.queue.ShutDown()
	wg.Wait()
	return nil
}

// Synced is nil once the caches are synced and the agent has the full set
// of every kind; otherwise it says what is missing (the readiness check).
func (s *Source) Synced() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced {
		return nil
	}
	if s.syncErr != nil {
		return fmt.Errorf("k8s caches not synced: %w", s.syncErr)
	}
	return errors.New("k8s caches not synced")
}

func (s *Source) setSyncErr(err error) {
	s.mu.Lock()
	s.syncErr = err
	s.mu.Unlock()
}

// replace hands the agent every object of kind in the cache (invalid ones
// too: the agent refuses them, and counts them with the others it refuses).
func (s *Source) replace(kind k8sobj.Kind, inf cache.SharedIndexInformer) error {
	var objs []k8sobj.Object
	for _, o := range inf.GetStore().List() {
		obj, err := s.object(kind, o)
		if err != nil && !errors.Is(err, errInvalid) {
			s.log.Warn("ignoring object", "kind", kind, "err", err)
			continue
		}
		objs = append(objs, obj)
	}
	refused, err := s.cfg.Objects.ReplaceObjects(kind, objs)
	if err != nil && !errors.Is(err, agent.ErrDatapathPending) {
		return fmt.Errorf("replace %d %s objects: %w", len(objs), kind, err)
	}
	// Taken (the datapath may retry a part of it): not handed over again.
	s.noteRefused(kind, refused)
	s.mu.Lock()
	first := !s.replaced[kind]
	s.replaced[kind] = true
	s.mu.Unlock()
	if first {
		s.log.Info("synced", "kind", kind, "objects", len(objs)-len(refused), "refused", len(refused))
	}
	if err != nil {
		return fmt.Errorf("replace %d %s objects: %w", len(objs), kind, err)
	}
	return nil
}

// noteRefused records the refusals of kind's full set, logging what is
// newly refused (or for another reason) and what no longer is.
func (s *Source) noteRefused(kind k8sobj.Kind, rs []agent.Refusal) {
	now := make(map[objKey]refusal, len(rs))
	for _, r := range rs {
		ref := refusal{reason: r.Err.Error()}
		for _, b := range r.By {
			if bk, ok := parseKey(b); ok {
				ref.by = append(ref.by, bk)
			}
		}
		if len(ref.by) < len(r.By) {
			ref.by = nil // unknown: any change to the kind
		}
		now[objKey{kind: kind, namespace: r.Object.Namespace(), name: r.Object.Name()}] = ref
	}
	s.mu.Lock()
	prev := s.refused[kind]
	s.refused[kind] = now
	s.mu.Unlock()
	for _, k := range slices.SortedFunc(maps.Keys(now), compareKeys) {
		if prev[k].reason != now[k].reason {
			s.log.Warn("object refused", "object", k, "reason", now[k].reason)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(prev), compareKeys) {
		if _, still := now[k]; !still {
			s.log.Info("object no longer refused", "object", k)
		}
	}
}

// settled drops k from the refused objects (it applied, or is gone).
func (s *Source) settled(k objKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.refused[k.kind][k]; ok {
		delete(s.refused[k.kind], k)
		s.log.Info("object no longer refused", "object", k)
	}
}

// maySettle returns the kinds with a refusal that a change to k may settle:
// k holds what a refused object claims, or the refusal does not say.
func (s *Source) maySettle(k objKey) []k8sobj.Kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []k8sobj.Kind
	for kind, m := range s.refused {
		for _, r := range m {
			if (r.by == nil && kind == k.kind) || slices.Contains(r.by, k) {
				out = append(out, kind)
				break
			}
		}
	}
	return out
}

// parseKey parses an Object.Key ("Kind/namespace/name").
func parseKey(key string) (objKey, bool) {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) != 3 {
		return objKey{}, false
	}
	kind, err := k8sobj.ParseKind(parts[0])
	if err != nil {
		return objKey{}, false
	}
	return objKey{kind: kind, namespace: parts[1], name: parts[2]}, true
}

// Refused returns the objects the agent refused ("Kind namespace/name")
// with the reason.
func (s *Source) Refused() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for _, m := range s.refused {
		for k, r := range m {
			out[k.String()] = r.reason
		}
	}
	return out
}

func compareKeys(a, b objKey) int { return strings.Compare(a.String(), b.String()) }

// work applies queued changes: present in the cache → upsert, gone →
// delete, all → the kind's full set. What is queued when the worker comes
// round is applied together (batch.go): one commit (one store transaction,
// one fsync) for a burst of upserts instead of one each. An object the
// agent refuses on its own (invalid, or clashing with another) makes the
// kind's full set decide: the agent refuses the same objects a restart
// would (the oldest of clashing objects wins) and counts them; the refused
// object is retried when it or what it clashes with changes. Other failures
// are retried with backoff.
func (s *Source) work(ctx context.Context) {
	for {
		k, quit := s.queue.Get()
		if quit {
			return
		}
		batch := s.moreQueued([]objKey{k})
		for i, err := range s.applyBatch(batch) {
			s.finish(batch[i], err)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// finish records the outcome of applying k and marks it done.
func (s *Source) finish(k objKey, err error) {
	switch {
	case err == nil:
		s.queue.Forget(k)
		if s.latency != nil {
			s.latency.applied(k, time.Now())
		}
		if s.capacity != nil { // any kind can change what fits (pods, namespaces: policy)
			s.capacity.poke()
		}
		if !k.all {
			s.settled(k)
		}
	case k.all && errors.Is(err, agent.ErrDatapathPending):
		// The agent took the full set and retries what the datapath
		// refused by itself: handing it the set again would rewrite
		// every object.
		s.queue.Forget(k)
	case !k.all && (errors.Is(err, errInvalid) || errors.Is(err, agent.ErrInvalid)):
		s.log.Debug("refused; the kind's full set decides", "object", k, "err", err)
		s.queue.Forget(k)
		s.queue.Add(objKey{kind: k.kind, all: true})
	default:
		if n := s.queue.NumRequeues(k); n%10 == 0 {
			s.log.Error("apply", "object", k, "attempt", n+1, "err", err)
		}
		s.queue.AddRateLimited(k)
	}
	s.queue.Done(k)
}

var errInvalid = errors.New("invalid object")

// cached is key k's object in its informer's cache.
func (s *Source) cached(k objKey) (any, bool, error) {
	key := k.name
	if k.namespace != "" {
		key = k.namespace + "/" + k.name
	}
	return s.kinds[k.kind].GetStore().GetByKey(key)
}

// apply applies one queued key: present in the cache → upsert, gone →
// delete, all → the kind's full set.
func (s *Source) apply(k objKey) error {
	inf := s.kinds[k.kind]
	if k.all {
		return s.replace(k.kind, inf)
	}
	o, exists, err := s.cached(k)
	if err != nil {
		return err
	}
	if !exists {
		return s.cfg.Objects.DeleteObject(k.kind, k.namespace, k.name)
	}
	obj, err := s.object(k.kind, o)
	if err != nil {
		// What the agent would refuse goes: an update that made a valid
		// object invalid must not leave the old version in force.
		if derr := s.cfg.Objects.DeleteObject(k.kind, k.namespace, k.name); derr != nil {
			return derr
		}
		return err
	}
	return s.cfg.Objects.UpsertObjects([]k8sobj.Object{obj})
}

// apiVersions by kind: informers hand out objects without TypeMeta.
var typeMeta = map[k8sobj.Kind]metav1.TypeMeta{
	k8sobj.KindNamespace:     {APIVersion: "v1", Kind: "Namespace"},
	k8sobj.KindPod:           {APIVersion: "v1", Kind: "Pod"},
	k8sobj.KindService:       {APIVersion: "v1", Kind: "Service"},
	k8sobj.KindEndpointSlice: {APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
	k8sobj.KindNetworkPolicy: {APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
}

// toObject wraps an informer object and validates it like the agent does
// for files. The cache's object itself, not a copy (the agent would hold a
// second copy of every object): the transform (slim.go) gave it its
// TypeMeta, and neither the cache nor the agent changes it. An object
// without TypeMeta (not from the transform) is wrapped in a shallow copy
// that has it.
func toObject(kind k8sobj.Kind, o any) (k8sobj.Object, error) {
	obj := k8sobj.Object{Kind: kind}
	var is k8sobj.Kind
	switch v := o.(type) {
	case *corev1.Namespace:
		is, obj.NamespaceObj = k8sobj.KindNamespace, typed(v, k8sobj.KindNamespace)
	case *k8sobj.Pod:
		is, obj.Pod = k8sobj.KindPod, v
	case *corev1.Pod: // not from the transform
		is, obj.Pod = k8sobj.KindPod, slimPod(v)
	case *k8sobj.Service:
		is, obj.Service = k8sobj.KindService, v
	case *corev1.Service: // not from the transform
		is, obj.Service = k8sobj.KindService, k8sobj.SlimService(v)
	case *k8sobj.EndpointSlice:
		is, obj.EndpointSlice = k8sobj.KindEndpointSlice, v
	case *discoveryv1.EndpointSlice: // not from the transform
		is, obj.EndpointSlice = k8sobj.KindEndpointSlice, k8sobj.SlimEndpointSlice(v)
	case *networkingv1.NetworkPolicy:
		is, obj.NetworkPolicy = k8sobj.KindNetworkPolicy, typed(v, k8sobj.KindNetworkPolicy)
	default:
		return obj, fmt.Errorf("%s: unexpected %T", kind, o)
	}
	if is != kind {
		return obj, fmt.Errorf("%s: got a %s", kind, is)
	}
	if err := k8sobj.Check(obj); err != nil {
		return obj, fmt.Errorf("%s: %w: %w", obj, err, errInvalid)
	}
	return obj, nil
}

// typed is v if it carries kind's TypeMeta, else a shallow copy that does.
func typed[T any, P interface {
	*T
	runtime.Object
}](v P, kind k8sobj.Kind) P {
	tm := typeMeta[kind]
	gvk := tm.GroupVersionKind()
	if v.GetObjectKind().GroupVersionKind() == gvk {
		return v
	}
	c := *v
	p := P(&c)
	p.GetObjectKind().SetGroupVersionKind(gvk)
	return p
}

// WaitPodCIDR returns node's IPv4 spec.podCIDR(s), or on an IPv6-only node
// (spec.podCIDRs has only IPv6) its IPv6 one, waiting until it is set (the
// node IPAM controller assigns them all at once after the Node registers).
func WaitPodCIDR(ctx context.Context, client kubernetes.Interface, node string, log *slog.Logger) (string, error) {
	var lastErr error
	logged := time.Time{}
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		switch {
		case err == nil:
			if cidr := nodePodCIDRv4(n); cidr != "" {
				return cidr, nil
			}
			if n.Spec.PodCIDR != "" { // set, and no IPv4 one: an IPv6-only node
				return n.Spec.PodCIDR, nil
			}
			lastErr = fmt.Errorf("node %s has no spec.podCIDR yet", node)
		case apierrors.IsNotFound(err):
			lastErr = fmt.Errorf("node %s is not registered yet", node)
		default:
			lastErr = fmt.Errorf("get node %s: %w", node, err)
		}
		if time.Since(logged) > 10*time.Second {
			log.Info("waiting for this node's pod CIDR", "node", node, "reason", lastErr)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(time.Second):
		}
	}
}

// nodePodCIDRv4 is a Node's IPv4 pod CIDR (spec.podCIDRs, else spec.podCIDR).
func nodePodCIDRv4(n *corev1.Node) string {
	for _, c := range append(slicesClone(n.Spec.PodCIDRs), n.Spec.PodCIDR) {
		if c != "" && !strings.Contains(c, ":") {
			return c
		}
	}
	return ""
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }
