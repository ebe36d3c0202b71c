// Command docgen writes the generated parts of docs/configuration.md from
// the code: the lanekitd flags (the built agent's own --help, lab-only
// flags hidden as users see them), the DaemonSet's ConfigMap keys
// (deploy/configmap.yaml, with the flags deploy/daemonset.yaml passes them
// to) and the CNI plugin's config fields (pkg/cniplugin's NetConf and its
// doc comments).
//
//	go run ./internal/tools/docgen            # rewrite docs/configuration.md (make docs)
//	go run ./internal/tools/docgen -check     # exit 1 when it is stale
//
// TestConfigurationReferenceUpToDate runs the same generation and fails when
// the committed file differs. This is a development tool: no shipped binary
// links it.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("docgen", flag.ContinueOnError)
	check := fs.Bool("check", false, "do not write: fail when "+configurationFile+" differs from what the code generates")
	lanekitd := fs.String("lanekitd", "", "the lanekitd binary to read --help from (default: built from ./cmd/lanekitd)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	want, have, err := generate(root, *lanekitd)
	if err != nil {
		return err
	}
	if bytes.Equal(want, have) {
		return nil
	}
	if *check {
		return fmt.Errorf("%s is stale: run make docs", configurationFile)
	}
	return os.WriteFile(filepath.Join(root, configurationFile), want, 0o644)
}

// generate returns the reference as the code makes it and as committed.
func generate(root, lanekitd string) (want, have []byte, err error) {
	help, err := agentHelp(root, lanekitd)
	if err != nil {
		return nil, nil, err
	}
	src, err := readSources(root, help)
	if err != nil {
		return nil, nil, err
	}
	content, err := blocks(src)
	if err != nil {
		return nil, nil, err
	}
	have, err = os.ReadFile(filepath.Join(root, configurationFile))
	if err != nil {
		return nil, nil, err
	}
	want, err = splice(have, content)
	return want, have, err
}

// agentHelp runs lanekitd --help (building it from the tree unless a binary
// is given) without the lab switch, so lab-only flags stay hidden.
func agentHelp(root, bin string) (string, error) {
	if bin == "" {
		dir, err := os.MkdirTemp("", "docgen-*")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "lanekitd")
		build := exec.Command("go", "build", "-o", bin, "./cmd/lanekitd")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build lanekitd: %w\n%s", err, out)
		}
	}
	cmd := exec.Command(bin, "--help")
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "LANEKIT_LAB=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run() // --help exits 1 (flag.ErrHelp)
	out := stderr.String()
	if !strings.Contains(out, "Usage of lanekitd:") {
		return "", fmt.Errorf("%s --help: %v: %s", bin, err, out)
	}
	// Drop what follows the flag list (main's "lanekitd: flag: help requested").
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "lanekitd: ") {
			continue
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n"), nil
}

// repoRoot is the directory holding go.mod, from the working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
