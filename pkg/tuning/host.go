package tuning

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

func checkBridgeNF(o Options) []Item {
	var items []Item
	for _, n := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		it := Item{Name: "net.bridge." + n, Category: "sysctl", Recommended: "0",
			Why: "lanekit does not bridge pods; with 1 every bridged frame on the node (tap/bridge VMs) walks iptables. " +
				"Not applied: bridge-based CNIs and kubeadm's preflight expect 1"}
		v, err := o.read("/proc/sys/net/bridge/" + n)
		switch {
		case err != nil:
			it.Status, it.Current = StatusOK, "absent"
			it.Why = "br_netfilter not loaded: bridged frames skip iptables"
		case v == "0":
			it.Status, it.Current = StatusOK, v
		default:
			it.Status, it.Current = StatusWarn, v
		}
		items = append(items, it)
	}
	return items
}

func (o Options) exists(p string) bool {
	_, err := os.Stat(o.path(p))
	return err == nil
}

func checkVhostNet(o Options) Item {
	it := Item{Name: "vhost_net", Category: "vm", Recommended: "loaded (/dev/vhost-net)",
		Why: "in-kernel virtio-net backend for tap-based VMs (QEMU vhost=on); lanekit's fast lane uses vhost-user and does not need it"}
	switch {
	case o.exists("/dev/vhost-net"):
		it.Status, it.Current = StatusOK, "/dev/vhost-net present"
	case o.exists("/sys/module/vhost_net"):
		it.Status, it.Current = StatusWarn, "module loaded, /dev/vhost-net missing"
	default:
		it.Status, it.Current = StatusMissing, "no /dev/vhost-net, module not loaded"
		it.Why += "; tap VMs fall back to QEMU's userspace virtio-net"
	}
	return it
}

// hugepages sums every hugepage pool (2 MiB, 1 GiB, ...).
func (o Options) hugepages() (total uint64, pools []string, err error) {
	dirs, err := filepath.Glob(o.path("/sys/kernel/mm/hugepages/hugepages-*kB"))
	if err != nil {
		return 0, nil, err
	}
	for _, d := range dirs {
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(d), "hugepages-"), "kB"), 10, 64)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "nr_hugepages"))
		if err != nil {
			return 0, nil, err
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", d, err)
		}
		total += n * kb << 10
		pools = append(pools, fmt.Sprintf("%d x %s", n, HumanBytes(kb<<10)))
	}
	if len(dirs) == 0 {
		return 0, nil, fmt.Errorf("no hugepage pools under /sys/kernel/mm/hugepages")
	}
	return total, pools, nil
}

func checkHugepages(o Options) Item {
	it := Item{Name: "hugepages", Category: "vm",
		Why: "guest RAM on hugepages cuts TLB misses and is never swapped; not applied: reserving them takes memory from the host"}
	total, pools, err := o.hugepages()
	if err != nil {
		it.Status, it.Current = StatusMissing, "unknown"
		it.Why = fmt.Sprintf("%s (%v)", it.Why, err)
		return it
	}
	it.Current = fmt.Sprintf("%s (%s)", HumanBytes(total), strings.Join(pools, ", "))
	if o.GuestMemory == 0 {
		it.Recommended = ">= guest memory (give --guest-memory)"
		it.Status = StatusOK
		if total == 0 {
			it.Status = StatusWarn
		}
		return it
	}
	pages := (o.GuestMemory + 2<<20 - 1) / (2 << 20)
	it.Recommended = fmt.Sprintf(">= %s (vm.nr_hugepages=%d with 2 MiB pages)", HumanBytes(o.GuestMemory), pages)
	switch {
	case total >= o.GuestMemory:
		it.Status = StatusOK
	case total == 0:
		it.Status = StatusMissing
	default:
		it.Status = StatusWarn
	}
	return it
}

// podDevice matches the host-side devices lanekit creates: "lk" + 11 hex.
var podDevice = regexp.MustCompile(`^lk[0-9a-f]{11}$`)

func checkMTU(o Options) Item {
	it := Item{Name: "uplink-mtu", Category: "network",
		Why: "pod and VM devices must carry the uplink's MTU: smaller wastes jumbo frames, larger black-holes big packets"}
	raw, err := o.read("/sys/class/net/" + o.Uplink + "/mtu")
	if err != nil {
		it.Status, it.Current, it.Recommended = StatusMissing, "no device "+o.Uplink, "an existing uplink"
		return it
	}
	up, _ := strconv.Atoi(raw)
	it.Recommended = fmt.Sprintf("pod/VM devices = %d (jumbo 9000 if the fabric carries it)", up)
	devs, _ := filepath.Glob(o.path("/sys/class/net/lk*"))
	var bad []string
	n := 0
	for _, d := range devs {
		name := filepath.Base(d)
		if !podDevice.MatchString(name) {
			continue
		}
		n++
		v, err := o.read("/sys/class/net/" + name + "/mtu")
		if err != nil {
			continue
		}
		if m, _ := strconv.Atoi(v); m != up {
			bad = append(bad, fmt.Sprintf("%s=%d", name, m))
		}
	}
	sort.Strings(bad)
	it.Current = fmt.Sprintf("%s %d, %d lanekit devices", o.Uplink, up, n)
	switch {
	case len(bad) > 0:
		it.Status = StatusWarn
		it.Current += ", differing: " + strings.Join(bad, " ")
	default:
		it.Status = StatusOK
	}
	return it
}

