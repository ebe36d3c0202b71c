//go:build !nolab

package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/lab"
	"github.com/spf13/cobra"
)

// lab vm-exec: run a shell command in a lab guest through its serial console.
func labVMExecCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "vm-exec NAME -- COMMAND...",
		Short: "Run a shell command inside a lab VM (through its serial console) and print its output",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := lab.LoadState()
			if err != nil {
				return err
			}
			var vm *lab.LabVM
			for i := range st.VMs {
				if st.VMs[i].Name == args[0] {
					vm = &st.VMs[i]
				}
			}
			if vm == nil {
				return fmt.Errorf("lab vm-exec: no VM %q in the lab", args[0])
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			con, err := guest.DialConsole(ctx, vm.SerialSocket)
			if err != nil {
				return fmt.Errorf("lab vm-exec %s: %w", vm.Name, err)
			}
			defer con.Close()
			out, code, err := con.Run(ctx, strings.Join(args[1:], " "))
			if err != nil {
				return fmt.Errorf("lab vm-exec %s: %w", vm.Name, err)
			}
			fmt.Fprint(cmd.OutOrStdout(), out)
			if code != 0 {
				con.Close()
				os.Exit(code)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "bound on the command")
	return cmd
}

func init() { labCmd.AddCommand(labVMExecCmd()) }
