package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/bench"
)

// IncludesSvcLanekit labels the lanekit service rows.
var IncludesSvcLanekit = bench.Includes{BPF: true,
	Detail: "lanekit pod -> VIP: from_pod's LB (service map, Maglev, conntrack, DNAT) then redirect to node 2's lanekit pods; replies rev-NATed"}

// svcApplyChunk is how many services (with their EndpointSlices) one
// ApplyObjects call carries: gRPC's 4 MiB message bound fits about 2,500.
const svcApplyChunk = 1000

// svcCloseBound bounds removing the bench services from the agent.
const svcCloseBound = 2 * time.Minute

// IncludesSvcLanekitHost labels the lanekit host-client rows.
var IncludesSvcLanekitHost = bench.Includes{BPF: true,
	Detail: "client process in node 1's netns and cgroup (the node, a hostNetwork pod) -> VIP: the socket LB translates connect() to a backend (Maglev, no conntrack, no per-packet NAT); routed to node 2's lanekit pods"}

// lanekitSvcRows are the lanekit service rows: client lanekit pod on node 1
// (host: a process in node 1's netns and cgroup, through the socket LB),
// backends the lanekit pods on node 2, services through node 1's agent
// (one agent for every count: the rows are programmed at every repetition).
// prog is shared by the pod and host-client rows (one agent, one set).
func (s *State) lanekitSvcRows(counts []int, cidr netip.Prefix, host bool, prog *AgentProgrammer) ([]bench.SvcPath, string) {
	if s.BaselineOnly {
		return nil, "lanekit: the lab is baseline-only"
	}
	n1, n2 := s.Nodes[0], s.Nodes[1]
	client, ok := firstPod(n1, KindLanekit)
	backends := svcBackends(n2, KindLanekit)
	if !ok || len(backends) == 0 {
		return nil, fmt.Sprintf("lanekit: no lanekit pods on %s and %s", n1.NS, n2.NS)
	}
	mode, inc, clientNS, cgroup := bench.SvcModeLanekit, IncludesSvcLanekit, client.NS, ""
	if host {
		mode, inc, clientNS, cgroup = bench.SvcModeLanekitHost, IncludesSvcLanekitHost, n1.NS, NodeCgroup(n1.Index)
		if _, err := os.Stat(cgroup); err != nil {
			return nil, fmt.Sprintf("%s: node cgroup %s: %v (the lab's agents attach the socket LB there)", mode, cgroup, err)
		}
	}
	dp := bench.NewDatapathProgrammer()
	var rows []bench.SvcPath
	for _, n := range counts {
		row := bench.SvcPath{Mode: mode, Services: n, ClientNS: clientNS, ClientCgroup: cgroup, NodeNS: n1.NS,
			Backends: backends, ClusterCIDR: cidr, Includes: inc, Prog: prog, Shared: true, Raw: s.svcRaw()}
		if !host {
			row.Datapath = dp // timed once, with the pod rows
		}
		rows = append(rows, row)
	}
	return rows, ""
}

// AgentProgrammer programs services into a lanekit agent through its API,
// end to end: ApplyObjects with Service + EndpointSlice JSON (decode,
// validation, store, translation, ApplyServices into the pinned BPF maps).
type AgentProgrammer struct {
	Socket string

	mu     sync.Mutex
	conn   *grpc.ClientConn
	client apiv1.AgentClient
	loaded *bench.SvcSet // what Program applied, for Clear
}

func (a *AgentProgrammer) dial() (apiv1.AgentClient, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client != nil {
		return a.client, nil
	}
	conn, err := grpc.NewClient("unix://"+a.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("agent at %s: %w", a.Socket, err)
	}
	a.conn, a.client = conn, apiv1.NewAgentClient(conn)
	return a.client, nil
}

// Close removes the bench services (best effort, at most svcCloseBound:
// `lanekit lab down` removes what is left with the agent) and closes the
// agent connection.
func (a *AgentProgrammer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), svcCloseBound)
	defer cancel()
	_ = a.Clear(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		a.conn.Close()
		a.conn, a.client = nil, nil
	}
}

// ProgramLabel says what Program times.
func (a *AgentProgrammer) ProgramLabel() string {
	return fmt.Sprintf("agent end to end: the whole set in ApplyObjects gRPC calls of %d Services + EndpointSlices (decode, validate, store, translate, ApplyServices into the BPF maps), summed; the previous (smaller) row's services are already there and unchanged", svcApplyChunk)
}

// ChangeLabel says what Change times.
func (a *AgentProgrammer) ChangeLabel() string {
	return "agent end to end: one ApplyObjects call with the changed EndpointSlice"
}

// Program applies every service of set in chunks; the JSON is encoded
// before the clock starts.
func (a *AgentProgrammer) Program(ctx context.Context, set *bench.SvcSet, limit time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c, err := a.dial()
	if err != nil {
		return 0, err
	}
	var chunks [][]byte
	for from := 0; from < len(set.Services); from += svcApplyChunk {
		data, err := set.ObjectsJSON(from, min(from+svcApplyChunk, len(set.Services)))
		if err != nil {
			return 0, err
		}
		chunks = append(chunks, data)
	}
	if a.loaded == nil {
		// The first row: remove what an interrupted run left, so the row
		// holds exactly its set.
		if err := a.Clear(ctx); err != nil {
			return 0, err
		}
	}
	a.loaded = set
	var took time.Duration
	for i, data := range chunks {
		start := time.Now()
		_, err := c.ApplyObjects(ctx, &apiv1.ApplyObjectsRequest{Data: data})
		took += time.Since(start)
		if err != nil {
			return took, fmt.Errorf("agent apply chunk %d of %d: %w", i+1, len(chunks), err)
		}
	}
	return took, nil
}

// Change applies service changed's EndpointSlice as cur has it.
func (a *AgentProgrammer) Change(ctx context.Context, _, cur *bench.SvcSet, changed int) (time.Duration, error) {
	c, err := a.dial()
	if err != nil {
		return 0, err
	}
	data, err := cur.SliceJSON(changed)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	_, err = c.ApplyObjects(ctx, &apiv1.ApplyObjectsRequest{Data: data})
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("agent apply one EndpointSlice: %w", err)
	}
	return took, nil
}

// Clear deletes the bench's Services and EndpointSlices from the agent:
// those Program applied and any the agent lists in the bench namespace (left
// by an interrupted run). The agent deletes one object per call, so 10,000
// services take minutes; the rows never clear between them (see
// bench.SvcPath.Shared), only Close does.
func (a *AgentProgrammer) Clear(ctx context.Context) error {
	c, err := a.dial()
	if err != nil {
		return err
	}
	names := map[string]bool{}
	if a.loaded != nil {
		for _, svc := range a.loaded.Services {
			names[svc.Name] = true
		}
	}
	list, err := c.ListServices(ctx, &apiv1.ListServicesRequest{})
	if err != nil {
		return fmt.Errorf("agent list services: %w", err)
	}
	for _, f := range list.GetFrontends() {
		if f.GetNamespace() == bench.SvcNamespace {
			names[f.GetName()] = true
		}
	}
	for name := range names {
		for _, ref := range []*apiv1.ObjectRef{
			{Kind: "EndpointSlice", Namespace: bench.SvcNamespace, Name: name + "-ep"},
			{Kind: "Service", Namespace: bench.SvcNamespace, Name: name},
		} {
			if _, err := c.DeleteObject(ctx, &apiv1.DeleteObjectRequest{Object: ref}); err != nil {
				return fmt.Errorf("agent delete %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
			}
		}
	}
	a.loaded = nil
	return nil
}
