package lab

// The KubeVirt rows of `lab bench` on a `lab up --k8s --kubelet --kubevirt`
// lab: the same guest booted twice by real KubeVirt on node 2 — once on
// lanekit's network binding (vhost-user to lanekit-vhost, the fast lane),
// once on KubeVirt's default bridge binding over lanekit's pod network (the
// launcher pod's veth, virt-launcher's in-pod bridge, a tap, QEMU's own
// virtio-net: what a KubeVirt user runs today) — measured from a real pod
// on node 1, interleaved with the lab's other rows in one run.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// The KubeVirt bench rows and the binding each VMI uses.
const (
	KubeVirtBenchLanekit    = bench.KubeVirtVMPath
	KubeVirtBenchBridge     = bench.KubeVirtBridgePath
	KubeVirtBenchMasquerade = bench.KubeVirtMasqueradePath
	// BindingLanekit, BindingBridge and BindingMasquerade are VMI
	// interface bindings: lanekit's plugin (a Multus network on
	// lanekit-vm), KubeVirt's bridge or its masquerade on the pod network.
	BindingLanekit    = "lanekit"
	BindingBridge     = "bridge"
	BindingMasquerade = "masquerade"
)

// What the KubeVirt rows' traffic goes through (the bench table's labels).
var (
	IncludesKubeVirtLanekit = bench.Includes{BPF: true,
		Detail: "real pod to a KubeVirt VMI on lanekit's binding: tcx + AF_PACKET (whole GSO packets, --rx-gso kernel) + lanekit-vhost (vhost-user), QEMU from virt-launcher, TCG guest"}
	IncludesKubeVirtBridge = bench.Includes{BPF: true,
		Detail: "real pod to a KubeVirt VMI on KubeVirt's bridge binding over lanekit's pod network: tcx to the launcher pod's veth, virt-launcher's in-pod bridge, tap, QEMU's virtio-net, TCG guest"}
	IncludesKubeVirtMasquerade = bench.Includes{BPF: true, Netfilter: true, Conntrack: true,
		Detail: "real pod to a KubeVirt VMI on KubeVirt's masquerade binding over lanekit's pod network: tcx to the launcher pod's veth, nftables DNAT/SNAT with conntrack in the pod, its bridge, tap, QEMU's virtio-net, TCG guest"}
)

// kubevirtBenchVM is one VMI of the KubeVirt rows.
type kubevirtBenchVM struct {
	row, name, binding, mac string
	includes                bench.Includes
}

// kubevirtBenchVMs: the lanekit VMI has a fixed MAC (the binding takes the
// VMI's); the bridge VMI takes the launcher pod interface's MAC, as KubeVirt's
// bridge binding does by default (lanekit's programs admit the pod's MAC
// only); the masquerade guest sits behind the pod's address (NAT).
var kubevirtBenchVMs = []kubevirtBenchVM{
	{row: KubeVirtBenchLanekit, name: "kv-bench-lanekit", binding: BindingLanekit, mac: "02:00:00:aa:00:11", includes: IncludesKubeVirtLanekit},
	{row: KubeVirtBenchBridge, name: "kv-bench-bridge", binding: BindingBridge, includes: IncludesKubeVirtBridge},
	{row: KubeVirtBenchMasquerade, name: "kv-bench-masq", binding: BindingMasquerade, includes: IncludesKubeVirtMasquerade},
}

// KubeVirt's masquerade binding: the guest's network behind the pod's
// address (its default vmNetworkCIDR).
const (
	masqueradeGuestIP = "10.0.2.2"
	masqueradeGateway = "10.0.2.1"
)

// EmptyBridgeHolder is what the bridge row's label adds on a kernel without
// dummy links.
const EmptyBridgeHolder = "the pod's address held by an empty bridge in place of KubeVirt's dummy link (no CONFIG_DUMMY here; the lab's virt-handler patch, third_party/kubevirt/patches)"

