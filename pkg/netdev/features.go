package netdev

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/xsk"
)

// Feature is one probed kernel capability.
type Feature struct {
	Supported bool
	// Unknown is set when the probe could not decide (typically: not root).
	Unknown bool
	Detail  string
}

// Features is the one set of kernel probes lanekit uses: the agent chooses
// its device mode from it, `lanekit status` and `lanekit node check` print it.
// Every answer comes from trying the feature, never from the version string.
type Features struct {
	Release       string
	TCX           Feature // tcx links: how pod and uplink programs attach
	Netkit        Feature // netkit devices: the pod device when available
	BPFFS         Feature // pins survive the agent
	BTF           Feature // kernel BTF
	RedirectPeer  Feature // bpf_redirect_peer: uplink -> pod without a second stack pass
	XDP           Feature // XDP programs: steer_vm on a VM's device
	AFXDP         Feature // AF_XDP sockets bound in copy mode: the VM fast lane
	AFXDPZeroCopy Feature // AF_XDP zero-copy on the uplink (driver support), only with an uplink
	TunSteering   Feature // TUNSETSTEERINGEBPF: Toeplitz steering for multiqueue tap
	RingBuf       Feature // BPF ring buffer: flow events
	BIGTCP        Feature // GSO/GRO above 64 KiB (bigtcp.go): a veth's, or the uplink's when given
}

// NamedFeature is one row of the feature table.
type NamedFeature struct {
	Name    string
	Uses    string // what lanekit uses it for
	Feature Feature
}

// Table lists the features in a fixed order, for status and node check.
func (f Features) Table() []NamedFeature {
	return []NamedFeature{
		{"tcx", "attach pod and uplink programs", f.TCX},
		{"netkit", "pod device (veth otherwise)", f.Netkit},
		{"bpf_redirect_peer", "uplink to pod in one hop", f.RedirectPeer},
		{"xdp", "steer_vm on VM devices", f.XDP},
		{"af_xdp", "VM fast lane sockets (copy mode)", f.AFXDP},
		{"af_xdp_zerocopy", "zero-copy VM sockets on the uplink", f.AFXDPZeroCopy},
		{"tun_steering_ebpf", "multiqueue tap steering", f.TunSteering},
		{"BTF", "CO-RE and map introspection", f.BTF},
		{"bpffs", "pins survive agent restarts", f.BPFFS},
		{"ringbuf", "flow events", f.RingBuf},
		{"big_tcp", "pod GSO/GRO above 64 KiB", f.BIGTCP},
	}
}

// ProbeFeatures probes the kernel from the host namespace (netkit is probed
// there, as the agent creates pod devices there). bpfDir is the directory
// that must be on a BPF filesystem (e.g. /sys/fs/bpf/lanekit or a parent).
func (h *Host) ProbeFeatures(bpfDir string) Features {
	f := probeCommon(bpfDir)
	ok, why := h.ProbeNetkit()
	f.Netkit = Feature{Supported: ok, Detail: why, Unknown: !ok && permissionDenied(why)}
	scratch(&f, false)
	return f
}

// ProbeKernel probes everything without touching the caller's namespace:
// device-creating probes run in a throwaway network namespace. uplink, when
// set, is asked (in the caller's namespace) whether its driver does AF_XDP
// zero-copy.
func ProbeKernel(bpfDir, uplink string) Features {
	f := probeCommon(bpfDir)
	scratch(&f, true)
	if uplink != "" {
		f.AFXDPZeroCopy = probeZeroCopy(uplink)
		f.BIGTCP = probeLinkBIGTCP(uplink)
	}
	return f
}

func probeCommon(bpfDir string) Features {
	var f Features
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		f.Release = unix.ByteSliceToString(uts.Release[:])
	}
	f.TCX = probeTCX()
	f.BPFFS = probeBPFFS(bpfDir)
	f.BTF = probeBTF()
	f.RedirectPeer = fromErr(features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectPeer), "helper available to tc programs")
	f.XDP = fromErr(features.HaveProgramType(ebpf.XDP), "XDP programs load")
	f.RingBuf = fromErr(features.HaveMapType(ebpf.RingBuf), "ring buffer maps create")
	f.AFXDPZeroCopy = Feature{Unknown: true, Detail: "depends on the uplink's driver (give the uplink to probe it)"}
	return f
}

// fromErr turns a cilium/ebpf features probe result into a Feature.
func fromErr(err error, ok string) Feature {
	switch {
	case err == nil:
		return Feature{Supported: true, Detail: ok}
	case errors.Is(err, ebpf.ErrNotSupported):
		return Feature{Detail: fmt.Sprintf("not supported: %v", err)}
	case errors.Is(err, unix.EPERM), errors.Is(err, os.ErrPermission):
		return Feature{Unknown: true, Detail: "probe needs root (CAP_BPF)"}
	}
	return Feature{Unknown: true, Detail: fmt.Sprintf("probe failed: %v", err)}
}

func permissionDenied(detail string) bool {
	d := strings.ToLower(detail)
	return strings.Contains(d, "operation not permitted") || strings.Contains(d, "permission denied")
}

