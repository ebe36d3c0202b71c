// Package cniplugin is the lanekit CNI plugin (type "lanekit", spec 1.1.0):
// a thin client that forwards ADD, DEL, CHECK, STATUS and GC to the node
// agent over its unix socket and turns the answers into CNI results and
// CNI error codes.
package cniplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/beneath"
)

// PluginType is the CNI "type" this plugin answers to.
const PluginType = "lanekit"

// DefaultAgentSocket is where lanekitd listens unless the config says otherwise.
const DefaultAgentSocket = "/run/lanekit/agent.sock"

// DefaultDeviceInfoDir is where Multus asks for device-info files
// (runtimeConfig.CNIDeviceInfoFile); the plugin writes and removes them as
// root, so it refuses a path anywhere else.
const DefaultDeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo"

// DeviceInfoDirEnv overrides DefaultDeviceInfoDir. It is the plugin's
// environment, set by the runtime or installer; a network configuration
// (a NetworkAttachmentDefinition) cannot change it.
const DeviceInfoDirEnv = "LANEKIT_CNI_DEVICE_INFO_DIR"

// DeviceInfoDir is the directory device-info files must be under.
func DeviceInfoDir() string {
	if d := os.Getenv(DeviceInfoDirEnv); d != "" {
		return filepath.Clean(d)
	}
	return DefaultDeviceInfoDir
}

// Timeout bounds each call to the agent.
var Timeout = 60 * time.Second

// VersionInfo lists the CNI spec versions the plugin speaks.
var VersionInfo = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

// About is printed for the VERSION command's human-readable form.
const About = "lanekit CNI plugin: forwards to the lanekitd agent"

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.PluginConf
	// AgentSocket is the agent's API socket (lanekitd --socket); default
	// /run/lanekit/agent.sock.
	AgentSocket *string `json:"agentSocket,omitempty"`
	// MTU is the pod device's MTU; 0 (default) leaves it to the agent
	// (lanekitd --mtu, else the uplink's).
	MTU int `json:"mtu,omitempty"`
	// Subnet is an optional IPv4 CIDR the node's pod CIDR must lie in (the
	// ADD is refused otherwise); addresses come from the pod CIDR.
	Subnet string `json:"subnet,omitempty"`
	// VhostUser makes the network a VM attachment (KubeVirt's binding
	// "lanekit", through a NetworkAttachmentDefinition): the interface is a
	// VM endpoint, the agent runs its vhost-user backend and the plugin
	// reports the socket as device-info.
	VhostUser *VhostUserConf `json:"vhostUser,omitempty"`
	// RuntimeConfig holds the capability arguments the runtime (Multus)
	// passes: the VM's MAC and where to write device-info.
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// VhostUserConf is where a VM attachment's vhost-user socket goes.
type VhostUserConf struct {
	// Queues: queue pairs; 0 (default) takes the VMI's (one per vCPU with
	// networkInterfaceMultiqueue), else 1.
	Queues int `json:"queues,omitempty"`
	// SocketDir is the socket's directory as QEMU sees it; default
	// /var/run/kubevirt/sockets (virt-launcher's "sockets" emptyDir).
	SocketDir string `json:"socketDir,omitempty"`
	// PodVolume is the launcher pod's emptyDir mounted at SocketDir; default
	// "sockets". The agent finds it under kubelet's pod directory.
	PodVolume string `json:"podVolume,omitempty"`
	// HostSocketDir replaces PodVolume with a host directory that QEMU sees
	// at SocketDir (runtimes without kubelet volumes).
	HostSocketDir string `json:"hostSocketDir,omitempty"`
}

// RuntimeConfig holds the capability arguments the plugin understands
// ("capabilities": {"mac": true, "CNIDeviceInfoFile": true}).
type RuntimeConfig struct {
	// MAC is the VM's MAC (Multus passes the network selection's "mac").
	MAC string `json:"mac,omitempty"`
	// CNIDeviceInfoFile is where Multus wants the device-info written.
	CNIDeviceInfoFile string `json:"CNIDeviceInfoFile,omitempty"`
}

// Socket returns the agent socket path from the config or the default.
func (c *NetConf) Socket() string {
	if c.AgentSocket == nil {
		return DefaultAgentSocket
	}
	return *c.AgentSocket
}

