package bench

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The datapath's own cost of a connection and of a round trip: during each
// conn/s and each RR (sockperf) measurement
// the kernel's BPF run-time statistics (BPF_ENABLE_STATS: run_cnt and
// run_time_ns of every program, counted while the returned descriptor is
// open, so nothing global is left changed) are read for every program on
// the machine before and after, and the difference is divided by the
// connections made (the round trips of the whole RR run, its warm-up
// included). Every BPF datapath in the lab counts (lanekit's,
// Cilium's); a netfilter or bridge path's cost is not BPF and reads zero,
// so the figure compares BPF datapaths with each other and a row with its
// own policy twin, not a BPF row with an iptables one. Unlike conn/s it
// does not move with the rest of the machine's load (the client's and the
// kernel's TCP work are not in it), which is what a row's noise hides.

// bpfStart is the statistics held on for a run and the snapshot taken
// before it; nil when not measured.
type bpfStart struct {
	stats io.Closer
	snap  bpfSnapshot
}

// bpfBefore turns the statistics on and snapshots every program, when
// o.BPFCost and this process may; close it after the run's snapshot.
func (o Options) bpfBefore() *bpfStart {
	if !o.BPFCost {
		return nil
	}
	c := enableBPFStats()
	if c == nil {
		return nil
	}
	snap, err := snapshotBPF()
	if err != nil {
		c.Close()
		return nil
	}
	return &bpfStart{stats: c, snap: snap}
}

func (b *bpfStart) close() { b.stats.Close() }

// bpfSamples are a row's BPF run time per unit (connection or round trip)
// per repetition, in total and by program name, with runs per unit by
// program name.
type bpfSamples struct {
	total              []float64
	byName, runsByName map[string][]float64
}

// add records repetition cur: what ran since before, over n units.
func (b *bpfSamples) add(cur int, before *bpfStart, n int64) {
	if before == nil {
		return
	}
	after, err := snapshotBPF()
	if err != nil {
		return
	}
	if c, ok := costPerConn(before.snap, after, n); ok {
		b.record(cur, c)
	}
}

func (b *bpfSamples) record(cur int, c bpfCost) {
	b.total[cur] = c.nsPerConn
	if b.byName == nil {
		b.byName, b.runsByName = map[string][]float64{}, map[string][]float64{}
	}
	for name, ns := range c.byName {
		partSlot(b.byName, name, len(b.total))[cur] = ns // hostcpu.go
		partSlot(b.runsByName, name, len(b.total))[cur] = c.runs[name]
	}
}

// bpfSnapshot is every program's run count and run time, by program ID.
type bpfSnapshot map[ebpf.ProgramID]bpfProgStat

type bpfProgStat struct {
	name     string
	runs, ns uint64
}

// EnableBPFStats turns the kernel's BPF run-time statistics (run_cnt and
// run_time_ns of every program) on until the closer is closed
// (BPF_ENABLE_STATS: nothing global is left changed if the process dies).
func EnableBPFStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	return c, nil
}

// enableBPFStats is EnableBPFStats, or nil when this process may not (not
// root, or a kernel without BPF_ENABLE_STATS).
func enableBPFStats() io.Closer {
	if os.Geteuid() != 0 {
		return nil
	}
	c, err := EnableBPFStats()
	if err != nil {
		return nil
	}
	return c
}

// snapshotBPF reads every loaded program's statistics. A program that goes
// away while it is read is left out.
func snapshotBPF() (bpfSnapshot, error) {
	out := bpfSnapshot{}
	id := ebpf.ProgramID(0)
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("bpf stats: next program after %d: %w", id, err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		st, serr := p.Stats()
		info, ierr := p.Info()
		p.Close()
		if serr != nil || ierr != nil {
			continue
		}
		out[id] = bpfProgStat{name: info.Name, runs: st.RunCount, ns: uint64(st.Runtime.Nanoseconds())}
	}
}

// bpfCost is what the programs ran between two snapshots, per connection:
// the total and each program name's share (programs of one name, e.g. one
// per node, summed).
type bpfCost struct {
	nsPerConn float64
	byName    map[string]float64 // ns per connection
	runs      map[string]float64 // runs per connection
}

// costPerConn divides what ran between before and after by conns. Programs
// loaded after before count from zero.
func costPerConn(before, after bpfSnapshot, conns int64) (bpfCost, bool) {
	if conns <= 0 {
		return bpfCost{}, false
	}
	c := bpfCost{byName: map[string]float64{}, runs: map[string]float64{}}
	for id, a := range after {
		b := before[id]
		if a.runs < b.runs || a.ns < b.ns {
			continue // a new program under a reused ID
		}
		runs, ns := a.runs-b.runs, a.ns-b.ns
		if runs == 0 {
			continue
		}
		per := float64(ns) / float64(conns)
		c.nsPerConn += per
		c.byName[a.name] += per
		c.runs[a.name] += float64(runs) / float64(conns)
	}
	return c, true
}

// topPrograms returns up to n program names by cost, highest first.
func topPrograms(byName map[string]float64, n int) []string {
	names := slices.Collect(maps.Keys(byName))
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case byName[a] > byName[b]:
			return -1
		case byName[a] < byName[b]:
			return 1
		}
		return strings.Compare(a, b)
	})
	return names[:min(n, len(names))]
}

// writeBPFCost prints each row's BPF run time per connection and per
// round trip with its three costliest programs, when measured.
func (r *Report) writeBPFCost(w io.Writer) { writeBPFCost(w, r.Rows) }

// writeBPFCost prints rows' BPF run time, each labelled by its Path.
func writeBPFCost(w io.Writer, rows []Row) {
	for _, m := range []struct {
		what  string
		total func(Row) (*Summary, []BPFProgramCost)
	}{
		{"connection during conn/s", func(r Row) (*Summary, []BPFProgramCost) { return r.BPFNsPerConn, r.BPFPrograms }},
		{"round trip during RR", func(r Row) (*Summary, []BPFProgramCost) { return r.BPFNsPerRR, r.BPFProgramsRR }},
	} {
		head := false
		for _, row := range rows {
			total, progs := m.total(row)
			if total == nil {
				continue
			}
			if !head {
				fmt.Fprintf(w, "BPF run time per %s (every program on the machine, BPF_ENABLE_STATS; not the client's or the kernel's TCP work), median (min–max):\n", m.what)
				head = true
			}
			var top []string
			for _, p := range progs[:min(3, len(progs))] {
				if p.NsPerConn < 50 { // background traffic (a row whose path runs no BPF reads ~0)
					break
				}
				top = append(top, fmt.Sprintf("%s %.1f µs (%.1f runs)", p.Name, p.NsPerConn/1e3, p.RunsPerConn))
			}
			if len(top) == 0 {
				top = append(top, "no program on the path")
			}
			fmt.Fprintf(w, "  %-28s %.1f µs (%.1f–%.1f): %s\n", row.Path, total.Median/1e3, total.Min/1e3, total.Max/1e3, strings.Join(top, ", "))
		}
	}
}
