package netdev

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// netkit UAPI numbers, from the kernel's include/uapi/linux/if_link.h
// (not from a library: we build the request ourselves and test its bytes).
const (
	iflaNetkitPeerInfo   = 1
	iflaNetkitPrimary    = 2
	iflaNetkitPolicy     = 3
	iflaNetkitPeerPolicy = 4
	iflaNetkitMode       = 5
	iflaNetkitScrub      = 6
	iflaNetkitPeerScrub  = 7
	iflaNetkitHeadroom   = 8
	iflaNetkitTailroom   = 9
)

// NetkitMode is enum netkit_mode.
type NetkitMode uint32

const (
	NetkitL2 NetkitMode = 0
	NetkitL3 NetkitMode = 1
)

// NetkitPolicy is the default action (enum netkit_action) when no program
// is attached.
type NetkitPolicy uint32

const (
	NetkitPass NetkitPolicy = 0 // NETKIT_PASS: forward
	NetkitDrop NetkitPolicy = 2 // NETKIT_DROP: blackhole
)

// NetkitSpec describes a netkit pair to create.
type NetkitSpec struct {
	Name        string // primary (host side)
	PeerName    string
	MTU         int // 0: kernel default
	PeerNetnsFd int // >0: create the peer directly in that namespace
	Mode        NetkitMode
	PeerMAC     net.HardwareAddr // L2 only; nil: the kernel's random one
	Policy      NetkitPolicy     // primary's default policy
	PeerPolicy  NetkitPolicy
}

// netkitRequest builds the RTM_NEWLINK request for spec. Scrub attributes
// are left out so the kernel keeps its default (NETKIT_SCRUB_DEFAULT);
// vishvananda/netlink always sends them, as zero (NONE).
func netkitRequest(spec NetkitSpec) (*nl.NetlinkRequest, error) {
	if spec.Name == "" || spec.PeerName == "" {
		return nil, errors.New("netkit request: name and peer name are required")
	}
	if len(spec.Name) > 15 || len(spec.PeerName) > 15 {
		return nil, fmt.Errorf("netkit request: %q/%q longer than 15 characters", spec.Name, spec.PeerName)
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(spec.Name)))
	if spec.MTU > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(spec.MTU))))
	}
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("netkit"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)

	peer := data.AddRtAttr(iflaNetkitPeerInfo, nil)
	peer.AddChild(nl.NewIfInfomsg(unix.AF_UNSPEC))
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(spec.PeerName))
	if spec.MTU > 0 {
		peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(spec.MTU)))
	}
	if spec.PeerNetnsFd > 0 {
		peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(spec.PeerNetnsFd)))
	}
	if len(spec.PeerMAC) > 0 {
		if spec.Mode != NetkitL2 || len(spec.PeerMAC) != 6 {
			return nil, fmt.Errorf("netkit request: peer MAC %v needs L2 mode and 6 bytes", spec.PeerMAC)
		}
		peer.AddRtAttr(unix.IFLA_ADDRESS, []byte(spec.PeerMAC))
	}
	data.AddRtAttr(iflaNetkitPolicy, nl.Uint32Attr(uint32(spec.Policy)))
	data.AddRtAttr(iflaNetkitPeerPolicy, nl.Uint32Attr(uint32(spec.PeerPolicy)))
	data.AddRtAttr(iflaNetkitMode, nl.Uint32Attr(uint32(spec.Mode)))
	req.AddData(info)
	return req, nil
}

// CreateNetkit creates a netkit pair in the calling thread's namespace.
func CreateNetkit(spec NetkitSpec) error {
	req, err := netkitRequest(spec)
	if err != nil {
		return err
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		if isUnsupportedKind(err) {
			return fmt.Errorf("create netkit %s: %w: %w", spec.Name, ErrNotSupported, err)
		}
		return fmt.Errorf("create netkit %s: %w", spec.Name, err)
	}
	return nil
}

// ErrNotSupported is returned when the kernel lacks a device kind.
var ErrNotSupported = errors.New("not supported by this kernel")

func isUnsupportedKind(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) ||
		strings.Contains(strings.ToLower(err.Error()), "unknown device type")
}

// ProbeNetkit reports whether the kernel can create netkit devices, by
// creating (and deleting) a pair in the host namespace. reason explains the
// answer for `lanekit status`.
func (h *Host) ProbeNetkit() (ok bool, reason string) {
	pid := os.Getpid() % 10000000
	name := fmt.Sprintf("lkprobe%d", pid)
	err := h.Do(func() error {
		err := CreateNetkit(NetkitSpec{
			Name: name, PeerName: fmt.Sprintf("lkprobp%d", pid),
			Mode: NetkitL3, Policy: NetkitPass, PeerPolicy: NetkitDrop,
		})
		if err != nil {
			return err
		}
		if l, lerr := netlink.LinkByName(name); lerr == nil {
			netlink.LinkDel(l)
		}
		return nil
	})
	if err == nil {
		return true, "netkit pair created by start-up probe"
	}
	if errors.Is(err, ErrNotSupported) {
		return false, fmt.Sprintf("kernel has no netkit (probe: %v)", err)
	}
	return false, fmt.Sprintf("netkit probe failed: %v", err)
}