// scratch runs the probes that create devices in a throwaway namespace: the
// AF_XDP copy-mode bind, TUNSETSTEERINGEBPF, and netkit when withNetkit.
func scratch(f *Features, withNetkit bool) {
	err := inScratchNetns(func() {
		f.AFXDP = probeAFXDP()
		f.TunSteering = probeTunSteering()
		f.BIGTCP = probeVethBIGTCP()
		if withNetkit {
			ok, why := (&Host{}).ProbeNetkit() // the scratch namespace is the current one
			f.Netkit = Feature{Supported: ok, Detail: why, Unknown: !ok && permissionDenied(why)}
		}
	})
	if err != nil {
		unknown := Feature{Unknown: true, Detail: fmt.Sprintf("needs a scratch network namespace: %v", err)}
		f.AFXDP, f.TunSteering, f.BIGTCP = unknown, unknown, unknown
		if withNetkit {
			f.Netkit = unknown
		}
	}
}

// inScratchNetns runs fn on a locked thread inside a new, empty network
// namespace that disappears afterwards.
func inScratchNetns(fn func()) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	tmp, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer tmp.Close()
	fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: the runtime discards it when the goroutine ends.
		return fmt.Errorf("return from scratch netns: %w", err)
	}
	runtime.UnlockOSThread()
	return nil
}

// probeTCX attaches a trivial program to an ifindex that cannot exist: a
// kernel with tcx answers ENODEV, one without it rejects the attach type.
// Nothing is ever attached.
func probeTCX() Feature {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, -1), // TCX_NEXT
			asm.Return(),
		},
	})
	if err != nil {
		return fromErr(err, "")
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return Feature{Supported: true, Detail: "attach succeeded"}
	}
	if errors.Is(err, unix.ENODEV) {
		return Feature{Supported: true, Detail: "tcx links supported"}
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return Feature{Detail: "kernel has no tcx links (needs 6.6)"}
	}
	return Feature{Unknown: errors.Is(err, unix.EPERM), Detail: fmt.Sprintf("tcx probe: %v", err)}
}

// probeAFXDP binds a copy-mode AF_XDP socket to queue 0 of a veth made for
// the purpose (in the scratch namespace).
func probeAFXDP() Feature {
	const a, b = "lkxskprobe0", "lkxskprobe1"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}); err != nil {
		return Feature{Unknown: true, Detail: fmt.Sprintf("create probe veth: %v", err)}
	}
	l, err := netlink.LinkByName(a)
	if err != nil {
		return Feature{Unknown: true, Detail: fmt.Sprintf("probe veth: %v", err)}
	}
	defer netlink.LinkDel(l)
	if err := netlink.LinkSetUp(l); err != nil {
		return Feature{Unknown: true, Detail: fmt.Sprintf("probe veth up: %v", err)}
	}
	sz := xsk.Sizes{FrameSize: 2048, FrameCount: 64, FillSize: 64, CompSize: 64, RxSize: 64, TxSize: 64}
	s, err := xsk.Open(l.Attrs().Index, 0, sz)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return Feature{Detail: fmt.Sprintf("kernel without AF_XDP: %v", err)}
		}
		return Feature{Detail: fmt.Sprintf("copy-mode bind failed: %v", err)}
	}
	s.Close()
	return Feature{Supported: true, Detail: "copy-mode socket bound to a veth queue"}
}

// probeTunSteering creates a multiqueue tap and sets a steering program on
// it with TUNSETSTEERINGEBPF (QEMU's eBPF RSS path).
func probeTunSteering() Feature {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return Feature{Detail: fmt.Sprintf("open /dev/net/tun: %v", err)}
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lktunprobe0")
	if err != nil {
		return Feature{Unknown: true, Detail: err.Error()}
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return Feature{Unknown: errors.Is(err, unix.EPERM), Detail: fmt.Sprintf("create multiqueue tap: %v", err)}
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SocketFilter,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return fromErr(err, "")
	}
	defer prog.Close()
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETSTEERINGEBPF, prog.FD()); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			return Feature{Detail: fmt.Sprintf("TUNSETSTEERINGEBPF refused: %v", err)}
		}
		return Feature{Detail: fmt.Sprintf("TUNSETSTEERINGEBPF: %v", err)}
	}
	return Feature{Supported: true, Detail: "steering program set on a multiqueue tap"}
}

const bpfFSMagic = 0xcafe4a11

// probeBPFFS reports whether dir, or its nearest existing parent, is on a
// BPF filesystem.
func probeBPFFS(dir string) Feature {
	if dir == "" {
		dir = "/sys/fs/bpf"
	}
	for d := dir; ; {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			if uint32(st.Type) == bpfFSMagic {
				return Feature{Supported: true, Detail: fmt.Sprintf("%s is on bpffs", d)}
			}
			return Feature{Detail: fmt.Sprintf("%s is not on bpffs (mount -t bpf bpf /sys/fs/bpf)", d)}
		}
		if !errors.Is(err, unix.ENOENT) || d == "/" {
			return Feature{Unknown: true, Detail: fmt.Sprintf("statfs %s: %v", d, err)}
		}
		d = parentDir(d)
	}
}

func parentDir(p string) string {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "/"
}

// probeBTF parses the kernel's BTF (not only checks that the file exists).
func probeBTF() Feature {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, os.ErrNotExist) {
			return Feature{Detail: fmt.Sprintf("no kernel BTF: %v", err)}
		}
		return Feature{Unknown: true, Detail: fmt.Sprintf("load kernel BTF: %v", err)}
	}
	if _, err := spec.AnyTypeByName("sk_buff"); err != nil {
		return Feature{Detail: fmt.Sprintf("kernel BTF lacks sk_buff: %v", err)}
	}
	return Feature{Supported: true, Detail: "/sys/kernel/btf/vmlinux parsed"}
}
