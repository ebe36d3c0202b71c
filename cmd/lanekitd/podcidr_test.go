package main

import (
	"strings"
	"testing"
)

func TestSplitPodCIDRs(t *testing.T) {
	for _, c := range []struct {
		in     []string
		v4, v6 string
		err    string
	}{
		{in: nil},
		{in: []string{"10.244.1.0/24"}, v4: "10.244.1.0/24"},
		{in: []string{"fd00:10:244:1::/64", "10.244.1.0/24"}, v4: "10.244.1.0/24", v6: "fd00:10:244:1::/64"},
		{in: []string{"10.244.1.0/24", "10.244.2.0/24"}, err: "two IPv4"},
		{in: []string{"10.244.1.0/24", "fd00::/64", "fd01::/64"}, err: "two IPv6"},
		{in: []string{"fd00::/64"}, v6: "fd00::/64"}, // an IPv6-only node
		{in: []string{"::ffff:10.0.0.0/104"}, err: "IPv4-mapped"},
		{in: []string{"nope"}, err: "nope"},
	} {
		v4, v6, err := splitPodCIDRs(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || v4 != c.v4 || v6 != c.v6 {
			t.Errorf("%v: got %q %q %v, want %q %q", c.in, v4, v6, err, c.v4, c.v6)
		}
	}
}

func TestNodeFamilies(t *testing.T) {
	for _, tc := range []struct {
		node, flag4, flag6 string
		v4, v6, err        string
	}{
		{node: "10.244.1.0/24", v4: "10.244.1.0/24"},
		{node: "10.244.1.0/24", flag6: "fd00:10:244:1::/64", v4: "10.244.1.0/24", v6: "fd00:10:244:1::/64"},
		{node: "10.244.1.0/24", flag4: "10.244.2.0/24", err: "differs"},
		{node: "fd00:10:244:1::/64", v6: "fd00:10:244:1::/64"},
		{node: "fd00:10:244:1::/64", flag6: "fd00:10:244:1::/64", v6: "fd00:10:244:1::/64"},
		{node: "fd00:10:244:1::/64", flag6: "fd00:10:244:2::/64", err: "differs"},
		{node: "fd00:10:244:1::/64", flag4: "10.244.1.0/24", err: "IPv6-only"},
		{node: "nonsense", err: "spec.podCIDR"},
	} {
		v4, v6, err := nodeFamilies("n1", tc.node, tc.flag4, tc.flag6)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: err %v, want %q", tc, err, tc.err)
			}
			continue
		}
		if err != nil || v4 != tc.v4 || v6 != tc.v6 {
			t.Errorf("%+v: got %q %q %v", tc, v4, v6, err)
		}
	}
}
