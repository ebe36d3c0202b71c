package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Route is a native route to another node's pods.
type Route struct {
	Node string
	Dst  netip.Prefix // the node's pod CIDR
	Via  netip.Addr   // the node's InternalIP
}

// RouteSink installs the full set of routes to other nodes' pod CIDRs,
// removing the ones it installed before that are no longer in it.
type RouteSink interface {
	SyncRoutes(routes []Route) error
}

// desiredRoutes are the routes to every other node with an IPv4 pod CIDR
// and an IPv4 InternalIP, and the IPv6 ones of desiredRoutes6, sorted by
// destination.
func desiredRoutes(self string, own netip.Prefix, nodes []*corev1.Node) []Route {
	var out []Route
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		dst, err := netip.ParsePrefix(nodePodCIDRv4(n))
		if err != nil {
			continue
		}
		dst = dst.Masked()
		if own.IsValid() && dst.Overlaps(own) {
			continue
		}
		via := nodeInternalIPv4(n) // also the claims' (vmiclaims.go)
		if !via.IsValid() {
			continue
		}
		out = append(out, Route{Node: n.Name, Dst: dst, Via: via})
	}
	out = append(out, desiredRoutes6(self, nodes)...) // podcidr6.go
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out
}

// EarlyRoutes installs the routes to the other Nodes from one LIST of the
// Nodes while the agent is still starting: routes need nothing from the
// BPF datapath, whose load (the verifier) takes most of an agent's start,
// so a restarted or new node reaches other nodes' pods that much sooner.
// It is the source's RouteSink: the source's syncs wait until the early one
// has ended, so a LIST older than the informers' view can never overwrite
// what the source installed.
type EarlyRoutes struct {
	sink RouteSink
	done chan struct{}
}

// StartEarlyRoutes lists the Nodes (from the API server's watch cache, as
// an informer's first list does) and syncs sink with the routes to every
// other Node, in the background, for at most timeout. A failure is logged
// and leaves the routes to the source.
func StartEarlyRoutes(ctx context.Context, c kubernetes.Interface, self string, sink RouteSink, timeout time.Duration, log *slog.Logger) *EarlyRoutes {
	e := &EarlyRoutes{sink: sink, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			log.Warn("early node routes: list Nodes (the source installs them once synced)", "err", err)
			return
		}
		nodes := make([]*corev1.Node, len(list.Items))
		var own netip.Prefix
		for i := range list.Items {
			nodes[i] = &list.Items[i]
			if nodes[i].Name == self {
				own, _ = netip.ParsePrefix(nodePodCIDRv4(nodes[i]))
			}
		}
		want := desiredRoutes(self, own, nodes)
		if err := sink.SyncRoutes(want); err != nil {
			log.Warn("early node routes (the source retries)", "err", err)
			return
		}
		log.Info("node routes synced before the datapath", "routes", len(want))
	}()
	return e
}

// SyncRoutes syncs the sink once the early sync has ended.
func (e *EarlyRoutes) SyncRoutes(routes []Route) error {
	<-e.done
	return e.sink.SyncRoutes(routes)
}

func (s *Source) kickRoutes() {
	select {
	case s.routesQ <- struct{}{}:
	default:
	}
}

// routeLoop recomputes the routes on each node change. A failed sync is
// retried on the next change or after a few seconds.
func (s *Source) routeLoop(ctx context.Context) {
	own, _ := netip.ParsePrefix(s.ownPodCIDR())
	var last []Route
	s.kickRoutes()
	retry := make(<-chan struct{})
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.routesQ:
		case <-retry:
		}
		var nodes []*corev1.Node
		for _, o := range s.nodes.GetStore().List() {
			if n, ok := o.(*corev1.Node); ok {
				nodes = append(nodes, n)
			}
		}
		if !own.IsValid() {
			own, _ = netip.ParsePrefix(s.ownPodCIDR())
		}
		want := desiredRoutes(s.cfg.NodeName, own, nodes)
		if last != nil && slices.Equal(want, last) {
			continue
		}
		if err := s.cfg.Routes.SyncRoutes(want); err != nil {
			s.log.Error("sync node routes", "err", err)
			retry = afterChan(ctx, retryRoutes)
			last = nil
			continue
		}
		s.log.Info("node routes synced", "routes", len(want))
		last = want
	}
}

func (s *Source) ownPodCIDR() string {
	o, ok, _ := s.nodes.GetStore().GetByKey(s.cfg.NodeName)
	if !ok {
		return ""
	}
	return nodePodCIDRv4(o.(*corev1.Node))
}

// RouteProtocol marks the routes lanekit owns (rtnetlink protocol number,
// from the range unused by iproute2's rt_protos).
const RouteProtocol netlink.RouteProtocol = 0xb4

// NetlinkRoutes installs routes in a network namespace's main table.
type NetlinkRoutes struct {
	h *netlink.Handle
}

// NewNetlinkRoutes opens netlink in the namespace at path ("" = the
// caller's).
func NewNetlinkRoutes(path string) (*NetlinkRoutes, error) {
	if path == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		return &NetlinkRoutes{h: h}, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return &NetlinkRoutes{h: h}, nil
}

// Close releases the netlink handle.
func (r *NetlinkRoutes) Close() { r.h.Close() }

// SyncRoutes replaces each wanted route and deletes lanekit's others.
func (r *NetlinkRoutes) SyncRoutes(routes []Route) error {
	want := map[string]bool{}
	var errs []error
	for _, rt := range routes {
		nr := &netlink.Route{
			Dst:      prefixNet(rt.Dst),
			Gw:       net.IP(rt.Via.AsSlice()),
			Protocol: RouteProtocol,
			Table:    unix.RT_TABLE_MAIN,
		}
		if err := r.h.RouteReplace(nr); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s (node %s): %w", rt.Dst, rt.Via, rt.Node, err))
			continue
		}
		want[rt.Dst.String()] = true
	}
	have, err := r.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list routes: %w", err))...)
	}
	for _, h := range have {
		if h.Dst == nil || want[h.Dst.String()] {
			continue
		}
		if err := r.h.RouteDel(&h); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", h.Dst, err))
		}
	}
	return errors.Join(errs...)
}

// Routes lists the routes lanekit installed.
func (r *NetlinkRoutes) Routes() ([]Route, error) {
	have, err := r.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	var out []Route
	for _, h := range have {
		if h.Dst == nil {
			continue
		}
		dst, _ := netip.ParsePrefix(h.Dst.String())
		via, _ := netip.AddrFromSlice(h.Gw)
		via = via.Unmap()
		out = append(out, Route{Dst: dst, Via: via})
	}
	return out, nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
