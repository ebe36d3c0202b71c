//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/bench"
)

// The TCP request/response pair `lab bench` runs for its IPv6 rows
// (pkg/bench/rr.go: sockperf 3.7 takes IPv4 addresses only). Hidden and
// bounded in time, like the connection-rate pair.
func init() {
	labCmd.AddCommand(rrServerCmd(), rrClientCmd())
}

func rrServerCmd() *cobra.Command { return benchServerCmd("rr-server", bench.ServeRR) }

func rrClientCmd() *cobra.Command {
	var addr string
	var d time.Duration
	cmd := &cobra.Command{
		Use:    "rr-client",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := bench.RunRR(context.Background(), addr, d)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "server address")
	cmd.Flags().DurationVar(&d, "duration", 5*time.Second, "how long to ping-pong")
	return cmd
}
