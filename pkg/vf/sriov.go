package vf

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// SRIOV is the hardware VF: a PCI virtual function of the DPU's PF in
// switchdev mode. Its representor is a netdev on the DPU with the PF's
// phys_switch_id and phys_port_name "pf<P>vf<N>"; the VF's MAC is set
// through the PF (IFLA_VFINFO_LIST/IFLA_VF_MAC). Claiming a VF renames its
// representor to the endpoint's device name and keeps the original name in
// the representor's ifalias, so Delete can give it back.
type SRIOV struct {
	PF    string // the PF's netdev on the DPU
	Sysfs string // "" means /sys
	// Send executes a netlink request; nil: NETLINK_ROUTE with an ACK.
	// Tests record the requests instead (no hardware here).
	Send func(*nl.NetlinkRequest) error
}

// Kind is KindSRIOV.
func (SRIOV) Kind() string { return KindSRIOV }

func (s SRIOV) sysfs() string {
	if s.Sysfs == "" {
		return "/sys"
	}
	return s.Sysfs
}

func (s SRIOV) send(req *nl.NetlinkRequest) error {
	if s.Send != nil {
		return s.Send(req)
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

func readIfindex(sysfs, name string) (int, error) {
	v, err := readTrim(filepath.Join(sysfs, "class/net", name, "ifindex"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

var vfPortName = regexp.MustCompile(`^pf\d+vf(\d+)$`)

// rep is a representor found in sysfs.
type rep struct {
	vf      uint32
	name    string
	ifindex int
}

// representors lists the PF's VF representors, by VF number.
func (s SRIOV) representors() ([]rep, error) {
	sw, err := readTrim(filepath.Join(s.sysfs(), "class/net", s.PF, "phys_switch_id"))
	if err != nil || sw == "" {
		return nil, fmt.Errorf("pf %s: no phys_switch_id (not in switchdev mode?): %v", s.PF, err)
	}
	ents, err := os.ReadDir(filepath.Join(s.sysfs(), "class/net"))
	if err != nil {
		return nil, fmt.Errorf("list netdevs: %w", err)
	}
	var out []rep
	for _, e := range ents {
		dir := filepath.Join(s.sysfs(), "class/net", e.Name())
		if id, _ := readTrim(filepath.Join(dir, "phys_switch_id")); id != sw {
			continue
		}
		pn, _ := readTrim(filepath.Join(dir, "phys_port_name"))
		m := vfPortName.FindStringSubmatch(pn)
		if m == nil {
			continue
		}
		n, _ := strconv.ParseUint(m[1], 10, 32)
		idx, err := readIfindex(s.sysfs(), e.Name())
		if err != nil {
			return nil, fmt.Errorf("representor %s: ifindex: %w", e.Name(), err)
		}
		out = append(out, rep{vf: uint32(n), name: e.Name(), ifindex: idx})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].vf < out[j].vf })
	return out, nil
}

// Create claims the lowest VF whose representor no endpoint has (its name
// does not start with "lk"): sets the VF's MAC through the PF, records the
// representor's name in its ifalias, renames it to rep and sets its MTU.
func (s SRIOV) Create(name string, mtu int) (VF, error) {
	if err := checkRep(name); err != nil {
		return VF{}, err
	}
	reps, err := s.representors()
	if err != nil {
		return VF{}, fmt.Errorf("create vf for %s: %w", name, err)
	}
	pfIndex, err := readIfindex(s.sysfs(), s.PF)
	if err != nil {
		return VF{}, fmt.Errorf("create vf for %s: pf %s: %w", name, s.PF, err)
	}
	for _, r := range reps {
		if strings.HasPrefix(r.name, "lk") {
			continue
		}
		mac := MACFor(name)
		for _, req := range []*nl.NetlinkRequest{
			vfMACRequest(pfIndex, r.vf, mac),
			setLinkRequest(r.ifindex, unix.IFLA_IFALIAS, nl.ZeroTerminated(r.name)),
			setLinkRequest(r.ifindex, unix.IFLA_IFNAME, nl.ZeroTerminated(name)),
			setLinkRequest(r.ifindex, unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))),
		} {
			if err := s.send(req); err != nil {
				return VF{}, fmt.Errorf("create vf %d for %s: %w", r.vf, name, err)
			}
		}
		return VF{Kind: KindSRIOV, Index: r.vf, MAC: mac, Representor: name}, nil
	}
	return VF{}, fmt.Errorf("create vf for %s on %s (%d VFs): %w", name, s.PF, len(reps), ErrNoFreeVF)
}

// Delete gives the VF of representor name back: representor down and
// renamed to the name in its ifalias, the VF's MAC cleared.
func (s SRIOV) Delete(name string) error {
	reps, err := s.representors()
	if err != nil {
		return fmt.Errorf("delete vf of %s: %w", name, err)
	}
	pfIndex, err := readIfindex(s.sysfs(), s.PF)
	if err != nil {
		return fmt.Errorf("delete vf of %s: pf %s: %w", name, s.PF, err)
	}
	for _, r := range reps {
		if r.name != name {
			continue
		}
		orig, _ := readTrim(filepath.Join(s.sysfs(), "class/net", name, "ifalias"))
		if orig == "" {
			orig = fmt.Sprintf("%sv%d", s.PF, r.vf)
		}
		down := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
		msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
		msg.Index, msg.Change = int32(r.ifindex), unix.IFF_UP
		down.AddData(msg)
		for _, req := range []*nl.NetlinkRequest{
			down,
			setLinkRequest(r.ifindex, unix.IFLA_IFNAME, nl.ZeroTerminated(orig)),
			setLinkRequest(r.ifindex, unix.IFLA_IFALIAS, []byte{}),
			vfMACRequest(pfIndex, r.vf, make(net.HardwareAddr, 6)),
		} {
			if err := s.send(req); err != nil {
				return fmt.Errorf("delete vf %d of %s: %w", r.vf, name, err)
			}
		}
		return nil
	}
	return nil // no such representor: nothing to give back
}

// Describe is the VF of representor name (its number from sysfs).
func (s SRIOV) Describe(name string, mac net.HardwareAddr) VF {
	out := VF{Kind: KindSRIOV, MAC: mac, Representor: name}
	if pn, err := readTrim(filepath.Join(s.sysfs(), "class/net", name, "phys_port_name")); err == nil {
		if m := vfPortName.FindStringSubmatch(pn); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 32)
			out.Index = uint32(n)
		}
	}
	return out
}

