// Command lkimages writes the container images of a lab node as image
// archives, without a registry: pause, the lanekit agent, agnhost, CoreDNS, the
// conntrack test's regression-issue-74839 and BusyBox (a Debian stand-in),
// each a docker-archive tarball (NAME.tar) tagged with the names the manifests
// (deploy/) and the upstream e2e tests pull, so no pull ever leaves the node.
//
//	go run ./internal/tools/lkimages -out DIR [-bin bin] [-agent-go DIR] [-node-bins DIR] [-kubevirt-bins DIR] [-cache DIR] [pause agent agnhost coredns regression busybox kube-proxy flannel virt-operator virt-api virt-controller virt-handler virt-launcher virt-exportserver virt-exportproxy multus kubevirt-sidecar lanekit-guest]
//
// Inputs: the agent image's Go binaries built the way
// deploy/images/agent.Containerfile builds them (its `go build` line is read and
// run: CGO off, the tags that leave the lab out) plus lanekit-vhost from bin/
// after `make build`, in the Containerfile's layout (it stays the recipe for
// real registries), the node binaries of scripts/k8s-node-bins.sh (pause, agnhost,
// CoreDNS; default: `scripts/k8s-node-bins.sh dir`), and Debian root
// filesystems that mmdebstrap builds from Debian's archive (Debian's
// bookworm-slim stands in for the agent's base, and agnhost's upstream Alpine
// base is replaced by Debian with the tools the e2e tests exec in it), cached
// under -cache. The images are built with go-containerregistry; nothing here
// writes tar or JSON formats by hand.
//
// How the coming `lanekit lab up --k8s --kubelet` uses it: after the lab has
// built the archives once (they depend only on the inputs above), each node's
// containerd imports every archive at node start (`ctr -n k8s.io images import
// --digests NAME.tar`, as kind loads images; TestCtrImport does exactly that),
// before kubelet starts; kubelet's pods use imagePullPolicy
// IfNotPresent (the DaemonSet) or the e2e framework's defaults, which find the
// tags present, and containerd's sandbox image is the pause tag below.
//
// This is a development tool: no shipped binary links it.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/lab"
)

// Image names. The pause and agnhost tags are the e2e tests' (test/utils/image/
// manifest.go at k8s.io/kubernetes v1.37.2; pause is also containerd v2.4's
// default sandbox image), the agent's is deploy/daemonset.yaml's, CoreDNS's is
// the upstream name at the version scripts/k8s-node-bins.sh builds.
const (
	pauseImage   = "registry.k8s.io/pause:3.10.2"
	agentImage   = "ghcr.io/lanekit/lanekit-agent:v0.1.0"
	agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	agnhostPrev  = "registry.k8s.io/e2e-test-images/agnhost:2.55" // AgnhostPrev: same binary
	// GlibcDnsTesting: the DNS tests' prober (sh, dig, getent on glibc; they
	// give its command), which agnhost's Debian root has.
	glibcDNSImage = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	corednsImage  = "registry.k8s.io/coredns/coredns:v1.15.0"
	// RegressionIssue74839: the conntrack test's out-of-window TCP server.
	regressionImage = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
	busyboxImage    = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	// The rivals (lab up --kubelet --cni kube-proxy-*): the names of their
	// upstream manifests at the versions scripts/k8s-node-bins.sh builds.
	kubeProxyImage = "registry.k8s.io/kube-proxy:v1.37.2"
	flannelImage   = "ghcr.io/flannel-io/flannel:v0.28.10"
	// Cilium's chart's image names (values.yaml: image, operator.image with
	// the generic suffix), without its digests.
	ciliumImage         = "quay.io/cilium/cilium:v1.19.0"
	ciliumOperatorImage = "quay.io/cilium/operator-generic:v1.19.0"
	debianMirror        = "http://deb.debian.org/debian"
	debianSuite         = "bookworm"
	defaultOutDir       = "images"
)

// pathEnv is the PATH of Debian's images (bookworm-slim's ENV).
const pathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// agentBins are the binaries of the agent image, as in agent.Containerfile.
var agentBins = []string{"lanekitd", "lanekit-cni", "lanekit", "lanekit-vhost"}

