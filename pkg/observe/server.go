package observe

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// Server is the Observer gRPC service over a Hub.
type Server struct {
	apiv1.UnimplementedObserverServer
	hub *Hub
}

// NewServer serves hub's events.
func NewServer(hub *Hub) *Server { return &Server{hub: hub} }

// Register adds the Observer service to srv.
func (s *Server) Register(srv *grpc.Server) { apiv1.RegisterObserverServer(srv, s) }

// FilterFromProto turns a request into a Filter.
func FilterFromProto(req *apiv1.ObserveRequest) (Filter, error) {
	f := Filter{Endpoint: req.GetEndpoint(), SampleRate: req.GetSampleRate()}
	switch req.GetVerdict() {
	case apiv1.Verdict_VERDICT_UNSPECIFIED:
	case apiv1.Verdict_VERDICT_DROPPED:
		f.Verdict = datapath.EventDrop
	case apiv1.Verdict_VERDICT_FORWARDED:
		f.Verdict = datapath.EventForwarded
	default:
		return Filter{}, fmt.Errorf("unknown verdict %d", req.GetVerdict())
	}
	return f, f.Validate()
}

// Observe streams events until the client goes away.
func (s *Server) Observe(req *apiv1.ObserveRequest, stream grpc.ServerStreamingServer[apiv1.FlowEvent]) error {
	f, err := FilterFromProto(req)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	sub, err := s.hub.Subscribe(f)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer sub.Close()
	// Headers tell the client that events are on: what happens from now
	// on is reported.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	ctx := stream.Context()
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			if errors.Is(err, ctx.Err()) {
				return nil
			}
			return status.Error(codes.Internal, err.Error())
		}
		if err := stream.Send(MessageToProto(m)); err != nil {
			return err
		}
	}
}

// MessageToProto converts a message for the wire.
func MessageToProto(m Message) *apiv1.FlowEvent {
	if m.Flow == nil {
		return &apiv1.FlowEvent{Lost: m.Lost, LostWhere: m.LostWhere}
	}
	f := m.Flow
	ev := &apiv1.FlowEvent{
		TimeUnixNano: f.Time.UnixNano(),
		Endpoint:     nameToProto(f.Endpoint),
		Peer:         nameToProto(f.Peer),
		Ifindex:      f.IfIndex,
		Ifname:       f.IfName,
		EtherType:    uint32(f.EtherType),
		IpProtocol:   uint32(f.Proto),
		SrcPort:      uint32(f.SrcPort),
		DstPort:      uint32(f.DstPort),
		Length:       f.Len,
	}
	switch f.Kind {
	case datapath.EventDrop:
		ev.Verdict = apiv1.Verdict_VERDICT_DROPPED
		ev.DropReason = f.Reason.String()
		ev.DropReasonCode = uint32(f.Reason)
	case datapath.EventForwarded:
		ev.Verdict = apiv1.Verdict_VERDICT_FORWARDED
	}
	if f.Src.IsValid() {
		ev.SrcIp, ev.DstIp = f.Src.String(), f.Dst.String()
	}
	return ev
}

func nameToProto(n Name) *apiv1.FlowEndpoint {
	if n.ID == 0 {
		return nil
	}
	return &apiv1.FlowEndpoint{Id: n.ID, Name: n.Name, Kind: n.Kind}
}

// OpenPinned opens the events of the BPF datapath pinned in pinDir: the
// Options.Open of a real agent.
func OpenPinned(pinDir string) func() (Source, error) {
	return func() (Source, error) {
		r, err := datapath.OpenEvents(pinDir)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}
