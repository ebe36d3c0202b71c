// Package socktest is a socket client for tests of the socket load
// balancer: a test binary re-executes itself (MaybeClient in its TestMain)
// as a "host process" in a chosen network namespace and cgroup, makes TCP
// and UDP calls, and reports the backend that answered and the peer address
// the client saw (getpeername, recvfrom).
package socktest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const env = "LANEKIT_SOCKTEST_CLIENT"

// MaybeClient runs the client and exits when the process was started by
// Run; otherwise it returns. Call it first in TestMain.
func MaybeClient() {
	ops := os.Getenv(env)
	if ops == "" {
		return
	}
	for _, op := range strings.Split(ops, ";") {
		kind, addr, _ := strings.Cut(op, " ")
		backend, peer, err := do(kind, addr)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				fmt.Printf("err %s\n", unix.ErrnoName(errno))
			} else {
				fmt.Printf("err %q\n", err.Error())
			}
			continue
		}
		fmt.Printf("ok %s %s\n", backend, peer)
	}
	os.Exit(0)
}

// Run re-executes the test binary as a client in the netns at netnsPath
// and, when cgroup is not empty, in that cgroup2 directory from its first
// instruction (clone3 into the cgroup). ops are "tcp ADDR" (connect, write
// a line, read the answer), "udpc ADDR" (the same over connected UDP),
// "udp ADDR" (unconnected: sendto, recvfrom), or "tcp6m" / "udp6m" /
// "udp6mu ADDR" (tcp / udpc / udp from an IPv6 socket to ADDR's IPv4-mapped
// address; the peer is reported unmapped), or "tcp6" / "udpc6" / "udp6 ADDR"
// (tcp / udpc / udp to an IPv6 ADDR). It returns one line per op:
// "ok <first word of the answer> <peer>" (peer: getpeername for tcp/udpc,
// the reply's source for udp) or "err <ERRNO>".
func Run(netnsPath, cgroup string, ops ...string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", "--net="+netnsPath, self)
	cmd.Env = append(os.Environ(), env+"="+strings.Join(ops, ";"))
	if cgroup != "" {
		f, err := os.Open(cgroup)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("socket client %v: %w", ops, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(ops) {
		return nil, fmt.Errorf("socket client %v: %d result lines, want %d: %q", ops, len(lines), len(ops), out)
	}
	return lines, nil
}

func do(kind, addr string) (backend, peer string, err error) {
	deadline := time.Now().Add(3 * time.Second)
	buf := make([]byte, 128)
	first := func(b []byte) string {
		if f := strings.Fields(string(b)); len(f) > 0 {
			return f[0]
		}
		return "-"
	}
	switch kind {
	case "tcp", "udpc", "tcp6", "udpc6":
		network := map[string]string{"tcp": "tcp4", "udpc": "udp4", "tcp6": "tcp6", "udpc6": "udp6"}[kind]
		c, err := net.DialTimeout(network, addr, 3*time.Second)
		if err != nil {
			return "", "", err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return "", "", err
		}
		n, err := c.Read(buf)
		if err != nil {
			return "", "", err
		}
		// Go fills RemoteAddr from getpeername after connect.
		return first(buf[:n]), c.RemoteAddr().String(), nil
	case "udp", "udp6":
		network := map[string]string{"udp": "udp4", "udp6": "udp6"}[kind]
		to, err := net.ResolveUDPAddr(network, addr)
		if err != nil {
			return "", "", err
		}
		c, err := net.ListenUDP(network, nil)
		if err != nil {
			return "", "", err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		if _, err := c.WriteToUDP([]byte("ping\n"), to); err != nil {
			return "", "", err
		}
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			return "", "", err
		}
		return first(buf[:n]), from.String(), nil
	case "tcp6m", "udp6m", "udp6mu":
		return mapped(kind, addr, deadline)
	}
	return "", "", fmt.Errorf("unknown op %q", kind)
}

// mapped is tcp or udpc from an IPv6 socket to the IPv4-mapped form of addr
// (what a dual-stack application does; Go's net would use an IPv4 socket).
func mapped(kind, addr string, deadline time.Time) (backend, peer string, err error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", "", err
	}
	typ := unix.SOCK_STREAM
	if kind != "tcp6m" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", "", err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(time.Until(deadline).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	sa := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: netip.AddrFrom16(ap.Addr().As16()).As16()}
	if kind == "udp6mu" {
		return mappedUnconnected(fd, sa)
	}
	if err := unix.Connect(fd, sa); err != nil {
		return "", "", err
	}
	if _, err := unix.Write(fd, []byte("ping\n")); err != nil {
		return "", "", err
	}
	buf := make([]byte, 128)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return "", "", err
	}
	if n <= 0 {
		return "", "", fmt.Errorf("no answer")
	}
	got, err := unix.Getpeername(fd)
	if err != nil {
		return "", "", err
	}
	p6, ok := got.(*unix.SockaddrInet6)
	if !ok {
		return "", "", fmt.Errorf("peer %T", got)
	}
	return answer6(buf[:n], p6)
}

// mappedUnconnected is udp from an IPv6 socket: sendto, recvfrom.
func mappedUnconnected(fd int, to *unix.SockaddrInet6) (backend, peer string, err error) {
	if err := unix.Sendto(fd, []byte("ping\n"), 0, to); err != nil {
		return "", "", err
	}
	buf := make([]byte, 128)
	n, from, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return "", "", err
	}
	p6, ok := from.(*unix.SockaddrInet6)
	if !ok {
		return "", "", fmt.Errorf("source %T", from)
	}
	return answer6(buf[:n], p6)
}

// answer6 is the answer's first word and the peer, unmapped.
func answer6(b []byte, p6 *unix.SockaddrInet6) (backend, peer string, err error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "", "", fmt.Errorf("empty answer")
	}
	return f[0], netip.AddrPortFrom(netip.AddrFrom16(p6.Addr).Unmap(), uint16(p6.Port)).String(), nil
}
