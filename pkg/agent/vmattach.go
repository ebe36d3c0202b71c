package agent

// VM attachments made through the CNI: KubeVirt's virt-launcher pod gets a
// secondary network (a NetworkAttachmentDefinition whose lanekit config has
// "vhostUser"); its ADD creates a VM endpoint whose device carries the CNI
// ifname in the pod's netns, starts the VM's lanekit-vhost and answers with
// the vhost-user socket QEMU connects to, as the compute container sees it.
// The CNI plugin reports that socket as device-info; Multus puts it in the
// pod's network-status, KubeVirt in the binding sidecar's network-info.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/lanekit/lanekit/internal/beneath"
	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

const (
	// DefaultVMSocketMountDir is where KubeVirt's compute container mounts
	// the launcher pod's "sockets" emptyDir.
	DefaultVMSocketMountDir = "/var/run/kubevirt/sockets"
	// DefaultVMSocketVolume is that emptyDir's name.
	DefaultVMSocketVolume = "sockets"
	// DefaultKubeletRootDir is kubelet's --root-dir.
	DefaultKubeletRootDir = "/var/lib/kubelet"
	// DefaultVMHostSocketRoot is KubeVirt's run directory on the node, one
	// of the default roots a hostSocketDir may be beneath.
	DefaultVMHostSocketRoot = "/var/run/kubevirt"
	// DefaultVhostUID is the backend's user by default: KubeVirt's qemu
	// user (107), so that QEMU may connect to the socket the backend creates.
	DefaultVhostUID = 107
	// VhostUserModeClient: QEMU is the vhost-user client (the backend listens).
	VhostUserModeClient = "client"
	// LabelPodUID is the CNI_ARGS key of the pod's UID.
	LabelPodUID = "K8S_POD_UID"
	// LabelVMI marks a VM endpoint with the "namespace/name" of its VMI.
	LabelVMI = "lanekit.io/vmi"
)

// VMAttachRequest is a CNI ADD of a VM attachment.
type VMAttachRequest struct {
	ContainerID, IfName, Netns, Network string
	// Labels are the CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID).
	Labels map[string]string
	Queues int    // 0: the VMI's, else 1
	MAC    string // empty: the VMI's interface's, else random
	MTU    int
	// SocketDir is the socket's directory as QEMU sees it; PodVolume the
	// pod's emptyDir mounted there, or HostSocketDir a host directory.
	SocketDir, PodVolume, HostSocketDir string
}

// VMAttachment is a VM attachment and where QEMU reaches its backend.
type VMAttachment struct {
	VM   VMInfo
	Mode string // VhostUserModeClient
	Path string // the socket as QEMU sees it
}

// VMIInfo is what a Kubernetes source knows about the VMI that a launcher
// pod runs.
type VMIInfo struct {
	Namespace, Name string
	Queues          int    // from vCPUs with networkInterfaceMultiqueue, else 1
	MAC             string // of the VMI's interface bound to lanekit, when there is one
	Labels          map[string]string
	// Incoming: the launcher pod is the target of the VMI's live migration
	// in progress; the attachment becomes an incoming VM endpoint with the
	// address the VM has on the source (Address, from the VMI's status),
	// claimed with Generation (the migration's start).
	Incoming   bool
	Address    netip.Addr
	Generation uint64
}

// VMIResolver finds the VMI of a launcher pod: ok false for a pod that is
// not a launcher pod; an error when it cannot tell now (the ADD fails and is
// retried rather than guess the queue count).
type VMIResolver func(podNamespace, podName, podUID string) (info VMIInfo, ok bool, err error)

// SetVMIResolver sets how VM attachments learn their VMI (pkg/k8s).
func (a *Agent) SetVMIResolver(r VMIResolver) {
	a.resolverMu.Lock()
	defer a.resolverMu.Unlock()
	a.resolver = r
}

func (a *Agent) resolveVMI(labels map[string]string) (VMIInfo, bool, error) {
	a.resolverMu.Lock()
	r := a.resolver
	a.resolverMu.Unlock()
	if r == nil || labels[argPodName] == "" {
		return VMIInfo{}, false, nil
	}
	return r(labels[argPodNamespace], labels[argPodName], labels[LabelPodUID])
}

