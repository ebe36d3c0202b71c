package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

func (ep Endpoint) validate() error {
	switch {
	case ep.ID == 0:
		return errors.New("endpoint id must be > 0")
	case ep.IfIndex <= 0:
		return fmt.Errorf("endpoint %d: bad ifindex %d", ep.ID, ep.IfIndex)
	case ep.IfName == "":
		return fmt.Errorf("endpoint %d: no host device name", ep.ID)
	case ep.IP.IsValid() && !ep.IP.Is4(), !ep.IP.IsValid() && !ep.IP6.IsValid():
		// No IPv4 address: an endpoint of an IPv6-only node.
		return fmt.Errorf("endpoint %d: %v is not an IPv4 address", ep.ID, ep.IP)
	case ep.IP6.IsValid() && (!ep.IP6.Is6() || ep.IP6.Is4In6() || ep.IP6.Zone() != ""):
		return fmt.Errorf("endpoint %d: %v is not an IPv6 address", ep.ID, ep.IP6)
	case len(ep.MAC) != 6 || len(ep.HostMAC) != 6:
		return fmt.Errorf("endpoint %d: MACs must be 6 bytes", ep.ID)
	}
	return nil
}

func (ep Endpoint) info() podEndpointInfo {
	v := podEndpointInfo{Ifindex: uint32(ep.IfIndex), Id: ep.ID, Ip: ip4Key(ep.IP), Queues: ep.Queues}
	if ep.VM {
		v.Flags |= epFlagVM
	}
	// netkit L3 (pkg/netdev): no MACs, no ARP. netkit L2 is a veth to the
	// programs.
	if ep.Mode == ModeNetkit {
		v.Flags |= epFlagL3
	}
	copy(v.Mac[:], ep.MAC)
	copy(v.HostMac[:], ep.HostMAC)
	if ep.IP6.IsValid() {
		v.Ip6 = ep.IP6.As16()
	}
	return v
}

// ipKey returns the uint32 whose in-memory bytes are the address in network
// order, as the programs see iph->daddr.
func ipKey(a [4]byte) uint32 {
	return nativeEndian.Uint32(a[:])
}

// ip4Key is ipKey of an IPv4 address, 0 for none (an endpoint of an
// IPv6-only node: its IPv4 is dropped as spoofed).
func ip4Key(a netip.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	return ipKey(a.As4())
}

