package observe

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/metrics"
)

// EndpointLister is the agent's endpoint list (*agent.Agent).
type EndpointLister interface {
	List() ([]endpoint.Endpoint, error)
}

// Name is an endpoint as events show it.
type Name struct {
	ID     uint32
	Name   string // "namespace/pod", "pod", the VM name; empty when unknown
	Kind   string // "pod", "vm"
	IfName string // host-side device
}

func (n Name) String() string {
	switch {
	case n.ID == 0:
		return "-"
	case n.Name == "":
		return fmt.Sprintf("(ep %d)", n.ID)
	}
	return fmt.Sprintf("%s (ep %d)", n.Name, n.ID)
}

// matches says whether s names this endpoint: its id, full name, bare
// name (pod without namespace) or host device name.
func (n Name) matches(s string) bool {
	if n.ID == 0 {
		return false
	}
	if id, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(id) == n.ID
	}
	if n.Name == "" {
		return false
	}
	_, bare, _ := strings.Cut(n.Name, "/")
	return s == n.Name || s == bare || s == n.IfName
}

// Flow is an event with its endpoints named.
type Flow struct {
	datapath.Event
	Endpoint Name // dropped: the endpoint charged; forwarded: the sender
	Peer     Name // forwarded: the local receiver
	IfName   string
}

func (f *Flow) involves(s string) bool { return f.Endpoint.matches(s) || f.Peer.matches(s) }

// resolver caches endpoint names by id and host ifindex, refreshed from the
// agent when an unknown id shows up (at most once a second).
type resolver struct {
	src EndpointLister

	mu        sync.Mutex
	byID      map[uint32]Name
	ifnames   map[uint32]string
	refreshed time.Time
}

func newResolver(src EndpointLister) *resolver {
	return &resolver{src: src, byID: map[uint32]Name{}, ifnames: map[uint32]string{}}
}

// refresh reloads the list (force, or when the last load is old enough).
func (r *resolver) refresh(force bool) {
	if r.src == nil {
		return
	}
	r.mu.Lock()
	if !force && time.Since(r.refreshed) < time.Second {
		r.mu.Unlock()
		return
	}
	r.refreshed = time.Now()
	r.mu.Unlock()
	eps, err := r.src.List()
	if err != nil {
		return
	}
	byID := make(map[uint32]Name, len(eps))
	ifnames := make(map[uint32]string, len(eps))
	for _, ep := range eps {
		name, ns := metrics.EndpointLabels(ep)
		if ns != "" {
			name = ns + "/" + name
		}
		byID[ep.ID] = Name{ID: ep.ID, Name: name, Kind: string(ep.Kind), IfName: ep.HostIfName}
		if ep.HostIfIndex > 0 {
			ifnames[uint32(ep.HostIfIndex)] = ep.HostIfName
		}
	}
	r.mu.Lock()
	r.byID, r.ifnames = byID, ifnames
	r.mu.Unlock()
}

func (r *resolver) name(id uint32) Name {
	if id == 0 {
		return Name{}
	}
	r.mu.Lock()
	n, ok := r.byID[id]
	r.mu.Unlock()
	if !ok {
		r.refresh(false)
		r.mu.Lock()
		n, ok = r.byID[id]
		r.mu.Unlock()
		if !ok {
			n = Name{ID: id}
		}
	}
	return n
}

func (r *resolver) flow(ev datapath.Event) *Flow {
	fl := &Flow{Event: ev, Endpoint: r.name(ev.EndpointID), Peer: r.name(ev.PeerID)}
	// A VM's drops happen on its device inside its own netns, where the
	// ifindex means nothing to the node: only pod host ends are named.
	if ev.Kind != datapath.EventDrop || fl.Endpoint.Kind != string(endpoint.KindVM) {
		r.mu.Lock()
		fl.IfName = r.ifnames[ev.IfIndex]
		r.mu.Unlock()
	}
	return fl
}
