// Package nsexec starts processes inside named network namespaces and serves
// TCP accept loops: the helpers the lab and the benchmark share.
package nsexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"syscall"
	"time"
)

// Command builds `ip netns exec NS args...` in its own process group, so a
// cancelled context kills the tool and anything it spawned. `ip netns exec`
// execs in place: the pid is the tool's.
func Command(ctx context.Context, ns string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// GroupCommand builds argv in its own process group that dies with this
// process (Pdeathsig) and whose whole group a cancelled ctx kills; Wait
// gives up on its output pipes waitDelay after that.
func GroupCommand(ctx context.Context, waitDelay time.Duration, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	return cmd
}

// ServeEcho echoes every connection on ln back (each for at most 5 s) until
// ctx ends; what names the server in errors (Serve).
func ServeEcho(ctx context.Context, ln net.Listener, what string) error {
	return Serve(ctx, ln, what, func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(c, c)
	})
}

// Serve accepts connections on ln until ctx ends and runs handle for each in
// its own goroutine; handle owns (and closes) the connection. Temporary
// accept errors (timeouts) are retried; what is the server's name in errors.
// It returns nil once ctx ends.
func Serve(ctx context.Context, ln net.Listener, what string, handle func(net.Conn)) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("%s accept: %w", what, err)
		}
		go handle(c)
	}
}