// UpsertEndpoint writes ep's map entries, then attaches (or updates) the pod
// program on its host device. Maps first: the program drops packets from a
// device it has no entry for.
func (l *Loader) UpsertEndpoint(ep Endpoint) error {
	if err := ep.validate(); err != nil {
		return fmt.Errorf("upsert endpoint: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()

	info := ep.info()
	ifKey := uint32(ep.IfIndex)
	ipk := info.Ip
	// An endpoint that moved (same id, new IP or device) must not leave its
	// old entries behind.
	if err := l.removeStale(ep); err != nil {
		return fmt.Errorf("upsert endpoint %d: %w", ep.ID, err)
	}
	if err := l.pod.LkEpByIfindex.Put(ifKey, info); err != nil {
		return fmt.Errorf("upsert endpoint %d: ifindex entry: %w", ep.ID, err)
	}
	if ep.IP.Is4() {
		if err := l.pod.LkEndpoints.Put(ipk, info); err != nil {
			return fmt.Errorf("upsert endpoint %d: ip entry: %w", ep.ID, err)
		}
	}
	if ep.IP6.IsValid() {
		if err := l.pod.LkEndpoints6.Put(ep.IP6.As16(), info); err != nil {
			return fmt.Errorf("upsert endpoint %d: ipv6 entry: %w", ep.ID, err)
		}
	}
	if err := l.writeDHCPOptions(ep); err != nil {
		return fmt.Errorf("upsert endpoint %d: %w", ep.ID, err)
	}
	if err := l.attach(pinPodLink+ep.IfName, ep.IfIndex, podAttachMode(ep.Mode), l.pod.FromPod); err != nil {
		return fmt.Errorf("upsert endpoint %d: %w", ep.ID, err)
	}
	if err := l.attach(pinToPod+ep.IfName, ep.IfIndex, toPodAttachMode(ep.Mode), l.pod.ToPod); err != nil {
		return fmt.Errorf("upsert endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// removeStale deletes entries that carry ep.ID under another key.
func (l *Loader) removeStale(ep Endpoint) error {
	var (
		ip   uint32
		ifx  uint32
		info podEndpointInfo
	)
	wantIP, wantIf := ip4Key(ep.IP), uint32(ep.IfIndex)
	var staleIPs, staleIfs []uint32
	it := l.pod.LkEndpoints.Iterate()
	for it.Next(&ip, &info) {
		if info.Id == ep.ID && ip != wantIP {
			staleIPs = append(staleIPs, ip)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan endpoints: %w", err)
	}
	it = l.pod.LkEpByIfindex.Iterate()
	for it.Next(&ifx, &info) {
		if info.Id == ep.ID && ifx != wantIf {
			staleIfs = append(staleIfs, ifx)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan endpoints by ifindex: %w", err)
	}
	var (
		ip6      [16]byte
		staleIP6 [][16]byte
	)
	it = l.pod.LkEndpoints6.Iterate()
	for it.Next(&ip6, &info) {
		if info.Id == ep.ID && (!ep.IP6.IsValid() || ip6 != ep.IP6.As16()) {
			staleIP6 = append(staleIP6, ip6)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan ipv6 endpoints: %w", err)
	}
	for _, k := range staleIP6 {
		if err := deleteIgnoreMissing(l.pod.LkEndpoints6, k); err != nil {
			return err
		}
	}
	for _, k := range staleIPs {
		if err := deleteIgnoreMissing(l.pod.LkEndpoints, k); err != nil {
			return err
		}
	}
	for _, k := range staleIfs {
		if err := deleteIgnoreMissing(l.pod.LkEpByIfindex, k); err != nil {
			return err
		}
	}
	return nil
}

// DeleteEndpoint detaches the program from ep's device and removes its map
// entries and counters. What is already gone is not an error.
func (l *Loader) DeleteEndpoint(ep Endpoint) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	// The address first: the datapath stops delivering to the endpoint at
	// once (a live migration's source hands it over with this); detaching
	// its programs waits for RCU grace periods (tcx), tens of ms on a busy
	// node.
	if ep.IP.Is4() {
		errs = append(errs, deleteIgnoreMissing(l.pod.LkEndpoints, ipKey(ep.IP.As4())))
	}
	if ep.IP6.IsValid() && ep.IP6.Is6() {
		errs = append(errs, deleteIgnoreMissing(l.pod.LkEndpoints6, ep.IP6.As16()))
	}
	if ep.IfName != "" {
		errs = append(errs, l.detach(pinPodLink+ep.IfName), l.detach(pinToPod+ep.IfName))
	}
	if ep.IfIndex > 0 {
		errs = append(errs, deleteIgnoreMissing(l.pod.LkEpByIfindex, uint32(ep.IfIndex)))
	}
	if ep.ID != 0 {
		errs = append(errs, l.deleteMetrics(ep.ID), deleteIgnoreMissing(l.pod.LkEdt, ep.ID),
			deleteIgnoreMissing(l.pod.LkDhcpOpts, ep.ID))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete endpoint %d: %w", ep.ID, err)
	}
	return nil
}

func deleteIgnoreMissing(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", m, err)
	}
	return nil
}

// Endpoints lists the endpoint IDs present in the datapath (by device).
func (l *Loader) Endpoints() ([]uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var (
		k    uint32
		info podEndpointInfo
		ids  []uint32
	)
	it := l.pod.LkEpByIfindex.Iterate()
	for it.Next(&k, &info) {
		ids = append(ids, info.Id)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return ids, nil
}

// MapEntryCount returns how many entries the endpoint and metrics maps hold
// (leak checks in tests and `lanekit status`).
func (l *Loader) MapEntryCount() (endpoints, byIfindex, metrics int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var e1, e2, e3 error
	endpoints, e1 = countEntries(l.pod.LkEndpoints)
	byIfindex, e2 = countEntries(l.pod.LkEpByIfindex)
	metrics, e3 = countEntries(l.pod.LkMetrics)
	return endpoints, byIfindex, metrics, errors.Join(e1, e2, e3)
}
