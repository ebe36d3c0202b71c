package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// How the real-node lab installs lanekit (Config.Install).
const (
	// InstallKustomize: `kubectl apply -k` of an overlay over deploy/ (the default).
	InstallKustomize = "kustomize"
	// InstallHelm: the commands of docs/install.md's "Install with Helm", read
	// from that page and run as written, the placeholders filled in: what a
	// newcomer following the docs types.
	InstallHelm = "helm"
)

// InstallDoc is the page whose Helm commands InstallHelm runs, and
// installHelmSection the heading of its section.
const (
	InstallDoc         = "docs/install.md"
	installHelmSection = "## Install with Helm"
)

// The placeholders of the documented Helm command, and what the lab puts in
// their place: the API server's address and port (no kube-proxy serves the
// kubernetes Service to the agents) and the registry the lab's images are
// tagged for (lkimages imports them under these names: no pull leaves a node).
const (
	placeholderAPIHost  = "<API server address>"
	placeholderAPIPort  = "<API server port>"
	placeholderRegistry = "<your registry>"
	labRegistry         = "ghcr.io/lanekit"
)

func (c Config) install() string {
	if c.Install == "" {
		return InstallKustomize
	}
	return c.Install
}

// zone is node i's zone (Zones, round robin; "" without).
func (c Config) zone(i int) string {
	if len(c.Zones) == 0 {
		return ""
	}
	return c.Zones[(i-1)%len(c.Zones)]
}

// checkZones: zones only on real nodes, each a valid label value.
func (c Config) checkZones() error {
	if len(c.Zones) == 0 {
		return nil
	}
	if !c.Kubelet {
		return errors.New("--zones needs --k8s --kubelet (real nodes label themselves)")
	}
	for _, z := range c.Zones {
		if errs := validation.IsValidLabelValue(z); z == "" || len(errs) > 0 {
			return fmt.Errorf("--zones: %q is not a label value: %s", z, strings.Join(errs, "; "))
		}
	}
	return nil
}

func (c Config) checkInstall() error {
	if err := c.checkZones(); err != nil {
		return err
	}
	if c.LBPool != "" && !c.Kubelet {
		return fmt.Errorf("--lb-pool needs --k8s --kubelet (real nodes)")
	}
	if c.LBPool != "" {
		ranges, err := lbPoolRanges(c.LBPool)
		if err != nil {
			return err
		}
		for _, r := range ranges {
			if r.First.Is6() && c.IPFamily != IPFamilyDual {
				return fmt.Errorf("--lb-pool %s-%s: an IPv6 range needs --ip-family dual (the real-node lab's nodes have no IPv6 otherwise)", r.First, r.Last)
			}
		}
	}
	if c.CNI != "" && c.CNI != CNILanekit && (c.Install != "" && c.Install != InstallKustomize || c.LBPool != "") {
		return fmt.Errorf("--install and --lb-pool install lanekit: not with --cni %s", c.CNI)
	}
	switch c.Install {
	case "", InstallKustomize:
		return nil
	case InstallHelm:
		if !c.Kubelet {
			return fmt.Errorf("--install %s needs --k8s --kubelet (real nodes)", c.Install)
		}
		if c.LBPool != "" {
			return fmt.Errorf("--lb-pool: with --install %s, set the chart's config.lbIPAM and a pool yourself", InstallHelm)
		}
		return nil
	}
	return fmt.Errorf("--install %q: want %s or %s", c.Install, InstallKustomize, InstallHelm)
}

// DocCommands returns the shell commands of the first ```sh block under
// heading in the Markdown page md: each command with its backslash
// continuations joined and its trailing comment removed. Only commands that
// start with prefix are returned (the block also lists informational ones,
// such as `helm show values`).
func DocCommands(md []byte, heading, prefix string) ([]string, error) {
	var (
		cmds            []string
		inSection, inSh bool
		cur             strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !inSection:
			inSection = strings.TrimSpace(line) == heading
			continue
		case !inSh && strings.HasPrefix(line, "## "):
			return nil, fmt.Errorf("section %q has no ```sh block", heading)
		case !inSh:
			inSh = strings.TrimSpace(line) == "```sh"
			continue
		case strings.TrimSpace(line) == "```":
			if cur.Len() > 0 {
				return nil, fmt.Errorf("section %q: the block ends inside a continued command", heading)
			}
			if len(cmds) == 0 {
				return nil, fmt.Errorf("section %q: no command starting with %q", heading, prefix)
			}
			return cmds, nil
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		cont := strings.HasSuffix(line, `\`)
		cur.WriteString(strings.TrimSpace(strings.TrimSuffix(line, `\`)))
		if cont {
			cur.WriteByte(' ')
			continue
		}
		if c := cur.String(); strings.HasPrefix(c, prefix) {
			cmds = append(cmds, c)
		}
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("section %q not found or its ```sh block not closed", heading)
}

// helmInstallCommands returns docs/install.md's `bin/helm install` commands
// with the lab's values in the placeholders; every placeholder must be one
// the lab knows (a new one in the docs fails here, not halfway in a shell).
func helmInstallCommands(repo string, srv *k8stest.Server) ([]string, error) {
	md, err := os.ReadFile(filepath.Join(repo, InstallDoc))
	if err != nil {
		return nil, err
	}
	cmds, err := DocCommands(md, installHelmSection, "bin/helm install ")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", InstallDoc, err)
	}
	r := strings.NewReplacer(placeholderAPIHost, srv.Address, placeholderAPIPort, strconv.Itoa(srv.APIPort),
		placeholderRegistry, labRegistry)
	for i, c := range cmds {
		cmds[i] = r.Replace(c)
		if strings.ContainsAny(cmds[i], "<>") {
			return nil, fmt.Errorf("%s: a placeholder the lab does not fill in: %s", InstallDoc, cmds[i])
		}
	}
	return cmds, nil
}

// installLanekitHelm runs docs/install.md's Helm install commands in a shell,
// from the repository's root (they name bin/helm), with the lab's admin
// kubeconfig as KUBECONFIG, in the underlay namespace (where the API server's
// address is).
func installLanekitHelm(ctx context.Context, repo string, srv *k8stest.Server) error {
	cmds, err := helmInstallCommands(repo, srv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, c := range cmds {
		cmd := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(WireNS), "--", "sh", "-ec", c)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "KUBECONFIG="+Kubeconfig)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s (from %s): %w: %s", c, InstallDoc, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
