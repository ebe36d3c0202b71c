package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
	"github.com/lanekit/lanekit/pkg/store"
)

// DefaultMaintenanceInterval is how often the agent collects expired
// conntrack entries and retries datapath updates that failed.
const DefaultMaintenanceInterval = 30 * time.Second

func (a *Agent) serviceDP() datapath.ServiceDatapath {
	sd, _ := a.dp.(datapath.ServiceDatapath)
	return sd
}

func (a *Agent) policyDP() datapath.PolicyDatapath {
	pd, _ := a.dp.(datapath.PolicyDatapath)
	return pd
}

// applyServices programs u after the updates the datapath refused before,
// which are queued (svcRetry) for the maintenance loop and the next call. An
// update the datapath refuses is halved by frontend until the refused
// frontends are found alone (applyFinding): every other frontend is
// programmed, and only the refused parts stay queued, each retried alone. A
// later update's part for a frontend (or a service key) a queued part holds
// waits behind it; the rest of it is applied. The error is about u (a part
// of it refused or waiting), or with u nil (the maintenance loop's retry)
// about the queue. Called with ctl.mu.
func (a *Agent) applyServices(u *service.Update) error {
	c := a.ctl
	sd := a.serviceDP()
	if sd == nil {
		return nil // nothing to program; status reports it
	}
	if u != nil && u.Ops() == 0 {
		u = nil
	}
	if u != nil {
		c.svcRetry = append(c.svcRetry, u)
	}
	if len(c.svcRetry) == 0 {
		return nil
	}
	apply := func(u *service.Update) error {
		var err error
		a.host.Do(func() error { err = sd.ApplyServices(u); return nil })
		return err
	}
	queue := c.svcRetry
	c.svcRetry = nil
	// Parts already queued are retried whole; new refusals are searched
	// for while the queue has room (a datapath that refuses everything
	// does not split the queue any further).
	budget := maxQueuedServiceParts - len(queue)
	var held service.Held
	var queued, errU error
	for i, q := range queue {
		queue[i] = nil // the queue's array must not keep an applied update alive (dropFirst)
		isU := u != nil && i == len(queue)-1
		wait, free := held.Split(q)
		if wait != nil {
			c.svcRetry = append(c.svcRetry, wait)
			held.Add(wait)
			if isU {
				errU = fmt.Errorf("behind a refused update of the same frontends: %w", cmp.Or(queued, errRefusedBefore))
			}
		}
		if free == nil {
			continue
		}
		refused, err := applyFinding(apply, free, &budget)
		for _, r := range refused {
			c.svcRetry = append(c.svcRetry, r)
			held.Add(r)
		}
		switch {
		case err == nil:
		case isU:
			errU = cmp.Or(errU, err)
		case queued == nil:
			queued = err
		}
	}
	if u == nil {
		errU = queued
	}
	if errU != nil {
		return fmt.Errorf("apply services (%d parts queued): %w", len(c.svcRetry), errU)
	}
	return nil
}

var errRefusedBefore = errors.New("refused before")

// maxQueuedServiceParts bounds how many refused parts applyFinding splits
// the queued service updates into.
const maxQueuedServiceParts = 32

// applyFinding applies u; when the datapath refuses it, it halves u by
// frontend and applies each half the same way, until the refused frontends
// are found alone: everything else in u is programmed. It returns the
// refused parts (in frontend order) and the datapath's first error. Each
// refused part takes one of *budget; with none left, a refused part is
// kept whole.
func applyFinding(apply func(*service.Update) error, u *service.Update, budget *int) ([]*service.Update, error) {
	err := apply(u)
	if err == nil {
		return nil, nil
	}
	ids, ok := u.Frontends()
	if !ok || len(ids) < 2 || *budget <= 0 {
		*budget--
		return []*service.Update{u}, err
	}
	mid := ids[len(ids)/2]
	var refused []*service.Update
	var first error
	for _, half := range []*service.Update{u.Part(func(id uint32) bool { return id < mid }), u.Part(func(id uint32) bool { return id >= mid })} {
		r, err := applyFinding(apply, half, budget)
		refused = append(refused, r...)
		if first == nil {
			first = err
		}
	}
	return refused, first
}

// dropFirst removes q's first element, letting go of it: the queue's array
// must not keep an applied update (a full set's Maglev tables and backends)
// alive.
func dropFirst[T any](q []*T) []*T {
	q[0] = nil
	if len(q) == 1 {
		return nil
	}
	return q[1:]
}