// noDummyLinks: KubeVirt's bridge binding moves the pod's address to a
// dummy link named like the pod's interface (virt-handler's netpod
// bridgeBindingSpec); upstream's virt-handler fails the VMI on a kernel
// without CONFIG_DUMMY ("LinkAdd: operation not supported"), the lab's
// (scripts/kubevirt-bins.sh) makes an empty bridge instead, which, like
// the dummy, carries no traffic. It says why the kernel cannot make dummy
// links, "" when it can.
func noDummyLinks(ctx context.Context) string {
	const probe = "lk-probe-dummy"
	if err := ip(ctx, "netns", "add", probe); err != nil {
		return "cannot probe for dummy links: " + err.Error()
	}
	defer ip(context.Background(), "netns", "delete", probe) //nolint:errcheck
	if err := ip(ctx, "-n", probe, "link", "add", "d0", "type", "dummy"); err != nil {
		return "the kernel has no dummy links (CONFIG_DUMMY), on which KubeVirt's bridge binding keeps the pod's address"
	}
	return ""
}

// KubeVirtClientNoBIGTCP is what every KubeVirt row's label says of its
// client pod, whose eth0 the bench sets to 64 KiB GSO and GRO (no BIG TCP):
// a tap takes GSO packets of at most 64 KiB, and the kernel cuts a larger one
// into MSS-sized frames in software before it enters the tap — with the
// client at lanekit's 192 KiB, KubeVirt's bridge and masquerade bindings got
// 0.69 and 0.73 Gbit/s to the VM against 1.5–1.7 at 64 KiB (Dec 2), a loss
// that would flatter lanekit's binding, which takes such packets whole.
const KubeVirtClientNoBIGTCP = "client pod at 64 KiB GSO (no BIG TCP), which a tap takes whole"

// clientNoBIGTCP gives dev in netns 64 KiB GSO/GRO sizes for both families
// (the --big-tcp rows' switch) and reads them back.
func clientNoBIGTCP(netns, dev string) error {
	found, err := readGSOSizes(netns, dev)
	if err != nil {
		return err
	}
	if err := setGSOSizes(netns, dev, found.off()); err != nil {
		return err
	}
	got, err := readGSOSizes(netns, dev)
	if err != nil {
		return err
	}
	if got != found.off() {
		return fmt.Errorf("%s in %s: %s after setting %s", dev, netns, got, found.off())
	}
	return nil
}

// kubevirtBenchClient is the client pod of the KubeVirt rows (node 1).
var kubevirtBenchClient = benchPod{Name: "kv-bench-client", Node: 1, Netns: "lk-n1-kvb"}

// KubeVirtVMI renders VMI name on node (preferred, not required: KubeVirt
// copies a VMI's placement to its migration target's pod, which must fit
// another node) booting lanekit's test guest by KubeVirt's kernel boot (the
// lanekit-guest image: its kernel and initramfs under /boot), with one
// interface: binding BindingLanekit (the Multus network lanekit-vm that
// deploy/kubevirt/nad-example.yaml defines; mac, when set, is the VMI's
// macAddress), BindingBridge or BindingMasquerade (the pod network). The kernel command line
// carries no address: the guest comes up with its NIC unconfigured
// (ConfigureKubeVirtGuest).
func KubeVirtVMI(name, node, binding, mac string) string {
	// As KubeVirt's docs label VMs for Services and policies: KubeVirt
	// copies a VMI's labels to its launcher pod, whose labels the VM
	// endpoint takes (kubevirt.io/domain itself is only an annotation).
	iface := "        - name: fast\n          binding:\n            name: lanekit\n"
	network := "    - name: fast\n      multus:\n        networkName: " + VMNetwork + "\n"
	args := "console=ttyS0 quiet panic=-1"
	if binding == BindingBridge || binding == BindingMasquerade {
		iface = "        - name: default\n          " + binding + ": {}\n"
		network = "    - name: default\n      pod: {}\n"
	} else {
		// On lanekit's binding the guest leases its address by DHCP from
		// its link (bpf/lib/dhcp.h), as a cloud image would; the others are
		// configured over the console (ConfigureKubeVirtGuest).
		args += " lk.ip=dhcp"
		if mac != "" {
			args += " lk.mac=" + mac
		}
	}
	if mac != "" {
		iface += "          macAddress: \"" + mac + "\"\n"
	}
	return `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: ` + name + `
  namespace: ` + PodNamespace + `
  labels:
    app: kv-test
    kubevirt.io/domain: ` + name + `
spec:
  affinity:
    nodeAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          preference:
            matchExpressions:
              - {key: kubernetes.io/hostname, operator: In, values: [` + node + `]}
  domain:
    resources:
      requests:
        memory: 256Mi
    firmware:
      kernelBoot:
        kernelArgs: "` + args + `"
        container:
          image: ghcr.io/lanekit/lanekit-guest:v0.1.0
          imagePullPolicy: IfNotPresent
          kernelPath: /boot/vmlinuz
          initrdPath: /boot/initrd.img
    devices:
      interfaces:
` + iface + `  networks:
` + network
}

