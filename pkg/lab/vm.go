package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/guest"
)

// LabVM is a QEMU guest of the lab, served by lanekit-vhost on the fast lane.
// The backend and QEMU run inside the VM's netns (like virt-launcher).
type LabVM struct {
	Name        string `json:"name"`
	Node        int    `json:"node"`
	NS          string `json:"netns"`
	IP          string `json:"ip"`
	IP6         string `json:"ip6,omitempty"` // dual-stack lab: the guest's IPv6 address (vm6.go)
	MAC         string `json:"mac"`
	Queues      int    `json:"queues"`
	XSKSocket   string `json:"xsk_socket"`
	VhostSocket string `json:"vhost_socket"`
	// MetricsSocket is the backend's --metrics-listen socket (Prometheus text).
	MetricsSocket string `json:"metrics_socket,omitempty"`
	SerialSocket  string `json:"serial_socket"`
	// BackendNS is where lanekit-vhost runs when not in NS: the DPU's
	// namespace on a DPU node (the VM's fast lane is the DPU's, its QEMU
	// stays in NS on the host).
	BackendNS   string  `json:"backend_netns,omitempty"`
	BackendPID  int     `json:"backend_pid"`
	QEMUPID     int     `json:"qemu_pid"`
	MTU         int     `json:"mtu,omitempty"` // the guest NIC's (0: the driver's default)
	BootSeconds float64 `json:"boot_seconds"`
}

// RxGSOEnv, when set (kernel or xdp), is passed as --rx-gso to every agent
// and fast-lane VM backend the lab starts: how frames reach the guests
// (docs/vm-fast-lane.md, wire -> guest). Unset: the binaries' default.
const RxGSOEnv = "LANEKIT_LAB_RX_GSO"

func labRxGSOArgs() []string {
	if v := os.Getenv(RxGSOEnv); v != "" {
		return []string{"--rx-gso", v}
	}
	return nil
}

// GuestCacheDir holds the guest kernel and initramfs (built once, reused).
const GuestCacheDir = "/var/cache/lanekit/guest"

// vmBootTimeout bounds a TCG boot on a loaded 2-core machine.
const vmBootTimeout = 3 * time.Minute

// backendUser is the unprivileged user lanekit-vhost runs as in the lab
// ("nobody"): it gets ready AF_XDP sockets from the agent and needs no
// capabilities.
const backendUser = 65534

// VMNS is the netns of VM j on node i ("v" fits the lab's lk-n<i>-<k><j> names).
func VMNS(i, j int) string { return fmt.Sprintf("lk-n%d-v%d", i, j) }

func vmFile(i int, name, suffix string) string {
	return filepath.Join(NodeDir(i), name+"-"+suffix)
}

// vmConsoleLog is the file QEMU appends lv's console output to (the guest's
// last words when it ends with nobody on its console: a migrated guest's).
func vmConsoleLog(lv LabVM) string { return vmFile(lv.Node, lv.Name, "console.log") }

// vmBackendDir holds the backend's vhost-user socket, owned by backendUser.
func vmBackendDir(i int, name string) string { return filepath.Join(NodeDir(i), name+"-backend") }

// vmNode is the node of the fast-lane VM vm1: --vm-node, else the last.
func (cfg Config) vmNode() int {
	if cfg.VMNode > 0 {
		return cfg.VMNode
	}
	return cfg.Nodes
}

func (cfg Config) checkVMNode() error {
	if cfg.NoStdVM && !cfg.VM {
		return errors.New("--no-std-vm needs --vm")
	}
	switch {
	case cfg.VMNode == 0:
		return nil
	case !cfg.VM:
		return errors.New("--vm-node needs --vm")
	case cfg.VMNode < 0 || cfg.VMNode > cfg.Nodes:
		return fmt.Errorf("--vm-node %d: want 1..%d", cfg.VMNode, cfg.Nodes)
	case cfg.VMNode == 1 && cfg.VMs > 1:
		return errors.New("--vm-node 1 with --vms 2: the second VM is node 1's already")
	case cfg.K8s:
		return errors.New("--vm-node: not with --k8s (the KubeVirt VM runs on the last node)")
	}
	return nil
}

