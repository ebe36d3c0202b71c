package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// rpcErr turns an API error into a CLI error: the agent's own message for
// rejected requests, a hint when the agent is not there.
func rpcErr(op string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("%s: agent not reachable at %s (is lanekitd running?): %s", op, agentSocket, st.Message())
	case codes.InvalidArgument:
		return fmt.Errorf("%s: invalid: %s", op, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: agent did not answer in time", op)
	}
	return fmt.Errorf("%s: %s: %s", op, st.Code(), st.Message())
}

// readObjects reads -f FILE (or - for stdin) and checks it locally with the
// decoder the agent uses, so a bad file fails before the agent is asked;
// wantKinds limits what the command applies.
func readObjects(cmd *cobra.Command, file string, wantKinds ...k8sobj.Kind) ([]byte, []k8sobj.Object, error) {
	if file == "" {
		return nil, nil, fmt.Errorf("-f FILE (or - for stdin) is required")
	}
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(cmd.InOrStdin())
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", file, err)
	}
	objs, err := k8sobj.Decode(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(objs) == 0 {
		return nil, nil, fmt.Errorf("%s: no objects", file)
	}
	for _, o := range objs {
		ok := false
		for _, k := range wantKinds {
			ok = ok || o.Kind == k
		}
		if !ok {
			names := make([]string, len(wantKinds))
			for i, k := range wantKinds {
				names[i] = string(k)
			}
			return nil, nil, fmt.Errorf("%s: document %d (%s): this command applies %s objects", file, o.Index, o, strings.Join(names, ", "))
		}
	}
	return data, objs, nil
}

func applyCmd(use, short string, kinds ...k8sobj.Kind) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, _, err := readObjects(cmd, file, kinds...)
			if err != nil {
				return err
			}
			resp, err := agentGet(cmd, 30*time.Second, func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ApplyObjectsResponse, error) {
				return c.ApplyObjects(ctx, &apiv1.ApplyObjectsRequest{Data: data})
			})
			if err != nil {
				return rpcErr("apply", err)
			}
			for _, r := range resp.GetApplied() {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %s\n", refString(r))
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "filename", "f", "", "YAML or JSON file of objects, - for stdin")
	addSocketFlag(c)
	return c
}

func refString(r *apiv1.ObjectRef) string {
	if r.GetNamespace() == "" {
		return r.GetKind() + " " + r.GetName()
	}
	return r.GetKind() + " " + r.GetNamespace() + "/" + r.GetName()
}

func deleteCmd(use, short string, kind k8sobj.Kind) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, ok := strings.Cut(args[0], "/")
			if !ok {
				ns, name = k8sobj.DefaultNamespace, args[0]
			}
			if ns == "" || name == "" || strings.Contains(name, "/") {
				return fmt.Errorf("%q: want NAMESPACE/NAME or NAME", args[0])
			}
			ref := &apiv1.ObjectRef{Kind: string(kind), Namespace: ns, Name: name}
			resp, err := agentGet(cmd, 30*time.Second, func(ctx context.Context, c apiv1.AgentClient) (*apiv1.DeleteObjectResponse, error) {
				return c.DeleteObject(ctx, &apiv1.DeleteObjectRequest{Object: ref})
			})
			if err != nil {
				return rpcErr("delete", err)
			}
			if resp.GetExisted() {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", refString(ref))
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "no %s\n", refString(ref))
			}
			return nil
		},
	}
	addSocketFlag(c)
	return c
}

var serviceListJSON bool

