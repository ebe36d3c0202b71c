package netdev

import (
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Feature is one probed kernel capability.
type Feature struct {
	Supported bool
	Detail    string
}

// Features is what `lanekit status` reports about the kernel.
type Features struct {
	Release string
	TCX     Feature
	Netkit  Feature
	BPFFS   Feature
	BTF     Feature
}

// ProbeFeatures probes the kernel (never by version string). bpfDir is the
// directory that must be on a BPF filesystem (e.g. /sys/fs/bpf/lanekit or a
// parent of it).
func (h *Host) ProbeFeatures(bpfDir string) Features {
	var f Features
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		f.Release = unix.ByteSliceToString(uts.Release[:])
	}
	f.TCX = probeTCX()
	ok, why := h.ProbeNetkit()
	f.Netkit = Feature{ok, why}
	f.BPFFS = probeBPFFS(bpfDir)
	f.BTF = probeBTF()
	return f
}

// probeTCX attaches a trivial program to an ifindex that cannot exist: a
// kernel with tcx answers ENODEV, one without it rejects the attach type.
func probeTCX() Feature {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		return Feature{false, fmt.Sprintf("load probe program: %v", err)}
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return Feature{true, "attach succeeded"}
	}
	if errors.Is(err, unix.ENODEV) {
		return Feature{true, "tcx links supported"}
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return Feature{false, "kernel has no tcx links (needs 6.6)"}
	}
	return Feature{false, fmt.Sprintf("tcx probe: %v", err)}
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
				return Feature{true, fmt.Sprintf("%s is on bpffs", d)}
			}
			return Feature{false, fmt.Sprintf("%s is not on bpffs (mount -t bpf bpf /sys/fs/bpf)", d)}
		}
		if !errors.Is(err, unix.ENOENT) || d == "/" {
			return Feature{false, fmt.Sprintf("statfs %s: %v", d, err)}
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

func probeBTF() Feature {
	const path = "/sys/kernel/btf/vmlinux"
	if _, err := os.Stat(path); err != nil {
		return Feature{false, fmt.Sprintf("no kernel BTF: %v", err)}
	}
	return Feature{true, path}
}
