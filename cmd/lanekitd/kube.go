package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// kubeFlags turn the Kubernetes source on (--node-name).
type kubeFlags struct {
	nodeName   string
	kubeconfig string
	// api is the API server's own address (--k8s-service-host,
	// --k8s-service-port): without kube-proxy, the "kubernetes" ClusterIP
	// that rest.InClusterConfig uses is served to no host-network process.
	api k8s.APIServer
	// saDir holds the service-account token and CA (tests mirror kubelet's
	// layout elsewhere; empty: k8s.ServiceAccountDir).
	saDir string
}

// addFlags registers the Kubernetes flags on fs.
func (f *kubeFlags) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.nodeName, "node-name", "", "this node's name in Kubernetes: watch the API server (Pods, Namespaces, Services, EndpointSlices, NetworkPolicies, Nodes, KubeVirt VMIs)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for the API server (default with --node-name: the in-cluster service account)")
	fs.Func("k8s-service-host", "the API server's host name or IP address, reached directly with the in-cluster service account's token and CA "+
		"(needed without kube-proxy: the kubernetes Service's ClusterIP is not served to the node); empty: the in-cluster KUBERNETES_SERVICE_HOST", func(v string) error {
		f.api.Host = unsetRef(v)
		return nil
	})
	f.api.Port = defaultAPIPort
	fs.Func("k8s-service-port", "the API server's port with --k8s-service-host (default "+defaultAPIPort+")", func(v string) error {
		if v = unsetRef(v); v == "" {
			v = defaultAPIPort
		}
		f.api.Port = v
		return nil
	})
}

// defaultAPIPort is kube-apiserver's default --secure-port.
const defaultAPIPort = "6443"

// unsetRef maps a Kubernetes $(VAR) reference left in an argument (the
// DaemonSet's optional ConfigMap key is missing, so the container has no
// VAR and kubelet leaves the reference as it is) to "not set".
func unsetRef(v string) string {
	if strings.HasPrefix(v, "$(") && strings.HasSuffix(v, ")") {
		return ""
	}
	return v
}

// validate checks the combinations of Kubernetes flags.
func (f kubeFlags) validate() error {
	if f.kubeconfig != "" && f.nodeName == "" {
		return fmt.Errorf("--kubeconfig needs --node-name")
	}
	if f.api.Set() {
		if f.nodeName == "" {
			return fmt.Errorf("--k8s-service-host needs --node-name")
		}
		if f.kubeconfig != "" {
			return fmt.Errorf("--k8s-service-host and --kubeconfig both name the API server: give one")
		}
		if err := f.api.Validate(); err != nil {
			return fmt.Errorf("--k8s-service-host/--k8s-service-port: %w", err)
		}
	}
	return nil
}

// restConfig is the client configuration: --kubeconfig, else the in-cluster
// service account at --k8s-service-host, else rest.InClusterConfig.
func (f kubeFlags) restConfig(log *slog.Logger) (*rest.Config, error) {
	switch {
	case f.kubeconfig != "":
		return clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	case f.api.Set():
		return k8s.ServiceAccountConfig(f.api, f.saDir)
	}
	log.Warn("no --k8s-service-host: reaching the API server through the kubernetes Service's ClusterIP "+
		"(KUBERNETES_SERVICE_HOST); without kube-proxy nothing serves it to the node and the agent cannot start: "+
		"set k8s-service-host in the lanekit-config ConfigMap", "kubernetes_service_host", os.Getenv("KUBERNETES_SERVICE_HOST"))
	return rest.InClusterConfig()
}

type kubeClients struct {
	client  kubernetes.Interface
	dynamic dynamic.Interface
	// latency receives the programming latencies (nil: no metrics).
	latency k8s.LatencyObserver
}

// clients builds the API clients from --kubeconfig or the in-cluster
// service account.
func (f kubeFlags) clients(log *slog.Logger) (*kubeClients, error) {
	cfg, err := f.restConfig(log)
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

// earlyRoutesTimeout bounds the early routes' LIST and sync: the source
// waits for them before its first sync.
const earlyRoutesTimeout = 30 * time.Second

// startSource wires the Kubernetes source to the agent: objects to its
// object seam, launcher pods' VMIs to its VM attachments, other nodes' pod CIDRs to routes in the
// node's netns (through early, when the routes were started before the
// agent: k8s.EarlyRoutes), and "caches synced" into its readiness.
func startSource(kc *kubeClients, node string, a *agent.Agent, hostNetns string, early k8s.RouteSink, log *slog.Logger) (*k8s.Source, error) {
	var routes k8s.RouteSink = tunnelPeers{a}
	switch {
	case a.RoutingMode() == agent.RoutingTunnel:
	case early != nil:
		routes = early
	default:
		var err error
		if routes, err = k8s.NewNetlinkRoutes(hostNetns); err != nil {
			return nil, err
		}
	}
	// Claims of moved VM addresses, via the owner's InternalIP: /32 routes
	// (native) or node map entries (tunnel: the InternalIP is the underlay
	// address the node map has for the owner's pod CIDR).
	var moved k8s.EndpointRouteSink = a
	src, err := k8s.New(k8s.Config{
		NodeName: node, Client: kc.client, Dynamic: kc.dynamic,
		Objects: a, VMs: a, Routes: routes, EndpointRoutes: moved, Latency: kc.latency, Log: log,
		OnSynced: func() { releaseSyncMemory(log, a.DropStorePages) },
	})
	if err != nil {
		return nil, err
	}
	a.AddReadyCheck("k8s", src.Synced)
	return src, nil
}

// tunnelPeers takes the other nodes' pod CIDRs and InternalIPs into the
// tunnel's node map instead of kernel routes (tunnel routing mode).
type tunnelPeers struct{ a *agent.Agent }

func (t tunnelPeers) SyncRoutes(routes []k8s.Route) error {
	peers := make([]datapath.TunnelNode, 0, len(routes))
	for _, r := range routes {
		peers = append(peers, datapath.TunnelNode{PodCIDR: r.Dst, Underlay: r.Via})
	}
	return t.a.SetTunnelPeers(peers)
}
