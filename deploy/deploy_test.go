package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/pkg/cniplugin"
)

// watched is what the agent reads from the API server; RBAC must grant
// exactly get/list/watch on these and nothing else.
var watched = []struct{ group, resource string }{
	{"", "nodes"},
	{"", "pods"},
	{"", "namespaces"},
	{"", "services"},
	{"discovery.k8s.io", "endpointslices"},
	{"networking.k8s.io", "networkpolicies"},
	// a VM attachment's VMI (get), VMI migrations on this node (list/watch)
	{"kubevirt.io", "virtualmachineinstances"},
}

// read are resources the agent only gets.
var read = []struct{ group, resource string }{
	// a migration target's CNI ADD: the migration its launcher pod names
	{"kubevirt.io", "virtualmachineinstancemigrations"},
}

var readVerbs = []string{"get", "list", "watch"}

const (
	agentImage   = "ghcr.io/lanekit/lanekit-agent"
	sidecarImage = "ghcr.io/lanekit/lanekit-kubevirt-sidecar"
)

// manifests is the kustomization's resources, decoded.
type manifests struct {
	ns   *corev1.Namespace
	sa   *corev1.ServiceAccount
	cr   *rbacv1.ClusterRole
	crb  *rbacv1.ClusterRoleBinding
	cm   *corev1.ConfigMap
	ds   *appsv1.DaemonSet
	kust kustomization
}

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// strictYAML decodes YAML into v, failing on unknown or duplicate fields.
func strictYAML(t *testing.T, data []byte, v any) {
	t.Helper()
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatal(err)
	}
	// Case-sensitive like the API server (encoding/json would take
	// "downwardApi" for "downwardAPI").
	strict, err := sigsjson.UnmarshalStrict(j, v)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range strict {
		t.Fatal(e)
	}
}

func load(t *testing.T) manifests {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ser := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})

	var m manifests
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	strictYAML(t, data, &m.kust)
	for _, f := range m.kust.Resources {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("kustomization resource: %v", err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			obj, _, err := ser.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			switch o := obj.(type) {
			case *corev1.Namespace:
				m.ns = o
			case *corev1.ServiceAccount:
				m.sa = o
			case *rbacv1.ClusterRole:
				m.cr = o
			case *rbacv1.ClusterRoleBinding:
				m.crb = o
			case *corev1.ConfigMap:
				m.cm = o
			case *appsv1.DaemonSet:
				m.ds = o
			default:
				t.Fatalf("%s: unexpected %T", f, obj)
			}
		}
	}
	if m.ns == nil || m.sa == nil || m.cr == nil || m.crb == nil || m.cm == nil || m.ds == nil {
		t.Fatalf("missing objects: %+v", m)
	}
	return m
}

func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	// Guard for the guard: the decoder used above does fail on a typo.
	scheme := runtime.NewScheme()
	if err := appsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ser := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      hostNetwrk: true\n")
	if _, _, err := ser.Decode(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "hostNetwrk") {
		t.Fatalf("unknown field accepted: %v", err)
	}
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	m := load(t)
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f != "kustomization.yaml" && !slices.Contains(m.kust.Resources, f) {
			t.Errorf("%s is not in kustomization.yaml resources", f)
		}
	}
	for _, o := range []string{m.sa.Namespace, m.cm.Namespace, m.ds.Namespace} {
		if o != m.ns.Name || m.kust.Namespace != m.ns.Name {
			t.Errorf("namespace %q, kustomization %q, want %q", o, m.kust.Namespace, m.ns.Name)
		}
	}
}

