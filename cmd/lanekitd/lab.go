package main

import (
	"flag"
	"fmt"

	"github.com/lanekit/lanekit/internal/labswitch"
	"github.com/lanekit/lanekit/pkg/vf"
)

// labFlags are the flags (and, for --vf-kind, the value) only the lab
// uses: veth pairs standing in for a DPU's VFs (--vf-kind veth,
// --vf-host-netns) and static tunnel peers instead of the Node objects
// (--tunnel-node). --help leaves them out and run refuses them unless the
// lab switch is on (internal/labswitch: LANEKIT_LAB=1 in the environment;
// pkg/lab sets it for the agents it starts).
var labFlags = map[string]func(value string) bool{
	"vf-kind":       func(v string) bool { return v == vf.KindVeth },
	"vf-host-netns": func(string) bool { return true },
	"tunnel-node":   func(string) bool { return true },
}

// hideLabFlags makes fs's usage (--help) list every flag but labFlags,
// unless lab.
func hideLabFlags(fs *flag.FlagSet, lab bool) {
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
		shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		shown.SetOutput(out)
		fs.VisitAll(func(f *flag.Flag) {
			if _, hidden := labFlags[f.Name]; hidden && !lab {
				return
			}
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue // the default, not what was parsed so far
		})
		shown.PrintDefaults()
	}
}

// checkLabFlags refuses the lab-only flags set on fs (after Parse) unless
// lab.
func checkLabFlags(fs *flag.FlagSet, lab bool) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if only, ok := labFlags[f.Name]; ok && !lab && err == nil && only(f.Value.String()) {
			name := "--" + f.Name
			if f.Name == "vf-kind" {
				name += " " + f.Value.String()
			}
			err = labswitch.Refused(name)
		}
	})
	return err
}
