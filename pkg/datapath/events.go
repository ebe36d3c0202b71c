package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// EventKind is what a flow event reports (enum lk_event_kind, generated).
type EventKind uint32

const (
	EventDrop      = EventKind(podLkEventKindEVENT_DROP)      // the datapath dropped the packet
	EventForwarded = EventKind(podLkEventKindEVENT_FORWARDED) // a sampled packet the datapath forwarded
)

func (k EventKind) String() string {
	switch k {
	case EventDrop:
		return "dropped"
	case EventForwarded:
		return "forwarded"
	}
	return fmt.Sprintf("kind-%d", uint32(k))
}

// Event flags in lk_events_cfg (enum lk_events_flags, generated).
const (
	eventsFlagDrops     = uint32(podLkEventsFlagsEVENTS_F_DROPS)
	eventsFlagForwarded = uint32(podLkEventsFlagsEVENTS_F_FORWARDED)
)

// Pinned names of the event maps (bpf/lib/events.h).
const (
	pinEvents     = "lk_events"
	pinEventsCfg  = "lk_events_cfg"
	pinEventsLost = "lk_events_lost"
)

// Event is one flow event from the BPF programs.
type Event struct {
	Time       time.Time
	Kind       EventKind
	Reason     DropReason // EventDrop only
	EndpointID uint32     // the endpoint charged (drop) or sending (forwarded); 0: none
	PeerID     uint32     // forwarded to this local endpoint; 0: none (leaves the node)
	IfIndex    uint32     // device the packet entered on (in the endpoint's or node's netns)
	Len        uint32     // packet length in bytes
	EtherType  uint16     // 0: frame too short to tell
	Proto      uint8      // IPv4 protocol number (6 TCP, 17 UDP, 1 ICMP)
	Src, Dst   netip.Addr // IPv4 only; invalid otherwise
	SrcPort    uint16     // TCP/UDP only
	DstPort    uint16
}

// EventsConfig says which events the BPF programs emit.
type EventsConfig struct {
	Drops bool
	// Forwarded samples forwarded packets: one in SampleRate (0 and 1: every
	// one, which costs a ring write per packet: use with care).
	Forwarded  bool
	SampleRate uint32
}

// EventReader reads flow events from the pinned ring buffer and switches
// their emission on and off. One reader per agent: the ring has one consumer.
type EventReader struct {
	events, cfg, lost *ebpf.Map
	rd                *ringbuf.Reader
	monoOffset        time.Duration // wall clock - CLOCK_MONOTONIC
}

// OpenEvents opens the event maps pinned in pinDir by a loaded datapath,
// skipping the events already in the ring.
func OpenEvents(pinDir string) (*EventReader, error) {
	var ms [3]*ebpf.Map
	for i, name := range []string{pinEvents, pinEventsCfg, pinEventsLost} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if err != nil {
			for _, o := range ms[:i] {
				o.Close()
			}
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("open events: %s is not pinned in %s (is the BPF datapath loaded, and up to date?)", name, pinDir)
			}
			return nil, fmt.Errorf("open events: load pinned %s: %w", name, err)
		}
		ms[i] = m
	}
	r, err := newEventReader(ms[0], ms[1], ms[2])
	if err != nil {
		for _, m := range ms {
			m.Close()
		}
		return nil, err
	}
	return r, nil
}

// newEventReader takes ownership of the three maps.
func newEventReader(events, cfg, lost *ebpf.Map) (*EventReader, error) {
	rd, err := ringbuf.NewReader(events)
	if err != nil {
		return nil, fmt.Errorf("open events: ring reader: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		rd.Close()
		return nil, fmt.Errorf("open events: read monotonic clock: %w", err)
	}
	off := time.Duration(time.Now().UnixNano() - ts.Nano())
	r := &EventReader{events: events, cfg: cfg, lost: lost, rd: rd, monoOffset: off}
	r.discard()
	return r, nil
}

// discard skips the records already in the ring: the tail of an earlier
// reader's session (written before it turned the events off), or what the
// programs wrote while an agent that had them on was down.
func (r *EventReader) discard() {
	var rec ringbuf.Record
	for {
		r.rd.SetDeadline(time.Now())
		if err := r.rd.ReadInto(&rec); err != nil {
			break
		}
	}
	r.rd.SetDeadline(time.Time{})
}

// Configure writes which events the programs emit. The zero config stops
// them all: then no program reserves anything in the ring.
func (r *EventReader) Configure(c EventsConfig) error {
	var v podEventsCfg
	if c.Drops {
		v.Flags |= eventsFlagDrops
	}
	if c.Forwarded {
		v.Flags |= eventsFlagForwarded
		v.SampleRate = c.SampleRate
	}
	if err := r.cfg.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("configure events: %w", err)
	}
	return nil
}

// Read blocks until the next event, or returns an error wrapping
// os.ErrClosed once Close was called.
func (r *EventReader) Read() (Event, error) {
	rec, err := r.rd.Read()
	if err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return Event{}, fmt.Errorf("read event: %w", os.ErrClosed)
		}
		return Event{}, fmt.Errorf("read event: %w", err)
	}
	return r.decode(rec.RawSample)
}

func (r *EventReader) decode(raw []byte) (Event, error) {
	var ev podLkEvent
	if err := binary.Read(bytes.NewReader(raw), nativeEndian, &ev); err != nil {
		return Event{}, fmt.Errorf("decode event of %d bytes: %w", len(raw), err)
	}
	out := Event{
		Time:       time.Unix(0, 0).Add(r.monoOffset + time.Duration(ev.TsNs)),
		Kind:       EventKind(ev.Kind),
		Reason:     DropReason(ev.Reason),
		EndpointID: ev.EpId,
		PeerID:     ev.PeerEpId,
		IfIndex:    ev.Ifindex,
		Len:        ev.Len,
		EtherType:  ntohs(ev.L3Proto),
		Proto:      ev.L4Proto,
		SrcPort:    ntohs(ev.Sport),
		DstPort:    ntohs(ev.Dport),
	}
	if out.EtherType == unix.ETH_P_IP {
		// __be32 in memory: the bytes are the address in network order.
		out.Src = netip.AddrFrom4(u32Bytes(ev.Saddr))
		out.Dst = netip.AddrFrom4(u32Bytes(ev.Daddr))
	}
	return out, nil
}

// Lost returns how many events the programs could not write because the
// ring was full, since the maps were created (summed over CPUs).
func (r *EventReader) Lost() (uint64, error) {
	var per []uint64
	if err := r.lost.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read lost events: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// Close stops emission (best effort), unblocks Read and releases the maps.
func (r *EventReader) Close() error {
	cfgErr := r.Configure(EventsConfig{})
	return errors.Join(cfgErr, r.rd.Close(), r.events.Close(), r.cfg.Close(), r.lost.Close())
}

func ntohs(v uint16) uint16 {
	var b [2]byte
	nativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

func u32Bytes(v uint32) [4]byte {
	var b [4]byte
	nativeEndian.PutUint32(b[:], v)
	return b
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t (zero: no
// deadline).
func (r *EventReader) SetDeadline(t time.Time) { r.rd.SetDeadline(t) }
