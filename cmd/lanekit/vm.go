package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

var vmCmd = &cobra.Command{
	Use:   "vm",
	Short: "Manage VM endpoints (the VM fast lane)",
}

var (
	vmNetns  string
	vmQueues uint32
	vmMAC    string
	vmMTU    uint32
	vmJSON   bool
	vmOwner  string
)

// parseOwner parses "UID" or "UID:GID".
func parseOwner(s string) (uid, gid *uint32, err error) {
	if s == "" {
		return nil, nil, nil
	}
	u, g, hasGID := strings.Cut(s, ":")
	n, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		return nil, nil, fmt.Errorf("--socket-owner %q: uid: %w", s, err)
	}
	v := uint32(n)
	uid = &v
	if hasGID {
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("--socket-owner %q: gid: %w", s, err)
		}
		w := uint32(n)
		gid = &w
	}
	return uid, gid, nil
}

// vmView is what `vm add --json` and `vm list --json` print per VM.
type vmView struct {
	Name     string `json:"name"`
	ID       uint32 `json:"id"`
	Address  string `json:"address"`
	Gateway  string `json:"gateway"`
	MAC      string `json:"mac"`
	Queues   uint32 `json:"queues"`
	MTU      uint32 `json:"mtu"`
	Socket   string `json:"socket"`
	Serving  bool   `json:"serving"`
	Netns    string `json:"netns"`
	HostDev  string `json:"host_dev"`
	XSKBase  uint32 `json:"xsk_base"`
	DeviceIf int32  `json:"ifindex"`
	// Backend is set when the agent runs the VM's lanekit-vhost (a CNI VM
	// attachment).
	Backend *vmBackendView `json:"backend,omitempty"`
}

type vmBackendView struct {
	PID        int32  `json:"pid"`
	Restarts   uint32 `json:"restarts"`
	Socket     string `json:"socket"`      // as QEMU sees it
	HostSocket string `json:"host_socket"` // on the node
	Attachment string `json:"attachment"`  // CNI container ID/ifname
}

func viewOf(v *apiv1.VM) vmView {
	out := vmView{
		Name: v.GetName(), Address: v.GetAddress(), Gateway: v.GetGateway(), MAC: v.GetMac(),
		Queues: v.GetQueues(), MTU: v.GetMtu(), Socket: v.GetSocket(), Serving: v.GetServing(), XSKBase: v.GetXskBase(),
	}
	if b := v.GetBackend(); b != nil {
		out.Backend = &vmBackendView{PID: b.GetPid(), Restarts: b.GetRestarts(), Socket: b.GetSocket(), HostSocket: b.GetHostSocket(),
			Attachment: b.GetAttachment().GetContainerId() + "/" + b.GetAttachment().GetIfname()}
	}
	if ep := v.GetEndpoint(); ep != nil {
		out.ID, out.Netns = ep.GetId(), ep.GetNetns()
		if ifs := ep.GetInterfaces(); len(ifs) == 2 {
			out.HostDev, out.DeviceIf = ifs[0].GetName(), ifs[1].GetIfindex()
		}
	}
	return out
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// agentGet runs one bounded call on the agent and returns its answer.
func agentGet[T any](cmd *cobra.Command, timeout time.Duration, call func(ctx context.Context, c apiv1.AgentClient) (T, error)) (T, error) {
	var out T
	err := agentCall(cmd, timeout, func(ctx context.Context, c apiv1.AgentClient) (err error) {
		out, err = call(ctx, c)
		return err
	})
	return out, err
}

// agentCall dials the agent and runs f with a context bounded by timeout.
func agentCall(cmd *cobra.Command, timeout time.Duration, f func(ctx context.Context, c apiv1.AgentClient) error) error {
	c, closeFn, err := dialAgent()
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	return f(ctx, c)
}

var vmAddCmd = &cobra.Command{
	Use:   "add NAME --netns PATH",
	Short: "Create a VM endpoint and its AF_XDP socket server",
	Long: `Create a VM endpoint: an address from the node's pod CIDR, a device eth0 in the
VM's netns with one queue per queue pair, the steering program on it, and a unix
socket where the vhost-user backend (lanekit-vhost) fetches the AF_XDP sockets.
The guest's virtio-net MAC must be the printed MAC.`,
	Args: cobra.ExactArgs(1),
	RunE: func(cmd *cobra.Command, args []string) error {
		if vmNetns == "" {
			return fmt.Errorf("vm add %s: --netns is required", args[0])
		}
		return agentCall(cmd, 30*time.Second, func(ctx context.Context, c apiv1.AgentClient) error {
			uid, gid, err := parseOwner(vmOwner)
			if err != nil {
				return err
			}
			resp, err := c.AddVM(ctx, &apiv1.AddVMRequest{Name: args[0], Netns: vmNetns, Queues: vmQueues, Mac: vmMAC, Mtu: vmMTU,
				SocketUid: uid, SocketGid: gid})
			if err != nil {
				return fmt.Errorf("add vm %s: %w", args[0], err)
			}
			v := viewOf(resp.GetVm())
			out := cmd.OutOrStdout()
			if vmJSON {
				return printJSON(out, v)
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "vm:\t%s (endpoint %d)\n", v.Name, v.ID)
			fmt.Fprintf(w, "ip:\t%s\n", v.Address)
			fmt.Fprintf(w, "gateway:\t%s\n", v.Gateway)
			fmt.Fprintf(w, "mac:\t%s (the guest's virtio-net MAC must be this one)\n", v.MAC)
			fmt.Fprintf(w, "queues:\t%d\n", v.Queues)
			fmt.Fprintf(w, "mtu:\t%d\n", v.MTU)
			fmt.Fprintf(w, "socket:\t%s (lanekit-vhost fetches its AF_XDP sockets here)\n", v.Socket)
			return w.Flush()
		})
	},
}

var vmDelCmd = &cobra.Command{
	Use:   "del NAME",
	Short: "Delete a VM endpoint (deleting an unknown one succeeds)",
	Args:  cobra.ExactArgs(1),
	RunE: func(cmd *cobra.Command, args []string) error {
		return agentCall(cmd, 30*time.Second, func(ctx context.Context, c apiv1.AgentClient) error {
			resp, err := c.DelVM(ctx, &apiv1.DelVMRequest{Name: args[0]})
			if err != nil {
				return fmt.Errorf("del vm %s: %w", args[0], err)
			}
			if resp.GetExisted() {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted vm %s\n", args[0])
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "no vm %s\n", args[0])
			}
			return nil
		})
	},
}