// Debian root filesystems.
var (
	// slim stands in for debian:bookworm-slim (minbase: sh, coreutils, install, mv).
	slim = debian{Name: "slim", Suite: debianSuite, Mirror: debianMirror}
	// agnhostRoot has what the e2e tests exec in agnhost (upstream installs
	// bind-tools curl netcat-openbsd iproute2 iperf bash util-linux-misc socat
	// on Alpine) and the user and group its image defines.
	agnhostRoot = debian{
		Name: "agnhost", Suite: debianSuite, Mirror: debianMirror,
		Packages: []string{"bash", "curl", "wget", "netcat-openbsd", "iproute2", "dnsutils",
			"socat", "iperf", "iputils-ping", "procps"},
		Hooks: []string{
			`chroot "$1" groupadd -g 50000 group-defined-in-image`,
			`chroot "$1" useradd -u 1000 -M -G group-defined-in-image user-defined-in-image`,
			`mkdir -p "$1/uploads"`,
		},
	}
)

// netRoot is the root of the rivals' images: what kube-proxy (iptables,
// nftables, conntrack; upstream: distroless-iptables) and flanneld (iproute2,
// iptables, nftables; upstream: Alpine) run. Debian's iptables is its nft
// backend, as upstream's iptables-wrapper picks on a node without legacy
// rules.
var netRoot = debian{
	Name: "netroot", Suite: debianSuite, Mirror: debianMirror,
	Packages: []string{"iptables", "nftables", "conntrack", "iproute2", "ca-certificates"},
}

// ciliumRoot stands in for quay.io/cilium/cilium-runtime (Ubuntu with clang,
// llvm, iproute2, iptables, ipset, kmod, bash): the agent compiles its BPF at
// start with clang (>= 18; bookworm's clang-19 is 19.1.7, the version Cilium's
// own image ships) and the chart's init containers run bash and mount.
var ciliumRoot = debian{
	Name: "cilium", Suite: debianSuite, Mirror: debianMirror,
	Packages: []string{"clang-19", "llvm-19", "iproute2", "iptables", "ipset", "kmod", "bash", "ca-certificates"},
	Hooks: []string{
		`ln -s clang-19 "$1/usr/bin/clang"`,
		`ln -s llc-19 "$1/usr/bin/llc"`,
	},
}

// inputs are where the images' files come from.
type inputs struct {
	Bin      string // lanekit binaries (make build): lanekit-vhost
	AgentGo  string // the agent image's Go binaries; "": built as the Containerfile does
	NodeBins string // scripts/k8s-node-bins.sh dir
	Cache    string // Debian rootfs cache
	// KubeVirtBins is scripts/kubevirt-bins.sh dir (the KubeVirt and Multus
	// images).
	KubeVirtBins string
	// Guest holds lanekit's test guest (vmlinuz, initrd.img: pkg/guest's
	// cache, built by guest.EnsureImage) for the kernel-boot image.
	Guest string
}

// names are the images in the order they are written by default.
var names = []string{"pause", "agent", "agnhost", "coredns", "regression", "busybox"}

// optionalNodeFiles: images of names that the default set leaves out, with a
// note, when the node binary they carry is missing — make k8s-lab-bins builds
// only what the real-node lab runs with lanekit (no regression-issue-74839,
// which only the upstream conformance run needs); named explicitly, their
// absence is an error.
var optionalNodeFiles = map[string]string{"regression": "regression-issue-74839"}

// rivalNames are written only when named (make k8s-rival-images): the
// images of the rival labs.
var rivalNames = []string{"kube-proxy", "flannel", "cilium", "cilium-operator"}

