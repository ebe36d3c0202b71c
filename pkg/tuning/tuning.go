// Package tuning checks whether a node is set up for lanekit's pods and VMs
// (the KVM tuning checklist plus the kernel features lanekit uses) and
// applies the safe, reversible part of it: sysctls, raised only, with the
// previous values recorded so they can be restored.
//
// Every read goes through Options.Root, so tests run against a fake /proc,
// /sys and /dev tree without privileges.
package tuning

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// Status of one item.
type Status string

const (
	StatusOK      Status = "ok"      // as recommended
	StatusWarn    Status = "warn"    // works, but below the recommendation or undecidable
	StatusMissing Status = "missing" // absent from this node
)

// Item is one line of the check.
type Item struct {
	Name     string `json:"name"`
	Category string `json:"category"` // sysctl, vm, network, cpu, kernel-feature
	// Scope of a sysctl: "netns" (per network namespace) or "global".
	Scope       string `json:"scope,omitempty"`
	Status      Status `json:"status"`
	Current     string `json:"current"`
	Recommended string `json:"recommended"`
	Why         string `json:"why"`
	// Applicable: `--apply` may change this item (a sysctl, raised only).
	Applicable bool `json:"applicable"`

	sysctl *sysctl
}

// Options say what to check and where.
type Options struct {
	// Root is where /proc, /sys and /dev are looked up; "" means "/".
	Root string
	// GuestMemory is the memory the node's VMs need, in bytes; 0: unknown.
	GuestMemory uint64
	// Uplink is the node's uplink device; "": MTU and queue checks are skipped.
	Uplink string
	// Features is the kernel probe result; nil: no kernel feature rows.
	Features *netdev.Features
	// NumCPU overrides runtime.NumCPU (tests).
	NumCPU int
	// Only restricts the check to these item names; empty: everything.
	Only []string
}

func (o Options) path(p string) string {
	root := o.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, p)
}

func (o Options) read(p string) (string, error) {
	b, err := os.ReadFile(o.path(p))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func (o Options) ncpu() int {
	if o.NumCPU > 0 {
		return o.NumCPU
	}
	return runtime.NumCPU()
}

// Check inspects the node. It never changes anything.
func Check(o Options) []Item {
	var items []Item
	items = append(items, checkSysctls(o)...)
	items = append(items, checkBridgeNF(o)...)
	items = append(items, checkVhostNet(o), checkHugepages(o))
	if o.Uplink != "" {
		items = append(items, checkMTU(o), checkMultiqueue(o))
	} else {
		for _, n := range []string{"uplink-mtu", "uplink-multiqueue"} {
			items = append(items, Item{Name: n, Category: "network", Status: StatusWarn, Current: "not checked",
				Recommended: "give --uplink", Why: "the uplink's MTU and queues decide pod/VM MTU and spreading"})
		}
	}
	items = append(items, checkIsolation(o), checkIrqbalance(o))
	if o.Features != nil {
		items = append(items, featureItems(*o.Features)...)
	}
	if len(o.Only) == 0 {
		return items
	}
	var out []Item
	for _, it := range items {
		for _, n := range o.Only {
			if it.Name == n {
				out = append(out, it)
			}
		}
	}
	return out
}

// Worst is the most severe status among items.
func Worst(items []Item) Status {
	w := StatusOK
	for _, it := range items {
		switch it.Status {
		case StatusMissing:
			return StatusMissing
		case StatusWarn:
			w = StatusWarn
		}
	}
	return w
}

// featureItems turns the kernel probe into rows: what lanekit does without
// each feature is the "why".
func featureItems(f netdev.Features) []Item {
	without := map[string]string{
		"tcx":               "pod and uplink programs cannot attach: lanekit needs tcx (Linux >= 6.6)",
		"netkit":            "lanekit uses veth pods (one more stack pass than netkit)",
		"bpf_redirect_peer": "traffic from the uplink to pods takes the slower redirect path",
		"xdp":               "no VM fast lane (steer_vm is an XDP program)",
		"af_xdp":            "no VM fast lane (the backend needs AF_XDP sockets)",
		"af_xdp_zerocopy":   "AF_XDP runs in copy mode (one copy per packet)",
		"tun_steering_ebpf": "tap-based VMs cannot get Toeplitz RSS steering",
		"BTF":               "no CO-RE; map contents are shown without types",
		"bpffs":             "pins do not survive an agent restart: pods lose forwarding",
		"ringbuf":           "no flow events",
	}
	var out []Item
	for _, row := range f.Table() {
		it := Item{Name: row.Name, Category: "kernel-feature", Recommended: "supported", Current: "supported"}
		switch {
		case row.Feature.Supported:
			it.Status, it.Why = StatusOK, row.Uses+": "+row.Feature.Detail
		case row.Feature.Unknown:
			it.Status, it.Current = StatusWarn, "unknown"
			it.Why = fmt.Sprintf("%s: %s", row.Uses, row.Feature.Detail)
		default:
			it.Status, it.Current = StatusMissing, "not supported"
			it.Why = fmt.Sprintf("%s; %s", without[row.Name], row.Feature.Detail)
		}
		out = append(out, it)
	}
	return out
}