// ConfigureKubeVirtGuest configures the guest's NIC over its console (as
// cloud-init would): the NIC with mac, or the guest's only one when mac is
// empty, gets addr/32 routed through lanekit's gateway
// (datapath.DefaultGatewayIP: the agent answers ARP for it) — or, behind
// KubeVirt's masquerade (masquerade true), its guest address and gateway. It
// returns the NIC's name.
func ConfigureKubeVirtGuest(ctx context.Context, con *guest.Console, mac, addr string, masquerade bool) (string, error) {
	// The loop's status is its last test's: true ends it, and an empty IF
	// is the failure.
	pick := `[ "$(basename $d)" != lo ]`
	if mac != "" {
		pick = `[ "$(cat $d/address)" = ` + mac + ` ]`
	}
	gw := datapath.DefaultGatewayIP.String()
	setup := `ip addr add ` + addr + `/32 dev "$IF" && ip route add ` + gw + ` dev "$IF" && ip route add default via ` + gw
	if masquerade {
		setup = `ip addr add ` + masqueradeGuestIP + `/24 dev "$IF" && ip route add default via ` + masqueradeGateway
	}
	cmd := `IF=$(for d in /sys/class/net/*; do ` + pick + ` && basename $d; done | head -n 1; true) && [ -n "$IF" ] && ` +
		`ip link set "$IF" up && ` + setup + ` && echo "$IF"`
	out, code, err := con.Run(ctx, cmd)
	if err != nil || code != 0 {
		gout, _, _ := con.Run(ctx, "ip link; cat /sys/class/net/*/address")
		return "", fmt.Errorf("configure the guest's NIC: %v (exit %d): %s\nguest:\n%s", err, code, out, gout)
	}
	return strings.TrimSpace(out), nil
}

// DialKubeVirtConsole connects to the guest's serial console: QEMU's
// virt-serial0 socket in the launcher pod's "private" emptyDir (what
// virt-handler serves to `virtctl console`), reached through node's root and
// a short link in a directory of its own under the temp dir (sun_path holds
// 107 bytes), removed once connected. It returns once the guest's control
// loop answers (the guest may still be booting).
func DialKubeVirtConsole(ctx context.Context, node int, pod *corev1.Pod) (*guest.Console, error) {
	root, err := nodeRoot(node)
	if err != nil {
		return nil, err
	}
	uid, ok := pod.Labels["kubevirt.io/created-by"]
	if !ok {
		return nil, fmt.Errorf("launcher pod %s has no kubevirt.io/created-by label", pod.Name)
	}
	dir, err := os.MkdirTemp("", "lkvc")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	link := filepath.Join(dir, "s")
	if err := os.Symlink(filepath.Join(root, "var/lib/kubelet/pods", string(pod.UID), "volumes/kubernetes.io~empty-dir/private", uid), link); err != nil {
		return nil, err
	}
	con, err := guest.DialConsole(ctx, filepath.Join(link, "virt-serial0"))
	if err != nil {
		return nil, fmt.Errorf("guest console: %w", err)
	}
	// Commands sent before the guest's init reads the console are lost:
	// ask again until one is answered.
	var last error
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		out, code, err := con.Run(rctx, "echo lk-alive")
		last = err
		return err == nil && code == 0 && strings.Contains(out, "lk-alive"), nil
	})
	if err != nil {
		con.Close()
		return nil, fmt.Errorf("the guest's console does not answer (%v, %v): %s", err, last, tail(con.Text(), 2000))
	}
	return con, nil
}

