// Package endpoint is the agent's record of one attachment (a pod's
// interface, later a VM's), as stored and as handed to the datapath.
package endpoint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// Kind is what sits behind an endpoint.
type Kind string

const (
	KindPod Kind = "pod" // a network namespace with a veth or netkit device
	KindVM  Kind = "vm"  // a VM behind vhost-user, its AF_XDP sockets bound to the VM's device
)

// GatewayIP is the pod's next hop. It is on no device: the datapath answers
// the pod's ARP requests for it with the host-side device MAC.
var GatewayIP = netip.MustParseAddr("169.254.1.1")

// GatewayIP6 is the pod's IPv6 next hop, link-local and on no device: the
// datapath answers the pod's neighbour solicitations for it (bpf/lib/ndp.h).
var GatewayIP6 = datapath.GatewayIP6

// Endpoint is one attachment and everything needed to recreate, check or
// delete it.
type Endpoint struct {
	ID          uint32              `json:"id"`
	Kind        Kind                `json:"kind"`
	ContainerID string              `json:"containerID"`
	IfName      string              `json:"ifName"` // inside the pod
	Netns       string              `json:"netns"`
	Network     string              `json:"network,omitempty"`
	Mode        datapath.DeviceMode `json:"mode"`
	HostIfName  string              `json:"hostIfName"`
	HostIfIndex int                 `json:"hostIfIndex"`
	HostMAC     string              `json:"hostMAC,omitempty"` // empty for netkit L3
	IfIndex     int                 `json:"ifIndex"`           // inside the pod
	MAC         string              `json:"mac,omitempty"`     // empty for netkit L3
	IP          netip.Addr          `json:"ip"`
	IP6         netip.Addr          `json:"ip6,omitzero"` // invalid: the node has no IPv6 pod CIDR
	MTU         int                 `json:"mtu"`
	Labels      map[string]string   `json:"labels,omitempty"`
	Created     time.Time           `json:"created"`
	VM          *VM                 `json:"vm,omitempty"` // set for KindVM
	// Pending marks an intent: the agent writes the record before it touches
	// devices or the datapath and clears the flag when the ADD completes. A
	// restarted agent rolls pending records back.
	Pending bool `json:"pending,omitempty"`
}

// VM is what a VM endpoint adds to a pod endpoint: the device inside the
// VM's netns (IfName, IfIndex, MAC) carries one rx queue per queue pair, each
// with an AF_XDP socket in slot XSKBase+queue of the datapath.
type VM struct {
	Name    string `json:"name"`
	Queues  int    `json:"queues"`
	XSKBase uint32 `json:"xskBase"`
	Socket  string `json:"socket"` // where the backend fetches the sockets
	// Owner of Socket (the backend's user); nil: root.
	SocketUID *uint32 `json:"socketUid,omitempty"`
	SocketGID *uint32 `json:"socketGid,omitempty"`
	// The VM's netns identity: ifindexes repeat across namespaces (every
	// netns has ifindex 1, 2, ...), so a restarted agent re-adopts the
	// device only in the same namespace (cookie, or inode when the kernel
	// has no netns cookies).
	NetnsCookie uint64 `json:"netnsCookie,omitempty"`
	NetnsIno    uint64 `json:"netnsIno,omitempty"`
	// Attachment is the CNI attachment that made the VM (a KubeVirt
	// virt-launcher pod's network); nil for VMs added by name (AddVM).
	Attachment *CNIAttachment `json:"attachment,omitempty"`
	// Backend is the vhost-user backend the agent runs for the VM; nil when
	// something else runs it (the lab, `lanekit vm add` users).
	Backend *VMBackend `json:"backend,omitempty"`
	// Migration is set on a VM endpoint that took part in a live migration.
	Migration *VMMigration `json:"migration,omitempty"`
}

// VMMigrationState is where a migrated VM endpoint stands.
type VMMigrationState string

const (
	// VMIncoming: a migration target, inactive (devices and sockets, no
	// datapath entry, no route) until the guest runs here.
	VMIncoming VMMigrationState = "incoming"
	// VMActive: the node's claim of the VM's address after a migration.
	VMActive VMMigrationState = "active"
	// VMMoved: superseded by another node's claim with a higher generation;
	// out of the datapath, routed to that node, removed by DelVM.
	VMMoved VMMigrationState = "moved"
)

// VMMigration is a VM endpoint's part in live migrations: its claim of the
// address (Generation: the highest claim wins) and its state.
type VMMigration struct {
	State       VMMigrationState `json:"state"`
	Generation  uint64           `json:"generation"`
	ActivatedBy string           `json:"activatedBy,omitempty"`
	Activated   time.Time        `json:"activated,omitzero"`
	MovedTo     string           `json:"movedTo,omitempty"` // the claiming node's address
	// HandedOver: moved by this node itself when its backend saw the
	// source QEMU stop the device during a migration away (not by another
	// node's claim); taken back if the device runs again here.
	HandedOver bool `json:"handedOver,omitempty"`
	// HandOverGeneration and MovedToNode: a hand-over's claim (its
	// generation, the target node's name), which the node keeps routing
	// until a higher claim replaces it or the VM goes.
	HandOverGeneration uint64 `json:"handOverGeneration,omitempty"`
	MovedToNode        string `json:"movedToNode,omitempty"`
}

