package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

// containerfile is the recipe of the agent image for real registries.
const containerfile = "deploy/images/agent.Containerfile"

// goBuildLine matches the Containerfile's Go build: env, flags, packages.
var goBuildLine = regexp.MustCompile(`(?m)((?:[A-Z_]+=\S+ )*)go build ((?:\S+ )*?)-o /out/ ((?:\./cmd/\S+ ?)+)`)

// agentGoBuild returns the Containerfile's `go build` of the agent image's Go
// binaries: its environment (CGO_ENABLED=0), flags (-trimpath, the tags that
// leave the lab out of the CLI) and packages, so the archive carries the
// binaries the Containerfile would build, not bin/'s (make build links the lab).
func agentGoBuild(recipe string) (env, flags, pkgs []string, err error) {
	m := goBuildLine.FindStringSubmatch(recipe)
	if m == nil {
		return nil, nil, nil, fmt.Errorf("%s: no `go build ... -o /out/ ./cmd/...` line", containerfile)
	}
	return strings.Fields(m[1]), strings.Fields(m[2]), strings.Fields(m[3]), nil
}

// buildAgentGo builds the agent image's Go binaries into dir, from the
// repository root (the working directory), as the Containerfile does.
func buildAgentGo(dir string) error {
	recipe, err := os.ReadFile(containerfile)
	if err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	env, flags, pkgs, err := agentGoBuild(string(recipe))
	if err != nil {
		return err
	}
	args := append(append([]string{"build"}, flags...), "-o", dir+"/")
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "lkimages: %s go %s\n", strings.Join(env, " "), strings.Join(cmd.Args[1:], " "))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("agent binaries: %w", err)
	}
	return nil
}
