package main

import (
	"fmt"
	"log/slog"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// kubeFlags turn the Kubernetes source on (--node-name).
type kubeFlags struct {
	nodeName   string
	kubeconfig string
}

type kubeClients struct {
	client  kubernetes.Interface
	dynamic dynamic.Interface
}

// clients builds the API clients from --kubeconfig or the in-cluster
// service account.
func (f kubeFlags) clients() (*kubeClients, error) {
	var (
		cfg *rest.Config
		err error
	)
	if f.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "lanekitd/" + agent.Version + " (" + f.nodeName + ")"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return &kubeClients{client: c, dynamic: d}, nil
}

// startSource wires the Kubernetes source to the agent: objects to its
// object seam, launcher pods' VMIs to its VM attachments, other nodes' pod CIDRs to routes in the
// node's netns, and "caches synced" into its readiness.
func startSource(kc *kubeClients, node string, a *agent.Agent, hostNetns string, log *slog.Logger) (*k8s.Source, error) {
	routes, err := k8s.NewNetlinkRoutes(hostNetns)
	if err != nil {
		return nil, err
	}
	src, err := k8s.New(k8s.Config{
		NodeName: node, Client: kc.client, Dynamic: kc.dynamic,
		Objects: a, VMs: a, Routes: routes, Log: log,
	})
	if err != nil {
		return nil, err
	}
	a.AddReadyCheck("k8s", src.Synced)
	return src, nil
}
