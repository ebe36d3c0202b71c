//go:build !nolab

package main

import (
	"encoding/json"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/lab"
)

// lab bpf-stats: where the datapath's CPU goes per namespace (issue 28).
func labBPFStatsCmd() *cobra.Command {
	var (
		dur    time.Duration
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "bpf-stats",
		Short: "Per network namespace BPF run time (BPF_ENABLE_STATS, on for the run only) of an iperf3 transfer from each node's pod to the last node's pod: a DPU node's host vs its DPU vs a plain node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rows, err := lab.BPFStats(cmd.Context(), dur)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"rows": rows})
			}
			lab.WriteBPFStats(cmd.OutOrStdout(), rows)
			return nil
		},
	}
	cmd.Flags().DurationVar(&dur, "duration", 3*time.Second, "length of each transfer")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func init() { labCmd.AddCommand(labBPFStatsCmd()) }