// upVM adds VM "vm1" on node i: agent VM endpoint, backend, QEMU, ready line.
func upVM(ctx context.Context, cfg Config, st *State, i int) error {
	return upVMNamed(ctx, cfg, st, i, "vm1")
}

// upVMNamed is upVM for VM name (the first VM of node i).
func upVMNamed(ctx context.Context, cfg Config, st *State, i int, name string) error {
	ns := VMNS(i, 1)
	queues := cfg.VMQueues
	if queues < 1 {
		queues = 1
	}
	vhostBin := filepath.Join(cfg.Bins.Dir, "lanekit-vhost")
	if !executable(vhostBin) {
		return fmt.Errorf("vm: %s missing (make build)", vhostBin)
	}
	progress(cfg.Out, "lab: vm %s: building or reusing the guest image in %s", name, GuestCacheDir)
	kernel, initrd, err := guest.EnsureImage(GuestCacheDir)
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	if err := addNetns(ctx, ns); err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	if _, err := inNS(ctx, ns, "ip", "link", "set", "lo", "up"); err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	vm, err := addVMEndpoint(ctx, AgentSocket(i), name, netnsPath(ns), queues, backendUser)
	if err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	lv := LabVM{Name: name, Node: i, NS: ns, IP: vm.GetAddress(), MAC: vm.GetMac(), Queues: queues,
		XSKSocket: vm.GetSocket(), VhostSocket: filepath.Join(vmBackendDir(i, name), "vhost.sock"),
		MetricsSocket: filepath.Join(vmBackendDir(i, name), "metrics.sock"), SerialSocket: vmFile(i, name, "serial.sock")}
	// The guest's MTU is its endpoint's (tunnel mode: the uplink's minus
	// the VXLAN overhead): offered in virtio config space and set by /init.
	lv.MTU = int(vm.GetMtu())
	if ip, _, err := net.ParseCIDR(lv.IP); err == nil {
		lv.IP = ip.String()
	}
	lv.IP6 = vmIPv6(vm) // vm6.go
	if IsDPUNode(i) {
		lv.BackendNS = DPUNS(i)
	}
	progress(cfg.Out, "lab: vm %s: endpoint %s mac %s, %d queue pair(s), sockets at %s", name, lv.IP, lv.MAC, queues, lv.XSKSocket)
	if err := publishVMPod(ctx, st, lv); err != nil { // vm6.go
		return fmt.Errorf("vm %s: %w", name, err)
	}

	if lv.BackendPID, err = startVMBackend(lv, vhostBin); err != nil {
		return fmt.Errorf("vm %s: %w", name, err)
	}
	return bootLabVM(ctx, cfg, st, lv, guest.Config{Kernel: kernel, Initrd: initrd, MTU: lv.MTU}, vmFile(i, name, "vhost.log"))
}

