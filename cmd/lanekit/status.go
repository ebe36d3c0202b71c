package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/tuning"
)

var statusOpts struct {
	uplink      string
	bpfDir      string
	wait        bool
	waitTimeout time.Duration
}

var statusCmd = &cobra.Command{
	Use:   "status",
	Short: "Show the local agent, the kernel features and what lanekit chose because of them",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		out := cmd.OutOrStdout()
		if statusOpts.wait {
			if err := waitAgentReady(cmd.Context(), cmd.ErrOrStderr(), statusOpts.waitTimeout); err != nil {
				return err
			}
		}
		st, agentErr := agentStatus(cmd.Context(), out)
		// The feature table is probed here, with the same probes the agent
		// runs at start-up: it is shown even when the agent is down.
		f := netdev.ProbeKernel(statusOpts.bpfDir, statusOpts.uplink)
		fmt.Fprintf(out, "kernel:       %s\n", f.Release)
		printFeatures(out, f)
		if k := st.GetKernel(); k != nil && k.GetNetkit().GetSupported() != f.Netkit.Supported {
			fmt.Fprintf(out, "  note: the agent saw netkit=%v at start-up: %s\n", k.GetNetkit().GetSupported(), k.GetNetkit().GetDetail())
		}
		fmt.Fprintln(out)
		dp := st.GetDatapath()
		printChoices(out, tuning.Choices(f, dp.GetDeviceMode(), dp.GetDeviceModeReason()))
		return agentErr
	},
}

// agentStatus prints the agent's part of the status; the error says the
// agent is unreachable.
func agentStatus(ctx context.Context, out io.Writer) (*apiv1.StatusResponse, error) {
	c, closeFn, err := dialAgent()
	if err != nil {
		fmt.Fprintf(out, "agent:        unreachable (%v)\n", err)
		return nil, fmt.Errorf("agent unreachable")
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, &apiv1.StatusRequest{})
	if err != nil {
		fmt.Fprintf(out, "agent:        unreachable at %s (%v)\n", agentSocket, err)
		return nil, fmt.Errorf("agent unreachable")
	}
	ready := "ready"
	if !st.GetReady() {
		ready = "not ready: " + st.GetReason()
	}
	dp := st.GetDatapath()
	fmt.Fprintf(out, "agent:        reachable at %s, version %s, %s\n", agentSocket, st.GetVersion(), ready)
	fmt.Fprintf(out, "datapath:     %s (%s)\n", dp.GetBackend(), dp.GetLocation())
	if dp.GetError() != "" {
		fmt.Fprintf(out, "  error:      %s\n", dp.GetError())
	}
	fmt.Fprintf(out, "device mode:  %s (%s)\n", dp.GetDeviceMode(), dp.GetDeviceModeReason())
	printDPULink(out, st.GetDpuLink(), time.Now())
	if c := dp.GetCounterCapacity(); c > 0 {
		full := ""
		if dp.GetCounterEntries() >= c {
			full = " FULL: new counters are not recorded"
		}
		if n := dp.GetCounterUpdatesLost(); n > 0 {
			full += fmt.Sprintf(", %d counter updates lost", n)
		}
		fmt.Fprintf(out, "counters:     %d/%d entries%s\n", dp.GetCounterEntries(), c, full)
	}
	fmt.Fprintf(out, "pod CIDR:     %s (%d/%d addresses allocated)\n", st.GetPodCidr(), st.GetIpsAllocated(), st.GetIpsCapacity())
	fmt.Fprintf(out, "endpoints:    %d\n", st.GetEndpointCount())
	printVMs(ctx, out, c, dp.GetBackend() == "dpu")
	printRouting(out, st.GetRouting())
	printMasquerade(out, st.GetRouting(), st.GetControlPlane())
	if cp := st.GetControlPlane(); cp != nil {
		lb, pol := "load-balanced", "enforced"
		if !cp.GetServiceDatapath() {
			lb = "not load-balanced: the datapath has no service support"
		}
		if !cp.GetPolicyDatapath() {
			pol = "not enforced: the datapath has no policy support"
		}
		fmt.Fprintf(out, "services:     %d (%d frontends, %d backends), %s\n", cp.GetServices(), cp.GetFrontends(), cp.GetBackends(), lb)
		fmt.Fprintf(out, "policies:     %d (%d identities, %d rules), %s\n", cp.GetPolicies(), cp.GetIdentities(), cp.GetPolicyRules(), pol)
		if cp.GetServiceDatapath() {
			fmt.Fprintf(out, "conntrack:    %d/%d entries, %d evicted (table full), gc removed %d in %d runs\n", cp.GetConntrackEntries(),
				cp.GetConntrackCapacity(), cp.GetConntrackFull(), cp.GetConntrackGcRemoved(), cp.GetConntrackGcRuns())
		}
		printSocketLB(out, cp)
		printMaps(out, cp.GetMaps())
		if n := cp.GetPendingUpdates(); n > 0 {
			fmt.Fprintf(out, "  warning:    %d datapath updates failed and wait for a retry\n", n)
		}
		if e := cp.GetError(); e != "" {
			fmt.Fprintf(out, "  error:      %s\n", e)
		}
	}
	if !st.GetReady() {
		return st, fmt.Errorf("agent not ready: %s", st.GetReason())
	}
	return st, nil
}

