package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// debian describes a Debian root filesystem built by mmdebstrap from Debian's
// package archive (the only place it downloads from) and cached as a tar.
type debian struct {
	Name     string   // cache file prefix
	Suite    string   // e.g. bookworm
	Mirror   string   // e.g. http://deb.debian.org/debian
	Packages []string // --include, on top of --variant=minbase
	Hooks    []string // --customize-hook shell commands; "$1" is the rootfs
	// Backports adds SUITE-backports as a second source: Packages name what
	// they take from it as PACKAGE/SUITE-backports (apt then takes their
	// dependencies' versions from there as needed).
	Backports bool
}

// key names the rootfs in the cache after its whole mmdebstrap command line:
// any change to the recipe builds a new one.
func (d debian) key() string {
	h := sha256.Sum256([]byte(strings.Join(d.args("OUT"), "\x00")))
	return fmt.Sprintf("%s-%s-%s.tar", d.Name, d.Suite, hex.EncodeToString(h[:])[:12])
}

// args are mmdebstrap's arguments writing the rootfs tar to out.
func (d debian) args(out string) []string {
	a := []string{"--variant=minbase", "--quiet",
		// No device nodes in the image (the runtime mounts /dev).
		"--skip=output/dev",
		// Merged /usr set up by mmdebstrap, not by the usrmerge package (which
		// pulls in perl).
		"--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"}
	// As Debian's -slim images: no docs (but the copyrights), man pages or locales.
	for _, o := range []string{"path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
		"path-exclude=/usr/share/man/*", "path-exclude=/usr/share/groff/*", "path-exclude=/usr/share/info/*",
		"path-exclude=/usr/share/lintian/*", "path-exclude=/usr/share/locale/*"} {
		a = append(a, "--dpkgopt="+o)
	}
	if len(d.Packages) > 0 {
		a = append(a, "--include="+strings.Join(d.Packages, ","))
	}
	for _, h := range d.Hooks {
		a = append(a, "--customize-hook="+h)
	}
	// Leave no apt lists or caches in the image.
	a = append(a, `--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*`)
	a = append(a, d.Suite, out, d.Mirror)
	if d.Backports {
		a = append(a, fmt.Sprintf("deb %s %s-backports main", d.Mirror, d.Suite))
	}
	return a
}

// rootfs returns the cached rootfs tar of d under cacheDir, building it with
// mmdebstrap (as root: it chroots) the first time.
func (d debian) rootfs(cacheDir string) (string, error) {
	out := filepath.Join(cacheDir, d.key())
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", errors.New("mmdebstrap not found: apt-get install mmdebstrap")
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp := out + ".tmp.tar" // mmdebstrap picks the format from the suffix
	fmt.Fprintf(os.Stderr, "lkimages: building the %s rootfs (%s + %s) into %s\n",
		d.Name, d.Suite, strings.Join(d.Packages, " "), out)
	// Its hooks talk even with --quiet: show the output only on failure.
	output, err := exec.Command("nice", append([]string{"-n", "19", mm}, d.args(tmp)...)...).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mmdebstrap %s: %w\n%s", d.Name, err, output)
	}
	return out, os.Rename(tmp, out)
}
