package bench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// offloadBits names the virtio-net offload feature bits a VM row reports.
var offloadBits = map[int]string{
	0: "csum", 1: "guest_csum", 7: "guest_tso4", 8: "guest_tso6", 10: "guest_ufo",
	11: "host_tso4", 12: "host_tso6", 13: "host_ecn", 14: "host_ufo", 56: "host_uso",
}

// BackendOffloads names the offloads the guest acked on a lanekit-vhost,
// read from its metrics socket (lanekit_vhost_virtio_features).
func BackendOffloads(ctx context.Context, sock string) (string, error) {
	text, err := scrapeBackend(ctx, sock)
	if err != nil {
		return "", err
	}
	return ackedOffloads(text)
}

// ackedOffloads reads the acked feature bits from a scrape and names the
// offloads among them ("none" when there are none).
func ackedOffloads(text string) (string, error) {
	var names []string
	seen := false
	for _, l := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(l, "{")
		if !ok || name != "lanekit_vhost_virtio_features" {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		if !strings.Contains(labels, `set="acked"`) || strings.TrimSpace(value) != "1" {
			continue
		}
		_, b, ok := strings.Cut(labels, `bit="`)
		if !ok {
			return "", fmt.Errorf("backend metrics: no bit in %q", l)
		}
		bit, err := strconv.Atoi(strings.TrimSuffix(b[:strings.IndexByte(b+`"`, '"')], `"`))
		if err != nil {
			return "", fmt.Errorf("backend metrics: %q: %w", l, err)
		}
		seen = true
		if n, ok := offloadBits[bit]; ok {
			names = append(names, n)
		}
	}
	if !seen {
		return "", fmt.Errorf("backend metrics: no acked features (older backend, or no guest yet)")
	}
	if len(names) == 0 {
		return "none", nil
	}
	sort.Strings(names)
	return strings.Join(names, " "), nil
}
