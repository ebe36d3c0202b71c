package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/info"
	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/v1alpha3"
)

// The command wires its flags through: a hook socket where asked, the
// binding name from LANEKIT_BINDING, and it exits when virt-launcher calls
// Shutdown.
func TestRunServesUntilShutdown(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "hooks", "x.sock")
	t.Setenv("LANEKIT_BINDING", "lanekit-fast")
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"--socket", sock, "--network-info", filepath.Join(dir, "none"), "--wait", "1ms"})
	}()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	res, err := info.NewInfoClient(conn).Info(ctx, &info.InfoParams{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if res.GetName() != "lanekit-fast" {
		t.Fatalf("name %q", res.GetName())
	}
	// No network-info file: a clear error naming the file, not a hang.
	vmi := `{"spec":{"domain":{"devices":{"interfaces":[{"name":"n","binding":{"name":"lanekit-fast"}}]}}}}`
	_, err = v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: []byte("<domain><devices/></domain>"), Vmi: []byte(vmi)})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "none")) {
		t.Fatalf("err = %v", err)
	}
	// The same on a migration target (kubevirt#15634: the target pod got no
	// network-info): virt-launcher is told it is the target pod's device-info
	// that is missing, and gets no domain.
	target := `{"metadata":{"name":"vm1","namespace":"ns1"},` +
		`"spec":{"domain":{"devices":{"interfaces":[{"name":"n","binding":{"name":"lanekit-fast"}}]}}},` +
		`"status":{"migrationState":{"sourceNode":"a","targetNode":"b","targetPod":"virt-launcher-vm1-b"}}}`
	res2, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: []byte("<domain><devices/></domain>"), Vmi: []byte(target)})
	if res2 != nil || status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "migration target pod ns1/virt-launcher-vm1-b on node b") ||
		!strings.Contains(err.Error(), "kubevirt#15634") || !strings.Contains(err.Error(), filepath.Join(dir, "none")) {
		t.Fatalf("migration target without network-info: %v, %v", res2, err)
	}
	if _, err := v1alpha3.NewCallbacksClient(conn).Shutdown(ctx, &v1alpha3.ShutdownParams{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("run did not return after Shutdown")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left: %v", err)
	}
}

func TestRunRejectsArguments(t *testing.T) {
	if err := run([]string{"extra"}); err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Fatalf("err = %v", err)
	}
}
