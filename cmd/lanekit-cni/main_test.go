package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestArgsAndUnknownCommand: arguments and an unknown CNI_COMMAND fail with
// a message naming them (the plugin binary, run as the runtime would).
func TestArgsAndUnknownCommand(t *testing.T) {
	if err := noArgs(nil); err != nil {
		t.Fatal(err)
	}
	if err := noArgs([]string{"--help"}); err == nil || !strings.Contains(err.Error(), "--help") {
		t.Fatalf("noArgs(--help): %v", err)
	}
	if os.Getenv("LANEKIT_CNI_MAIN") != "" {
		// The re-executed test binary plays the plugin: its arguments are
		// the ones after "--".
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append(os.Args[:1], os.Args[i+1:]...)
				break
			}
		}
		main()
		return
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"CNI_COMMAND=MIGRATE"}, nil, "MIGRATE"},
		{[]string{"CNI_COMMAND=VERSION"}, []string{"extra"}, "extra"},
	} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=TestArgsAndUnknownCommand", "--"}, c.args...)...)
		cmd.Env = append(os.Environ(), append(c.env, "LANEKIT_CNI_MAIN=1")...)
		cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0","name":"lk","type":"lanekit"}`)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v %v: err %v, output %q: want a failure naming %q", c.env, c.args, err, out, c.want)
		}
	}
}
