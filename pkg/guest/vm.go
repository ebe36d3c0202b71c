package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Bounds on the QEMU process and the serial link.
const (
	serialDialTimeout = 15 * time.Second
	serialWriteTime   = 5 * time.Second
	stopTimeout       = 10 * time.Second
	consoleKeep       = 256 << 10 // bytes of console kept for Console()
)

// ErrExited is returned when QEMU is gone.
var ErrExited = errors.New("guest qemu exited")

// VM is a running guest. All methods are safe for concurrent use; commands run
// one at a time.
type VM struct {
	cfg     Config
	dir     string
	cmd     *exec.Cmd
	conn    net.Conn
	started time.Time

	exited  chan struct{} // closed when QEMU has been reaped
	exitErr error

	readyCh chan struct{} // closed on LK-READY or LK-FAIL
	mu      sync.Mutex
	readyAt time.Time
	status  string
	failed  bool
	pending map[string]chan Result
	console []byte
	qlog    limitedBuffer // QEMU's own stdout+stderr

	runMu    sync.Mutex
	nextID   int
	stopOnce sync.Once
	stopErr  error
}

// Start launches QEMU for cfg (Kernel and Initrd required; SerialSocket is
// chosen here) and connects to its serial console. ctx bounds the VM's whole
// lifetime: when it is done, the VM is stopped. QEMU runs in its own process
// group with a parent-death signal, so it does not outlive the caller; still,
// call Stop (e.g. in t.Cleanup) to reap it and remove its temporary files.
func Start(ctx context.Context, cfg Config) (*VM, error) {
	cfg = cfg.withDefaults()
	if _, err := exec.LookPath(cfg.QEMU); err != nil {
		return nil, fmt.Errorf("start guest: %w", err)
	}
	for _, f := range []string{cfg.Kernel, cfg.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("start guest: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "lkg-")
	if err != nil {
		return nil, fmt.Errorf("start guest: temp dir: %w", err)
	}
	cfg.SerialSocket = filepath.Join(dir, "serial.sock")
	args, err := QEMUArgs(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start guest: %w", err)
	}
	vm := &VM{
		cfg: cfg, dir: dir,
		exited: make(chan struct{}), readyCh: make(chan struct{}),
		pending: map[string]chan Result{},
	}
	vm.qlog.max = 64 << 10
	vm.cmd = exec.Command(args[0], args[1:]...)
	vm.cmd.Dir = dir
	vm.cmd.Stdin = nil
	vm.cmd.Stdout, vm.cmd.Stderr = &vm.qlog, &vm.qlog
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	vm.started = time.Now()
	if err := vm.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start guest: %s: %w", args[0], err)
	}
	go func() {
		vm.exitErr = vm.cmd.Wait()
		close(vm.exited)
	}()
	go func() {
		select {
		case <-ctx.Done():
			vm.Stop()
		case <-vm.exited:
		}
	}()
	if err := vm.dialSerial(ctx); err != nil {
		vm.Stop()
		return nil, fmt.Errorf("start guest: %w", err)
	}
	go vm.readLoop()
	return vm, nil
}

func (vm *VM) dialSerial(ctx context.Context) error {
	deadline := time.NewTimer(serialDialTimeout)
	defer deadline.Stop()
	for {
		c, err := net.Dial("unix", vm.cfg.SerialSocket)
		if err == nil {
			vm.conn = c
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("connect serial %s: %w", vm.cfg.SerialSocket, ctx.Err())
		case <-vm.exited:
			return fmt.Errorf("connect serial: %w: %v: %s", ErrExited, vm.exitErr, tail(vm.qlog.String(), 5))
		case <-deadline.C:
			return fmt.Errorf("connect serial %s: %w (after %s)", vm.cfg.SerialSocket, err, serialDialTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readLoop feeds console lines to the protocol parser until the link closes.
func (vm *VM) readLoop() {
	var p Parser
	r := bufio.NewReaderSize(vm.conn, 64<<10)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			vm.mu.Lock()
			vm.console = append(vm.console, line...)
			if len(vm.console) > consoleKeep {
				vm.console = append([]byte(nil), vm.console[len(vm.console)-consoleKeep:]...)
			}
			vm.mu.Unlock()
		}
		if err != nil {
			return
		}
		switch ev, res := p.Feed(line); ev {
		case EvReady, EvFail:
			_, status, failed := p.Ready()
			vm.mu.Lock()
			vm.readyAt, vm.status, vm.failed = time.Now(), status, failed
			vm.mu.Unlock()
			close(vm.readyCh)
		case EvResult:
			vm.mu.Lock()
			ch := vm.pending[res.ID]
			delete(vm.pending, res.ID)
			vm.mu.Unlock()
			if ch != nil {
				ch <- res
			}
		}
	}
}

// WaitReady waits for the guest's LK-READY line and returns its status text,
// e.g. "net=up if=eth0 ip=10.244.2.50/32 queues=1" or "net=none". An LK-FAIL
// line (network setup failed; the control loop still runs) is an error.
func (vm *VM) WaitReady(ctx context.Context) (string, error) {
	select {
	case <-vm.readyCh:
	case <-ctx.Done():
		return "", fmt.Errorf("wait for guest ready: %w: console: %s", ctx.Err(), tail(vm.Console(), 5))
	case <-vm.exited:
		return "", fmt.Errorf("wait for guest ready: %w: %v: %s", ErrExited, vm.exitErr, tail(vm.Console()+vm.qlog.String(), 8))
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed {
		return vm.status, fmt.Errorf("guest network setup: %s", vm.status)
	}
	return vm.status, nil
}

// BootTime is the time from QEMU's start to the ready line (0 before it).
func (vm *VM) BootTime() time.Duration {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.readyAt.IsZero() {
		return 0
	}
	return vm.readyAt.Sub(vm.started)
}

// Run runs a shell command in the guest through the serial control protocol
// and returns its combined output and exit code. It waits for the control loop
// first. The guest bounds each command by lk.cmdtimeout; ctx bounds the wait.
func (vm *VM) Run(ctx context.Context, cmd string) (string, int, error) {
	select {
	case <-vm.exited:
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ErrExited)
	default:
	}
	select {
	case <-vm.readyCh:
	case <-ctx.Done():
		return "", -1, fmt.Errorf("run %q in guest: waiting for control loop: %w", cmd, ctx.Err())
	case <-vm.exited:
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ErrExited)
	}
	vm.runMu.Lock()
	defer vm.runMu.Unlock()
	vm.nextID++
	id := strconv.Itoa(vm.nextID)
	line, err := FormatCmd(id, cmd)
	if err != nil {
		return "", -1, fmt.Errorf("run in guest: %w", err)
	}
	ch := make(chan Result, 1)
	vm.mu.Lock()
	vm.pending[id] = ch
	vm.mu.Unlock()
	defer func() {
		vm.mu.Lock()
		delete(vm.pending, id)
		vm.mu.Unlock()
	}()
	vm.conn.SetWriteDeadline(time.Now().Add(serialWriteTime))
	if _, err := vm.conn.Write([]byte(line)); err != nil {
		select {
		case <-vm.exited:
			return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ErrExited)
		default:
		}
		return "", -1, fmt.Errorf("run %q in guest: write serial: %w", cmd, err)
	}
	select {
	case r := <-ch:
		return r.Output, r.Exit, nil
	case <-ctx.Done():
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ctx.Err())
	case <-vm.exited:
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ErrExited)
	}
}