// startVMBackend starts lanekit-vhost for lv inside lv.NS as backendUser
// and waits for its vhost-user socket.
func startVMBackend(lv LabVM, vhostBin string) (int, error) {
	dir := vmBackendDir(lv.Node, lv.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	if err := os.Chown(dir, backendUser, backendUser); err != nil {
		return 0, err
	}
	// setpriv drops to backendUser with no capabilities and no_new_privs.
	args := []string{"--reuid", strconv.Itoa(backendUser), "--regid", strconv.Itoa(backendUser), "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", vhostBin,
		"--socket", lv.VhostSocket, "--queues", strconv.Itoa(lv.Queues), "--mac", lv.MAC,
		"--xsk-socket", lv.XSKSocket, "--vm", lv.Name, "--metrics-listen", lv.MetricsSocket}
	if lv.MTU > 0 {
		args = append(args, "--mtu", strconv.Itoa(lv.MTU))
	}
	args = append(args, labRxGSOArgs()...)
	ns := lv.NS
	if lv.BackendNS != "" {
		ns = lv.BackendNS
	}
	pid, err := startDaemon(ns, vmFile(lv.Node, lv.Name, "vhost"), "setpriv", args...)
	if err != nil {
		return pid, fmt.Errorf("backend: %w", err)
	}
	if err := nsexec.WaitSocket(lv.VhostSocket, 10*time.Second, pid); err != nil {
		return pid, fmt.Errorf("backend: %w; log: %s", err, logTail(vmFile(lv.Node, lv.Name, "vhost.log")))
	}
	return pid, nil
}

// vmQMPSocket is the QMP socket of lv's QEMU (`lab vm migrate` drives it).
func vmQMPSocket(node int, name string) string { return vmFile(node, name, "qmp.sock") }

// bootLabVM records lv and boots its QEMU guest (TCG) on lv.VhostSocket,
// inside lv.NS, until the guest's ready line. gc gives the image and
// options; the network and console come from lv.
func bootLabVM(ctx context.Context, cfg Config, st *State, lv LabVM, gc guest.Config, backendLog string) error {
	st.VMs = append(st.VMs, lv)
	if err := st.save(); err != nil {
		return err
	}
	gc.IP, gc.Gateway, gc.MAC, gc.Queues, gc.VhostSocket, gc.SerialSocket = lv.IP+"/32", "169.254.1.1", lv.MAC, lv.Queues, lv.VhostSocket, lv.SerialSocket
	gc.SerialLog = vmConsoleLog(lv)
	guestIPv6(&gc, lv) // vm6.go
	args, err := guest.QEMUArgs(gc)
	if err != nil {
		return fmt.Errorf("vm %s: %w", lv.Name, err)
	}
	args = append(args, "-qmp", "unix:"+vmQMPSocket(lv.Node, lv.Name)+",server=on,wait=off")
	start := time.Now()
	st.VMs[len(st.VMs)-1].QEMUPID, err = startDaemon(lv.NS, vmFile(lv.Node, lv.Name, "qemu"), args[0], args[1:]...)
	if err != nil {
		return fmt.Errorf("vm %s: qemu: %w", lv.Name, err)
	}
	if err := st.save(); err != nil {
		return err
	}
	progress(cfg.Out, "lab: vm %s: booting (QEMU under TCG, vhost-user to lanekit-vhost)", lv.Name)
	status, err := waitGuestReady(ctx, lv.SerialSocket, vmFile(lv.Node, lv.Name, "qemu.log"), backendLog)
	if err != nil {
		return fmt.Errorf("vm %s: %w", lv.Name, err)
	}
	st.VMs[len(st.VMs)-1].BootSeconds = time.Since(start).Seconds()
	progress(cfg.Out, "lab: vm %s ready in %.1fs: %s", lv.Name, time.Since(start).Seconds(), status)
	return st.save()
}

// addVMEndpoint asks node's agent for a VM endpoint.
func addVMEndpoint(ctx context.Context, agentSock, name, netns string, queues int, owner uint32) (*apiv1.VM, error) {
	c, closeFn, err := agentClient(agentSock)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.AddVM(cctx, &apiv1.AddVMRequest{Name: name, Netns: netns, Queues: uint32(queues),
		SocketUid: &owner, SocketGid: &owner, Labels: labVMLabels(name)})
	if err != nil {
		return nil, fmt.Errorf("add vm endpoint: %w", err)
	}
	return resp.GetVm(), nil
}

// startDaemon starts argv detached inside ns (nsenter --net keeps the host's
// /sys), logging to base.log with its pid in base.pid.
func startDaemon(ns, base, bin string, args ...string) (int, error) {
	return startDaemonIn(ns, "", base, bin, args...)
}

// startDaemonIn is startDaemon in the cgroup2 directory cgroup.
func startDaemonIn(ns, cgroup, base, bin string, args ...string) (int, error) {
	cmd, err := nsexec.StartDaemonIn(netnsPath(ns), cgroup, base+".log", bin, args...)
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(base+".pid", []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return pid, err
	}
	return pid, nil
}

// waitGuestReady takes the first client place on a booting guest's serial
// socket and waits (bounded by vmBootTimeout) for its ready line. Errors
// carry the tails of the given logs.
func waitGuestReady(ctx context.Context, serial string, logs ...string) (string, error) {
	bctx, cancel := context.WithTimeout(ctx, vmBootTimeout)
	defer cancel()
	withLogs := func(err error) error {
		for _, l := range logs {
			err = fmt.Errorf("%w; %s: %s", err, filepath.Base(l), logTail(l))
		}
		return err
	}
	con, err := guest.DialBootingConsole(bctx, serial)
	if err != nil {
		return "", withLogs(err)
	}
	defer con.Close()
	status, err := con.WaitReady(bctx)
	if err != nil {
		return "", withLogs(err)
	}
	return status, nil
}
