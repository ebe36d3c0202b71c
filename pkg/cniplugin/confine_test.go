package cniplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestDeviceInfoConfined: a CNIDeviceInfoFile (or hostSocketDir) that
// leaves its directory, lexically or through a symbolic link planted below
// it, fails ADD with an invalid-config error before the agent creates
// anything; nothing is written or removed outside, and DEL refuses too.
func TestDeviceInfoConfined(t *testing.T) {
	testutil.RequireRoot(t)
	fake := testutil.FakeVhost(t)
	uid := uint32(0)
	dir := t.TempDir()
	devRoot, sockRoot, outside := filepath.Join(dir, "devinfo"), filepath.Join(dir, "sockets"), t.TempDir()
	for _, d := range []string{filepath.Join(devRoot, "cni"), filepath.Join(sockRoot, "vm")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(DeviceInfoDirEnv, devRoot)
	if err := os.Symlink(outside, filepath.Join(devRoot, "cni", "link")); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(outside, "victim.json")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(sockRoot, "link"))
	sock := startAgentWith(t, agenttest.NewMemoryDatapath(), func(c *agent.Config) {
		c.VhostBin, c.VhostUID, c.VhostGID = fake, &uid, &uid
		c.VMSocketDir = filepath.Join(c.StateDir, "vm")
		c.VMHostSocketRoots = []string{sockRoot}
	})
	pod := netnstest.New(t, "cconfine")
	vm := func(hostDir, devinfo string) *skel.CmdArgs {
		return &skel.CmdArgs{ContainerID: "launcher9", IfName: "net1", Netns: pod.Path(), Args: "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=virt-launcher-h",
			StdinData: conf(sock, fmt.Sprintf(`,"vhostUser":{"hostSocketDir":%q},"runtimeConfig":{"CNIDeviceInfoFile":%q}`, hostDir, devinfo))}
	}
	good := filepath.Join(sockRoot, "vm")
	for _, tc := range []struct{ name, hostDir, devinfo string }{
		{"device-info outside", good, victim},
		{"device-info dotdot", good, devRoot + "/cni/../../" + filepath.Base(outside) + "/victim.json"},
		{"device-info through a link", good, filepath.Join(devRoot, "cni", "link", "victim.json")},
		{"device-info a link's new file", good, filepath.Join(devRoot, "cni", "link", "new.json")},
		{"socket dir outside", outside, filepath.Join(devRoot, "cni", "ok.json")},
		{"socket dir through a link", filepath.Join(sockRoot, "link"), filepath.Join(devRoot, "cni", "ok.json")},
	} {
		args := vm(tc.hostDir, tc.devinfo)
		_, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
		if err == nil || code(t, err) != types.ErrInvalidNetworkConfig {
			t.Errorf("%s: ADD = %v, want refused (code 7)", tc.name, err)
		}
		if got := code(t, CmdCheck(vm(good, filepath.Join(devRoot, "cni", "ok.json")))); got != types.ErrUnknownContainer {
			t.Errorf("%s: CHECK code %d after the refused ADD, want 3: the agent made the attachment", tc.name, got)
		}
		if _, err := os.Stat(filepath.Join(devRoot, "cni", "ok.json")); !os.IsNotExist(err) {
			t.Errorf("%s: device-info written for a refused ADD: %v", tc.name, err)
		}
		if tc.hostDir == good {
			if err := CmdDel(args); err == nil || code(t, err) != types.ErrInvalidNetworkConfig {
				t.Errorf("%s: DEL = %v, want refused (code 7)", tc.name, err)
			}
		}
	}
	ents, _ := os.ReadDir(outside)
	if b, _ := os.ReadFile(victim); string(b) != "keep" || len(ents) != 1 {
		t.Errorf("outside the roots: victim %q, entries %v", b, ents)
	}
	// The same attachment with both paths inside works.
	args := vm(good, filepath.Join(devRoot, "cni", "ok.json"))
	mustAdd(t, args)
	if _, err := os.Stat(filepath.Join(devRoot, "cni", "ok.json")); err != nil {
		t.Errorf("device-info inside its directory: %v", err)
	}
	if err := CmdDel(args); err != nil {
		t.Fatal(err)
	}
}
