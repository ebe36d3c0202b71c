package lab

import "testing"

// --zones: real nodes only, label values, handed out round robin.
func TestZones(t *testing.T) {
	c := Config{K8s: true, Kubelet: true, Zones: []string{"a", "b", "c"}}
	if err := c.checkZones(); err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{1: "a", 2: "b", 3: "c", 4: "a"} {
		if got := c.zone(i); got != want {
			t.Errorf("node %d: zone %q, want %q", i, got, want)
		}
	}
	if (Config{}).zone(1) != "" {
		t.Error("a zone without --zones")
	}
	for _, bad := range []Config{{K8s: true, Zones: []string{"a"}}, {K8s: true, Kubelet: true, Zones: []string{"a b"}},
		{K8s: true, Kubelet: true, Zones: []string{""}}} {
		if err := bad.checkZones(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
