package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

type attachEnv struct {
	fx       *fixture
	bin      string
	kubelet  string
	vmDir    string
	hostRoot string // the agent's only VMHostSocketRoots entry
	root     uint32
	dp       *fakeDatapath // the datapath start gives the agent (nil: a new fake each time)
}

func newAttachEnv(t *testing.T) *attachEnv {
	fx := newFixture(t)
	dir := t.TempDir()
	return &attachEnv{fx: fx, bin: testutil.FakeVhost(t), kubelet: filepath.Join(dir, "kubelet"), vmDir: filepath.Join(dir, "vm"),
		hostRoot: filepath.Join(dir, "host-sockets")}
}

func (e *attachEnv) start(t *testing.T) *Agent {
	t.Helper()
	a, err := New(Config{
		StateDir: e.fx.stateDir, Socket: filepath.Join(e.fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: e.fx.nodeNS.Path(),
		VMSocketDir: e.vmDir, VhostBin: e.bin, VhostUID: &e.root, VhostGID: &e.root, KubeletRootDir: e.kubelet,
		VMHostSocketRoots: []string{e.hostRoot},
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) {
			if e.dp != nil {
				return e.dp, nil
			}
			return newFake(), nil
		},
	}, quietLog())
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	return a
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func backendOf(t *testing.T, a *Agent, name string) BackendInfo {
	t.Helper()
	vms, err := a.ListVMs()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if v.Endpoint.VM.Name == name {
			if v.Backend == nil {
				return BackendInfo{}
			}
			return *v.Backend
		}
	}
	t.Fatalf("no vm %s", name)
	return BackendInfo{}
}

// TestVMAttachmentLifecycle: a CNI VM attachment creates the VM endpoint on
// the attachment's ifname, runs its backend on the socket QEMU will see,
// keeps the backend running (restart on exit, adoption by a restarted
// agent) and removes everything on DEL or GC.
func TestVMAttachmentLifecycle(t *testing.T) {
	e := newAttachEnv(t)
	a := e.start(t)
	defer func() { a.Close() }()
	vmNS := netnstest.New(t, "launcher")
	sockets := filepath.Join(e.hostRoot, "sockets")
	if err := os.MkdirAll(sockets, 0o777); err != nil {
		t.Fatal(err)
	}
	req := VMAttachRequest{
		ContainerID: "c0ffee", IfName: "pod1a2b", Netns: vmNS.Path(), Network: "lanekit-vm",
		Labels: map[string]string{argPodNamespace: "default", argPodName: "virt-launcher-vm1-x"},
		Queues: 2, MAC: "02:00:00:aa:00:07", SocketDir: "/var/run/kubevirt/sockets", HostSocketDir: sockets,
	}
	va, err := a.AttachVM(req)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	ep := va.VM.Endpoint
	if va.Mode != "client" || va.Path != "/var/run/kubevirt/sockets/lanekit-pod1a2b.sock" || ep.VM.Name != "default.virt-launcher-vm1-x" ||
		ep.VM.Queues != 2 || ep.MAC != "02:00:00:aa:00:07" || ep.IfName != "pod1a2b" || !va.VM.Serving {
		t.Fatalf("attachment %+v endpoint %+v vm %+v", va, ep, ep.VM)
	}
	if l := linkIn(t, vmNS, "pod1a2b"); l == nil || l.Attrs().NumRxQueues != 2 {
		t.Fatalf("device pod1a2b in the launcher netns: %+v", l)
	}
	hostSock := filepath.Join(sockets, "lanekit-pod1a2b.sock")
	if fi, err := os.Stat(hostSock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("backend socket %s: %v", hostSock, err)
	}
	b := backendOf(t, a, ep.VM.Name)
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", b.PID))
	args := strings.ReplaceAll(string(cmdline), "\x00", " ")
	for _, want := range []string{"--xsk-socket " + ep.VM.Socket, "--vm default.virt-launcher-vm1-x", "--queues 2", "--mac 02:00:00:aa:00:07", "--mtu 1400",
		"--metrics-listen " + filepath.Join(e.vmDir, backendMetricsDir) + "/m-"} {
		if !strings.Contains(args, want) {
			t.Errorf("backend command line %q lacks %q", args, want)
		}
	}

	// A repeated ADD returns the same attachment and backend.
	again, err := a.AttachVM(req)
	if err != nil || again.VM.Endpoint.ID != ep.ID || backendOf(t, a, ep.VM.Name).PID != b.PID {
		t.Fatalf("repeated ADD: %+v %v", again, err)
	}
	other := req
	other.Netns = "/proc/1/ns/net"
	if _, err := a.AttachVM(other); !errors.Is(err, ErrConflict) {
		t.Fatalf("ADD of the same attachment in another netns: %v, want a conflict", err)
	}
	if _, err := a.CheckVMAttachment(req.ContainerID, req.IfName, req.Netns); err != nil {
		t.Fatalf("check: %v", err)
	}

	// The backend dies: the agent starts it again, and CHECK says so meanwhile.
	if err := syscall.Kill(b.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "backend restarted", func() bool {
		n := backendOf(t, a, ep.VM.Name)
		return n.PID != 0 && n.PID != b.PID && n.Restarts == 1 && nsexec.Alive(n.PID)
	})
	b = backendOf(t, a, ep.VM.Name)

	// Agent restart: the running backend is adopted, not restarted, and
	// still supervised.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !nsexec.Alive(b.PID) {
		t.Fatal("the backend stopped with the agent: VMs would lose their network on agent restarts")
	}
	a = e.start(t)
	if n := backendOf(t, a, ep.VM.Name); n.PID != b.PID {
		t.Fatalf("after restart backend %+v, want the running pid %d adopted", n, b.PID)
	}
	if _, err := a.CheckVMAttachment(req.ContainerID, req.IfName, req.Netns); err != nil {
		t.Fatalf("check after restart: %v", err)
	}
	_ = syscall.Kill(b.PID, syscall.SIGKILL)
	waitUntil(t, "adopted backend restarted", func() bool {
		n := backendOf(t, a, ep.VM.Name)
		return n.PID != 0 && n.PID != b.PID && nsexec.Alive(n.PID)
	})
	b = backendOf(t, a, ep.VM.Name)

	// GC without the attachment removes the VM, its backend and socket.
	removed, err := a.GC([]Attachment{{"someone-else", "eth0"}})
	if err != nil || len(removed) != 1 || removed[0] != (Attachment{req.ContainerID, req.IfName}) {
		t.Fatalf("gc: %v %v", removed, err)
	}
	waitUntil(t, "backend stopped", func() bool { return !nsexec.Alive(b.PID) })
	if _, err := os.Stat(hostSock); !os.IsNotExist(err) {
		t.Errorf("backend socket left behind: %v", err)
	}
	if vms, _ := a.ListVMs(); len(vms) != 0 {
		t.Errorf("vms after gc: %+v", vms)
	}
	if l := linkIn(t, vmNS, "pod1a2b"); l != nil {
		t.Error("device left in the launcher netns")
	}
	if existed, err := a.DetachVM(req.ContainerID, req.IfName); existed || err != nil {
		t.Errorf("DEL of a gone attachment: %v %v", existed, err)
	}
	if _, err := a.CheckVMAttachment(req.ContainerID, req.IfName, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("check of a gone attachment: %v", err)
	}
}