const (
	argPodNamespace = "K8S_POD_NAMESPACE"
	argPodName      = "K8S_POD_NAME"
)

// k8sName: a Kubernetes UID or volume name (no path separators or dots).
var k8sName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// vmBackendFor fills where the backend of VM name listens for req.
func (a *Agent) vmBackendFor(name string, req *VMAttachRequest) (*endpoint.VMBackend, error) {
	mount := req.SocketDir
	if mount == "" {
		mount = DefaultVMSocketMountDir
	}
	if !filepath.IsAbs(mount) || filepath.Clean(mount) != mount {
		return nil, fmt.Errorf("socketDir %q is not a clean absolute path: %w", mount, ErrInvalid)
	}
	hostDir := req.HostSocketDir
	switch {
	case hostDir != "":
		if !filepath.IsAbs(hostDir) || filepath.Clean(hostDir) != hostDir {
			return nil, fmt.Errorf("hostSocketDir %q is not a clean absolute path: %w", hostDir, ErrInvalid)
		}
		if err := a.confineHostSocketDir(hostDir); err != nil {
			return nil, err
		}
	default:
		vol := req.PodVolume
		if vol == "" {
			vol = DefaultVMSocketVolume
		}
		uid := req.Labels[LabelPodUID]
		if !k8sName.MatchString(vol) {
			return nil, fmt.Errorf("podVolume %q is not a volume name: %w", vol, ErrInvalid)
		}
		if uid == "" {
			return nil, fmt.Errorf("no %s in CNI_ARGS: the runtime must pass the pod's UID (containerd and CRI-O do) to find its %q volume: %w",
				LabelPodUID, vol, ErrInvalid)
		}
		if !k8sName.MatchString(uid) {
			return nil, fmt.Errorf("%s %q is not a UID: %w", LabelPodUID, uid, ErrInvalid)
		}
		root := a.cfg.KubeletRootDir
		if root == "" {
			root = DefaultKubeletRootDir
		}
		hostDir = filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~empty-dir", vol)
	}
	if fi, err := os.Stat(hostDir); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, fmt.Errorf("socket directory %s (the pod's volume mounted at %s): %v: %w", hostDir, mount, err, ErrBadNetns)
	}
	h := sha256.Sum256([]byte(name))
	b := &endpoint.VMBackend{
		HostDir: hostDir, BindDir: filepath.Join(a.cfg.VMSocketDir, "b-"+hex.EncodeToString(h[:5])),
		File: "lanekit-" + req.IfName + ".sock", UID: DefaultVhostUID, GID: DefaultVhostUID,
	}
	b.ReportedPath = filepath.Join(mount, b.File)
	// In a directory of the VM's backend user alone (it creates the socket).
	b.MetricsSocket = filepath.Join(a.cfg.VMSocketDir, backendMetricsDir, "m-"+hex.EncodeToString(h[:5]), BackendMetricsFile)
	if a.cfg.VhostUID != nil {
		b.UID = *a.cfg.VhostUID
	}
	if a.cfg.VhostGID != nil {
		b.GID = *a.cfg.VhostGID
	}
	for _, p := range []string{b.Socket(), b.MetricsSocket} {
		if len(p) > maxSocketPath {
			return nil, fmt.Errorf("backend socket path %s is longer than %d bytes: %w", p, maxSocketPath, ErrInvalid)
		}
	}
	return b, nil
}

// hostSocketRoots are the directories a hostSocketDir may be beneath.
func (a *Agent) hostSocketRoots() []string {
	if len(a.cfg.VMHostSocketRoots) > 0 {
		return a.cfg.VMHostSocketRoots
	}
	root := a.cfg.KubeletRootDir
	if root == "" {
		root = DefaultKubeletRootDir
	}
	return []string{filepath.Join(root, "pods"), DefaultVMHostSocketRoot}
}

