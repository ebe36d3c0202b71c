package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/lanekit/lanekit/pkg/lbipam"
)

// lbFlags turn on LB IPAM (this agent stands for the cluster's one writer
// of LoadBalancer addresses) and L2 announcements on the uplink.
type lbFlags struct {
	ipam, l2  bool
	namespace string
	pools     string
}

func (f *lbFlags) addFlags(fs *flag.FlagSet) {
	boolFunc := func(dst *bool) func(string) error {
		return func(v string) error {
			if v = unsetRef(v); v == "" {
				return nil
			}
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("want true or false, got %q", v)
			}
			*dst = b
			return nil
		}
	}
	fs.Func("lb-ipam", "assign LoadBalancer Services (no loadBalancerClass, or "+lbipam.Class+") addresses from the pools in the --lb-pools-configmap "+
		"ConfigMap; the agents elect one writer by a Lease (needs --node-name; default false)", boolFunc(&f.ipam))
	fs.Func("l2-announce", "answer ARP and NDP on the uplink for the LoadBalancer addresses lanekit assigned (only those of its pools), from one node per Service "+
		"(moved within seconds when that node's agent stops; needs --node-name; default false)", boolFunc(&f.l2))
	f.namespace = os.Getenv("POD_NAMESPACE")
	if f.namespace == "" {
		f.namespace = "lanekit-system"
	}
	fs.StringVar(&f.namespace, "lb-namespace", f.namespace, "namespace of the LB IPAM and L2 Leases and of the pools ConfigMap (default: $POD_NAMESPACE, else lanekit-system)")
	fs.StringVar(&f.pools, "lb-pools-configmap", lbipam.DefaultPoolsConfigMap, "ConfigMap (key "+lbipam.PoolsKey+") holding the LoadBalancer address pools")
}

func (f lbFlags) validate(k kubeFlags) error {
	if (f.ipam || f.l2) && k.nodeName == "" {
		return fmt.Errorf("--lb-ipam and --l2-announce need --node-name")
	}
	return nil
}

// start runs what f enables until ctx ends; done closes after.
func (f lbFlags) start(ctx context.Context, kc *kubeClients, node, hostNetns, uplink string, log *slog.Logger) (done <-chan struct{}, err error) {
	ch := make(chan struct{})
	if !f.ipam && !f.l2 {
		close(ch)
		return ch, nil
	}
	cfg := lbipam.AgentConfig{Client: kc.client, Node: node, Namespace: f.namespace, IPAM: f.ipam,
		PoolsConfigMap: f.pools, Log: log.With("component", "lb")}
	var r *lbipam.Responder
	if f.l2 {
		if uplink == "" {
			return nil, fmt.Errorf("--l2-announce: no uplink to answer on (--uplink)")
		}
		if r, err = lbipam.OpenResponder(hostNetns, uplink, cfg.Log); err != nil {
			return nil, fmt.Errorf("--l2-announce: %w", err)
		}
		cfg.Announce = r
	}
	go func() {
		defer close(ch)
		if err := lbipam.RunAgent(ctx, cfg); err != nil && ctx.Err() == nil {
			log.Error("lb ipam / l2 announcements stopped", "err", err)
		}
		if r != nil {
			r.Close()
		}
	}()
	return ch, nil
}
