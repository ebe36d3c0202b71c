package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/lbipam"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/lanekit"

// helmOnlyLabels are the labels the chart adds to every object's metadata
// (not to selectors or pod templates); kustomize's objects lack them.
var helmOnlyLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// rendered is a chart rendered as `helm install` would: its objects and
// NOTES.txt.
type rendered struct {
	objs  []*unstructured.Unstructured
	notes string
}

func (r rendered) find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// renderChart renders the chart into namespace ns with sets, each a `helm
// --set` argument; it returns the error of a refused value.
func renderChart(t *testing.T, ns string, sets ...string) (rendered, error) {
	t.Helper()
	c := loadChart(t)
	user := map[string]any{}
	for _, s := range sets {
		if err := strvals.ParseInto(s, user); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	vals, err := chartutil.ToRenderValues(c, user, chartutil.ReleaseOptions{Name: "lanekit", Namespace: ns, Revision: 1, IsInstall: true}, nil)
	if err != nil {
		return rendered{}, err
	}
	files, err := engine.Render(c, vals)
	if err != nil {
		return rendered{}, err
	}
	var r rendered
	for _, name := range slices.Sorted(maps.Keys(files)) {
		switch {
		case strings.HasSuffix(name, "/NOTES.txt"):
			r.notes = files[name]
		case strings.HasSuffix(name, ".yaml"):
			r.objs = append(r.objs, decodeDocs(t, []byte(files[name]))...)
		}
	}
	return r, nil
}

func mustRender(t *testing.T, ns string, sets ...string) rendered {
	t.Helper()
	r, err := renderChart(t, ns, sets...)
	if err != nil {
		t.Fatalf("render %v: %v", sets, err)
	}
	return r
}

// normalize drops what only Helm adds: its labels and the pod template's
// config checksum (which rolls the agents when the ConfigMap changes).
func normalize(o *unstructured.Unstructured) *unstructured.Unstructured {
	o = o.DeepCopy()
	labels := o.GetLabels()
	for _, l := range helmOnlyLabels {
		delete(labels, l)
	}
	if len(labels) == 0 {
		unstructured.RemoveNestedField(o.Object, "metadata", "labels")
	} else {
		o.SetLabels(labels)
	}
	unstructured.RemoveNestedField(o.Object, "spec", "template", "metadata", "annotations", "checksum/config")
	if a, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "metadata", "annotations"); len(a) == 0 {
		unstructured.RemoveNestedField(o.Object, "spec", "template", "metadata", "annotations")
	}
	return o
}

