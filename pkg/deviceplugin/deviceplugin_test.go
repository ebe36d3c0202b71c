package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is kubelet's registration service: it records each request.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	reqs chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string) (*fakeKubelet, func()) {
	t.Helper()
	k := &fakeKubelet{reqs: make(chan *pluginapi.RegisterRequest, 8)}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go srv.Serve(l) //nolint:errcheck
	return k, srv.Stop
}

func waitRegister(t *testing.T, k *fakeKubelet) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register with kubelet")
		return nil
	}
}

func TestPluginRegistersAndServes(t *testing.T) {
	dir, err := os.MkdirTemp("", "lkdp") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &Plugin{Dir: dir, Devices: 3, Interval: 50 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	// No kubelet yet: the plugin waits for it.
	time.Sleep(200 * time.Millisecond)
	k, stopKubelet := startKubelet(t, dir)
	defer stopKubelet()
	r := waitRegister(t, k)
	if r.ResourceName != ResourceName || r.Endpoint != SocketName || r.Version != pluginapi.Version {
		t.Fatalf("register request %+v", r)
	}

	// kubelet's side: list the devices, allocate one.
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
	defer lcancel()
	stream, err := c.ListAndWatch(lctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Devices) != 3 {
		t.Fatalf("%d devices, want 3", len(resp.Devices))
	}
	for i, d := range resp.Devices {
		if d.ID != DeviceID(i) || d.Health != pluginapi.Healthy {
			t.Errorf("device %d: %+v", i, d)
		}
	}
	if _, err := c.Allocate(lctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{DeviceID(2)}}}}); err != nil {
		t.Errorf("allocate %s: %v", DeviceID(2), err)
	}
	for _, bad := range []string{DeviceID(3), "vhost-1", "vhost-0001x", "other"} {
		if _, err := c.Allocate(lctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{bad}}}}); err == nil {
			t.Errorf("allocate %q: accepted", bad)
		}
	}

	// A kubelet restart removes the plugin's socket: it registers again.
	if err := os.Remove(filepath.Join(dir, SocketName)); err != nil {
		t.Fatal(err)
	}
	waitRegister(t, k)
	if _, err := inode(filepath.Join(dir, SocketName)); err != nil {
		t.Errorf("socket not served again: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if _, err := os.Stat(filepath.Join(dir, SocketName)); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestPluginRefusesDeviceCount(t *testing.T) {
	for _, n := range []int{0, -1, MaxDevices + 1} {
		if err := (&Plugin{Dir: t.TempDir(), Devices: n}).Run(context.Background()); err == nil {
			t.Errorf("%d devices accepted", n)
		}
	}
}
