package lab

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lanekit/lanekit/pkg/guest"
)

// The standard VM path, for the benchmark to compare the fast lane with: a
// second guest whose NIC is QEMU's own (userspace) virtio-net on a tap device
// in the node netns, attached to the baseline bridge lk-cni0 (bridge +
// iptables, like KubeVirt's bridge binding). This kernel has no vhost_net, so
// QEMU moves every frame itself (vhost=off). QEMU runs in the node netns.
const (
	TapVMName  = "vm-std"
	TapVMDev   = "lk-tap0"
	tapVMHost  = 200 // host part of its baseline address: above host-local's allocations (pods-per-node ≤ 100)
	tapVMMACFm = "52:54:00:4c:53:%02x"
)

// upTapVM starts vm-std on node i: tap on lk-cni0, QEMU, ready line. It is
// recorded in State.TapVMs; `lab down` stops QEMU through its pid file (in
// the node's run dir) and the tap goes with the node netns.
func upTapVM(ctx context.Context, cfg Config, st *State, i int) error {
	name, ns := TapVMName, NodeNS(i)
	progress(cfg.Out, "lab: vm %s: standard path (tap %s on %s, QEMU userspace virtio-net) on %s", name, TapVMDev, BaseBridge, ns)
	kernel, initrd, err := guest.EnsureImage(GuestCacheDir)
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	gw, plen, err := bridgeAddr(ctx, ns, BaseBridge)
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	addr, err := tapVMAddr(BaseCIDR(i), st.Nodes[i-1].Pods)
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	mtu := "1500"
	if out, err := inNS(ctx, ns, "cat", "/sys/class/net/"+BaseBridge+"/mtu"); err == nil {
		mtu = strings.TrimSpace(out)
	}
	if err := addTapDev(ctx, ns, mtu); err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	lv := LabVM{Name: name, Node: i, NS: ns, IP: addr, MAC: fmt.Sprintf(tapVMMACFm, i), Queues: 1,
		SerialSocket: vmFile(i, name, "serial.sock")}
	// The guest's MTU is the bridge's (a routed underlay: the flannel-style
	// VXLAN's).
	lv.MTU, _ = strconv.Atoi(mtu)
	args, err := guest.QEMUArgs(guest.Config{Kernel: kernel, Initrd: initrd, IP: fmt.Sprintf("%s/%d", addr, plen),
		Gateway: gw, MAC: lv.MAC, Tap: TapVMDev, SerialSocket: lv.SerialSocket, SerialLog: vmConsoleLog(lv), MTU: lv.MTU})
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	args = append(args, "-qmp", "unix:"+vmQMPSocket(i, name)+",server=on,wait=off")
	start := time.Now()
	lv.QEMUPID, err = startDaemon(ns, vmFile(i, name, "qemu"), args[0], args[1:]...)
	if err != nil {
		return fmt.Errorf("vm %s: qemu: %w", name, err)
	}
	st.TapVMs = append(st.TapVMs, lv)
	if err := st.save(); err != nil {
		return err
	}
	progress(cfg.Out, "lab: vm %s: booting %s/%d gw %s (QEMU under TCG, tap)", name, addr, plen, gw)
	status, err := waitGuestReady(ctx, lv.SerialSocket, vmFile(i, name, "qemu.log"))
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	st.TapVMs[len(st.TapVMs)-1].BootSeconds = time.Since(start).Seconds()
	progress(cfg.Out, "lab: vm %s ready in %.1fs: %s", name, time.Since(start).Seconds(), status)
	return st.save()
}

// addTapDev adds TapVMDev to the baseline bridge of node netns ns.
func addTapDev(ctx context.Context, ns, mtu string) error {
	for _, args := range [][]string{
		{"-n", ns, "tuntap", "add", "dev", TapVMDev, "mode", "tap"},
		{"-n", ns, "link", "set", TapVMDev, "mtu", mtu, "master", BaseBridge},
		{"-n", ns, "link", "set", TapVMDev, "up"},
	} {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("tap: %w", err)
		}
	}
	return nil
}

// bridgeAddr returns the IPv4 address and prefix length the bridge plugin
// put on a bridge (its isGateway address).
func bridgeAddr(ctx context.Context, ns, dev string) (string, int, error) {
	out, err := run(ctx, "ip", "-n", ns, "-4", "-o", "addr", "show", "dev", dev)
	if err != nil {
		return "", 0, fmt.Errorf("bridge %s address: %w", dev, err)
	}
	return parseAddrShow(out, dev)
}

// parseAddrShow reads the first "inet A/P" of `ip -4 -o addr show` output.
func parseAddrShow(out, dev string) (string, int, error) {
	f := strings.Fields(out)
	for k := 0; k+1 < len(f); k++ {
		if f[k] != "inet" {
			continue
		}
		ipa, n, err := net.ParseCIDR(f[k+1])
		if err != nil {
			return "", 0, fmt.Errorf("bridge %s address %q: %w", dev, f[k+1], err)
		}
		plen, _ := n.Mask.Size()
		return ipa.String(), plen, nil
	}
	return "", 0, fmt.Errorf("bridge %s has no IPv4 address (no baseline pod yet?)", dev)
}

// tapVMAddr picks .200 of the baseline CIDR, refusing one a pod already has.
func tapVMAddr(cidr string, pods []Pod) (string, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return "", fmt.Errorf("baseline cidr %q: %w", cidr, err)
	}
	a := n.IP.To4()
	if a == nil {
		return "", fmt.Errorf("baseline cidr %q: not IPv4", cidr)
	}
	addr := net.IPv4(a[0], a[1], a[2], tapVMHost).String()
	if !n.Contains(net.ParseIP(addr)) {
		return "", fmt.Errorf("baseline cidr %q: too small for .%d", cidr, tapVMHost)
	}
	for _, p := range pods {
		if p.IP == addr {
			return "", fmt.Errorf("address %s already used by pod %s", addr, p.NS)
		}
	}
	return addr, nil
}
