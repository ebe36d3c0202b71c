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

// ServiceStats are conntrack and load-balancer statistics.
type ServiceStats struct {
	ConntrackEntries  int    // entries in the conntrack table now
	ConntrackCapacity int    // maximum entries
	ConntrackFull     uint64 // new flows not tracked because the table was full
	// LB counts load-balancer events by name ("new-flow", "no-backend", ...).
	LB map[string]uint64
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