// specFor returns the spec of the named image, building (or taking from the
// cache) the Debian rootfs it needs.
func specFor(n string, in inputs) (spec, error) {
	node := func(f string) string { return filepath.Join(in.NodeBins, f) }
	if s, ok, err := kubevirtSpec(n, in); ok {
		return s, err
	}
	switch n {
	case "pause":
		return spec{Name: n, Tags: []string{pauseImage},
			Files:      []entry{regular("/pause", node("pause"), 0o755)},
			Entrypoint: []string{"/pause"}}, nil
	case "coredns":
		return spec{Name: n, Tags: []string{corednsImage},
			Files:      []entry{regular("/coredns", node("coredns"), 0o755)},
			Entrypoint: []string{"/coredns"}}, nil
	case "busybox":
		// The tests run BusyBox's sh, sleep and nc; agnhost's Debian root
		// has them (as it stands in for agnhost's Alpine).
		base, err := agnhostRoot.rootfs(in.Cache)
		if err != nil {
			return spec{}, err
		}
		return spec{Name: n, Tags: []string{busyboxImage}, Base: base,
			Env: []string{"PATH=" + pathEnv}, Cmd: []string{"sh"}}, nil
	case "regression":
		return spec{Name: n, Tags: []string{regressionImage},
			Files:      []entry{regular("/regression-issue-74839", node("regression-issue-74839"), 0o755)},
			Entrypoint: []string{"/regression-issue-74839"}}, nil
	case "kube-proxy", "flannel":
		base, err := netRoot.rootfs(in.Cache)
		if err != nil {
			return spec{}, err
		}
		s := spec{Name: n, Base: base, Env: []string{"PATH=" + pathEnv}}
		if n == "kube-proxy" { // its DaemonSet gives the command
			s.Tags, s.Files = []string{kubeProxyImage}, []entry{regular("/usr/local/bin/kube-proxy", node("kube-proxy"), 0o755)}
		} else {
			s.Tags, s.Files = []string{flannelImage}, []entry{regular("/opt/bin/flanneld", node("flanneld"), 0o755)}
			s.Entrypoint = []string{"/opt/bin/flanneld"}
		}
		return s, nil
	case "cilium":
		return ciliumSpec(in)
	case "cilium-operator":
		base, err := slim.rootfs(in.Cache)
		if err != nil {
			return spec{}, err
		}
		return spec{Name: n, Tags: []string{ciliumOperatorImage}, Base: base, Env: []string{"PATH=" + pathEnv},
			Files: []entry{regular("/usr/bin/cilium-operator-generic", node("cilium-operator-generic"), 0o755)}}, nil
	case "agent":
		base, err := slim.rootfs(in.Cache)
		if err != nil {
			return spec{}, err
		}
		s := spec{Name: n, Tags: []string{agentImage}, Base: base,
			Env:        []string{"PATH=/opt/lanekit/bin:" + pathEnv},
			Entrypoint: []string{"/opt/lanekit/bin/lanekitd"}}
		for _, b := range agentBins {
			src := filepath.Join(in.AgentGo, b)
			if b == "lanekit-vhost" {
				src = filepath.Join(in.Bin, b)
			}
			s.Files = append(s.Files, regular("/opt/lanekit/bin/"+b, src, 0o755))
		}
		return s, nil
	case "agnhost":
		base, err := agnhostRoot.rootfs(in.Cache)
		if err != nil {
			return spec{}, err
		}
		reg, err := registryPause(in)
		if err != nil {
			return spec{}, fmt.Errorf("agnhost: fake registry: %w", err)
		}
		return spec{Name: n, Tags: []string{agnhostImage, agnhostPrev, glibcDNSImage}, Base: base,
			Files: append(reg, []entry{
				regular("/agnhost", node("agnhost"), 0o755),
				symlink("/agnhost-2", "agnhost"),
				// Upstream's agnhost image carries CoreDNS too: the DNS
				// tests run it as a pod's custom nameserver (/coredns).
				regular("/coredns", node("coredns"), 0o755),
				symlink("/usr/local/bin/iperf", "/usr/bin/iperf"),
				regular("/localhost.crt", node("agnhost-porter/localhost.crt"), 0o644),
				regular("/localhost.key", node("agnhost-porter/localhost.key"), 0o644),
			}...),
			Env:        []string{"PATH=" + pathEnv},
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}, nil
	}
	return spec{}, fmt.Errorf("unknown image %q (have %s)", n, strings.Join(slices.Concat(names, rivalNames, kubevirtNames), ", "))
}

// ciliumSpec is Cilium's agent image as images/cilium/Dockerfile lays it out
// (install-container-binary: the binaries in /usr/bin, the CNI plugin in
// /opt/cni/bin, the BPF sources in /var/lib/cilium/bpf, the scripts at /),
// without Envoy (cilium-envoy, libcilium.so: C++, not built here) and Hubble.
func ciliumSpec(in inputs) (spec, error) {
	node := func(f string) string { return filepath.Join(in.NodeBins, f) }
	base, err := ciliumRoot.rootfs(in.Cache)
	if err != nil {
		return spec{}, err
	}
	files := []entry{
		regular("/usr/bin/cilium-agent", node("cilium-agent"), 0o755),
		regular("/usr/bin/cilium-dbg", node("cilium-dbg"), 0o755),
		regular("/opt/cni/bin/cilium-cni", node("cilium-cni"), 0o755),
	}
	for _, f := range []string{"init-container.sh", "install-plugin.sh", "cni-uninstall.sh"} {
		files = append(files, regular("/"+f, node("cilium/"+f), 0o755))
	}
	bpf, err := tree("/var/lib/cilium/bpf", node("cilium/bpf"))
	if err != nil {
		return spec{}, fmt.Errorf("cilium: %w", err)
	}
	return spec{Name: "cilium", Tags: []string{ciliumImage}, Base: base, Files: append(files, bpf...),
		Env: []string{"PATH=" + pathEnv, "INITSYSTEM=SYSTEMD"}, WorkingDir: "/home/cilium",
		Cmd: []string{"/usr/bin/cilium-dbg"}}, nil
}

