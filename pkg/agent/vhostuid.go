package agent

// Per-VM backend users: each agent-run lanekit-vhost gets its own uid (and
// the same number as gid) from Config.VhostUIDRange, so that one VM's
// backend cannot signal, trace or fetch the sockets of another's. The uid is
// part of the VM's endpoint record (VMBackend.UID), written in the same
// transaction that reserves it: a restarted agent adopts the backend with the
// same uid, and DEL/GC, which delete the record, free it.

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/store"
)

// UIDRange is an inclusive range of uids.
type UIDRange struct{ First, Last uint32 }

// DefaultVhostUIDRange is below 65536 because kubelet may hand any uid from
// 65536 up to a user-namespaced pod (KubeletUsernsRange), and within the low
// range it is the block systemd's UIDS-GIDS.md leaves unused: above the
// regular users (1000-60000), systemd-homed (60001-60513) and nspawn's
// bind-user uids (60514-60577), below the DynamicUser range (61184-65519).
// 606 uids: one per VM backend of the node, more than kubelet's default
// maxPods (110).
var DefaultVhostUIDRange = UIDRange{First: 60578, Last: 61183}

// VMCapacity is how many VM backends the node can run at once: one per uid
// of the backend uid range.
func VMCapacity(cfg Config) int {
	r := DefaultVhostUIDRange
	if cfg.VhostUIDRange != nil {
		r = *cfg.VhostUIDRange
	}
	return int(r.Last-r.First) + 1
}

// KubeletUsernsRange is the host uid range kubelet (1.37,
// pkg/kubelet/userns) allocates user namespaces of hostUsers: false pods from
// when the node has no "kubelet" user with subordinate ids: the first id is
// idsPerPod (65536 by default) and the range runs to the top of the uid
// space; each pod takes a random free 65536-uid block of it
// (allocator.NewAllocationMap's random scan), so any uid in it may be a
// pod's.
var KubeletUsernsRange = UIDRange{First: 65536, Last: 1<<32 - 1}

// overlaps reports whether r and o share a uid.
func (r UIDRange) overlaps(o UIDRange) bool { return r.First <= o.Last && o.First <= r.Last }

// contains reports whether uid is in r.
func (r UIDRange) contains(uid uint32) bool { return r.First <= uid && uid <= r.Last }

// checkVhostUIDs refuses backend uids that kubelet may give a
// user-namespaced pod's processes: such a pod's root could then signal,
// trace or take over a VM's backend and its AF_XDP sockets. cfg.KubeletUserns
// is kubelet's range (nil: KubeletUsernsRange; the zero range: user
// namespaces off, nothing to check).
func checkVhostUIDs(cfg Config) error {
	k := KubeletUsernsRange
	if cfg.KubeletUserns != nil {
		k = *cfg.KubeletUserns
	}
	if k == (UIDRange{}) {
		return nil
	}
	if cfg.VhostUID != nil {
		if k.contains(*cfg.VhostUID) {
			return fmt.Errorf("--vhost-user uid %d is in the uids kubelet gives user-namespaced pods (%s)", *cfg.VhostUID, k)
		}
		return nil
	}
	r := DefaultVhostUIDRange
	if cfg.VhostUIDRange != nil {
		r = *cfg.VhostUIDRange
	}
	if r.overlaps(k) {
		return fmt.Errorf("VM backend uids (--vhost-uid-range) %s overlap the uids kubelet gives user-namespaced pods (%s): "+
			"a pod's processes could run as a VM backend's uid; choose a range outside it (default %s) or give "+
			"kubelet's range with --kubelet-userns-range", r, k, DefaultVhostUIDRange)
	}
	return nil
}

// DefaultVhostFrontendUID is KubeVirt's qemu user, which must connect to
// each backend's vhost-user socket.
const DefaultVhostFrontendUID = 107

// ParseUIDRange parses "FIRST-LAST" (FIRST > 0, FIRST <= LAST).
func ParseUIDRange(s string) (UIDRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(a, 10, 32)
	last, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || first == 0 || first > last || last == 1<<32-1 {
		return UIDRange{}, fmt.Errorf("want FIRST-LAST uids (0 < FIRST <= LAST < 4294967295), got %q", s)
	}
	return UIDRange{First: uint32(first), Last: uint32(last)}, nil
}

func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// vhostUIDRange is the configured range (zero: the default).
func (a *Agent) vhostUIDRange() UIDRange {
	if a.cfg.VhostUIDRange != nil {
		return *a.cfg.VhostUIDRange
	}
	return DefaultVhostUIDRange
}

// allocBackendUIDTx returns the lowest uid of r that no stored VM backend
// uses.
func allocBackendUIDTx(tx *store.Tx, r UIDRange) (uint32, error) {
	used := map[uint32]bool{}
	err := tx.ForEach(store.Endpoints, func(k []byte, raw json.RawMessage) error {
		var ep endpoint.Endpoint
		if err := json.Unmarshal(raw, &ep); err != nil {
			return fmt.Errorf("decode endpoint %s: %w", k, err)
		}
		if ep.VM != nil && ep.VM.Backend != nil {
			used[ep.VM.Backend.UID] = true
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("allocate backend uid: %w", err)
	}
	for uid := uint64(r.First); uid <= uint64(r.Last); uid++ {
		if !used[uint32(uid)] {
			return uint32(uid), nil
		}
	}
	return 0, fmt.Errorf("allocate backend uid: all of %s in use: %w", r, ErrExhausted)
}
