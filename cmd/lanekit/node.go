package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/tuning"
)

var nodeOpts struct {
	json        bool
	apply       bool
	revert      bool
	guestMemory string
	uplink      string
	state       string
	bpfDir      string
	root        string
	only        []string
}

var nodeCmd = &cobra.Command{
	Use:   "node",
	Short: "Check and tune this node for lanekit pods and VMs",
}

var nodeCheckCmd = &cobra.Command{
	Use:   "check",
	Short: "Check sysctls, VM prerequisites, CPU isolation and kernel features; --apply raises the safe sysctls",
	Long: `Check lists each item with its status (ok, warn, missing), current value, recommended value and why.
--apply raises the sysctls below their recommendation (never lowers any) and records the previous values in
--state; --revert writes them back. Nothing else is ever changed: hugepages, bridge netfilter, kernel command
line and modules are reported only.`,
	Args: cobra.NoArgs,
	RunE: runNodeCheck,
}

func init() {
	f := nodeCheckCmd.Flags()
	f.BoolVar(&nodeOpts.json, "json", false, "print one JSON document")
	f.BoolVar(&nodeOpts.apply, "apply", false, "raise the sysctls below their recommendation, recording the old values")
	f.BoolVar(&nodeOpts.revert, "revert", false, "restore the sysctl values recorded by --apply")
	f.StringVar(&nodeOpts.guestMemory, "guest-memory", "", "memory the node's VMs need (e.g. 8G), compared with the hugepages")
	f.StringVar(&nodeOpts.uplink, "uplink", "", "the node's uplink device (MTU, queues, AF_XDP zero-copy)")
	f.StringVar(&nodeOpts.state, "state", "/var/lib/lanekit/node-tuning.json", "where --apply records previous values")
	f.StringVar(&nodeOpts.bpfDir, "bpf-dir", "/sys/fs/bpf/lanekit", "the agent's pin directory (checked for bpffs)")
	f.StringSliceVar(&nodeOpts.only, "only", nil, "check (and apply) only these items, e.g. net.ipv4.tcp_rmem,net.core.somaxconn")
	f.StringVar(&nodeOpts.root, "root", "/", "root of /proc, /sys and /dev (a chroot or a test tree; kernel features are always probed live)")
	nodeCmd.AddCommand(nodeCheckCmd)
	rootCmd.AddCommand(nodeCmd)
}

type nodeReport struct {
	Worst    tuning.Status   `json:"worst"`
	Items    []tuning.Item   `json:"items"`
	Choices  []tuning.Choice `json:"choices"`
	Applied  []tuning.Change `json:"applied,omitempty"`
	Reverted []tuning.Change `json:"reverted,omitempty"`
}

func runNodeCheck(cmd *cobra.Command, _ []string) error {
	if nodeOpts.apply && nodeOpts.revert {
		return fmt.Errorf("--apply and --revert exclude each other")
	}
	o := tuning.Options{Root: nodeOpts.root, Uplink: nodeOpts.uplink, Only: nodeOpts.only}
	if nodeOpts.guestMemory != "" {
		n, err := tuning.ParseBytes(nodeOpts.guestMemory)
		if err != nil {
			return fmt.Errorf("--guest-memory: %w", err)
		}
		o.GuestMemory = n
	}
	var rep nodeReport
	if nodeOpts.revert {
		ch, err := tuning.Revert(o, nodeOpts.state)
		rep.Reverted = ch
		if err != nil {
			printChanges(cmd.ErrOrStderr(), "reverted", ch)
			return err
		}
	}
	f := netdev.ProbeKernel(nodeOpts.bpfDir, nodeOpts.uplink)
	o.Features = &f
	rep.Items = tuning.Check(o)
	for _, n := range nodeOpts.only {
		found := false
		for _, it := range rep.Items {
			found = found || it.Name == n
		}
		if !found {
			return fmt.Errorf("--only: no item %q (see `lanekit node check` for the names)", n)
		}
	}
	if nodeOpts.apply {
		ch, err := tuning.Apply(o, rep.Items, nodeOpts.state)
		rep.Applied = ch
		if err != nil {
			printChanges(cmd.ErrOrStderr(), "applied", ch)
			return err
		}
		rep.Items = tuning.Check(o)
	}
	rep.Worst = tuning.Worst(rep.Items)
	rep.Choices = tuning.Choices(f, "", "")
	out := cmd.OutOrStdout()
	if nodeOpts.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printChanges(out, "reverted", rep.Reverted)
	printChanges(out, "applied", rep.Applied)
	fmt.Fprintf(out, "kernel %s, %s\n\n", f.Release, summary(rep.Items))
	printItems(out, rep.Items)
	fmt.Fprintln(out)
	printChoices(out, rep.Choices)
	if nodeOpts.apply && len(rep.Applied) == 0 {
		fmt.Fprintln(out, "\nnothing to apply: every applicable sysctl is at or above its recommendation")
	}
	return nil
}

func summary(items []tuning.Item) string {
	n := map[tuning.Status]int{}
	for _, it := range items {
		n[it.Status]++
	}
	return fmt.Sprintf("%d ok, %d warn, %d missing", n[tuning.StatusOK], n[tuning.StatusWarn], n[tuning.StatusMissing])
}

func printChanges(w io.Writer, verb string, ch []tuning.Change) {
	for _, c := range ch {
		fmt.Fprintf(w, "%s: %s %q -> %q\n", verb, c.Name, c.From, c.To)
	}
	if len(ch) > 0 {
		fmt.Fprintln(w)
	}
}

func printItems(w io.Writer, items []tuning.Item) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tITEM\tCURRENT\tRECOMMENDED\tWHY")
	starred := false
	for _, it := range items {
		name := it.Name
		if it.Applicable && it.Status != tuning.StatusOK {
			name += " *"
			starred = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", it.Status, name, clip(it.Current, 48), clip(it.Recommended, 40), it.Why)
	}
	tw.Flush()
	if starred {
		fmt.Fprintln(w, "(* raised by --apply)")
	}
}

func printChoices(w io.Writer, ch []tuning.Choice) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANEKIT CHOOSES\t\tBECAUSE")
	for _, c := range ch {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.What, c.Chosen, c.Why)
	}
	tw.Flush()
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
