// Package rss is lanekit's receive-side scaling: the Toeplitz hash as virtio
// and Microsoft RSS define it (computed in BPF, bpf/lib/toeplitz.h), a helper
// that runs that BPF code on a frame through BPF_PROG_TEST_RUN (Hasher), and
// the steering program of a multiqueue tap (bpf/tun_steer.c) with its maps in
// QEMU's rss.bpf.c layout (Steering).
package rss

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// KeySize is the length of an RSS key (virtio and Microsoft RSS: 40 bytes).
const KeySize = 40

// TableSize is the capacity of the indirection table (QEMU's rss.bpf.c and
// VIRTIO_NET_RSS_MAX_TABLE_LEN are both 128).
const TableSize = 128

// Key is a Toeplitz secret key.
type Key [KeySize]byte

// DefaultKey is the key of Microsoft's RSS verification suite, also the
// default of many NIC drivers.
var DefaultKey = Key{
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2,
	0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4,
	0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
}

// KeyOrDefault parses s as ParseKey does; empty s is DefaultKey.
func KeyOrDefault(s string) (Key, error) {
	if s == "" {
		return DefaultKey, nil
	}
	return ParseKey(s)
}

// ParseKey reads a key written as 80 hex digits, optionally with ':' between
// bytes (the ethtool -x form).
func ParseKey(s string) (Key, error) {
	var k Key
	clean := strings.ReplaceAll(strings.TrimPrefix(strings.TrimSpace(s), "0x"), ":", "")
	b, err := hex.DecodeString(clean)
	if err != nil {
		return k, fmt.Errorf("parse rss key: %w", err)
	}
	if len(b) != KeySize {
		return k, fmt.Errorf("parse rss key: %d bytes, want %d", len(b), KeySize)
	}
	copy(k[:], b)
	return k, nil
}

// String is the key as 80 hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// qemuBytes is the key in the value layout of QEMU's toeplitz key map: the
// first four bytes as one host-order (little-endian here) u32 holding their
// big-endian value, then bytes 4..39 as they are.
func (k Key) qemuBytes() []byte {
	out := make([]byte, KeySize)
	binary.LittleEndian.PutUint32(out[:4], binary.BigEndian.Uint32(k[:4]))
	copy(out[4:], k[4:])
	return out
}

// HashTypes is a set of VIRTIO_NET_RSS_HASH_TYPE_* bits.
type HashTypes uint32

// The hash types of the virtio spec (include/uapi/linux/virtio_net.h).
const (
	TypeIPv4  HashTypes = 1 << 0
	TypeTCPv4 HashTypes = 1 << 1
	TypeUDPv4 HashTypes = 1 << 2
	TypeIPv6  HashTypes = 1 << 3
	TypeTCPv6 HashTypes = 1 << 4
	TypeUDPv6 HashTypes = 1 << 5
	// AllTypes is every type lanekit computes (no _EX types).
	AllTypes = TypeIPv4 | TypeTCPv4 | TypeUDPv4 | TypeIPv6 | TypeTCPv6 | TypeUDPv6
)

var typeNames = []struct {
	name string
	t    HashTypes
}{
	{"ipv4", TypeIPv4}, {"tcpv4", TypeTCPv4}, {"udpv4", TypeUDPv4},
	{"ipv6", TypeIPv6}, {"tcpv6", TypeTCPv6}, {"udpv6", TypeUDPv6},
}

// ParseHashTypes reads a comma-separated list of ipv4, tcpv4, udpv4, ipv6,
// tcpv6, udpv6, or "all".
func ParseHashTypes(s string) (HashTypes, error) {
	var t HashTypes
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "all" {
			t |= AllTypes
			continue
		}
		found := false
		for _, n := range typeNames {
			if n.name == f {
				t |= n.t
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown hash type %q (want ipv4, tcpv4, udpv4, ipv6, tcpv6, udpv6 or all)", f)
		}
	}
	return t, nil
}

func (t HashTypes) String() string {
	var parts []string
	for _, n := range typeNames {
		if t&n.t != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, ",")
}

// Report is a VIRTIO_NET_HASH_REPORT_* value: which input a hash covers.
type Report uint32

// The hash report types lanekit produces.
const (
	ReportNone  Report = 0
	ReportIPv4  Report = 1
	ReportTCPv4 Report = 2
	ReportUDPv4 Report = 3
	ReportIPv6  Report = 4
	ReportTCPv6 Report = 5
	ReportUDPv6 Report = 6
)

func (r Report) String() string {
	switch r {
	case ReportNone:
		return "none"
	case ReportIPv4:
		return "ipv4"
	case ReportTCPv4:
		return "tcpv4"
	case ReportUDPv4:
		return "udpv4"
	case ReportIPv6:
		return "ipv6"
	case ReportTCPv6:
		return "tcpv6"
	case ReportUDPv6:
		return "udpv6"
	}
	return fmt.Sprintf("report(%d)", uint32(r))
}

// Config is the steering configuration of a tap, QEMU's struct rss_config_t
// plus the table.
type Config struct {
	Redirect     bool // false: everything to DefaultQueue
	PopulateHash bool // stored for QEMU compatibility; unused on a tap
	HashTypes    HashTypes
	Table        []uint16 // 1..128 entries: hash % len(Table) -> queue
	DefaultQueue uint16   // packets without a hash
}

// ErrBadConfig marks configuration errors.
var ErrBadConfig = errors.New("bad rss config")

// Validate checks the table size.
func (c Config) Validate() error {
	if c.Redirect && (len(c.Table) == 0 || len(c.Table) > TableSize) {
		return fmt.Errorf("%w: indirection table has %d entries, want 1..%d", ErrBadConfig, len(c.Table), TableSize)
	}
	return nil
}

// qemuBytes is the 10-byte packed struct rss_config_t.
func (c Config) qemuBytes() []byte {
	b := make([]byte, 10)
	if c.Redirect {
		b[0] = 1
	}
	if c.PopulateHash {
		b[1] = 1
	}
	binary.LittleEndian.PutUint32(b[2:6], uint32(c.HashTypes))
	binary.LittleEndian.PutUint16(b[6:8], uint16(len(c.Table)))
	binary.LittleEndian.PutUint16(b[8:10], c.DefaultQueue)
	return b
}

// RoundRobin is the table a NIC driver writes by default: entry i -> i % queues.
func RoundRobin(queues, entries int) []uint16 {
	t := make([]uint16, entries)
	for i := range t {
		t[i] = uint16(i % queues)
	}
	return t
}

// Flow is the tuple a hash is computed on.
type Flow struct {
	Src, Dst     netip.Addr
	Sport, Dport uint16
}

// Input is the Toeplitz input of f for report type r, in the order virtio and
// Microsoft RSS specify: source address, destination address, source port,
// destination port, network byte order.
func (f Flow) Input(r Report) []byte {
	var in []byte
	in = append(in, f.Src.AsSlice()...)
	in = append(in, f.Dst.AsSlice()...)
	switch r {
	case ReportTCPv4, ReportUDPv4, ReportTCPv6, ReportUDPv6:
		in = binary.BigEndian.AppendUint16(in, f.Sport)
		in = binary.BigEndian.AppendUint16(in, f.Dport)
	}
	return in
}