// waitAgentReady polls the agent until it answers ready, printing what it
// waits for each time that changes (the socket, the answer, the agent's
// not-ready reason).
func waitAgentReady(ctx context.Context, out io.Writer, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		why := agentNotReady(ctx)
		if why == "" {
			fmt.Fprintf(out, "agent at %s is ready\n", agentSocket)
			return nil
		}
		if why != last {
			fmt.Fprintf(out, "waiting for the agent: %s\n", why)
			last = why
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready after %s: %s", timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// agentNotReady is why the agent is not ready yet; "" when it is.
func agentNotReady(ctx context.Context) string {
	if _, err := os.Stat(agentSocket); err != nil {
		return fmt.Sprintf("its socket %s does not exist yet", agentSocket)
	}
	c, closeFn, err := dialAgent()
	if err != nil {
		return err.Error()
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx, &apiv1.StatusRequest{})
	switch {
	case err != nil:
		return fmt.Sprintf("no answer on %s (%v)", agentSocket, status.Convert(err).Message())
	case !st.GetReady():
		return "not ready: " + st.GetReason()
	}
	return ""
}

// printMasquerade prints tunnel mode's masquerading (bpf/lib/masq.h) with
// its counters: where a pod cannot reach the outside, this is the line
// that says whether anything left.
func printMasquerade(out io.Writer, r *apiv1.RoutingStatus, cp *apiv1.ControlPlaneStatus) {
	if r.GetMode() != "tunnel" {
		return
	}
	lb := cp.GetLbCounters()
	fmt.Fprintf(out, "masquerade:   to outside the cluster (TCP, UDP, ICMP echo over IPv4) from the node's address: %d flows, %d packets\n",
		lb["masquerade"], lb["masquerade-packets"])
}

// printSocketLB prints the socket load balancer's state and the served
// healthCheckNodePorts.
func printSocketLB(out io.Writer, cp *apiv1.ControlPlaneStatus) {
	if sl := cp.GetSocketLb(); sl != nil {
		switch sl.GetState() {
		case "attached":
			lb := cp.GetLbCounters()
			fmt.Fprintf(out, "socket LB:    attached at %s (loopback NodePorts as %s), translated %d connects, %d datagrams, %d refused (no backend)\n",
				sl.GetCgroup(), sl.GetNodeAddr(), lb["socket-connect4-translated"]+lb["socket-connect6-translated"],
				lb["socket-sendmsg4-translated"]+lb["socket-sendmsg6-translated"],
				lb["socket-connect4-no-backend"]+lb["socket-connect6-no-backend"]+lb["socket-sendmsg4-no-backend"]+lb["socket-sendmsg6-no-backend"])
		case "off":
			fmt.Fprintln(out, "socket LB:    off (lanekitd --socket-lb=false): the node's processes and hostNetwork pods do not reach Services")
		default:
			fmt.Fprintf(out, "socket LB:    %s\n", sl.GetState())
		}
	}
	for _, h := range cp.GetHealthChecks() {
		state := fmt.Sprintf("%d local endpoints", h.GetLocalEndpoints())
		if h.GetError() != "" {
			state = "NOT SERVED: " + h.GetError()
		}
		fmt.Fprintf(out, "health check: port %d for %s/%s, %s\n", h.GetPort(), h.GetNamespace(), h.GetName(), state)
	}
}

// printFeatures prints the kernel feature table shared with `node check`.
func printFeatures(out io.Writer, f netdev.Features) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  FEATURE\tSUPPORTED\tUSED FOR\tPROBE")
	for _, row := range f.Table() {
		mark := "no"
		switch {
		case row.Feature.Supported:
			mark = "yes"
		case row.Feature.Unknown:
			mark = "unknown"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", row.Name, mark, row.Uses, row.Feature.Detail)
	}
	tw.Flush()
}

func init() {
	addSocketFlag(statusCmd)
	statusCmd.Flags().StringVar(&statusOpts.uplink, "uplink", "", "the node's uplink (probes AF_XDP zero-copy on its driver)")
	statusCmd.Flags().BoolVar(&statusOpts.wait, "wait", false, "wait until the agent answers and is ready (datapath loaded, Kubernetes caches synced when it watches a cluster)")
	statusCmd.Flags().DurationVar(&statusOpts.waitTimeout, "wait-timeout", 5*time.Minute, "give up waiting after this long")
	statusCmd.Flags().StringVar(&statusOpts.bpfDir, "bpf-dir", "/sys/fs/bpf/lanekit", "the agent's pin directory (checked for bpffs)")
	rootCmd.AddCommand(statusCmd)
}

// printVMs lists the agent's VM endpoints and where their fast lane runs:
// on a DPU node's host (onDPU) the device, its steering and sockets are the
// DPU's, the VM's QEMU is here. Nothing when the agent lists none.
func printVMs(ctx context.Context, out io.Writer, c apiv1.AgentClient, onDPU bool) {
	resp, err := c.ListVMs(ctx, &apiv1.ListVMsRequest{})
	if err != nil {
		fmt.Fprintf(out, "vms:          unknown (%v)\n", err)
		return
	}
	where := "here"
	if onDPU {
		where = "on the DPU (QEMU here)"
	}
	for _, vm := range resp.GetVms() {
		serving := "serving"
		if !vm.GetServing() {
			serving = "NOT serving"
		}
		ep, dev := vm.GetEndpoint(), "?"
		if ifs := ep.GetInterfaces(); len(ifs) > 1 {
			dev = ifs[1].GetName() // the VM side
		}
		fmt.Fprintf(out, "vm:           %s %s %s: device %s in netns %s, AF_XDP sockets from %s (%s)\n", vm.GetName(), vm.GetAddress(),
			where, dev, ep.GetNetns(), vm.GetSocket(), serving)
	}
}

// mapNearFull is the agent's agent.NearFull (the CLI does not link the agent).
const mapNearFull = 0.9

// policyMapFlags are the lanekitd flags that size the policy maps.
var policyMapFlags = map[string]string{
	"lk_policy_ipcache": "--policy-ipcache", "lk_policy_ipcache6": "--policy-ipcache",
	"lk_policy_cidrs": "--policy-cidrs", "lk_policy_cidrs6": "--policy-cidrs",
	"lk_policy_isolation": "--policy-identities", "lk_policy_rules": "--policy-rules",
}

// policyMapEntries names what a policy map's entries are.
var policyMapEntries = map[string]string{
	"lk_policy_ipcache": "pod addresses", "lk_policy_ipcache6": "pod addresses", "lk_policy_isolation": "isolated identities",
}

// printMaps prints a line for each service or policy map that is full (with
// what is not programmed) or nearly full; nothing when all have room.
func printMaps(out io.Writer, maps []*apiv1.MapFill) {
	for _, m := range maps {
		n, c := m.GetEntries(), m.GetCapacity()
		switch {
		case m.GetUnprogrammedFrontends() > 0:
			fmt.Fprintf(out, "  error:      map %s full (%d/%d entries): %d frontends of %d Services not programmed; raise lanekitd's --lb-frontends/--lb-backends or remove Services\n",
				m.GetName(), n, c, m.GetUnprogrammedFrontends(), m.GetUnprogrammedServices())
		case m.GetUnprogrammedPolicies() > 0:
			fmt.Fprintf(out, "  error:      map %s full (%d/%d entries): %d NetworkPolicies not programmed (their pods stay isolated, their allow rules wait: `lanekit policy list`); raise lanekitd's %s or remove NetworkPolicies\n",
				m.GetName(), n, c, m.GetUnprogrammedPolicies(), policyMapFlags[m.GetName()])
		case m.GetUnprogrammedEntries() > 0:
			fmt.Fprintf(out, "  error:      map %s full (%d/%d entries): %d %s left out (this node's own are kept first); raise lanekitd's %s\n",
				m.GetName(), n, c, m.GetUnprogrammedEntries(), policyMapEntries[m.GetName()], policyMapFlags[m.GetName()])
		case c > 0 && float64(n) >= mapNearFull*float64(c):
			fmt.Fprintf(out, "  warning:    map %s nearly full (%d/%d entries)\n", m.GetName(), n, c)
		}
	}
}