var vmListCmd = &cobra.Command{
	Use:   "list",
	Short: "List the VM endpoints of the local agent",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		return agentCall(cmd, 30*time.Second, func(ctx context.Context, c apiv1.AgentClient) error {
			resp, err := c.ListVMs(ctx, &apiv1.ListVMsRequest{})
			if err != nil {
				return fmt.Errorf("list vms: %w", err)
			}
			views := []vmView{}
			for _, v := range resp.GetVms() {
				views = append(views, viewOf(v))
			}
			out := cmd.OutOrStdout()
			if vmJSON {
				return printJSON(out, map[string]any{"vms": views})
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tID\tIP\tMAC\tQUEUES\tSERVING\tSOCKET\tNETNS\tBACKEND")
			for _, v := range views {
				backend := "-"
				if b := v.Backend; b != nil {
					backend = fmt.Sprintf("pid %d, %d restarts, %s", b.PID, b.Restarts, b.HostSocket)
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%t\t%s\t%s\t%s\n", v.Name, v.ID, v.Address, v.MAC, v.Queues, v.Serving, v.Socket, v.Netns, backend)
			}
			return w.Flush()
		})
	},
}

func init() {
	vmAddCmd.Flags().StringVar(&vmNetns, "netns", "", "path of the VM's network namespace (required)")
	vmAddCmd.Flags().Uint32Var(&vmQueues, "queues", 1, "queue pairs (1-16)")
	vmAddCmd.Flags().StringVar(&vmMAC, "mac", "", "MAC of the VM (default: random)")
	vmAddCmd.Flags().Uint32Var(&vmMTU, "mtu", 0, "MTU (default: the agent's, at most 1500)")
	vmAddCmd.Flags().BoolVar(&vmJSON, "json", false, "print JSON")
	vmAddCmd.Flags().StringVar(&vmOwner, "socket-owner", "", "UID[:GID] owning the backend's fd-passing socket (the unprivileged backend's user; default root)")
	vmListCmd.Flags().BoolVar(&vmJSON, "json", false, "print JSON")
	for _, c := range []*cobra.Command{vmAddCmd, vmDelCmd, vmListCmd} {
		addSocketFlag(c)
		vmCmd.AddCommand(c)
	}
	rootCmd.AddCommand(vmCmd)
}
