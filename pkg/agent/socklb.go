package agent

import (
	"fmt"
	"net/netip"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// sockLB is a datapath with the socket load balancer (*datapath.Loader).
type sockLB interface {
	AttachSockLB(datapath.SockLBConfig) error
	DetachSockLB() error
}

// SockLBState is the socket load balancer's state (ControlStats).
type SockLBState struct {
	// State: "attached", "off" (Config.SockLBCgroup empty) or
	// "unsupported" (the datapath has no socket load balancer).
	State    string
	Cgroup   string
	NodeAddr netip.Addr
}

// setupSockLB attaches the socket load balancer (services for the node's own
// processes and hostNetwork pods) to Config.SockLBCgroup, mounting the
// cgroup2 hierarchy there if needed, or detaches it when that is empty. Run
// in the node's netns: only its sockets are translated.
func (a *Agent) setupSockLB() error {
	sl, ok := a.dp.(sockLB)
	if !ok {
		a.sockLB = SockLBState{State: "unsupported"}
		return nil
	}
	if a.cfg.SockLBCgroup == "" {
		a.sockLB = SockLBState{State: "off"}
		return a.host.Do(sl.DetachSockLB)
	}
	addrs, err := a.nodeAddrs()
	if err != nil {
		a.log.Warn("socket lb: no node address (NodePort on loopback off)", "err", err)
	}
	var node netip.Addr
	if len(addrs) > 0 {
		node = addrs[0]
	}
	err = a.host.Do(func() error {
		if err := datapath.EnsureCgroup2(a.cfg.SockLBCgroup); err != nil {
			return err
		}
		return sl.AttachSockLB(datapath.SockLBConfig{Cgroup: a.cfg.SockLBCgroup, NodeAddr: node})
	})
	if err != nil {
		return fmt.Errorf("socket load balancer (lanekitd --socket-lb=false goes without): %w", err)
	}
	a.sockLB = SockLBState{State: "attached", Cgroup: a.cfg.SockLBCgroup, NodeAddr: node}
	return nil
}
