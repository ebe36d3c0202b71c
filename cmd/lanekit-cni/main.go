// Command lanekit-cni is the lanekit CNI plugin (type "lanekit"); the work
// happens in the node agent, see pkg/cniplugin.
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/lanekit/lanekit/pkg/cniplugin"
)

func init() { runtime.LockOSThread() }

func main() {
	if err := noArgs(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lanekit-cni:", err)
		os.Exit(1)
	}
	// skel fails an unknown CNI_COMMAND with a CNI error (exit 1).
	skel.PluginMainFuncs(cniplugin.Funcs(), cniplugin.VersionInfo, cniplugin.About)
}

// noArgs refuses command-line arguments: a runtime calls a CNI plugin with
// none (the command is CNI_COMMAND, the config on stdin), so any word or flag
// is a caller's mistake, not something to ignore.
func noArgs(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q: a CNI plugin is driven by CNI_COMMAND and the config on stdin (CNI spec 1.1)", args)
	}
	return nil
}
