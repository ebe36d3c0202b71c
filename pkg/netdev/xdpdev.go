package netdev

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// From the kernel's include/uapi/linux/netdev.h (generic netlink family "netdev").
const (
	netdevCmdDevGet         = 1
	netdevADevIfindex       = 1
	netdevADevXDPFeatures   = 3
	netdevXDPActBasic       = 1 << 0
	netdevXDPActRedirect    = 1 << 1
	netdevXDPActNdoXmit     = 1 << 2
	netdevXDPActXSKZeroCopy = 1 << 3
)

// DeviceXDP is what a device's driver says it can do with XDP, asked through
// the netdev generic netlink family (Linux >= 6.3): nothing is attached.
type DeviceXDP struct {
	Native   bool // native (driver) XDP
	Redirect bool // XDP_REDIRECT out of the device
	NdoXmit  bool // can be the target of XDP_REDIRECT
	ZeroCopy bool // AF_XDP zero-copy
}

// genlHeader is struct genlmsghdr with its reserved field written as zero.
// nl.Genlmsg is a 2-byte struct whose Serialize reads 4 bytes through
// unsafe, so its "reserved" bytes are whatever the heap holds next to it;
// the kernel rejects a non-zero reserved field with EINVAL for families that
// validate it (netdev does, for every command), hence never use nl.Genlmsg.
type genlHeader struct{ cmd, version uint8 }

func (h genlHeader) Len() int          { return nl.SizeofGenlmsg }
func (h genlHeader) Serialize() []byte { return []byte{h.cmd, h.version, 0, 0} }

// devGetRequest builds NETDEV_CMD_DEV_GET for one device (the "do" form:
// NLM_F_REQUEST only, NETDEV_A_DEV_IFINDEX set), not a dump of every device.
func devGetRequest(family uint16, version uint8, ifindex int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(family), 0)
	req.AddData(genlHeader{cmd: netdevCmdDevGet, version: version})
	req.AddData(nl.NewRtAttr(netdevADevIfindex, nl.Uint32Attr(uint32(ifindex))))
	return req
}

// XDPFeatures asks the kernel which XDP actions the driver of ifname
// supports. The calling thread must be in the device's namespace (the
// netlink socket is opened there, and the ifindex is looked up there).
func XDPFeatures(ifname string) (DeviceXDP, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: %w", ifname, err)
	}
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: generic netlink family netdev: %w", ifname, err)
	}
	// Execute opens a socket in the current thread's namespace and only
	// accepts answers carrying our sequence number and port id.
	req := devGetRequest(fam.ID, uint8(fam.Version), ifc.Index)
	msgs, err := req.Execute(unix.NETLINK_GENERIC, fam.ID)
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s (ifindex %d): %w", ifname, ifc.Index, err)
	}
	if len(msgs) != 1 {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: %d answers to a single-device request", ifname, len(msgs))
	}
	return parseDevGet(ifname, ifc.Index, msgs[0])
}

// parseDevGet decodes one NETDEV_CMD_DEV_GET answer (genl header and
// attributes) for the device with ifindex.
func parseDevGet(ifname string, ifindex int, m []byte) (DeviceXDP, error) {
	if len(m) < nl.SizeofGenlmsg {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: short answer (%d bytes)", ifname, len(m))
	}
	attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: parse: %w", ifname, err)
	}
	idx, v, have := -1, uint64(0), false
	for _, a := range attrs {
		switch {
		case a.Attr.Type == netdevADevIfindex && len(a.Value) >= 4:
			idx = int(binary.NativeEndian.Uint32(a.Value))
		case a.Attr.Type == netdevADevXDPFeatures && len(a.Value) >= 8:
			v, have = binary.NativeEndian.Uint64(a.Value), true
		}
	}
	if idx != ifindex {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: the kernel answered for ifindex %d, asked %d", ifname, idx, ifindex)
	}
	if !have {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: no xdp-features attribute in the answer", ifname)
	}
	return DeviceXDP{
		Native: v&netdevXDPActBasic != 0, Redirect: v&netdevXDPActRedirect != 0,
		NdoXmit: v&netdevXDPActNdoXmit != 0, ZeroCopy: v&netdevXDPActXSKZeroCopy != 0,
	}, nil
}

// probeZeroCopy reports whether the uplink's driver does AF_XDP zero-copy.
func probeZeroCopy(uplink string) Feature {
	x, err := XDPFeatures(uplink)
	if err != nil {
		drv := "unknown driver"
		if p, lerr := os.Readlink("/sys/class/net/" + uplink + "/device/driver"); lerr == nil {
			drv = "driver " + filepath.Base(p)
		}
		return Feature{Unknown: true, Detail: fmt.Sprintf("%s (%s): the kernel did not answer the netdev netlink query: %v", uplink, drv, err)}
	}
	if x.ZeroCopy {
		return Feature{Supported: true, Detail: uplink + " driver supports AF_XDP zero-copy"}
	}
	native := "no native XDP"
	if x.Native {
		native = "native XDP"
	}
	return Feature{Detail: fmt.Sprintf("%s driver: %s, no AF_XDP zero-copy (copy mode only)", uplink, native)}
}