// applyPolicy is applyServices for policy updates.
func (a *Agent) applyPolicy(u *policy.Update) error {
	c := a.ctl
	pd := a.policyDP()
	if pd == nil {
		return nil
	}
	if u != nil && u.Ops() > 0 {
		c.polRetry = append(c.polRetry, u)
	}
	for len(c.polRetry) > 0 {
		var err error
		a.host.Do(func() error { err = pd.ApplyPolicy(c.polRetry[0]); return nil })
		if err != nil {
			return fmt.Errorf("apply policy: %w", err)
		}
		c.polRetry = dropFirst(c.polRetry)
	}
	return a.syncTunnelIdentities()
}

// endpointsChanged recompiles policy after this node's endpoints changed
// (CNI ADD/DEL, VMs, GC): a new pod needs its identity in the ipcache and its
// default-deny state before it sends.
func (a *Agent) endpointsChanged() {
	c := a.ctl
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := a.recompileLocked(); err != nil {
		a.log.Error("recompile policy after endpoint change", "err", err)
	}
}

func (a *Agent) recompileLocked() error {
	c := a.ctl
	compiled, locals, err := a.compilePolicy(c.objs)
	if err != nil {
		return err
	}
	if err := a.st.Update(c.saveIdentitiesTx); err != nil {
		return fmt.Errorf("store identities: %w", err)
	}
	c.markIdentitiesSaved()
	u := policy.Diff(c.compiled, compiled)
	old := c.locals
	c.compiled, c.locals = compiled, locals
	return errors.Join(a.applyPolicy(u), a.applyBandwidth(old, locals))
}

// policyDumper is a datapath that can say what its policy maps hold
// (*datapath.Loader's DumpPolicy).
type policyDumper interface {
	DumpPolicy() (*policy.Compiled, error)
}

// nodeAddrs returns the addresses NodePort frontends listen on: the
// configured ones, else the uplink's global addresses of both families.
func (a *Agent) nodeAddrs() ([]netip.Addr, error) {
	if len(a.cfg.NodeAddrs) > 0 || a.cfg.Uplink == "" {
		return a.cfg.NodeAddrs, nil
	}
	var out []netip.Addr
	err := a.host.Do(func() error {
		link, err := netlink.LinkByName(a.cfg.Uplink)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", a.cfg.Uplink, err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("addresses of %s: %w", a.cfg.Uplink, err)
		}
		for _, ad := range addrs {
			if ip, ok := netip.AddrFromSlice(ad.IP); ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
		return nil
	})
	slices.SortFunc(out, netip.Addr.Compare)
	return out, err
}

// restoreControlPlane creates the control plane and restores it (tests;
// the agent restores in the background: restore.go).
func (a *Agent) restoreControlPlane() error {
	c := a.newControlPlane()
	c.mu.Lock()
	defer c.mu.Unlock()
	return a.restoreLocked()
}

// newControlPlane creates a.ctl, empty, with the node's addresses and the
// maps' sizes.
func (a *Agent) newControlPlane() *ctlPlane {
	addrs, err := a.nodeAddrs()
	if err != nil {
		a.log.Warn("no node addresses for NodePort services", "err", err)
	}
	// The node's own addresses (hostaddrs.go): the hostIPs a hostPort may
	// name; SyncHostAddrs keeps them current.
	hostAddrs, err := a.listHostAddrs()
	if err != nil {
		a.log.Warn("no node addresses for hostPorts with a hostIP", "err", err)
	}
	opts := service.Options{NodeAddrs: addrs, NodeName: a.cfg.NodeName, Zone: a.cfg.Zone, HostAddrs: hostAddrs, ExternalIPs: a.cfg.ExternalIPs}
	if a.cfg.PodCIDR.IsValid() {
		opts.LocalPrefixes = []netip.Prefix{a.cfg.PodCIDR.Masked()}
	}
	if a.cfg.PodCIDR6.IsValid() { // IPv6 Services' traffic policy Local
		opts.LocalPrefixes = append(opts.LocalPrefixes, a.cfg.PodCIDR6.Masked())
	}
	a.ctl = newCtlPlane(opts)
	fronts, backs := datapath.Config{LBFrontends: a.cfg.LBFrontends, LBBackends: a.cfg.LBBackends}.LBSizes()
	a.ctl.tables.SetCapacity(service.Capacity{Frontends: fronts, Backends: backs})
	a.ctl.policySizes = datapath.Config{PolicyMaps: a.cfg.PolicyMaps}.PolicySizes()
	a.ctl.log = a.log
	return a.ctl
}

