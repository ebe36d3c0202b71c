package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// DefaultCacheDir is where EnsureImage keeps the kernel and initramfs.
const DefaultCacheDir = "/var/cache/lanekit/guest"

// buildTimeout bounds one run of scripts/guest/build.sh (apt included).
const buildTimeout = 10 * time.Minute

// EnsureImage builds the guest image into cacheDir (DefaultCacheDir when empty)
// unless it is up to date, and returns the kernel and initramfs paths. It runs
// scripts/guest/build.sh, found through $LANEKIT_GUEST_BUILD, the working
// directory's enclosing lanekit checkout, or this source file's checkout.
func EnsureImage(cacheDir string) (kernel, initrd string, err error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	script, err := BuildScript()
	if err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := nsexec.GroupCommand(ctx, 5*time.Second, "bash", script, cacheDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timed out after %s)", err, buildTimeout)
		}
		return "", "", fmt.Errorf("build guest image in %s: %w: %s", cacheDir, err, tail(stderr.String(), 5))
	}
	for _, l := range strings.Split(stdout.String(), "\n") {
		if v, ok := strings.CutPrefix(l, "KERNEL="); ok {
			kernel = v
		} else if v, ok := strings.CutPrefix(l, "INITRD="); ok {
			initrd = v
		}
	}
	if kernel == "" || initrd == "" {
		return "", "", fmt.Errorf("build guest image in %s: no KERNEL=/INITRD= in output: %q", cacheDir, tail(stdout.String(), 3))
	}
	for _, f := range []string{kernel, initrd} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			return "", "", fmt.Errorf("build guest image in %s: %s missing or empty", cacheDir, f)
		}
	}
	return kernel, initrd, nil
}

// BuildScript locates scripts/guest/build.sh.
func BuildScript() (string, error) {
	if p := os.Getenv("LANEKIT_GUEST_BUILD"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("guest build script from LANEKIT_GUEST_BUILD: %w", err)
		}
		return p, nil
	}
	rel := filepath.Join("scripts", "guest", "build.sh")
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, d := range starts {
		for ; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, rel)); err == nil {
				return filepath.Join(d, rel), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("find guest build script: scripts/guest/build.sh not found above the working directory, the executable or the source (set LANEKIT_GUEST_BUILD)")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
