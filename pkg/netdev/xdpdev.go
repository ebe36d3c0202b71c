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

// XDPFeatures asks the kernel which XDP actions the driver of ifname
// supports. The calling thread must be in the device's namespace.
func XDPFeatures(ifname string) (DeviceXDP, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: %w", ifname, err)
	}
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: generic netlink family netdev: %w", ifname, err)
	}
	// A dump of every device, filtered here, read on our own socket.
	sock, err := nl.Subscribe(unix.NETLINK_GENERIC)
	if err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: netlink socket: %w", ifname, err)
	}
	defer sock.Close()
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_DUMP)
	req.AddData(&nl.Genlmsg{Command: netdevCmdDevGet, Version: 1})
	if err := sock.Send(req); err != nil {
		return DeviceXDP{}, fmt.Errorf("xdp features of %s: send: %w", ifname, err)
	}
	var msgs [][]byte
recv:
	for {
		batch, _, err := sock.Receive()
		if err != nil {
			return DeviceXDP{}, fmt.Errorf("xdp features of %s: receive: %w", ifname, err)
		}
		for _, m := range batch {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				break recv
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return DeviceXDP{}, fmt.Errorf("xdp features of %s: %w", ifname, unix.Errno(-errno))
					}
				}
				break recv
			}
			msgs = append(msgs, m.Data)
		}
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofGenlmsg {
			continue
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
		if idx != ifc.Index {
			continue
		}
		if !have {
			return DeviceXDP{}, fmt.Errorf("xdp features of %s: no xdp-features attribute in the answer", ifname)
		}
		return DeviceXDP{
			Native: v&netdevXDPActBasic != 0, Redirect: v&netdevXDPActRedirect != 0,
			NdoXmit: v&netdevXDPActNdoXmit != 0, ZeroCopy: v&netdevXDPActXSKZeroCopy != 0,
		}, nil
	}
	return DeviceXDP{}, fmt.Errorf("xdp features of %s: the kernel did not list ifindex %d", ifname, ifc.Index)
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
