package lbipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// IPAMConfig configures the IPAM controller.
type IPAMConfig struct {
	Client    kubernetes.Interface
	Identity  string // the leader candidate: the node name
	Namespace string // of the Lease and the pools ConfigMap
	ConfigMap string // default DefaultPoolsConfigMap
	// LeaseName is the leader Lease (default "lanekit-lb-ipam").
	LeaseName string
	// LeaseDuration, RenewDeadline, RetryPeriod: leader election timing
	// (defaults 15 s, 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       *slog.Logger
}

// IPAM assigns pool addresses to LoadBalancer Services while its agent
// is the leader; every agent runs one, one writes.
type IPAM struct {
	cfg      IPAMConfig
	recorder record.EventRecorder
	bcast    record.EventBroadcaster
}

// NewIPAM checks cfg and fills its defaults.
func NewIPAM(cfg IPAMConfig) (*IPAM, error) {
	if cfg.Client == nil || cfg.Identity == "" || cfg.Namespace == "" {
		return nil, errors.New("lbipam: client, identity and namespace are required")
	}
	if cfg.ConfigMap == "" {
		cfg.ConfigMap = DefaultPoolsConfigMap
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = "lanekit-lb-ipam"
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	b := record.NewBroadcaster(record.WithContext(context.Background()))
	return &IPAM{cfg: cfg, bcast: b,
		recorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lanekit-lb-ipam", Host: cfg.Identity})}, nil
}

// Run campaigns for the leader Lease until ctx ends, assigning addresses
// while it leads; it stands again after losing the lease.
func (m *IPAM) Run(ctx context.Context) error {
	m.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: m.cfg.Client.CoreV1().Events("")})
	defer m.bcast.Shutdown()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: m.cfg.Namespace, Name: m.cfg.LeaseName},
		Client:     m.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: m.cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: m.cfg.LeaseDuration, RenewDeadline: m.cfg.RenewDeadline,
			RetryPeriod: m.cfg.RetryPeriod, ReleaseOnCancel: true, Name: m.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					m.cfg.Log.Info("lb-ipam: leading", "lease", m.cfg.Namespace+"/"+m.cfg.LeaseName)
					if err := m.lead(ctx); err != nil && ctx.Err() == nil {
						m.cfg.Log.Error("lb-ipam: stopped", "err", err)
					}
				},
				OnStoppedLeading: func() { m.cfg.Log.Info("lb-ipam: not leading") },
			},
		})
		if err != nil {
			return fmt.Errorf("lb-ipam leader election: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}

// lead watches Services, Namespaces and the pools ConfigMap and
// reconciles all Services on every change (one key: the plan is computed
// from the whole set, so a restarted leader rebuilds it from the Services'
// status alone).
func (m *IPAM) lead(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(m.cfg.Client, 0)
	cmf := poolsInformers(m.cfg.Client, m.cfg.Namespace, m.cfg.ConfigMap)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { q.Add("all") },
		UpdateFunc: func(any, any) { q.Add("all") },
		DeleteFunc: func(any) { q.Add("all") },
	}
	svcs, nss, cms := f.Core().V1().Services(), f.Core().V1().Namespaces(), cmf.Core().V1().ConfigMaps()
	for _, inf := range []cache.SharedIndexInformer{svcs.Informer(), nss.Informer(), cms.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	f.Start(ctx.Done())
	cmf.Start(ctx.Done())
	defer f.Shutdown()
	defer cmf.Shutdown()
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("lb-ipam: %v cache not synced", typ)
		}
	}
	cmf.WaitForCacheSync(ctx.Done())
	go func() { <-ctx.Done(); q.ShutDown() }()
	q.Add("all")
	for {
		k, quit := q.Get()
		if quit {
			return nil
		}
		if err := m.reconcile(ctx, svcs.Lister(), nss.Lister(), cms.Lister()); err != nil {
			// A conflict is the informer a write behind: retried, not news.
			lvl := slog.LevelWarn
			if apierrors.IsConflict(err) {
				lvl = slog.LevelDebug
			}
			m.cfg.Log.Log(ctx, lvl, "lb-ipam: reconcile", "err", err)
			q.AddRateLimited(k)
		} else {
			q.Forget(k)
		}
		q.Done(k)
	}
}