func TestRBACLeastPrivilege(t *testing.T) {
	m := load(t)
	granted := map[string][]string{} // group/resource -> verbs
	for _, r := range m.cr.Rules {
		if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
			t.Errorf("unexpected rule %+v", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if g == "*" || res == "*" || strings.Contains(res, "/") {
					t.Errorf("rule grants %q/%q: no wildcards or subresources", g, res)
				}
				for _, v := range r.Verbs {
					if !slices.Contains(readVerbs, v) {
						t.Errorf("%s/%s: verb %q is more than the agent needs (read only)", g, res, v)
					}
					granted[g+"/"+res] = append(granted[g+"/"+res], v)
				}
			}
		}
	}
	for _, w := range watched {
		for _, v := range readVerbs {
			if !slices.Contains(granted[w.group+"/"+w.resource], v) {
				t.Errorf("agent watches %s/%s but RBAC does not grant %s", w.group, w.resource, v)
			}
		}
		delete(granted, w.group+"/"+w.resource)
	}
	for _, r := range read {
		if v := granted[r.group+"/"+r.resource]; !slices.Equal(v, []string{"get"}) {
			t.Errorf("agent gets %s/%s: RBAC grants %v, want exactly get", r.group, r.resource, v)
		}
		delete(granted, r.group+"/"+r.resource)
	}
	for k := range granted {
		t.Errorf("RBAC grants %s, which the agent does not watch", k)
	}
	if m.crb.RoleRef.Kind != "ClusterRole" || m.crb.RoleRef.Name != m.cr.Name {
		t.Errorf("binding refers to %+v, want ClusterRole %s", m.crb.RoleRef, m.cr.Name)
	}
	if len(m.crb.Subjects) != 1 || m.crb.Subjects[0].Kind != "ServiceAccount" ||
		m.crb.Subjects[0].Name != m.sa.Name || m.crb.Subjects[0].Namespace != m.sa.Namespace {
		t.Errorf("binding subjects %+v, want ServiceAccount %s/%s", m.crb.Subjects, m.sa.Namespace, m.sa.Name)
	}
	if m.ds.Spec.Template.Spec.ServiceAccountName != m.sa.Name {
		t.Errorf("DaemonSet runs as %q, want %q", m.ds.Spec.Template.Spec.ServiceAccountName, m.sa.Name)
	}
}

