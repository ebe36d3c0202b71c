package datapath

import (
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
)

// This file holds the service and policy seams as agreed in SEAMS.md §1; the
// lb and policy work implements them on *Loader, the agent's MemoryDatapath
// implements them for tests. The agent type-asserts them on its Datapath.

// ServiceDatapath programs service load balancing.
type ServiceDatapath interface {
	// ApplyServices applies u in the order service.Update documents; it is idempotent.
	ApplyServices(u *service.Update) error
	// DumpServices returns what the (pinned) maps hold, for a restarted agent
	// to re-adopt frontend and backend IDs.
	DumpServices() (*service.Update, error)
	// GCConntrack removes expired conntrack entries; the agent calls it periodically.
	GCConntrack() (removed int, err error)
	// ServiceStats returns conntrack occupancy and load-balancer counters.
	ServiceStats() (ServiceStats, error)
}

// ServiceStats are conntrack occupancy and load-balancing counters, summed
// over CPUs (the same definition as the lb work's services.go).
type ServiceStats struct {
	// ConntrackEntries is the live entry count.
	ConntrackEntries uint64
	// ConntrackCapacity is lk_ct4's size.
	ConntrackCapacity uint64
	// ConntrackCreated counts entries the datapath created.
	ConntrackCreated uint64
	// ConntrackEvicted counts creations while the table was full: each made
	// the LRU evict a tracked flow.
	ConntrackEvicted uint64
	// ConntrackFailed counts creations the map refused.
	ConntrackFailed uint64

	NewFlows      uint64 // new flows that took a backend
	ConntrackHits uint64 // packets of tracked flows that kept their backend
	Reselected    uint64 // tracked flows whose backend was gone, chosen again
	AffinityHits  uint64 // new flows that followed a ClientIP affinity entry
	RevNAT        uint64 // replies translated back
	NoBackend     uint64 // new flows without a backend (reset / unreachable sent)
	Hairpin       uint64 // new flows whose client is its own backend
	NodePortLocal uint64 // new NodePort flows to a local backend
	NodePortSNAT  uint64 // new NodePort flows to a remote backend (SNAT)
}

// PolicyDatapath programs network policy.
type PolicyDatapath interface {
	// ApplyPolicy applies u in the order policy.Update documents.
	ApplyPolicy(u *policy.Update) error
	// PolicyVerdicts returns packet verdicts keyed by policy index
	// (RuleValue.Policy for allows, Isolation index - 1 for default denies).
	PolicyVerdicts() (map[uint32]PolicyVerdict, error)
}

// PolicyVerdict counts what one policy decided.
type PolicyVerdict struct {
	Allowed uint64 // packets an allow rule of the policy matched
	Denied  uint64 // packets dropped by the default deny the policy put in place
}