// TestVMAttachmentPodVolumeAndVMI: the socket goes into the launcher pod's
// emptyDir under kubelet's pod directory; the VMI gives name, queues, MAC
// and labels; bad or missing inputs fail the ADD and leave nothing.
func TestVMAttachmentPodVolumeAndVMI(t *testing.T) {
	e := newAttachEnv(t)
	a := e.start(t)
	defer func() { a.Close() }()
	vmNS := netnstest.New(t, "launcher2")
	uid := "4f1c2d3e-0000-4000-8000-00000000abcd"
	req := VMAttachRequest{
		ContainerID: "c1", IfName: "net1", Netns: vmNS.Path(),
		Labels: map[string]string{argPodNamespace: "ns1", argPodName: "virt-launcher-db-abc", LabelPodUID: uid},
	}
	noLeftovers := func(what string) {
		t.Helper()
		if vms, _ := a.ListVMs(); len(vms) != 0 {
			t.Errorf("%s: vms left: %+v", what, vms)
		}
		if l := linkIn(t, vmNS, "net1"); l != nil {
			t.Errorf("%s: device left", what)
		}
	}
	if _, err := a.AttachVM(req); !errors.Is(err, ErrBadNetns) || !strings.Contains(err.Error(), "kubernetes.io~empty-dir/sockets") {
		t.Fatalf("ADD before kubelet made the volume: %v", err)
	}
	noLeftovers("no volume")
	noUID := req
	noUID.Labels = map[string]string{argPodNamespace: "ns1", argPodName: "p"}
	if _, err := a.AttachVM(noUID); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "K8S_POD_UID") {
		t.Fatalf("ADD without K8S_POD_UID: %v", err)
	}
	a.SetVMIResolver(func(ns, name, podUID string) (VMIInfo, bool, error) {
		return VMIInfo{}, false, errors.New("api server down")
	})
	vol := filepath.Join(e.kubelet, "pods", uid, "volumes", "kubernetes.io~empty-dir", "sockets")
	if err := os.MkdirAll(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AttachVM(req); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ADD while the VMI cannot be read: %v, want unavailable (retry, no guessed queue count)", err)
	}
	noLeftovers("resolver error")
	var asked []string
	a.SetVMIResolver(func(ns, name, podUID string) (VMIInfo, bool, error) {
		asked = append(asked, ns+"/"+name+"/"+podUID)
		return VMIInfo{Namespace: "ns1", Name: "db", Queues: 3, MAC: "02:00:00:bb:00:01", Labels: map[string]string{"app": "db"}}, true, nil
	})
	va, err := a.AttachVM(req)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	ep := va.VM.Endpoint
	if len(asked) != 1 || asked[0] != "ns1/virt-launcher-db-abc/"+uid {
		t.Errorf("resolver asked %v", asked)
	}
	if ep.VM.Name != "ns1.db" || ep.VM.Queues != 3 || ep.MAC != "02:00:00:bb:00:01" || ep.Labels["app"] != "db" || ep.Labels[LabelVMI] != "ns1/db" {
		t.Errorf("endpoint %+v vm %+v: want the VMI's name, queues, MAC and labels", ep, ep.VM)
	}
	if va.Path != DefaultVMSocketMountDir+"/lanekit-net1.sock" {
		t.Errorf("reported path %s", va.Path)
	}
	if fi, err := os.Stat(filepath.Join(vol, "lanekit-net1.sock")); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket not in the pod volume: %v", err)
	}
	if l := len(ep.VM.Backend.Socket()); l > maxSocketPath {
		t.Errorf("bind path %d bytes", l)
	}
	// A second lanekit network of the same VMI gets its own VM.
	second := req
	second.IfName = "net2"
	vb, err := a.AttachVM(second)
	if err != nil || vb.VM.Endpoint.VM.Name != "ns1.db.net2" {
		t.Fatalf("second attachment: %+v %v", vb, err)
	}
	for _, at := range []VMAttachRequest{req, second} {
		if existed, err := a.DetachVM(at.ContainerID, at.IfName); !existed || err != nil {
			t.Errorf("DEL %s: %v %v", at.IfName, existed, err)
		}
	}
	noLeftovers("after DEL")
}

