package dpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// VMNetns places the DPU side of VM endpoints: each VM's device (the
// multiqueue veth end the AF_XDP sockets bind to, the DPU side of what a
// virtio-net emulation function is on hardware) gets a network namespace of
// its own on the DPU, bind-mounted at Dir/<Prefix><vm>, so that the VM's
// address never becomes the DPU's own. The representor end stays in the
// DPU agent's namespace with the pod programs.
type VMNetns struct {
	Dir    string // e.g. /run/netns
	Prefix string // e.g. "lk-n1-d1-"
}

// Path is where the namespace of VM name is mounted.
func (v VMNetns) Path(name string) string { return filepath.Join(v.Dir, v.Prefix+name) }

// Create makes the namespace of VM name (loopback up) and returns its path;
// an existing one (a repeated or interrupted ADD) is reused.
func (v VMNetns) Create(name string) (string, error) {
	if v.Dir == "" {
		return "", errors.New("vm netns: no directory (--vm-netns-dir)")
	}
	p := v.Path(name)
	if isNetnsMount(p) {
		return p, nil
	}
	if err := os.MkdirAll(v.Dir, 0o755); err != nil {
		return "", fmt.Errorf("vm netns %s: %w", p, err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return "", fmt.Errorf("vm netns %s: %w", p, err)
	}
	f.Close()
	errc := make(chan error, 1)
	// A thread of its own: unshared, bind-mounted, then left to die (never
	// returned to the Go scheduler in another namespace).
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind %s: %w", src, err)
			return
		}
		errc <- setLoUp()
	}()
	if err := <-errc; err != nil {
		v.Delete(name)
		return "", fmt.Errorf("vm netns %s: %w", p, err)
	}
	return p, nil
}

// setLoUp brings loopback up in the calling thread's namespace.
func setLoUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// Delete unmounts and removes the namespace of VM name; a missing one is
// success.
func (v VMNetns) Delete(name string) error {
	p := v.Path(name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("vm netns %s: unmount: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("vm netns %s: %w", p, err)
	}
	return nil
}

// isNetnsMount says whether p is a mounted network namespace.
func isNetnsMount(p string) bool {
	var st unix.Statfs_t
	return unix.Statfs(p, &st) == nil && st.Type == unix.NSFS_MAGIC
}
