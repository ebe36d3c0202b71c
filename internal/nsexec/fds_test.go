package nsexec

import (
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A descriptor the caller left open without close-on-exec (flock(1)'s lock)
// must not reach the daemons the lab starts.
func TestCloseInheritedOnExec(t *testing.T) {
	fd, err := syscall.Open(filepath.Join(t.TempDir(), "lock"), syscall.O_CREAT|syscall.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC != 0 {
		t.Fatalf("setup: flags %#x, %v", flags, err)
	}
	CloseInheritedOnExec()
	if flags, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("inherited descriptor still passes to children: flags %#x, %v", flags, err)
	}
}
