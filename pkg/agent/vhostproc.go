package agent

// The vhost-user backends the agent runs for CNI VM attachments: one
// lanekit-vhost per VM, unprivileged (the VM's own backend user, no
// capabilities, no_new_privs, non-dumpable, seccomp: the agent hands it
// ready AF_XDP sockets; see lanekit-vhost's confine.rs), in its own session
// so that it outlives an agent restart (the new agent adopts it by pid file
// and command line), restarted with backoff when it exits, stopped by DEL.

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

const (
	// backendStartWait bounds how long a new backend may take to listen.
	backendStartWait = 10 * time.Second
	// backendStopWait is how long a stopping backend gets after SIGTERM.
	backendStopWait = 5 * time.Second
	// backendBackoffMax caps the wait between restarts; a backend that ran
	// for backendStableAfter starts over at backendBackoffMin.
	backendBackoffMin  = 500 * time.Millisecond
	backendBackoffMax  = 30 * time.Second
	backendStableAfter = time.Minute
	// backendLogMax: a backend log larger than this is truncated at start.
	backendLogMax = 4 << 20
)

// backendProc supervises one VM's backend.
type backendProc struct {
	name, socket     string
	argv             []string
	uid, gid         uint32
	logPath, pidPath string
	log              *slog.Logger

	mu       sync.Mutex
	pid      int
	restarts uint32
	stopping bool
	detached bool          // stopping because the agent closes: the process runs on
	wake     chan struct{} // closed by stop
	done     chan struct{} // closed when run returns
}

// BackendInfo is what ListVMs reports about a VM's backend.
type BackendInfo struct {
	PID      int
	Restarts uint32
}

func (p *backendProc) info() BackendInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return BackendInfo{PID: p.pid, Restarts: p.restarts}
}

