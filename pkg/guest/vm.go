package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	con     *Console
	started time.Time

	exited  chan struct{} // closed when QEMU has been reaped
	exitErr error
	qlog    limitedBuffer // QEMU's own stdout+stderr

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
	vm := &VM{cfg: cfg, dir: dir, exited: make(chan struct{})}
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
	conn, err := dialSerial(ctx, cfg.SerialSocket, vm.exited, func() string {
		return fmt.Sprintf("%v: %s", vm.exitErr, tail(vm.qlog.String(), 5))
	})
	if err != nil {
		vm.Stop()
		return nil, fmt.Errorf("start guest: %w", err)
	}
	vm.con = newConsole(conn, vm.exited, false)
	return vm, nil
}

// WaitReady waits for the guest's LK-READY line and returns its status text,
// e.g. "net=up if=eth0 ip=10.244.2.50/32 queues=1" or "net=none". An LK-FAIL
// line (network setup failed; the control loop still runs) is an error.
func (vm *VM) WaitReady(ctx context.Context) (string, error) {
	status, err := vm.con.WaitReady(ctx)
	if errors.Is(err, ErrExited) {
		return "", fmt.Errorf("%w: %v: %s", err, vm.exitErr, tail(vm.Console()+vm.qlog.String(), 8))
	}
	return status, err
}

// BootTime is the time from QEMU's start to the ready line (0 before it).
func (vm *VM) BootTime() time.Duration {
	at := vm.con.ReadyAt()
	if at.IsZero() {
		return 0
	}
	return at.Sub(vm.started)
}

// Run runs a shell command in the guest through the serial control protocol
// and returns its combined output and exit code (see Console.Run).
func (vm *VM) Run(ctx context.Context, cmd string) (string, int, error) {
	return vm.con.Run(ctx, cmd)
}

// Console returns the last console output (up to 256 KiB), raw.
func (vm *VM) Console() string { return vm.con.Text() }

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
		if vm.con != nil {
			vm.con.Close()
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
