package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// ControlPlaneSource is a Source that also has the service and policy
// control plane (*agent.Agent is one); the collector exports its metrics
// when the watched source implements it.
type ControlPlaneSource interface {
	ControlStats() agent.ControlStats
	Policies() ([]agent.PolicyInfo, error)
}

// Service, policy and conntrack metric names (the dashboard uses exactly these).
const (
	NameServiceFrontends  = "lanekit_service_frontends"
	NameServiceBackends   = "lanekit_service_backends"
	NameServiceObjects    = "lanekit_service_objects"
	NameObjectsRefused    = "lanekit_k8s_objects_refused"
	NameServiceLBEvents   = "lanekit_service_lb_events_total"
	NamePendingUpdates    = "lanekit_service_pending_updates"
	NamePolicies          = "lanekit_policy_policies"
	NamePolicyIdentities  = "lanekit_policy_identities"
	NamePolicyRules       = "lanekit_policy_rules"
	NamePolicyVerdicts    = "lanekit_policy_verdict_packets_total"
	NamePolicyPending     = "lanekit_policy_pending_updates"
	NameConntrackEntries  = "lanekit_conntrack_entries"
	NameConntrackCapacity = "lanekit_conntrack_capacity"
	NameConntrackEvicted  = "lanekit_conntrack_evicted_total"
	NameConntrackFailed   = "lanekit_conntrack_failed_total"
	NameConntrackCreated  = "lanekit_conntrack_created_total"
	NameConntrackGC       = "lanekit_conntrack_gc_removed_total"
	NameAddrsIgnored      = "lanekit_service_addresses_ignored"
	NameMapEntries        = "lanekit_map_entries"
	NameMapCapacity       = "lanekit_map_capacity"
	NameMapUnprogrammed   = "lanekit_map_unprogrammed_frontends"
	NameMapUnprogPolicies = "lanekit_map_unprogrammed_policies"
	NameMapUnprogEntries  = "lanekit_map_unprogrammed_entries"
)

var (
	descSvcFront  = prometheus.NewDesc(NameServiceFrontends, "Service frontends (cluster IP or node address + port + protocol) the agent programs, by scope.", []string{"scope"}, nil)
	descSvcBack   = prometheus.NewDesc(NameServiceBackends, "Backends over all service frontends.", nil, nil)
	descSvcObjs   = prometheus.NewDesc(NameServiceObjects, "Kubernetes objects the agent holds, by kind (Service, EndpointSlice, NetworkPolicy, Namespace, Pod).", []string{"kind"}, nil)
	descRefused   = prometheus.NewDesc(NameObjectsRefused, "Kubernetes objects the agent refused on its own (invalid, or a Service claiming a frontend an older Service holds), by kind; retried with every change to their kind.", []string{"kind"}, nil)
	descLBEvents  = prometheus.NewDesc(NameServiceLBEvents, "Load-balancer events the datapath counted, by event.", []string{"event"}, nil)
	descSvcPend   = prometheus.NewDesc(NamePendingUpdates, "Service map updates the datapath failed to apply, waiting for a retry.", nil, nil)
	descPolicies  = prometheus.NewDesc(NamePolicies, "NetworkPolicies compiled into the datapath.", nil, nil)
	descPolIDs    = prometheus.NewDesc(NamePolicyIdentities, "Security identities allocated (endpoint label sets and ipBlock prefixes).", nil, nil)
	descPolRules  = prometheus.NewDesc(NamePolicyRules, "Allow rules in the policy map.", nil, nil)
	descVerdicts  = prometheus.NewDesc(NamePolicyVerdicts, "Packets a NetworkPolicy allowed (its rules matched) or denied (its default deny dropped them).", []string{"policy_namespace", "policy", "verdict"}, nil)
	descPolPend   = prometheus.NewDesc(NamePolicyPending, "Policy map updates the datapath failed to apply, waiting for a retry.", nil, nil)
	descCTEntries = prometheus.NewDesc(NameConntrackEntries, "Entries in the datapath's conntrack table.", nil, nil)
	descCTCap     = prometheus.NewDesc(NameConntrackCapacity, "Capacity of the datapath's conntrack table.", nil, nil)
	descCTEvict   = prometheus.NewDesc(NameConntrackEvicted, "Conntrack entries created while the table was full: each evicted a tracked flow (which loses its backend or NAT).", nil, nil)
	descCTFailed  = prometheus.NewDesc(NameConntrackFailed, "Conntrack entries the datapath could not create.", nil, nil)
	descCTCreated = prometheus.NewDesc(NameConntrackCreated, "Conntrack entries the datapath created.", nil, nil)
	descCTGC      = prometheus.NewDesc(NameConntrackGC, "Expired conntrack entries the agent's periodic GC removed.", nil, nil)
	descMapEnt    = prometheus.NewDesc(NameMapEntries, "Entries in a service or policy map (lk_lb_svc, lk_lb_svc6: frontends; lk_lb_backends, lk_lb_backends6: backends of every frontend; lk_policy_*: as compiled, with the node's own addresses in the ipcache).", []string{"map"}, nil)
	descMapCap    = prometheus.NewDesc(NameMapCapacity, "Capacity of a service or policy map (lanekitd --lb-frontends, --lb-backends, --policy-*).", []string{"map"}, nil)
	descMapUnprog = prometheus.NewDesc(NameMapUnprogrammed, "Service frontends not programmed (or programmed with an earlier backend set) because the map is full; programmed once room returns.", []string{"map"}, nil)
	descMapUnpol  = prometheus.NewDesc(NameMapUnprogPolicies, "NetworkPolicies not programmed because a policy map is full: their pods stay isolated, their allow rules wait; programmed once room returns.", []string{"map"}, nil)
	descMapUnent  = prometheus.NewDesc(NameMapUnprogEntries, "Pod addresses (lk_policy_ipcache, lk_policy_ipcache6) or isolated identities (lk_policy_isolation) left out because the map is full; this node's own are kept first.", []string{"map"}, nil)
	descIgnored   = prometheus.NewDesc(NameAddrsIgnored, "Addresses the agent does not serve on purpose, by reason: hostip-not-node (a hostPort whose hostIP is not an address of this node), externalip-not-allowed (a spec.externalIPs address outside --external-ips), protocol-unsupported (a Service or hostPort port of a protocol lanekit does not load-balance: SCTP).", []string{"reason"}, nil)
)

