package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/bench"
)

// The BIG TCP rows of `lab bench --big-tcp` (issue 42): lanekit pod to pod
// on one node (node 1's first two lanekit pods) and across nodes (node 1's
// first to node 2's), 1 and 8 streams, per family the lab has. BigTCPSwitch
// turns BIG TCP off by giving every device those rows cross (both ends of
// each pod's veth, the nodes' uplinks) the kernel's 64 KiB GSO/GRO sizes,
// and back on by restoring the sizes found.

// bigTCPStreams are the rows' stream counts (iperf3 -P).
var bigTCPStreams = []int{1, 8}

// gsoSizes are a device's GSO/GRO maximum sizes; GSO4/GRO4 are 0 when the
// kernel has no IPv4 attributes (Linux < 6.3).
type gsoSizes struct{ GSO, GRO, GSO4, GRO4 int }

func (s gsoSizes) String() string {
	return fmt.Sprintf("gso %d gro %d gso_ipv4 %d gro_ipv4 %d", s.GSO, s.GRO, s.GSO4, s.GRO4)
}

// active says whether the sizes of family ("ipv4", "ipv6") exceed 64 KiB.
func (s gsoSizes) active(family string) bool {
	if family == "ipv4" {
		return s.GSO4 > bench.BigTCPLegacySize && s.GRO4 > bench.BigTCPLegacySize
	}
	return s.GSO > bench.BigTCPLegacySize && s.GRO > bench.BigTCPLegacySize
}

// off is s with every size at 64 KiB (the IPv4 ones stay absent).
func (s gsoSizes) off() gsoSizes {
	o := gsoSizes{GSO: bench.BigTCPLegacySize, GRO: bench.BigTCPLegacySize}
	if s.GSO4 != 0 {
		o.GSO4 = bench.BigTCPLegacySize
	}
	if s.GRO4 != 0 {
		o.GRO4 = bench.BigTCPLegacySize
	}
	return o
}

// gsoDevice is a device in a named network namespace.
type gsoDevice struct {
	NS, Name string
	Found    gsoSizes // what it held before the bench touched it
}

func (d gsoDevice) String() string { return d.NS + " " + d.Name }

// netlinkIn runs f with a netlink handle in the named namespace.
func netlinkIn(name string, f func(h *netlink.Handle) error) error {
	nsh, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", name, err)
	}
	defer h.Close()
	return f(h)
}

// readGSOSizes reads device name's sizes in namespace ns.
func readGSOSizes(ns, name string) (s gsoSizes, err error) {
	err = netlinkIn(ns, func(h *netlink.Handle) error {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("%s %s: %w", ns, name, err)
		}
		la := link.Attrs()
		s = gsoSizes{GSO: int(la.GSOMaxSize), GRO: int(la.GROMaxSize), GSO4: int(la.GSOIPv4MaxSize), GRO4: int(la.GROIPv4MaxSize)}
		return nil
	})
	return s, err
}

// setGSOSizes gives device name in namespace ns the sizes s. The IPv4
// sizes come last: setting gso_max_size to 64 KiB also resets
// gso_ipv4_max_size.
func setGSOSizes(ns, name string, s gsoSizes) error {
	return netlinkIn(ns, func(h *netlink.Handle) error {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("%s %s: %w", ns, name, err)
		}
		for _, a := range []struct {
			attr string
			size int
			set  func(netlink.Link, int) error
		}{
			{"gro_max_size", s.GRO, h.LinkSetGROMaxSize},
			{"gso_max_size", s.GSO, h.LinkSetGSOMaxSize},
			{"gro_ipv4_max_size", s.GRO4, h.LinkSetGROIPv4MaxSize},
			{"gso_ipv4_max_size", s.GSO4, h.LinkSetGSOIPv4MaxSize},
		} {
			if a.size == 0 { // the kernel has no such attribute
				continue
			}
			if err := a.set(link, a.size); err != nil {
				return fmt.Errorf("%s %s: set %s %d: %w", ns, name, a.attr, a.size, err)
			}
		}
		return nil
	})
}

// BigTCPSwitch is the lab's bench.BigTCPSwitch: it switches the devices'
// sizes and reads the sending pods' from-pod counters from their agents.
type BigTCPSwitch struct {
	devices []gsoDevice
	senders map[string]bigTCPSender // client netns -> its endpoint
	touched bool
}

type bigTCPSender struct {
	socket string
	id     uint32
}

// newGSOSwitch reads the devices' sizes as found.
func newGSOSwitch(devs []gsoDevice) (*BigTCPSwitch, error) {
	sw := &BigTCPSwitch{senders: map[string]bigTCPSender{}}
	for _, d := range devs {
		s, err := readGSOSizes(d.NS, d.Name)
		if err != nil {
			return nil, err
		}
		d.Found = s
		sw.devices = append(sw.devices, d)
	}
	return sw, nil
}

