package lbipam

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// LabelL2Member marks the per-node Leases of the L2 announcers.
const LabelL2Member = "lanekit.io/l2-announcer"

// Announce is where a node's announcements go: the responder on its
// uplink. Set replaces the set of addresses answered for; addresses new to
// the set are announced at once (gratuitous ARP, unsolicited NA).
type Announce interface {
	Set(addrs []netip.Addr) error
}

// L2Config configures the L2 announcer.
type L2Config struct {
	Client    kubernetes.Interface
	Node      string
	Namespace string // of the per-node Leases and the pools ConfigMap
	// PoolsConfigMap is the pools ConfigMap (default DefaultPoolsConfigMap):
	// only its addresses are ever answered for.
	PoolsConfigMap string
	// LeaseDuration is how long a node's Lease counts after its last renewal
	// (default 3 s); the node renews every LeaseDuration/3.
	LeaseDuration time.Duration
	Announce      Announce
	Log           *slog.Logger
}

// L2 elects one node per LoadBalancer Service lanekit assigned and has
// this node's responder answer for the Services it won. Each agent holds a
// Lease of its own ("lanekit-l2-<node>"), renewed every third of its
// duration; the live nodes are those whose Lease this agent saw renewed
// within the duration (its own clock: no clock sync needed). A Service's
// node is the highest rendezvous hash of (node, Service) among the live
// nodes — with externalTrafficPolicy Local, among those with the most
// ready local endpoints (mostLocal) — so every agent computes the same
// answer, and only the Services of a node that stops move.
//
// A node answers only for addresses of the pools the cluster admin wrote
// (the pools ConfigMap): a Service's status, which anyone allowed to write
// services/status can fill, never makes it claim an underlay address
// outside them (the gateway's, another host's). A malformed ConfigMap
// keeps the last pools read; none (deleted) answers for nothing.
type L2 struct {
	cfg   L2Config
	pools poolsSeen
	mu    sync.Mutex
	seen  map[string]seenLease // node -> last renewal observed
	kick  chan struct{}
	renew time.Duration
	// ownOK is when this node last renewed its own Lease.
	ownOK time.Time
}

type seenLease struct {
	renew string    // renewTime as written
	at    time.Time // when this agent saw it change
	dur   time.Duration
}

// NewL2 checks cfg and fills its defaults.
func NewL2(cfg L2Config) (*L2, error) {
	if cfg.Client == nil || cfg.Node == "" || cfg.Namespace == "" || cfg.Announce == nil {
		return nil, errors.New("lbipam: L2 needs a client, node, namespace and responder")
	}
	if cfg.PoolsConfigMap == "" {
		cfg.PoolsConfigMap = DefaultPoolsConfigMap
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 3 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &L2{cfg: cfg, seen: map[string]seenLease{}, kick: make(chan struct{}, 1), renew: cfg.LeaseDuration / 3}, nil
}

func (l *L2) leaseName() string { return "lanekit-l2-" + l.cfg.Node }

// Run heartbeats, watches and announces until ctx ends; then it stops
// answering and deletes its Lease, so the other nodes take over at once.
func (l *L2) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(l.cfg.Client, 0)
	lf := informers.NewSharedInformerFactoryWithOptions(l.cfg.Client, 0, informers.WithNamespace(l.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelL2Member + "=true" }))
	cmf := poolsInformers(l.cfg.Client, l.cfg.Namespace, l.cfg.PoolsConfigMap)
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { l.poke() }, UpdateFunc: func(any, any) { l.poke() }, DeleteFunc: func(any) { l.poke() },
	}
	svcs, slices, leases := f.Core().V1().Services(), f.Discovery().V1().EndpointSlices(), lf.Coordination().V1().Leases()
	cms := cmf.Core().V1().ConfigMaps()
	for _, inf := range []cache.SharedIndexInformer{svcs.Informer(), slices.Informer(), leases.Informer(), cms.Informer()} {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return err
		}
	}
	for _, fac := range []informers.SharedInformerFactory{f, lf, cmf} {
		fac.Start(ctx.Done())
		defer fac.Shutdown()
	}
	defer l.stop()
	for _, fac := range []informers.SharedInformerFactory{f, lf, cmf} {
		fac.WaitForCacheSync(ctx.Done())
	}

	hb := time.NewTicker(l.renew)
	defer hb.Stop()
	tick := time.NewTicker(l.renew / 2) // leases expire without an event
	defer tick.Stop()
	l.heartbeat(ctx)
	for {
		ll, _ := leases.Lister().Leases(l.cfg.Namespace).List(labels.Everything())
		sl, _ := svcs.Lister().List(labels.Everything())
		el, _ := slices.Lister().List(labels.Everything())
		cm, err := cms.Lister().ConfigMaps(l.cfg.Namespace).Get(l.cfg.PoolsConfigMap)
		if err != nil && !apierrors.IsNotFound(err) {
			l.cfg.Log.Warn("l2: pools ConfigMap", "err", err)
		}
		if err := l.pools.update(cm, l.cfg.Log); err != nil {
			l.cfg.Log.Warn("l2: pools ConfigMap malformed; answering for the last pools read", "err", err)
		}
		if err := l.cfg.Announce.Set(l.announce(time.Now(), ll, sl, el)); err != nil {
			l.cfg.Log.Warn("l2: set announced addresses", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-hb.C:
			l.heartbeat(ctx)
		case <-tick.C:
		case <-l.kick:
		}
	}
}

