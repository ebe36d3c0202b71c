// Package peercred reads who is at the other end of a unix socket.
package peercred

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Of returns the credentials (pid, uid, gid) of the process at the other end
// of c, as the kernel recorded them at connect (SO_PEERCRED).
func Of(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var (
		cred *unix.Ucred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred, nil
}