// Set gives every device its sizes as found (on) or 64 KiB (off).
func (sw *BigTCPSwitch) Set(_ context.Context, on bool) error {
	var errs []error
	for _, d := range sw.devices {
		want := d.Found
		if !on {
			want = d.Found.off()
			sw.touched = true
		}
		errs = append(errs, setGSOSizes(d.NS, d.Name, want))
	}
	return errors.Join(errs...)
}

// Restore gives every device its sizes as found, if Set ever changed them.
func (sw *BigTCPSwitch) Restore() error {
	if !sw.touched {
		return nil
	}
	if err := sw.Set(context.Background(), true); err != nil {
		return fmt.Errorf("big tcp: restore the devices' GSO/GRO sizes: %w", err)
	}
	sw.touched = false
	return nil
}

// setup says, per family, whether every device had BIG TCP sizes.
func (sw *BigTCPSwitch) setup(families []string) bench.BigTCPSetup {
	st := bench.BigTCPSetup{Active: map[string]bool{}}
	for _, d := range sw.devices {
		st.Devices = append(st.Devices, d.String()+": "+d.Found.String())
	}
	for _, f := range families {
		var off []string
		for _, d := range sw.devices {
			if !d.Found.active(f) {
				off = append(off, d.String())
			}
		}
		st.Active[f] = len(off) == 0
		if len(off) > 0 {
			st.Why = append(st.Why, fmt.Sprintf("%s: BIG TCP was not active: 64 KiB or less on %s", f, strings.Join(off, ", ")))
		}
	}
	return st
}

// SenderCounters reads the from-pod counters of c's sending pod.
func (sw *BigTCPSwitch) SenderCounters(ctx context.Context, c bench.BigTCPCase) (uint64, uint64, error) {
	s, ok := sw.senders[c.Path.ClientNS]
	if !ok {
		return 0, 0, fmt.Errorf("no endpoint known for %s", c.Path.ClientNS)
	}
	eps, err := agentEndpoints(ctx, s.socket)
	if err != nil {
		return 0, 0, err
	}
	for _, ep := range eps {
		if ep.GetId() == s.id {
			return ep.GetCounters().GetFromPackets(), ep.GetCounters().GetFromBytes(), nil
		}
	}
	return 0, 0, fmt.Errorf("endpoint %d of %s is gone", s.id, c.Path.ClientNS)
}

func agentEndpoints(ctx context.Context, socket string) ([]*apiv1.Endpoint, error) {
	c, closeFn, err := agentClient(socket)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.ListEndpoints(cctx, &apiv1.ListEndpointsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list endpoints at %s: %w", socket, err)
	}
	return resp.GetEndpoints(), nil
}

// podEndpoint finds the agent's endpoint of pod p (by its address).
func podEndpoint(eps []*apiv1.Endpoint, p Pod) (*apiv1.Endpoint, error) {
	want, err := netip.ParseAddr(p.IP)
	if err != nil {
		return nil, fmt.Errorf("pod %s: address %q: %w", p.NS, p.IP, err)
	}
	for _, ep := range eps {
		for _, ipc := range ep.GetIps() {
			if pfx, err := netip.ParsePrefix(ipc.GetAddress()); err == nil && pfx.Addr() == want {
				if len(ep.GetInterfaces()) < 2 {
					return nil, fmt.Errorf("pod %s: endpoint %d has %d interfaces, want the host and pod ends", p.NS, ep.GetId(), len(ep.GetInterfaces()))
				}
				return ep, nil
			}
		}
	}
	return nil, fmt.Errorf("pod %s (%s): no endpoint on its agent", p.NS, p.IP)
}

