package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Bins locates the executables the lab runs.
type Bins struct {
	Dir    string // lanekitd, lanekit-cni
	CNIDir string // reference plugins: bridge, host-local
	Self   string // the lanekit CLI (helper subcommands)
}

// FindBins uses $LANEKIT_BIN, else the directory of the running executable.
func FindBins() (Bins, error) {
	self, err := os.Executable()
	if err != nil {
		return Bins{}, fmt.Errorf("find lanekit executable: %w", err)
	}
	dir := os.Getenv("LANEKIT_BIN")
	if dir == "" {
		dir = filepath.Dir(self)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return Bins{}, fmt.Errorf("find bin dir: %w", err)
	}
	return Bins{Dir: dir, CNIDir: filepath.Join(dir, "cni"), Self: self}, nil
}

// Agent is the lanekitd path.
func (b Bins) Agent() string { return filepath.Join(b.Dir, "lanekitd") }

// CNIPaths is where libcni looks for plugins.
func (b Bins) CNIPaths() []string { return []string{b.Dir, b.CNIDir} }

// checkBaseline verifies the reference plugins are built.
func (b Bins) checkBaseline() error {
	for _, p := range []string{"bridge", "host-local"} {
		if !executable(filepath.Join(b.CNIDir, p)) {
			return fmt.Errorf("reference cni plugin %s missing in %s (run ./scripts/deps.sh)", p, b.CNIDir)
		}
	}
	return nil
}

// checkLanekit verifies the agent and CNI plugin exist.
func (b Bins) checkLanekit() error {
	for _, p := range []string{"lanekitd", "lanekit-cni"} {
		if !executable(filepath.Join(b.Dir, p)) {
			return fmt.Errorf("%s missing in %s (run make build, or use --baseline-only)", p, b.Dir)
		}
	}
	return nil
}

// LanekitReady reports whether lanekitd and lanekit-cni exist and lanekitd's
// usage lists the flags the lab passes: the full lab can be attempted.
func (b Bins) LanekitReady() bool {
	if b.checkLanekit() != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, b.Agent(), "--help").CombinedOutput() // usage exit codes vary
	for _, flag := range []string{"state-dir", "socket", "uplink", "pod-cidr", "bpf-dir"} {
		if !strings.Contains(string(out), "-"+flag) {
			return false
		}
	}
	return true
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