// confineHostSocketDir refuses a hostSocketDir (named by the CNI config,
// which a NetworkAttachmentDefinition's author writes) that is not beneath
// one of the agent's roots or reaches out of it through a symbolic link:
// the agent creates and removes sockets there as root and links it for the
// backend.
func (a *Agent) confineHostSocketDir(dir string) error {
	roots := a.hostSocketRoots()
	for _, root := range roots {
		rel, err := beneath.Rel(root, dir)
		if err != nil {
			continue
		}
		d, err := beneath.OpenDir(root, rel, 0)
		if err != nil {
			return fmt.Errorf("hostSocketDir %s: %v: %w", dir, err, ErrInvalid)
		}
		d.Close()
		return nil
	}
	return fmt.Errorf("hostSocketDir %s is not beneath %s (the agent's --vm-host-socket-root): %w",
		dir, strings.Join(roots, ", "), ErrInvalid)
}

// removeHostSocket removes the backend's socket file from dir as root: when
// dir is beneath one of the roots, resolved again without following a
// symbolic link (one planted below the root after the ADD is refused).
func (a *Agent) removeHostSocket(dir, file string) error {
	for _, root := range a.hostSocketRoots() {
		if rel, err := beneath.Rel(root, dir); err == nil {
			d, err := beneath.OpenDir(root, rel, 0)
			if err != nil {
				return err
			}
			defer d.Close()
			return beneath.RemoveAt(d, file)
		}
	}
	return os.Remove(filepath.Join(dir, file))
}

// vmNameFor names the VM of an attachment: after its VMI, else its pod, else
// its container ID.
func vmNameFor(req *VMAttachRequest, vmi VMIInfo, found bool) string {
	switch {
	case found:
		return endpoint.VMName(vmi.Namespace, vmi.Name)
	case req.Labels[argPodName] != "":
		return endpoint.VMName(req.Labels[argPodNamespace], req.Labels[argPodName])
	default:
		return endpoint.VMName("cni", req.ContainerID[:min(len(req.ContainerID), 12)])
	}
}

// vmByAttachment finds the VM endpoint made by a CNI attachment (mu held).
func (a *Agent) vmByAttachment(containerID, ifname string) (endpoint.Endpoint, bool, error) {
	eps, err := a.endpoints()
	if err != nil {
		return endpoint.Endpoint{}, false, err
	}
	for _, ep := range eps {
		if at := vmAttachmentOf(&ep); at != nil && at.ContainerID == containerID && at.IfName == ifname {
			return ep, true, nil
		}
	}
	return endpoint.Endpoint{}, false, nil
}

func vmAttachmentOf(ep *endpoint.Endpoint) *endpoint.CNIAttachment {
	if ep.Kind != endpoint.KindVM || ep.VM == nil {
		return nil
	}
	return ep.VM.Attachment
}

// AttachVM is the ADD of a VM attachment: the VM endpoint, its backend and
// the socket to report. A repeated ADD returns the existing attachment (and
// restarts its backend if it is not running).
func (a *Agent) AttachVM(req VMAttachRequest) (*VMAttachment, error) {
	if err := endpoint.Validate(req.ContainerID, req.IfName); err != nil {
		return nil, fmt.Errorf("attach vm %s/%s: %w: %w", req.ContainerID, req.IfName, err, ErrInvalid)
	}
	if a.cfg.VhostBin == "" {
		if _, err := a.vhostBin(); err != nil {
			return nil, fmt.Errorf("attach vm %s/%s: %w: %w", req.ContainerID, req.IfName, err, ErrNotReady)
		}
	}
	at := endpoint.Key(req.ContainerID, req.IfName)
	if out, ok, err := a.existingAttachment(req); err != nil || ok {
		return out, err
	}
	vmi, found, err := a.resolveVMI(req.Labels)
	if err != nil {
		return nil, fmt.Errorf("attach vm %s: %w: %w", at, err, ErrUnavailable)
	}
	queues, mac := req.Queues, req.MAC
	if queues == 0 {
		queues = 1
		if found && vmi.Queues > 0 {
			queues = vmi.Queues
		}
	}
	if mac == "" && found {
		mac = vmi.MAC
	}
	labels := map[string]string{}
	for k, v := range req.Labels {
		labels[k] = v
	}
	if found {
		for k, v := range vmi.Labels {
			labels[k] = v
		}
		labels[LabelVMI] = vmi.Namespace + "/" + vmi.Name
	}
	name := vmNameFor(&req, vmi, found)
	var info *VMInfo
	for attempt := 0; ; attempt++ {
		backend, err := a.vmBackendFor(name, &req)
		if err != nil {
			return nil, fmt.Errorf("attach vm %s: %w", at, err)
		}
		add := AddVMRequest{
			Name: name, Netns: req.Netns, IfName: req.IfName, Queues: queues, MAC: mac, MTU: req.MTU, Labels: labels,
			SocketUID: &backend.UID, SocketGID: &backend.GID, allocUID: a.cfg.VhostUID == nil,
			attachment: &endpoint.CNIAttachment{ContainerID: req.ContainerID, IfName: req.IfName}, backend: backend,
		}
		if found && vmi.Incoming {
			add.Incoming, add.Address, add.Generation = true, vmi.Address, vmi.Generation
		}
		info, err = a.AddVM(add)
		if err == nil {
			break
		}
		// Another attachment of the same pod or VMI has the name: this one
		// adds its ifname.
		if errors.Is(err, ErrConflict) && attempt == 0 {
			if out, ok, err := a.existingAttachment(req); err != nil || ok {
				return out, err
			}
			name = endpoint.VMName(name, req.IfName)
			continue
		}
		return nil, fmt.Errorf("attach vm %s: %w", at, err)
	}
	a.mu.Lock()
	err = a.runBackend(&info.Endpoint)
	a.mu.Unlock()
	if err != nil {
		if _, derr := a.DelVM(name); derr != nil {
			a.log.Error("undo vm attachment", "vm", name, "err", derr)
		}
		return nil, fmt.Errorf("attach vm %s: %w", at, err)
	}
	a.watchGuestIfIncoming(&info.Endpoint) // vmguest.go
	a.log.Info("vm attached", "attachment", at, "vm", name, "vmi", labels[LabelVMI], "queues", queues,
		"socket", info.Endpoint.VM.Backend.ReportedPath, "host_dir", info.Endpoint.VM.Backend.HostDir)
	return a.attachmentInfo(&info.Endpoint), nil
}

