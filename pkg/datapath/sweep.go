package datapath

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// Owned is what the agent's endpoint records own in the datapath; Sweep
// removes everything else.
type Owned struct {
	IDs      map[uint32]bool // endpoint ids (pods and VMs)
	PodLinks map[string]bool // host-side device names with a pinned pod link
	VMs      map[uint32]bool // endpoint ids of VMs (pinned steering links)
	XSKSlots map[uint32]bool // lk_xsks slots reserved by VMs
}

// Swept counts what Sweep removed.
type Swept struct {
	Endpoints, ByIfindex, Metrics, PodLinks, VMLinks int
}

// Total is the number of objects removed.
func (s Swept) Total() int {
	return s.Endpoints + s.ByIfindex + s.Metrics + s.PodLinks + s.VMLinks
}

// Sweep deletes the map entries, counters, socket slots and pinned links
// that no record in own accounts for (left by a crash between programming the
// datapath and recording it). Drops counted under endpoint 0 stay.
func (l *Loader) Sweep(own Owned) (Swept, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sw Swept
	var errs []error
	sweepEP := func(m *ebpf.Map, n *int) {
		var (
			k    []byte // the key's bytes: 4 (IPv4, ifindex) or 16 (IPv6)
			info podEndpointInfo
			del  [][]byte
		)
		it := m.Iterate()
		for it.Next(&k, &info) {
			if !own.IDs[info.Id] {
				del = append(del, append([]byte(nil), k...))
			}
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("scan %s: %w", m, err))
			return
		}
		for _, k := range del {
			if err := deleteIgnoreMissing(m, k); err != nil {
				errs = append(errs, err)
				continue
			}
			*n++
		}
	}
	sweepEP(l.pod.LkEndpoints, &sw.Endpoints)
	sweepEP(l.pod.LkEpByIfindex, &sw.ByIfindex)
	sweepEP(l.pod.LkEndpoints6, &sw.Endpoints)

	var (
		mk   podMetricsKey
		vals []podMetricsVal
		mdel []podMetricsKey
	)
	it := l.pod.LkMetrics.Iterate()
	for it.Next(&mk, &vals) {
		if mk.EpId != 0 && !own.IDs[mk.EpId] {
			mdel = append(mdel, mk)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("scan counters: %w", err))
	}
	for _, k := range mdel {
		if err := deleteIgnoreMissing(l.pod.LkMetrics, k); err != nil {
			errs = append(errs, err)
			continue
		}
		sw.Metrics++
	}

	// An XSKMAP cannot be read from user space; clearing an empty slot is a
	// no-op, so every slot no VM reserves is cleared.
	for slot := uint32(0); slot < MaxXSKs; slot++ {
		if own.XSKSlots[slot] {
			continue
		}
		if err := l.vm.LkXsks.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("clear socket slot %d: %w", slot, err))
		}
	}

	// RSS maps of VMs that are gone.
	var (
		rk   uint32
		rv   *ebpf.Map
		rdel []uint32
	)
	rit := l.vm.LkRssVms.Iterate()
	for rit.Next(&rk, &rv) {
		rv.Close()
		if !own.VMs[rk] {
			rdel = append(rdel, rk)
		}
	}
	if err := rit.Err(); err != nil {
		errs = append(errs, fmt.Errorf("scan vm rss maps: %w", err))
	}
	for _, k := range rdel {
		if err := deleteIgnoreMissing(l.vm.LkRssVms, k); err != nil {
			errs = append(errs, err)
		}
	}

	entries, err := os.ReadDir(l.cfg.PinDir)
	if err != nil {
		errs = append(errs, fmt.Errorf("read pin dir: %w", err))
	}
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, pinPodLink) || strings.HasPrefix(n, pinToPod):
			if own.PodLinks[strings.TrimPrefix(strings.TrimPrefix(n, pinPodLink), pinToPod)] {
				continue
			}
			if err := l.detach(n); err != nil {
				errs = append(errs, err)
				continue
			}
			sw.PodLinks++
		case strings.HasPrefix(n, pinVMLink) || strings.HasPrefix(n, pinVMRxLink):
			id, perr := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(n, pinVMLink), pinVMRxLink), 10, 32)
			if perr == nil && own.VMs[uint32(id)] {
				continue
			}
			if err := l.detach(n); err != nil {
				errs = append(errs, err)
				continue
			}
			sw.VMLinks++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return sw, fmt.Errorf("sweep datapath: %w", err)
	}
	return sw, nil
}
