package agent

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
}

// TestVMReadoptChecksNetns: while the agent is down the VM's netns path
// comes to name another namespace that has an eth0 with the same ifindex
// and MAC (ifindexes repeat in every namespace). The restarted agent must
// not attach the VM's steering program there.
func TestVMReadoptChecksNetns(t *testing.T) {
	for _, b := range vmBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			fx := newFixture(t)
			if b.bpfDir != "" {
				t.Cleanup(func() { datapath.Unpin(b.bpfDir) })
			}
			vmDir := filepath.Join(fx.stateDir, "vm")
			a := b.start(t, fx, vmDir)
			defer func() { a.Close() }()
			name := fmt.Sprintf("lk-t-vmid-%s-%d", b.name, os.Getpid())
			path := "/run/netns/" + name
			ipCmd(t, "netns", "add", name)
			t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
			v, err := a.AddVM(AddVMRequest{Name: "vmid", Netns: path, Queues: 1})
			if err != nil {
				t.Fatalf("add vm: %v", err)
			}
			ep := v.Endpoint
			if ep.VM.NetnsIno == 0 {
				t.Fatalf("vm netns identity not recorded: %+v", ep.VM)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			// Keep the old namespace (and so the VM's devices) alive, and make
			// the path name a new one with a look-alike eth0.
			old, err := ns.GetNS(path)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			os.Remove(path)
			ipCmd(t, "netns", "add", name)
			ipCmd(t, "-n", name, "link", "add", "name", "eth0", "index", strconv.Itoa(ep.IfIndex),
				"type", "veth", "peer", "name", "impostor", "index", strconv.Itoa(ep.IfIndex+100))
			ipCmd(t, "-n", name, "link", "set", "eth0", "address", ep.MAC, "up")

			a = b.start(t, fx, vmDir)
			vms, err := a.ListVMs()
			if err != nil || len(vms) != 1 || vms[0].Serving {
				t.Fatalf("vms after restart = %+v %v, want vmid kept but not served", vms, err)
			}
			impostor := linkIn(t, netnsAt(t, path), "eth0")
			if impostor == nil || impostor.Attrs().Index != ep.IfIndex {
				t.Fatalf("look-alike eth0: %+v", impostor)
			}
			if x := impostor.Attrs().Xdp; x != nil && x.Attached {
				t.Fatalf("steering program attached to the look-alike eth0 in another namespace")
			}
			if b.bpfDir == "" {
				if _, ok := a.dp.(*fakeDatapath).VM(ep.ID); ok {
					t.Fatal("vm re-attached in another namespace")
				}
			}
			// Deleting it still works.
			if existed, err := a.DelVM("vmid"); err != nil || !existed {
				t.Fatalf("del vm = %v %v", existed, err)
			}
		})
	}
}

func netnsAt(t *testing.T, path string) ns.NetNS {
	t.Helper()
	n, err := ns.GetNS(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// TestCrashDuringAddVM kills the ADD of a VM after each step and checks
// that the restarted agent leaves no record, address, socket slot, device,
// socket file or datapath state (for BPF: no lk_vm_* or lk_pod_* pins and no
// endpoint entries), then adds and deletes the VM.
func TestCrashDuringAddVM(t *testing.T) {
	steps := []string{StepIntent, StepDevice, StepRecorded, StepDatapath, StepVMAttach}
	for _, b := range vmBackends(t) {
		for _, step := range steps {
			t.Run(b.name+"/"+step, func(t *testing.T) {
				fx := newFixture(t)
				if b.bpfDir != "" {
					t.Cleanup(func() { datapath.Unpin(b.bpfDir) })
				}
				vmDir := filepath.Join(fx.stateDir, "vm")
				var mem *fakeDatapath
				start := func() *Agent {
					if b.bpfDir != "" {
						return b.start(t, fx, vmDir)
					}
					// The memory datapath stands for the pins: it outlives the agent.
					if mem == nil {
						mem = newFake()
					}
					a, err := New(Config{
						StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
						PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: fx.nodeNS.Path(), VMSocketDir: vmDir,
						OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return mem, nil },
					}, quietLog())
					if err != nil {
						t.Fatal(err)
					}
					return a
				}
				a := start()
				vmNS := netnstest.New(t, "vmc")
				req := AddVMRequest{Name: "crashvm", Netns: vmNS.Path(), Queues: 2}
				if !crashIn(t, step, func() { a.AddVM(req) }) {
					t.Fatalf("add vm did not reach %s", step)
				}
				a.Close()
				a = start()
				defer func() { a.Close() }()
				eps, ids, ips := storeCounts(t, a)
				if eps+ids+ips+slotCount(t, a) != 0 || len(fx.lkDevices(t)) != 0 {
					t.Fatalf("crash after %s leaked: %d records %d ids %d ips %d slot ranges, devices %v",
						step, eps, ids, ips, slotCount(t, a), fx.lkDevices(t))
				}
				if _, err := os.Stat(filepath.Join(vmDir, "crashvm.sock")); !os.IsNotExist(err) {
					t.Fatalf("socket file left: %v", err)
				}
				if dpIDs, _ := a.dp.Endpoints(); len(dpIDs) != 0 {
					t.Fatalf("datapath endpoints left: %v", dpIDs)
				}
				if b.bpfDir != "" {
					st, err := datapath.InspectPins(b.bpfDir)
					if err != nil {
						t.Fatal(err)
					}
					if err := st.Leaks(); err != nil {
						t.Fatalf("datapath leaked: %v", err)
					}
				} else if _, ok := mem.VM(1); ok || mem.SocketSlots() != 0 {
					t.Fatalf("vm registration or %d socket slots left", mem.SocketSlots())
				}
				v, err := a.AddVM(req)
				if err != nil {
					t.Fatalf("add vm after restart: %v", err)
				}
				fetchVM(t, v.Endpoint.VM.Socket, "crashvm", 2)
				if existed, err := a.DelVM("crashvm"); err != nil || !existed {
					t.Fatalf("del vm = %v %v", existed, err)
				}
				vmNS.Do(func(ns.NetNS) error {
					if _, err := netlink.LinkByName("eth0"); err == nil {
						t.Error("eth0 left in the vm netns")
					}
					return nil
				})
			})
		}
	}
}
