package datapath

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
)

func TestDHCPOptionsRender(t *testing.T) {
	dns := []netip.Addr{netip.MustParseAddr("10.96.0.10")}
	b, err := DHCPOptions{DNS: dns, Search: []string{"a.svc.cluster.local.", "cluster.local"}, MTU: 1500}.Render()
	want := append([]byte{26, 2, 0x05, 0xdc, 6, 4, 10, 96, 0, 10, 15, 19}, "a.svc.cluster.local"...)
	want = append(want, 119, 36, 1, 'a', 3, 's', 'v', 'c', 7, 'c', 'l', 'u', 's', 't', 'e', 'r', 5, 'l', 'o', 'c', 'a', 'l', 0,
		7, 'c', 'l', 'u', 's', 't', 'e', 'r', 5, 'l', 'o', 'c', 'a', 'l', 0)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("render = %v %v\nwant %v", b, err, want)
	}
	if b, err := (DHCPOptions{}).Render(); err != nil || len(b) != 0 || !(DHCPOptions{}).Empty() {
		t.Errorf("empty options rendered %v %v", b, err)
	}
	for name, o := range map[string]DHCPOptions{
		"mtu below 68":       {MTU: 67},
		"mtu above 65535":    {MTU: 65536},
		"IPv6 name server":   {DNS: []netip.Addr{netip.MustParseAddr("fd00::a")}},
		"0.0.0.0":            {DNS: []netip.Addr{netip.IPv4Unspecified()}},
		"no address":         {DNS: []netip.Addr{{}}},
		"empty label":        {Search: []string{"a..b"}},
		"label of 64":        {Search: []string{strings.Repeat("x", 64) + ".local"}},
		"space in a label":   {Search: []string{"a b.local"}},
		"underscore":         {Search: []string{"a_b.local"}},
		"empty domain":       {Search: []string{""}},
		"too many servers":   {DNS: make([]netip.Addr, 64)},
		"more than fits one": {Search: []string{strings.Repeat("x", 60) + "." + strings.Repeat("y", 60) + "." + strings.Repeat("z", 60)}, DNS: dns},
	} {
		if b, err := o.Render(); err == nil {
			t.Errorf("%s: rendered %v", name, b)
		}
	}
	// Fit leaves search domains out from the end until the set fits; a bad
	// name is still an error.
	long := func(c string) string { return strings.Repeat(c, 40) + "." + strings.Repeat(c, 40) + ".cluster.local" }
	o := DHCPOptions{DNS: dns, MTU: 1450, Search: []string{long("a"), long("b"), long("c")}}
	b, dropped, err := o.Fit()
	if err != nil || dropped != 2 || len(b) > DHCPExtraMax || !bytes.Contains(b, []byte(strings.Repeat("a", 40))) || bytes.Contains(b, []byte(strings.Repeat("b", 40))) {
		t.Errorf("fit = %d bytes, %d dropped, %v", len(b), dropped, err)
	}
	if _, _, err := (DHCPOptions{Search: []string{"bad name"}}).Fit(); err == nil {
		t.Error("fit accepted a bad name")
	}
	// The longest a Kubernetes namespace makes with cluster.local fits whole.
	ns := strings.Repeat("n", 63)
	o = DHCPOptions{DNS: []netip.Addr{dns[0], dns[0], dns[0]}, MTU: 9000,
		Search: []string{ns + ".svc.cluster.local", "svc.cluster.local", "cluster.local"}}
	if b, err := o.Render(); err != nil {
		t.Errorf("a 63-character namespace's search list: %v (%d bytes)", err, len(b))
	}
}
