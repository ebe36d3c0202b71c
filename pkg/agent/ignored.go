package agent

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// Addresses the service translation leaves out on purpose (service/guard.go):
// a hostPort whose hostIP is not this node's, a spec.externalIPs address
// outside --external-ips, a Service or hostPort port of a protocol lanekit
// does not load-balance (SCTP). The agent has no event recorder, so each is
// logged once (when it first is, not on every resync; an object's SCTP ports
// in one line) and counted in ControlStats.

// noteIgnored records what the edited pods and Services have ignored now
// (replacing what they had), logging the addresses that were not ignored
// before. A removed object's edit (no Pod, no Service) forgets it; after a
// full build (all: edits has every object) so does an object without one.
// Called with c.mu.
func (c *ctlPlane) noteIgnored(edits []service.Edit, all bool) {
	if c.ignored == nil {
		c.ignored = map[service.ServiceID][]service.Ignored{}
	}
	if all {
		maps.DeleteFunc(c.ignored, func(id service.ServiceID, _ []service.Ignored) bool {
			return !slices.ContainsFunc(edits, func(e service.Edit) bool { return e.ID == id })
		})
	}
	for _, e := range edits {
		var now []service.Ignored
		switch {
		case e.Pod != nil:
			now = service.HostPortsIgnored(e.Pod, c.svcOpts)
		case e.Service != nil:
			now = service.ServiceIgnored(e.Service, c.svcOpts)
		}
		before := c.ignored[e.ID]
		var protoPorts []string // one line per object for all its ports of another protocol
		for _, g := range now {
			if slices.Contains(before, g) {
				continue
			}
			switch g.Reason {
			case service.ReasonProtocolUnsupported:
				protoPorts = append(protoPorts, g.String())
			case service.ReasonHostIPNotNode:
				c.log.Warn("hostPort not programmed: its hostIP is not an address of this node",
					"pod", ignoredObject(e.ID), "hostPort", g.String())
			default:
				c.log.Warn("externalIP not programmed: outside --external-ips",
					"service", e.ID.String(), "externalIP", g.String(), "allowed", c.svcOpts.ExternalIPs.String())
			}
		}
		if len(protoPorts) > 0 {
			c.log.Warn("ports not load-balanced: lanekit serves TCP and UDP ports only (the object's other ports are served)",
				"object", ignoredObject(e.ID), "ports", strings.Join(protoPorts, ","))
		}
		if len(now) == 0 {
			delete(c.ignored, e.ID)
		} else {
			c.ignored[e.ID] = now
		}
	}
}

// ignoredObject names the object of an ignored address: "pod NS/NAME" for
// hostPorts, else "service NS/NAME".
func ignoredObject(id service.ServiceID) string {
	if id.IsHostPort() {
		return "pod " + id.Namespace + "/" + strings.TrimPrefix(id.Name, service.HostPortPrefix)
	}
	return "service " + id.String()
}

// allEdits returns an edit for every Service and every pod with hostPorts
// in objs, for noteIgnored after a full build.
func allEdits(objs map[string]k8sobj.Object) []service.Edit {
	var edits []service.Edit
	for _, o := range objs {
		switch {
		case o.Service != nil:
			edits = append(edits, service.Edit{ID: service.ServiceID{Namespace: o.Service.Namespace, Name: o.Service.Name}, Service: o.Service})
		case o.Pod != nil && service.HasHostPorts(o.Pod):
			edits = append(edits, service.Edit{ID: service.HostPortID(o.Pod), Pod: o.Pod})
		}
	}
	return edits
}

// ignoredByReason counts the ignored addresses by reason. Called with c.mu.
func (c *ctlPlane) ignoredByReason() map[string]int {
	out := map[string]int{}
	for _, gs := range c.ignored {
		for _, g := range gs {
			out[g.Reason]++
		}
	}
	return out
}

// syncServiceHostAddrs gives the service translation the node's current
// addresses: when they changed, every pod's hostPorts are translated again,
// so a hostIP that became (or stopped being) this node's gains (or loses) its
// frontend at this resync.
func (a *Agent) syncServiceHostAddrs(addrs []netip.Addr) {
	c := a.ctl
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Equal(c.svcOpts.HostAddrs, addrs) {
		return
	}
	old := c.svcOpts
	host4, host6 := c.hostAddrCounts()
	c.svcOpts.HostAddrs = slices.Clone(addrs)
	m, err := c.buildModel(c.objs)
	if err != nil { // the objects were accepted: they translate
		c.svcOpts = old
		a.log.Error("node addresses changed, but the services no longer translate; keeping the old ones", "err", err)
		return
	}
	ch := service.Diff(c.model, m)
	c.model = m
	if err := a.applyServices(c.tables.Apply(ch)); err != nil {
		a.log.Warn("node addresses changed: service update (retried in the background)", "err", err)
	}
	a.log.Info("node addresses for hostPorts", "addrs", addrs, "frontends", len(ch.Upserted), "removed", len(ch.Removed))
	if n4, n6 := c.hostAddrCounts(); (n4 != host4 || n6 != host6) && c.compiled != nil {
		// The ipcache's room for endpoints changed (capacity.go).
		if err := a.recompileLocked(); err != nil {
			a.log.Warn("node addresses changed: policy update (retried in the background)", "err", err)
		}
	}
}

// Ignored returns the addresses the service translation leaves out on
// purpose, by Service (or a pod's hostPorts: service.HostPortID).
func (a *Agent) Ignored() map[service.ServiceID][]service.Ignored {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.ignored)
}
