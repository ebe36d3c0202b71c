// Package deviceplugin advertises the node's VM fast-lane attachments to
// kubelet as the extended resource lanekit.io/vhost-user, through kubelet's
// device plugin API (v1beta1).
//
// The resource is how a VM's vhost-user socket reaches KubeVirt's binding
// sidecar: a NetworkAttachmentDefinition annotated
// k8s.v1.cni.cncf.io/resourceName: lanekit.io/vhost-user makes KubeVirt
// request one unit for each VMI interface on it, kubelet allocates a device
// ID, and Multus, seeing the pod's device ID, gives the lanekit CNI plugin a
// CNIDeviceInfoFile to write the socket's device-info to (Multus sets that
// file only for networks with a device ID). Multus copies the device-info
// into the pod's network-status, KubeVirt into the sidecar's network-info.
//
// The devices are slots, one per VM backend the node can run (a backend uid
// each), so the scheduler also places VMs only where lanekit's agent runs
// and has room: when the agent stops, its socket goes and kubelet marks the
// devices unhealthy.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	// ResourceName is the extended resource lanekit advertises.
	ResourceName = "lanekit.io/vhost-user"
	// SocketName is the plugin's socket in kubelet's device plugin
	// directory.
	SocketName = "lanekit-vhost-user.sock"
	// DefaultDir is kubelet's device plugin directory (--root-dir
	// /var/lib/kubelet).
	DefaultDir = pluginapi.DevicePluginPath
	// MaxDevices bounds the device list kubelet keeps per node.
	MaxDevices = 4096
)

// Plugin serves the device plugin API and keeps it registered with kubelet.
type Plugin struct {
	// Dir is kubelet's device plugin directory: kubelet.sock is there and
	// the plugin's socket goes there.
	Dir string
	// Devices is how many VM attachments the node offers (1..MaxDevices).
	Devices int
	Log     *slog.Logger
	// Interval is how often the plugin checks that kubelet still knows it
	// (kubelet removes every plugin socket when it restarts); default 2 s.
	Interval time.Duration

	pluginapi.UnimplementedDevicePluginServer
}

// DeviceID names slot i.
func DeviceID(i int) string { return fmt.Sprintf("vhost-%04d", i) }

func (p *Plugin) devices() []*pluginapi.Device {
	ds := make([]*pluginapi.Device, p.Devices)
	for i := range ds {
		ds[i] = &pluginapi.Device{ID: DeviceID(i), Health: pluginapi.Healthy}
	}
	return ds
}

// GetDevicePluginOptions: no pre-start hook, no preferred allocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the slots once; they stay healthy while the agent
// serves (a stopped agent closes the stream and kubelet marks them
// unhealthy).
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices()}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate accepts any of its slots: a slot carries nothing into the
// container (the VM's socket comes from the CNI ADD); kubelet's device ID
// is what makes Multus ask the plugin for device-info.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		for _, id := range c.GetDevicesIds() {
			if !p.valid(id) {
				return nil, fmt.Errorf("allocate: unknown device %q", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

func (p *Plugin) valid(id string) bool {
	var i int
	if _, err := fmt.Sscanf(id, "vhost-%04d", &i); err != nil {
		return false
	}
	return i >= 0 && i < p.Devices && DeviceID(i) == id
}

// PreStartContainer is not used (GetDevicePluginOptions says so).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves the plugin until ctx ends: it waits for kubelet's socket,
// serves its own, registers, and starts over whenever kubelet removed the
// plugin's socket or replaced its own (a kubelet restart). It removes its
// socket when it returns.
func (p *Plugin) Run(ctx context.Context) error {
	if p.Devices < 1 || p.Devices > MaxDevices {
		return fmt.Errorf("device plugin: %d devices, want 1..%d", p.Devices, MaxDevices)
	}
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	interval := p.Interval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	sock := filepath.Join(p.Dir, SocketName)
	kubelet := filepath.Join(p.Dir, filepath.Base(pluginapi.KubeletSocket))
	waiting := false
	for {
		kubeletID, err := inode(kubelet)
		if err != nil {
			if !waiting {
				p.Log.Info("device plugin: waiting for kubelet", "socket", kubelet, "err", err)
				waiting = true
			}
			if !sleep(ctx, interval) {
				return nil
			}
			continue
		}
		waiting = false
		srv, ownID, err := p.serve(sock)
		if err == nil {
			err = p.register(ctx, kubelet)
		}
		if err != nil {
			if srv != nil {
				srv.Stop()
			}
			p.Log.Warn("device plugin: not registered, retrying", "err", err)
			if !sleep(ctx, interval) {
				return nil
			}
			continue
		}
		p.Log.Info("device plugin registered with kubelet", "resource", ResourceName, "devices", p.Devices, "socket", sock)
		for sleep(ctx, interval) {
			// kubelet, when it starts, removes every socket in the
			// directory but its own and waits for plugins to register.
			if id, err := inode(sock); err != nil || id != ownID {
				p.Log.Info("device plugin: socket removed (kubelet restarted?), registering again")
				break
			}
			if id, err := inode(kubelet); err != nil || id != kubeletID {
				p.Log.Info("device plugin: kubelet's socket changed, registering again")
				break
			}
		}
		srv.Stop()
		if ctx.Err() != nil {
			if id, err := inode(sock); err == nil && id == ownID {
				os.Remove(sock)
			}
			return nil
		}
	}
}

// serve listens on sock (replacing a stale file) and serves the plugin.
func (p *Plugin) serve(sock string) (*grpc.Server, uint64, error) {
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, err
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, 0, err
	}
	id, err := inode(sock)
	if err != nil {
		l.Close()
		return nil, 0, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go srv.Serve(l) //nolint:errcheck // ends with Stop
	return srv, id, nil
}

// register tells kubelet about the plugin's socket and resource.
func (p *Plugin) register(ctx context.Context, kubelet string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     SocketName,
		ResourceName: ResourceName,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register with kubelet (%s): %w", kubelet, err)
	}
	return nil
}

// inode identifies a file, so a replaced socket is noticed.
func inode(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || fi.Mode()&os.ModeSocket == 0 {
		return 0, fmt.Errorf("%s is not a socket", path)
	}
	return st.Ino, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
