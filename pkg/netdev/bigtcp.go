package netdev

// BIG TCP (issue 42): the TCP stack builds GSO packets, and GRO merges
// received ones, of up to gso_max_size / gro_max_size bytes (IPv6) and
// gso_ipv4_max_size / gro_ipv4_max_size (IPv4, Linux >= 6.3) instead of
// 64 KiB, so a pod's stream costs fewer passes through the stack and the
// datapath per byte. The sizes are per device: the sending pod's device
// bounds what its stack builds, the receiving device what GRO merges. A
// device's driver bounds them by its tso_max_size (veth: 512 KiB; a NIC
// without BIG TCP support: 64 KiB).

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
)

const (
	// BIGTCPSize is the GSO/GRO size BIG TCP sets (192 KiB, Cilium's).
	BIGTCPSize = 196608
	// LegacyGSOMaxSize is the kernel's default (and the limit without BIG TCP).
	LegacyGSOMaxSize = 65536
)

// BIGTCP is the GSO/GRO maximum size per family that the agent gives its
// devices; 0 leaves a family at the kernel's 64 KiB default.
type BIGTCP struct {
	IPv4, IPv6 int
}

// On says whether any family uses BIG TCP.
func (b BIGTCP) On() bool { return b.IPv4 > 0 || b.IPv6 > 0 }

// ProbeBIGTCP reports which BIG TCP sizes link supports: IPv6 when its driver
// accepts TSO packets above 64 KiB (tso_max_size), IPv4 when the kernel also
// has the IPv4 attributes (it reports gso_ipv4_max_size). Each size is
// BIGTCPSize bounded by tso_max_size. detail says why a family is off.
func ProbeBIGTCP(link netlink.Link) (b BIGTCP, detail string) {
	la := link.Attrs()
	size := min(BIGTCPSize, int(la.TSOMaxSize))
	if size <= LegacyGSOMaxSize {
		return b, fmt.Sprintf("%s: driver's tso_max_size %d (no TSO above 64 KiB)", la.Name, la.TSOMaxSize)
	}
	b.IPv6 = size
	if la.GSOIPv4MaxSize == 0 {
		return b, fmt.Sprintf("%s: kernel has no gso_ipv4_max_size (Linux >= 6.3): IPv6 only", la.Name)
	}
	b.IPv4 = size
	return b, fmt.Sprintf("%s: tso_max_size %d", la.Name, la.TSOMaxSize)
}

// setBIGTCP gives link the GSO and GRO sizes of b (a family at 0: 64 KiB),
// in the calling thread's namespace. The IPv4 sizes come last: setting
// gso_max_size to 64 KiB also resets gso_ipv4_max_size.
func setBIGTCP(link netlink.Link, b BIGTCP) error {
	la := link.Attrs()
	v4, v6 := max(b.IPv4, LegacyGSOMaxSize), max(b.IPv6, LegacyGSOMaxSize)
	has4 := la.GSOIPv4MaxSize != 0 // the kernel reports the IPv4 attributes
	for _, s := range []struct {
		name string
		want int
		set  func(netlink.Link, int) error
	}{
		{"gro_max_size", v6, netlink.LinkSetGROMaxSize},
		{"gso_max_size", v6, netlink.LinkSetGSOMaxSize},
		{"gro_ipv4_max_size", v4, netlink.LinkSetGROIPv4MaxSize},
		{"gso_ipv4_max_size", v4, netlink.LinkSetGSOIPv4MaxSize},
	} {
		if !has4 && strings.Contains(s.name, "ipv4") {
			if s.want > LegacyGSOMaxSize {
				return fmt.Errorf("%s: set %s %d: the kernel has no IPv4 BIG TCP", la.Name, s.name, s.want)
			}
			continue
		}
		if err := s.set(link, s.want); err != nil {
			return fmt.Errorf("%s: set %s %d: %w", la.Name, s.name, s.want, err)
		}
	}
	return nil
}

// SetBIGTCP gives the device name in h's namespace the sizes of b.
func (h *Host) SetBIGTCP(name string, b BIGTCP) error {
	return h.Do(func() error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("big tcp: %w", err)
		}
		return setBIGTCP(link, b)
	})
}

// ProbeBIGTCP probes the device name in h's namespace (see ProbeBIGTCP).
func (h *Host) ProbeBIGTCP(name string) (b BIGTCP, detail string, err error) {
	err = h.Do(func() error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		b, detail = ProbeBIGTCP(link)
		return nil
	})
	return b, detail, err
}

// bigTCPFeature turns a probe into a Feature row: supported when IPv6 or
// IPv4 gets more than 64 KiB.
func bigTCPFeature(b BIGTCP, detail string) Feature {
	return Feature{Supported: b.On(), Detail: fmt.Sprintf("IPv4 %d, IPv6 %d (%s)", max(b.IPv4, LegacyGSOMaxSize), max(b.IPv6, LegacyGSOMaxSize), detail)}
}

// probeVethBIGTCP probes the kernel's BIG TCP with a veth pair in the
// current (scratch) namespace.
func probeVethBIGTCP() Feature {
	link, del, err := probeVeth()
	if err != nil {
		return Feature{Unknown: permissionDenied(err.Error()), Detail: err.Error()}
	}
	defer del()
	return bigTCPFeature(ProbeBIGTCP(link))
}

// probeVeth creates the veth pair lkprobe0/lkprobe1 in the current (scratch)
// namespace for a probe and returns lkprobe0 as the kernel reports it; del
// removes the pair.
func probeVeth() (link netlink.Link, del func(), err error) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lkprobe0"}, PeerName: "lkprobe1"}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("create a veth: %w", err)
	}
	if link, err = netlink.LinkByName(veth.Name); err != nil {
		netlink.LinkDel(veth)
		return nil, nil, fmt.Errorf("create a veth: %w", err)
	}
	return link, func() { netlink.LinkDel(veth) }, nil
}

// probeLinkBIGTCP probes device name in the current namespace.
func probeLinkBIGTCP(name string) Feature {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return Feature{Unknown: true, Detail: err.Error()}
	}
	return bigTCPFeature(ProbeBIGTCP(link))
}
