package agent

// What arrives from other nodes for an incoming VM endpoint (the target of
// a live migration, not switched over yet) is dropped, not routed back.
// Until the switch-over this node routes the VM's address to the source
// (the claims; its own pods reach the VM there); the source hands the
// address over to this node when its backend sees the device stop
// (vmhandover.go), some 100 ms or more before the target's device starts
// here. Frames sent meanwhile would bounce between the two nodes until
// their TTL ran out. A policy rule per incoming address — from the uplink,
// to the address: blackhole — drops them on arrival, before the route back;
// this node's own traffic (its pods, itself) still follows the route to
// the source. The rules go when the endpoint is activated or removed; a
// restarted agent reconciles them with its incoming endpoints. Without an
// uplink (--uplink) there are none.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/endpoint"
)

// incomingDropPriority is the rules' priority: before the main table.
const incomingDropPriority = 1000

func (a *Agent) incomingDropRule(addr netip.Addr) *netlink.Rule {
	r := netlink.NewRule()
	r.Priority, r.IifName, r.Dst, r.Type, r.Protocol = incomingDropPriority, a.cfg.Uplink, host32(addr), unix.RTN_BLACKHOLE, uint8(rtProtoLanekit)
	r.Family = unix.AF_INET
	if addr.Is6() {
		r.Family = unix.AF_INET6
	}
	return r
}

// addIncomingDrops drops what the uplink brings for incoming ep's addresses.
func (a *Agent) addIncomingDrops(ep *endpoint.Endpoint) error {
	if a.cfg.Uplink == "" {
		return nil
	}
	return a.host.Do(func() error {
		for _, addr := range addrsOf(ep) {
			if err := netlink.RuleAdd(a.incomingDropRule(addr)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("drop rule for incoming %s from %s: %w", addr, a.cfg.Uplink, err)
			}
		}
		return nil
	})
}

// delIncomingDrops removes ep's drop rules (gone already: no error).
func (a *Agent) delIncomingDrops(ep *endpoint.Endpoint) error {
	if a.cfg.Uplink == "" {
		return nil
	}
	return a.host.Do(func() error {
		for _, addr := range addrsOf(ep) {
			if err := netlink.RuleDel(a.incomingDropRule(addr)); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove drop rule for %s: %w", addr, err)
			}
		}
		return nil
	})
}

// syncIncomingDrops makes the drop rules those of the incoming endpoints
// among eps (a restarted agent; mu held or no one else running).
func (a *Agent) syncIncomingDrops(eps []endpoint.Endpoint) error {
	want := map[netip.Addr]bool{}
	for i := range eps {
		ep := &eps[i]
		if !ep.Pending && ep.VM != nil && ep.VM.Migration != nil && ep.VM.Migration.State == endpoint.VMIncoming && a.cfg.Uplink != "" {
			for _, addr := range addrsOf(ep) {
				want[addr] = true
			}
		}
	}
	return a.host.Do(func() error {
		var errs []error
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(fam)
			if err != nil {
				return fmt.Errorf("list rules: %w", err)
			}
			for _, r := range rules {
				if r.Protocol != uint8(rtProtoLanekit) || r.Priority != incomingDropPriority || r.Dst == nil {
					continue
				}
				addr, ok := netip.AddrFromSlice(r.Dst.IP)
				ones, bits := r.Dst.Mask.Size()
				if addr = addr.Unmap(); ok && ones == bits && want[addr] && r.IifName == a.cfg.Uplink {
					delete(want, addr)
					continue
				}
				if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("remove stale drop rule for %s: %w", r.Dst, err))
				}
			}
		}
		for addr := range want {
			if err := netlink.RuleAdd(a.incomingDropRule(addr)); err != nil && !errors.Is(err, unix.EEXIST) {
				errs = append(errs, fmt.Errorf("drop rule for incoming %s: %w", addr, err))
			}
		}
		return errors.Join(errs...)
	})
}
