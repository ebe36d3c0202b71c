package lab

import (
	"strings"
	"testing"
)

func TestCheckLBPool(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string // "" : accepted
	}{
		{Config{K8s: true, Kubelet: true, LBPool: LabLBPool}, ""},
		{Config{K8s: true, Kubelet: true, IPFamily: IPFamilyDual, LBPool: LabLBPool + "," + LabLBPool6}, ""},
		{Config{K8s: true, Kubelet: true, IPFamily: IPFamilyDual, LBPool: "fd00:77::100/124"}, ""},
		{Config{K8s: true, Kubelet: true, LBPool: LabLBPool + "," + LabLBPool6}, "needs --ip-family dual"},
		{Config{K8s: true, Kubelet: true, LBPool: "10.77.0.200-fd00:77::1"}, "one family"},
		{Config{K8s: true, Kubelet: true, LBPool: LabLBPool + ",nonsense"}, "--lb-pool"},
		{Config{K8s: true, LBPool: LabLBPool}, "needs --k8s --kubelet"},
	} {
		err := c.cfg.checkInstall()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
