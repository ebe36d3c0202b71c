package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// repoRoot is the repository root, from this package's directory.
const repoRoot = "../../.."

// tarFile is one entry of a layer as read back.
type tarFile struct {
	Mode int64
	Type byte
	Link string
	Data string
	PAX  map[string]string
	UID  int
}

// writeTar writes a tar of regular files (path -> content) to file.
func writeTar(t *testing.T, file string, files map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for p, c := range files {
		if err := tw.WriteHeader(&tar.Header{Name: p, Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeInputs fills a bin dir, a node-bins dir and a rootfs cache (the cache
// files under the names the recipes look up, so mmdebstrap never runs) with
// small files whose content names them.
func fakeInputs(t *testing.T) inputs {
	t.Helper()
	d := t.TempDir()
	in := inputs{Bin: filepath.Join(d, "bin"), AgentGo: filepath.Join(d, "bin"), NodeBins: filepath.Join(d, "node"), Cache: filepath.Join(d, "cache")}
	for _, f := range []string{in.Bin, filepath.Join(in.NodeBins, "agnhost-porter"), in.Cache} {
		if err := os.MkdirAll(f, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range agentBins {
		if err := os.WriteFile(filepath.Join(in.Bin, b), []byte("bin/"+b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"cilium/bpf/include"} {
		if err := os.MkdirAll(filepath.Join(in.NodeBins, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"pause", "agnhost", "coredns", "regression-issue-74839", "agnhost-porter/localhost.crt", "agnhost-porter/localhost.key", "kube-proxy", "flanneld",
		"cilium-agent", "cilium-dbg", "cilium-cni", "cilium-operator-generic", "cilium/init-container.sh", "cilium/install-plugin.sh",
		"cilium/cni-uninstall.sh", "cilium/bpf/bpf_lxc.c", "cilium/bpf/include/bpf.h"} {
		if err := os.WriteFile(filepath.Join(in.NodeBins, b), []byte("node/"+b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeTar(t, filepath.Join(in.Cache, slim.key()), map[string]string{"etc/os-release": "slim", "bin/sh": "sh"})
	writeTar(t, filepath.Join(in.Cache, agnhostRoot.key()), map[string]string{"etc/os-release": "agnhost", "usr/bin/curl": "curl"})
	writeTar(t, filepath.Join(in.Cache, netRoot.key()), map[string]string{"etc/os-release": "netroot", "usr/sbin/iptables": "iptables"})
	writeTar(t, filepath.Join(in.Cache, ciliumRoot.key()), map[string]string{"etc/os-release": "cilium", "usr/bin/clang-19": "clang"})
	return in
}

// readImage loads the image tagged tag from the archive and returns its config
// and the entries of each layer, bottom first.
func readImage(t *testing.T, file, tag string) (*v1.ConfigFile, []map[string]tarFile) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(file, &ref)
	if err != nil {
		t.Fatalf("%s: image %s: %v", file, tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]tarFile
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]tarFile{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimSuffix(h.Name, "/")] = tarFile{Mode: h.Mode, Type: h.Typeflag, Link: h.Linkname, Data: string(data), PAX: h.PAXRecords, UID: h.Uid}
		}
		rc.Close()
		out = append(out, files)
	}
	return cf, out
}

// TestImagesReadBack writes every image from fake inputs and reads each back
// under each of its tags: config, base layer, and the files on top (content,
// mode, symlinks, parent directories).
func TestImagesReadBack(t *testing.T) {
	in := fakeInputs(t)
	out := t.TempDir()
	if err := run(out, in, append(slices.Clone(names), rivalNames...)); err != nil {
		t.Fatal(err)
	}
	type want struct {
		tags       []string
		entrypoint []string
		cmd        []string
		env        []string
		base       map[string]string  // base layer: path -> content; nil: no base
		files      map[string]tarFile // top layer
	}
	reg := func(data string) tarFile { return tarFile{Mode: 0o755, Type: tar.TypeReg, Data: data} }
	dir := tarFile{Mode: 0o755, Type: tar.TypeDir}
	agentFiles := map[string]tarFile{"opt": dir, "opt/lanekit": dir, "opt/lanekit/bin": dir}
	for _, b := range agentBins {
		agentFiles["opt/lanekit/bin/"+b] = reg("bin/" + b)
	}
	cases := map[string]want{
		"pause": {tags: []string{"registry.k8s.io/pause:3.10.2"}, entrypoint: []string{"/pause"},
			files: map[string]tarFile{"pause": reg("node/pause")}},
		"coredns": {tags: []string{"registry.k8s.io/coredns/coredns:v1.15.0"}, entrypoint: []string{"/coredns"},
			files: map[string]tarFile{"coredns": reg("node/coredns")}},
		"busybox": {tags: []string{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2"}, cmd: []string{"sh"},
			env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			base: map[string]string{"etc/os-release": "agnhost", "usr/bin/curl": "curl"}},
		"regression": {tags: []string{"registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"},
			entrypoint: []string{"/regression-issue-74839"},
			files:      map[string]tarFile{"regression-issue-74839": reg("node/regression-issue-74839")}},
		"kube-proxy": {tags: []string{"registry.k8s.io/kube-proxy:v1.37.2"},
			env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			base: map[string]string{"etc/os-release": "netroot", "usr/sbin/iptables": "iptables"},
			files: map[string]tarFile{"usr": dir, "usr/local": dir, "usr/local/bin": dir,
				"usr/local/bin/kube-proxy": reg("node/kube-proxy")}},
		"flannel": {tags: []string{"ghcr.io/flannel-io/flannel:v0.28.10"}, entrypoint: []string{"/opt/bin/flanneld"},
			env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			base:  map[string]string{"etc/os-release": "netroot", "usr/sbin/iptables": "iptables"},
			files: map[string]tarFile{"opt": dir, "opt/bin": dir, "opt/bin/flanneld": reg("node/flanneld")}},
		"cilium": {tags: []string{"quay.io/cilium/cilium:v1.19.0"}, cmd: []string{"/usr/bin/cilium-dbg"},
			env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "INITSYSTEM=SYSTEMD"},
			base: map[string]string{"etc/os-release": "cilium", "usr/bin/clang-19": "clang"},
			files: map[string]tarFile{"usr": dir, "usr/bin": dir, "opt": dir, "opt/cni": dir, "opt/cni/bin": dir,
				"usr/bin/cilium-agent": reg("node/cilium-agent"), "usr/bin/cilium-dbg": reg("node/cilium-dbg"),
				"opt/cni/bin/cilium-cni": reg("node/cilium-cni"), "init-container.sh": reg("node/cilium/init-container.sh"),
				"install-plugin.sh": reg("node/cilium/install-plugin.sh"), "cni-uninstall.sh": reg("node/cilium/cni-uninstall.sh"),
				"var": dir, "var/lib": dir, "var/lib/cilium": dir, "var/lib/cilium/bpf": dir, "var/lib/cilium/bpf/include": dir,
				// The BPF sources keep their (non-executable) mode: 0644.
				"var/lib/cilium/bpf/bpf_lxc.c":     {Mode: 0o644, Type: tar.TypeReg, Data: "node/cilium/bpf/bpf_lxc.c"},
				"var/lib/cilium/bpf/include/bpf.h": {Mode: 0o644, Type: tar.TypeReg, Data: "node/cilium/bpf/include/bpf.h"},
			}},
		"cilium-operator": {tags: []string{"quay.io/cilium/operator-generic:v1.19.0"},
			env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			base:  map[string]string{"etc/os-release": "slim", "bin/sh": "sh"},
			files: map[string]tarFile{"usr": dir, "usr/bin": dir, "usr/bin/cilium-operator-generic": reg("node/cilium-operator-generic")}},
		"agent": {tags: []string{"ghcr.io/lanekit/lanekit-agent:v0.1.0"},
			entrypoint: []string{"/opt/lanekit/bin/lanekitd"},
			env:        []string{"PATH=/opt/lanekit/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			base:       map[string]string{"etc/os-release": "slim", "bin/sh": "sh"},
			files:      agentFiles},
		"agnhost": {tags: []string{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", "registry.k8s.io/e2e-test-images/agnhost:2.55",
			"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"},
			entrypoint: []string{"/agnhost"}, cmd: []string{"pause"},
			env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			base: map[string]string{"etc/os-release": "agnhost", "usr/bin/curl": "curl"},
			files: map[string]tarFile{
				"agnhost":             reg("node/agnhost"),
				"coredns":             reg("node/coredns"),
				"agnhost-2":           {Mode: 0o777, Type: tar.TypeSymlink, Link: "agnhost"},
				"usr/local/bin/iperf": {Mode: 0o777, Type: tar.TypeSymlink, Link: "/usr/bin/iperf"},
				"usr":                 dir,
				"usr/local":           dir,
				"usr/local/bin":       dir,
				"localhost.crt":       {Mode: 0o644, Type: tar.TypeReg, Data: "node/agnhost-porter/localhost.crt"},
				"localhost.key":       {Mode: 0o644, Type: tar.TypeReg, Data: "node/agnhost-porter/localhost.key"},
			}},
	}
	for n, w := range cases {
		file := filepath.Join(out, n+".tar")
		m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
		if err != nil {
			t.Fatalf("%s: manifest.json: %v", n, err)
		}
		if len(m) != 1 || !slices.Equal(slices.Sorted(slices.Values(m[0].RepoTags)), slices.Sorted(slices.Values(w.tags))) {
			t.Errorf("%s: manifest.json RepoTags %v, want one image tagged %v", n, m, w.tags)
		}
		for _, tag := range w.tags {
			cf, layers := readImage(t, file, tag)
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("%s: platform %s/%s", tag, cf.OS, cf.Architecture)
			}
			if !slices.Equal(cf.Config.Entrypoint, w.entrypoint) || !slices.Equal(cf.Config.Cmd, w.cmd) ||
				!slices.Equal(cf.Config.Env, w.env) {
				t.Errorf("%s: entrypoint %q cmd %q env %q, want %q %q %q", tag,
					cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env, w.entrypoint, w.cmd, w.env)
			}
			wantLayers := 0
			if w.base != nil {
				wantLayers++
			}
			if w.files != nil {
				wantLayers++
			}
			if len(layers) != wantLayers || len(cf.RootFS.DiffIDs) != wantLayers {
				t.Fatalf("%s: %d layers, %d diff ids, want %d", tag, len(layers), len(cf.RootFS.DiffIDs), wantLayers)
			}
			if w.base != nil {
				for p, c := range w.base {
					if got := layers[0][p].Data; got != c {
						t.Errorf("%s: base layer %s = %q, want %q", tag, p, got, c)
					}
				}
			}
			if w.files == nil {
				continue // the base alone (busybox)
			}
			top := layers[len(layers)-1]
			for p, f := range w.files {
				if got, ok := top[p]; !ok || !reflect.DeepEqual(got, f) {
					t.Errorf("%s: %s = %+v (present %v), want %+v", tag, p, got, ok, f)
				}
			}
			for p := range top {
				if p == "var" || strings.HasPrefix(p, "var/registry") {
					continue // agnhost's fake registry: TestFakeRegistryLayout
				}
				if _, ok := w.files[p]; !ok {
					t.Errorf("%s: unexpected %s in the top layer", tag, p)
				}
			}
		}
	}
}

// TestImagesReproducible: the same inputs give the same image digest (no
// wall-clock time or host ownership in the image).
func TestImagesReproducible(t *testing.T) {
	in := fakeInputs(t)
	digest := func() v1.Hash {
		out := t.TempDir()
		if err := run(out, in, []string{"agent"}); err != nil {
			t.Fatal(err)
		}
		ref, _ := name.NewTag(agentImage)
		img, err := tarball.ImageFromPath(filepath.Join(out, "agent.tar"), &ref)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := digest()
	if err := os.Chtimes(filepath.Join(in.Bin, "lanekitd"), epoch.AddDate(30, 0, 0), epoch.AddDate(30, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if b := digest(); a != b {
		t.Errorf("agent image digest %s then %s", a, b)
	}
}

// TestMissingInput: a missing binary is an error naming it, not an image
// without it.
func TestMissingInput(t *testing.T) {
	in := fakeInputs(t)
	if err := os.Remove(filepath.Join(in.Bin, "lanekit-vhost")); err != nil {
		t.Fatal(err)
	}
	err := run(t.TempDir(), in, []string{"agent"})
	if err == nil || !strings.Contains(err.Error(), "lanekit-vhost") {
		t.Fatalf("err = %v, want one naming lanekit-vhost", err)
	}
	if err := run(t.TempDir(), in, []string{"nginx"}); err == nil {
		t.Fatal("unknown image: no error")
	}
}

// TestDefaultsLeaveOutMissingOptional: with only make k8s-lab-bins' node
// binaries the default set leaves the conformance-only regression image out
// and says so; named, its missing binary is still an error.
func TestDefaultsLeaveOutMissingOptional(t *testing.T) {
	in := fakeInputs(t)
	var note strings.Builder
	got := withoutMissingOptional(names, in.NodeBins, &note)
	if !slices.Contains(got, "regression") || note.Len() != 0 {
		t.Fatalf("binary present: %v, note %q; want regression kept, no note", got, note.String())
	}
	if err := os.Remove(filepath.Join(in.NodeBins, optionalNodeFiles["regression"])); err != nil {
		t.Fatal(err)
	}
	got = withoutMissingOptional(names, in.NodeBins, &note)
	if slices.Contains(got, "regression") || !slices.Contains(got, "busybox") || len(got) != len(names)-1 {
		t.Errorf("binary missing: %v, want names less regression", got)
	}
	if !strings.Contains(note.String(), "make k8s-node-bins") {
		t.Errorf("note %q does not say how to build it", note.String())
	}
	out := t.TempDir()
	if err := run(out, in, nil); err != nil {
		t.Fatalf("the default set without regression-issue-74839: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "regression.tar")); err == nil {
		t.Error("regression.tar written without its binary")
	}
	if _, err := os.Stat(filepath.Join(out, "busybox.tar")); err != nil {
		t.Errorf("the rest of the default set: %v", err)
	}
	if err := run(t.TempDir(), in, []string{"regression"}); err == nil || !strings.Contains(err.Error(), "regression-issue-74839") {
		t.Errorf("named regression without its binary: err = %v, want one naming it", err)
	}
}

// TestDebianRecipe: mmdebstrap's arguments, and a cache key that changes with
// the recipe (a stale rootfs is never reused for a new package list).
func TestDebianRecipe(t *testing.T) {
	args := agnhostRoot.args("/x/out.tar")
	n := len(args)
	if n < 3 || !slices.Equal(args[n-3:], []string{"bookworm", "/x/out.tar", "http://deb.debian.org/debian"}) {
		t.Errorf("args end %q", args)
	}
	for _, a := range []string{"--variant=minbase", "--include=bash,curl,wget,netcat-openbsd,iproute2,dnsutils,socat,iperf,iputils-ping,procps"} {
		if !slices.Contains(args, a) {
			t.Errorf("args %q lack %s", args, a)
		}
	}
	if slices.ContainsFunc(slim.args("o.tar"), func(a string) bool { return strings.HasPrefix(a, "--include") }) {
		t.Errorf("slim installs packages: %q", slim.args("o.tar"))
	}
	other := agnhostRoot
	other.Packages = append(slices.Clone(other.Packages), "tcpdump")
	if other.key() == agnhostRoot.key() || slim.key() == agnhostRoot.key() {
		t.Errorf("cache keys do not follow the recipe: %s %s %s", slim.key(), agnhostRoot.key(), other.key())
	}
}

// TestNamesMatchUpstream: the tags are the names the DaemonSet, the e2e tests
// and containerd pull, and the versions scripts/k8s-node-bins.sh builds.
func TestNamesMatchUpstream(t *testing.T) {
	ds, err := os.ReadFile(filepath.Join(repoRoot, "deploy/daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	imgs := regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllStringSubmatch(string(ds), -1)
	if len(imgs) == 0 {
		t.Fatal("no image in deploy/daemonset.yaml")
	}
	for _, m := range imgs {
		if m[1] != agentImage {
			t.Errorf("deploy/daemonset.yaml runs %s, lkimages writes %s", m[1], agentImage)
		}
	}
	script, err := os.ReadFile(filepath.Join(repoRoot, "scripts/k8s-node-bins.sh"))
	if err != nil {
		t.Fatal(err)
	}
	pin := func(v string) string {
		m := regexp.MustCompile(`(?m)^` + v + `=(\S+)`).FindStringSubmatch(string(script))
		if m == nil {
			t.Fatalf("no %s in scripts/k8s-node-bins.sh", v)
		}
		return m[1]
	}
	if want := "registry.k8s.io/pause:" + pin("PAUSE_VERSION"); pauseImage != want {
		t.Errorf("pause image %s, the script builds %s", pauseImage, want)
	}
	if want := "registry.k8s.io/coredns/coredns:" + pin("COREDNS_VERSION"); corednsImage != want {
		t.Errorf("coredns image %s, the script builds %s", corednsImage, want)
	}
	if want := "registry.k8s.io/kube-proxy:" + pin("K8S_VERSION"); kubeProxyImage != want {
		t.Errorf("kube-proxy image %s, the script builds %s", kubeProxyImage, want)
	}
	if want := "ghcr.io/flannel-io/flannel:" + pin("FLANNEL_VERSION"); flannelImage != want {
		t.Errorf("flannel image %s, the script builds %s", flannelImage, want)
	}
	if want := "quay.io/cilium/cilium:" + pin("CILIUM_VERSION"); ciliumImage != want {
		t.Errorf("cilium image %s, the script builds %s", ciliumImage, want)
	}
	if want := "quay.io/cilium/operator-generic:" + pin("CILIUM_VERSION"); ciliumOperatorImage != want {
		t.Errorf("cilium operator image %s, the script builds %s", ciliumOperatorImage, want)
	}
	// The e2e tests' image list, when the module is in the local cache (no download in tests).
	t.Run("e2e manifest", func(t *testing.T) {
		modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			t.Skipf("go env GOMODCACHE: %v", err)
		}
		manifest := filepath.Join(strings.TrimSpace(string(modcache)), "k8s.io/kubernetes@"+pin("K8S_VERSION"), "test/utils/image/manifest.go")
		src, err := os.ReadFile(manifest)
		if err != nil {
			t.Skipf("e2e image list not in the module cache (scripts/k8s-node-bins.sh downloads it): %v", err)
		}
		for _, w := range []struct{ key, tag string }{{"Agnhost", agnhostImage}, {"AgnhostPrev", agnhostPrev}, {"GlibcDnsTesting", glibcDNSImage}, {"Pause", pauseImage}} {
			m := regexp.MustCompile(`configs\[` + w.key + `\] = Config\{[^,]+, "([^"]+)", "([^"]+)"\}`).FindStringSubmatch(string(src))
			if m == nil {
				t.Errorf("%s: no configs[%s] entry", manifest, w.key)
				continue
			}
			if !strings.HasSuffix(w.tag, "/"+m[1]+":"+m[2]) {
				t.Errorf("e2e %s is %s:%s, lkimages writes %s", w.key, m[1], m[2], w.tag)
			}
		}
	})
}

// TestAgentGoBuild: the agent's Go binaries are built with the Containerfile's
// own go build line (environment, flags, packages), read from the file.
func TestAgentGoBuild(t *testing.T) {
	recipe, err := os.ReadFile(filepath.Join(repoRoot, containerfile))
	if err != nil {
		t.Fatal(err)
	}
	env, flags, pkgs, err := agentGoBuild(string(recipe))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(env, []string{"CGO_ENABLED=0"}) || !slices.Contains(flags, "-trimpath") ||
		!slices.Equal(pkgs, []string{"./cmd/lanekitd", "./cmd/lanekit-cni", "./cmd/lanekit"}) {
		t.Errorf("%s: env %q flags %q packages %q", containerfile, env, flags, pkgs)
	}
	line := "RUN go generate ./pkg/... \\\n    && CGO_ENABLED=0 go build -trimpath -tags nolab -o /out/ ./cmd/lanekitd ./cmd/lanekit\n"
	if _, flags, pkgs, err := agentGoBuild(line); err != nil || !slices.Equal(flags, []string{"-trimpath", "-tags", "nolab"}) ||
		!slices.Equal(pkgs, []string{"./cmd/lanekitd", "./cmd/lanekit"}) {
		t.Errorf("tags line: flags %q packages %q err %v", flags, pkgs, err)
	}
	if _, _, _, err := agentGoBuild("RUN cargo build\n"); err == nil {
		t.Error("no go build line: no error")
	}
}
