package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// DatapathProgrammer times lanekit's datapath alone: the Services and
// EndpointSlices translated (pkg/service) and written with ApplyServices
// into freshly pinned BPF maps of a throwaway pin directory, in process: no
// agent, gRPC or store. No traffic goes through these maps; it splits the
// agent's end-to-end time into datapath and the rest.
type DatapathProgrammer struct {
	PinDir string // throwaway, removed by Clear

	dp     *datapath.Loader
	tables *service.Tables
	model  *service.Model
}

// NewDatapathProgrammer uses a pin directory named after this process.
func NewDatapathProgrammer() *DatapathProgrammer {
	return &DatapathProgrammer{PinDir: filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-bench-%d-svc", os.Getpid()))}
}

// ProgramLabel says what Program times.
func (d *DatapathProgrammer) ProgramLabel() string {
	return "datapath only, in process: translate (pkg/service Build + Tables.Apply) and ApplyServices into freshly pinned BPF maps"
}

// ChangeLabel says what Change times.
func (d *DatapathProgrammer) ChangeLabel() string {
	return "datapath only, in process: Model.Set of the changed EndpointSlice + Tables.Apply + ApplyServices"
}

// Program opens fresh maps (untimed), then times translating and applying
// all of set.
func (d *DatapathProgrammer) Program(ctx context.Context, set *SvcSet, _ time.Duration) (time.Duration, error) {
	if err := d.Clear(ctx); err != nil {
		return 0, err
	}
	dp, err := datapath.Open(datapath.Config{PinDir: d.PinDir}, slog.New(slog.DiscardHandler))
	if err != nil {
		return 0, fmt.Errorf("datapath programming: %w", err)
	}
	d.dp = dp
	svcs := make([]*k8sobj.Service, len(set.Services))
	slices := make([]*k8sobj.EndpointSlice, len(set.Services))
	for i := range set.Services {
		svc, es := set.Objects(i)
		svcs[i], slices[i] = k8sobj.SlimService(svc), k8sobj.SlimEndpointSlice(es)
	}
	start := time.Now()
	m, err := service.Build(svcs, slices, service.Options{})
	if err != nil {
		return 0, fmt.Errorf("datapath programming: %w", err)
	}
	d.model, d.tables = m, service.NewTables()
	u := d.tables.Apply(service.Diff(nil, m))
	if err := d.dp.ApplyServices(u); err != nil {
		return time.Since(start), fmt.Errorf("datapath programming: %w", err)
	}
	return time.Since(start), nil
}

// Change times the one-service change as the agent would apply it.
func (d *DatapathProgrammer) Change(_ context.Context, _, cur *SvcSet, changed int) (time.Duration, error) {
	if d.dp == nil {
		return 0, fmt.Errorf("datapath change: nothing programmed")
	}
	svc, v1 := cur.Objects(changed)
	slice := k8sobj.SlimEndpointSlice(v1) // as the agent's decode does (and SlimService below), before it applies
	start := time.Now()
	c, err := d.model.Set(k8sobj.SlimService(svc), []*k8sobj.EndpointSlice{slice})
	if err != nil {
		return 0, fmt.Errorf("datapath change: %w", err)
	}
	if err := d.dp.ApplyServices(d.tables.Apply(c)); err != nil {
		return time.Since(start), fmt.Errorf("datapath change: %w", err)
	}
	return time.Since(start), nil
}

// Clear closes and unpins the maps.
func (d *DatapathProgrammer) Clear(context.Context) error {
	if d.dp != nil {
		d.dp.Close()
		d.dp = nil
	}
	d.model, d.tables = nil, nil
	if err := datapath.Unpin(d.PinDir); err != nil {
		return fmt.Errorf("datapath programming: unpin %s: %w", d.PinDir, err)
	}
	return nil
}

// Close is Clear without a context (the rows' cleanup).
func (d *DatapathProgrammer) Close() { _ = d.Clear(context.Background()) }
