// Package observe fans the datapath's flow events (drops, sampled forwarded
// packets) out to subscribers: the agent's Observer gRPC service, behind
// `lanekit observe`. The ring buffer is read, and the BPF programs report
// events, only while at least one subscriber exists. Each subscriber has a
// bounded queue: one that does not keep up loses events and is told how many.
package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// Source is the event ring: *datapath.EventReader, or a fake in tests.
type Source interface {
	Configure(datapath.EventsConfig) error
	// Read blocks for the next event; after Close it returns an error
	// wrapping os.ErrClosed.
	Read() (datapath.Event, error)
	Lost() (uint64, error) // events the ring had no room for, cumulative
	Close() error
}

// Options configure a Hub.
type Options struct {
	// Open opens the event source when the first subscriber arrives.
	Open func() (Source, error)
	// Endpoints lists the agent's endpoints, for names (nil: ids only).
	Endpoints EndpointLister
	// QueueLen bounds each subscriber's queue (0: DefaultQueueLen).
	QueueLen int
	// LostInterval is how often the ring's lost counter is polled (0: 1s).
	LostInterval time.Duration
	Log          *slog.Logger
}

// DefaultQueueLen is a subscriber's queue length when Options.QueueLen is 0.
const DefaultQueueLen = 1024

// Filter selects a subscriber's events.
type Filter struct {
	// Endpoint: an endpoint id, name ("ns/pod", "pod", VM name) or host
	// device name; empty: all.
	Endpoint string
	// Verdict: datapath.EventDrop or EventForwarded; 0: both (forwarded
	// ones only when SampleRate > 0).
	Verdict datapath.EventKind
	// SampleRate > 0 asks for one in SampleRate forwarded packets. With
	// several subscribers the smallest rate wins for all of them.
	SampleRate uint32
}

func (f Filter) wantsDrops() bool { return f.Verdict == 0 || f.Verdict == datapath.EventDrop }
func (f Filter) wantsForwarded() bool {
	return f.SampleRate > 0 && (f.Verdict == 0 || f.Verdict == datapath.EventForwarded)
}

// Validate checks a filter before it subscribes.
func (f Filter) Validate() error {
	switch f.Verdict {
	case 0, datapath.EventDrop:
	case datapath.EventForwarded:
		if f.SampleRate == 0 {
			return errors.New("forwarded events need a sample rate (one in N packets)")
		}
	default:
		return fmt.Errorf("unknown verdict %d", f.Verdict)
	}
	return nil
}

// Message is what a subscriber receives: a flow, or a notice of lost events.
type Message struct {
	Flow      *Flow
	Lost      uint64 // > 0: events lost
	LostWhere string // LostSubscriber or LostRing
}

// Where events were lost.
const (
	LostSubscriber = "subscriber" // this subscriber's queue was full
	LostRing       = "ring"       // the BPF ring buffer was full
)

// Hub reads events while anyone subscribes and fans them out.
type Hub struct {
	opts  Options
	names *resolver
	log   *slog.Logger

	life sync.Mutex // serialises subscribe/unsubscribe (source open/close)
	src  Source     // under life
	done chan struct{}
	stop chan struct{}

	mu   sync.Mutex // guards subs
	subs map[*Subscription]struct{}
}

// NewHub returns a hub; nothing is opened until the first Subscribe.
func NewHub(opts Options) *Hub {
	if opts.QueueLen <= 0 {
		opts.QueueLen = DefaultQueueLen
	}
	if opts.LostInterval <= 0 {
		opts.LostInterval = time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Hub{opts: opts, names: newResolver(opts.Endpoints), log: opts.Log, subs: map[*Subscription]struct{}{}}
}

// Subscription is one subscriber's stream.
type Subscription struct {
	h       *Hub
	filter  Filter
	ch      chan *Flow
	dropped atomic.Uint64 // queue full
	ring    atomic.Uint64 // ring lost, this subscriber's share of the notices
	notify  chan struct{} // cap 1: a loss to report
	closed  sync.Once
}

// Subscribe adds a subscriber, starting the reader (and enabling the BPF
// events) if it is the first.
func (h *Hub) Subscribe(f Filter) (*Subscription, error) { return h.subscribe(f, h.opts.QueueLen) }

func (h *Hub) subscribe(f Filter, queueLen int) (*Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	s := &Subscription{h: h, filter: f, ch: make(chan *Flow, queueLen), notify: make(chan struct{}, 1)}
	h.life.Lock()
	defer h.life.Unlock()
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	if h.src == nil {
		if err := h.start(); err != nil {
			h.mu.Lock()
			delete(h.subs, s)
			h.mu.Unlock()
			return nil, fmt.Errorf("subscribe: %w", err)
		}
	}
	if err := h.configure(); err != nil {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
		h.stopIfIdle()
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	h.names.refresh(true)
	return s, nil
}

// start opens the source and runs the reader and the lost-counter poller.
// Called with life held.
func (h *Hub) start() error {
	src, err := h.opts.Open()
	if err != nil {
		return fmt.Errorf("open events: %w", err)
	}
	base, err := src.Lost()
	if err != nil {
		src.Close()
		return err
	}
	h.src, h.done, h.stop = src, make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); h.read(src) }()
	go func() { defer wg.Done(); h.pollLost(src, base, h.stop) }()
	go func(done chan struct{}) { wg.Wait(); close(done) }(h.done)
	h.log.Info("flow events on")
	return nil
}

