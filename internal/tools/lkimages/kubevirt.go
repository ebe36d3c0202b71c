package main

// The images of `lab up --k8s --kubelet --kubevirt`: KubeVirt's components
// and Multus from scripts/kubevirt-bins.sh, lanekit's binding sidecar from
// bin/, under the names the rendered release manifests and the binding
// registration use (make kubevirt-images).

import (
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// KubeVirt's image names: quay.io/kubevirt/NAME:TAG, what
// scripts/kubevirt-bins.sh renders into kubevirt-operator.yaml (and what
// virt-operator derives the others' names from).
const (
	kubevirtRegistry = "quay.io/kubevirt/"
	kubevirtTag      = "v1.9.0"
	// Multus' thick-plugin DaemonSet image (deployments/multus-daemonset-thick.yml).
	multusImage = "ghcr.io/k8snetworkplumbingwg/multus-cni:v4.2.3-thick"
	// lanekit's binding sidecar (deploy/kubevirt/binding-patch.yaml).
	sidecarImage = "ghcr.io/lanekit/lanekit-kubevirt-sidecar:v0.1.0"
	// lanekit's test guest as a KubeVirt kernel-boot image (the lab's VMIs:
	// spec.domain.firmware.kernelBoot.container).
	guestImage = "ghcr.io/lanekit/lanekit-guest:v0.1.0"
)

// qemuUID is the qemu user and group of the virt-launcher image.
const qemuUID = 107

// capNetBindService: the monitor raises it for virt-launcher.
const capNetBindService = unix.CAP_NET_BIND_SERVICE

// kubevirtNames are written only when named (make kubevirt-images).
var kubevirtNames = []string{"virt-operator", "virt-api", "virt-controller", "virt-handler",
	"virt-launcher", "virt-exportserver", "virt-exportproxy", "multus", "kubevirt-sidecar",
	"lanekit-guest"}

// launcherRoot is the root of the virt-launcher image: libvirt 11.3 and
// QEMU 10.0 from bookworm-backports (upstream's launcher base: CentOS Stream's
// libvirt-daemon-driver-qemu, qemu-kvm-core, qemu-img, passt, swtpm ...), TCG
// being enough here (useEmulation), and the qemu user and group (107) the
// non-root launcher runs as.
var launcherRoot = debian{
	Name: "launcher", Suite: debianSuite, Mirror: debianMirror, Backports: true,
	Packages: []string{"bash", "procps", "util-linux", "iproute2", "nftables", "ca-certificates",
		"libvirt-daemon/bookworm-backports", "libvirt-daemon-driver-qemu/bookworm-backports",
		"libvirt-clients/bookworm-backports", "qemu-system-x86/bookworm-backports",
		"qemu-utils/bookworm-backports",
		// qemu-system-x86's exact-version dependencies, which apt does not
		// take from backports by itself.
		"qemu-system-common/bookworm-backports", "qemu-system-data/bookworm-backports",
		"seabios/bookworm-backports"},
	Hooks: append(slices.Clone(qemuUser), `mkdir -p "$1/home/qemu" && chown 107:107 "$1/home/qemu"`),
}

// qemuUser makes the qemu user and group 107 (the launcher's user).
var qemuUser = []string{
	`chroot "$1" sh -c 'getent group qemu >/dev/null && groupmod -g 107 qemu || groupadd -g 107 qemu'`,
	`chroot "$1" sh -c 'getent passwd qemu >/dev/null && usermod -u 107 -g 107 -d /home/qemu qemu || useradd -u 107 -g 107 -d /home/qemu -s /bin/bash qemu'`,
}

// handlerRoot is the root of virt-handler (upstream's handler base: the
// tools it execs on the node and in its own mount namespace), with the qemu
// user: virt-handler chowns the launcher's domain-notify socket to it by
// name (without it: "failed to look up user qemu").
var handlerRoot = debian{
	Name: "handler", Suite: debianSuite, Mirror: debianMirror,
	Packages: []string{"bash", "procps", "util-linux", "iproute2", "nftables", "iptables", "qemu-utils",
		"ca-certificates"},
	Hooks: qemuUser,
}

// virtqemud is a wrapper installed as /usr/sbin/virtqemud: virt-launcher
// execs virtqemud (libvirt's modular QEMU daemon), Debian's libvirt ships
// only the monolithic libvirtd. libvirtd takes virtqemud's options and
// configuration keys; its socket is libvirt-sock where virt-launcher
// dials virtqemud-sock (in $XDG_RUNTIME_DIR/libvirt non-root, /run/libvirt
// as root), so the wrapper links that name to it first.
const virtqemud = `#!/bin/sh
# lanekit: libvirtd standing in for virtqemud (Debian ships no modular daemons).
if [ "$(id -u)" = 0 ]; then d=/run/libvirt; else d=${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/libvirt; fi
mkdir -p "$d" && ln -sf libvirt-sock "$d/virtqemud-sock"
exec /usr/sbin/libvirtd "$@"
`

// kubevirtSpec returns the spec of a KubeVirt, Multus or sidecar image
// (ok false: n is none of them).
func kubevirtSpec(n string, in inputs) (s spec, ok bool, err error) {
	kv := func(f string) string { return filepath.Join(in.KubeVirtBins, f) }
	usrBin := func(names ...string) []entry {
		var out []entry
		for _, b := range names {
			out = append(out, regular("/usr/bin/"+b, kv(b), 0o755))
		}
		return out
	}
	env := []string{"PATH=" + pathEnv}
	switch n {
	case "virt-operator", "virt-api", "virt-controller", "virt-exportserver", "virt-exportproxy":
		base, err := slim.rootfs(in.Cache)
		if err != nil {
			return spec{}, true, err
		}
		// Upstream's images run as 1001 (cmd/NAME/BUILD.bazel); their pods
		// say runAsNonRoot.
		return spec{Name: n, Tags: []string{kubevirtRegistry + n + ":" + kubevirtTag}, Base: base, Env: env,
			Files: usrBin(n), Entrypoint: []string{"/usr/bin/" + n}, User: "1001"}, true, nil
	case "virt-handler":
		base, err := handlerRoot.rootfs(in.Cache)
		if err != nil {
			return spec{}, true, err
		}
		return spec{Name: n, Tags: []string{kubevirtRegistry + n + ":" + kubevirtTag}, Base: base, Env: env,
			Files: usrBin("virt-handler", "virt-chroot"), Entrypoint: []string{"/usr/bin/virt-handler"}}, true, nil
	case "virt-launcher":
		base, err := launcherRoot.rootfs(in.Cache)
		if err != nil {
			return spec{}, true, err
		}
		files := usrBin("virt-launcher", "virt-freezer", "virt-probe", "virt-tail", "container-disk", "libvirt-hook-client")
		// As upstream's image (cmd/virt-launcher/BUILD.bazel setcaps): the
		// monitor, non-root, starts virt-launcher with CAP_NET_BIND_SERVICE
		// ambient, which it must hold itself.
		files = append(files, withCaps(regular("/usr/bin/virt-launcher-monitor", kv("virt-launcher-monitor"), 0o755), capNetBindService))
		for _, f := range []string{"qemu.conf", "virtqemud.conf", "nsswitch.conf"} {
			dst := "/etc/libvirt/" + f
			if f == "nsswitch.conf" {
				dst = "/etc/" + f
			}
			files = append(files, regular(dst, kv("launcher-files/"+f), 0o644))
		}
		files = append(files,
			regular("/usr/bin/node-labeller.sh", kv("launcher-files/node-labeller.sh"), 0o755),
			// virt-launcher (uid 107) replaces the hook with a link to
			// libvirt-hook-client: upstream's hooks directory is the qemu
			// user's.
			ownedBy(dir("/etc/libvirt/hooks", 0o755), qemuUID),
			ownedBy(regular("/etc/libvirt/hooks/qemu", kv("launcher-files/qemu"), 0o755), qemuUID),
			content("/usr/sbin/virtqemud", []byte(virtqemud), 0o755),
			// Relative, as upstream's: virt-handler reads the launcher's
			// sockets through /proc/PID/root/var/run (Debian's link is
			// absolute, which would resolve in virt-handler's root).
			symlink("/var/run", "../run"),
			dir("/usr/lib64/qemu-kvm", 0o755))
		return spec{Name: n, Tags: []string{kubevirtRegistry + n + ":" + kubevirtTag}, Base: base, Env: env,
			Files: files, Entrypoint: []string{"/usr/bin/virt-launcher"}, User: strconv.Itoa(qemuUID)}, true, nil
	case "multus":
		base, err := slim.rootfs(in.Cache)
		if err != nil {
			return spec{}, true, err
		}
		// Where upstream's thick image has them (the DaemonSet names the paths).
		var files []entry
		for _, b := range []string{"multus", "multus-daemon", "multus-shim", "install_multus", "passthru"} {
			files = append(files, regular("/usr/src/multus-cni/bin/"+b, kv(b), 0o755))
		}
		return spec{Name: n, Tags: []string{multusImage}, Base: base, Env: env, Files: files,
			Entrypoint: []string{"/usr/src/multus-cni/bin/multus-daemon"}}, true, nil
	case "kubevirt-sidecar":
		base, err := slim.rootfs(in.Cache)
		if err != nil {
			return spec{}, true, err
		}
		return spec{Name: n, Tags: []string{sidecarImage}, Base: base, Env: env,
			Files:      []entry{regular("/usr/bin/lanekit-kubevirt-sidecar", filepath.Join(in.Bin, "lanekit-kubevirt-sidecar"), 0o755)},
			Entrypoint: []string{"/usr/bin/lanekit-kubevirt-sidecar"}}, true, nil
	case "lanekit-guest":
		// As upstream's kernel-boot images (FROM scratch, the kernel and
		// initramfs under /boot): virt-launcher's pod runs its static
		// container-disk binary in it, virt-handler mounts the files
		// into the launcher.
		return spec{Name: n, Tags: []string{guestImage}, Files: []entry{
			regular("/boot/vmlinuz", filepath.Join(in.Guest, "vmlinuz"), 0o644),
			regular("/boot/initrd.img", filepath.Join(in.Guest, "initrd.img"), 0o644)}}, true, nil
	}
	return spec{}, false, nil
}
