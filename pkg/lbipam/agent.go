package lbipam

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// AgentConfig is what a node agent runs of LB IPAM and L2 announcements.
type AgentConfig struct {
	Client    kubernetes.Interface
	Node      string
	Namespace string // the agents' namespace: Leases and the pools ConfigMap
	// IPAM makes this agent a candidate for the cluster's one IPAM writer.
	IPAM bool
	// PoolsConfigMap overrides DefaultPoolsConfigMap.
	PoolsConfigMap string
	// IPAMLeaseDuration etc. override the leader election's timing.
	IPAMLeaseDuration, IPAMRenewDeadline, IPAMRetryPeriod time.Duration
	// Announce answers for this node's addresses (nil: no L2 announcements).
	Announce Announce
	// L2LeaseDuration is the per-node Lease's duration (default 3 s).
	L2LeaseDuration time.Duration
	Log             *slog.Logger
}

// RunAgent runs the parts cfg enables until ctx ends.
func RunAgent(ctx context.Context, cfg AgentConfig) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	var runs []func(context.Context) error
	if cfg.IPAM {
		m, err := NewIPAM(IPAMConfig{Client: cfg.Client, Identity: cfg.Node, Namespace: cfg.Namespace, ConfigMap: cfg.PoolsConfigMap,
			LeaseDuration: cfg.IPAMLeaseDuration, RenewDeadline: cfg.IPAMRenewDeadline, RetryPeriod: cfg.IPAMRetryPeriod, Log: cfg.Log})
		if err != nil {
			return err
		}
		runs = append(runs, m.Run)
	}
	if cfg.Announce != nil {
		l, err := NewL2(L2Config{Client: cfg.Client, Node: cfg.Node, Namespace: cfg.Namespace, PoolsConfigMap: cfg.PoolsConfigMap,
			LeaseDuration: cfg.L2LeaseDuration, Announce: cfg.Announce, Log: cfg.Log})
		if err != nil {
			return err
		}
		runs = append(runs, l.Run)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(runs))
	for i, run := range runs {
		wg.Go(func() { errs[i] = run(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
