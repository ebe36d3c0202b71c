package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/store"
)

// Error classes; the gRPC server maps them to status codes, the CNI plugin
// to CNI error codes.
var (
	ErrInvalid  = errors.New("invalid request")
	ErrNotFound = errors.New("unknown attachment")
	ErrConflict = errors.New("attachment conflict")
	ErrBadNetns = errors.New("bad network namespace")
	// ErrNotReady: the node cannot serve the request as deployed (no
	// lanekit-vhost binary for a VM attachment, say).
	ErrNotReady = errors.New("not ready")
	// ErrUnavailable: something the request needs cannot be read now (the
	// API server); retry.
	ErrUnavailable = errors.New("unavailable")
	ErrExhausted   = ipam.ErrExhausted
	// ErrPolicyFull: the policy maps have no room to police a new endpoint
	// (capacity.go); the ADD is refused rather than leave it unpoliced.
	ErrPolicyFull = errors.New("policy map full")
	// ErrDatapathPending: the objects are stored (the control plane has
	// them), but the datapath refused part of the update; the agent retries
	// that part in the background (applyServices), the rest is programmed.
	ErrDatapathPending = errors.New("stored, but the datapath failed (retried in the background)")
)

// AddRequest asks for an endpoint.
type AddRequest struct {
	Kind        endpoint.Kind
	ContainerID string
	IfName      string
	Netns       string
	Network     string
	MTU         int
	Subnet      string
	Labels      map[string]string
}

func (a *Agent) validateAdd(req *AddRequest) error {
	if req.Kind == "" {
		req.Kind = endpoint.KindPod
	}
	if req.Kind != endpoint.KindPod {
		return fmt.Errorf("endpoint kind %q is not supported yet: %w", req.Kind, ErrInvalid)
	}
	if err := endpoint.Validate(req.ContainerID, req.IfName); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if err := a.devs.CheckNetns(req.Netns); err != nil {
		return fmt.Errorf("%w: %w", err, ErrBadNetns)
	}
	if req.MTU == 0 {
		req.MTU = a.mtu
	}
	if req.MTU < 68 || req.MTU > 65535 {
		return fmt.Errorf("mtu %d out of range 68-65535: %w", req.MTU, ErrInvalid)
	}
	if req.Subnet != "" {
		sub, err := netip.ParsePrefix(req.Subnet)
		if err != nil {
			return fmt.Errorf("subnet %q: %w: %w", req.Subnet, err, ErrInvalid)
		}
		pod := a.pool().Prefix()
		if sub.Bits() > pod.Bits() || !sub.Masked().Contains(pod.Addr()) {
			return fmt.Errorf("subnet %s conflicts with this node's pod CIDR %s: %w", sub, pod, ErrInvalid)
		}
	}
	return nil
}

// lookup returns the endpoint stored under key.
func (a *Agent) lookup(key string) (endpoint.Endpoint, bool, error) {
	var ep endpoint.Endpoint
	var ok bool
	err := a.st.View(func(tx *store.Tx) error {
		var err error
		ok, err = tx.Get(store.Endpoints, []byte(key), &ep)
		return err
	})
	if err != nil {
		return ep, false, fmt.Errorf("look up %s: %w", key, err)
	}
	return ep, ok, nil
}

// allocIDTx reserves the lowest free endpoint ID (> 0) for key.
func allocIDTx(tx *store.Tx, key string) (uint32, error) {
	next := uint32(1)
	stop := errors.New("stop")
	err := tx.ForEach(store.EndpointIDs, func(k []byte, _ json.RawMessage) error {
		if len(k) != 4 {
			return nil
		}
		id := uint32(k[0])<<24 | uint32(k[1])<<16 | uint32(k[2])<<8 | uint32(k[3])
		if id > next {
			return stop
		}
		if id == next {
			next++
		}
		return nil
	})
	if err != nil && !errors.Is(err, stop) {
		return 0, fmt.Errorf("allocate endpoint id: %w", err)
	}
	if next == 0 {
		return 0, errors.New("allocate endpoint id: all ids in use")
	}
	if err := tx.Put(store.EndpointIDs, endpoint.IDKey(next), key); err != nil {
		return 0, fmt.Errorf("allocate endpoint id: %w", err)
	}
	return next, nil
}

