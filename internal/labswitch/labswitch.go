// Package labswitch is the one switch that lets lanekit's binaries take
// their lab-only flags: LANEKIT_LAB=1 in the environment. Without it
// lanekitd refuses --vf-kind veth, --vf-host-netns and --tunnel-node, and
// lanekit-vhost (vhost/src/main.rs, the same variable) refuses --loopback
// and --no-seccomp; neither lists them in --help.
//
// Why the environment and not a build tag (the CLI's lab commands are left
// out with -tags nolab): the lab and the tests then run the very binaries
// the image ships, the Rust backend needs no second build, and a command
// line alone cannot turn the switch on: not a ConfigMap value that becomes
// one of lanekitd's flags, not an argument the agent hands a VM's backend
// (it starts each with a clean environment, pkg/agent/vhostproc.go).
package labswitch

import (
	"fmt"
	"os"
)

// Env is the switch's environment variable; the value "1" turns it on.
const Env = "LANEKIT_LAB"

// On reports whether the switch is on in this process's environment.
func On() bool { return os.Getenv(Env) == "1" }

// Refused is the error for the lab-only flag flag given without the switch.
func Refused(flag string) error {
	return fmt.Errorf("%s is lab-only: refused unless %s=1 is in the environment", flag, Env)
}
