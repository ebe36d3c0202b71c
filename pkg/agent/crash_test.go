package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/store"
)

// crashed is what the test's crash hook panics with: unwinding skips the
// ADD's undo stack (its error is still nil), like a killed process.
type crashed struct{ step string }

// crashIn runs fn with the crash hook set to stop at step; it reports
// whether the crash happened.
func crashIn(t *testing.T, step string, fn func()) (hit bool) {
	t.Helper()
	old := crashAt
	crashAt = func(s string) {
		if s == step {
			panic(crashed{s})
		}
	}
	defer func() {
		crashAt = old
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			hit = true
		}
	}()
	fn()
	return false
}

// storeCounts returns the raw record counts, pending records included.
func storeCounts(t *testing.T, a *Agent) (eps, ids, ips int) {
	t.Helper()
	err := a.st.View(func(tx *store.Tx) error {
		var err error
		if eps, err = tx.Count(store.Endpoints); err != nil {
			return err
		}
		if ids, err = tx.Count(store.EndpointIDs); err != nil {
			return err
		}
		ips, err = tx.Count(store.IPAM)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return eps, ids, ips
}

// lkDevices lists the lk* devices in the node namespace.
func (fx *fixture) lkDevices(t *testing.T) []string {
	t.Helper()
	var out []string
	fx.nodeNS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "lk") {
				out = append(out, l.Attrs().Name)
			}
		}
		return nil
	})
	return out
}

// TestCrashDuringAdd stops the agent after each step of an ADD (no undo
// runs), restarts it on the same state and datapath, and checks that the
// unfinished ADD left nothing (records, addresses, IDs, devices, datapath
// entries) while a finished one is kept, and that the container and a new
// one can be added and deleted afterwards.
func TestCrashDuringAdd(t *testing.T) {
	for _, step := range AddSteps {
		t.Run(step, func(t *testing.T) {
			fx := newFixture(t)
			dp := agenttest.NewMemoryDatapath()
			a := fx.start(t, dp)
			pod := netnstest.New(t, "cpod")
			req := AddRequest{ContainerID: "crash-" + step, IfName: "eth0", Netns: pod.Path()}
			if !crashIn(t, step, func() { a.Add(req) }) {
				t.Fatalf("add did not reach step %s", step)
			}
			a.Close() // the process is gone; pins (dp) and devices stay

			a = fx.start(t, dp)
			defer a.Close()
			eps, ids, ips := storeCounts(t, a)
			dpIDs, _ := dp.Endpoints()
			devs := fx.lkDevices(t)
			if step == StepCommitted {
				if eps != 1 || ids != 1 || ips != 1 || len(dpIDs) != 1 || len(devs) != 1 {
					t.Fatalf("committed add not kept: %d records %d ids %d ips, datapath %v, devices %v", eps, ids, ips, dpIDs, devs)
				}
				if _, err := a.Check(req.ContainerID, req.IfName, pod.Path()); err != nil {
					t.Fatalf("check committed endpoint: %v", err)
				}
			} else if eps+ids+ips != 0 || len(dpIDs) != 0 || len(devs) != 0 {
				t.Fatalf("crash after %s leaked: %d records %d ids %d ips, datapath %v, devices %v", step, eps, ids, ips, dpIDs, devs)
			}

			// The same container again, and a new one.
			ep, err := a.Add(req)
			if err != nil {
				t.Fatalf("add after restart: %v", err)
			}
			pod2 := netnstest.New(t, "cpod2")
			ep2, err := a.Add(AddRequest{ContainerID: "fresh-" + step, IfName: "eth0", Netns: pod2.Path()})
			if err != nil || ep2.ID == ep.ID || ep2.IP == ep.IP {
				t.Fatalf("add of a new container after restart: %+v %v (first %d %s)", ep2, err, ep.ID, ep.IP)
			}
			for _, cid := range []string{req.ContainerID, "fresh-" + step} {
				if _, err := a.Check(cid, "eth0", ""); err != nil {
					t.Fatalf("check %s: %v", cid, err)
				}
				if existed, err := a.Del(cid, "eth0"); err != nil || !existed {
					t.Fatalf("del %s = %v %v", cid, existed, err)
				}
			}
			eps, ids, ips = storeCounts(t, a)
			dpIDs, _ = dp.Endpoints()
			if eps+ids+ips != 0 || len(dpIDs) != 0 || len(fx.lkDevices(t)) != 0 {
				t.Fatalf("after del: %d records %d ids %d ips, datapath %v, devices %v", eps, ids, ips, dpIDs, fx.lkDevices(t))
			}
		})
	}
}

// TestPendingHiddenFromList: an ADD in progress is not listed as an endpoint.
func TestPendingHiddenFromList(t *testing.T) {
	fx := newFixture(t)
	a := fx.start(t, agenttest.NewMemoryDatapath())
	defer a.Close()
	pod := netnstest.New(t, "hpod")
	var listed []string
	crashIn(t, StepDatapath, func() {
		old := crashAt
		crashAt = func(s string) {
			if s == StepDevice {
				eps, _ := a.List()
				for _, ep := range eps {
					listed = append(listed, fmt.Sprint(ep.ID))
				}
			}
			old(s)
		}
		defer func() { crashAt = old }()
		a.Add(AddRequest{ContainerID: "h", IfName: "eth0", Netns: pod.Path()})
	})
	if len(listed) != 0 {
		t.Fatalf("pending endpoint listed: %v", listed)
	}
}