// restoreLocked runs at start-up after the endpoints are re-adopted: it
// loads the stored objects and identities, re-adopts the service IDs the
// pinned maps hold (so established flows keep their backends), removes what
// the stored objects no longer have, and programs policy. Called with
// ctl.mu.
func (a *Agent) restoreLocked() error {
	c := a.ctl
	if err := a.restoreIdentities(); err != nil {
		return err
	}
	var bad []string
	err := a.st.View(func(tx *store.Tx) error {
		return tx.ForEach(store.Objects, func(k []byte, raw json.RawMessage) error {
			// One JSON object as commit wrote it: no YAML step (most of
			// a restart's time at scale went there). DecodeJSON validates:
			// what this build would refuse is dropped here (policyInput
			// relies on it).
			o, err := k8sobj.DecodeJSON(raw)
			if err != nil || o.Key() != string(k) {
				a.log.Error("dropping stored object that no longer decodes", "key", string(k), "err", err)
				bad = append(bad, string(k))
				return nil
			}
			if a.cfg.RestoreObject != nil {
				a.cfg.RestoreObject(&o)
			}
			c.objs[string(k)] = o
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("restore objects: %w", err)
	}
	if len(bad) > 0 {
		if err := a.st.Update(func(tx *store.Tx) error {
			for _, k := range bad {
				if err := tx.Delete(store.Objects, []byte(k)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("restore objects: %w", err)
		}
	}
	// Services: the model from the stored objects; a service that no longer
	// translates (it cannot: it was accepted) is dropped from the model.
	c.slices = newSliceIndex(c.objs)
	model, err := c.buildModel(c.objs)
	if err != nil {
		svcs, _, _ := k8sobj.Split(sortedObjects(c.objs))
		a.log.Error("stored services do not translate; adding them one by one", "err", err)
		model = service.NewModel(c.svcOpts)
		slicesOf := splitSlices(c.objs)
		for _, s := range svcs {
			id := service.ServiceID{Namespace: s.Namespace, Name: s.Name}
			if m, err := model.With(s, slicesOf[id]); err == nil {
				model = m
			} else {
				a.log.Error("service left out", "service", id, "err", err)
			}
		}
	}
	changes := service.Diff(nil, model)
	if sd := a.serviceDP(); sd != nil {
		var dump *service.Update
		a.host.Do(func() error { dump, err = sd.DumpServices(); return nil })
		if err != nil {
			return fmt.Errorf("restore services: dump datapath: %w", err)
		}
		adopted, repair := c.tables.Adopt(dump)
		for _, k := range adopted {
			if model.Frontend(k) == nil {
				changes.Removed = append(changes.Removed, k)
			}
		}
		if err := a.applyServices(repair); err != nil {
			return err
		}
		a.log.Info("re-adopted services from the datapath", "frontends", len(adopted), "stale", len(changes.Removed))
	}
	c.model = model
	if err := a.applyServices(c.tables.Apply(changes)); err != nil {
		return err
	}
	// Policy: diff the first compilation against what the pinned maps hold
	// (when the datapath can tell), so entries of endpoints or policies that
	// went away while the agent was down are deleted, not left behind.
	if pd, ok := a.dp.(policyDumper); ok && a.policyDP() != nil {
		var dump *policy.Compiled
		a.host.Do(func() error { dump, err = pd.DumpPolicy(); return nil })
		if err != nil {
			return fmt.Errorf("restore policy: dump datapath: %w", err)
		}
		c.compiled = dump
	}
	if err := a.recompileLocked(); err != nil {
		return fmt.Errorf("restore policy: %w", err)
	}
	if a.cfg.ServiceHealthChecks {
		if a.health != nil {
			a.health.close()
		}
		a.health = a.newHealthChecks()
		a.syncHealthChecks(model.Services())
	}
	a.log.Info("control plane restored", "objects", len(c.objs), "frontends", len(model.Frontends()),
		"policies", len(c.compiled.Policies), "identities", len(c.idsStored))
	return nil
}

// maintain runs the periodic work until ctx ends: conntrack GC, retries
// of failed datapath updates and a resync of the node's addresses.
func (a *Agent) maintain(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.MaintainOnce()
		}
	}
}

// MaintainOnce resyncs the node's addresses for policy, collects expired
// conntrack entries and retries failed datapath updates (what the periodic
// loop does each interval).
func (a *Agent) MaintainOnce() {
	if err := a.SyncHostAddrs(); err != nil { // a backstop for the address watcher
		a.log.Warn("sync node addresses", "err", err)
	}
	c := a.ctl
	c.mu.Lock()
	if err := a.applyServices(nil); err != nil {
		a.log.Warn("retry service update", "err", err)
	}
	if err := a.applyPolicy(nil); err != nil {
		a.log.Warn("retry policy update", "err", err)
	}
	c.mu.Unlock()
	sd := a.serviceDP()
	if sd == nil {
		return
	}
	// GC walks the whole conntrack table: outside the lock, so object
	// changes do not wait for it.
	var n int
	var err error
	a.host.Do(func() error { n, err = sd.GCConntrack(); return nil })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gc.runs++
	if err != nil {
		c.gc.lastErr = err.Error()
		a.log.Warn("conntrack gc", "err", err)
		return
	}
	c.gc.lastErr = ""
	c.gc.removed += uint64(n)
}

// ServiceBackend is one backend of a frontend, for the API.
type ServiceBackend struct {
	Addr      netip.AddrPort
	State     service.BackendState
	BackendID uint32
}

// FrontendInfo is one programmed frontend, for the API.
type FrontendInfo struct {
	Service         service.ServiceID
	PortName        string
	Key             service.FrontendKey
	FrontendID      uint32
	Backends        []ServiceBackend
	MaglevSize      int
	Eligible        int
	AffinityTimeout time.Duration
	Local, External bool           // service.Frontend's
	SourceRanges    []netip.Prefix // service.Frontend's: nil, every source
}

// Frontends returns every frontend of the service model with its IDs.
func (a *Agent) Frontends() []FrontendInfo {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []FrontendInfo
	for _, f := range c.model.Frontends() {
		fi := FrontendInfo{Service: f.Service, PortName: f.PortName, Key: f.Key, MaglevSize: f.Maglev.Len(),
			Eligible: f.Eligible(), AffinityTimeout: f.AffinityTimeout, Local: f.Local, External: f.External,
			SourceRanges: f.SourceRanges}
		fi.FrontendID, _ = c.tables.FrontendID(f.Key)
		for _, b := range f.Backends {
			fi.Backends = append(fi.Backends, ServiceBackend{Addr: netip.AddrPortFrom(b.Addr, b.Port), State: b.State})
		}
		out = append(out, fi)
	}
	return out
}

// PolicyInfo is one stored NetworkPolicy with its datapath verdicts.
type PolicyInfo struct {
	Namespace, Name string
	Ingress, Egress bool // the directions it isolates
	Index           int  // index in the compiled policy set; -1: not compiled
	Verdict         datapath.PolicyVerdict
	// NotProgrammed is the full policy map its rules did not fit ("":
	// programmed; capacity.go): it still isolates its pods.
	NotProgrammed string
}

// ControlStats are the control plane's counts for status and metrics.
type ControlStats struct {
	Objects map[k8sobj.Kind]int
	// Refused counts the objects ReplaceObjects refused, by kind (Refused).
	Refused   map[k8sobj.Kind]int
	Services  int
	Frontends int
	// FrontendsByScope counts frontends by "ClusterIP" and "NodePort".
	FrontendsByScope map[string]int
	Backends         int
	Policies         int
	Identities       int
	Rules            int
	Endpoints        int // endpoints (local and remote) policy knows
	PendingSvc       int // parts of service updates waiting for a retry (the refused frontends', applyServices)
	PendingPol       int
	ServiceDP        bool // the datapath load-balances
	PolicyDP         bool // the datapath enforces policy
	GCRuns           uint64
	GCRemoved        uint64
	GCLastError      string
	Conntrack        *datapath.ServiceStats // nil without a service datapath or on error
	ConntrackErr     string
	SockLB           SockLBState
	HealthChecks     []HealthCheck
	// Ignored counts the addresses the translation left out on purpose,
	// by reason (service.ReasonHostIPNotNode, ReasonExternalIPNotAllowed).
	Ignored map[string]int
	// Maps: the service maps' fill and what waits for room (capacity.go).
	Maps []MapStat
}

// Policies returns the stored NetworkPolicies with their verdict counters.
func (a *Agent) Policies() ([]PolicyInfo, error) {
	c := a.ctl
	c.mu.Lock()
	idx := map[policy.PolicyRef]int{}
	for i, r := range c.compiled.Policies {
		idx[r] = i
	}
	left := map[policy.PolicyRef]string{}
	for _, l := range c.compiled.LeftOut {
		left[l.Policy] = l.Map
	}
	var out []PolicyInfo
	for _, o := range sortedObjects(c.objs) {
		if o.NetworkPolicy == nil {
			continue
		}
		pi := PolicyInfo{Namespace: o.NetworkPolicy.Namespace, Name: o.NetworkPolicy.Name, Index: -1}
		pi.Ingress, pi.Egress = policy.EffectivePolicyTypes(o.NetworkPolicy)
		ref := policy.PolicyRef{Namespace: pi.Namespace, Name: pi.Name}
		if i, ok := idx[ref]; ok {
			pi.Index = i
		}
		pi.NotProgrammed = left[ref]
		out = append(out, pi)
	}
	c.mu.Unlock()
	pd := a.policyDP()
	if pd == nil || len(out) == 0 {
		return out, nil
	}
	var verdicts map[uint32]datapath.PolicyVerdict
	var err error
	a.host.Do(func() error { verdicts, err = pd.PolicyVerdicts(); return nil })
	if err != nil {
		return out, fmt.Errorf("policy verdicts: %w", err)
	}
	for i := range out {
		if out[i].Index >= 0 {
			out[i].Verdict = verdicts[uint32(out[i].Index)]
		}
	}
	return out, nil
}

// ControlStats returns the control plane's counts and the datapath's
// conntrack statistics.
//
// While the control plane is busy for longer than statsWait (a restore, a
// kind's full set at scale) it returns the counts of its last call, with
// the conntrack statistics current: Status answers, a moment behind.
func (a *Agent) ControlStats() ControlStats {
	c := a.ctl
	if !lockWithin(&c.mu, statsWait) {
		var s ControlStats
		if last := a.lastStats.Load(); last != nil {
			s = *last
		}
		a.conntrackStats(&s)
		return s
	}
	s := ControlStats{Objects: map[k8sobj.Kind]int{}, Services: len(c.model.Services()), Policies: len(c.compiled.Policies),
		Identities: len(c.idsStored), Rules: len(c.compiled.Rules), Endpoints: len(c.compiled.IPCache),
		PendingSvc: len(c.svcRetry), PendingPol: len(c.polRetry), ServiceDP: a.serviceDP() != nil, PolicyDP: a.policyDP() != nil,
		GCRuns: c.gc.runs, GCRemoved: c.gc.removed, GCLastError: c.gc.lastErr}
	for _, o := range c.objs {
		s.Objects[o.Kind]++
	}
	s.Refused = map[k8sobj.Kind]int{}
	for _, r := range c.refused {
		s.Refused[r.Object.Kind]++
	}
	s.Ignored = c.ignoredByReason()
	s.FrontendsByScope = map[string]int{}
	for _, f := range c.model.Frontends() {
		s.Frontends++
		s.FrontendsByScope[scopeName(f.Key.Scope)]++
		s.Backends += len(f.Backends)
	}
	s.Maps = c.mapStats()
	c.mu.Unlock()
	s.SockLB, s.HealthChecks = a.sockLB, a.HealthChecks()
	last := s
	a.lastStats.Store(&last)
	a.conntrackStats(&s)
	return s
}

// conntrackStats adds the datapath's conntrack statistics to s.
func (a *Agent) conntrackStats(s *ControlStats) {
	if sd := a.serviceDP(); sd != nil {
		var st datapath.ServiceStats
		var err error
		a.host.Do(func() error { st, err = sd.ServiceStats(); return nil })
		if err != nil {
			s.ConntrackErr = err.Error()
		} else {
			s.Conntrack = &st
		}
	}
}

// PolicyVerdicts returns the datapath's verdicts by policy (namespace/name).
func (a *Agent) PolicyVerdicts() (map[policy.PolicyRef]datapath.PolicyVerdict, error) {
	pols, err := a.Policies()
	out := map[policy.PolicyRef]datapath.PolicyVerdict{}
	for _, p := range pols {
		out[policy.PolicyRef{Namespace: p.Namespace, Name: p.Name}] = p.Verdict
	}
	return out, err
}

// LBCounters names the load-balancer counters of st (the lb_events metric
// and the API's lb_counters).
func LBCounters(st datapath.ServiceStats) map[string]uint64 {
	m := map[string]uint64{
		"new-flow": st.NewFlows, "conntrack-hit": st.ConntrackHits, "reselected": st.Reselected,
		"affinity-hit": st.AffinityHits, "rev-nat": st.RevNAT, "no-backend": st.NoBackend, "hairpin": st.Hairpin,
		"nodeport-local": st.NodePortLocal, "nodeport-snat": st.NodePortSNAT,
		"masquerade": st.Masqueraded, "masquerade-packets": st.MasqueradedPackets,
	}
	// The socket load balancer (node processes, hostNetwork pods), per hook.
	for hook, c := range st.Sock {
		m["socket-"+hook+"-translated"] = c.Translated
		m["socket-"+hook+"-no-backend"] = c.NoBackend
		m["socket-"+hook+"-src-range"] = c.SrcRange
	}
	return m
}
