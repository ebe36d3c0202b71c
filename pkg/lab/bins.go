package lab

import (
	"fmt"
	"os"
	"path/filepath"
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

// CNIPaths is where libcni looks for plugins. A CNI type names an executable:
// type "lanekit" is bin/cni/lanekit, which `make build` links to lanekit-cni
// (bin/lanekit itself is the CLI).
func (b Bins) CNIPaths() []string { return []string{b.CNIDir} }

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
	for _, p := range []string{filepath.Join(b.Dir, "lanekitd"), filepath.Join(b.Dir, "lanekit-cni"), filepath.Join(b.CNIDir, "lanekit")} {
		if !executable(p) {
			return fmt.Errorf("%s missing (run make build, or use --baseline-only)", p)
		}
	}
	return nil
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