// waitVMILauncher waits for VMI name to run and returns its running
// launcher pod.
func waitVMILauncher(ctx context.Context, kc kubernetes.Interface, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	var phase string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := kubectl(ctx, NodeBinDir(), nil, "get", "vmi", name, "-n", PodNamespace, "-o", "jsonpath={.status.phase}")
		phase = strings.TrimSpace(out)
		if err != nil || phase != "Running" {
			return false, nil
		}
		pods, err := kc.CoreV1().Pods(PodNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher,vm.kubevirt.io/name=" + name})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.Status.Phase == corev1.PodRunning {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		vmi, _ := kubectl(ctx, NodeBinDir(), nil, "get", "vmi", name, "-n", PodNamespace, "-o", "yaml")
		return nil, fmt.Errorf("VMI %s phase %q, not Running with a running launcher pod (%w):\n%s", name, phase, err, tail(vmi, 3000))
	}
	return pod, nil
}

// kubevirtVMAddress is the address a VMI's guest is reached at: for
// lanekit's binding what lanekit's CNI returned to Multus for the lanekit-vm
// network (the agent's VM endpoint), for the bridge binding (the guest
// takes it) and masquerade (NAT to the guest) the launcher pod's IP.
func kubevirtVMAddress(pod *corev1.Pod, binding string) (string, error) {
	if binding != BindingLanekit {
		if pod.Status.PodIP == "" {
			return "", fmt.Errorf("launcher pod %s has no address", pod.Name)
		}
		return pod.Status.PodIP, nil
	}
	var status []NetworkStatus
	if err := json.Unmarshal([]byte(pod.Annotations[NetworkStatusAnnotation]), &status); err != nil {
		return "", fmt.Errorf("launcher %s network-status: %w", pod.Name, err)
	}
	for _, s := range status {
		if s.Name == PodNamespace+"/"+VMNetwork && len(s.IPs) > 0 {
			return s.IPs[0], nil
		}
	}
	return "", fmt.Errorf("launcher %s network-status has no address on %s: %s", pod.Name, VMNetwork, pod.Annotations[NetworkStatusAnnotation])
}

// kubevirtGuestUp readies the guest of the VMI whose launcher pod runs on
// lab node node: the address it is reached at (kubevirtVMAddress), its
// console (DialKubeVirtConsole) and its NIC configured: on lanekit's binding
// by the DHCP lease the guest took at boot (kubevirtGuestLeased), on
// KubeVirt's over the console (ConfigureKubeVirtGuest). The caller closes
// the console.
func kubevirtGuestUp(ctx context.Context, node int, launcher *corev1.Pod, binding, mac string) (string, *guest.Console, error) {
	addr, err := kubevirtVMAddress(launcher, binding)
	if err != nil {
		return "", nil, err
	}
	con, err := DialKubeVirtConsole(ctx, node, launcher)
	if err != nil {
		return "", nil, err
	}
	if binding == BindingLanekit {
		err = kubevirtGuestLeased(ctx, con, addr)
	} else {
		_, err = ConfigureKubeVirtGuest(ctx, con, mac, addr, binding == BindingMasquerade)
	}
	if err != nil {
		con.Close()
		return "", nil, err
	}
	return addr, con, nil
}