func defaultCache() string {
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	return filepath.Join(c, "lanekit", "rootfs")
}

func main() {
	out := flag.String("out", defaultOutDir, "directory for the archives (NAME.tar)")
	in := inputs{}
	flag.StringVar(&in.Bin, "bin", "bin", "lanekit-vhost (after make build)")
	flag.StringVar(&in.AgentGo, "agent-go", "", "lanekitd, lanekit-cni, lanekit for the agent image (default: built as "+containerfile+" builds them)")
	flag.StringVar(&in.NodeBins, "node-bins", "", "node binaries (default: scripts/k8s-node-bins.sh dir)")
	flag.StringVar(&in.KubeVirtBins, "kubevirt-bins", "", "KubeVirt and Multus binaries (default: scripts/kubevirt-bins.sh dir)")
	flag.StringVar(&in.Cache, "cache", defaultCache(), "cache of the Debian root filesystems")
	flag.StringVar(&in.Guest, "guest", guest.DefaultCacheDir, "lanekit's test guest kernel and initramfs (lanekit-guest image; built by the lab's first VM)")
	flag.Parse()
	if err := run(*out, in, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "lkimages:", err)
		os.Exit(1)
	}
}

// withoutMissingOptional is want less the optionalNodeFiles images whose
// binary is not in nodeBins, each left out with a line on w.
func withoutMissingOptional(want []string, nodeBins string, w io.Writer) []string {
	return slices.DeleteFunc(slices.Clone(want), func(n string) bool {
		f, ok := optionalNodeFiles[n]
		if !ok {
			return false
		}
		if _, err := os.Stat(filepath.Join(nodeBins, f)); err == nil {
			return false
		}
		fmt.Fprintf(w, "lkimages: %s left out: %s is not in %s (make k8s-node-bins builds it; only make conformance needs the image)\n", n, f, nodeBins)
		return true
	})
}

func run(out string, in inputs, want []string) error {
	defaults := len(want) == 0
	if defaults {
		want = names
	}
	if in.NodeBins == "" {
		d, err := exec.Command("scripts/k8s-node-bins.sh", "dir").Output()
		if err != nil {
			return fmt.Errorf("-node-bins not given and scripts/k8s-node-bins.sh dir failed (run from the repo root): %w", err)
		}
		in.NodeBins = strings.TrimSpace(string(d))
	}
	if defaults {
		want = withoutMissingOptional(want, in.NodeBins, os.Stderr)
	}
	if in.KubeVirtBins == "" && slices.ContainsFunc(want, func(n string) bool { return slices.Contains(kubevirtNames, n) }) {
		d, err := exec.Command("scripts/kubevirt-bins.sh", "dir").Output()
		if err != nil {
			return fmt.Errorf("-kubevirt-bins not given and scripts/kubevirt-bins.sh dir failed (run from the repo root): %w", err)
		}
		in.KubeVirtBins = strings.TrimSpace(string(d))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if in.AgentGo == "" && slices.Contains(want, "agent") {
		tmp, err := os.MkdirTemp("", "lkimages-agent-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := buildAgentGo(tmp); err != nil {
			return err
		}
		in.AgentGo = tmp
		// The agent's BPF programs are this tree's, as lkimages' own:
		// lab up refuses an image whose stamp differs from its own.
		if err := os.WriteFile(filepath.Join(out, lab.AgentDatapathStamp), []byte(datapath.ObjectsDigest()+"\n"), 0o644); err != nil {
			return err
		}
	} else if slices.Contains(want, "agent") {
		os.Remove(filepath.Join(out, lab.AgentDatapathStamp)) // binaries from elsewhere: unknown
	}
	for _, n := range want {
		s, err := specFor(n, in)
		if err != nil {
			return err
		}
		f := filepath.Join(out, n+".tar")
		if err := write(s, f); err != nil {
			return err
		}
		fmt.Printf("%s\t%s\n", f, strings.Join(s.Tags, " "))
	}
	return nil
}
