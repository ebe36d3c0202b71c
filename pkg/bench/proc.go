package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// nsCommand builds `ip netns exec NS args...` in its own process group (see
// nsexec.Command).
var nsCommand = nsexec.Command

// runIn runs a bounded command in a netns and returns its stdout; stderr is
// folded into the error.
func runIn(ctx context.Context, timeout time.Duration, ns string, args ...string) ([]byte, error) {
	return runInCgroup(ctx, timeout, ns, "", args...)
}

// runInCgroup is runIn with the process started in cgroup2 directory
// cgroup ("": this process's), from its first instruction.
func runInCgroup(ctx context.Context, timeout time.Duration, ns, cgroup string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := nsCommand(ctx, ns, args...)
	if cgroup != "" {
		f, err := os.Open(cgroup)
		if err != nil {
			return nil, fmt.Errorf("client cgroup: %w", err)
		}
		defer f.Close()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd())
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timed out after %s)", err, timeout)
		}
		return stdout.Bytes(), fmt.Errorf("%s in %s: %w: %s", args[0], ns, err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// server is a background process serving one measurement in a netns.
type server struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

// startServer starts args in ns and waits until the process listens on TCP
// port (seen in /proc/<pid>/net/tcp*, which shows the process's own netns).
func startServer(ctx context.Context, life time.Duration, ns string, port int, args ...string) (*server, error) {
	ctx, cancel := context.WithTimeout(ctx, life)
	s := &server{done: make(chan error, 1)}
	s.cmd = nsCommand(ctx, ns, args...)
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s in %s: %w", args[0], ns, err)
	}
	go func() { s.done <- s.cmd.Wait(); cancel() }()
	pid := s.cmd.Process.Pid
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-s.done:
			s.done <- err
			return nil, fmt.Errorf("%s in %s exited early: %v: %s", args[0], ns, err, lastLine(s.out.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if Listening(pid, port) {
			return s, nil
		}
	}
	s.stop()
	return nil, fmt.Errorf("%s in %s: not listening on port %d after 5s", args[0], ns, port)
}

// stop waits briefly for a server that exits by itself (iperf3 -1), then
// kills its process group.
func (s *server) stop() {
	select {
	case err := <-s.done:
		s.done <- err
		return
	case <-time.After(500 * time.Millisecond):
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	err := <-s.done
	s.done <- err
}

// Listening reports whether the process pid's netns has a TCP socket in
// LISTEN state on port.
func Listening(pid, port int) bool {
	for _, f := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		if listenInTable(data, port) {
			return true
		}
	}
	return false
}

// listenInTable scans a /proc/net/tcp table for a LISTEN (0A) socket on port.
func listenInTable(table []byte, port int) bool {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		p, err := strconv.ParseUint(f[1][i+1:], 16, 16)
		if err == nil && int(p) == port {
			return true
		}
	}
	return false
}