// existingAttachment returns the attachment of req if it exists (a repeated
// ADD), with its backend running.
func (a *Agent) existingAttachment(req VMAttachRequest) (*VMAttachment, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok, err := a.vmByAttachment(req.ContainerID, req.IfName)
	if err != nil || !ok {
		return nil, false, err
	}
	key := endpoint.Key(req.ContainerID, req.IfName)
	if ep.Pending {
		return nil, true, fmt.Errorf("attach vm %s: an ADD is in progress: %w", key, ErrConflict)
	}
	if ep.Netns != req.Netns {
		return nil, true, fmt.Errorf("attach vm %s: exists in netns %s, asked for %s: %w", key, ep.Netns, req.Netns, ErrConflict)
	}
	if _, running := a.backends[ep.VM.Name]; !running {
		if err := a.runBackend(&ep); err != nil {
			return nil, true, fmt.Errorf("attach vm %s: %w", key, err)
		}
	}
	return a.attachmentInfo(&ep), true, nil
}

// backendMetricsDir (under the VM socket directory, root's, 0711) holds one
// directory per VM backend, owned by that VM's uid, mode 0700, with its
// metrics socket BackendMetricsFile inside.
const backendMetricsDir = "backend-metrics"

// BackendMetricsFile is the name of a backend's metrics socket.
const BackendMetricsFile = "metrics.sock"

// runBackend links the backend's bind directory to its socket directory and
// starts (or adopts) the backend (mu held).
func (a *Agent) runBackend(ep *endpoint.Endpoint) error {
	b := ep.VM.Backend
	if b.MetricsSocket != "" {
		if err := backendMetricsDirFor(b); err != nil {
			return fmt.Errorf("backend metrics dir: %w", err)
		}
	}
	if cur, err := os.Readlink(b.BindDir); err != nil || cur != b.HostDir {
		if err := os.Remove(b.BindDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("backend link %s: %w", b.BindDir, err)
		}
		if err := os.Symlink(b.HostDir, b.BindDir); err != nil {
			return fmt.Errorf("backend link: %w", err)
		}
	}
	return a.startBackend(ep)
}

