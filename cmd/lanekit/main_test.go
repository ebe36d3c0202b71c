package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestUnknownCommandsFail walks the whole command tree: at every level an
// unknown subcommand, an unknown flag and (for commands that take none) a
// stray argument fail naming the word, and a bare group prints its help and
// succeeds. Without strictTree, `lanekit lab vm migrate` printed help and
// exited 0.
func TestUnknownCommandsFail(t *testing.T) {
	strictTree(rootCmd)
	var walk func(c *cobra.Command)
	groups, actions := 0, 0
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:]
		if c.HasSubCommands() {
			groups++
			_, err := runCLI(t, append(path, "no-such-command")...)
			if err == nil || !strings.Contains(err.Error(), `"no-such-command"`) {
				t.Errorf("lanekit %s no-such-command: err %v, want an unknown-command error naming it", strings.Join(path, " "), err)
			}
			if !c.Runnable() || c.Name() == "lanekit" {
				out, err := runCLI(t, path...)
				if err != nil || !strings.Contains(out, "Usage:") {
					t.Errorf("lanekit %s: err %v, output %q: want its help", strings.Join(path, " "), err, out)
				}
			}
		}
		if c.Runnable() && !c.HasSubCommands() && c.Name() != "help" {
			actions++
			_, err := runCLI(t, append(path, "--no-such-flag")...)
			if err == nil || !strings.Contains(err.Error(), "no-such-flag") {
				t.Errorf("lanekit %s --no-such-flag: err %v, want an unknown-flag error", strings.Join(path, " "), err)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd)
	if groups < 8 || actions < 25 {
		t.Errorf("walked %d groups and %d actions: the tree is smaller than expected", groups, actions)
	}
	for _, args := range [][]string{
		// Every case must fail in argument checking: a valid `lab vm
		// migrate` would migrate the VM of whatever lab is up — in `make
		// test`, pkg/lab's, running at the same time (CI stop 57).
		{"lab", "vm", "migrate", "vm1", "extra"},
		{"lab", "vm-exec"}, // needs NAME and a command
		{"status", "extra"},
		{"lab", "down", "extra"},
		{"help", "no-such-topic"},
		{"completion", "no-such-shell"},
	} {
		if _, err := runCLI(t, args...); err == nil {
			t.Errorf("lanekit %s: no error", strings.Join(args, " "))
		}
	}
	if out, err := runCLI(t, "help", "lab", "up"); err != nil || !strings.Contains(out, "lab up") {
		t.Errorf("lanekit help lab up: err %v, output %q", err, out)
	}
}
