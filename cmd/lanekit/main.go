// Command lanekit is the lanekit CLI: endpoints, VMs, services and policies,
// status, observe, node checks, RSS. A checkout's build adds the lab and the
// benchmarks (lab*.go); the agent image builds with -tags nolab and ships
// without them (ship_test.go checks what the shipped binaries link).
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
	strictTree(rootCmd)
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "lanekit:", err)
		os.Exit(1)
	}
}

// strictTree makes every command under root refuse what it does not know, so
// a script never takes help text for success: a group (subcommands, no action
// of its own) prints its help when called bare and fails on any other word;
// an action with no Args rule takes no positional arguments. Unknown flags
// already fail in cobra. cobra's own help and completion commands are added
// first so they get the same treatment.
func strictTree(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		switch {
		case c.Name() == "help" && c.HasParent():
			// cobra's help prints "Unknown help topic" and succeeds.
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(cmd *cobra.Command, args []string) error {
				target, rest, err := cmd.Root().Find(args)
				if err != nil || target == nil || len(rest) > 0 {
					return fmt.Errorf("unknown help topic %q", args)
				}
				return target.Help()
			}
			c.Run = nil
		case c.HasSubCommands() && !c.Runnable():
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) > 0 {
					return fmt.Errorf("unknown command %q for %q (run %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
				}
				return cmd.Help()
			}
		case c.Runnable() && c.Args == nil:
			c.Args = cobra.NoArgs
		}
	}
	walk(root)
}
