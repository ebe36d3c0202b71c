package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

var statusCmd = &cobra.Command{
	Use:   "status",
	Short: "Show the local agent: reachable, datapath mode and why, kernel features",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		out := cmd.OutOrStdout()
		c, closeFn, err := dialAgent()
		if err != nil {
			fmt.Fprintf(out, "agent:        unreachable (%v)\n", err)
			return fmt.Errorf("agent unreachable")
		}
		defer closeFn()
		ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
		defer cancel()
		st, err := c.Status(ctx, &apiv1.StatusRequest{})
		if err != nil {
			fmt.Fprintf(out, "agent:        unreachable at %s (%v)\n", agentSocket, err)
			return fmt.Errorf("agent unreachable")
		}
		ready := "ready"
		if !st.GetReady() {
			ready = "not ready: " + st.GetReason()
		}
		dp := st.GetDatapath()
		k := st.GetKernel()
		fmt.Fprintf(out, "agent:        reachable at %s, version %s, %s\n", agentSocket, st.GetVersion(), ready)
		fmt.Fprintf(out, "datapath:     %s (%s)\n", dp.GetBackend(), dp.GetLocation())
		if dp.GetError() != "" {
			fmt.Fprintf(out, "  error:      %s\n", dp.GetError())
		}
		fmt.Fprintf(out, "device mode:  %s (%s)\n", dp.GetDeviceMode(), dp.GetDeviceModeReason())
		if c := dp.GetCounterCapacity(); c > 0 {
			full := ""
			if dp.GetCounterEntries() >= c {
				full = " FULL: new counters are not recorded"
			}
			fmt.Fprintf(out, "counters:     %d/%d entries%s\n", dp.GetCounterEntries(), c, full)
		}
		fmt.Fprintf(out, "pod CIDR:     %s (%d/%d addresses allocated)\n", st.GetPodCidr(), st.GetIpsAllocated(), st.GetIpsCapacity())
		fmt.Fprintf(out, "endpoints:    %d\n", st.GetEndpointCount())
		fmt.Fprintf(out, "kernel:       %s\n", k.GetRelease())
		for _, f := range []struct {
			name string
			f    *apiv1.Feature
		}{{"tcx", k.GetTcx()}, {"netkit", k.GetNetkit()}, {"bpffs", k.GetBpffs()}, {"BTF", k.GetBtf()}} {
			mark := "no "
			if f.f.GetSupported() {
				mark = "yes"
			}
			fmt.Fprintf(out, "  %-7s     %s  %s\n", f.name, mark, f.f.GetDetail())
		}
		if !st.GetReady() {
			return fmt.Errorf("agent not ready: %s", st.GetReason())
		}
		return nil
	},
}

func init() {
	addSocketFlag(statusCmd)
	rootCmd.AddCommand(statusCmd)
}