func objKey(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// diffObjects lists where a and b differ, by field path.
func diffObjects(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		var out []string
		keys := maps.Clone(av)
		maps.Copy(keys, bv)
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			out = append(out, diffObjects(path+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, diffObjects(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: helm %s, kustomize %s", path, short(a), short(b))}
}

func short(v any) string {
	j, _ := json.Marshal(v)
	if len(j) > 200 {
		return string(j[:200]) + "..."
	}
	return string(j)
}

// compareWithKustomize checks that helm's objects are kustomize's, field
// for field, but for Helm's own labels; skip names kustomize objects the
// chart does not render.
func compareWithKustomize(t *testing.T, helm rendered, skip ...string) {
	t.Helper()
	want := map[string]*unstructured.Unstructured{}
	for _, o := range decodeDocs(t, kustomizeBuild(t)) {
		if !slices.Contains(skip, o.GetKind()) {
			want[objKey(o)] = o
		}
	}
	got := map[string]*unstructured.Unstructured{}
	for _, o := range helm.objs {
		got[objKey(o)] = o
		for _, l := range helmOnlyLabels {
			if _, ok := o.GetLabels()[l]; !ok {
				t.Errorf("%s lacks the label %s", objKey(o), l)
			}
		}
	}
	if k1, k2 := slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)); !slices.Equal(k1, k2) {
		t.Fatalf("helm renders %v\nkustomize builds %v", k1, k2)
	}
	for k, w := range want {
		for _, d := range diffObjects(k, normalize(got[k]).Object, w.Object) {
			t.Error(d)
		}
	}
}

// TestHelmChartMatchesKustomize: with its default values the chart renders
// the objects `kubectl apply -k deploy/` applies, field for field (spec,
// data, rules, subjects, the DaemonSet's every container), but for Helm's
// labels and config checksum. The namespace is the release's: by default
// the chart does not create it (Helm stores the release there first);
// namespace.create renders kustomize's Namespace, labels and all.
func TestHelmChartMatchesKustomize(t *testing.T) {
	m := load(t)
	t.Run("defaults", func(t *testing.T) {
		compareWithKustomize(t, mustRender(t, m.kust.Namespace), "Namespace")
	})
	t.Run("namespace.create", func(t *testing.T) {
		compareWithKustomize(t, mustRender(t, m.kust.Namespace, "namespace.create=true"))
	})
}

// TestHelmChartVersions: the chart's appVersion is the image tag the
// kustomization pins, so both install the same release.
func TestHelmChartVersions(t *testing.T) {
	c := loadChart(t)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := load(t)
	for _, img := range m.kust.Images {
		if img.NewTag != c.Metadata.AppVersion {
			t.Errorf("kustomization tags %s %q, chart appVersion %q", img.Name, img.NewTag, c.Metadata.AppVersion)
		}
	}
	if c.Metadata.APIVersion != chart.APIVersionV2 || c.Metadata.Version != "0.1.0" {
		t.Errorf("chart %s version %s", c.Metadata.APIVersion, c.Metadata.Version)
	}
}

// typedDaemonSet converts the rendered DaemonSet for the helpers of
// deploy_test.go and agentconfig_test.go.
func typedDaemonSet(t *testing.T, r rendered) *appsv1.DaemonSet {
	t.Helper()
	o := r.find("DaemonSet", "lanekit-agent")
	if o == nil {
		t.Fatal("no DaemonSet rendered")
	}
	var ds appsv1.DaemonSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
		t.Fatal(err)
	}
	return &ds
}

func configData(t *testing.T, r rendered) map[string]string {
	t.Helper()
	o := r.find("ConfigMap", "lanekit-config")
	if o == nil {
		t.Fatal("no ConfigMap rendered")
	}
	d, _, err := unstructured.NestedStringMap(o.Object, "data")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// agentFlags is the agent's lanekitd flags as kubelet expands them from the
// rendered ConfigMap.
func agentFlags(t *testing.T, r rendered) map[string]string {
	t.Helper()
	ds := typedDaemonSet(t, r)
	return expandArgs(t, container(t, ds.Spec.Template.Spec.Containers, "agent"), "lanekit-config", configData(t, r))
}

// TestHelmValues: each non-default value does what values.yaml says, seen
// where it takes effect (the flags lanekitd gets, the pods' images and
// scheduling, the objects rendered).
func TestHelmValues(t *testing.T) {
	def := mustRender(t, "lanekit-system")
	defFlags := agentFlags(t, def)
	if defFlags["routing-mode"] != "native" || defFlags["metrics-listen"] != "127.0.0.1:9964" {
		t.Fatalf("default flags %v", defFlags)
	}
	checksum := func(r rendered) string {
		return typedDaemonSet(t, r).Spec.Template.Annotations["checksum/config"]
	}

	t.Run("tunnel and the agent settings", func(t *testing.T) {
		r := mustRender(t, "lanekit-system", "config.routingMode=tunnel,config.tunnelPort=4789",
			"config.k8sServiceHost=fd00::10,config.k8sServicePort=8443", "config.mtu=1400,config.deviceMode=veth,config.uplink=eth1",
			"config.metricsHost=0.0.0.0,config.metricsPort=9100")
		f := agentFlags(t, r)
		want := map[string]string{"routing-mode": "tunnel", "tunnel-port": "4789", "k8s-service-host": "fd00::10", "k8s-service-port": "8443",
			"mtu": "1400", "device-mode": "veth", "uplink": "eth1", "metrics-listen": "0.0.0.0:9100"}
		for k, v := range want {
			if f[k] != v {
				t.Errorf("--%s=%q, want %q", k, f[k], v)
			}
		}
		agent := container(t, typedDaemonSet(t, r).Spec.Template.Spec.Containers, "agent")
		if len(agent.Ports) != 1 || agent.Ports[0].ContainerPort != 9100 {
			t.Errorf("ports %+v, want the metrics port 9100", agent.Ports)
		}
		// A changed ConfigMap rolls the agents on upgrade.
		if checksum(r) == checksum(def) || checksum(def) == "" {
			t.Errorf("config checksum %q did not change (default %q)", checksum(r), checksum(def))
		}
		if strings.Contains(r.notes, "WARNING") || !strings.Contains(def.notes, "config.k8sServiceHost is empty") {
			t.Errorf("the notes' kube-proxy warning: with a host %q; default %q", r.notes, def.notes)
		}
	})

	t.Run("image", func(t *testing.T) {
		r := mustRender(t, "lanekit-system", "image.repository=registry.example/lk/agent,image.tag=v9.9.9,image.pullPolicy=Always",
			"imagePullSecrets[0].name=regcred")
		spec := typedDaemonSet(t, r).Spec.Template.Spec
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if c.Image != "registry.example/lk/agent:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("%s: image %q pull %q", c.Name, c.Image, c.ImagePullPolicy)
			}
		}
		if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "regcred" {
			t.Errorf("imagePullSecrets %+v", spec.ImagePullSecrets)
		}
		if checksum(r) != checksum(def) {
			t.Error("the config checksum changed with the image")
		}
	})

	t.Run("scheduling, resources, extra args", func(t *testing.T) {
		r := mustRender(t, "lanekit-system", "nodeSelector.lanekit=yes", "tolerations=null", "priorityClassName=",
			"resources.limits.memory=1Gi", "extraArgs={--nodeport-snat-ports=61000-65535}", "extraEnv[0].name=GOGC,extraEnv[0].value=off",
			"podAnnotations.team=net")
		ds := typedDaemonSet(t, r)
		spec := ds.Spec.Template.Spec
		if spec.NodeSelector["lanekit"] != "yes" || len(spec.Tolerations) != 0 || spec.PriorityClassName != "" {
			t.Errorf("nodeSelector %v tolerations %v priorityClassName %q", spec.NodeSelector, spec.Tolerations, spec.PriorityClassName)
		}
		agent := container(t, spec.Containers, "agent")
		if q := agent.Resources.Limits[corev1.ResourceMemory]; q.String() != "1Gi" || agent.Resources.Requests.Cpu().String() != "100m" {
			t.Errorf("resources %+v", agent.Resources)
		}
		if f := flags(agent); f["nodeport-snat-ports"] != "61000-65535" || f["node-name"] != "$(NODE_NAME)" {
			t.Errorf("args %v", agent.Args)
		}
		if e := agent.Env[len(agent.Env)-1]; e.Name != "GOGC" || e.Value != "off" {
			t.Errorf("last env %+v", e)
		}
		if ds.Spec.Template.Annotations["team"] != "net" || ds.Spec.Template.Annotations["checksum/config"] == "" {
			t.Errorf("pod annotations %v", ds.Spec.Template.Annotations)
		}
	})

	t.Run("features off", func(t *testing.T) {
		r := mustRender(t, "lanekit-system", "features.bigTCP=false,features.bandwidthManager=false")
		f := agentFlags(t, r)
		if f["big-tcp"] != "false" || f["bandwidth-manager"] != "false" {
			t.Errorf("--big-tcp=%q --bandwidth-manager=%q, want false", f["big-tcp"], f["bandwidth-manager"])
		}
		if _, on := defFlags["big-tcp"]; on {
			t.Error("the default passes --big-tcp (lanekitd's default is on)")
		}
	})

	t.Run("release namespace", func(t *testing.T) {
		r := mustRender(t, "kube-system")
		for _, o := range r.objs {
			if o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" && o.GetNamespace() != "kube-system" {
				t.Errorf("%s not in the release namespace", objKey(o))
			}
		}
		subj, _, _ := unstructured.NestedSlice(r.find("ClusterRoleBinding", "lanekit-agent").Object, "subjects")
		if len(subj) != 1 || subj[0].(map[string]any)["namespace"] != "kube-system" {
			t.Errorf("binding subjects %v", subj)
		}
		if !strings.Contains(r.notes, "kubectl -n kube-system exec ds/lanekit-agent -- lanekit status --wait") ||
			!strings.Contains(r.notes, "lanekit connectivity test") {
			t.Errorf("notes do not say how to check:\n%s", r.notes)
		}
	})

	t.Run("kubevirt", func(t *testing.T) {
		if def.find("NetworkAttachmentDefinition", "lanekit-vm") != nil || strings.Contains(def.notes, "kubectl patch kubevirt") {
			t.Error("kubevirt.enabled=false renders the binding")
		}
		on := mustRender(t, "lanekit-system", "kubevirt.enabled=true")
		nadObj := on.find("NetworkAttachmentDefinition", "lanekit-vm")
		if nadObj == nil || len(on.objs) != len(def.objs)+1 {
			t.Fatalf("kubevirt.enabled=true renders %d objects (default %d), NAD %v", len(on.objs), len(def.objs), nadObj)
		}
		// The NAD is deploy/kubevirt's example, field for field.
		data, err := os.ReadFile("kubevirt/nad-example.yaml")
		if err != nil {
			t.Fatal(err)
		}
		example := decodeDocs(t, data)[0]
		for _, d := range diffObjects("NAD", normalize(nadObj).Object, example.Object) {
			if !strings.HasPrefix(d, "NAD.spec.config:") {
				t.Error(d)
			}
		}
		var gotConf, wantConf any
		cfg, _, _ := unstructured.NestedString(nadObj.Object, "spec", "config")
		wcfg, _, _ := unstructured.NestedString(example.Object, "spec", "config")
		if json.Unmarshal([]byte(cfg), &gotConf) != nil || json.Unmarshal([]byte(wcfg), &wantConf) != nil || !reflect.DeepEqual(gotConf, wantConf) {
			t.Errorf("NAD config %s, example %s", cfg, wcfg)
		}
		checkConflist(t, []byte(cfg), flags(container(t, typedDaemonSet(t, on).Spec.Template.Spec.Containers, "agent"))["socket"])

		// The notes' patch is deploy/kubevirt/binding-patch.yaml.
		patch := regexp.MustCompile(`kubectl patch kubevirt kubevirt -n kubevirt --type merge -p '([^']*)'`).FindStringSubmatch(on.notes)
		if patch == nil {
			t.Fatalf("notes lack the binding patch:\n%s", on.notes)
		}
		var got, want any
		if err := json.Unmarshal([]byte(patch[1]), &got); err != nil {
			t.Fatal(err)
		}
		data, err = os.ReadFile("kubevirt/binding-patch.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		for _, d := range diffObjects("patch", got, want) {
			t.Error(d)
		}

		moved := mustRender(t, "lanekit-system", "kubevirt.enabled=true", "kubevirt.networkAttachmentDefinition.namespace=vms",
			"kubevirt.networkAttachmentDefinition.name=fast", "kubevirt.sidecarImage.tag=v2")
		if o := moved.find("NetworkAttachmentDefinition", "fast"); o == nil || o.GetNamespace() != "vms" {
			t.Errorf("NAD not moved: %v", o)
		}
		for _, want := range []string{`"sidecarImage":"ghcr.io/lanekit/lanekit-kubevirt-sidecar:v2"`} {
			if !strings.Contains(moved.notes, want) {
				t.Errorf("notes lack %s", want)
			}
		}
	})
}

