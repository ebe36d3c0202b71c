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

// The datapath's own cost of a connection: during each conn/s measurement
// the kernel's BPF run-time statistics (BPF_ENABLE_STATS: run_cnt and
// run_time_ns of every program, counted while the returned descriptor is
// open, so nothing global is left changed) are read for every program on
// the machine before and after, and the difference is divided by the
// connections made. Every BPF datapath in the lab counts (lanekit's,
// Cilium's); a netfilter or bridge path's cost is not BPF and reads zero,
// so the figure compares BPF datapaths with each other and a row with its
// own policy twin, not a BPF row with an iptables one. Unlike conn/s it
// does not move with the rest of the machine's load (the client's and the
// kernel's TCP work are not in it), which is what a row's noise hides.

// bpfSnapshot is every program's run count and run time, by program ID.
type bpfSnapshot map[ebpf.ProgramID]bpfProgStat

type bpfProgStat struct {
	name     string
	runs, ns uint64
}

// enableBPFStats turns the run-time statistics on until the closer is
// closed; nil when this process may not (not root, or a kernel without
// BPF_ENABLE_STATS).
func enableBPFStats() io.Closer {
	if os.Geteuid() != 0 {
		return nil
	}
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
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

// writeBPFCost prints each row's BPF run time per connection with its
// three costliest programs, when measured.
func (r *Report) writeBPFCost(w io.Writer) {
	head := false
	for _, row := range r.Rows {
		if row.BPFNsPerConn == nil {
			continue
		}
		if !head {
			fmt.Fprintln(w, "BPF run time per connection during conn/s (every program on the machine, BPF_ENABLE_STATS; not the client's or the kernel's TCP work), median (min–max):")
			head = true
		}
		var top []string
		for _, p := range row.BPFPrograms[:min(3, len(row.BPFPrograms))] {
			if p.NsPerConn < 50 { // background traffic (a row whose path runs no BPF reads ~0)
				break
			}
			top = append(top, fmt.Sprintf("%s %.1f µs (%.1f runs)", p.Name, p.NsPerConn/1e3, p.RunsPerConn))
		}
		if len(top) == 0 {
			top = append(top, "no program on the path")
		}
		fmt.Fprintf(w, "  %-28s %.1f µs (%.1f–%.1f): %s\n", row.Path, row.BPFNsPerConn.Median/1e3,
			row.BPFNsPerConn.Min/1e3, row.BPFNsPerConn.Max/1e3, strings.Join(top, ", "))
	}
}
