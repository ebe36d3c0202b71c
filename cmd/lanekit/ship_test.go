package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/labswitch"
	"github.com/lanekit/lanekit/internal/testutil"
)

// shippedCommands are the binaries the agent image carries, and shipTags the
// build tags the image builds them with (deploy/images/agent.Containerfile).
var shippedCommands = []string{"./cmd/lanekitd", "./cmd/lanekit-cni", "./cmd/lanekit"}

const shipTags = "nolab"

// TestShippedBinariesLinkNoTestCode lists the packages the shipped binaries
// link, built as the image builds them: no lab, bench, guest image builder,
// test API server or test helpers. Without the nolab tag the CLI links the
// lab (the control: the check does see what is linked).
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	forbidden := []string{"/pkg/lab", "/pkg/bench", "/pkg/guest", "/internal/k8stest", "/internal/agenttest", "/internal/testutil", "/internal/tools/"}
	deps := func(tags string, pkgs ...string) []string {
		t.Helper()
		args := append([]string{"list", "-deps", "-tags", tags}, pkgs...)
		cmd := exec.Command("go", args...)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return strings.Fields(string(out))
	}
	for _, p := range deps(shipTags, shippedCommands...) {
		for _, f := range forbidden {
			if strings.Contains(p, "github.com/lanekit/lanekit"+f) {
				t.Errorf("a shipped binary links %s", p)
			}
		}
	}
	linksLab := false
	for _, p := range deps("", "./cmd/lanekit") {
		linksLab = linksLab || p == "github.com/lanekit/lanekit/pkg/lab"
	}
	if !linksLab {
		t.Errorf("without -tags %s the CLI does not link pkg/lab: the check above proves nothing", shipTags)
	}
	cf, err := os.ReadFile("../../deploy/images/agent.Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`go build [^\n]*-tags ` + shipTags + `[^\n]*\./cmd/lanekit\b`)
	if !build.Match(cf) {
		t.Errorf("agent.Containerfile does not build the shipped binaries with -tags %s", shipTags)
	}
}

// labFlagCases are the shipped binaries' lab-only flags (internal/labswitch):
// the arguments that use one, the flag the refusal must name, and what the
// same arguments fail on with the switch on (they never start anything).
var labFlagCases = []struct {
	bin, flag, withSwitch string
	args                  []string
}{
	{"lanekitd", "--vf-kind veth", "--nodeport-snat-ports", []string{"--vf-kind", "veth", "--pod-cidr", "10.9.0.0/24", "--nodeport-snat-ports", "x"}},
	{"lanekitd", "--vf-host-netns", "--nodeport-snat-ports", []string{"--vf-host-netns", "/run/netns/x", "--pod-cidr", "10.9.0.0/24", "--nodeport-snat-ports", "x"}},
	{"lanekitd", "--tunnel-node", "--nodeport-snat-ports", []string{"--tunnel-node", "10.9.1.0/24=192.0.2.1", "--pod-cidr", "10.9.0.0/24", "--nodeport-snat-ports", "x"}},
	{"lanekit-vhost", "--loopback", "bad mac address", []string{"--loopback", "--mac", "zz", "--socket", "SOCK"}},
	{"lanekit-vhost", "--no-seccomp", "bad mac address", []string{"--ifname", "lo", "--no-seccomp", "--mac", "zz", "--socket", "SOCK"}},
}

// TestShippedBinariesRefuseLabFlags runs the shipped binaries as the image
// builds them (lanekitd with -tags nolab; lanekit-vhost from $LANEKIT_BIN,
// which the image copies): lanekitd links no test double (no
// internal/agenttest symbol, no MemoryDatapath), --help lists no lab-only
// flag, and each is refused, naming it and the switch, unless
// LANEKIT_LAB=1; with the switch the same arguments get past it (the
// control: the refusal is the switch's).
func TestShippedBinariesRefuseLabFlags(t *testing.T) {
	dir := t.TempDir()
	// The image also builds with -trimpath, which changes no symbol or flag
	// checked here but makes go build compile every dependency again (277 s
	// of a fresh machine's make test): left out.
	build := exec.Command("go", "build", "-tags", shipTags, "-o", dir+"/", "./cmd/lanekitd")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build lanekitd: %v\n%s", err, out)
	}
	bins := map[string]string{"lanekitd": filepath.Join(dir, "lanekitd")}
	nm, err := exec.Command("go", "tool", "nm", bins["lanekitd"]).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	for _, sym := range []string{"internal/agenttest", "MemoryDatapath"} {
		if strings.Contains(string(nm), sym) {
			t.Errorf("lanekitd links %s", sym)
		}
	}
	bins["lanekit-vhost"] = filepath.Join(os.Getenv("LANEKIT_BIN"), "lanekit-vhost")
	runBin := func(bin string, lab bool, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(bins[bin], args...)
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, labswitch.Env+"=") {
				cmd.Env = append(cmd.Env, e)
			}
		}
		if lab {
			cmd.Env = append(cmd.Env, labswitch.Env+"=1")
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, bin := range []string{"lanekitd", "lanekit-vhost"} {
		if _, err := os.Stat(bins[bin]); err != nil {
			testutil.MissingDep(t, "no %s in $LANEKIT_BIN", bin) // lanekit-vhost: the image copies it from bin/
		}
		help, _ := runBin(bin, false, "--help")
		labHelp, _ := runBin(bin, true, "--help")
		for _, c := range labFlagCases {
			if c.bin != bin {
				continue
			}
			name := strings.Fields(c.flag)[0]
			listed := regexp.MustCompile(`(?m)^\s+-{1,2}` + regexp.QuoteMeta(strings.TrimLeft(name, "-")) + `\b`)
			if listed.MatchString(help) {
				t.Errorf("%s --help lists %s:\n%s", bin, name, help)
			}
			if bin == "lanekitd" && !listed.MatchString(labHelp) {
				t.Errorf("%s --help with %s=1 does not list %s: the check above proves nothing", bin, labswitch.Env, name)
			}
			args := make([]string, len(c.args))
			for i, a := range c.args {
				args[i] = strings.ReplaceAll(a, "SOCK", filepath.Join(dir, "vhost.sock"))
			}
			out, err := runBin(bin, false, args...)
			if want := c.flag + " is lab-only: refused unless " + labswitch.Env + "=1"; err == nil || !strings.Contains(out, want) {
				t.Errorf("%s %s without %s: %v, %q; want refused with %q", bin, strings.Join(args, " "), labswitch.Env, err, out, want)
			}
			if out, err := runBin(bin, true, args...); err == nil || !strings.Contains(out, c.withSwitch) {
				t.Errorf("%s %s with %s=1: %v, %q; want it to fail on %q (past the switch)", bin, strings.Join(args, " "), labswitch.Env, err, out, c.withSwitch)
			}
		}
	}
}