// Add creates the endpoint for req, or returns the existing one for the same
// attachment and netns. On failure everything done so far is undone.
func (a *Agent) Add(req AddRequest) (added *endpoint.Endpoint, err error) {
	created := false
	defer func() {
		if err != nil {
			return
		}
		a.endpointsChanged()
		if !created {
			return
		}
		if full := a.unpoliced(added); full != "" { // capacity.go
			if _, derr := a.Del(req.ContainerID, req.IfName); derr != nil {
				a.log.Error("undo an ADD the policy maps have no room for", "attachment", endpoint.Key(req.ContainerID, req.IfName), "err", derr)
			}
			added, err = nil, fmt.Errorf("add %s: %s: %w", endpoint.Key(req.ContainerID, req.IfName), full, ErrPolicyFull)
		}
	}()
	if err := a.validateAdd(&req); err != nil {
		return nil, fmt.Errorf("add %s/%s: %w", req.ContainerID, req.IfName, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := endpoint.Key(req.ContainerID, req.IfName)
	if ep, ok, err := a.lookup(key); err != nil {
		return nil, fmt.Errorf("add %s: %w", key, err)
	} else if ok {
		if ep.Netns != req.Netns {
			return nil, fmt.Errorf("add %s: exists in netns %s, asked for %s: %w", key, ep.Netns, req.Netns, ErrConflict)
		}
		return &ep, nil
	}

	var undo undoStack
	defer func() { err = undo.unwind(err, a.log.With("attachment", key)) }()

	// Intent first: the pending record owns the address, the ID and the
	// device name before anything exists on the node, so a crash at any later
	// step leaves a record the next agent rolls back.
	hostIf := endpoint.HostIfName(req.ContainerID, req.IfName)
	ep := endpoint.Endpoint{
		Kind: req.Kind, ContainerID: req.ContainerID, IfName: req.IfName, Netns: req.Netns,
		Network: req.Network, Mode: a.mode, HostIfName: hostIf, MTU: req.MTU, Labels: req.Labels,
		Created: time.Now().UTC(), Pending: true,
	}
	err = a.st.Update(func(tx *store.Tx) error {
		var err error
		if ep.IP, err = a.allocIPv4Tx(tx, key); err != nil { // ipv6.go
			return err
		}
		if ep.IP6, err = a.allocIPv6Tx(tx, key); err != nil {
			return err
		}
		if ep.ID, err = allocIDTx(tx, key); err != nil {
			return err
		}
		return tx.Put(store.Endpoints, []byte(key), ep)
	})
	if err != nil {
		return nil, fmt.Errorf("add %s: %w", key, err)
	}
	undo = append(undo, func() error { return a.forget(key, ep.ID) })
	crashAt(StepIntent)

	// A device with our name and no record is left from a crash mid-ADD.
	if err := a.devs.DeletePod(hostIf); err != nil {
		return nil, fmt.Errorf("add %s: remove stale device: %w", key, err)
	}
	links, err := a.devs.SetupPod(netdev.PodSpec{
		Mode: a.mode, HostIfName: hostIf, IfName: req.IfName, Netns: req.Netns, IP: ep.IP, IP6: ep.IP6, MTU: req.MTU,
		BIGTCP: a.bigTCP.Sizes, CongestionControl: a.cfg.PodCongestionControl,
	})
	if err != nil {
		return nil, fmt.Errorf("add %s: %w", key, err)
	}
	undo = append(undo, func() error { return a.devs.DeletePod(hostIf) })
	crashAt(StepDevice)

	ep.HostIfIndex, ep.IfIndex = links.HostIfIndex, links.IfIndex
	if links.HostMAC != nil {
		ep.HostMAC = links.HostMAC.String()
	}
	if links.MAC != nil {
		ep.MAC = links.MAC.String()
	}
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(key), ep) }); err != nil {
		return nil, fmt.Errorf("add %s: record devices: %w", key, err)
	}
	crashAt(StepRecorded)

	dpEp, err := a.dpEndpoint(&ep)
	if err != nil {
		return nil, fmt.Errorf("add %s: %w", key, err)
	}
	if err := a.host.Do(func() error { return a.dp.UpsertEndpoint(dpEp) }); err != nil {
		return nil, fmt.Errorf("add %s: program datapath: %w", key, err)
	}
	undo = append(undo, func() error { return a.host.Do(func() error { return a.dp.DeleteEndpoint(dpEp) }) })
	crashAt(StepDatapath)

	ep.Pending = false
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(key), ep) }); err != nil {
		return nil, fmt.Errorf("add %s: store endpoint: %w", key, err)
	}
	crashAt(StepCommitted)
	a.log.Info("endpoint added", "id", ep.ID, "attachment", key, "ip", ep.IP, "dev", hostIf, "mode", a.mode)
	created = true
	return &ep, nil
}

