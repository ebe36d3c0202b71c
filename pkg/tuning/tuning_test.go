package tuning

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// fakeRoot builds a /proc, /sys and /dev tree like an untuned node's.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	base := map[string]string{
		"proc/sys/net/core/rmem_max":                               "4194304",
		"proc/sys/net/core/wmem_max":                               "16777216",
		"proc/sys/net/core/rmem_default":                           "212992",
		"proc/sys/net/core/wmem_default":                           "212992",
		"proc/sys/net/ipv4/tcp_rmem":                               "4096\t131072\t33554432",
		"proc/sys/net/ipv4/tcp_wmem":                               "4096\t16384\t4194304",
		"proc/sys/net/core/netdev_max_backlog":                     "1000",
		"proc/sys/net/core/somaxconn":                              "4096",
		"proc/sys/net/bridge/bridge-nf-call-iptables":              "1",
		"proc/sys/net/bridge/bridge-nf-call-ip6tables":             "0",
		"proc/cmdline":                                             "console=ttyS0 quiet -- --init-arg isolcpus=1",
		"proc/42/comm":                                             "sshd",
		"sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages":    "512",
		"sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages": "0",
		"sys/class/net/up0/mtu":                                    "9000",
		"sys/class/net/up0/queues/rx-0/x":                          "",
		"sys/class/net/up0/queues/tx-0/x":                          "",
		"sys/class/net/lk0123456789a/mtu":                          "9000",
		"sys/class/net/lk0123456789b/mtu":                          "1500",
		"sys/class/net/lkother/mtu":                                "1500", // not a lanekit device name
	}
	for k, v := range files {
		base[k] = v
	}
	for p, v := range base {
		if v == "-" {
			continue
		}
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func byName(items []Item) map[string]Item {
	m := map[string]Item{}
	for _, it := range items {
		m[it.Name] = it
	}
	return m
}

func TestCheckFakeRoot(t *testing.T) {
	root := fakeRoot(t, nil)
	items := Check(Options{Root: root, GuestMemory: 2 << 30, Uplink: "up0", NumCPU: 4})
	m := byName(items)
	want := map[string]Status{
		"net.core.rmem_max":                   StatusWarn,
		"net.core.wmem_max":                   StatusOK,
		"net.core.rmem_default":               StatusWarn,
		"net.ipv4.tcp_rmem":                   StatusOK, // 33554432 max already above 16 MiB
		"net.ipv4.tcp_wmem":                   StatusWarn,
		"net.core.netdev_max_backlog":         StatusWarn,
		"net.core.somaxconn":                  StatusOK,
		"net.bridge.bridge-nf-call-iptables":  StatusWarn,
		"net.bridge.bridge-nf-call-ip6tables": StatusOK,
		"vhost_net":                           StatusMissing,
		"hugepages":                           StatusWarn, // 1 GiB of 2 GiB
		"uplink-mtu":                          StatusWarn,
		"uplink-multiqueue":                   StatusWarn, // 1 rx queue, 4 CPUs
		"cpu-isolation":                       StatusWarn, // isolcpus only after "--"
		"irqbalance":                          StatusWarn,
	}
	for n, s := range want {
		it, ok := m[n]
		if !ok {
			t.Errorf("no item %s", n)
			continue
		}
		if it.Status != s {
			t.Errorf("%s: status %s (current %q), want %s", n, it.Status, it.Current, s)
		}
		if it.Why == "" || it.Recommended == "" || it.Current == "" {
			t.Errorf("%s: incomplete %+v", n, it)
		}
	}
	if got := m["net.ipv4.tcp_wmem"].Current; got != "4096 16384 4194304" {
		t.Errorf("tcp_wmem current = %q", got)
	}
	if got := m["uplink-mtu"].Current; !strings.Contains(got, "lk0123456789b=1500") || strings.Contains(got, "lkother") ||
		!strings.Contains(got, "2 lanekit devices") {
		t.Errorf("mtu current = %q", got)
	}
	if got := m["hugepages"].Current; !strings.HasPrefix(got, "1 GiB") {
		t.Errorf("hugepages current = %q", got)
	}
	if m["net.ipv4.tcp_rmem"].Scope != "netns" || m["net.core.rmem_max"].Scope != "global" {
		t.Errorf("scopes: %q %q", m["net.ipv4.tcp_rmem"].Scope, m["net.core.rmem_max"].Scope)
	}
	if Worst(items) != StatusMissing {
		t.Errorf("worst = %s", Worst(items))
	}
}

func TestCheckTunedFakeRoot(t *testing.T) {
	root := fakeRoot(t, map[string]string{
		"proc/sys/net/core/rmem_max":                   "16777216",
		"proc/sys/net/core/rmem_default":               "1048576",
		"proc/sys/net/core/wmem_default":               "1048576",
		"proc/sys/net/ipv4/tcp_wmem":                   "4096 65536 16777216",
		"proc/sys/net/core/netdev_max_backlog":         "30000",
		"proc/sys/net/bridge/bridge-nf-call-iptables":  "-",
		"proc/sys/net/bridge/bridge-nf-call-ip6tables": "-",
		"dev/vhost-net":                                "",
		"proc/cmdline":                                 "quiet isolcpus=2-3 nohz_full=2-3",
		"proc/7/comm":                                  "irqbalance",
		"sys/class/net/lk0123456789b/mtu":              "9000",
		"sys/class/net/up0/queues/rx-1/x":              "",
	})
	items := Check(Options{Root: root, GuestMemory: 1 << 30, Uplink: "up0", NumCPU: 2})
	for _, it := range items {
		want := StatusOK
		if it.Name == "irqbalance" {
			want = StatusWarn // running with isolated cores: must ban them
		}
		if it.Status != want {
			t.Errorf("%s: %s (current %q: %s), want %s", it.Name, it.Status, it.Current, it.Why, want)
		}
	}
	if it := byName(items)["cpu-isolation"]; it.Current != "isolcpus=2-3 nohz_full=2-3" {
		t.Errorf("isolation current = %q", it.Current)
	}
}

func TestCheckMissingUplinkAndFeatures(t *testing.T) {
	root := fakeRoot(t, nil)
	f := netdev.Features{
		TCX:    netdev.Feature{Supported: true, Detail: "tcx links supported"},
		Netkit: netdev.Feature{Detail: "kernel has no netkit"},
		BTF:    netdev.Feature{Unknown: true, Detail: "probe needs root"},
	}
	m := byName(Check(Options{Root: root, Uplink: "nope0", Features: &f}))
	if m["uplink-mtu"].Status != StatusMissing || m["uplink-multiqueue"].Status != StatusMissing {
		t.Errorf("missing uplink: %+v %+v", m["uplink-mtu"], m["uplink-multiqueue"])
	}
	if m["tcx"].Status != StatusOK || m["netkit"].Status != StatusMissing || m["BTF"].Status != StatusWarn {
		t.Errorf("features: tcx %s netkit %s btf %s", m["tcx"].Status, m["netkit"].Status, m["BTF"].Status)
	}
	if !strings.Contains(m["netkit"].Why, "veth") {
		t.Errorf("netkit why = %q, want the veth fallback named", m["netkit"].Why)
	}
	if m["hugepages"].Status != StatusOK || !strings.Contains(m["hugepages"].Recommended, "--guest-memory") {
		t.Errorf("hugepages without guest memory: %+v", m["hugepages"])
	}
	only := Check(Options{Root: root, Only: []string{"net.core.somaxconn"}})
	if len(only) != 1 || only[0].Name != "net.core.somaxconn" {
		t.Errorf("only = %+v", only)
	}
}

func TestApplyRevertFakeRoot(t *testing.T) {
	root := fakeRoot(t, nil)
	state := filepath.Join(t.TempDir(), "state", "tuning.json")
	o := Options{Root: root}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(b)), " ")
	}
	changes, err := Apply(o, Check(o), state)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Change{}
	for _, c := range changes {
		got[c.Name] = c
	}
	want := map[string][2]string{
		"net.core.rmem_max":           {"4194304", "16777216"},
		"net.core.rmem_default":       {"212992", "1048576"},
		"net.core.wmem_default":       {"212992", "1048576"},
		"net.ipv4.tcp_wmem":           {"4096 16384 4194304", "4096 16384 16777216"},
		"net.core.netdev_max_backlog": {"1000", "16384"},
	}
	if len(got) != len(want) {
		t.Errorf("changes = %+v", changes)
	}
	for n, fromTo := range want {
		if c := got[n]; c.From != fromTo[0] || c.To != fromTo[1] {
			t.Errorf("%s: change %+v, want %v", n, c, fromTo)
		}
	}
	if v := read("proc/sys/net/core/rmem_max"); v != "16777216" {
		t.Errorf("rmem_max = %s after apply", v)
	}
	// Never lowered: tcp_rmem's max is above the recommendation.
	if v := read("proc/sys/net/ipv4/tcp_rmem"); v != "4096 131072 33554432" {
		t.Errorf("tcp_rmem = %s after apply", v)
	}
	// Bridge netfilter is reported, never applied.
	if v := read("proc/sys/net/bridge/bridge-nf-call-iptables"); v != "1" {
		t.Errorf("bridge-nf-call-iptables = %s after apply", v)
	}
	for _, it := range Check(o) {
		if it.Category == "sysctl" && it.Applicable && it.Status != StatusOK {
			t.Errorf("%s still %s after apply", it.Name, it.Status)
		}
	}
	// A second apply changes nothing and keeps the original values recorded.
	if again, err := Apply(o, Check(o), state); err != nil || len(again) != 0 {
		t.Errorf("second apply = %+v, %v", again, err)
	}
	reverted, err := Revert(o, state)
	if err != nil {
		t.Fatal(err)
	}
	if len(reverted) != len(want) {
		t.Errorf("reverted %+v", reverted)
	}
	for n, fromTo := range want {
		p := "proc/sys/" + strings.ReplaceAll(n, ".", "/")
		if v := read(p); v != fromTo[0] {
			t.Errorf("%s = %s after revert, want %s", n, v, fromTo[0])
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state file left after revert: %v", err)
	}
	if _, err := Revert(o, state); err == nil {
		t.Error("revert without state: no error")
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]uint64{"4G": 4 << 30, "512M": 512 << 20, "1GiB": 1 << 30, "2048K": 2 << 20, "4096": 4096} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1G", "0", "4Q"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q): no error", bad)
		}
	}
}
