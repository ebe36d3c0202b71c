// Package libnbd stands in for libnbd's Go bindings (libguestfs.org/libnbd),
// which the Go module proxy refuses (403) and which upstream generates from
// libnbd's OCaml API description at build time. It declares exactly what
// kubevirt.io/kubevirt v1.9.0 links (pkg/storage/nbdclient, used by
// virt-launcher for changed-block-tracking backups); every call fails with
// ErrUnavailable, so that feature reports an error instead of reading a disk.
package libnbd

import "errors"

// ErrUnavailable is what every operation of this stand-in returns.
var ErrUnavailable = errors.New("libnbd: not available in this build (lanekit third_party/kubevirt/libnbd stand-in)")

// The meta contexts and extent flags, with libnbd's values (nbd-protocol.h).
const (
	CONTEXT_BASE_ALLOCATION   = "base:allocation"
	CONTEXT_QEMU_DIRTY_BITMAP = "qemu:dirty-bitmap:"
)

// State flags of an extent.
type State uint32

const (
	STATE_HOLE  State = 1
	STATE_ZERO  State = 2
	STATE_DIRTY State = 1
)

// LibnbdExtent is one extent of a block-status reply.
type LibnbdExtent struct {
	Length uint64
	Flags  uint64
}

// ExtentCallback64 receives the extents of one meta context.
type ExtentCallback64 func(metacontext string, offset uint64, entries []LibnbdExtent, error *int) int

// BlockStatus64Optargs are the optional arguments of BlockStatus64.
type BlockStatus64Optargs struct{}

// PreadOptargs are the optional arguments of Pread.
type PreadOptargs struct{}

// Libnbd is a handle; this stand-in never creates one.
type Libnbd struct{}

// Create fails: there is no libnbd in this build.
func Create() (*Libnbd, error) { return nil, ErrUnavailable }

// Close does nothing.
func (h *Libnbd) Close() error { return nil }

// AddMetaContext fails.
func (h *Libnbd) AddMetaContext(string) error { return ErrUnavailable }

// CanMetaContext fails.
func (h *Libnbd) CanMetaContext(string) (bool, error) { return false, ErrUnavailable }

// SetExportName fails.
func (h *Libnbd) SetExportName(string) error { return ErrUnavailable }

// ConnectUnix fails.
func (h *Libnbd) ConnectUnix(string) error { return ErrUnavailable }

// GetSize fails.
func (h *Libnbd) GetSize() (uint64, error) { return 0, ErrUnavailable }

// Pread fails.
func (h *Libnbd) Pread([]byte, uint64, *PreadOptargs) error { return ErrUnavailable }

// BlockStatus64 fails.
func (h *Libnbd) BlockStatus64(uint64, uint64, ExtentCallback64, *BlockStatus64Optargs) error {
	return ErrUnavailable
}
