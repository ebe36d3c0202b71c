package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// PinnedState is what an agent's pin directory holds, read without loading
// any program: for leak checks and diagnostics.
type PinnedState struct {
	Endpoints      int               // lk_endpoints entries (by IP)
	EndpointsByDev int               // lk_ep_by_ifindex entries
	Metrics        map[uint32]int    // lk_metrics entries per endpoint id (0: not attributable)
	PodLinks       []string          // pinned lk_pod_* links
	VMLinks        []string          // pinned lk_vm_* links
	Other          map[string]string // other pins, name -> kind
}

// InspectPins reads the pinned maps and links of pinDir.
func InspectPins(pinDir string) (PinnedState, error) {
	st := PinnedState{Metrics: map[uint32]int{}, Other: map[string]string{}}
	count := func(name string) (int, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return 0, fmt.Errorf("open pinned %s: %w", name, err)
		}
		defer m.Close()
		return countEntries(m)
	}
	var err error
	if st.Endpoints, err = count("lk_endpoints"); err != nil {
		return st, err
	}
	if st.EndpointsByDev, err = count("lk_ep_by_ifindex"); err != nil {
		return st, err
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "lk_metrics"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return st, fmt.Errorf("open pinned lk_metrics: %w", err)
	}
	defer m.Close()
	var (
		key  podMetricsKey
		vals []podMetricsVal
	)
	it := m.Iterate()
	for it.Next(&key, &vals) {
		st.Metrics[key.EpId]++
	}
	if err := it.Err(); err != nil {
		return st, fmt.Errorf("read lk_metrics: %w", err)
	}
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return st, fmt.Errorf("read pin dir: %w", err)
	}
	for _, e := range entries {
		switch n := e.Name(); {
		case strings.HasPrefix(n, pinPodLink) || strings.HasPrefix(n, pinToPod):
			st.PodLinks = append(st.PodLinks, n)
		case strings.HasPrefix(n, pinVMLink) || strings.HasPrefix(n, pinVMRxLink):
			st.VMLinks = append(st.VMLinks, n)
		case n == "lk_endpoints" || n == "lk_ep_by_ifindex" || n == "lk_metrics" || n == "lk_xsks" || n == "lk_rss_vms" || n == pinUplinkTC || n == pinUplinkEgress || n == pinHostPF:
		default:
			st.Other[n] = "unknown"
		}
	}
	return st, nil
}

// Leaks describes what st holds for endpoints: entries, per-endpoint
// counters and pinned pod/VM links. Empty when nothing endpoint-related is left.
func (st PinnedState) Leaks() error {
	var errs []error
	if st.Endpoints != 0 || st.EndpointsByDev != 0 {
		errs = append(errs, fmt.Errorf("%d endpoint entries by IP, %d by device", st.Endpoints, st.EndpointsByDev))
	}
	for id, n := range st.Metrics {
		if id != 0 {
			errs = append(errs, fmt.Errorf("%d counter entries of endpoint %d", n, id))
		}
	}
	if len(st.PodLinks)+len(st.VMLinks) > 0 {
		errs = append(errs, fmt.Errorf("pinned links %v %v", st.PodLinks, st.VMLinks))
	}
	return errors.Join(errs...)
}

// countEntries counts the entries of any map, per-CPU ones included (it
// walks keys only).
func countEntries(m *ebpf.Map) (int, error) {
	n := 0
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	var prev any // nil: the first key
	for {
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("walk %s: %w", m, err)
		}
		n++
		copy(key, next)
		prev = key
	}
}

// Health reports whether the loaded datapath still forwards: the pin
// directory is there and, with an uplink, its program is still attached.
func (l *Loader) Health() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := os.Stat(l.cfg.PinDir); err != nil {
		return fmt.Errorf("pin dir: %w", err)
	}
	for _, name := range []string{"lk_endpoints", "lk_ep_by_ifindex", "lk_metrics"} {
		if _, err := os.Stat(filepath.Join(l.cfg.PinDir, name)); err != nil {
			return fmt.Errorf("pinned map %s: %w", name, err)
		}
	}
	if l.cfg.Uplink == "" {
		return nil
	}
	lnk, err := link.LoadPinnedLink(filepath.Join(l.cfg.PinDir, pinUplinkTC), nil)
	if err != nil {
		return fmt.Errorf("uplink %s program: %w", l.cfg.Uplink, err)
	}
	defer lnk.Close()
	if linkIfindex(lnk) == 0 {
		return fmt.Errorf("uplink %s program is detached (device gone?)", l.cfg.Uplink)
	}
	return nil
}

// PinnedCounters reads the counters of the endpoint with address ip from
// the maps pinned in pinDir, without loading any program: for tests and
// diagnostics that look at a running agent's datapath from outside. It
// returns the endpoint's id too.
func PinnedCounters(pinDir string, ip netip.Addr) (uint32, Counters, error) {
	name, key := "lk_endpoints", any(nil)
	switch {
	case ip.Is4():
		key = ipKey(ip.As4())
	case ip.Is6() && !ip.Is4In6():
		name, key = "lk_endpoints6", ip.As16() // an endpoint's IPv6 address
	default:
		return 0, Counters{}, fmt.Errorf("pinned counters: %v is not an IP address", ip)
	}
	eps, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, Counters{}, fmt.Errorf("pinned counters: open %s: %w", name, err)
	}
	defer eps.Close()
	var info podEndpointInfo
	if err := eps.Lookup(key, &info); err != nil {
		return 0, Counters{}, fmt.Errorf("pinned counters: endpoint %v: %w", ip, err)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "lk_metrics"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, Counters{}, fmt.Errorf("pinned counters: open lk_metrics: %w", err)
	}
	defer m.Close()
	c, err := sumCounters(m, info.Id)
	if err != nil {
		return 0, Counters{}, fmt.Errorf("pinned counters: %w", err)
	}
	return info.Id, c, nil
}

// PinnedNodeCounters reads, from the maps pinned in pinDir, the counters
// charged to no endpoint (id 0): the node's own drops, such as what
// from_tunnel refuses (DropTunnelUnknownNode, DropTunnelForeignSrc).
func PinnedNodeCounters(pinDir string) (Counters, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "lk_metrics"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return Counters{}, fmt.Errorf("pinned node counters: open lk_metrics: %w", err)
	}
	defer m.Close()
	c, err := sumCounters(m, 0)
	if err != nil {
		return Counters{}, fmt.Errorf("pinned node counters: %w", err)
	}
	return c, nil
}
