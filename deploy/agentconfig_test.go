package deploy

import (
	"maps"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// expandArgs returns c's --name=value arguments as kubelet runs them with
// data as the ConfigMap: $(VAR) becomes the env var's value; a reference to
// a variable the container does not have (an optional key missing from the
// ConfigMap) stays as it is, as Kubernetes leaves it. Downward-API values
// become "<fieldPath>".
func expandArgs(t *testing.T, c corev1.Container, cmName string, data map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch r := e.ValueFrom; {
		case r == nil:
			env[e.Name] = e.Value
		case r.ConfigMapKeyRef != nil && r.ConfigMapKeyRef.Name == cmName:
			v, ok := data[r.ConfigMapKeyRef.Key]
			if !ok {
				if r.ConfigMapKeyRef.Optional == nil || !*r.ConfigMapKeyRef.Optional {
					t.Errorf("env %s: ConfigMap key %q missing and not optional: the pod would not start", e.Name, r.ConfigMapKeyRef.Key)
				}
				continue
			}
			env[e.Name] = v
		case r.FieldRef != nil:
			env[e.Name] = "<" + r.FieldRef.FieldPath + ">"
		}
	}
	out := map[string]string{}
	for k, v := range flags(corev1.Container{Args: c.Args}) {
		out[k] = varRef.ReplaceAllStringFunc(v, func(ref string) string {
			if val, ok := env[varRef.FindStringSubmatch(ref)[1]]; ok {
				return val
			}
			return ref
		})
	}
	return out
}

// TestConfigMapReachesAgentFlags: the ConfigMap's API-server and metrics
// keys become the agent's flags; the API server address is optional (an
// older ConfigMap without the keys leaves an unexpanded reference, which
// lanekitd reads as unset), and metrics stay on the node's loopback unless
// the ConfigMap says otherwise.
func TestConfigMapReachesAgentFlags(t *testing.T) {
	m := load(t)
	agent := container(t, m.ds.Spec.Template.Spec.Containers, "agent")
	cm := m.cm.Data

	f := expandArgs(t, agent, m.cm.Name, cm)
	if f["k8s-service-host"] != "" || f["k8s-service-port"] != "6443" {
		t.Errorf("default ConfigMap: --k8s-service-host=%q --k8s-service-port=%q, want empty (in-cluster) and 6443",
			f["k8s-service-host"], f["k8s-service-port"])
	}
	host, port, _ := strings.Cut(f["metrics-listen"], ":")
	if a, err := netip.ParseAddr(host); err != nil || !a.IsLoopback() || port != cm["metrics-port"] {
		t.Errorf("default --metrics-listen=%q, want the loopback address and metrics-port %s (no unauthenticated listener on the node's addresses)",
			f["metrics-listen"], cm["metrics-port"])
	}

	set := maps.Clone(cm)
	set["k8s-service-host"], set["k8s-service-port"] = "fd00::10", "8443"
	set["metrics-host"] = "0.0.0.0"
	f = expandArgs(t, agent, m.cm.Name, set)
	if f["k8s-service-host"] != "fd00::10" || f["k8s-service-port"] != "8443" {
		t.Errorf("k8s-service-host/port in the ConfigMap: --k8s-service-host=%q --k8s-service-port=%q", f["k8s-service-host"], f["k8s-service-port"])
	}
	if f["metrics-listen"] != "0.0.0.0:"+cm["metrics-port"] {
		t.Errorf("metrics-host 0.0.0.0: --metrics-listen=%q", f["metrics-listen"])
	}

	old := maps.Clone(cm)
	delete(old, "k8s-service-host")
	delete(old, "k8s-service-port")
	f = expandArgs(t, agent, m.cm.Name, old)
	if f["k8s-service-host"] != "$(LANEKIT_K8S_SERVICE_HOST)" || f["k8s-service-port"] != "$(LANEKIT_K8S_SERVICE_PORT)" {
		t.Errorf("ConfigMap without the keys: --k8s-service-host=%q --k8s-service-port=%q, want the unexpanded references lanekitd reads as unset",
			f["k8s-service-host"], f["k8s-service-port"])
	}
}
