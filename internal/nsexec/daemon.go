package nsexec

import (
	"os"
	"os/exec"
	"syscall"
)

// StartDaemon starts bin with args detached, so that it outlives the caller:
// in a session of its own, inside the network namespace at the path netns
// (by `nsenter --net`, which keeps the caller's mounts and /sys; empty: the
// caller's namespace), with stdout and stderr appended to logPath, and
// without the descriptors the caller inherited (CloseInheritedOnExec). A
// goroutine reaps it should it end while the caller still runs.
func StartDaemon(netns, logPath, bin string, args ...string) (*exec.Cmd, error) {
	return StartDaemonIn(netns, "", logPath, bin, args...)
}

// StartDaemonIn is StartDaemon in the cgroup2 directory cgroup (from its
// first instruction: clone3 into the cgroup); empty: the caller's.
func StartDaemonIn(netns, cgroup, logPath, bin string, args ...string) (*exec.Cmd, error) {
	CloseInheritedOnExec()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if netns != "" {
		args = append([]string{"--net=" + netns, "--", bin}, args...)
		bin = "nsenter"
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cgroup != "" {
		cg, err := os.Open(cgroup)
		if err != nil {
			return nil, err
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go cmd.Wait() //nolint:errcheck // reaps the child; its status is in the log
	return cmd, nil
}