// ParseConf decodes and validates stdin; errors carry CNI codes 6 (decode)
// or 7 (invalid config).
func ParseConf(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "failed to decode network configuration", err.Error())
	}
	invalid := func(msg string) error { return types.NewError(types.ErrInvalidNetworkConfig, msg, "") }
	if conf.Type != PluginType {
		return nil, invalid(fmt.Sprintf("config type is %q, want %q", conf.Type, PluginType))
	}
	if conf.Name == "" {
		return nil, invalid("config has no network name")
	}
	if conf.AgentSocket != nil && *conf.AgentSocket == "" {
		return nil, invalid("agentSocket is empty (omit it for " + DefaultAgentSocket + ")")
	}
	if conf.MTU != 0 && (conf.MTU < 68 || conf.MTU > 65535) {
		return nil, invalid(fmt.Sprintf("mtu %d out of range 68-65535", conf.MTU))
	}
	if conf.Subnet != "" {
		p, err := netip.ParsePrefix(conf.Subnet)
		if err != nil || !p.Addr().Is4() {
			return nil, invalid(fmt.Sprintf("subnet %q is not an IPv4 CIDR", conf.Subnet))
		}
	}
	if v := conf.VhostUser; v != nil {
		if v.Queues < 0 || v.Queues > 16 {
			return nil, invalid(fmt.Sprintf("vhostUser.queues %d out of range 0-16", v.Queues))
		}
		for k, d := range map[string]string{"socketDir": v.SocketDir, "hostSocketDir": v.HostSocketDir} {
			if d != "" && (!filepath.IsAbs(d) || filepath.Clean(d) != d) {
				return nil, invalid(fmt.Sprintf("vhostUser.%s %q is not a clean absolute path", k, d))
			}
		}
		if v.PodVolume != "" && v.HostSocketDir != "" {
			return nil, invalid("vhostUser: set podVolume or hostSocketDir, not both")
		}
		if v.PodVolume != "" && (strings.ContainsAny(v.PodVolume, "/.") || len(v.PodVolume) > 63) {
			return nil, invalid(fmt.Sprintf("vhostUser.podVolume %q is not a volume name", v.PodVolume))
		}
	}
	if m := conf.RuntimeConfig.MAC; m != "" {
		if hw, err := net.ParseMAC(m); err != nil || len(hw) != 6 {
			return nil, invalid(fmt.Sprintf("runtimeConfig.mac %q is not an Ethernet address", m))
		}
	}
	if f := conf.RuntimeConfig.CNIDeviceInfoFile; f != "" {
		if _, err := beneath.Rel(DeviceInfoDir(), f); err != nil {
			return nil, invalid(fmt.Sprintf("runtimeConfig.CNIDeviceInfoFile: %v", err))
		}
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "failed to decode prevResult", err.Error())
		}
	}
	return conf, nil
}

// Funcs returns the plugin's command handlers for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: CmdAdd, Del: CmdDel, Check: CmdCheck, Status: CmdStatus, GC: CmdGC}
}

// Dial connects to the agent at socket. A missing socket is reported as
// code 11 (try again later): the agent is not running.
func Dial(socket string) (apiv1.AgentClient, func(), error) {
	if fi, err := os.Stat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		msg := "lanekit agent is not running"
		if err == nil {
			err = fmt.Errorf("%s is not a socket", socket)
		}
		return nil, nil, types.NewError(types.ErrTryAgainLater, msg, fmt.Sprintf("agent socket %s: %v", socket, err))
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, types.NewError(types.ErrTryAgainLater, "cannot reach the lanekit agent", err.Error())
	}
	return apiv1.NewAgentClient(conn), func() { conn.Close() }, nil
}

// cniError maps an agent error to a CNI error. unavailable is the code for
// an unreachable agent (11 for most commands, 50 for STATUS).
func cniError(op string, err error, unavailable uint) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	st, _ := status.FromError(err)
	msg := st.Message()
	code := uint(types.ErrInternal)
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return types.NewError(unavailable, "lanekit agent unavailable", fmt.Sprintf("%s: %s", op, msg))
	case codes.NotFound:
		code = types.ErrUnknownContainer
	case codes.InvalidArgument:
		code = types.ErrInvalidNetworkConfig
	case codes.FailedPrecondition, codes.AlreadyExists:
		code = types.ErrInvalidEnvironmentVariables
	case codes.ResourceExhausted:
		code = types.ErrTryAgainLater
	}
	return types.NewError(code, op+" failed", msg)
}

// kindOf is the endpoint kind a network config makes.
func kindOf(conf *NetConf) apiv1.EndpointKind {
	if conf.VhostUser != nil {
		return apiv1.EndpointKind_ENDPOINT_KIND_VM
	}
	return apiv1.EndpointKind_ENDPOINT_KIND_POD
}

func attachment(args *skel.CmdArgs) *apiv1.Attachment {
	return &apiv1.Attachment{ContainerId: args.ContainerID, Ifname: args.IfName}
}

func labelsFromArgs(cniArgs string) map[string]string {
	if cniArgs == "" {
		return nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(cniArgs, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" {
			out[k] = v
		}
	}
	return out
}

func checkEnv(args *skel.CmdArgs, needNetns bool) error {
	if args.ContainerID == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID is empty", "")
	}
	if args.IfName == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_IFNAME is empty", "")
	}
	if needNetns && args.Netns == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is empty", "")
	}
	return nil
}