// kubevirtGuestLeased checks that the guest holds addr/32 with the default
// route through lanekit's gateway: what its boot-time DHCP (lk.ip=dhcp)
// leased from the datapath, with nothing configured over the console.
func kubevirtGuestLeased(ctx context.Context, con *guest.Console, addr string) error {
	gw := datapath.DefaultGatewayIP.String()
	out, code, err := con.Run(ctx, "ip -o -4 addr show; ip -4 route show")
	if err != nil || code != 0 || !strings.Contains(out, " "+addr+"/32 ") || !strings.Contains(out, "default via "+gw+" ") {
		log, _, _ := con.Run(ctx, "cat /tmp/udhcpc.log")
		return fmt.Errorf("the guest has no DHCP lease of %s/32 with the default route via %s (%v, exit %d):\n%s\nudhcpc:\n%s",
			addr, gw, err, code, out, log)
	}
	return nil
}

// findProc is a process of this machine (as the root PID namespace numbers
// it: the nodes' processes live in their own) whose argv match accepts, 0
// when none does.
func findProc(match func(argv []string) bool) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && len(cmd) > 0 && match(strings.Split(strings.TrimSuffix(string(cmd), "\x00"), "\x00")) {
			return pid
		}
	}
	return 0
}

// qemuOf is the QEMU process of VMI ns/name (libvirt names the domain
// ns_name: -name guest=ns_name,...).
func qemuOf(ns, name string) int {
	want := "guest=" + ns + "_" + name
	return findProc(func(argv []string) bool {
		if !strings.Contains(filepath.Base(argv[0]), "qemu") {
			return false
		}
		for _, a := range argv[1:] {
			if a == want || strings.HasPrefix(a, want+",") {
				return true
			}
		}
		return false
	})
}

// vhostOf is the lanekit-vhost process of VM endpoint vm (--vm vm).
func vhostOf(vm string) int {
	return findProc(func(argv []string) bool {
		if filepath.Base(argv[0]) != "lanekit-vhost" {
			return false
		}
		for i := 1; i+1 < len(argv); i++ {
			if argv[i] == "--vm" && argv[i+1] == vm {
				return true
			}
		}
		return false
	})
}

// KubeVirtBench is what KubeVirtBenchRows set up: the rows, the QEMU
// processes of their guests (the bench's host CPU figures exclude their
// vCPU threads) and what to undo.
type KubeVirtBench struct {
	Paths     []bench.Path
	GuestPIDs []int
	kc        kubernetes.Interface
	vms       []kubevirtBenchVM // the VMIs applied: Close deletes them
	cons      []*guest.Console
}

