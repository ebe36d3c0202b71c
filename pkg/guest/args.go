package guest

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxQueues bounds Config.Queues (virtio-net queue pairs).
const MaxQueues = 16

// Config describes one guest. Kernel and Initrd come from EnsureImage. The NIC
// is chosen by VhostSocket (vhost-user, the lanekit fast lane), else Tap (an
// existing tap device, QEMU's userspace virtio-net: the standard VM path), else
// UserNet (QEMU user-mode networking, for tests that need no backend), else none.
type Config struct {
	QEMU     string // binary; default "qemu-system-x86_64"
	Kernel   string
	Initrd   string
	MemoryMB int // guest RAM, shared memfd when VhostSocket is set; default 256
	CPUs     int // default 1

	IP      string // lk.ip, "10.244.2.50/32"; empty: the guest configures no network
	Gateway string // lk.gw, on-link gateway, "169.254.1.1"
	MAC     string // lk.mac and the virtio-net device MAC; default DefaultMAC
	Queues  int    // queue pairs (lk.queues, netdev queues=, mq=on); default 1
	MTU     int    // lk.mtu; 0 keeps the driver default
	// IP6 is the NIC's IPv6 address (lk.ip6, "fd00:10:244:2::5/128", no
	// duplicate address detection: the agent's IPAM owns it); Gateway6 its
	// on-link IPv6 gateway (lk.gw6, "fe80::1": a default route via it).
	IP6      string
	Gateway6 string

	VhostSocket string // vhost-user backend socket (QEMU is the client)
	// VhostReconnect: seconds between QEMU's attempts to reconnect to a
	// backend that went away (what KubeVirt's libvirt <reconnect> sets);
	// 0: no reconnect.
	VhostReconnect int
	Tap            string   // existing tap device name (script=no, vhost=off) when VhostSocket is empty
	UserNet        *UserNet // QEMU user-mode network when VhostSocket and Tap are empty

	// SerialSocket is the unix socket QEMU serves ttyS0 on (server=on,wait=on:
	// QEMU waits for the host to connect before the guest runs, so no output is
	// lost). Start fills it in; empty in QEMUArgs means "-serial stdio".
	SerialSocket string
	// SerialLog, with SerialSocket: a file QEMU appends the guest's console
	// output to (the chardev's logfile), so its last words (a panic before a
	// reset) are kept when no client is attached.
	SerialLog string
	// CmdTimeout bounds one control command inside the guest (lk.cmdtimeout).
	CmdTimeout time.Duration
	// ExtraAppend is added to the kernel command line verbatim.
	ExtraAppend []string
}

// UserNet is QEMU's user-mode (slirp) network with restrict=on: the guest
// reaches nothing outside QEMU, the host reaches it through the forwards.
type UserNet struct {
	// Forwards maps a TCP port on 127.0.0.1 to a guest TCP port.
	Forwards map[int]int
}

// DefaultMAC is the guest NIC's MAC when Config.MAC is empty.
const DefaultMAC = "52:54:00:4c:4b:01"

func (c Config) withDefaults() Config {
	if c.QEMU == "" {
		c.QEMU = "qemu-system-x86_64"
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = 256
	}
	if c.CPUs == 0 {
		c.CPUs = 1
	}
	if c.MAC == "" {
		c.MAC = DefaultMAC
	}
	if c.Queues == 0 {
		c.Queues = 1
	}
	return c
}

func (c Config) hasNIC() bool { return c.VhostSocket != "" || c.Tap != "" || c.UserNet != nil }