func checkMultiqueue(o Options) Item {
	it := Item{Name: "uplink-multiqueue", Category: "network",
		Why: "one rx queue per CPU spreads interrupts and softirq work; in guests enable virtio multiqueue with `ethtool -L eth0 combined N` (lanekit VMs take --queues N)"}
	rx, _ := filepath.Glob(o.path("/sys/class/net/" + o.Uplink + "/queues/rx-*"))
	tx, _ := filepath.Glob(o.path("/sys/class/net/" + o.Uplink + "/queues/tx-*"))
	if len(rx) == 0 {
		it.Status, it.Current, it.Recommended = StatusMissing, "no queues for "+o.Uplink, "an existing uplink"
		return it
	}
	ncpu := o.ncpu()
	it.Current = fmt.Sprintf("%d rx / %d tx queues, %d CPUs", len(rx), len(tx), ncpu)
	it.Recommended = fmt.Sprintf(">= %d rx queues", ncpu)
	it.Status = StatusOK
	if len(rx) < ncpu {
		it.Status = StatusWarn
	}
	return it
}

// cmdline returns the kernel command line parameters as key -> value.
func (o Options) cmdline() (map[string]string, error) {
	raw, err := o.read("/proc/cmdline")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range strings.Fields(raw) {
		if f == "--" {
			break // the rest belongs to init
		}
		k, v, _ := strings.Cut(f, "=")
		out[k] = v
	}
	return out, nil
}

func checkIsolation(o Options) Item {
	it := Item{Name: "cpu-isolation", Category: "cpu", Recommended: "isolcpus=<vCPU cores> nohz_full=<same> rcu_nocbs=<same>",
		Why: "pinned vCPU and backend threads on isolated cores do not share them with host tasks and timer ticks; pin with virsh vcpupin/emulatorpin or KubeVirt dedicatedCpuPlacement"}
	cl, err := o.cmdline()
	if err != nil {
		it.Status, it.Current = StatusWarn, "unknown"
		it.Why = fmt.Sprintf("%s (%v)", it.Why, err)
		return it
	}
	var set []string
	for _, k := range []string{"isolcpus", "nohz_full", "rcu_nocbs"} {
		if v, ok := cl[k]; ok {
			set = append(set, k+"="+v)
		}
	}
	if len(set) > 0 {
		it.Status, it.Current = StatusOK, strings.Join(set, " ")
		return it
	}
	it.Status, it.Current = StatusWarn, "no isolcpus/nohz_full on the kernel command line"
	if n := o.ncpu(); n <= 2 {
		it.Why += fmt.Sprintf(" (this node has %d CPUs: isolating any leaves too few for the host)", n)
	}
	return it
}

// running reports whether a process with this comm exists under Root/proc.
func (o Options) running(comm string) bool {
	dirs, _ := filepath.Glob(o.path("/proc/[0-9]*/comm"))
	for _, d := range dirs {
		f, err := os.Open(d)
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		match := s.Scan() && strings.TrimSpace(s.Text()) == comm
		f.Close()
		if match {
			return true
		}
	}
	return false
}

func checkIrqbalance(o Options) Item {
	it := Item{Name: "irqbalance", Category: "cpu"}
	cl, _ := o.cmdline()
	_, isolated := cl["isolcpus"]
	on := o.running("irqbalance")
	it.Current = "not running"
	if on {
		it.Current = "running"
	}
	switch {
	case on && isolated:
		it.Status, it.Recommended = StatusWarn, "IRQBALANCE_BANNED_CPULIST=<isolated cores>"
		it.Why = "irqbalance may move NIC interrupts onto the isolated vCPU cores unless they are banned"
	case on:
		it.Status, it.Recommended = StatusOK, "running"
		it.Why = "spreads NIC queue interrupts over the CPUs"
	default:
		it.Status, it.Recommended = StatusWarn, "running, or IRQs pinned by hand (/proc/irq/N/smp_affinity)"
		it.Why = "without it NIC queue interrupts stay where the driver put them (often all on CPU 0)"
	}
	return it
}

// HumanBytes formats n with a binary unit.
func HumanBytes(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// ParseBytes reads sizes like 4G, 512M, 2048K, 1GiB or a plain byte count.
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(s), "B"), "I"))
	mult := uint64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K, M, G or T suffix", s)
	}
	return v * mult, nil
}