// Result builds the CNI result for an endpoint: interfaces [host, pod], the
// pod's /32 on interface 1, the gateway and the routes.
func Result(ep *apiv1.Endpoint) (*current.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	for _, itf := range ep.GetInterfaces() {
		res.Interfaces = append(res.Interfaces, &current.Interface{
			Name: itf.GetName(), Mac: itf.GetMac(), Mtu: int(itf.GetMtu()), Sandbox: itf.GetSandbox(),
		})
	}
	for _, ipc := range ep.GetIps() {
		ip, ipn, err := net.ParseCIDR(ipc.GetAddress())
		if err != nil {
			return nil, fmt.Errorf("endpoint address %q: %w", ipc.GetAddress(), err)
		}
		idx := int(ipc.GetInterface())
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: &idx,
			Address:   net.IPNet{IP: ip, Mask: ipn.Mask},
			Gateway:   net.ParseIP(ipc.GetGateway()),
		})
	}
	for _, r := range ep.GetRoutes() {
		_, dst, err := net.ParseCIDR(r.GetDst())
		if err != nil {
			return nil, fmt.Errorf("endpoint route %q: %w", r.GetDst(), err)
		}
		rt := &types.Route{Dst: *dst}
		if r.GetGateway() != "" {
			rt.GW = net.ParseIP(r.GetGateway())
		}
		if r.GetScope() != 0 {
			scope := int(r.GetScope())
			rt.Scope = &scope
		}
		res.Routes = append(res.Routes, rt)
	}
	return res, nil
}

// withAgent parses the network config, checks the CNI environment (the
// netns too when needNetns) and runs f against the agent, bounded by Timeout.
func withAgent(args *skel.CmdArgs, needNetns bool, f func(ctx context.Context, conf *NetConf, c apiv1.AgentClient) error) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := checkEnv(args, needNetns); err != nil {
		return err
	}
	c, closeFn, err := Dial(conf.Socket())
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	return f(ctx, conf, c)
}

// CmdAdd asks the agent for the endpoint and prints the result.
func CmdAdd(args *skel.CmdArgs) error {
	return withAgent(args, true, func(ctx context.Context, conf *NetConf, c apiv1.AgentClient) error {
		req := &apiv1.AddEndpointRequest{
			Kind: apiv1.EndpointKind_ENDPOINT_KIND_POD, Attachment: attachment(args), Netns: args.Netns,
			Network: conf.Name, Mtu: uint32(conf.MTU), Subnet: conf.Subnet, Labels: labelsFromArgs(args.Args),
		}
		if v := conf.VhostUser; v != nil {
			req.Kind = apiv1.EndpointKind_ENDPOINT_KIND_VM
			req.VhostUser = &apiv1.VhostUserAttachment{
				Queues: uint32(v.Queues), Mac: conf.RuntimeConfig.MAC,
				SocketDir: v.SocketDir, PodVolume: v.PodVolume, HostSocketDir: v.HostSocketDir,
			}
		}
		var devinfo *os.File
		if f := conf.RuntimeConfig.CNIDeviceInfoFile; f != "" && conf.VhostUser != nil {
			// Refused before the agent does anything: a link on the way.
			d, err := openDeviceInfoDir(f, true)
			if err != nil {
				return err
			}
			defer d.Close()
			devinfo = d
		}
		resp, err := c.AddEndpoint(ctx, req)
		if err != nil {
			return cniError("add", err, types.ErrTryAgainLater)
		}
		res, err := Result(resp.GetEndpoint())
		if err != nil {
			return types.NewError(types.ErrInternal, "bad endpoint from agent", err.Error())
		}
		if conf.VhostUser != nil {
			dev := resp.GetVhostUser()
			if dev.GetPath() == "" {
				return types.NewError(types.ErrInternal, "bad answer from agent", "a VM attachment without a vhost-user socket")
			}
			if devinfo != nil {
				if err := WriteDeviceInfo(devinfo, filepath.Base(conf.RuntimeConfig.CNIDeviceInfoFile), dev.GetMode(), dev.GetPath()); err != nil {
					return types.NewError(types.ErrIOFailure, "write device-info", err.Error())
				}
			}
		}
		return types.PrintResult(res, conf.CNIVersion)
	})
}

// DeviceInfo is the NPWG device-info document (spec 1.1.0) for a
// vhost-user interface: Multus copies it into the pod's network-status,
// KubeVirt into the binding sidecar's network-info.
type DeviceInfo struct {
	Type      string          `json:"type"`
	Version   string          `json:"version"`
	VhostUser DeviceVhostUser `json:"vhost-user"`
}

// DeviceVhostUser is device-info's vhost-user part: mode is QEMU's role.
type DeviceVhostUser struct {
	Mode string `json:"mode"`
	Path string `json:"path"`
}