// Del removes the endpoint for containerID/ifname. Unknown attachments, a
// missing netns and missing devices are success; existed reports whether
// there was a record.
func (a *Agent) Del(containerID, ifname string) (existed bool, err error) {
	defer func() {
		if err == nil {
			a.endpointsChanged()
		}
	}()
	if err := endpoint.Validate(containerID, ifname); err != nil {
		return false, fmt.Errorf("del %s/%s: %w: %w", containerID, ifname, err, ErrInvalid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := endpoint.Key(containerID, ifname)
	if ep, ok, err := a.lookup(key); err != nil {
		return false, fmt.Errorf("del %s: %w", key, err)
	} else if ok && ep.Kind == endpoint.KindVM {
		return false, fmt.Errorf("del %s: a vm endpoint, delete it with DelVM: %w", key, ErrConflict)
	}
	return a.del(key, endpoint.HostIfName(containerID, ifname))
}

func (a *Agent) del(key, hostIf string) (bool, error) {
	ep, ok, err := a.lookup(key)
	if err != nil {
		return false, fmt.Errorf("del %s: %w", key, err)
	}
	if ok {
		dpEp, err := a.dpEndpoint(&ep)
		if err != nil {
			return true, fmt.Errorf("del %s: %w", key, err)
		}
		if err := a.host.Do(func() error { return a.dp.DeleteEndpoint(dpEp) }); err != nil {
			return true, fmt.Errorf("del %s: datapath: %w", key, err)
		}
		hostIf = ep.HostIfName
	}
	if err := a.devs.DeletePod(hostIf); err != nil {
		return ok, fmt.Errorf("del %s: %w", key, err)
	}
	if err := a.forget(key, ep.ID); err != nil {
		return ok, fmt.Errorf("del %s: %w", key, err)
	}
	if _, err := a.freeIDsOf(key); err != nil {
		return ok, fmt.Errorf("del %s: %w", key, err)
	}
	if ok {
		a.log.Info("endpoint deleted", "id", ep.ID, "attachment", key, "ip", ep.IP)
	}
	return ok, nil
}

// freeIDsOf removes ID reservations held by key (left by a crash mid-ADD).
func (a *Agent) freeIDsOf(key string) (int, error) {
	n := 0
	err := a.st.Update(func(tx *store.Tx) error {
		var ks [][]byte
		err := tx.ForEach(store.EndpointIDs, func(k []byte, raw json.RawMessage) error {
			var owner string
			if json.Unmarshal(raw, &owner) == nil && owner == key {
				ks = append(ks, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range ks {
			if err := tx.Delete(store.EndpointIDs, k); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// Check verifies the endpoint for containerID/ifname: devices, address,
// routes and the datapath entry.
func (a *Agent) Check(containerID, ifname, netns string) (*endpoint.Endpoint, error) {
	if err := endpoint.Validate(containerID, ifname); err != nil {
		return nil, fmt.Errorf("check %s/%s: %w: %w", containerID, ifname, err, ErrInvalid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := endpoint.Key(containerID, ifname)
	ep, ok, err := a.lookup(key)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", key, err)
	}
	if !ok {
		return nil, fmt.Errorf("check %s: %w", key, ErrNotFound)
	}
	if netns != "" && netns != ep.Netns {
		return nil, fmt.Errorf("check %s: endpoint is in netns %s, not %s: %w", key, ep.Netns, netns, ErrConflict)
	}
	if err := a.devs.CheckNetns(ep.Netns); err != nil {
		return nil, fmt.Errorf("check %s: %w: %w", key, err, ErrBadNetns)
	}
	links := netdev.PodLinks{HostIfIndex: ep.HostIfIndex, IfIndex: ep.IfIndex}
	if ep.MAC != "" {
		if links.MAC, err = net.ParseMAC(ep.MAC); err != nil {
			return nil, fmt.Errorf("check %s: stored mac: %w", key, err)
		}
	}
	spec := netdev.PodSpec{Mode: ep.Mode, HostIfName: ep.HostIfName, IfName: ep.IfName, Netns: ep.Netns, IP: ep.IP, IP6: ep.IP6, MTU: ep.MTU}
	if err := a.devs.CheckPod(spec, links); err != nil {
		return nil, fmt.Errorf("check %s: %w", key, err)
	}
	ids, err := a.dp.Endpoints()
	if err != nil {
		return nil, fmt.Errorf("check %s: list datapath endpoints: %w", key, err)
	}
	if !slices.Contains(ids, ep.ID) {
		return nil, fmt.Errorf("check %s: endpoint %d missing from the datapath", key, ep.ID)
	}
	return &ep, nil
}

// List returns every endpoint, by ID (ADDs in progress excluded).
func (a *Agent) List() ([]endpoint.Endpoint, error) {
	eps, err := a.endpoints()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(eps, func(ep endpoint.Endpoint) bool { return ep.Pending }), nil
}

// Counters returns what the datapath counted for endpoint id.
func (a *Agent) Counters(id uint32) (datapath.Counters, error) { return a.dp.Counters(id) }

// CountersOf returns the counters of each id, looked up directly per
// endpoint: the datapath's lock is held for one endpoint's keys at a time,
// and the cost grows with the endpoints listed, not with the map.
func (a *Agent) CountersOf(ids []uint32) (map[uint32]datapath.Counters, error) {
	out := make(map[uint32]datapath.Counters, len(ids))
	for _, id := range ids {
		c, err := a.dp.Counters(id)
		if err != nil {
			return nil, err
		}
		out[id] = c
	}
	return out, nil
}

// Attachment is a container ID + ifname pair.
type Attachment struct{ ContainerID, IfName string }

// GC deletes every endpoint whose attachment is not in valid and frees
// orphaned addresses. It returns the attachments it removed.
func (a *Agent) GC(valid []Attachment) ([]Attachment, error) {
	keep := map[string]bool{}
	for _, v := range valid {
		keep[endpoint.Key(v.ContainerID, v.IfName)] = true
	}
	defer a.endpointsChanged()
	a.mu.Lock()
	defer a.mu.Unlock()
	eps, err := a.endpoints()
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	var removed []Attachment
	var errs []error
	for _, ep := range eps {
		if ep.Kind == endpoint.KindVM {
			// VMs added by name are not CNI attachments: only DelVM
			// removes them. VM attachments go with their attachment.
			at := vmAttachmentOf(&ep)
			if at == nil || keep[endpoint.Key(at.ContainerID, at.IfName)] || ep.Pending {
				continue
			}
			if _, err := a.delVM(ep.VM.Name); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, Attachment{at.ContainerID, at.IfName})
			continue
		}
		if keep[ep.Key()] {
			continue
		}
		if _, err := a.del(ep.Key(), ep.HostIfName); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, Attachment{ep.ContainerID, ep.IfName})
	}
	if _, err := a.freeOrphans(keep); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("gc: %w", err)
	}
	a.log.Info("gc", "valid", len(valid), "removed", len(removed))
	return removed, nil
}

// StatusInfo is what Status reports.
type StatusInfo struct {
	Version          string
	Backend          string
	DeviceMode       datapath.DeviceMode
	DeviceModeReason string
	Features         netdev.Features
	PodCIDR          netip.Prefix
	Endpoints        int
	IPsAllocated     int
	IPsCapacity      int
	// Ready is whether the datapath is loaded and forwarding; otherwise
	// NotReadyReason says why.
	Ready          bool
	NotReadyReason string
	// Counter map use: at capacity, new counters are not recorded.
	MetricsEntries, MetricsCapacity int
	// Counter updates the datapath could not record (counter map full).
	MetricsLost uint64
	// Routing: native or tunnel, the tunnel's node map and counters, the
	// probed encryption facilities (tunnel.go).
	Routing RoutingInfo
}

// healthChecker is a datapath that can tell whether it still forwards.
type healthChecker interface{ Health() error }

// metricsUsage is a datapath whose counter map can fill up.
type metricsUsage interface {
	MetricsUsage() (entries, capacity int, lost uint64, err error)
}

// ready reports whether the agent can serve endpoints: its datapath is
// open and, when it can tell, loaded and attached.
func (a *Agent) ready() (bool, string) {
	if a.dp == nil {
		return false, "datapath not open"
	}
	if hc, ok := a.dp.(healthChecker); ok {
		var err error
		a.host.Do(func() error { err = hc.Health(); return nil })
		if err != nil {
			return false, "datapath not loaded: " + err.Error()
		}
	}
	if why := a.restoring(); why != "" { // restore.go
		return false, why
	}
	a.readyMu.Lock()
	checks := slices.Clone(a.readyChecks)
	a.readyMu.Unlock()
	for _, c := range checks {
		if err := c.check(); err != nil {
			return false, c.name + ": " + err.Error()
		}
	}
	return true, ""
}

// readyCheck is a readiness condition beyond the datapath's.
type readyCheck struct {
	name  string
	check func() error
}

// AddReadyCheck makes readiness (Status, /readyz, CNI STATUS) also require
// check to return nil; name prefixes the reason otherwise. The Kubernetes
// source adds "k8s caches synced".
func (a *Agent) AddReadyCheck(name string, check func() error) {
	a.readyMu.Lock()
	defer a.readyMu.Unlock()
	a.readyChecks = append(a.readyChecks, readyCheck{name, check})
}

// Status reports the agent's configuration, probes and counts.
func (a *Agent) Status() (StatusInfo, error) {
	s := StatusInfo{
		Version: Version, Backend: a.backend, DeviceMode: a.mode, DeviceModeReason: a.modeReason,
		Features: a.features, PodCIDR: a.pool().Prefix(), IPsCapacity: a.pool().Capacity(),
	}
	s.Ready, s.NotReadyReason = a.ready()
	s.Routing = a.routingInfo()
	if mu, ok := a.dp.(metricsUsage); ok {
		var err error
		if s.MetricsEntries, s.MetricsCapacity, s.MetricsLost, err = mu.MetricsUsage(); err != nil {
			return s, fmt.Errorf("status: %w", err)
		}
	}
	eps, err := a.List() // ADDs in progress are not endpoints yet
	if err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	s.Endpoints = len(eps)
	err = a.st.View(func(tx *store.Tx) error {
		var err error
		s.IPsAllocated, err = tx.Count(store.IPAM)
		return err
	})
	if err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	return s, nil
}

// undoStack collects what an ADD did, to take it back in reverse order when
// a later step fails.
type undoStack []func() error

// unwind runs the stack when err is set and returns err joined with whatever
// could not be undone.
func (u undoStack) unwind(err error, log *slog.Logger) error {
	if err == nil {
		return nil
	}
	for i := len(u) - 1; i >= 0; i-- {
		if uerr := u[i](); uerr != nil {
			log.Error("undo failed add", "err", uerr)
			err = errors.Join(err, fmt.Errorf("undo: %w", uerr))
		}
	}
	return err
}