// TestHelmFlagsExist: every lanekitd flag the chart can pass (each value
// that adds one set) is one the built agent accepts.
func TestHelmFlagsExist(t *testing.T) {
	known := lanekitdFlags(t)
	r := mustRender(t, "lanekit-system", "features.bigTCP=false,features.bandwidthManager=false,kubevirt.enabled=true")
	for f := range flags(container(t, typedDaemonSet(t, r).Spec.Template.Spec.Containers, "agent")) {
		if !known[f] && !pendingAgentFlags[f] {
			t.Errorf("the chart passes --%s, which lanekitd does not accept", f)
		}
	}
}

// TestHelmValuesRefused: values.schema.json refuses what the agent would
// refuse at start (or a misspelt key Helm would otherwise ignore), with an
// error that names the value.
func TestHelmValuesRefused(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"config.routingMode=vxlan", "routingMode"},
		{"config.deviceMode=macvlan", "deviceMode"},
		{"config.tunnelPort=70000", "tunnelPort"},
		{"config.metricsPort=0", "metricsPort"},
		{"config.routingmode=tunnel", "routingmode"},
		{"kubevirt.enable=true", "enable"},
		{"image.pullPolicy=Sometimes", "pullPolicy"},
		{"extraArgs={nodeport-snat-ports=1}", "extraArgs"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := renderChart(t, "lanekit-system", tc.set)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

// TestHelmLoadBalancer: with config.lbIPAM (or l2Announce) the chart renders
// deploy/lb's RBAC, field for field, in the release's namespace, and with
// lbPools the pools ConfigMap, whose document parses to deploy/lb's example
// pools when given the same pools; without them, none of it.
func TestHelmLoadBalancer(t *testing.T) {
	var lbObjs []*unstructured.Unstructured
	var examplePools string
	for _, o := range decodeDocs(t, kustomizeBuildDir(t, "lb")) {
		if o.GetKind() == "ConfigMap" {
			examplePools, _, _ = unstructured.NestedString(o.Object, "data", "pools.yaml")
			continue
		}
		lbObjs = append(lbObjs, o)
	}
	if len(lbObjs) != 4 || examplePools == "" {
		t.Fatalf("deploy/lb builds %d RBAC objects and pools %q; want 4 and the example", len(lbObjs), examplePools)
	}
	for _, o := range mustRender(t, "lanekit-system").objs {
		if strings.HasPrefix(o.GetName(), "lanekit-lb") {
			t.Errorf("rendered by default: %s", objKey(o))
		}
	}
	want, err := lbipam.ParsePools(examplePools)
	if err != nil {
		t.Fatal(err)
	}
	for _, sets := range [][]string{
		{"config.l2Announce=true"},
		{"config.lbIPAM=true", "lbPools[0].name=default,lbPools[0].addresses={192.0.2.0/28,2001:db8:0:1::10-2001:db8:0:1::1f}"},
	} {
		r := mustRender(t, "lanekit-system", sets...)
		for _, w := range lbObjs {
			got := r.find(w.GetKind(), w.GetName())
			if got == nil {
				t.Errorf("%v: no %s", sets, objKey(w))
				continue
			}
			for _, d := range diffObjects(objKey(w), normalize(got).Object, w.Object) {
				t.Errorf("%v: %s", sets, d)
			}
		}
		cm := r.find("ConfigMap", lbipam.DefaultPoolsConfigMap)
		if strings.HasPrefix(sets[0], "config.l2Announce") {
			if cm != nil {
				t.Errorf("%v: a pools ConfigMap without lbIPAM", sets)
			}
			continue
		}
		if cm == nil || cm.GetNamespace() != "lanekit-system" {
			t.Fatalf("%v: no pools ConfigMap in the release's namespace", sets)
		}
		doc, _, _ := unstructured.NestedString(cm.Object, "data", lbipam.PoolsKey)
		got, err := lbipam.ParsePools(doc)
		if err != nil {
			t.Fatalf("rendered pools %q: %v", doc, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("rendered pools %+v, want deploy/lb's %+v (document %q)", got, want, doc)
		}
	}
	if _, err := renderChart(t, "lanekit-system", "config.lbIPAM=true", "lbPools[0].name=x"); err == nil {
		t.Error("a pool without addresses was accepted")
	}
}
