// Package beneath confines paths that callers name (a CNI config's
// device-info file, a VM attachment's host socket directory) to a root
// directory the agent or installer chose: no "..", no absolute escape, and
// no symbolic link anywhere below the root (resolved by the kernel with
// openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so a link swapped in after a
// check cannot redirect the open).
package beneath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrOutside is returned for a path that is not strictly beneath its root
// or that reaches outside through a symbolic link.
var ErrOutside = errors.New("outside its allowed directory")

// Rel returns path relative to root when path is a clean absolute path
// strictly beneath root (lexically: no "..", not root itself).
func Rel(root, path string) (string, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return "", fmt.Errorf("%q is not a clean absolute path: %w", path, ErrOutside)
	}
	rel, err := filepath.Rel(filepath.Clean(root), path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%q is not under %s: %w", path, root, ErrOutside)
	}
	return rel, nil
}

// how opens one directory beneath a verified one, following no symbolic
// link. (Mounts below the root are allowed: a memory-backed emptyDir is one.)
var how = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
}

// OpenDir opens the directory rel (relative, as Rel returns it; "." is the
// root) beneath root, one component at a time from the root's descriptor:
// a symbolic link on the way is refused before anything is created past
// it. With mode != 0, missing directories (the root too) are created with
// that mode. The result is an O_PATH descriptor for WriteFileAt and
// RemoveAt.
func OpenDir(root, rel string, mode os.FileMode) (*os.File, error) {
	if mode != 0 {
		if err := os.MkdirAll(root, mode); err != nil {
			return nil, err
		}
	}
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	cur := root
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		if part == "." {
			continue
		}
		if part == ".." {
			unix.Close(dfd)
			return nil, fmt.Errorf("%s: %q: %w", root, rel, ErrOutside)
		}
		cur = filepath.Join(cur, part)
		if mode != 0 {
			// mkdirat does not follow a link at part: an existing link is
			// EEXIST and refused by the open below.
			if err := unix.Mkdirat(dfd, part, uint32(mode.Perm())); err != nil && err != unix.EEXIST {
				unix.Close(dfd)
				return nil, &os.PathError{Op: "mkdir", Path: cur, Err: err}
			}
		}
		nfd, err := unix.Openat2(dfd, part, &how)
		unix.Close(dfd)
		switch {
		case err == unix.ELOOP || err == unix.EXDEV:
			return nil, fmt.Errorf("%s is a symbolic link (%v): %w", cur, err, ErrOutside)
		case err != nil:
			return nil, &os.PathError{Op: "open", Path: cur, Err: err}
		}
		dfd = nfd
	}
	return os.NewFile(uintptr(dfd), cur), nil
}

// WriteFileAt writes name in dir atomically (a temporary file renamed over
// it) with mode perm; it never follows a symbolic link at name.
func WriteFileAt(dir *os.File, name string, data []byte, perm os.FileMode) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("%q is not a file name: %w", name, ErrOutside)
	}
	dfd := int(dir.Fd())
	tmp := fmt.Sprintf(".%s.%d.%d.tmp", name, os.Getpid(), time.Now().UnixNano())
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(dir.Name(), tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), tmp))
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s: %w", filepath.Join(dir.Name(), name), err)
	}
	return nil
}

// RemoveAt removes the file name in dir (a symbolic link itself, not its
// target); a missing file is not an error.
func RemoveAt(dir *os.File, name string) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("%q is not a file name: %w", name, ErrOutside)
	}
	if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil && err != unix.ENOENT {
		return &os.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	return nil
}