// TestVMAttachmentHostSocketDirConfined: a hostSocketDir (written by a
// NetworkAttachmentDefinition's author) outside the agent's roots, the root
// itself, or reaching out through a symbolic link fails the ADD as invalid,
// before any endpoint, backend or socket exists.
func TestVMAttachmentHostSocketDirConfined(t *testing.T) {
	e := newAttachEnv(t)
	a := e.start(t)
	defer func() { a.Close() }()
	vmNS := netnstest.New(t, "launcher3")
	outside := t.TempDir()
	if err := os.MkdirAll(filepath.Join(e.hostRoot, "ok", "sub"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(e.hostRoot, "link"))
	os.Symlink("../..", filepath.Join(e.hostRoot, "ok", "up"))
	os.Symlink(outside, filepath.Join(e.hostRoot, "ok", "sub", "deep"))
	for i, dir := range []string{outside, filepath.Dir(e.hostRoot), e.hostRoot, filepath.Join(e.hostRoot, "link"),
		filepath.Join(e.hostRoot, "ok", "up"), filepath.Join(e.hostRoot, "ok", "sub", "deep")} {
		req := VMAttachRequest{ContainerID: fmt.Sprintf("c%d", i), IfName: "net1", Netns: vmNS.Path(), HostSocketDir: dir,
			Labels: map[string]string{argPodNamespace: "ns1", argPodName: fmt.Sprintf("virt-launcher-%d", i)}}
		_, err := a.AttachVM(req)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "hostSocketDir") {
			t.Errorf("hostSocketDir %s: %v, want refused as invalid", dir, err)
		}
		if vms, _ := a.ListVMs(); len(vms) != 0 {
			t.Errorf("hostSocketDir %s: vms %+v", dir, vms)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("the agent wrote outside its roots: %v", ents)
	}
	if l := linkIn(t, vmNS, "net1"); l != nil {
		t.Error("device left in the launcher netns")
	}
	// A directory swapped for a link after the ADD: DEL does not remove the
	// socket's namesake through it.
	good := filepath.Join(e.hostRoot, "good")
	os.Mkdir(good, 0o777)
	req := VMAttachRequest{ContainerID: "c9", IfName: "net1", Netns: vmNS.Path(), HostSocketDir: good,
		Labels: map[string]string{argPodNamespace: "ns1", argPodName: "virt-launcher-9"}}
	if _, err := a.AttachVM(req); err != nil {
		t.Fatalf("attach with hostSocketDir %s: %v", good, err)
	}
	elsewhere := t.TempDir()
	namesake := filepath.Join(elsewhere, "lanekit-net1.sock")
	os.WriteFile(namesake, []byte("keep"), 0o600)
	if err := os.Rename(good, good+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, good); err != nil {
		t.Fatal(err)
	}
	if existed, err := a.DetachVM(req.ContainerID, req.IfName); !existed || err != nil {
		t.Fatalf("DEL: %v %v", existed, err)
	}
	if _, err := os.Stat(namesake); err != nil {
		t.Errorf("DEL removed a file through a link planted after the ADD: %v", err)
	}
	// Defaults: kubelet's pod directories and KubeVirt's run directory.
	d := &Agent{cfg: Config{KubeletRootDir: "/k"}}
	if got := d.hostSocketRoots(); len(got) != 2 || got[0] != "/k/pods" || got[1] != DefaultVMHostSocketRoot {
		t.Errorf("default roots %v", got)
	}
}