// CNIAttachment is a CNI container ID + ifname.
type CNIAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// VMBackend is how the agent runs a VM's lanekit-vhost: it listens on
// Socket, which is BindDir/File on the host, where BindDir is a short link
// to HostDir (a unix socket path holds 107 bytes; kubelet's pod volume
// paths are longer). QEMU sees the same file as ReportedPath.
type VMBackend struct {
	HostDir      string `json:"hostDir"`
	BindDir      string `json:"bindDir"`
	File         string `json:"file"`
	ReportedPath string `json:"reportedPath"`
	UID          uint32 `json:"uid"`
	GID          uint32 `json:"gid"`
	// MetricsSocket is where the backend serves its Prometheus metrics (the
	// agent's /metrics includes them).
	MetricsSocket string `json:"metricsSocket,omitempty"`
}

// Socket is the path the backend binds.
func (b *VMBackend) Socket() string { return b.BindDir + "/" + b.File }

// VMContainerID is the container ID a VM endpoint is stored under. CNI
// container IDs cannot contain ':', so it never collides with a pod's.
func VMContainerID(name string) string { return "vm:" + name }

// VMIfName is the name of a VM's device inside its netns.
const VMIfName = "eth0"

// MaxVMNameLen bounds a VM name (it becomes a socket file name).
const MaxVMNameLen = 63

// VMName is a VM name made of parts (a namespace and a VMI name, say)
// joined by '.', or "vm-" and a hash of them when that is longer than a VM
// name may be.
func VMName(parts ...string) string {
	n := strings.Join(parts, ".")
	if len(n) <= MaxVMNameLen && ValidateVMName(n) == nil {
		return n
	}
	h := sha256.Sum256([]byte(strings.Join(parts, "/")))
	return "vm-" + hex.EncodeToString(h[:])[:32]
}

// ValidateVMName checks a VM name: 1-63 of [A-Za-z0-9_.-], not starting
// with '.' or '-'.
func ValidateVMName(name string) error {
	if name == "" {
		return errors.New("vm name is empty")
	}
	if len(name) > MaxVMNameLen {
		return fmt.Errorf("vm name %q is longer than %d characters", name, MaxVMNameLen)
	}
	if name[0] == '.' || name[0] == '-' {
		return fmt.Errorf("vm name %q starts with %q", name, name[0])
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return fmt.Errorf("vm name %q contains %q", name, c)
		}
	}
	return nil
}

// DatapathVM returns what the VM fast lane needs for e; ok is false for a
// pod endpoint.
func (e *Endpoint) DatapathVM() (vm datapath.VM, ok bool, err error) {
	if e.VM == nil {
		return vm, false, nil
	}
	vm = datapath.VM{ID: e.ID, IfIndex: e.IfIndex, Queues: e.VM.Queues, XSKBase: e.VM.XSKBase}
	if vm.MAC, err = parseMAC(e.MAC); err != nil {
		return vm, true, fmt.Errorf("endpoint %d mac: %w", e.ID, err)
	}
	return vm, true, nil
}

// Key is the attachment key: the endpoint's identity in the store and IPAM.
func Key(containerID, ifname string) string { return containerID + "/" + ifname }

// Key returns e's attachment key.
func (e *Endpoint) Key() string { return Key(e.ContainerID, e.IfName) }

// StoreKey is the key e's record is stored under: its attachment key, but
// for a VM its container ID with VMIfName whatever its device's name in its
// netns (a KubeVirt attachment's is the pod interface's, "pod" and a hash),
// so that one VM has one record and its name finds it.
func (e *Endpoint) StoreKey() string {
	if e.Kind == KindVM {
		return Key(e.ContainerID, VMIfName)
	}
	return e.Key()
}

// HostIfName is the host-side device name for an attachment: "lk" and the
// first 11 hex digits of sha256(containerID+ifname), 13 characters.
func HostIfName(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + ifname))
	return "lk" + hex.EncodeToString(sum[:])[:11]
}

// IDKey encodes an endpoint ID as a store key (big-endian, so keys sort by ID).
func IDKey(id uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return b[:]
}

// Validate checks the fields an attachment request must carry.
func Validate(containerID, ifname string) error {
	if containerID == "" {
		return errors.New("container ID is empty")
	}
	if ifname == "" {
		return errors.New("interface name is empty")
	}
	if len(ifname) > 15 {
		return fmt.Errorf("interface name %q is longer than 15 characters", ifname)
	}
	for _, c := range ifname {
		if c == '/' || c == ':' || c <= ' ' {
			return fmt.Errorf("interface name %q contains %q", ifname, c)
		}
	}
	if ifname == "." || ifname == ".." {
		return fmt.Errorf("interface name %q is invalid", ifname)
	}
	return nil
}

// Datapath returns what the datapath needs to forward for e.
func (e *Endpoint) Datapath() (datapath.Endpoint, error) {
	dp := datapath.Endpoint{
		ID:      e.ID,
		Mode:    e.Mode,
		IfName:  e.HostIfName,
		IfIndex: e.HostIfIndex,
		IP:      e.IP,
		IP6:     e.IP6,
	}
	if e.VM != nil {
		dp.Queues = uint16(e.VM.Queues)
		dp.VM = true
	}
	var err error
	if dp.MAC, err = parseMAC(e.MAC); err != nil {
		return dp, fmt.Errorf("endpoint %d mac: %w", e.ID, err)
	}
	if dp.HostMAC, err = parseMAC(e.HostMAC); err != nil {
		return dp, fmt.Errorf("endpoint %d host mac: %w", e.ID, err)
	}
	return dp, nil
}

func parseMAC(s string) (net.HardwareAddr, error) {
	if s == "" {
		return nil, nil
	}
	return net.ParseMAC(s)
}
