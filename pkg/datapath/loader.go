package datapath

import (
	"fmt"
	"log/slog"
)

// Loader is the BPF implementation of Datapath.
type Loader struct {
	cfg Config
	log *slog.Logger
}

var _ Datapath = (*Loader)(nil)

// Open loads (or re-adopts from PinDir) the programs and maps and attaches the
// uplink program. (Implementation in progress.)
func Open(cfg Config, log *slog.Logger) (*Loader, error) {
	return nil, fmt.Errorf("open datapath: %w", ErrNotSupported)
}

func (l *Loader) UpsertEndpoint(ep Endpoint) error     { return ErrNotSupported }
func (l *Loader) DeleteEndpoint(ep Endpoint) error     { return ErrNotSupported }
func (l *Loader) Endpoints() ([]uint32, error)         { return nil, ErrNotSupported }
func (l *Loader) Counters(id uint32) (Counters, error) { return Counters{}, ErrNotSupported }
func (l *Loader) Close() error                         { return nil }
