package agent

import (
	"fmt"
	"slices"
	"sync"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// MemoryDatapath is the "none" backend: it forwards nothing and remembers
// the endpoints it was given, so the control plane (ADD/CHECK/DEL/GC and
// re-adoption) runs without BPF.
type MemoryDatapath struct {
	mu  sync.Mutex
	eps map[uint32]datapath.Endpoint
}

var _ datapath.Datapath = (*MemoryDatapath)(nil)

// NewMemoryDatapath returns an empty MemoryDatapath.
func NewMemoryDatapath() *MemoryDatapath {
	return &MemoryDatapath{eps: map[uint32]datapath.Endpoint{}}
}

func (m *MemoryDatapath) UpsertEndpoint(ep datapath.Endpoint) error {
	if ep.ID == 0 {
		return fmt.Errorf("upsert endpoint: id 0 is reserved")
	}
	if ep.IfIndex <= 0 {
		return fmt.Errorf("upsert endpoint %d: no ifindex", ep.ID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.eps[ep.ID] = ep
	return nil
}

func (m *MemoryDatapath) DeleteEndpoint(ep datapath.Endpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.eps, ep.ID)
	return nil
}

func (m *MemoryDatapath) Endpoints() ([]uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]uint32, 0, len(m.eps))
	for id := range m.eps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Endpoint returns what was last upserted for id.
func (m *MemoryDatapath) Endpoint(id uint32) (datapath.Endpoint, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, ok := m.eps[id]
	return ep, ok
}

func (m *MemoryDatapath) Counters(id uint32) (datapath.Counters, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.eps[id]; !ok {
		return datapath.Counters{}, fmt.Errorf("counters of endpoint %d: no such endpoint", id)
	}
	return datapath.Counters{Drops: map[datapath.DropReason]uint64{}}, nil
}

func (m *MemoryDatapath) Close() error { return nil }
