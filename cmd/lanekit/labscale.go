//go:build !nolab

package main

import (
	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/lab"
)

func labScaleCmd() *cobra.Command {
	cfg := lab.DefaultScaleConfig()
	var asJSON, keep bool
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Scale bench through the lab's API server: fake Nodes, Services, EndpointSlices, pods, policies and churn against the real agents",
		Long: `Scale bench on a lab brought up with ` + "`lanekit lab up --k8s`" + `, driven only through its API server: creates
--nodes Node objects without kubelets (pod CIDRs in 10.128.0.0/9, InternalIPs on the underlay), --services
Services with --endpoints endpoints each (EndpointSlices as the endpointslice controller writes them, with the
trigger-time annotation, on the fake nodes' pod CIDRs), --pods pods with --identities label sets and
--policies NetworkPolicies, then changes endpoints at --churn-rate per second for --churn-for (every tenth
change relabels a pod). Reports: when the agents routed to every node and programmed every Service and
policy; network programming latency from the agents' kubeproxy_network_programming_duration_seconds
(bucket bounds) and from polling node 1's lk_lb_backends for each new backend (sampled); the policy
histogram; node 1's agent RSS and CPU at rest and under churn; its restart time to ready with every
frontend; the service maps' fill; with --first-packet-at, new connections through a probe Service at each
count; the API server's LIST calls, streamed initial lists and ended watches
during the churn and the restart (its own request metrics). The scale objects are deleted afterwards unless
--keep.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Out = cmd.ErrOrStderr()
			r, err := lab.RunScale(cmd.Context(), cfg, keep)
			if err != nil {
				return err
			}
			if asJSON {
				return r.WriteJSON(cmd.OutOrStdout())
			}
			return r.WriteTable(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "fake Node objects (up to 200: InternalIPs on the lab's underlay)")
	f.IntVar(&cfg.Services, "services", cfg.Services, "Services (one TCP port each)")
	f.IntVar(&cfg.Endpoints, "endpoints", cfg.Endpoints, "endpoints per Service")
	f.IntVar(&cfg.Pods, "pods", cfg.Pods, "pods on the fake nodes")
	f.IntVar(&cfg.Identities, "identities", cfg.Identities, "distinct label sets among the pods")
	f.IntVar(&cfg.Policies, "policies", cfg.Policies, "NetworkPolicies")
	f.Float64Var(&cfg.ChurnRate, "churn-rate", cfg.ChurnRate, "endpoint changes per second during the churn")
	f.DurationVar(&cfg.ChurnFor, "churn-for", cfg.ChurnFor, "how long to churn")
	f.Float32Var(&cfg.QPS, "qps", cfg.QPS, "API client QPS while creating")
	f.IntVar(&cfg.Burst, "burst", cfg.Burst, "API client burst")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "objects created in parallel")
	f.BoolVar(&cfg.FillEtcd, "fill-etcd", false, "write the scale objects into the lab API server's etcd as it stores them, a kind at a time, instead of one create each (kube-apiserver's ClusterIP allocator makes N creates cost O(N²): 30,000 Services took 29 min); the agents still see them, and the churn, through the API server's watches")
	f.IntSliceVar(&cfg.FirstPacketAt, "first-packet-at", nil, "Service counts (ascending, e.g. 100,10000,100000) at which the fill pauses, once both agents programmed them, to time new connections (connect() p50/p99 and conn/s, one loop) from node 1's lanekit pod through a probe Service to node 2's lanekit pods")
	f.DurationVar(&cfg.FirstPacketFor, "first-packet-for", cfg.FirstPacketFor, "length of one --first-packet-at run")
	f.IntVar(&cfg.FirstPacketRepeat, "first-packet-repeat", cfg.FirstPacketRepeat, "runs per --first-packet-at count (medians reported)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&keep, "keep", false, "keep the scale objects afterwards")
	return cmd
}