var serviceListCmd = &cobra.Command{
	Use:   "list",
	Short: "List service frontends with their backends",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		resp, err := agentGet(cmd, 10*time.Second, func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ListServicesResponse, error) {
			return c.ListServices(ctx, &apiv1.ListServicesRequest{})
		})
		if err != nil {
			return rpcErr("list services", err)
		}
		if serviceListJSON {
			return printProto(cmd, resp)
		}
		w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SERVICE\tPORT\tSCOPE\tFRONTEND\tID\tMAGLEV\tAFFINITY\tBACKENDS")
		for _, f := range resp.GetFrontends() {
			var bs []string
			for _, b := range f.GetBackends() {
				bs = append(bs, fmt.Sprintf("%s:%d(%s)", b.GetAddress(), b.GetPort(), b.GetState()))
			}
			aff := "-"
			if s := f.GetAffinityTimeoutSeconds(); s > 0 {
				aff = fmt.Sprintf("ClientIP/%ds", s)
			}
			port := f.GetPortName()
			if port == "" {
				port = "-"
			}
			backends := strings.Join(bs, ",")
			if backends == "" {
				backends = "-"
			}
			scope := f.GetScope()
			if f.GetExternal() {
				scope += ",external"
			}
			if f.GetLocal() {
				scope += ",local"
			}
			fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s:%d/%s\t%d\t%d(%d)\t%s\t%s\n", f.GetNamespace(), f.GetName(), port, scope,
				f.GetAddress(), f.GetPort(), f.GetProtocol(), f.GetFrontendId(), f.GetMaglevSize(), f.GetEligibleBackends(), aff, backends)
		}
		return w.Flush()
	},
}

var policyListJSON bool

var policyListCmd = &cobra.Command{
	Use:   "list",
	Short: "List NetworkPolicies with their verdict counters",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		resp, err := agentGet(cmd, 10*time.Second, func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ListPoliciesResponse, error) {
			return c.ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
		})
		if err != nil {
			return rpcErr("list policies", err)
		}
		if policyListJSON {
			return printProto(cmd, resp)
		}
		w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "POLICY\tTYPES\tALLOWED\tDENIED\tPROGRAMMED")
		for _, p := range resp.GetPolicies() {
			var types []string
			if p.GetIngress() {
				types = append(types, "Ingress")
			}
			if p.GetEgress() {
				types = append(types, "Egress")
			}
			programmed := "yes"
			if m := p.GetNotProgrammed(); m != "" {
				programmed = "no: " + m + " full (isolates, allows nothing)"
			}
			fmt.Fprintf(w, "%s/%s\t%s\t%d\t%d\t%s\n", p.GetNamespace(), p.GetName(), strings.Join(types, ","), p.GetAllowedPackets(), p.GetDeniedPackets(), programmed)
		}
		return w.Flush()
	},
}

// printProto prints an API response as JSON with the proto field names and
// every field (zero counters included).
func printProto(cmd *cobra.Command, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil { // protojson's own spacing is deliberately unstable
		return err
	}
	out.WriteByte('\n')
	_, err = cmd.OutOrStdout().Write(out.Bytes())
	return err
}

// labelsText formats labels as k=v,... sorted; "-" when empty.
func labelsText(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func init() {
	serviceCmd := &cobra.Command{Use: "service", Short: "Apply, list and delete Kubernetes Services and EndpointSlices"}
	serviceCmd.AddCommand(
		applyCmd("apply", "Apply Service and EndpointSlice objects (all or none)", k8sobj.KindService, k8sobj.KindEndpointSlice),
		deleteCmd("delete NAMESPACE/NAME", "Delete a Service (its EndpointSlices stay until deleted or replaced)", k8sobj.KindService),
		serviceListCmd,
	)
	serviceListCmd.Flags().BoolVar(&serviceListJSON, "json", false, "print JSON")
	addSocketFlag(serviceListCmd)
	policyCmd := &cobra.Command{Use: "policy", Short: "Apply, list and delete Kubernetes NetworkPolicies"}
	policyCmd.AddCommand(
		applyCmd("apply", "Apply NetworkPolicy (and Namespace, Pod) objects (all or none)", k8sobj.KindNetworkPolicy, k8sobj.KindNamespace, k8sobj.KindPod),
		deleteCmd("delete NAMESPACE/NAME", "Delete a NetworkPolicy", k8sobj.KindNetworkPolicy),
		policyListCmd,
	)
	policyListCmd.Flags().BoolVar(&policyListJSON, "json", false, "print JSON")
	addSocketFlag(policyListCmd)
	rootCmd.AddCommand(serviceCmd, policyCmd)
}