// stopVMBackend stops ep's backend and removes its pid file, sockets and
// link (mu held).
func (a *Agent) stopVMBackend(ep *endpoint.Endpoint) {
	if ep.VM == nil || ep.VM.Backend == nil {
		return
	}
	pidPath := a.backendPIDPath(ep.VM.Name)
	if !a.stopBackend(ep.VM.Name) {
		// A backend this agent did not supervise (the VM was not re-adopted
		// after a restart): stop it by its pid file.
		if pid := nsexec.ReadPIDFile(pidPath); pid > 0 {
			if p, err := a.newBackendProc(ep); err == nil {
				if _, ours := p.matches(pid); ours {
					nsexec.Terminate(pid, backendStopWait)
				}
			}
		}
	}
	_ = os.Remove(pidPath)
	b := ep.VM.Backend
	if err := a.removeHostSocket(b.HostDir, b.File); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("remove backend socket", "vm", ep.VM.Name, "err", err)
	}
	if b.MetricsSocket != "" {
		_ = os.RemoveAll(filepath.Dir(b.MetricsSocket))
	}
	if cur, err := os.Readlink(b.BindDir); err == nil && cur == b.HostDir {
		_ = os.Remove(b.BindDir)
	}
}

func (a *Agent) attachmentInfo(ep *endpoint.Endpoint) *VMAttachment {
	return &VMAttachment{VM: a.vmInfo(*ep), Mode: VhostUserModeClient, Path: ep.VM.Backend.ReportedPath}
}

// DetachVM is the DEL of a VM attachment; unknown attachments are success.
func (a *Agent) DetachVM(containerID, ifname string) (existed bool, err error) {
	if err := endpoint.Validate(containerID, ifname); err != nil {
		return false, fmt.Errorf("detach vm %s/%s: %w: %w", containerID, ifname, err, ErrInvalid)
	}
	a.mu.Lock()
	ep, ok, err := a.vmByAttachment(containerID, ifname)
	a.mu.Unlock()
	if err != nil || !ok {
		return false, err
	}
	return a.DelVM(ep.VM.Name)
}

// CheckVMAttachment is the CHECK of a VM attachment: the VM endpoint exists
// in netns, its device is there and its backend listens.
func (a *Agent) CheckVMAttachment(containerID, ifname, netns string) (*VMAttachment, error) {
	key := endpoint.Key(containerID, ifname)
	if err := endpoint.Validate(containerID, ifname); err != nil {
		return nil, fmt.Errorf("check vm %s: %w: %w", key, err, ErrInvalid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok, err := a.vmByAttachment(containerID, ifname)
	if err != nil {
		return nil, fmt.Errorf("check vm %s: %w", key, err)
	}
	if !ok {
		return nil, fmt.Errorf("check vm %s: %w", key, ErrNotFound)
	}
	if netns != "" && netns != ep.Netns {
		return nil, fmt.Errorf("check vm %s: in netns %s, not %s: %w", key, ep.Netns, netns, ErrConflict)
	}
	if _, err := os.Stat(ep.Netns); err != nil {
		return nil, fmt.Errorf("check vm %s: netns: %w: %w", key, err, ErrBadNetns)
	}
	if _, ok := a.vms[ep.VM.Name]; !ok {
		return nil, fmt.Errorf("check vm %s: the socket server of vm %s is not running", key, ep.VM.Name)
	}
	p, ok := a.backends[ep.VM.Name]
	if !ok || p.info().PID == 0 {
		return nil, fmt.Errorf("check vm %s: the backend of vm %s is not running", key, ep.VM.Name)
	}
	sock := filepath.Join(ep.VM.Backend.HostDir, ep.VM.Backend.File)
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("check vm %s: backend socket %s: %v", key, sock, strings.TrimSpace(fmt.Sprint(err)))
	}
	return a.attachmentInfo(&ep), nil
}

// backendMetricsDirFor makes b's metrics directory: its parent root's and
// 0711, itself b's user's and 0700 (whatever was there is replaced unless it
// already is exactly that).
func backendMetricsDirFor(b *endpoint.VMBackend) error {
	dir := filepath.Dir(b.MetricsSocket)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(parent, 0o711); err != nil {
		return err
	}
	if fi, err := os.Lstat(dir); err == nil {
		st, _ := fi.Sys().(*syscall.Stat_t)
		if fi.IsDir() && fi.Mode().Perm() == 0o700 && st != nil && st.Uid == b.UID && st.Gid == b.GID {
			return nil
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	return os.Lchown(dir, int(b.UID), int(b.GID))
}