var controlDescs = []*prometheus.Desc{descSvcFront, descSvcBack, descSvcObjs, descRefused, descLBEvents, descSvcPend, descPolicies, descPolIDs,
	descPolRules, descVerdicts, descPolPend, descCTEntries, descCTCap, descCTEvict, descCTFailed, descCTCreated, descCTGC, descIgnored,
	descMapEnt, descMapCap, descMapUnprog, descMapUnpol, descMapUnent}

func (c *collector) collectControlPlane(ch chan<- prometheus.Metric, cp ControlPlaneSource) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	st := cp.ControlStats()
	gauge(descSvcFront, float64(st.FrontendsByScope["ClusterIP"]), "ClusterIP")
	gauge(descSvcFront, float64(st.FrontendsByScope["NodePort"]), "NodePort")
	gauge(descSvcBack, float64(st.Backends))
	for _, k := range []string{"Service", "EndpointSlice", "NetworkPolicy", "Namespace", "Pod"} {
		n := 0
		for kind, v := range st.Objects {
			if string(kind) == k {
				n = v
			}
		}
		gauge(descSvcObjs, float64(n), k)
		gauge(descRefused, float64(st.Refused[k8sobj.Kind(k)]), k)
	}
	gauge(descSvcPend, float64(st.PendingSvc))
	gauge(descPolicies, float64(st.Policies))
	gauge(descPolIDs, float64(st.Identities))
	gauge(descPolRules, float64(st.Rules))
	gauge(descPolPend, float64(st.PendingPol))
	counter(descCTGC, st.GCRemoved)
	for _, r := range []string{service.ReasonHostIPNotNode, service.ReasonExternalIPNotAllowed} {
		gauge(descIgnored, float64(st.Ignored[r]), r)
	}
	for _, m := range st.Maps {
		gauge(descMapEnt, float64(m.Entries), m.Map)
		gauge(descMapCap, float64(m.Capacity), m.Map)
		gauge(descMapUnprog, float64(m.UnprogrammedFrontends), m.Map)
		gauge(descMapUnpol, float64(m.UnprogrammedPolicies), m.Map)
		gauge(descMapUnent, float64(m.UnprogrammedEntries), m.Map)
	}
	if ct := st.Conntrack; ct != nil {
		gauge(descCTEntries, float64(ct.ConntrackEntries))
		gauge(descCTCap, float64(ct.ConntrackCapacity))
		counter(descCTEvict, ct.ConntrackEvicted)
		counter(descCTFailed, ct.ConntrackFailed)
		counter(descCTCreated, ct.ConntrackCreated)
		for ev, n := range agent.LBCounters(*ct) {
			counter(descLBEvents, n, ev)
		}
	} else if st.ConntrackErr != "" {
		c.opts.Log.Warn("metrics: conntrack stats", "err", st.ConntrackErr)
	}
	pols, err := cp.Policies()
	if err != nil {
		c.opts.Log.Warn("metrics: policy verdicts", "err", err)
	}
	for _, p := range pols {
		counter(descVerdicts, p.Verdict.Allowed, p.Namespace, p.Name, "allowed")
		counter(descVerdicts, p.Verdict.Denied, p.Namespace, p.Name, "denied")
	}
}
