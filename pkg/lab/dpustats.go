package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/bench"
)

// Where the datapath's CPU goes on a DPU node (issue 28): the kernel's BPF
// run-time statistics (bench.EnableBPFStats: run_time_ns and run_cnt of
// every program) summed per network namespace over the same iperf3
// transfer, for a pod on a DPU node and a pod on a plain node sending to the
// same pod on a plain node.

// BPFNSStat is what the programs attached in one namespace ran during a
// transfer.
type BPFNSStat struct {
	NS       string  `json:"netns"`
	Programs int     `json:"programs"`
	Runs     uint64  `json:"runs"`
	RunNs    uint64  `json:"run_ns"`
	NsPerRun float64 `json:"ns_per_run"`
}

// BPFStatsRow is one transfer.
type BPFStatsRow struct {
	From, To string      `json:"-"`
	Path     string      `json:"path"`
	Gbps     float64     `json:"tcp_gbps"`
	NS       []BPFNSStat `json:"netns"`
}

// progsIn lists the programs attached in a namespace: tcx ingress and
// egress, and XDP, on every device.
func progsIn(ns string) ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	err := testutil.InNetnsPath(netnsPath(ns), func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
				if err != nil {
					return fmt.Errorf("query %s: %w", l.Attrs().Name, err)
				}
				for _, p := range q.Programs {
					ids = append(ids, p.ID)
				}
			}
			if x := l.Attrs().Xdp; x != nil && x.Attached {
				ids = append(ids, ebpf.ProgramID(x.ProgId))
			}
		}
		return nil
	})
	return ids, err
}

// progStats sums run time and count of programs.
func progStats(ids []ebpf.ProgramID) (runs, ns uint64, err error) {
	for _, id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			return 0, 0, fmt.Errorf("program %d: %w", id, err)
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("program %d stats: %w", id, err)
		}
		runs += st.RunCount
		ns += uint64(st.Runtime.Nanoseconds())
	}
	return runs, ns, nil
}

// BPFStats measures, for each lanekit pod on nodes before the last (pod 1)
// sending to pod 1 on the last node, a dur-long iperf3 transfer and the BPF
// run time per namespace (the sender's node, its DPU if it has one, the
// receiver's node). The statistics are on for the measurement only.
func BPFStats(ctx context.Context, dur time.Duration) ([]BPFStatsRow, error) {
	st, err := LoadState()
	if err != nil {
		return nil, err
	}
	if len(st.Nodes) < 2 || len(st.PodsOf(KindLanekit)) == 0 {
		return nil, errors.New("bpf stats: need a lab with 2 or more nodes and lanekit pods")
	}
	stats, err := bench.EnableBPFStats()
	if err != nil {
		return nil, fmt.Errorf("bpf stats: %w", err)
	}
	defer stats.Close()

	last := st.Nodes[len(st.Nodes)-1].Index
	server := PodNS(last, 1, KindLanekit)
	serverIP := podIP(ctx, server)
	var rows []BPFStatsRow
	for _, n := range st.Nodes[:len(st.Nodes)-1] {
		client := PodNS(n.Index, 1, KindLanekit)
		spaces := []string{NodeNS(n.Index)}
		kind := "plain node"
		if IsDPUNode(n.Index) {
			spaces = append(spaces, DPUNS(n.Index))
			kind = "DPU node"
		}
		spaces = append(spaces, NodeNS(last))
		row := BPFStatsRow{From: client, To: server, Path: fmt.Sprintf("pod on %s (%s) -> pod on %s", NodeNS(n.Index), kind, NodeNS(last))}
		ids := map[string][]ebpf.ProgramID{}
		before := map[string][2]uint64{}
		for _, ns := range spaces {
			if ids[ns], err = progsIn(ns); err != nil {
				return nil, err
			}
			r, t, err := progStats(ids[ns])
			if err != nil {
				return nil, err
			}
			before[ns] = [2]uint64{r, t}
		}
		srv := nsCommand(ctx, server, "iperf3", "-s", "-1")
		if err := srv.Start(); err != nil {
			return nil, fmt.Errorf("bpf stats: iperf3 server: %w", err)
		}
		time.Sleep(300 * time.Millisecond)
		out, err := nsCommand(ctx, client, "iperf3", "-c", serverIP, "-t", fmt.Sprint(int(dur.Seconds())), "-J").Output()
		srv.Process.Kill()
		srv.Wait()
		if err != nil {
			return nil, fmt.Errorf("bpf stats: iperf3 %s -> %s: %w", client, server, err)
		}
		var rep struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			return nil, fmt.Errorf("bpf stats: iperf3 -J: %w", err)
		}
		row.Gbps = rep.End.SumReceived.BitsPerSecond / 1e9
		for _, ns := range spaces {
			r, t, err := progStats(ids[ns])
			if err != nil {
				return nil, err
			}
			s := BPFNSStat{NS: ns, Programs: len(ids[ns]), Runs: r - before[ns][0], RunNs: t - before[ns][1]}
			if s.Runs > 0 {
				s.NsPerRun = float64(s.RunNs) / float64(s.Runs)
			}
			row.NS = append(row.NS, s)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// WriteBPFStats prints the rows as a table.
func WriteBPFStats(w io.Writer, rows []BPFStatsRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tTCP Gbps\tNETNS\tPROGRAMS\tRUNS\tNS/RUN\tBPF ms")
	for _, r := range rows {
		for i, s := range r.NS {
			path, gbps := "", ""
			if i == 0 {
				path, gbps = r.Path, fmt.Sprintf("%.2f", r.Gbps)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.0f\t%.1f\n", path, gbps, s.NS, s.Programs, s.Runs, s.NsPerRun, float64(s.RunNs)/1e6)
		}
	}
	tw.Flush()
}
