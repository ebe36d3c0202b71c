package observe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

// fakeSource is an event ring fed by the test. An item is an event, or a
// barrier the reader closes when it asks for the next item: then every
// event before it has been fanned out.
type fakeSource struct {
	items  chan any
	closed chan struct{}
	once   sync.Once
	lost   atomic.Uint64

	mu      sync.Mutex
	configs []datapath.EventsConfig
}

func newFake() *fakeSource {
	return &fakeSource{items: make(chan any), closed: make(chan struct{})}
}

func (f *fakeSource) Configure(c datapath.EventsConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.configs = append(f.configs, c)
	return nil
}

func (f *fakeSource) lastConfig() datapath.EventsConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.configs[len(f.configs)-1]
}

func (f *fakeSource) Read() (datapath.Event, error) {
	for {
		select {
		case <-f.closed:
			return datapath.Event{}, fmt.Errorf("fake: %w", os.ErrClosed)
		case it := <-f.items:
			if b, ok := it.(chan struct{}); ok {
				close(b)
				continue
			}
			return it.(datapath.Event), nil
		}
	}
}

func (f *fakeSource) Lost() (uint64, error) { return f.lost.Load(), nil }
func (f *fakeSource) Close() error {
	f.once.Do(func() { f.Configure(datapath.EventsConfig{}); close(f.closed) })
	return nil
}

// push feeds events and returns once all of them were fanned out.
func (f *fakeSource) push(t *testing.T, evs ...datapath.Event) {
	t.Helper()
	for _, ev := range evs {
		f.items <- ev
	}
	b := make(chan struct{})
	f.items <- b
	<-b
}

type fakeEndpoints []endpoint.Endpoint

func (f fakeEndpoints) List() ([]endpoint.Endpoint, error) { return f, nil }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func drop(ep uint32, i int) datapath.Event {
	return datapath.Event{Kind: datapath.EventDrop, Reason: datapath.DropSpoofedIP, EndpointID: ep, Len: uint32(i),
		EtherType: 0x0800, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}
}

func next(t *testing.T, s *Subscription) Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	return m
}

// A slow subscriber loses what its queue cannot hold and is told how many;
// a fast one gets every event; the ring's own losses reach everyone.
func TestFanOutSlowSubscriber(t *testing.T) {
	src := newFake()
	opened := 0
	h := NewHub(Options{Open: func() (Source, error) { opened++; return src, nil }, Log: quiet(), LostInterval: 5 * time.Millisecond,
		Endpoints: fakeEndpoints{{ID: 3, Kind: endpoint.KindPod, HostIfName: "lkh3", HostIfIndex: 33,
			Labels: map[string]string{"K8S_POD_NAME": "a", "K8S_POD_NAMESPACE": "default"}}}})
	fast, err := h.subscribe(Filter{}, 64)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := h.subscribe(Filter{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if c := src.lastConfig(); !c.Drops || c.Forwarded || opened != 1 {
		t.Fatalf("config %+v after %d opens, want drops only, one open", c, opened)
	}
	const n = 20
	for i := 0; i < n; i++ {
		src.push(t, drop(3, i))
	}
	for i := 0; i < n; i++ {
		m := next(t, fast)
		if m.Flow == nil || m.Flow.Len != uint32(i) {
			t.Fatalf("fast subscriber message %d: %+v", i, m)
		}
		if i == 0 && (m.Flow.Endpoint.Name != "default/a" || m.Flow.IfName != "") {
			t.Errorf("endpoint named %+v ifname %q", m.Flow.Endpoint, m.Flow.IfName)
		}
	}
	if m := next(t, slow); m.Flow != nil || m.Lost != n-4 || m.LostWhere != LostSubscriber {
		t.Fatalf("slow subscriber first message %+v, want %d lost (subscriber)", m, n-4)
	}
	for i := 0; i < 4; i++ {
		if m := next(t, slow); m.Flow == nil || m.Flow.Len != uint32(i) {
			t.Fatalf("slow subscriber queued message %d: %+v", i, m)
		}
	}
	// The ring lost 7: both hear it, the fast one having lost nothing itself.
	src.lost.Store(7)
	for _, s := range []*Subscription{fast, slow} {
		if m := next(t, s); m.Lost != 7 || m.LostWhere != LostRing {
			t.Fatalf("message %+v, want 7 lost (ring)", m)
		}
	}
	fast.Close()
	if c := src.lastConfig(); !c.Drops {
		t.Fatalf("one subscriber left, config %+v", c)
	}
	slow.Close()
	if c := src.lastConfig(); c != (datapath.EventsConfig{}) {
		t.Fatalf("no subscriber left, config %+v, want all off", c)
	}
	select {
	case <-src.closed:
	default:
		t.Fatal("source still open with no subscriber")
	}
}

// Filters: verdicts, sample rates (the smallest wins), endpoints by name.
func TestFilters(t *testing.T) {
	src := newFake()
	h := NewHub(Options{Open: func() (Source, error) { return src, nil }, Log: quiet(),
		Endpoints: fakeEndpoints{
			{ID: 3, Kind: endpoint.KindPod, HostIfName: "lkh3", Labels: map[string]string{"K8S_POD_NAME": "a", "K8S_POD_NAMESPACE": "default"}},
			{ID: 4, Kind: endpoint.KindVM, VM: &endpoint.VM{Name: "vm1"}},
		}})
	if _, err := h.Subscribe(Filter{Verdict: datapath.EventForwarded}); err == nil {
		t.Fatal("forwarded without a sample rate accepted")
	}
	drops, err := h.Subscribe(Filter{Verdict: datapath.EventDrop, Endpoint: "vm1"})
	if err != nil {
		t.Fatal(err)
	}
	defer drops.Close()
	fwd, err := h.Subscribe(Filter{Verdict: datapath.EventForwarded, SampleRate: 100, Endpoint: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	all, err := h.Subscribe(Filter{SampleRate: 10})
	if err != nil {
		t.Fatal(err)
	}
	if c := src.lastConfig(); !c.Drops || !c.Forwarded || c.SampleRate != 10 {
		t.Fatalf("config %+v, want drops and forwarded 1 in 10", c)
	}
	all.Close()
	if c := src.lastConfig(); !c.Forwarded || c.SampleRate != 100 {
		t.Fatalf("config %+v after the 1-in-10 subscriber left, want 1 in 100", c)
	}
	src.push(t,
		drop(3, 1), // pod a's drop: nobody
		datapath.Event{Kind: datapath.EventForwarded, EndpointID: 4, PeerID: 3, Len: 2}, // to a: fwd
		drop(4, 3), // vm1: drops
		datapath.Event{Kind: datapath.EventForwarded, EndpointID: 4, Len: 4}, // vm1 forwarded: nobody
	)
	if m := next(t, fwd); m.Flow == nil || m.Flow.Len != 2 || m.Flow.Peer.Name != "default/a" {
		t.Fatalf("forwarded subscriber got %+v", m)
	}
	if m := next(t, drops); m.Flow == nil || m.Flow.Len != 3 || m.Flow.Endpoint.Kind != "vm" {
		t.Fatalf("drop subscriber got %+v", m)
	}
	for _, s := range []*Subscription{fwd, drops} {
		if n := len(s.ch); n != 0 || s.dropped.Load() != 0 {
			t.Fatalf("%d unexpected extra messages, %d lost", n, s.dropped.Load())
		}
	}
}
