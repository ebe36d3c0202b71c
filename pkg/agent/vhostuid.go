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

// DefaultVhostUIDRange: 65,536 uids above those of a typical node's users
// and of container user namespaces' first mappings.
var DefaultVhostUIDRange = UIDRange{First: 200000, Last: 265535}

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