// KubeVirtBenchRows creates the KubeVirt rows on a --kubevirt lab: a
// client pod on node 1, and on node 2 one VMI per binding (kubevirtBenchVMs)
// this machine can run,
// waits for them to run, gives each guest its address and checks the
// client reaches it. Close removes them again, also after a failure here.
func (s *State) KubeVirtBenchRows(ctx context.Context, progress func(string, ...any)) (*KubeVirtBench, error) {
	if !s.KubeVirt || len(s.Nodes) < 2 {
		return nil, errors.New("the KubeVirt rows need a lab up with --k8s --kubelet --kubevirt and 2 nodes")
	}
	kc, err := fastClient()
	if err != nil {
		return nil, err
	}
	kb := &KubeVirtBench{kc: kc}
	fail := func(err error) (*KubeVirtBench, error) {
		kb.Close()
		return nil, err
	}
	for _, v := range kubevirtBenchVMs {
		v.includes.Detail += "; " + KubeVirtClientNoBIGTCP
		if v.binding == BindingBridge && noDummyLinks(ctx) != "" {
			v.includes.Detail += "; " + EmptyBridgeHolder
		}
		kb.vms = append(kb.vms, v)
		if _, err := kubectl(ctx, NodeBinDir(), []byte(KubeVirtVMI(v.name, KubeNodeName(2), v.binding, v.mac)), "apply", "-f", "-"); err != nil {
			return fail(fmt.Errorf("VMI %s: %w", v.name, err))
		}
	}
	pods, err := startBenchPods(ctx, kc, []benchPod{kubevirtBenchClient})
	if err != nil {
		return fail(err)
	}
	client := pods[kubevirtBenchClient.Name]
	if err := clientNoBIGTCP(kubevirtBenchClient.Netns, "eth0"); err != nil {
		return fail(fmt.Errorf("client pod %s: %w", client.Name, err))
	}
	for _, v := range kb.vms {
		progress("KubeVirt row %s: waiting for VMI %s (%s binding) to run and its guest to boot", v.row, v.name, v.binding)
		launcher, err := waitVMILauncher(ctx, kc, v.name)
		if err != nil {
			return fail(err)
		}
		addr, con, err := kubevirtGuestUp(ctx, 2, launcher, v.binding, v.mac)
		if err != nil {
			return fail(fmt.Errorf("VMI %s: %w", v.name, err))
		}
		kb.cons = append(kb.cons, con)
		if err := waitReachFrom(ctx, kubevirtBenchClient.Netns, addr); err != nil {
			return fail(fmt.Errorf("VMI %s at %s from pod %s: %w", v.name, addr, client.Name, err))
		}
		listenIP := ""
		if v.binding == BindingMasquerade {
			listenIP = masqueradeGuestIP
		}
		p := bench.Path{Name: v.row, ClientNS: kubevirtBenchClient.Netns, ServerNS: NodeNS(2), ServerIP: addr,
			Guest: &bench.Guest{Name: v.name, Shell: con}, Includes: v.includes, ListenIP: listenIP,
			Note: fmt.Sprintf("VMI %s (%s binding) on %s, booted by KubeVirt %s; %s", v.name, v.binding, KubeNodeName(2), KubeVirtVersion, TCGNote)}
		// The agent reports its backend's PID in its node's PID namespace;
		// the bench reads /proc here.
		if pid := vhostOf(k8s.VMName(PodNamespace, v.name)); v.binding == BindingLanekit && pid > 0 {
			p.CPUParts = append(p.CPUParts, bench.CPUPart{Name: "lanekit-vhost", PID: pid})
		}
		if pid := qemuOf(PodNamespace, v.name); pid > 0 {
			kb.GuestPIDs = append(kb.GuestPIDs, pid)
			p.CPUParts = append(p.CPUParts, bench.CPUPart{Name: "qemu without vCPUs", PID: pid})
		}
		kb.Paths = append(kb.Paths, p)
	}
	return kb, nil
}

// waitReachFrom waits until the guest at addr answers HTTP (its web
// server) from the named netns: first contact, ARP on both sides.
func waitReachFrom(ctx context.Context, netns, addr string) error {
	c := netnsHTTPClient(netnsPath(netns), 3*time.Second)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(addr, "80")+"/", nil)
		if err != nil {
			return false, err
		}
		resp, err := c.Do(req)
		if last = err; err != nil {
			return false, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if !strings.Contains(string(body), "lanekit guest") {
			last = fmt.Errorf("HTTP %s: %q", resp.Status, body)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("no answer to HTTP: %v", last)
	}
	return nil
}

// Close deletes the VMIs and the client pod (waiting until they are gone)
// and the client's netns name.
func (kb *KubeVirtBench) Close() error {
	if kb == nil {
		return nil
	}
	for _, c := range kb.cons {
		c.Close()
	}
	kb.cons = nil
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	for _, v := range kb.vms {
		if _, err := kubectl(ctx, NodeBinDir(), nil, "delete", "vmi", v.name, "-n", PodNamespace, "--ignore-not-found", "--wait=true"); err != nil {
			errs = append(errs, err)
		}
	}
	zero := int64(0)
	if err := kb.kc.CoreV1().Pods(benchPodNamespace).Delete(ctx, kubevirtBenchClient.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	_ = ip(ctx, "netns", "delete", kubevirtBenchClient.Netns)
	return errors.Join(errs...)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