func (l *L2) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// heartbeat creates or renews this node's Lease.
func (l *L2) heartbeat(ctx context.Context) {
	c := l.cfg.Client.CoordinationV1().Leases(l.cfg.Namespace)
	now := metav1.NewMicroTime(time.Now())
	secs := int32((l.cfg.LeaseDuration + time.Second - 1) / time.Second)
	ctx, cancel := context.WithTimeout(ctx, l.renew)
	defer cancel()
	le, err := c.Get(ctx, l.leaseName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		le = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.leaseName(), Namespace: l.cfg.Namespace,
			Labels: map[string]string{LabelL2Member: "true"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(l.cfg.Node), LeaseDurationSeconds: &secs, RenewTime: &now, AcquireTime: &now}}
		_, err = c.Create(ctx, le, metav1.CreateOptions{})
	case err == nil:
		le.Spec.HolderIdentity, le.Spec.LeaseDurationSeconds, le.Spec.RenewTime = ptr.To(l.cfg.Node), &secs, &now
		_, err = c.Update(ctx, le, metav1.UpdateOptions{})
	}
	if err != nil {
		l.cfg.Log.Warn("l2: renew lease", "lease", l.leaseName(), "err", err)
		return
	}
	l.mu.Lock()
	l.ownOK = time.Now()
	l.mu.Unlock()
}

