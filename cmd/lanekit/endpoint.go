package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/cniplugin"
)

// agentSocket is the --socket flag shared by the commands that talk to lanekitd.
var agentSocket string

func dialAgent() (apiv1.AgentClient, func(), error) {
	conn, err := agentConn()
	if err != nil {
		return nil, nil, err
	}
	return apiv1.NewAgentClient(conn), func() { conn.Close() }, nil
}

// agentConn opens a gRPC connection to the agent's socket (the Agent and
// Observer services share it).
func agentConn() (*grpc.ClientConn, error) {
	if _, err := os.Stat(agentSocket); err != nil {
		return nil, fmt.Errorf("agent not reachable at %s: %w", agentSocket, err)
	}
	conn, err := grpc.NewClient("unix://"+agentSocket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(apiv1.MaxMessage), grpc.MaxCallSendMsgSize(apiv1.MaxMessage)))
	if err != nil {
		return nil, fmt.Errorf("connect to agent at %s: %w", agentSocket, err)
	}
	return conn, nil
}

func addSocketFlag(c *cobra.Command) {
	c.Flags().StringVar(&agentSocket, "socket", cniplugin.DefaultAgentSocket, "the agent's unix socket")
}

var endpointCmd = &cobra.Command{
	Use:   "endpoint",
	Short: "Inspect the agent's endpoints",
}

var endpointListCmd = &cobra.Command{
	Use:   "list",
	Short: "List the endpoints of the local agent",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		resp, err := agentGet(cmd, 10*time.Second, func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ListEndpointsResponse, error) {
			return c.ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
		})
		if err != nil {
			return fmt.Errorf("list endpoints: %w", err)
		}
		w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tKIND\tCONTAINER\tIFNAME\tIP\tMODE\tHOST-DEV\tIFINDEX\tNETNS\tPOD\tLABELS\tIDENTITY\tEGRESS-LIMIT\tSENT pkts/bytes\tTO-STACK pkts/bytes\tRECEIVED pkts/bytes\tDROPS\tPOLICY-DROPS")
		for _, ep := range resp.GetEndpoints() {
			ip, hostDev, ifindex := "", "", int32(0)
			for i, ipc := range ep.GetIps() { // dual-stack: both addresses
				if i > 0 {
					ip += ","
				}
				ip += ipc.GetAddress()
			}
			if len(ep.GetInterfaces()) > 0 {
				hostDev, ifindex = ep.GetInterfaces()[0].GetName(), ep.GetInterfaces()[0].GetIfindex()
			}
			cid := ep.GetAttachment().GetContainerId()
			if len(cid) > 16 {
				cid = cid[:16]
			}
			c := ep.GetCounters()
			pol := ep.GetPolicy()
			pod, identity, limit := "-", "-", "-"
			if pol != nil {
				pod, identity = pol.GetNamespace()+"/"+pol.GetName(), fmt.Sprint(pol.GetIdentity())
			}
			if bps := pol.GetEgressBps(); bps > 0 {
				limit = fmt.Sprintf("%.3g Mbit/s", float64(bps)/1e6)
			}
			if pol.GetBandwidthNote() != "" {
				limit += " (" + pol.GetBandwidthNote() + ")"
			}
			drops, policyDrops := splitPolicyDrops(c.GetDrops())
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%d/%d\t%s\t%s\n", ep.GetId(), kindName(ep.GetKind()), cid,
				ep.GetAttachment().GetIfname(), ip, ep.GetDeviceMode(), hostDev, ifindex, ep.GetNetns(),
				pod, labelsText(pol.GetLabels()), identity, limit,
				c.GetFromPackets(), c.GetFromBytes(), c.GetStackPackets(), c.GetStackBytes(), c.GetToPackets(), c.GetToBytes(),
				dropsText(drops), dropsText(policyDrops))
		}
		return w.Flush()
	},
}

func kindName(k apiv1.EndpointKind) string {
	switch k {
	case apiv1.EndpointKind_ENDPOINT_KIND_VM:
		return "vm"
	default:
		return "pod"
	}
}

func init() {
	addSocketFlag(endpointListCmd)
	endpointCmd.AddCommand(endpointListCmd)
	rootCmd.AddCommand(endpointCmd)
}

// dropsText formats drops by reason, "-" when there are none.
func dropsText(d map[string]uint64) string {
	if len(d) == 0 {
		return "-"
	}
	var parts []string
	for r, n := range d {
		parts = append(parts, fmt.Sprintf("%s=%d", r, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// splitPolicyDrops separates the policy drop reasons (named "policy-..." after
// enum lk_drop_reason's DROP_POLICY_* values) from the others.
func splitPolicyDrops(d map[string]uint64) (other, policy map[string]uint64) {
	for r, n := range d {
		if strings.HasPrefix(r, "policy") {
			if policy == nil {
				policy = map[string]uint64{}
			}
			policy[r] = n
			continue
		}
		if other == nil {
			other = map[string]uint64{}
		}
		other[r] = n
	}
	return other, policy
}
