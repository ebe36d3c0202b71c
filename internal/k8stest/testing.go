package k8stest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// StartT starts a control plane for t on 127.0.0.1 and stops it when t ends.
// Without the binaries t is skipped (saying how to build them), or fails when
// LANEKIT_K8S_REQUIRED is set (CI).
func StartT(t testing.TB) *Server {
	t.Helper()
	return StartTOptions(t, Options{})
}

// StartTOptions is StartT with options (e.g. a Service range larger than
// the default /16 for more than 65,000 Services).
func StartTOptions(t testing.TB, o Options) *Server {
	t.Helper()
	RequireBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// RequireBins skips t unless etcd and kube-apiserver are built, or fails it
// under LANEKIT_K8S_REQUIRED (CI) or make test (make deps builds them).
func RequireBins(t testing.TB) {
	t.Helper()
	if _, _, err := Bins(); err != nil {
		if os.Getenv(EnvRequired) != "" {
			t.Fatalf("%s is set: %v", EnvRequired, err)
		}
		testutil.MissingDep(t, "%v", err)
	}
}