// openDeviceInfoDir opens the directory of a device-info file beneath
// DeviceInfoDir, creating it (mode 0700) if create, else nil when it does
// not exist; a path outside it or through a symbolic link is an
// invalid-config CNI error.
func openDeviceInfoDir(path string, create bool) (*os.File, error) {
	root := DeviceInfoDir()
	rel, err := beneath.Rel(root, path)
	if err == nil {
		var mode os.FileMode
		if create {
			mode = 0o700
		}
		var d *os.File
		if d, err = beneath.OpenDir(root, filepath.Dir(rel), mode); err == nil {
			return d, nil
		}
	}
	if !create && errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, beneath.ErrOutside) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "runtimeConfig.CNIDeviceInfoFile refused", err.Error())
	}
	return nil, types.NewError(types.ErrIOFailure, "device-info directory", err.Error())
}

// WriteDeviceInfo writes a vhost-user device-info file name in dir
// atomically, never through a symbolic link.
func WriteDeviceInfo(dir *os.File, name, mode, socket string) error {
	raw, err := json.Marshal(DeviceInfo{Type: "vhost-user", Version: "1.1.0", VhostUser: DeviceVhostUser{Mode: mode, Path: socket}})
	if err != nil {
		return err
	}
	return beneath.WriteFileAt(dir, name, raw, 0o644)
}

// CmdDel asks the agent to delete the endpoint; unknown ones are success.
func CmdDel(args *skel.CmdArgs) error {
	return withAgent(args, false, func(ctx context.Context, conf *NetConf, c apiv1.AgentClient) error {
		_, err := c.DelEndpoint(ctx, &apiv1.DelEndpointRequest{
			Kind: kindOf(conf), Attachment: attachment(args), Netns: args.Netns,
		})
		if err != nil {
			return cniError("del", err, types.ErrTryAgainLater)
		}
		if f := conf.RuntimeConfig.CNIDeviceInfoFile; f != "" && conf.VhostUser != nil {
			d, err := openDeviceInfoDir(f, false)
			if err != nil || d == nil { // nil: no directory, no file
				return err
			}
			defer d.Close()
			if err := beneath.RemoveAt(d, filepath.Base(f)); err != nil {
				return types.NewError(types.ErrIOFailure, "remove device-info", err.Error())
			}
		}
		return nil
	})
}

// CmdCheck asks the agent to verify the endpoint and compares it with the
// previous result.
func CmdCheck(args *skel.CmdArgs) error {
	return withAgent(args, true, func(ctx context.Context, conf *NetConf, c apiv1.AgentClient) error {
		resp, err := c.CheckEndpoint(ctx, &apiv1.CheckEndpointRequest{
			Kind: kindOf(conf), Attachment: attachment(args), Netns: args.Netns,
		})
		if err != nil {
			return cniError("check", err, types.ErrTryAgainLater)
		}
		if conf.PrevResult == nil {
			return nil
		}
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, "failed to convert prevResult", err.Error())
		}
		var have []string
		for _, ipc := range resp.GetEndpoint().GetIps() {
			have = append(have, ipc.GetAddress())
		}
		for _, ipc := range prev.IPs {
			found := false
			for _, h := range have {
				if h == ipc.Address.String() {
					found = true
				}
			}
			if !found {
				return types.NewError(types.ErrInternal, "check failed",
					fmt.Sprintf("prevResult address %s not on the endpoint (has %v)", ipc.Address.String(), have))
			}
		}
		return nil
	})
}

// CmdStatus reports whether the plugin can add endpoints: code 50 when the
// agent is unreachable or not ready.
func CmdStatus(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	c, closeFn, err := Dial(conf.Socket())
	if err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return types.NewError(types.ErrPluginNotAvailable, te.Msg, te.Details)
		}
		return types.NewError(types.ErrPluginNotAvailable, "lanekit agent unavailable", err.Error())
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	st, err := c.Status(ctx, &apiv1.StatusRequest{})
	if err != nil {
		return cniError("status", err, types.ErrPluginNotAvailable)
	}
	if !st.GetReady() {
		return types.NewError(types.ErrPluginNotAvailable, "lanekit agent not ready", st.GetReason())
	}
	return nil
}

// CmdGC removes every endpoint not in the config's valid attachments.
func CmdGC(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	c, closeFn, err := Dial(conf.Socket())
	if err != nil {
		return err
	}
	defer closeFn()
	req := &apiv1.GCRequest{}
	for _, at := range conf.ValidAttachments {
		req.ValidAttachments = append(req.ValidAttachments, &apiv1.Attachment{ContainerId: at.ContainerID, Ifname: at.IfName})
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if _, err := c.GC(ctx, req); err != nil {
		return cniError("gc", err, types.ErrTryAgainLater)
	}
	return nil
}