// flags returns a container's --name=value arguments.
func flags(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		out[k] = v
	}
	return out
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func TestDaemonSet(t *testing.T) {
	m := load(t)
	spec := m.ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("agent must run in the host network namespace")
	}
	if sel := m.ds.Spec.Selector.MatchLabels; len(sel) == 0 {
		t.Error("no selector")
	} else {
		for k, v := range sel {
			if m.ds.Spec.Template.Labels[k] != v {
				t.Errorf("selector %s=%s does not match the template labels", k, v)
			}
		}
	}
	agent := container(t, spec.Containers, "agent")
	install := container(t, spec.InitContainers, "install-cni")
	if agent.SecurityContext == nil || agent.SecurityContext.Privileged == nil || !*agent.SecurityContext.Privileged {
		t.Error("agent must be privileged (BPF, netns, AF_XDP)")
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	keys := m.cm.Data
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		// Same image for the agent and the CNI installer, and one that the
		// kustomization can retag.
		repo, _, _ := strings.Cut(c.Image, ":")
		if repo != agentImage {
			t.Errorf("%s: image %q, want %s:TAG", c.Name, c.Image, agentImage)
		}
		defined := map[string]bool{}
		for _, e := range c.Env {
			defined[e.Name] = true
			if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
				if r.ConfigMapKeyRef.Name != m.cm.Name {
					t.Errorf("%s: env %s from ConfigMap %q, want %q", c.Name, e.Name, r.ConfigMapKeyRef.Name, m.cm.Name)
				}
				if _, ok := keys[r.ConfigMapKeyRef.Key]; !ok {
					t.Errorf("%s: env %s uses ConfigMap key %q, which does not exist", c.Name, e.Name, r.ConfigMapKeyRef.Key)
				}
			}
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			for _, ref := range varRef.FindAllStringSubmatch(a, -1) {
				if !defined[ref[1]] {
					t.Errorf("%s: %q refers to $(%s), which is not in its env", c.Name, a, ref[1])
				}
			}
		}
		for _, vm := range c.VolumeMounts {
			if _, ok := volumes[vm.Name]; !ok {
				t.Errorf("%s: mounts volume %q, which does not exist", c.Name, vm.Name)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		if v.ConfigMap.Name != m.cm.Name {
			t.Errorf("volume %s: ConfigMap %q, want %q", v.Name, v.ConfigMap.Name, m.cm.Name)
		}
		for _, it := range v.ConfigMap.Items {
			if _, ok := keys[it.Key]; !ok {
				t.Errorf("volume %s: ConfigMap key %q does not exist", v.Name, it.Key)
			}
		}
	}

	// The agent's paths are on host mounts, so state, pins and sockets
	// outlive the container (the datapath keeps forwarding while it restarts).
	f := flags(agent)
	hostMount := func(path string) string {
		for _, vm := range agent.VolumeMounts {
			if path == vm.MountPath || strings.HasPrefix(path, vm.MountPath+"/") {
				if v := volumes[vm.Name]; v.HostPath != nil {
					return v.HostPath.Path + strings.TrimPrefix(path, vm.MountPath)
				}
			}
		}
		return ""
	}
	for _, flag := range []string{"state-dir", "socket", "bpf-dir", "vm-socket-dir"} {
		if f[flag] == "" || hostMount(f[flag]) == "" {
			t.Errorf("--%s=%q is not on a hostPath mount", flag, f[flag])
		}
	}
	// VM attachments find launcher pods' volumes under kubelet's directory.
	if root := f["kubelet-root-dir"]; root == "" || hostMount(root+"/pods/x") != root+"/pods/x" {
		t.Errorf("--kubelet-root-dir=%q: its pods directory is not the host's", root)
	}
	if f["node-name"] != "$(NODE_NAME)" {
		t.Errorf("--node-name = %q, want the downward API node name", f["node-name"])
	}

	// Probes hit the agent's health endpoints on the metrics listener, on
	// the node's loopback: the listener is unauthenticated and stays off the
	// node's addresses unless the ConfigMap opts in (agentconfig_test.go).
	port := keys["metrics-port"]
	if f["metrics-listen"] != "$(LANEKIT_METRICS_HOST):$(LANEKIT_METRICS_PORT)" || len(agent.Ports) != 1 ||
		fmt.Sprint(agent.Ports[0].ContainerPort) != port {
		t.Errorf("metrics listener %q / ports %+v do not match metrics-port %q", f["metrics-listen"], agent.Ports, port)
	}
	for probe, path := range map[*corev1.Probe]string{agent.LivenessProbe: "/healthz", agent.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path || probe.HTTPGet.Port.StrVal != agent.Ports[0].Name ||
			probe.HTTPGet.Host != "127.0.0.1" {
			t.Errorf("probe %+v, want GET 127.0.0.1 %s on port %q", probe, path, agent.Ports[0].Name)
		}
	}

	// The init container installs the CNI binary and conflist to the host
	// directories the runtime reads, under the conflist's ConfigMap key.
	script := strings.Join(install.Command, " ")
	for _, want := range []string{"/opt/lanekit/bin/lanekit-cni", "/host/opt/cni/bin/lanekit", "/host/etc/cni/net.d/10-lanekit.conflist"} {
		if !strings.Contains(script, want) {
			t.Errorf("install-cni does not mention %s", want)
		}
	}
	installHost := map[string]string{}
	for _, vm := range install.VolumeMounts {
		if v := volumes[vm.Name]; v.HostPath != nil {
			installHost[vm.MountPath] = v.HostPath.Path
		}
	}
	if installHost["/host/opt/cni/bin"] != "/opt/cni/bin" || installHost["/host/etc/cni/net.d"] != "/etc/cni/net.d" {
		t.Errorf("install-cni host mounts %v", installHost)
	}

	// The CNI type the conflist names is the file the init container writes,
	// and its agentSocket is the agent's --socket.
	checkConflist(t, []byte(keys["10-lanekit.conflist"]), f["socket"])
}