// reconcile plans every Service and writes the statuses that differ.
func (m *IPAM) reconcile(ctx context.Context, sl listerscorev1.ServiceLister, nl listerscorev1.NamespaceLister, cl listerscorev1.ConfigMapLister) error {
	all, err := sl.List(labels.Everything())
	if err != nil {
		return err
	}
	if err := m.releaseDeleted(ctx, all); err != nil {
		return err
	}
	pools, found, err := m.pools(cl)
	if err != nil {
		// Keep every assignment as it is: a typo must not release addresses.
		return err
	}
	if !found {
		// No pools ConfigMap (not yet created, or deleted by mistake): touch
		// nothing. An empty pool list releases every address on purpose.
		m.cfg.Log.Info("lb-ipam: no pools ConfigMap; assigning and releasing nothing", "configmap", m.cfg.Namespace+"/"+m.cfg.ConfigMap)
		return nil
	}
	var errs []error
	var wants []Want
	bad := map[string]*Error{}
	byKey := map[string]*corev1.Service{}
	for _, svc := range all {
		if !Ours(svc) || svc.DeletionTimestamp != nil {
			continue
		}
		var nsLabels map[string]string
		if ns, err := nl.Get(svc.Namespace); err == nil {
			nsLabels = ns.Labels
		}
		w, werr := wantOf(svc, nsLabels)
		byKey[w.Key] = svc
		if werr != nil {
			bad[w.Key] = werr
			continue
		}
		wants = append(wants, w)
	}
	plan := Plan(pools, wants)
	for k, e := range bad {
		plan[k] = Result{Err: e}
	}
	for k, r := range plan {
		svc := byKey[k]
		if st, changed := desiredStatus(svc, r); changed {
			out, err := m.writeStatus(ctx, svc, st)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if r.Err != nil {
				m.recorder.Event(svc, corev1.EventTypeWarning, r.Err.Reason, r.Err.Msg)
			} else {
				m.recorder.Eventf(svc, corev1.EventTypeNormal, ReasonAssigned, "assigned LoadBalancer address %s", joinAddrs(r.Addrs))
			}
			svc = out
		}
		// After the condition: a Service carries the finalizer only once
		// the condition marks it lanekit's (the server clears the ingress
		// list, not the condition, when the type changes).
		if _, err := m.setFinalizer(ctx, svc, true); err != nil {
			errs = append(errs, err)
		}
	}
	// Services lanekit served that are no longer LoadBalancer (or lanekit's):
	// the finalizer, then the addresses and condition (a failed release is
	// retried: the condition still says whose it was).
	for _, svc := range all {
		if Ours(svc) || svc.DeletionTimestamp != nil || !Assigned(svc) {
			continue
		}
		svc, err := m.setFinalizer(ctx, svc, false)
		if err == nil {
			_, err = m.writeStatus(ctx, svc, releasedStatus(svc))
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.recorder.Event(svc, corev1.EventTypeNormal, "Released", "released LoadBalancer addresses "+joinAddrs(IngressAddrs(svc)))
	}
	return errors.Join(errs...)
}

// Finalizer is the cleanup finalizer of Kubernetes' service controller,
// which load-balancer implementations put on the Services they serve: a
// Service lanekit assigned (its condition present) is not gone before
// lanekit has seen its deletion, so its address leaves the plan by that
// pass, not by a missed event. Removed when the Service is deleted or
// stops being lanekit's; never touched on Services another controller
// serves.
const Finalizer = "service.kubernetes.io/load-balancer-cleanup"

// releaseDeleted lets Services being deleted go: they left the plan, so
// their addresses are free whatever the pools say.
func (m *IPAM) releaseDeleted(ctx context.Context, all []*corev1.Service) error {
	var errs []error
	for _, svc := range all {
		if svc.DeletionTimestamp == nil || !slices.Contains(svc.Finalizers, Finalizer) || (!Ours(svc) && !Assigned(svc)) {
			continue
		}
		if _, err := m.setFinalizer(ctx, svc, false); err != nil {
			errs = append(errs, err)
			continue
		}
		if Assigned(svc) {
			m.recorder.Event(svc, corev1.EventTypeNormal, "Released", "released LoadBalancer addresses "+joinAddrs(IngressAddrs(svc))+" of a deleted Service")
		}
	}
	return errors.Join(errs...)
}

// setFinalizer adds or removes Finalizer on svc (a merge patch guarded by
// its resourceVersion) and returns the Service as the server has it.
func (m *IPAM) setFinalizer(ctx context.Context, svc *corev1.Service, want bool) (*corev1.Service, error) {
	if slices.Contains(svc.Finalizers, Finalizer) == want {
		return svc, nil
	}
	fin := slices.DeleteFunc(slices.Clone(svc.Finalizers), func(f string) bool { return f == Finalizer })
	if want {
		fin = append(fin, Finalizer)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": svc.ResourceVersion, "finalizers": fin}})
	if err != nil {
		return nil, err
	}
	out, err := m.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: "lanekit-lb-ipam"})
	if apierrors.IsNotFound(err) {
		return svc, nil
	}
	if err != nil {
		return nil, fmt.Errorf("finalizer of service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// writeStatus writes st and returns the Service as the server has it.
func (m *IPAM) writeStatus(ctx context.Context, svc *corev1.Service, st corev1.ServiceStatus) (*corev1.Service, error) {
	c := svc.DeepCopy()
	c.Status = st
	out, err := m.cfg.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{FieldManager: "lanekit-lb-ipam"})
	if apierrors.IsNotFound(err) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("update status of service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// pools parses the pools ConfigMap: found false without one, an error
// (and an event on it) when it is malformed.
func (m *IPAM) pools(cl listerscorev1.ConfigMapLister) (pools []*Pool, found bool, err error) {
	cm, err := cl.ConfigMaps(m.cfg.Namespace).Get(m.cfg.ConfigMap)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if pools, err = ParsePools(cm.Data[PoolsKey]); err != nil {
		m.recorder.Event(cm, corev1.EventTypeWarning, "InvalidPools", err.Error())
		return nil, true, fmt.Errorf("configmap %s/%s key %s: %w", cm.Namespace, cm.Name, PoolsKey, err)
	}
	return pools, true, nil
}

// poolsInformers is an informer factory that watches only the pools
// ConfigMap ns/name (the IPAM leader's and each L2 announcer's view of it).
func poolsInformers(c kubernetes.Interface, ns, name string) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
}
