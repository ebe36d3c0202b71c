package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
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
	forbidden := []string{"/pkg/lab", "/pkg/bench", "/pkg/guest", "/internal/k8stest", "/internal/testutil", "/internal/tools/"}
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