// checkConflist parses a CNI network list the way libcni does and each
// lanekit plugin config the way the plugin does.
func checkConflist(t *testing.T, data []byte, socket string) {
	t.Helper()
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("conflist: %v", err)
	}
	n := 0
	for _, p := range list.Plugins {
		if p.Network.Type != cniplugin.PluginType {
			continue
		}
		n++
		// The runtime hands each plugin its entry plus the list's name and
		// cniVersion.
		var entry map[string]any
		if err := json.Unmarshal(p.Bytes, &entry); err != nil {
			t.Fatal(err)
		}
		entry["name"], entry["cniVersion"] = list.Name, list.CNIVersion
		stdin, err := json.Marshal(entry)
		if err != nil {
			t.Fatal(err)
		}
		conf, err := cniplugin.ParseConf(stdin)
		if err != nil {
			t.Fatalf("lanekit plugin config: %v", err)
		}
		if conf.Socket() != socket {
			t.Errorf("agentSocket %q, agent serves %q", conf.Socket(), socket)
		}
	}
	if n != 1 {
		t.Fatalf("conflist has %d lanekit plugins, want 1", n)
	}
}

// TestContainerfiles checks what can be checked without building: every
// COPY from the build context exists in the repository, every COPY
// --from=stage names a stage of that file, and every binary copied out of a
// builder is one its go build or cargo build produces.
func TestContainerfiles(t *testing.T) {
	files, err := filepath.Glob("images/*.Containerfile")
	if err != nil || len(files) != 2 {
		t.Fatalf("containerfiles: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			fh, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			stages := map[string]string{} // stage name -> its RUN lines
			cur := ""
			var lines []string
			sc := bufio.NewScanner(fh)
			var cont string
			for sc.Scan() {
				l := strings.TrimSpace(sc.Text())
				if strings.HasPrefix(l, "#") || l == "" {
					continue
				}
				if strings.HasSuffix(l, "\\") {
					cont += strings.TrimSuffix(l, "\\") + " "
					continue
				}
				l, cont = cont+l, ""
				lines = append(lines, l)
			}
			copies := 0
			for _, l := range lines {
				fields := strings.Fields(l)
				switch strings.ToUpper(fields[0]) {
				case "FROM":
					cur = ""
					if len(fields) == 4 && strings.EqualFold(fields[2], "AS") {
						cur = fields[3]
						stages[cur] = ""
					}
				case "RUN":
					if cur != "" {
						stages[cur] += l + "\n"
					}
				case "COPY":
					copies++
					args := fields[1:]
					from := ""
					if strings.HasPrefix(args[0], "--from=") {
						from = strings.TrimPrefix(args[0], "--from=")
						args = args[1:]
					}
					for _, src := range args[:len(args)-1] {
						if from == "" {
							if _, err := os.Stat(filepath.Join("..", src)); err != nil {
								t.Errorf("%s: COPY source %s: %v", f, src, err)
							}
							continue
						}
						run, ok := stages[from]
						if !ok {
							t.Errorf("%s: COPY --from=%s: no such stage", f, from)
							continue
						}
						bin := filepath.Base(src)
						if !strings.Contains(run, "./cmd/"+bin) && !strings.Contains(run, "target/release/"+bin) {
							t.Errorf("%s: COPY --from=%s %s: the stage does not build %s", f, from, src, bin)
						}
						if _, err := os.Stat(filepath.Join("..", "cmd", bin)); err != nil && bin != "lanekit-vhost" {
							t.Errorf("%s: %s is not a command in cmd/", f, bin)
						}
					}
				}
			}
			if copies == 0 {
				t.Error("no COPY lines")
			}
		})
	}
}

