package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// offloadBits names the virtio-net offload feature bits a VM row reports.
var offloadBits = map[int]string{
	0: "csum", 1: "guest_csum", 7: "guest_tso4", 8: "guest_tso6", 10: "guest_ufo",
	11: "host_tso4", 12: "host_tso6", 13: "host_ecn", 14: "host_ufo", 54: "guest_uso4", 55: "guest_uso6", 56: "host_uso",
}

// guestFeaturesFile is where the guest's kernel shows the features its
// virtio-net driver negotiated with the device behind eth0 (one '0' or '1'
// per bit, bit 0 first): the same for a vhost-user backend and for QEMU's
// own virtio-net on a tap, and read where they take effect.
const guestFeaturesFile = "/sys/class/net/eth0/device/features"

// Offloads names the virtio offloads the guest's driver negotiated for its
// eth0, read inside the guest.
func (g *Guest) Offloads(ctx context.Context) (string, error) {
	out, err := g.output(ctx, "cat "+guestFeaturesFile)
	if err != nil {
		return "", err
	}
	return offloadsFromBits(out)
}

// offloadsFromBits names the offloads among the set bits of a virtio
// features file ("none" when there are none).
func offloadsFromBits(out string) (string, error) {
	bits := strings.TrimSpace(out)
	if bits == "" || strings.Trim(bits, "01") != "" {
		return "", fmt.Errorf("virtio features %q: want a string of 0 and 1", bits)
	}
	var names []string
	for bit, c := range bits {
		if n, ok := offloadBits[bit]; ok && c == '1' {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "none", nil
	}
	sort.Strings(names)
	return strings.Join(names, " "), nil
}

// guestOffloads is g.Offloads for a row, or what kept it unknown.
func guestOffloads(ctx context.Context, g *Guest) string {
	o, err := g.Offloads(ctx)
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return o
}