func (c Config) validate() error {
	if c.Kernel == "" || c.Initrd == "" {
		return errors.New("guest config: kernel and initrd are required")
	}
	if c.MemoryMB < 64 {
		return fmt.Errorf("guest config: memory %d MiB: need at least 64", c.MemoryMB)
	}
	if c.CPUs < 1 || c.CPUs > 64 {
		return fmt.Errorf("guest config: cpus %d: out of range 1..64", c.CPUs)
	}
	if c.IP != "" {
		p, err := netip.ParsePrefix(c.IP)
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("guest config: ip %q: want an IPv4 ADDR/PLEN", c.IP)
		}
	}
	if c.Gateway != "" {
		if c.IP == "" {
			return errors.New("guest config: gateway without ip")
		}
		a, err := netip.ParseAddr(c.Gateway)
		if err != nil || !a.Is4() {
			return fmt.Errorf("guest config: gateway %q: want an IPv4 address", c.Gateway)
		}
	}
	if err := c.validateIPv6(); err != nil {
		return err
	}
	hw, err := net.ParseMAC(c.MAC)
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("guest config: mac %q: want a 48-bit MAC", c.MAC)
	}
	if hw[0]&1 != 0 {
		return fmt.Errorf("guest config: mac %q: multicast", c.MAC)
	}
	if c.Queues < 1 || c.Queues > MaxQueues {
		return fmt.Errorf("guest config: queues %d: out of range 1..%d", c.Queues, MaxQueues)
	}
	if c.Queues > 1 && c.VhostSocket == "" {
		return fmt.Errorf("guest config: queues %d: multiqueue needs a vhost-user socket", c.Queues)
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return fmt.Errorf("guest config: mtu %d: out of range 68..65535", c.MTU)
	}
	if (c.IP != "" || c.IP6 != "") && !c.hasNIC() {
		return errors.New("guest config: ip set but no nic (no vhost socket, no user net)")
	}
	for _, s := range []string{c.VhostSocket, c.SerialSocket} {
		if strings.ContainsAny(s, ", \n") {
			return fmt.Errorf("guest config: socket path %q: must not contain ',', spaces or newlines", s)
		}
	}
	if c.Tap != "" && (len(c.Tap) > 15 || strings.ContainsAny(c.Tap, ",/ \t\n")) {
		return fmt.Errorf("guest config: tap %q: want an interface name (at most 15 bytes, no ',', '/' or spaces)", c.Tap)
	}
	if c.VhostSocket != "" && c.Tap != "" {
		return errors.New("guest config: both a vhost-user socket and a tap")
	}
	if c.UserNet != nil {
		for hp, gp := range c.UserNet.Forwards {
			if hp < 1 || hp > 65535 || gp < 1 || gp > 65535 {
				return fmt.Errorf("guest config: user net forward %d->%d: port out of range", hp, gp)
			}
		}
	}
	for _, a := range c.ExtraAppend {
		if a == "" || strings.ContainsAny(a, " \t\n\"") {
			return fmt.Errorf("guest config: extra append %q: one word without quotes", a)
		}
	}
	return nil
}

// KernelCmdline returns the kernel command line: the console on ttyS0, quiet,
// the lk.* keys that scripts/guest/init reads, and panic=-1 (with -no-reboot a
// dead init ends QEMU).
func KernelCmdline(cfg Config) (string, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return "", err
	}
	return c.cmdline(), nil
}

func (c Config) cmdline() string {
	w := []string{"console=ttyS0", "quiet"}
	if c.IP != "" || c.IP6 != "" {
		if c.IP != "" {
			w = append(w, "lk.ip="+c.IP)
		}
		if c.Gateway != "" {
			w = append(w, "lk.gw="+c.Gateway)
		}
		if c.IP6 != "" {
			w = append(w, "lk.ip6="+c.IP6)
			if c.Gateway6 != "" {
				w = append(w, "lk.gw6="+c.Gateway6)
			}
		}
		w = append(w, "lk.mac="+strings.ToLower(c.MAC))
		if c.Queues > 1 {
			w = append(w, "lk.queues="+strconv.Itoa(c.Queues))
		}
		if c.MTU != 0 {
			w = append(w, "lk.mtu="+strconv.Itoa(c.MTU))
		}
	}
	if c.CmdTimeout > 0 {
		w = append(w, "lk.cmdtimeout="+strconv.Itoa(int((c.CmdTimeout+time.Second-1)/time.Second)))
	}
	w = append(w, c.ExtraAppend...)
	w = append(w, "panic=-1")
	return strings.Join(w, " ")
}

