// Command lanekit-cni is the lanekit CNI plugin (type "lanekit"); the work
// happens in the node agent, see pkg/cniplugin.
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/lanekit/lanekit/pkg/cniplugin"
)

func init() { runtime.LockOSThread() }

func main() {
	skel.PluginMainFuncs(cniplugin.Funcs(), cniplugin.VersionInfo, cniplugin.About)
}
