package datapath

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// EDTHorizon is how far ahead a packet of a rate-limited endpoint may be
// scheduled; a later one is dropped (DropEDTHorizon, bpf/lib/edt.h).
const EDTHorizon = 2 * time.Second

// SetEgressRate limits endpoint id's egress to bitsPerSec by EDT
// (bpf/lib/edt.h); 0 removes the limit. A changed rate restarts the
// endpoint's schedule.
func (l *Loader) SetEgressRate(id uint32, bitsPerSec uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if bitsPerSec == 0 {
		return deleteIgnoreMissing(l.pod.LkEdt, id)
	}
	if bitsPerSec < 8 {
		return fmt.Errorf("egress rate of endpoint %d: %d bit/s is below one byte per second", id, bitsPerSec)
	}
	var cur podEdtInfo
	if err := l.pod.LkEdt.Lookup(id, &cur); err == nil && cur.BytesPerSec == bitsPerSec/8 {
		return nil
	}
	v := podEdtInfo{BytesPerSec: bitsPerSec / 8, HorizonNs: uint64(EDTHorizon.Nanoseconds())}
	if err := l.pod.LkEdt.Update(id, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("egress rate of endpoint %d: %w", id, err)
	}
	return nil
}

// EgressRates returns the endpoints' egress limits in bits per second.
func (l *Loader) EgressRates() (map[uint32]uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[uint32]uint64{}
	var (
		id uint32
		v  podEdtInfo
	)
	it := l.pod.LkEdt.Iterate()
	for it.Next(&id, &v) {
		out[id] = v.BytesPerSec * 8
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("egress rates: %w", err)
	}
	return out, nil
}
