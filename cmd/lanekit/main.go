// Command lanekit is the lanekit CLI: lab, benchmarks, endpoints and status.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// rootCmd is the CLI root; each subcommand file registers itself in init().
var rootCmd = &cobra.Command{
	Use:           "lanekit",
	Short:         "lanekit: an eBPF datapath for Kubernetes pods and KubeVirt VMs",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "lanekit:", err)
		os.Exit(1)
	}
}