// QEMUArgs returns the QEMU command line (argv[0] included) for cfg.
//
// The virtio-net device always gets vectors=0 (no MSI-X): QEMU 7.2 under TCG
// with a vhost-user netdev crashes otherwise. With vhost-user the guest RAM is a
// shared memfd so the backend can map it; mq=on is added for queues > 1.
func QEMUArgs(cfg Config) ([]string, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	mem := strconv.Itoa(c.MemoryMB)
	a := []string{c.QEMU,
		"-machine", "q35", "-cpu", "max", "-accel", "tcg",
		"-m", mem, "-smp", strconv.Itoa(c.CPUs),
		"-nographic", "-no-reboot", "-monitor", "none",
		// Named threads ("CPU 0/TCG"): the bench tells the guest's vCPUs
		// from QEMU's I/O and main-loop threads (host CPU per byte).
		"-name", "lanekit-guest,debug-threads=on",
		"-kernel", c.Kernel, "-initrd", c.Initrd,
		"-append", c.cmdline(),
	}
	mac := strings.ToLower(c.MAC)
	switch {
	case c.VhostSocket != "":
		dev := "virtio-net-pci,netdev=n0,mac=" + mac + ",vectors=0,romfile="
		if c.Queues > 1 {
			dev += ",mq=on"
		}
		a = append(a,
			"-object", "memory-backend-memfd,id=mem,size="+mem+"M,share=on",
			"-numa", "node,memdev=mem",
			"-chardev", "socket,id=c0,path="+c.VhostSocket+reconnect(c.VhostReconnect),
			"-netdev", "vhost-user,id=n0,chardev=c0,queues="+strconv.Itoa(c.Queues),
			"-device", dev)
	case c.Tap != "":
		// QEMU's own virtio-net emulation on a tap (no vhost_net here): the
		// path KubeVirt's bridge binding takes. vectors=0 like the fast lane,
		// so both guests take interrupts the same way.
		a = append(a, "-netdev", "tap,id=n0,ifname="+c.Tap+",script=no,downscript=no,vhost=off",
			"-device", "virtio-net-pci,netdev=n0,mac="+mac+",vectors=0,romfile=")
	case c.UserNet != nil:
		nd := "user,id=n0,restrict=on"
		for _, hp := range slices.Sorted(maps.Keys(c.UserNet.Forwards)) {
			nd += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", hp, c.UserNet.Forwards[hp])
		}
		a = append(a, "-netdev", nd,
			"-device", "virtio-net-pci,netdev=n0,mac="+mac+",vectors=0,romfile=")
	default:
		a = append(a, "-nic", "none")
	}
	if c.SerialSocket != "" {
		ser := "socket,id=ser0,path=" + c.SerialSocket + ",server=on,wait=on"
		if c.SerialLog != "" {
			ser += ",logfile=" + c.SerialLog + ",logappend=on"
		}
		a = append(a, "-chardev", ser, "-serial", "chardev:ser0")
	} else {
		a = append(a, "-serial", "stdio")
	}
	return a, nil
}

func reconnect(seconds int) string {
	if seconds <= 0 {
		return ""
	}
	return ",reconnect=" + strconv.Itoa(seconds)
}

// validateIPv6 checks IP6 (an IPv6 ADDR/PLEN) and Gateway6 (an IPv6 address,
// only with IP6).
func (c Config) validateIPv6() error {
	if c.IP6 != "" {
		p, err := netip.ParsePrefix(c.IP6)
		if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return fmt.Errorf("guest config: ip6 %q: want an IPv6 ADDR/PLEN", c.IP6)
		}
	}
	if c.Gateway6 != "" {
		if c.IP6 == "" {
			return errors.New("guest config: gateway6 without ip6")
		}
		a, err := netip.ParseAddr(c.Gateway6)
		if err != nil || !a.Is6() || a.Is4In6() {
			return fmt.Errorf("guest config: gateway6 %q: want an IPv6 address", c.Gateway6)
		}
	}
	return nil
}