// stop answers for nothing and deletes this node's Lease.
func (l *L2) stop() {
	_ = l.cfg.Announce.Set(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := l.cfg.Client.CoordinationV1().Leases(l.cfg.Namespace).Delete(ctx, l.leaseName(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		l.cfg.Log.Warn("l2: delete lease", "lease", l.leaseName(), "err", err)
	}
}

// live are the nodes whose Lease this agent saw renewed within its
// duration. This node counts only while its own renewals succeed: cut off
// from the API server, it stops answering as the others take over.
func (l *L2) live(now time.Time, leases []*coordinationv1.Lease) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	present := map[string]bool{}
	for _, le := range leases {
		node := strings.TrimPrefix(le.Name, "lanekit-l2-")
		if le.Spec.HolderIdentity == nil || *le.Spec.HolderIdentity != node || le.Spec.RenewTime == nil {
			continue
		}
		present[node] = true
		dur := l.cfg.LeaseDuration
		if le.Spec.LeaseDurationSeconds != nil {
			dur = time.Duration(*le.Spec.LeaseDurationSeconds) * time.Second
		}
		r := le.Spec.RenewTime.Format(time.RFC3339Nano)
		s, ok := l.seen[node]
		if !ok || s.renew != r {
			s = seenLease{renew: r, at: now}
		}
		s.dur = dur
		l.seen[node] = s
		alive := now.Sub(s.at) < dur
		if node == l.cfg.Node {
			alive = now.Sub(l.ownOK) < l.cfg.LeaseDuration
		}
		if alive {
			out = append(out, node)
		}
	}
	for n := range l.seen {
		if !present[n] {
			delete(l.seen, n)
		}
	}
	return out
}

// announce is the set of addresses this node answers for now.
func (l *L2) announce(now time.Time, leases []*coordinationv1.Lease, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) []netip.Addr {
	live := l.live(now, leases)
	if !slices.Contains(live, l.cfg.Node) {
		return nil
	}
	local := localNodes(eps)
	var out []netip.Addr
	for _, svc := range svcs {
		if !Ours(svc) || !Assigned(svc) || svc.DeletionTimestamp != nil {
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		cands := live
		if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			cands = mostLocal(live, local[key])
		}
		if Elect(key, cands) == l.cfg.Node {
			for _, a := range IngressAddrs(svc) {
				if l.pools.contain(a) {
					out = append(out, a)
				} else {
					l.pools.outside(key, a, l.cfg.Log)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// poolsSeen is what the announcer knows of the pools ConfigMap.
type poolsSeen struct {
	version string // resourceVersion last parsed ("": none)
	pools   []*Pool
	warned  map[string]bool // "svc addr" already logged as outside
}

// update takes the ConfigMap as it is now (nil: none). A malformed one
// keeps the last pools read (as the IPAM keeps its assignments) and is
// reported once per version.
func (p *poolsSeen) update(cm *corev1.ConfigMap, log *slog.Logger) error {
	if cm == nil {
		if p.version != "" {
			log.Info("l2: no pools ConfigMap; answering for nothing")
		}
		p.version, p.pools = "", nil
		return nil
	}
	if cm.ResourceVersion == p.version {
		return nil
	}
	p.version, p.warned = cm.ResourceVersion, nil
	pools, err := ParsePools(cm.Data[PoolsKey])
	if err != nil {
		return err
	}
	p.pools = pools
	return nil
}

func (p *poolsSeen) contain(a netip.Addr) bool {
	return slices.ContainsFunc(p.pools, func(pl *Pool) bool { return pl.Contains(a) })
}

// outside logs, once, an address in a Service's status that no pool holds.
func (p *poolsSeen) outside(svc string, a netip.Addr, log *slog.Logger) {
	k := svc + " " + a.String()
	if p.warned[k] {
		return
	}
	if p.warned == nil {
		p.warned = map[string]bool{}
	}
	p.warned[k] = true
	log.Warn("l2: not answering for an address of no pool", "service", svc, "addr", a)
}

// Elect is the node that announces the Service key: the highest
// rendezvous hash among nodes ("" for none).
func Elect(key string, nodes []string) string {
	var best string
	var bestH uint64
	for _, n := range nodes {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s\x00%s", n, key)
		if v := mix64(h.Sum64()); best == "" || v > bestH || (v == bestH && n < best) {
			best, bestH = n, v
		}
	}
	return best
}

// mix64 is splitmix64's finalizer: FNV alone barely spreads names that
// differ in one character (node-1, node-2) over its high bits, which decide
// the comparison.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// mostLocal are the live nodes with the most ready local endpoints (none
// without one). All of an L2-announced eTP Local Service's traffic lands on
// its one announcer, so the node with the most endpoints spreads it over
// the most pods; nodes with equal counts tie and the hash decides, as for
// eTP Cluster (a DaemonSet's Services never move for a count).
func mostLocal(live []string, count map[string]int) []string {
	best := 0
	for _, n := range live {
		best = max(best, count[n])
	}
	if best == 0 {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(live), func(n string) bool { return count[n] < best })
}

// localNodes maps a Service key to its ready endpoints per node.
func localNodes(eps []*discoveryv1.EndpointSlice) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, s := range eps {
		svc := s.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		key := s.Namespace + "/" + svc
		for _, e := range s.Endpoints {
			if e.NodeName == nil || (e.Conditions.Ready != nil && !*e.Conditions.Ready) {
				continue
			}
			if out[key] == nil {
				out[key] = map[string]int{}
			}
			out[key][*e.NodeName]++
		}
	}
	return out
}