// configure writes the union of what the subscribers want. Called with life held.
func (h *Hub) configure() error {
	var c datapath.EventsConfig
	h.mu.Lock()
	for s := range h.subs {
		c.Drops = c.Drops || s.filter.wantsDrops()
		if s.filter.wantsForwarded() {
			if !c.Forwarded || s.filter.SampleRate < c.SampleRate {
				c.SampleRate = s.filter.SampleRate
			}
			c.Forwarded = true
		}
	}
	h.mu.Unlock()
	return h.src.Configure(c)
}

// stopIfIdle turns events off and stops the reader when nobody subscribes.
// Called with life held.
func (h *Hub) stopIfIdle() {
	h.mu.Lock()
	n := len(h.subs)
	h.mu.Unlock()
	if n > 0 || h.src == nil {
		return
	}
	close(h.stop)
	if err := h.src.Close(); err != nil {
		h.log.Warn("close flow events", "err", err)
	}
	<-h.done
	h.src = nil
	h.log.Info("flow events off")
}

// Close removes the subscriber; the last one turns events off.
func (s *Subscription) Close() {
	s.closed.Do(func() {
		h := s.h
		h.life.Lock()
		defer h.life.Unlock()
		h.mu.Lock()
		delete(h.subs, s)
		n := len(h.subs)
		h.mu.Unlock()
		if n == 0 {
			h.stopIfIdle()
		} else if err := h.configure(); err != nil {
			h.log.Warn("reconfigure flow events", "err", err)
		}
	})
}

func (h *Hub) read(src Source) {
	for {
		ev, err := src.Read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				h.log.Warn("read flow events", "err", err)
			}
			return
		}
		fl := h.names.flow(ev)
		h.mu.Lock()
		for s := range h.subs {
			if !s.matches(fl) {
				continue
			}
			select {
			case s.ch <- fl:
			default:
				s.dropped.Add(1)
				s.signal()
			}
		}
		h.mu.Unlock()
	}
}

// pollLost tells every subscriber about events the ring had no room for.
func (h *Hub) pollLost(src Source, base uint64, stop chan struct{}) {
	t := time.NewTicker(h.opts.LostInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		n, err := src.Lost()
		if err != nil || n <= base {
			continue
		}
		d := n - base
		base = n
		h.mu.Lock()
		for s := range h.subs {
			s.ring.Add(d)
			s.signal()
		}
		h.mu.Unlock()
	}
}

func (s *Subscription) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Subscription) matches(fl *Flow) bool {
	f := s.filter
	switch {
	case f.Verdict != 0 && fl.Kind != f.Verdict:
		return false
	case fl.Kind == datapath.EventForwarded && !f.wantsForwarded():
		return false
	case f.Endpoint != "" && !fl.involves(f.Endpoint):
		return false
	}
	return true
}

// Next returns the next message. A loss is reported as soon as it is known,
// ahead of the flows still queued (which arrived before it).
func (s *Subscription) Next(ctx context.Context) (Message, error) {
	for {
		if n := s.dropped.Swap(0); n > 0 {
			return Message{Lost: n, LostWhere: LostSubscriber}, nil
		}
		if n := s.ring.Swap(0); n > 0 {
			return Message{Lost: n, LostWhere: LostRing}, nil
		}
		select {
		case <-ctx.Done():
			return Message{}, ctx.Err()
		case fl := <-s.ch:
			return Message{Flow: fl}, nil
		case <-s.notify:
		}
	}
}
