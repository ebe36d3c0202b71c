//go:build !nolab

package main

import (
	"context"
	"encoding/json"
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
			for _, vms := range [][]lab.LabVM{st.VMs, st.TapVMs} { // vm-std too: lab bench's baseline guest
				for i := range vms {
					if vms[i].Name == args[0] {
						vm = &vms[i]
					}
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

// lab vm migrate: live-migrate the lab's fast-lane guest to another node.
func labVMMigrateCmd() *cobra.Command {
	var opts lab.MigrateOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "migrate [NAME]",
		Short: "Live-migrate a lab VM (QEMU migration) to another node while pods ping it and hold a TCP connection; report loss and switch-over time",
		Long: `Live-migrates the lab's fast-lane guest (after lab up --vm) from its node to --to
(default: node 1, or node 2 when it is on node 1): the target node's agent creates the VM
endpoint with the same address and MAC, inactive until the guest runs there; the agents then
route the address to the target and the source's side goes. A pod on every node pings the
guest every --interval and one holds a TCP connection to it across the migration.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				opts.VM = args[0]
			}
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			opts.Bins = bins
			if !asJSON {
				opts.Out = cmd.ErrOrStderr()
			}
			rep, err := lab.MigrateVM(cmd.Context(), opts)
			if rep != nil {
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					if jerr := enc.Encode(rep); jerr != nil {
						return jerr
					}
				} else {
					fmt.Fprint(cmd.OutOrStdout(), rep.String())
				}
			}
			return err
		},
	}
	cmd.Flags().IntVar(&opts.To, "to", 0, "target node (default: 1, or 2 when the VM is on node 1)")
	cmd.Flags().DurationVar(&opts.PingInterval, "interval", 10*time.Millisecond, "ping interval of each pod")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func init() {
	labCmd.AddCommand(labVMExecCmd())
	vmCmd := &cobra.Command{Use: "vm", Short: "Lab VM operations"}
	vmCmd.AddCommand(labVMMigrateCmd())
	labCmd.AddCommand(vmCmd)
}
