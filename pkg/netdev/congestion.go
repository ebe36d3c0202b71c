package netdev

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

const (
	congestionControlSysctl = "/proc/sys/net/ipv4/tcp_congestion_control"
	allowedCongestionSysctl = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
)

// ErrNotAvailable: the kernel lacks what a setting asks for.
var ErrNotAvailable = errors.New("not available")

// CheckCongestionControl says whether a pod namespace may use TCP
// congestion control name (e.g. bbr, which pods with egress limits pace best
// with): a namespace other than the host's can choose only what
// net.ipv4.tcp_allowed_congestion_control lists.
func (h *Host) CheckCongestionControl(name string) error {
	var allowed []byte
	err := h.Do(func() error {
		var err error
		allowed, err = os.ReadFile(allowedCongestionSysctl)
		return err
	})
	if err != nil {
		return fmt.Errorf("congestion control %s: %w", name, err)
	}
	if !slices.Contains(strings.Fields(string(allowed)), name) {
		return fmt.Errorf("congestion control %q is not available to pods (net.ipv4.tcp_allowed_congestion_control: %s; add it there, the kernel must have it: net.ipv4.tcp_available_congestion_control): %w",
			name, strings.TrimSpace(string(allowed)), ErrNotAvailable)
	}
	return nil
}
