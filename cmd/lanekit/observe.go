package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

var observeOpts struct {
	follow   bool
	endpoint string
	verdict  string
	json     bool
	sample   uint32
	count    int
	window   time.Duration
}

var observeCmd = &cobra.Command{
	Use:   "observe",
	Short: "Show the datapath's flow events: drops, and sampled forwarded packets",
	Long: `observe streams flow events from the local agent: every packet the datapath
drops (with the reason) and, with --sample N, one in N forwarded packets.
The BPF programs report events only while someone observes.

Without --follow it prints what arrives within --window (or the first
--count events) and exits.`,
	Args: cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		req := &apiv1.ObserveRequest{Endpoint: observeOpts.endpoint, SampleRate: observeOpts.sample}
		switch observeOpts.verdict {
		case "":
		case "dropped", "drop":
			req.Verdict = apiv1.Verdict_VERDICT_DROPPED
		case "forwarded", "allowed":
			req.Verdict = apiv1.Verdict_VERDICT_FORWARDED
			if req.SampleRate == 0 {
				return errors.New("--verdict forwarded needs --sample N (report one in N forwarded packets)")
			}
		default:
			return fmt.Errorf("--verdict %q: want dropped or forwarded", observeOpts.verdict)
		}
		if observeOpts.count < 0 {
			return errors.New("--count must not be negative")
		}
		return observe(cmd.Context(), cmd.OutOrStdout(), req)
	},
}

func init() {
	f := observeCmd.Flags()
	f.BoolVarP(&observeOpts.follow, "follow", "f", false, "keep streaming until interrupted")
	f.StringVar(&observeOpts.endpoint, "endpoint", "", "only events of this endpoint (id, namespace/pod, pod, VM name or host device)")
	f.StringVar(&observeOpts.verdict, "verdict", "", "only dropped or forwarded events")
	f.BoolVar(&observeOpts.json, "json", false, "one JSON object per event")
	f.Uint32Var(&observeOpts.sample, "sample", 0, "also report one in N forwarded packets (0: drops only)")
	f.IntVar(&observeOpts.count, "count", 0, "exit after this many events (0: no limit)")
	f.DurationVar(&observeOpts.window, "window", 2*time.Second, "without --follow: how long to collect events")
	addSocketFlag(observeCmd)
	rootCmd.AddCommand(observeCmd)
}

func observe(ctx context.Context, out io.Writer, req *apiv1.ObserveRequest) error {
	conn, err := agentConn()
	if err != nil {
		return err
	}
	defer conn.Close()
	if !observeOpts.follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, observeOpts.window)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := apiv1.NewObserverClient(conn).Observe(ctx, req)
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	n := 0
	for observeOpts.count == 0 || n < observeOpts.count {
		ev, err := stream.Recv()
		if err != nil {
			// The window closing (gRPC may see the deadline before ctx
			// does) or an interrupt end the stream normally.
			code := status.Code(err)
			if errors.Is(err, io.EOF) || code == codes.Canceled || !observeOpts.follow && code == codes.DeadlineExceeded {
				return nil
			}
			if code == codes.Unimplemented {
				return fmt.Errorf("observe: the agent at %s serves no flow events (it runs without the BPF datapath, or predates them)", agentSocket)
			}
			return fmt.Errorf("observe: %w", err)
		}
		if observeOpts.json {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
			if err != nil {
				return fmt.Errorf("encode event: %w", err)
			}
			fmt.Fprintln(out, string(b))
		} else {
			fmt.Fprintln(out, formatFlow(ev))
		}
		if ev.GetLost() == 0 {
			n++
		}
	}
	return nil
}

// formatFlow renders one event as a line:
//
//	12:00:01.123 DROPPED   spoofed-ip  default/pod-a (ep 3) 10.244.1.9:1234 -> 10.244.2.3:80 TCP 74B
func formatFlow(ev *apiv1.FlowEvent) string {
	if ev.GetLost() > 0 {
		where := "this stream did not keep up"
		if ev.GetLostWhere() == "ring" {
			where = "the datapath's ring buffer was full"
		}
		return fmt.Sprintf("%s LOST      %d events (%s)", time.Now().Format("15:04:05.000"), ev.GetLost(), where)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s ", time.Unix(0, ev.GetTimeUnixNano()).Format("15:04:05.000"))
	switch ev.GetVerdict() {
	case apiv1.Verdict_VERDICT_DROPPED:
		fmt.Fprintf(&b, "DROPPED   %-12s", ev.GetDropReason())
	case apiv1.Verdict_VERDICT_FORWARDED:
		fmt.Fprintf(&b, "FORWARDED %-12s", "")
	default:
		fmt.Fprintf(&b, "%-9s %-12s", ev.GetVerdict(), "")
	}
	fmt.Fprintf(&b, " %s", endpointName(ev.GetEndpoint(), ev.GetIfname()))
	switch {
	case ev.GetSrcIp() != "":
		fmt.Fprintf(&b, " %s -> %s %s", hostPort(ev.GetSrcIp(), ev.GetSrcPort(), ev), hostPort(ev.GetDstIp(), ev.GetDstPort(), ev), protoName(ev.GetIpProtocol()))
	case ev.GetEtherType() != 0:
		fmt.Fprintf(&b, " ethertype 0x%04x", ev.GetEtherType())
	}
	fmt.Fprintf(&b, " %dB", ev.GetLength())
	if p := ev.GetPeer(); p != nil {
		fmt.Fprintf(&b, " to %s", endpointName(p, ""))
	}
	return b.String()
}

func endpointName(ep *apiv1.FlowEndpoint, ifname string) string {
	switch {
	case ep == nil && ifname != "":
		return ifname
	case ep == nil:
		return "-"
	case ep.GetName() == "":
		return fmt.Sprintf("(ep %d)", ep.GetId())
	}
	return fmt.Sprintf("%s (ep %d)", ep.GetName(), ep.GetId())
}

func hostPort(ip string, port uint32, ev *apiv1.FlowEvent) string {
	if ev.GetIpProtocol() != 6 && ev.GetIpProtocol() != 17 {
		return ip
	}
	return fmt.Sprintf("%s:%d", ip, port)
}

func protoName(p uint32) string {
	switch p {
	case 1:
		return "ICMP"
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	}
	return fmt.Sprintf("proto-%d", p)
}
