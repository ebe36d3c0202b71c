package netdev

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// EnsureFQ makes fq the root qdisc of device name in h's namespace: fq
// paces packets by their departure time (EDT, bpf/lib/edt.h). A device that
// has it already is left alone; changed says whether the qdisc was
// replaced. One fq for all transmit queues (Cilium puts one under mq per
// queue, which scales better on multiqueue NICs).
func (h *Host) EnsureFQ(name string) (changed bool, err error) {
	err = h.Do(func() error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("fq on %s: %w", name, err)
		}
		qs, err := netlink.QdiscList(link)
		if err != nil {
			return fmt.Errorf("fq on %s: list qdiscs: %w", name, err)
		}
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Type() == "fq" {
				return nil
			}
		}
		fq := netlink.NewFq(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})
		if err := netlink.QdiscReplace(fq); err != nil {
			return fmt.Errorf("fq on %s: %w", name, err)
		}
		changed = true
		return nil
	})
	return changed, err
}

// ProbeFQ says whether the kernel has the fq qdisc (CONFIG_NET_SCH_FQ),
// trying it on a veth in a scratch namespace.
func ProbeFQ() Feature {
	var f Feature
	err := inScratchNetns(func() {
		link, del, err := probeVeth()
		if err != nil {
			f = Feature{Unknown: true, Detail: err.Error()}
			return
		}
		defer del()
		if err := netlink.QdiscReplace(netlink.NewFq(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})); err != nil {
			f = Feature{Detail: fmt.Sprintf("fq qdisc: %v (CONFIG_NET_SCH_FQ)", err)}
			return
		}
		f = Feature{Supported: true, Detail: "fq qdisc"}
	})
	if err != nil {
		return Feature{Unknown: true, Detail: fmt.Sprintf("needs a scratch network namespace: %v", err)}
	}
	return f
}

// SetPodEgressTBF shapes what the pod device ifname in namespace netnsPath
// sends to bitsPerSec with a tbf root qdisc (0: removes it), as the CNI
// bandwidth plugin does: the fallback for a kernel without fq. The burst
// is 5 ms at the rate (at least 64 KiB), the queue 50 ms more.
func SetPodEgressTBF(netnsPath, ifname string, bitsPerSec uint64) error {
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		return fmt.Errorf("tbf on %s: %w", ifname, err)
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("tbf on %s: %w", ifname, err)
		}
		root := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
		if bitsPerSec == 0 {
			qs, err := netlink.QdiscList(link)
			if err != nil {
				return fmt.Errorf("tbf on %s: %w", ifname, err)
			}
			for _, q := range qs {
				if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Type() == "tbf" {
					if err := netlink.QdiscDel(q); err != nil {
						return fmt.Errorf("remove tbf on %s: %w", ifname, err)
					}
				}
			}
			return nil
		}
		rate := bitsPerSec / 8 // bytes per second
		burst := max(uint32(rate/200), 64<<10)
		tbf := &netlink.Tbf{QdiscAttrs: root, Rate: rate, Buffer: netlink.Xmittime(rate, burst), Limit: burst + uint32(rate/20)}
		if err := netlink.QdiscReplace(tbf); err != nil {
			return fmt.Errorf("tbf on %s: %w", ifname, err)
		}
		return nil
	})
}

// PodEgressTBF reads the rate of the tbf root qdisc of ifname in netnsPath
// (bits/s; 0: none).
func PodEgressTBF(netnsPath, ifname string) (uint64, error) {
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		return 0, err
	}
	defer podNS.Close()
	var bps uint64
	err = podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(link)
		for _, q := range qs {
			if t, ok := q.(*netlink.Tbf); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
				bps = t.Rate * 8
			}
		}
		return err
	})
	return bps, err
}