// Console returns the last console output (up to 256 KiB), raw.
func (vm *VM) Console() string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return string(vm.console)
}

// Done is closed once QEMU has exited and been reaped.
func (vm *VM) Done() <-chan struct{} { return vm.exited }

// Pid is QEMU's process id.
func (vm *VM) Pid() int { return vm.cmd.Process.Pid }

// Stop kills QEMU (its whole process group), reaps it and removes the VM's
// temporary directory. It is idempotent and bounded in time.
func (vm *VM) Stop() error {
	vm.stopOnce.Do(func() {
		select {
		case <-vm.exited:
		default:
			_ = syscall.Kill(-vm.cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-vm.exited:
			case <-time.After(stopTimeout):
				vm.stopErr = fmt.Errorf("stop guest qemu pid %d: not reaped after %s", vm.cmd.Process.Pid, stopTimeout)
			}
		}
		if vm.conn != nil {
			vm.conn.Close()
		}
		if err := os.RemoveAll(vm.dir); err != nil && vm.stopErr == nil {
			vm.stopErr = fmt.Errorf("stop guest: remove %s: %w", vm.dir, err)
		}
	})
	return vm.stopErr
}

// limitedBuffer keeps the last max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > l.max {
		l.b = append([]byte(nil), l.b[len(l.b)-l.max:]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
