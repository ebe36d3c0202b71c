package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lanekit/lanekit/internal/unixhttp"
)

// BackendMetricsMaxBody bounds one backend's answer: its metrics are a few dozen
// families per queue, far below this.
const BackendMetricsMaxBody = 1 << 20

// ScrapeBackend reads and parses the metrics a VM backend running as uid
// serves on sock. A backend is the VM's, not the agent's: whatever a
// compromised one serves must not mislead the agent or the agent's /metrics.
// So the socket must be a socket owned by uid in a directory owned by uid
// with no access for others (no symbolic link on the way), its server must
// run as uid (SO_PEERCRED), and the answer is bounded. The families are as
// the text parser files them: the backend writes OpenMetrics, so a counter
// x's samples come as an untyped family x_total.
func ScrapeBackend(ctx context.Context, sock string, uid uint32) (map[string]*dto.MetricFamily, error) {
	if err := checkBackendPath(sock, uid); err != nil {
		return nil, err
	}
	text, err := unixhttp.GetWith(ctx, sock, "/metrics", unixhttp.Options{MaxBody: BackendMetricsMaxBody, PeerUID: &uid})
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sock, err)
	}
	return fams, nil
}

// checkBackendPath checks the backend's metrics directory and socket.
func checkBackendPath(sock string, uid uint32) error {
	dir := filepath.Dir(sock)
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, os.ModeDir}, {sock, os.ModeSocket}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case fi.Mode().Type() != c.mode:
			return fmt.Errorf("%s: %s, want a %s", c.path, fileType(fi.Mode()), fileType(c.mode))
		case !ok || st.Uid != uid:
			return fmt.Errorf("%s: not owned by the backend's uid %d", c.path, uid)
		case c.mode == os.ModeDir && fi.Mode().Perm()&0o077 != 0:
			return fmt.Errorf("%s: mode %s, want no access for group or others", c.path, fi.Mode().Perm())
		}
	}
	return nil
}

func fileType(m os.FileMode) string {
	switch m.Type() {
	case os.ModeDir:
		return "directory"
	case os.ModeSocket:
		return "socket"
	case os.ModeSymlink:
		return "symbolic link"
	case 0:
		return "regular file"
	}
	return m.Type().String()
}
