package lab

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// TestParseSubnetEnv: flanneld's subnet.env as it writes it, and the
// mistakes that must be refused with the key named.
func TestParseSubnetEnv(t *testing.T) {
	env, err := parseSubnetEnv([]byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if env.Network.String() != "10.244.0.0/16" || env.Subnet.String() != "10.244.1.1/24" || env.MTU != 1450 || !env.IPMasq {
		t.Errorf("parsed %+v", env)
	}
	for _, c := range []struct{ in, want string }{
		{"FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\n", "no FLANNEL_IPMASQ"},
		{"FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.245.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n", "outside FLANNEL_NETWORK"},
		{"FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=x\nFLANNEL_IPMASQ=true\n", "FLANNEL_MTU"},
		{"FLANNEL_NETWORK=10.244.0.0\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n", "FLANNEL_NETWORK"},
		{"garbage\n", "not KEY=VALUE"},
	} {
		if _, err := parseSubnetEnv([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
}

// TestFlannelConflist: the conflist libcni loads is flannel's delegate:
// bridge cni0 as the node's gateway with flanneld's MTU, host-local over
// the node's range with a route to the cluster network, no masquerade of
// its own when flanneld masquerades, portmap after it.
func TestFlannelConflist(t *testing.T) {
	for _, ipmasq := range []bool{true, false} {
		env, err := parseSubnetEnv([]byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.2.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=" +
			strconv.FormatBool(ipmasq) + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		data, err := flannelConflist(env)
		if err != nil {
			t.Fatal(err)
		}
		list, err := libcni.ConfListFromBytes(data)
		if err != nil {
			t.Fatalf("libcni: %v\n%s", err, data)
		}
		if len(list.Plugins) != 2 || list.Plugins[0].Network.Type != "bridge" || list.Plugins[1].Network.Type != "portmap" {
			t.Fatalf("plugins %+v", list.Plugins)
		}
		var br struct {
			Bridge           string `json:"bridge"`
			IsGateway        bool   `json:"isGateway"`
			IsDefaultGateway bool   `json:"isDefaultGateway"`
			HairpinMode      bool   `json:"hairpinMode"`
			IPMasq           bool   `json:"ipMasq"`
			MTU              int    `json:"mtu"`
			IPAM             struct {
				Type   string                `json:"type"`
				Ranges [][]map[string]string `json:"ranges"`
				Routes []map[string]string   `json:"routes"`
			} `json:"ipam"`
		}
		if err := json.Unmarshal(list.Plugins[0].Bytes, &br); err != nil {
			t.Fatal(err)
		}
		if br.Bridge != "cni0" || !br.IsGateway || !br.IsDefaultGateway || !br.HairpinMode || br.MTU != 1450 || br.IPMasq == ipmasq {
			t.Errorf("ipmasq %t: bridge %+v", ipmasq, br)
		}
		if br.IPAM.Type != "host-local" || len(br.IPAM.Ranges) != 1 || br.IPAM.Ranges[0][0]["subnet"] != "10.244.2.0/24" ||
			len(br.IPAM.Routes) != 1 || br.IPAM.Routes[0]["dst"] != "10.244.0.0/16" {
			t.Errorf("ipam %+v", br.IPAM)
		}
	}
}

// decodeManifest splits a rendered manifest into its objects by kind.
func decodeManifest(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("manifest document: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("%s %s: %v", meta.Kind, meta.Metadata.Name, err)
		}
		out[meta.Kind+"/"+meta.Metadata.Name] = j
	}
	return out
}

// TestRivalManifests: the rendered kube-proxy and flannel manifests carry
// the mode, backend and lab settings each --cni value and routing mode ask
// for, and decode strictly into their API types.
func TestRivalManifests(t *testing.T) {
	srv := &k8stest.Server{Address: "10.77.0.254", APIPort: 6443}
	for _, c := range []struct {
		cni, routing, mode, backend string
		nft                         bool
	}{
		{CNIKubeProxyIptables, RoutingNative, "iptables", "host-gw", false},
		{CNIKubeProxyNftables, RoutingNative, "nftables", "host-gw", true},
		{CNIKubeProxyIptables, RoutingTunnel, "iptables", "vxlan", false},
	} {
		r, ok, err := rivalFor(c.cni, c.routing)
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", c.cni, ok, err)
		}
		ms, err := rivalManifests(r, srv)
		if err != nil {
			t.Fatal(err)
		}
		kp, fl := decodeManifest(t, ms[0]), decodeManifest(t, ms[1])
		var cm corev1.ConfigMap
		if err := json.Unmarshal(kp["ConfigMap/kube-proxy"], &cm); err != nil {
			t.Fatal(err)
		}
		var kpc map[string]any
		if err := yaml.UnmarshalStrict([]byte(cm.Data["config.conf"]), &kpc); err != nil {
			t.Fatal(err)
		}
		if kpc["mode"] != c.mode || kpc["clusterCIDR"] != ClusterCIDR || kpc["conntrack"].(map[string]any)["maxPerCore"] != float64(0) {
			t.Errorf("%s: KubeProxyConfiguration %v", c.cni, kpc)
		}
		if !strings.Contains(cm.Data["kubeconfig.conf"], "server: https://10.77.0.254:6443") {
			t.Errorf("%s: kubeconfig %s", c.cni, cm.Data["kubeconfig.conf"])
		}
		var ds appsv1.DaemonSet
		if err := json.Unmarshal(kp["DaemonSet/kube-proxy"], &ds); err != nil {
			t.Fatal(err)
		}
		pod := ds.Spec.Template.Spec
		if !pod.HostNetwork || pod.Containers[0].Image != kubeProxyImage || !*pod.Containers[0].SecurityContext.Privileged {
			t.Errorf("%s: kube-proxy pod %+v", c.cni, pod)
		}
		if _, ok := kp["ClusterRoleBinding/kubeadm:node-proxier"]; !ok {
			t.Errorf("%s: no node-proxier binding: %v", c.cni, kp)
		}
		if err := json.Unmarshal(fl["ConfigMap/kube-flannel-cfg"], &cm); err != nil {
			t.Fatal(err)
		}
		var netConf struct {
			Network        string
			EnableNFTables bool
			Backend        struct{ Type string }
		}
		if err := json.Unmarshal([]byte(cm.Data["net-conf.json"]), &netConf); err != nil {
			t.Fatalf("net-conf.json: %v\n%s", err, cm.Data["net-conf.json"])
		}
		if netConf.Network != ClusterCIDR || netConf.Backend.Type != c.backend || netConf.EnableNFTables != c.nft {
			t.Errorf("%s %s: net-conf %+v", c.cni, c.routing, netConf)
		}
		ds = appsv1.DaemonSet{}
		if err := json.Unmarshal(fl["DaemonSet/kube-flannel-ds"], &ds); err != nil {
			t.Fatal(err)
		}
		fc := ds.Spec.Template.Spec.Containers[0]
		if fc.Image != flannelImage || strings.Join(fc.Args, " ") != "--ip-masq --kube-subnet-mgr --iface="+Uplink {
			t.Errorf("flannel container %s %q", fc.Image, fc.Args)
		}
		env := map[string]string{}
		for _, e := range fc.Env {
			env[e.Name] = e.Value
		}
		if env["KUBERNETES_SERVICE_HOST"] != "10.77.0.254" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
			t.Errorf("flannel env %v", env)
		}
	}
}

// TestCheckCNI: --cni values and the configurations they need.
func TestCheckCNI(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string // "" : accepted
	}{
		{Config{}, ""},
		{Config{CNI: CNILanekit}, ""},
		{Config{CNI: CNIKubeProxyIptables, K8s: true, Kubelet: true}, ""},
		{Config{CNI: CNIKubeProxyNftables, K8s: true, Kubelet: true, Routing: RoutingTunnel}, ""},
		{Config{CNI: CNIKubeProxyIptables, K8s: true}, "needs real nodes"},
		{Config{CNI: CNIKubeProxyIptables, K8s: true, Kubelet: true, IPFamily: IPFamilyDual}, "IPv4 only"},
		{Config{CNI: CNICilium, K8s: true, Kubelet: true}, ""},
		{Config{CNI: CNICilium, K8s: true, Kubelet: true, Routing: RoutingTunnel}, ""},
		{Config{CNI: "calico", K8s: true, Kubelet: true}, `--cni "calico"`},
	} {
		err := c.cfg.checkCNI()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	// A rival may use the routed underlay (flannel vxlan), and so may
	// lanekit's real nodes (the ConfigMap's routing-mode tunnel).
	for _, cni := range []string{CNIKubeProxyIptables, CNICilium, ""} {
		if err := (Config{Nodes: 2, CNI: cni, K8s: true, Kubelet: true, Routing: RoutingTunnel}).checkRouting(); err != nil {
			t.Errorf("%q on the routed underlay: %v", cni, err)
		}
	}
}
