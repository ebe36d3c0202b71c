package testutil

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Builds of this repository's commands, once per test process for each set
// of go build arguments: a test package whose tests each build the same
// binaries (a link of lanekitd is ~10 s on a busy machine) shares one build.
var (
	buildsMu sync.Mutex
	builds   = map[string]*goBuild{}
)

type goBuild struct {
	once sync.Once
	dir  string
	err  error
}

// GoBuild runs `go build ARGS -o DIR/ PKGS` in the module at root once per
// test process (per distinct args and pkgs) and links (or copies) each named
// binary into dst, which must exist; it fails t when the build fails. The
// shared builds' directory goes when RemoveGoBuilds runs (a TestMain's end);
// without one it is left in the system temp dir.
func GoBuild(t testing.TB, root, dst string, args, pkgs []string) {
	t.Helper()
	key := strings.Join(args, "\x00") + "\x01" + strings.Join(pkgs, "\x00")
	buildsMu.Lock()
	b := builds[key]
	if b == nil {
		b = &goBuild{}
		builds[key] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "lanekit-gobuild-"); b.err != nil {
			return
		}
		cmd := exec.Command("go", append(append(append([]string{"build"}, args...), "-o", b.dir+"/"), pkgs...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s %s: %v\n%s", strings.Join(args, " "), strings.Join(pkgs, " "), err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	for _, p := range pkgs {
		name := filepath.Base(p)
		if err := linkOrCopy(filepath.Join(b.dir, name), filepath.Join(dst, name)); err != nil {
			t.Fatalf("%s into %s: %v", name, dst, err)
		}
	}
}

// RemoveGoBuilds removes the directories of GoBuild's shared builds.
func RemoveGoBuilds() {
	buildsMu.Lock()
	defer buildsMu.Unlock()
	for k, b := range builds {
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
		delete(builds, k)
	}
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
