// Command lanekitd is the lanekit node agent: it serves the agent API on a
// unix socket for the CNI plugin and the CLI, and drives the datapath.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/lanekit/lanekit/internal/labswitch"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/deviceplugin"
	"github.com/lanekit/lanekit/pkg/k8s"
	lkmetrics "github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/observe"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lanekitd:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("lanekitd", flag.ContinueOnError)
	var f daemonFlags
	f.addFlags(fs) // flags.go
	lab := labswitch.On()
	hideLabFlags(fs, lab) // lab.go
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkLabFlags(fs, lab); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := f.check(); err != nil {
		return err
	}
	if f.mode.mode == modeHost {
		return runHost(f.mode, f.cfg.Socket, f.metrics, newLogger(f.logJSON, f.verbose))
	}
	cidr4, cidr6, err := f.agentConfig()
	if err != nil {
		return err
	}
	log := newLogger(f.logJSON, f.verbose)
	// client-go logs through klog: into the agent's log.
	klog.SetSlogLogger(log.With("component", "client-go"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if _, err := setMemoryLimit(f.memRatio, log); err != nil {
		return err
	}
	if f.pprofAt != "" { // first: a slow start is what one profiles
		if _, err := servePprof(ctx, f.pprofAt, log); err != nil {
			return err
		}
	}
	n, err := f.node(ctx, cidr4, cidr6, log)
	if err != nil {
		return err
	}
	return f.serve(ctx, stop, n, log)
}

// nodeStart is what the agent starts from: the API server's clients (nil
// without --node-name) and the Node's facts.
type nodeStart struct {
	kc      *kubeClients
	offline bool      // started from the stored node facts (nodestart.go)
	facts   nodeFacts // what the Node said, or the store
	// routes: native routing with the API server reachable, the routes to
	// the other Nodes, installed from one LIST while the datapath loads
	// (k8s.EarlyRoutes); the source syncs through it.
	routes k8s.RouteSink
}

// node takes the node's facts (with --node-name: the Node's pod CIDRs,
// zone and uplink, which --pod-cidr must agree with) and sets f.cfg's pod
// CIDRs.
func (f *daemonFlags) node(ctx context.Context, cidr4, cidr6 string, log *slog.Logger) (nodeStart, error) {
	var n nodeStart
	cfg := &f.cfg
	if f.kube.nodeName != "" {
		var err error
		if n.kc, err = f.kube.clients(log); err != nil {
			return n, err
		}
		if n.facts, n.offline, err = f.kube.startFacts(ctx, n.kc, cfg.StateDir, cidr4, cidr6, cfg.Uplink, cfg.HostNetns, log); err != nil {
			return n, err
		}
		cidr4, cidr6 = n.facts.PodCIDR, n.facts.PodCIDR6
		cfg.NodeName, cfg.Zone = f.kube.nodeName, n.facts.Zone
		cfg.RestoreObject = k8s.InternObject // as the informers' transform does
		if cfg.Uplink == "" {
			cfg.Uplink = n.facts.Uplink
			log.Info("uplink from the Node's InternalIP", "uplink", cfg.Uplink)
		}
		if !n.offline && cfg.RoutingMode != agent.RoutingTunnel {
			r, err := k8s.NewNetlinkRoutes(cfg.HostNetns)
			if err != nil {
				return n, err
			}
			n.routes = k8s.StartEarlyRoutes(ctx, n.kc.client, f.kube.nodeName, r, earlyRoutesTimeout, log)
		}
	}
	if cidr4 != "" { // empty: an IPv6-only node
		p, err := netip.ParsePrefix(cidr4)
		if err != nil {
			return n, fmt.Errorf("--pod-cidr: %w", err)
		}
		cfg.PodCIDR = p
	}
	if cidr6 != "" {
		p, err := netip.ParsePrefix(cidr6)
		if err != nil {
			return n, fmt.Errorf("--pod-cidr: %w", err)
		}
		cfg.PodCIDR6 = p
	}
	return n, nil
}

// startAgent makes the agent with what serves beside it on its socket and
// link: Prometheus metrics, the flow observer, the DPU link. It returns the
// Config the agent runs with.
func (f *daemonFlags) startAgent(ctx context.Context, stop context.CancelFunc, kc *kubeClients, log *slog.Logger) (*agent.Agent, agent.Config, error) {
	cfg := f.cfg
	var m *lkmetrics.Metrics
	if f.metrics != "" {
		m = lkmetrics.New(lkmetrics.Options{Log: log})
		cfg.ServerOptions = append(cfg.ServerOptions, m.ServerOption())
		if kc != nil {
			kc.latency = m
		}
	}
	var a *agent.Agent
	cfg.ExtraServices = func(srv *grpc.Server) {
		observe.NewServer(observe.NewHub(observe.Options{
			Open: observe.OpenPinned(cfg.BPFDir), Endpoints: a, Log: log})).Register(srv)
	}
	dpuLink, err := f.mode.setupDPU(&cfg, log)
	if err != nil {
		return nil, cfg, err
	}
	start := time.Now()
	a, err = agent.New(cfg, log)
	if err != nil {
		return nil, cfg, err
	}
	if dpuLink != nil {
		if err := dpuLink.serve(ctx, a, m, log, stop); err != nil {
			a.Close()
			return nil, cfg, err
		}
	}
	if m != nil {
		m.ObserveStartup(time.Since(start))
		if err := startMetrics(ctx, m, a, cfg, f.metrics, log); err != nil {
			a.Close()
			return nil, cfg, err
		}
	}
	return a, cfg, nil
}

// serve starts the agent and what runs beside it (startAgent's, LB IPAM,
// the Kubernetes source, the device plugin), runs it until ctx ends or stop
// is called, and closes it.
func (f *daemonFlags) serve(ctx context.Context, stop context.CancelFunc, n nodeStart, log *slog.Logger) error {
	kube, kc := f.kube, n.kc
	a, cfg, err := f.startAgent(ctx, stop, kc, log)
	if err != nil {
		return err
	}
	srcDone := make(chan struct{})
	var lbDone <-chan struct{} // LB IPAM and L2 announcements (lbipam.go)
	if kc != nil {
		// client-go's leader election and informers wait for the API
		// server themselves: started offline too.
		if lbDone, err = f.lb.start(ctx, kc, kube.nodeName, cfg.HostNetns, cfg.Uplink, log); err != nil {
			a.Close()
			return err
		}
	}
	srcErr := make(chan error, 1) // the agent must exit (nodestart.go)
	switch {
	case n.offline:
		go func() {
			defer close(srcDone)
			if err := kube.runWhenReachable(ctx, kc, n.facts, a, cfg.HostNetns, log); err != nil {
				srcErr <- err
				stop()
			}
		}()
	case kc != nil:
		src, err := startSource(kc, kube.nodeName, a, cfg.HostNetns, n.routes, log)
		if err != nil {
			a.Close()
			return err
		}
		go func() {
			defer close(srcDone)
			if err := src.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error("k8s source stopped", "err", err)
			}
		}()
	default:
		close(srcDone)
	}
	dpDone := make(chan struct{})
	if f.devicePluginDir != "" && kube.nodeName != "" {
		p := &deviceplugin.Plugin{Dir: f.devicePluginDir, Devices: min(agent.VMCapacity(cfg), deviceplugin.MaxDevices), Log: log}
		go func() {
			defer close(dpDone)
			if err := p.Run(ctx); err != nil {
				log.Error("device plugin", "err", err)
			}
		}()
	} else {
		close(dpDone)
	}
	runErr := a.Run(ctx)
	stop()
	<-srcDone
	<-dpDone
	if lbDone != nil {
		<-lbDone
	}
	select {
	case err := <-srcErr:
		runErr = errors.Join(runErr, err)
	default:
	}
	if err := a.Close(); err != nil {
		log.Error("close", "err", err)
	}
	if runErr == nil {
		log.Info("stopped")
	}
	return runErr
}

func newLogger(logJSON, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(os.Stderr, opts)
	if !logJSON {
		h = slog.NewTextHandler(os.Stderr, opts)
	}
	return slog.New(h)
}

// startMetrics registers the agent with the metrics registry and serves it.
func startMetrics(ctx context.Context, m *lkmetrics.Metrics, a *agent.Agent, cfg agent.Config, addr string, log *slog.Logger) error {
	m = m.WithDatapathCheck(lkmetrics.PinsLoaded(cfg.BPFDir))
	if err := m.Watch(a); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	bound, err := m.Serve(ctx, addr)
	if err != nil {
		return err
	}
	log.Info("serving metrics", "addr", bound.String(), "path", "/metrics")
	return nil
}