// setLinkRequest is RTM_NEWLINK on ifindex with one attribute (what
// `ip link set` sends).
func setLinkRequest(ifindex int, attr int, value []byte) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(attr, value))
	return req
}

// vfMACRequest sets VF vf's MAC through its PF (`ip link set PF vf N mac M`).
func vfMACRequest(pfIndex int, vf uint32, mac net.HardwareAddr) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(pfIndex)
	req.AddData(msg)
	list := nl.NewRtAttr(unix.IFLA_VFINFO_LIST, nil)
	info := list.AddRtAttr(nl.IFLA_VF_INFO, nil)
	vm := nl.VfMac{Vf: vf}
	copy(vm.Mac[:], mac)
	info.AddRtAttr(nl.IFLA_VF_MAC, vm.Serialize())
	req.AddData(list)
	return req
}

// HostVFName is the netdev of VF index of the host's PF pf:
// <sysfs>/class/net/<pf>/device/virtfn<index>/net/<name>.
func HostVFName(sysfs, pf string, index uint32) (string, error) {
	if sysfs == "" {
		sysfs = "/sys"
	}
	dir := filepath.Join(sysfs, "class/net", pf, "device", fmt.Sprintf("virtfn%d", index), "net")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("vf %d of %s: %w", index, pf, err)
	}
	if len(ents) != 1 {
		return "", fmt.Errorf("vf %d of %s: %d netdevs under %s (bound to a non-netdev driver?)", index, pf, len(ents), dir)
	}
	return ents[0].Name(), nil
}
