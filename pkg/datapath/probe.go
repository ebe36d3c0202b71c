package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Features is what the running kernel offers the datapath, found by probing.
type Features struct {
	TCX   bool   // tcx links (kernel >= 6.6): how pod programs attach
	BTF   bool   // kernel BTF at /sys/kernel/btf/vmlinux
	BPFFS bool   // a BPF filesystem at /sys/fs/bpf: pins survive the agent
	Notes string // why a probe failed, when one did
}

// ProbeFeatures probes tcx, BTF and bpffs. It needs CAP_BPF/CAP_NET_ADMIN for
// the tcx probe; without them TCX is reported false with the reason.
func ProbeFeatures() Features {
	var f Features
	var notes []error
	if err := ProbeTCX(); err == nil {
		f.TCX = true
	} else {
		notes = append(notes, fmt.Errorf("tcx: %w", err))
	}
	if _, err := btf.LoadKernelSpec(); err == nil {
		f.BTF = true
	} else {
		notes = append(notes, fmt.Errorf("btf: %w", err))
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		f.BPFFS = true
	} else {
		notes = append(notes, errors.New("bpffs: /sys/fs/bpf is not a BPF filesystem (mount -t bpf bpf /sys/fs/bpf)"))
	}
	if err := errors.Join(notes...); err != nil {
		f.Notes = err.Error()
	}
	return f
}

// ProbeTCX attaches a pass-through program to the loopback device with a tcx
// link and detaches it at once. ErrNotSupported when the kernel lacks tcx.
func ProbeTCX() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, -1), // TCX_NEXT: let the next program or the stack decide
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("load probe program: %w", err)
	}
	defer prog.Close()
	lo := 1 // loopback is ifindex 1 in every namespace
	l, err := link.AttachTCX(link.TCXOptions{Interface: lo, Program: prog, Attach: ebpf.AttachTCXIngress})
	if errors.Is(err, ebpf.ErrNotSupported) {
		return ErrNotSupported
	}
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("attach probe: %w (needs CAP_BPF and CAP_NET_ADMIN)", err)
		}
		return fmt.Errorf("attach probe: %w", err)
	}
	return l.Close()
}
