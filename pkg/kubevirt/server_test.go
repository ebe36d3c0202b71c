package kubevirt

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/info"
	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/v1alpha3"
)

// networkInfo is the downward API file as KubeVirt writes it from the
// network-status annotation (device-info from the lanekit CNI).
const networkInfo = `{"interfaces":[{"network":"fast","deviceInfo":{"type":"vhost-user","version":"1.1.0",` +
	`"vhost-user":{"mode":"client","path":"/var/run/kubevirt-hooks/lanekit/fast.sock"}}}]}`

func TestNetworkInfoSocket(t *testing.T) {
	cases := []struct {
		name, doc, net, want, wantErr string
	}{
		{name: "vhost-user client", doc: networkInfo, net: "fast", want: "/var/run/kubevirt-hooks/lanekit/fast.sock client"},
		{name: "server mode and mac", net: "n2", want: "/run/x.sock server 02:00:00:00:00:09",
			doc: `{"interfaces":[{"network":"fast"},{"network":"n2","mac":"02:00:00:00:00:09","deviceInfo":{"type":"vhost-user","version":"1.1.0","vhost-user":{"mode":"server","path":"/run/x.sock"}}}]}`},
		{name: "no device info", doc: `{"interfaces":[{"network":"fast"}]}`, net: "fast", wantErr: "no deviceInfo"},
		{name: "pci device", doc: `{"interfaces":[{"network":"fast","deviceInfo":{"type":"pci","version":"1.1.0"}}]}`, net: "fast", wantErr: `type "pci"`},
		{name: "no path", doc: `{"interfaces":[{"network":"fast","deviceInfo":{"type":"vhost-user","vhost-user":{"mode":"client"}}}]}`, net: "fast", wantErr: "no vhost-user path"},
		{name: "relative path", doc: `{"interfaces":[{"network":"fast","deviceInfo":{"type":"vhost-user","vhost-user":{"mode":"client","path":"x.sock"}}}]}`, net: "fast", wantErr: "not absolute"},
		{name: "bad mode", doc: `{"interfaces":[{"network":"fast","deviceInfo":{"type":"vhost-user","vhost-user":{"mode":"both","path":"/p"}}}]}`, net: "fast", wantErr: `mode "both"`},
		{name: "other network", doc: networkInfo, net: "slow", wantErr: `network "slow": not in network-info`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ni, err := ParseNetworkInfo([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			s, err := ni.Socket(tc.net)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(s.Path + " " + s.Mode + " " + s.MAC)
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := ParseNetworkInfo([]byte("{")); err == nil {
		t.Fatal("malformed network-info accepted")
	}
}

func TestInfoSourceWaitsForTheFile(t *testing.T) {
	// kubelet writes the downward API file late: the source polls until the
	// network shows up (here on the third read), with no wall-clock assertion.
	reads := 0
	src := &InfoSource{Path: "/x", Wait: time.Minute, Interval: time.Millisecond, read: func(string) ([]byte, error) {
		reads++
		switch reads {
		case 1:
			return nil, fs.ErrNotExist
		case 2:
			return []byte(`{"interfaces":[{"network":"default"}]}`), nil
		}
		return []byte(networkInfo), nil
	}}
	socks, err := src.Sockets(context.Background(), []string{"fast"})
	if err != nil {
		t.Fatal(err)
	}
	if reads != 3 || socks["fast"].Path != "/var/run/kubevirt-hooks/lanekit/fast.sock" {
		t.Fatalf("reads %d, sockets %+v", reads, socks)
	}

	// A final error (wrong device type) is not retried.
	reads = 0
	src.read = func(string) ([]byte, error) {
		reads++
		return []byte(`{"interfaces":[{"network":"fast","deviceInfo":{"type":"pci"}}]}`), nil
	}
	if _, err := src.Sockets(context.Background(), []string{"fast"}); err == nil || reads != 1 {
		t.Fatalf("err %v after %d reads", err, reads)
	}

	// Missing for good: the error says what was missing and where.
	src.Wait = 5 * time.Millisecond
	src.read = func(string) ([]byte, error) { return nil, fs.ErrNotExist }
	_, err = src.Sockets(context.Background(), []string{"fast"})
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "/x") {
		t.Fatalf("err = %v", err)
	}
}

// TestHookServerEndToEnd runs the hook server on a temporary socket and
// drives it with real gRPC clients, as virt-launcher does: Info, then
// OnDefineDomain, then Shutdown.
func TestHookServerEndToEnd(t *testing.T) {
	dir := t.TempDir()
	infoPath := filepath.Join(dir, "network-info")
	if err := os.WriteFile(infoPath, []byte(networkInfo), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "hooks", "lanekit.sock")
	srv := NewServer("", &InfoSource{Path: infoPath, Wait: 10 * time.Second, Interval: 10 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, sock) }()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	callCtx, callCancel := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(callCancel)

	inf, err := info.NewInfoClient(conn).Info(callCtx, &info.InfoParams{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	var points []string
	for _, p := range inf.GetHookPoints() {
		points = append(points, p.GetName())
	}
	if inf.GetName() != "lanekit" || strings.Join(inf.GetVersions(), ",") != "v1alpha3" ||
		strings.Join(points, ",") != "OnDefineDomain,Shutdown" {
		t.Fatalf("Info = %v", inf)
	}

	domain, err := os.ReadFile("testdata/pod-and-secondary.xml")
	if err != nil {
		t.Fatal(err)
	}
	cb := v1alpha3.NewCallbacksClient(conn)
	res, err := cb.OnDefineDomain(callCtx, &v1alpha3.OnDefineDomainParams{DomainXML: domain, Vmi: vmiJSON("", lkIface)})
	if err != nil {
		t.Fatalf("OnDefineDomain: %v", err)
	}
	want, err := os.ReadFile("testdata/pod-and-secondary.out.xml")
	if err != nil {
		t.Fatal(err)
	}
	if string(res.GetDomainXML()) != string(want) {
		t.Fatalf("OnDefineDomain returned\n%s", res.GetDomainXML())
	}

	// Errors reach virt-launcher as gRPC errors with the reason.
	_, err = cb.OnDefineDomain(callCtx, &v1alpha3.OnDefineDomainParams{DomainXML: []byte("<domain>"), Vmi: vmiJSON("", lkIface)})
	if err == nil || !strings.Contains(err.Error(), "malformed domain xml") {
		t.Fatalf("malformed domain: err = %v", err)
	}
	_, err = cb.OnDefineDomain(callCtx, &v1alpha3.OnDefineDomainParams{DomainXML: domain, Vmi: []byte("not json")})
	if err == nil || !strings.Contains(err.Error(), "parse vmi") {
		t.Fatalf("bad vmi: err = %v", err)
	}

	pre, err := cb.PreCloudInitIso(callCtx, &v1alpha3.PreCloudInitIsoParams{CloudInitData: []byte(`{"x":1}`)})
	if err != nil || string(pre.GetCloudInitData()) != `{"x":1}` {
		t.Fatalf("PreCloudInitIso = %v, %v", pre, err)
	}

	if _, err := cb.Shutdown(callCtx, &v1alpha3.ShutdownParams{}); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-callCtx.Done():
		t.Fatal("server did not stop after Shutdown")
	}
	if _, err := os.Stat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("hook socket left behind: %v", err)
	}
}
