// Command docgen writes the generated parts of docs/configuration.md and
// docs/lab.md from the code: the lanekitd flags (the built agent's own
// --help, lab-only flags hidden as users see them), the DaemonSet's
// ConfigMap keys (deploy/configmap.yaml, with the flags
// deploy/daemonset.yaml passes them to), the CNI plugin's config fields
// (pkg/cniplugin's NetConf and its doc comments) and the options of
// `lanekit lab up` and `lanekit lab bench`.
//
//	go run ./internal/tools/docgen            # rewrite the generated blocks (make docs)
//	go run ./internal/tools/docgen -check     # exit 1 when it is stale
//
// TestConfigurationReferenceUpToDate runs the same generation and fails when
// a committed file differs. This is a development tool: no shipped binary
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
	for file, w := range want {
		if bytes.Equal(w, have[file]) {
			continue
		}
		if *check {
			return fmt.Errorf("%s is stale: run make docs", file)
		}
		if err := os.WriteFile(filepath.Join(root, file), w, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// generate returns each generated file as the code makes it and as
// committed, by path relative to root.
func generate(root, lanekitd string) (want, have map[string][]byte, err error) {
	dir, err := os.MkdirTemp("", "docgen-*")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	cmds := []string{"lanekit"}
	if lanekitd == "" {
		cmds = append(cmds, "lanekitd")
		lanekitd = filepath.Join(dir, "lanekitd")
	}
	if err := build(root, dir, cmds...); err != nil {
		return nil, nil, err
	}
	lanekit := filepath.Join(dir, "lanekit")
	agent, err := helpOf(lanekitd, "Usage of lanekitd:", "--help")
	if err != nil {
		return nil, nil, err
	}
	labUp, err := helpOf(lanekit, "Usage:", "lab", "up", "--help")
	if err != nil {
		return nil, nil, err
	}
	labBench, err := helpOf(lanekit, "Usage:", "lab", "bench", "--help")
	if err != nil {
		return nil, nil, err
	}
	src, err := readSources(root, agent)
	if err != nil {
		return nil, nil, err
	}
	config, err := blocks(src)
	if err != nil {
		return nil, nil, err
	}
	lab := map[string]string{}
	for block, help := range map[string]string{blockLabUp: labUp, blockLabBench: labBench} {
		flags, err := parseCobraFlags(help)
		if err != nil {
			return nil, nil, fmt.Errorf("lanekit lab --help (%s): %w", block, err)
		}
		lab[block] = renderFlags(flags)
	}
	want, have = map[string][]byte{}, map[string][]byte{}
	for file, content := range map[string]map[string]string{configurationFile: config, labFile: lab} {
		h, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, nil, err
		}
		w, err := splice(file, h, content)
		if err != nil {
			return nil, nil, err
		}
		want[file], have[file] = w, h
	}
	return want, have, nil
}

// build compiles root's ./cmd/<name> commands into dir (one go build: the
// packages build in parallel).
func build(root, dir string, names ...string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %v: %w\n%s", names, err, out)
	}
	return nil
}

// helpOf runs bin with args (a --help) without the lab switch, so lab-only
// flags stay hidden, and returns its usage text (stdout and stderr: the
// flag package writes it to stderr and exits 1, cobra to stdout).
func helpOf(bin, marker string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "LANEKIT_LAB=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if !strings.Contains(out.String(), marker) {
		return "", fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, out.String())
	}
	// Drop main's "lanekitd: flag: help requested".
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(l, "lanekitd: ") {
			lines = append(lines, l)
		}
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
