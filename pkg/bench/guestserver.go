package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanekit/lanekit/pkg/guest"
)

// Shell runs one shell command inside a guest and returns its output and
// exit code; *guest.Console implements it.
type Shell interface {
	Run(ctx context.Context, cmd string) (string, int, error)
}

// Guest is the server side of a row whose servers run inside a VM: they are
// started through the guest's serial console (a shell command in the
// background) instead of with `ip netns exec`. The guest image carries
// iperf3, sockperf and lk-bench (the connection-rate server).
type Guest struct {
	Name   string // the VM's name, for messages
	Serial string // QEMU's serial socket; dialled on first use when Shell is nil
	Shell  Shell  // optional: an already connected shell (tests)

	mu  sync.Mutex
	con *guest.Console
}

// guestPollEvery and guestListenWait bound waiting for a server in a guest
// to listen: under TCG a process start takes hundreds of milliseconds.
const (
	guestPollEvery  = 200 * time.Millisecond
	guestListenWait = 30 * time.Second
	guestCmdTimeout = 20 * time.Second
)

// shell returns the guest's shell, dialling its console once.
func (g *Guest) shell(ctx context.Context) (Shell, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.Shell != nil {
		return g.Shell, nil
	}
	if g.con == nil {
		dctx, cancel := context.WithTimeout(ctx, guestCmdTimeout)
		defer cancel()
		con, err := guest.DialConsole(dctx, g.Serial)
		if err != nil {
			return nil, fmt.Errorf("guest %s console: %w", g.Name, err)
		}
		g.con = con
	}
	return g.con, nil
}

// Close closes a console the harness dialled.
func (g *Guest) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.con == nil {
		return nil
	}
	err := g.con.Close()
	g.con = nil
	return err
}

// run runs cmd with a bounded wait.
func (g *Guest) run(ctx context.Context, cmd string) (string, int, error) {
	sh, err := g.shell(ctx)
	if err != nil {
		return "", -1, err
	}
	rctx, cancel := context.WithTimeout(ctx, guestCmdTimeout)
	defer cancel()
	return sh.Run(rctx, cmd)
}

// output runs cmd and returns its output, an error naming the guest unless
// it exited 0.
func (g *Guest) output(ctx context.Context, cmd string) (string, error) {
	out, code, err := g.run(ctx, cmd)
	if err != nil {
		return "", fmt.Errorf("guest %s: %w", g.Name, err)
	}
	if code != 0 {
		return "", fmt.Errorf("guest %s: %s: exit %d: %s", g.Name, cmd, code, strings.TrimSpace(out))
	}
	return out, nil
}

// stopper ends a measurement's server.
type stopper interface{ stop() }

// guestServer is a server process inside a guest.
type guestServer struct {
	g   *Guest
	pid int
}

// shellQuote quotes one word for sh.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// guestStartCommand renders the background start of args in the guest,
// bounded by busybox timeout, logging to logf and printing its pid.
func guestStartCommand(life time.Duration, logf string, args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return fmt.Sprintf("cd /tmp && timeout %s %s >%s 2>&1 </dev/null & echo LKPID=$!",
		secondsArg(life), strings.Join(q, " "), logf)
}

// parseGuestPID reads the LKPID= line of guestStartCommand's output.
func parseGuestPID(out string) (int, error) {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "LKPID="); ok {
			pid, err := strconv.Atoi(v)
			if err != nil || pid <= 1 {
				break
			}
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no pid in %q", strings.TrimSpace(out))
}

// startGuestServer starts args in the guest and waits until its netns has a
// TCP listener on port (read from the guest's /proc/net/tcp{,6}).
func startGuestServer(ctx context.Context, g *Guest, life time.Duration, port int, args ...string) (*guestServer, error) {
	logf := fmt.Sprintf("/tmp/lkbench-%d.log", port)
	out, code, err := g.run(ctx, guestStartCommand(life, logf, args...))
	if err != nil {
		return nil, fmt.Errorf("start %s in guest %s: %w", args[0], g.Name, err)
	}
	pid, perr := parseGuestPID(out)
	if code != 0 || perr != nil {
		return nil, fmt.Errorf("start %s in guest %s: exit %d: %v", args[0], g.Name, code, perr)
	}
	s := &guestServer{g: g, pid: pid}
	check := fmt.Sprintf("kill -0 %d && cat /proc/net/tcp /proc/net/tcp6", pid)
	for deadline := time.Now().Add(guestListenWait); time.Now().Before(deadline); {
		out, code, err := g.run(ctx, check)
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("%s in guest %s: %w", args[0], g.Name, err)
		}
		if code != 0 {
			log, _, _ := g.run(ctx, "cat "+logf)
			return nil, fmt.Errorf("%s in guest %s exited early: %s", args[0], g.Name, lastLine(log))
		}
		if listenInTable([]byte(out), port) {
			return s, nil
		}
		select {
		case <-ctx.Done():
			s.stop()
			return nil, fmt.Errorf("%s in guest %s: %w", args[0], g.Name, ctx.Err())
		case <-time.After(guestPollEvery):
		}
	}
	s.stop()
	return nil, fmt.Errorf("%s in guest %s: not listening on port %d after %s", args[0], g.Name, port, guestListenWait)
}

// stop kills the server (a no-op when it already exited, like iperf3 -1).
func (s *guestServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), guestCmdTimeout)
	defer cancel()
	_, _, _ = s.g.run(ctx, fmt.Sprintf("kill -9 %d 2>/dev/null; true", s.pid))
}