// BigTCPRows returns the BIG TCP cases of the lab, the switch for their
// devices (holding their sizes as found: the caller must Restore it, also
// on failure) and what the devices held. skipped lists the cases the lab
// cannot offer.
func (s *State) BigTCPRows(ctx context.Context) ([]bench.BigTCPCase, *BigTCPSwitch, bench.BigTCPSetup, []string, error) {
	var none bench.BigTCPSetup
	if s.BaselineOnly || len(s.Nodes) == 0 {
		return nil, nil, none, nil, errors.New("big tcp rows: need a lanekit lab")
	}
	type pair struct {
		placement string
		from, to  Pod
		nodes     []Node
	}
	var pairs []pair
	var skipped []string
	n1 := s.Nodes[0]
	pods1 := lanekitPods(n1)
	switch {
	case len(pods1) >= 2:
		pairs = append(pairs, pair{"same-node", pods1[0], pods1[1], []Node{n1}})
	default:
		skipped = append(skipped, fmt.Sprintf("same-node rows: %s has %d lanekit pods (lab up --pods-per-node 2)", n1.NS, len(pods1)))
	}
	if len(s.Nodes) >= 2 {
		if pods2 := lanekitPods(s.Nodes[1]); len(pods1) > 0 && len(pods2) > 0 {
			pairs = append(pairs, pair{"cross-node", pods1[0], pods2[0], []Node{n1, s.Nodes[1]}})
		} else {
			skipped = append(skipped, fmt.Sprintf("cross-node rows: no lanekit pods on %s and %s", n1.NS, s.Nodes[1].NS))
		}
	} else {
		skipped = append(skipped, "cross-node rows: the lab has 1 node")
	}
	if len(pairs) == 0 {
		return nil, nil, none, skipped, errors.New("big tcp rows: no lanekit pod pairs")
	}
	// Every device the pairs cross, each once, and the senders' endpoints.
	var devs []gsoDevice
	seen := map[string]bool{}
	addDev := func(d gsoDevice) {
		if !seen[d.String()] {
			seen[d.String()] = true
			devs = append(devs, d)
		}
	}
	senders := map[string]bigTCPSender{}
	var detail string
	for _, p := range pairs {
		for k, pod := range []Pod{p.from, p.to} {
			node := p.nodes[min(k, len(p.nodes)-1)]
			sock := AgentSocket(node.Index)
			eps, err := agentEndpoints(ctx, sock)
			if err != nil {
				return nil, nil, none, skipped, err
			}
			ep, err := podEndpoint(eps, pod)
			if err != nil {
				return nil, nil, none, skipped, err
			}
			addDev(gsoDevice{NS: node.NS, Name: Uplink})
			addDev(gsoDevice{NS: node.NS, Name: ep.GetInterfaces()[0].GetName()})
			addDev(gsoDevice{NS: pod.NS, Name: ep.GetInterfaces()[1].GetName()})
			if k == 0 {
				senders[pod.NS] = bigTCPSender{socket: sock, id: ep.GetId()}
			}
			if detail == "" {
				detail = agentBigTCP(ctx, sock)
			}
		}
	}
	sw, err := newGSOSwitch(devs)
	if err != nil {
		return nil, nil, none, skipped, err
	}
	sw.senders = senders
	var cases []bench.BigTCPCase
	families := map[string]bool{}
	for _, p := range pairs {
		addrs := [][2]string{{"ipv4", p.to.IP}}
		if p.from.IP6 != "" && p.to.IP6 != "" {
			addrs = append(addrs, [2]string{"ipv6", p.to.IP6})
		}
		for _, a := range addrs {
			families[a[0]] = true
			for _, n := range bigTCPStreams {
				cases = append(cases, bench.BigTCPCase{Placement: p.placement, Family: a[0], Streams: n,
					Path: bench.Path{Name: "lanekit-pod", ClientNS: p.from.NS, ServerNS: p.to.NS, ServerIP: a[1]}})
			}
		}
	}
	var fams []string
	for _, f := range []string{"ipv4", "ipv6"} {
		if families[f] {
			fams = append(fams, f)
		}
	}
	setup := sw.setup(fams)
	setup.Detail = detail
	// The wire's ports (not switched): a lab brought up by an older lanekit
	// left them at 64 KiB, and its switch then segments the cross-node
	// rows' BIG TCP packets in software (topology.go: wireBIGTCP).
	for _, n := range s.Nodes[:min(2, len(s.Nodes))] {
		port := fmt.Sprintf("lk-w%d", n.Index)
		found, err := readGSOSizes(WireNS, port)
		if err != nil {
			continue // a DPU's port, or no wire
		}
		line := fmt.Sprintf("%s %s (the wire, not switched): %s", WireNS, port, found)
		if !found.active("ipv6") {
			line += ": at 64 KiB the lab's switch segments BIG TCP packets in software (a lab from an older lanekit: lab down, lab up)"
		}
		setup.Devices = append(setup.Devices, line)
	}
	return cases, sw, setup, skipped, nil
}

// agentBigTCP is the agent's BIG TCP status line (best effort).
func agentBigTCP(ctx context.Context, sock string) string {
	c, closeFn, err := agentClient(sock)
	if err != nil {
		return ""
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(cctx, &apiv1.StatusRequest{})
	if err != nil {
		return ""
	}
	b := st.GetRouting().GetBigTcp()
	return fmt.Sprintf("IPv4 %d, IPv6 %d (%s)", b.GetIpv4MaxSize(), b.GetIpv6MaxSize(), b.GetDetail())
}

// lanekitPods are node n's lanekit pods with an address.
func lanekitPods(n Node) []Pod {
	var out []Pod
	for _, p := range n.Pods {
		if p.Kind == KindLanekit && p.IP != "" {
			out = append(out, p)
		}
	}
	return out
}
