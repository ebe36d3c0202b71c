package cniplugin

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzParseConf: whatever a CNI caller (a runtime, Multus with a user's
// NetworkAttachmentDefinition) hands the plugin is either refused with a
// CNI error code (decode or invalid config) or accepted with every checked
// field within bounds.
func FuzzParseConf(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","name":"lk","type":"lanekit"}`,
		`{"cniVersion":"1.1.0","name":"lk","type":"lanekit","mtu":1400,"subnet":"10.0.0.0/8","agentSocket":"/run/x.sock"}`,
		`{"cniVersion":"1.1.0","name":"vm","type":"lanekit","vhostUser":{"queues":4,"socketDir":"/var/run/kubevirt/sockets","podVolume":"sockets"},` +
			`"runtimeConfig":{"mac":"02:00:00:00:00:01","CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo/x.json"}}`,
		`{"cniVersion":"1.1.0","name":"vm","type":"lanekit","vhostUser":{"hostSocketDir":"/a/../b"}}`,
		`{"cniVersion":"1.1.0","name":"lk","type":"lanekit","prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.1/32"}]}}`,
		`{"type":"lanekit","vhostUser":null,"runtimeConfig":{}}`,
		`{"cniVersion":"1.1.0","name":"vm","type":"lanekit","vhostUser":{},"runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo/../x"}}`,
		`{"cniVersion":"1.1.0","name":"vm","type":"lanekit","vhostUser":{},"runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo"}}`,
		`{"cniVersion":"1.1.0","name":"vm","type":"lanekit","vhostUser":{},"runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfoX/x"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		t.Setenv(DeviceInfoDirEnv, "")
		c, err := ParseConf(data)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || (te.Code != types.ErrDecodingFailure && te.Code != types.ErrInvalidNetworkConfig) {
				t.Fatalf("error %v is not a decode/invalid-config CNI error", err)
			}
			return
		}
		if c.Type != PluginType || c.Name == "" || c.Socket() == "" {
			t.Fatalf("accepted %+v", c)
		}
		if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
			t.Fatalf("accepted mtu %d", c.MTU)
		}
		if v := c.VhostUser; v != nil {
			if v.Queues < 0 || v.Queues > 16 {
				t.Fatalf("accepted queues %d", v.Queues)
			}
			for _, d := range []string{v.SocketDir, v.HostSocketDir} {
				if d != "" && (!filepath.IsAbs(d) || filepath.Clean(d) != d) {
					t.Fatalf("accepted directory %q", d)
				}
			}
		}
		// The plugin writes and removes the device-info file as root: only
		// strictly beneath Multus' directory (symbolic links are refused when
		// it is opened).
		if f := c.RuntimeConfig.CNIDeviceInfoFile; f != "" {
			rel, err := filepath.Rel(DefaultDeviceInfoDir, f)
			if err != nil || filepath.Clean(f) != f || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
				t.Fatalf("accepted device-info file %q", f)
			}
		}
		if m := c.RuntimeConfig.MAC; m != "" {
			if hw, err := net.ParseMAC(m); err != nil || len(hw) != 6 {
				t.Fatalf("accepted mac %q", m)
			}
		}
	})
}
