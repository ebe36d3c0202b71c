package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeKubeVirtInputs adds fake KubeVirt and Multus binaries, the launcher's
// files and the KubeVirt roots to fakeInputs.
func fakeKubeVirtInputs(t *testing.T) inputs {
	t.Helper()
	in := fakeInputs(t)
	in.KubeVirtBins = filepath.Join(t.TempDir(), "kubevirt")
	if err := os.MkdirAll(filepath.Join(in.KubeVirtBins, "launcher-files"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"virt-operator", "virt-api", "virt-controller", "virt-handler", "virt-chroot", "virt-launcher",
		"virt-launcher-monitor", "virt-freezer", "virt-probe", "virt-tail", "container-disk", "virt-exportserver", "virt-exportproxy", "libvirt-hook-client",
		"multus", "multus-daemon", "multus-shim", "install_multus", "passthru",
		"launcher-files/qemu.conf", "launcher-files/virtqemud.conf", "launcher-files/nsswitch.conf",
		"launcher-files/node-labeller.sh", "launcher-files/qemu"} {
		if err := os.WriteFile(filepath.Join(in.KubeVirtBins, b), []byte("kv/"+b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(in.Bin, "lanekit-kubevirt-sidecar"), []byte("bin/sidecar"), 0o600); err != nil {
		t.Fatal(err)
	}
	in.Guest = t.TempDir()
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		if err := os.WriteFile(filepath.Join(in.Guest, f), []byte("guest/"+f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeTar(t, filepath.Join(in.Cache, launcherRoot.key()), map[string]string{"etc/os-release": "launcher"})
	writeTar(t, filepath.Join(in.Cache, handlerRoot.key()), map[string]string{"etc/os-release": "handler"})
	return in
}

// TestKubeVirtImages writes the KubeVirt, Multus and sidecar images from fake
// inputs and reads back what their manifests and virt-launcher rely on.
func TestKubeVirtImages(t *testing.T) {
	in := fakeKubeVirtInputs(t)
	out := t.TempDir()
	if err := run(out, in, kubevirtNames); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, tag, entrypoint, user string
		files                       map[string]string // path in the top layer -> content prefix ("" : any)
		links                       map[string]string
	}{
		{name: "virt-launcher", tag: "quay.io/kubevirt/virt-launcher:v1.9.0", entrypoint: "/usr/bin/virt-launcher", user: "107",
			files: map[string]string{"usr/bin/virt-launcher": "kv/virt-launcher", "usr/bin/virt-launcher-monitor": "kv/",
				"usr/bin/container-disk": "kv/", "usr/bin/node-labeller.sh": "kv/launcher-files/node-labeller.sh",
				"etc/libvirt/qemu.conf": "kv/launcher-files/qemu.conf", "etc/libvirt/virtqemud.conf": "kv/",
				"etc/libvirt/hooks/qemu": "kv/", "etc/nsswitch.conf": "kv/", "usr/bin/libvirt-hook-client": "kv/libvirt-hook-client",
				"usr/sbin/virtqemud": "#!/bin/sh"},
			links: map[string]string{"var/run": "../run"}},
		{name: "virt-handler", tag: "quay.io/kubevirt/virt-handler:v1.9.0", entrypoint: "/usr/bin/virt-handler",
			files: map[string]string{"usr/bin/virt-handler": "kv/virt-handler", "usr/bin/virt-chroot": "kv/virt-chroot"}},
		{name: "virt-operator", tag: "quay.io/kubevirt/virt-operator:v1.9.0", entrypoint: "/usr/bin/virt-operator", user: "1001",
			files: map[string]string{"usr/bin/virt-operator": "kv/virt-operator"}},
		{name: "multus", tag: "ghcr.io/k8snetworkplumbingwg/multus-cni:v4.2.3-thick", entrypoint: "/usr/src/multus-cni/bin/multus-daemon",
			files: map[string]string{"usr/src/multus-cni/bin/multus-daemon": "kv/multus-daemon",
				"usr/src/multus-cni/bin/install_multus": "kv/install_multus", "usr/src/multus-cni/bin/multus-shim": "kv/", "usr/src/multus-cni/bin/passthru": "kv/passthru"}},
		{name: "kubevirt-sidecar", tag: "ghcr.io/lanekit/lanekit-kubevirt-sidecar:v0.1.0", entrypoint: "/usr/bin/lanekit-kubevirt-sidecar",
			files: map[string]string{"usr/bin/lanekit-kubevirt-sidecar": "bin/sidecar"}},
		{name: "virt-exportproxy", tag: "quay.io/kubevirt/virt-exportproxy:v1.9.0", entrypoint: "/usr/bin/virt-exportproxy", user: "1001",
			files: map[string]string{"usr/bin/virt-exportproxy": "kv/virt-exportproxy"}},
		{name: "lanekit-guest", tag: "ghcr.io/lanekit/lanekit-guest:v0.1.0",
			files: map[string]string{"boot/vmlinuz": "guest/vmlinuz", "boot/initrd.img": "guest/initrd.img"}},
	} {
		cf, layers := readImage(t, filepath.Join(out, c.name+".tar"), c.tag)
		var entrypoint []string // the kernel-boot image has none (KubeVirt names the command)
		if c.entrypoint != "" {
			entrypoint = []string{c.entrypoint}
		}
		if !slices.Equal(cf.Config.Entrypoint, entrypoint) || cf.Config.User != c.user {
			t.Errorf("%s: entrypoint %v user %q, want %s %q", c.name, cf.Config.Entrypoint, cf.Config.User, c.entrypoint, c.user)
		}
		top := layers[len(layers)-1]
		for p, want := range c.files {
			if f, ok := top[p]; !ok || !strings.HasPrefix(f.Data, want) || f.Mode&0o444 == 0 {
				t.Errorf("%s: %s = %+v, want content %q", c.name, p, f, want)
			}
		}
		for p, want := range c.links {
			if f := top[p]; f.Link != want {
				t.Errorf("%s: %s links to %q, want %q", c.name, p, f.Link, want)
			}
		}
	}
	// virt-launcher-monitor has CAP_NET_BIND_SERVICE (=ep) as upstream's, to
	// start virt-launcher with it ambient; nothing else has capabilities.
	_, layers := readImage(t, filepath.Join(out, "virt-launcher.tar"), "quay.io/kubevirt/virt-launcher:v1.9.0")
	for p, f := range layers[len(layers)-1] {
		got, ok := f.PAX["SCHILY.xattr.security.capability"]
		switch {
		case p == "usr/bin/virt-launcher-monitor" && got != "\x01\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00":
			t.Errorf("virt-launcher-monitor: security.capability %q, want cap_net_bind_service=ep", got)
		case p != "usr/bin/virt-launcher-monitor" && ok:
			t.Errorf("%s has file capabilities %q", p, got)
		}
	}
	// virt-launcher (107) replaces the QEMU hook with a link.
	for _, p := range []string{"etc/libvirt/hooks", "etc/libvirt/hooks/qemu"} {
		if f := layers[len(layers)-1][p]; f.UID != 107 {
			t.Errorf("virt-launcher: %s owned by %d, want 107", p, f.UID)
		}
	}
	// The wrapper runs libvirtd with virt-launcher's arguments, its socket
	// linked under the name virt-launcher dials.
	for _, want := range []string{`ln -sf libvirt-sock "$d/virtqemud-sock"`, `exec /usr/sbin/libvirtd "$@"`} {
		if !strings.Contains(virtqemud, want) {
			t.Errorf("virtqemud wrapper lacks %q", want)
		}
	}
}

// TestLauncherRootTakesBackports: libvirt and QEMU come from
// bookworm-backports (11.3, 10.0), added as a second source.
func TestLauncherRootTakesBackports(t *testing.T) {
	args := strings.Join(launcherRoot.args("OUT"), "\n")
	for _, want := range []string{"libvirt-daemon/bookworm-backports", "qemu-system-x86/bookworm-backports",
		"\ndeb http://deb.debian.org/debian bookworm-backports main"} {
		if !strings.Contains(args, want) {
			t.Errorf("launcher rootfs recipe lacks %q:\n%s", want, args)
		}
	}
	// virt-handler looks the qemu user up by name (107, as the launcher's).
	for _, r := range []debian{launcherRoot, handlerRoot} {
		if a := strings.Join(r.args("OUT"), "\n"); !strings.Contains(a, "useradd -u 107 -g 107") {
			t.Errorf("%s root has no qemu user 107:\n%s", r.Name, a)
		}
	}
	if strings.Contains(strings.Join(slim.args("OUT"), " "), "backports") {
		t.Error("the slim root takes backports")
	}
}

// TestLauncherRootRunsLibvirt runs the virtqemud wrapper on the cached
// virt-launcher root as virt-launcher does non-root (uid 107,
// XDG_RUNTIME_DIR=/var/run, `virtqemud -f /var/run/libvirt/virtqemud.conf`)
// and connects to it at the URI virt-launcher dials: libvirt 11.3 must answer
// with QEMU 10.0. Root (chroot, mount namespace); skips when the root is not
// cached (make kubevirt-images builds it).
func TestLauncherRootRunsLibvirt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot and a mount namespace")
	}
	root := filepath.Join(defaultCache(), launcherRoot.key())
	if _, err := os.Stat(root); err != nil {
		t.Skipf("launcher root not cached (%v): make kubevirt-images", err)
	}
	dir := t.TempDir()
	rfs := filepath.Join(dir, "root")
	if err := os.MkdirAll(rfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xf", root, "-C", rfs).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(rfs, "usr/sbin/virtqemud"), []byte(virtqemud), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"dev", "run", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Upstream's cmd/virt-launcher/virtqemud.conf.
	conf := "listen_tls = 0\nlisten_tcp = 0\nlog_outputs = \"1:stderr\"\n"
	inner := `mkdir -p /var/run/libvirt && chown 107:107 /var/run/libvirt && printf '` + conf + `' > /var/run/libvirt/virtqemud.conf
su -s /bin/sh qemu -c 'XDG_RUNTIME_DIR=/var/run HOME=/home/qemu /usr/sbin/virtqemud -f /var/run/libvirt/virtqemud.conf >/tmp/vq.log 2>&1 &'
for i in $(seq 50); do [ -S /var/run/libvirt/libvirt-sock ] && break; sleep 0.2; done
su -s /bin/sh qemu -c 'virsh -c "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock" version' || { cat /tmp/vq.log; exit 1; }`
	script := `set -e; mount -t tmpfs tmpfs "$1/run"; mount -t tmpfs tmpfs "$1/tmp"; mount --rbind /dev "$1/dev"; exec chroot "$1" sh -ec "$2"`
	cmd := exec.Command("timeout", "60", "unshare", "--mount", "--pid", "--fork", "--mount-proc="+filepath.Join(rfs, "proc"),
		"sh", "-c", script, "sh", rfs, inner)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("virtqemud wrapper on the launcher root: %v\n%s", err, out)
	}
	for _, want := range []string{"Using library: libvirt 11.3.0", "Running hypervisor: QEMU 10.0."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("virsh version lacks %q:\n%s", want, out)
		}
	}
}
