package agent

import (
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func TestTmpRestoreTime(t *testing.T) {
	dir := t.TempDir()
	a := newCtlAgent(t, dir, agenttest.NewMemoryDatapath())
	objs := benchServiceObjects(30000)
	t0 := time.Now()
	if _, err := a.ReplaceObjects("Service", svcOnly(objs, true)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReplaceObjects("EndpointSlice", svcOnly(objs, false)); err != nil {
		t.Fatal(err)
	}
	t.Logf("replace: %s", time.Since(t0))
	a.st.Close()
	t0 = time.Now()
	newCtlAgent(t, dir, agenttest.NewMemoryDatapath())
	t.Logf("restore: %s", time.Since(t0))
}

func svcOnly(objs []k8sobj.Object, svc bool) (out []k8sobj.Object) {
	for _, o := range objs {
		if (o.Service != nil) == svc {
			out = append(out, o)
		}
	}
	return out
}