// TestKustomizeBuild renders the kustomization with kubectl's built-in
// kustomize (when kubectl is installed) and decodes the result strictly:
// what a user applies is what the other tests checked.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	out, err := exec.Command(kubectl, "kustomize", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	m := load(t)
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ser := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
	kinds := map[string]int{}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		obj, gvk, err := ser.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("rendered manifest: %v\n%s", err, doc)
		}
		kinds[gvk.Kind]++
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			for i, c := range ds.Spec.Template.Spec.Containers {
				if c.Image != m.ds.Spec.Template.Spec.Containers[i].Image {
					t.Errorf("rendered image %q, manifest %q", c.Image, m.ds.Spec.Template.Spec.Containers[i].Image)
				}
			}
		}
	}
	want := map[string]int{"Namespace": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "ConfigMap": 1, "DaemonSet": 1}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("rendered kinds %v, want %v", kinds, want)
	}
}

// pendingAgentFlags are DaemonSet flags for agent features that have not
// landed yet (none now: --node-name, the API-server source, has).
var pendingAgentFlags = map[string]bool{}

// lanekitdFlags is the flags the built lanekitd accepts (its -h).
func lanekitdFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := os.Getenv("LANEKIT_BIN")
	if bin == "" {
		t.Skip("skipping: LANEKIT_BIN not set (make test sets it to the built bin/)")
	}
	out, _ := exec.Command(filepath.Join(bin, "lanekitd"), "-h").CombinedOutput()
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	if len(known) == 0 {
		t.Fatalf("lanekitd -h listed no flags:\n%s", out)
	}
	return known
}

// TestDaemonSetFlagsExist runs the built lanekitd -h and checks that every
// flag the DaemonSet passes is one the agent accepts, so the manifest cannot
// drift from the binary silently.
func TestDaemonSetFlagsExist(t *testing.T) {
	known := lanekitdFlags(t)
	agent := container(t, load(t).ds.Spec.Template.Spec.Containers, "agent")
	for f := range flags(agent) {
		switch {
		case pendingAgentFlags[f] && known[f]:
			t.Errorf("--%s has landed in lanekitd: drop it from pendingAgentFlags", f)
		case !pendingAgentFlags[f] && !known[f]:
			t.Errorf("the DaemonSet passes --%s, which lanekitd does not accept", f)
		}
	}
}

// TestSocketLBCgroupMounted: the socket load balancer attaches to the node's
// cgroup2 root, which a container's own cgroup namespace hides. The
// mount-cgroup init container mounts the host's hierarchy (from PID 1's
// cgroup and mount namespaces) where the agent's --cgroup-root points, and the
// agent sees that mount through the run volume's propagation.
func TestSocketLBCgroupMounted(t *testing.T) {
	spec := load(t).ds.Spec.Template.Spec
	agent := container(t, spec.Containers, "agent")
	root := flags(agent)["cgroup-root"]
	if root == "" {
		t.Fatal("the agent has no --cgroup-root")
	}
	mc := container(t, spec.InitContainers, "mount-cgroup")
	cmd := strings.Join(append(mc.Command, mc.Args...), " ")
	for _, want := range []string{"nsenter", "--cgroup=/hostproc/1/ns/cgroup", "--mount=/hostproc/1/ns/mnt", "mount -t cgroup2 none " + root} {
		if !strings.Contains(cmd, want) {
			t.Errorf("mount-cgroup command lacks %q: %s", want, cmd)
		}
	}
	if mc.SecurityContext == nil || mc.SecurityContext.Privileged == nil || !*mc.SecurityContext.Privileged {
		t.Error("mount-cgroup is not privileged: it cannot enter the host's namespaces")
	}
	propagated := false
	for _, m := range agent.VolumeMounts {
		if strings.HasPrefix(root, m.MountPath+"/") && m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationHostToContainer {
			propagated = true
		}
	}
	if !propagated {
		t.Errorf("no agent volume above %s propagates host mounts (HostToContainer)", root)
	}
}