// vhostBin is the backend binary: Config.VhostBin, else lanekit-vhost next
// to the agent's own binary, else on PATH.
func (a *Agent) vhostBin() (string, error) {
	if a.cfg.VhostBin != "" {
		return a.cfg.VhostBin, nil
	}
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), "lanekit-vhost"); isExecutable(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("lanekit-vhost")
	if err != nil {
		return "", fmt.Errorf("lanekit-vhost not found next to the agent or on PATH (set --vhost-bin): %w", err)
	}
	return p, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// backendDir holds the backends' pid files and logs.
func (a *Agent) backendDir() string { return filepath.Join(a.cfg.StateDir, "vhost") }

func (a *Agent) backendPIDPath(name string) string { return filepath.Join(a.backendDir(), name+".pid") }

// newBackendProc describes ep's backend (ep.VM.Backend set).
func (a *Agent) newBackendProc(ep *endpoint.Endpoint) (*backendProc, error) {
	bin, err := a.vhostBin()
	if err != nil {
		return nil, err
	}
	b := ep.VM.Backend
	argv := []string{bin,
		"--socket", b.Socket(),
		"--xsk-socket", ep.VM.Socket, "--vm", ep.VM.Name,
		"--queues", strconv.Itoa(ep.VM.Queues), "--mac", ep.MAC, "--mtu", strconv.Itoa(ep.MTU),
	}
	if b.MetricsSocket != "" {
		argv = append(argv, "--metrics-listen", b.MetricsSocket)
	}
	// The backend asks for what the agent hands (its own default may differ).
	rxGSO := RxGSOXDP
	if a.cfg.RxGSO == RxGSOKernel {
		rxGSO = RxGSOKernel
	}
	argv = append(argv, "--rx-gso", rxGSO)
	frontend := uint32(DefaultVhostFrontendUID)
	if a.cfg.VhostFrontendUID != nil {
		frontend = *a.cfg.VhostFrontendUID
	}
	// Started as root: the backend drops to its user with no capabilities
	// itself (the bounding set needs CAP_SETPCAP to drop), then locks down.
	argv = append(argv, "--run-as", fmt.Sprintf("%d:%d", b.UID, b.GID), "--frontend-uid", strconv.FormatUint(uint64(frontend), 10))
	return &backendProc{
		name: ep.VM.Name, socket: b.Socket(), argv: argv, uid: b.UID, gid: b.GID,
		logPath: filepath.Join(a.backendDir(), ep.VM.Name+".log"), pidPath: a.backendPIDPath(ep.VM.Name),
		log: a.log.With("vm", ep.VM.Name), wake: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// startBackend runs ep's backend (mu held): a backend left running by a
// previous agent with the same command line is adopted; another backend of
// this VM (other arguments) is stopped first. A fresh backend must listen
// within backendStartWait.
func (a *Agent) startBackend(ep *endpoint.Endpoint) error {
	p, err := a.newBackendProc(ep)
	if err != nil {
		return fmt.Errorf("vm %s backend: %w", ep.VM.Name, err)
	}
	pidfd := -1
	if old := nsexec.ReadPIDFile(p.pidPath); old > 0 {
		switch same, ours := p.matches(old); {
		case same && a.xsksEmptied():
			// Its AF_XDP sockets were in the lk_xsks this start replaced:
			// a new backend fetches them into the new one (QEMU reconnects).
			p.log.Warn("restarting vm backend: lk_xsks was recreated in a new shape without its sockets", "pid", old)
			nsexec.Terminate(old, backendStopWait)
		case same:
			if fd, err := unix.PidfdOpen(old, 0); err == nil {
				pidfd = fd
				p.pid = old
				p.log.Info("adopted running vm backend", "pid", old)
			}
		case ours:
			p.log.Info("stopping vm backend started with other arguments", "pid", old)
			nsexec.Terminate(old, backendStopWait)
		}
	}
	var cmd *exec.Cmd
	if pidfd < 0 {
		if cmd, err = p.spawn(); err != nil {
			return fmt.Errorf("vm %s backend: %w", ep.VM.Name, err)
		}
		if err := nsexec.WaitSocket(p.socket, backendStartWait, cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			_ = os.Remove(p.pidPath)
			return fmt.Errorf("vm %s backend: %w; log %s: %s", ep.VM.Name, err, p.logPath, nsexec.LogTail(p.logPath, 5))
		}
	}
	a.backends[ep.VM.Name] = p
	go p.run(cmd, pidfd)
	return nil
}

// stopBackend stops name's backend if the agent supervises one (mu held):
// SIGTERM, then SIGKILL after backendStopWait. It reports whether there was
// one; stopVMBackend removes the files.
func (a *Agent) stopBackend(name string) bool {
	p, ok := a.backends[name]
	if !ok {
		return false
	}
	delete(a.backends, name)
	p.mu.Lock()
	p.stopping = true
	pid := p.pid
	close(p.wake)
	p.mu.Unlock()
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(backendStopWait):
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-p.done
		}
	}
	<-p.done
	p.log.Info("vm backend stopped", "pid", pid)
	return true
}

// detachBackends stops supervising every backend without stopping it (agent
// Close): the VMs keep their network while the agent is down, and the next
// agent adopts the processes.
func (a *Agent) detachBackends() {
	for name, p := range a.backends {
		delete(a.backends, name)
		p.mu.Lock()
		p.stopping, p.detached = true, true
		close(p.wake)
		p.mu.Unlock()
	}
}

// spawn starts the backend as its user, in its own session, with its pid
// file written.
func (p *backendProc) spawn() (*exec.Cmd, error) {
	nsexec.CloseInheritedOnExec()
	if err := os.MkdirAll(filepath.Dir(p.logPath), 0o700); err != nil {
		return nil, fmt.Errorf("backend dir: %w", err)
	}
	if fi, err := os.Stat(p.logPath); err == nil && fi.Size() > backendLogMax {
		_ = os.Truncate(p.logPath, 0)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{"RUST_LOG=info"}
	// No Credential: --run-as makes the backend drop to p.uid:p.gid, its
	// bounding set and every capability before it talks to anyone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.argv[0], err)
	}
	// The pid file first: an agent that restarts as soon as the pid is
	// known must find this process in it, or it starts a second backend.
	if err := os.WriteFile(p.pidPath, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		p.log.Warn("write backend pid file", "err", err)
	}
	p.mu.Lock()
	p.pid = cmd.Process.Pid
	p.mu.Unlock()
	p.log.Info("vm backend started", "pid", cmd.Process.Pid, "socket", p.socket)
	return cmd, nil
}

// run waits for the backend to exit and restarts it until stopped. cmd is
// the child it started, or nil with pidfd an adopted process.
func (p *backendProc) run(cmd *exec.Cmd, pidfd int) {
	defer close(p.done)
	backoff := backendBackoffMin
	for {
		started := time.Now()
		var why string
		if cmd != nil {
			err := cmd.Wait()
			why = fmt.Sprint(err)
			if err == nil {
				why = "exit status 0"
			}
		} else {
			waitPidfd(pidfd)
			unix.Close(pidfd)
			why = "adopted process ended"
		}
		p.mu.Lock()
		p.pid = 0
		stopping := p.stopping
		if !stopping {
			p.restarts++
		}
		p.mu.Unlock()
		if stopping {
			return
		}
		if time.Since(started) > backendStableAfter {
			backoff = backendBackoffMin
		}
		p.log.Warn("vm backend exited; restarting", "why", why, "in", backoff, "log", nsexec.LogTail(p.logPath, 5))
		for {
			select {
			case <-p.wake:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, backendBackoffMax)
			p.mu.Lock()
			if p.stopping {
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			var err error
			if cmd, err = p.spawn(); err == nil {
				if backendRespawned != nil {
					backendRespawned(p)
				}
				break
			}
			p.log.Error("restart vm backend", "err", err, "next_in", backoff)
		}
		p.mu.Lock()
		if p.stopping { // stopped or detached while starting
			pid, detached := p.pid, p.detached
			p.mu.Unlock()
			if !detached {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
			// Detached (the agent closing): the process runs on, its pid
			// file written, for the next agent to adopt — killing it here
			// cut a VM's network whenever the agent restarted just as its
			// backend was restarted.
			_ = cmd.Wait()
			return
		}
		p.mu.Unlock()
		pidfd = -1
	}
}

// backendRespawned, when set (tests), runs right after the supervisor
// started a backend again, before it looks whether it was stopped meanwhile.
var backendRespawned func(p *backendProc)

// matches reports whether pid runs this backend's exact command line
// (same), or at least a backend of this VM (ours).
func (p *backendProc) matches(pid int) (same, ours bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(raw) == 0 {
		return false, false
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	// A script's command line starts with its interpreter.
	if len(args) == len(p.argv)+1 {
		args = args[1:]
	}
	if slices.Equal(args, p.argv) {
		return true, true
	}
	return false, filepath.Base(args[0]) == filepath.Base(p.argv[0]) &&
		bytes.Contains(raw, []byte("\x00--vm\x00"+p.name+"\x00"))
}

// waitPidfd blocks until the process behind pidfd ends.
func waitPidfd(pidfd int) {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// emptiedMaps is a datapath that replaced pinned maps with empty ones of a
// new shape when it loaded (datapath.Loader.EmptiedMaps).
type emptiedMaps interface{ EmptiedMaps() []string }

// xsksEmptied reports whether the datapath's lk_xsks lost the sockets a
// previous agent's VMs had in it.
func (a *Agent) xsksEmptied() bool {
	e, ok := a.dp.(emptiedMaps)
	return ok && slices.Contains(e.EmptiedMaps(), "lk_xsks")
}
