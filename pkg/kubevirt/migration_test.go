package kubevirt

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kvv1 "kubevirt.io/api/core/v1"
)

// withStatus adds a status to a vmiJSON document.
func withStatus(vmi []byte, status string) []byte {
	s := strings.TrimSuffix(strings.TrimSpace(string(vmi)), "}")
	return []byte(s + `,"status":` + status + `}`)
}

// A migrationState marshalled by KubeVirt's own types parses into the same
// typed state (JSON names kept honest against kubevirt.io/api v1.9.0).
func TestParseMigrationStateMatchesKubeVirtAPI(t *testing.T) {
	start := metav1.NewTime(time.Date(2026, 11, 26, 1, 2, 3, 0, time.UTC))
	end := metav1.NewTime(start.Add(7 * time.Second))
	vmi := kvv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns1"},
		Status: kvv1.VirtualMachineInstanceStatus{
			NodeName:   "node-b",
			Interfaces: []kvv1.VirtualMachineInstanceNetworkInterface{{Name: "fast", MAC: "02:00:00:aa:00:01"}},
			MigrationState: &kvv1.VirtualMachineInstanceMigrationState{
				MigrationUID: "mig-1", SourceNode: "node-a", SourcePod: "virt-launcher-vm1-aaaaa",
				TargetNode: "node-b", TargetPod: "virt-launcher-vm1-bbbbb",
				StartTimestamp: &start, EndTimestamp: &end, Completed: true, FailureReason: "",
			},
		},
	}
	data, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseVMI(data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := v.Migration()
	if err != nil {
		t.Fatal(err)
	}
	want := Migration{UID: "mig-1", SourceNode: "node-a", SourcePod: "virt-launcher-vm1-aaaaa", TargetNode: "node-b",
		TargetPod: "virt-launcher-vm1-bbbbb", Start: start.Time, End: end.Time, Completed: true}
	if m == nil || !m.Start.Equal(want.Start) || !m.End.Equal(want.End) {
		t.Fatalf("migration = %+v, want %+v", m, want)
	}
	m.Start, m.End, want.Start, want.End = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if *m != want {
		t.Fatalf("migration = %+v, want %+v", *m, want)
	}
	if m.Phase() != MigrationCompleted || m.InProgress() || m.Role("node-a") != RoleSource || m.Role("node-b") != RoleTarget || m.Role("node-c") != RoleNone {
		t.Fatalf("phase %s, roles %q %q %q", m.Phase(), m.Role("node-a"), m.Role("node-b"), m.Role("node-c"))
	}
	if v.GuestMAC("fast") != "02:00:00:aa:00:01" || v.GuestMAC("other") != "" || v.Status.NodeName != "node-b" {
		t.Fatalf("status %+v", v.Status)
	}
}

func TestMigrationPhases(t *testing.T) {
	cases := []struct {
		name, state string
		phase       MigrationPhase
		wantErr     string
	}{
		{name: "none", state: ``},
		{name: "scheduling", state: `{"migrationUid":"u","sourceNode":"a","startTimestamp":"2026-11-26T01:00:00Z"}`, phase: MigrationScheduling},
		{name: "running", state: `{"migrationUid":"u","sourceNode":"a","targetNode":"b","targetPod":"p"}`, phase: MigrationRunning},
		{name: "completed", state: `{"migrationUid":"u","sourceNode":"a","targetNode":"b","targetPod":"p","completed":true}`, phase: MigrationCompleted},
		{name: "failed", state: `{"migrationUid":"u","sourceNode":"a","targetNode":"b","targetPod":"p","failed":true,"failureReason":"target pod gone"}`, phase: MigrationFailed},
		{name: "completed and failed", state: `{"migrationUid":"u","completed":true,"failed":true}`, wantErr: "both completed and failed"},
		{name: "same node", state: `{"migrationUid":"u","sourceNode":"a","targetNode":"a"}`, wantErr: `source and target node "a"`},
		{name: "ends before start", state: `{"migrationUid":"u","startTimestamp":"2026-11-26T01:00:00Z","endTimestamp":"2026-11-26T00:59:00Z"}`, wantErr: "ends"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status := `{}`
			if tc.state != "" {
				status = `{"migrationState":` + tc.state + `}`
			}
			v, err := ParseVMI(withStatus(vmiJSON("", lkIface), status))
			if err != nil {
				t.Fatal(err)
			}
			m, err := v.Migration()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.state == "" {
				if m != nil {
					t.Fatalf("no migrationState gave %+v", m)
				}
				return
			}
			if m.Phase() != tc.phase {
				t.Fatalf("phase %s, want %s", m.Phase(), tc.phase)
			}
		})
	}
}

// targetVMI is the VMI virt-launcher hands the target pod's hook: its
// migrationState names this pod; the guest (still on the source) reports
// its MAC. The interface has no macAddress: the MAC comes from device-info.
func targetVMI(guestMAC string) []byte {
	return withStatus(vmiJSON(`"networkInterfaceMultiqueue":true,`, `{"name":"fast","binding":{"name":"lanekit"}}`),
		`{"nodeName":"node-a","interfaces":[{"name":"fast","mac":"`+guestMAC+`"}],
"migrationState":{"migrationUid":"mig-1","sourceNode":"node-a","sourcePod":"virt-launcher-vm1-aaaaa",
"targetNode":"node-b","targetPod":"virt-launcher-vm1-bbbbb","startTimestamp":"2026-11-26T01:00:00Z"}}`)
}

// fixedInfo is an InfoSource serving one network-info document (or error).
func fixedInfo(doc string, err error) *InfoSource {
	return &InfoSource{Path: "/etc/podinfo/network-info", Wait: 50 * time.Millisecond, Interval: time.Millisecond,
		read: func(string) ([]byte, error) { return []byte(doc), err }}
}

// The target's hook gets a domain that may already carry the source's
// vhost-user interface (KubeVirt migrates the source's domain XML): the
// result must point at the target pod's own socket, mode and MAC from the
// target's device-info, keeping only the guest-visible PCI address.
func TestMigrationTargetDomainIsRebuiltFromTargetData(t *testing.T) {
	src, err := os.ReadFile("testdata/migration-source.xml")
	if err != nil {
		t.Fatal(err)
	}
	const targetInfo = `{"interfaces":[{"network":"fast","mac":"02:00:00:aa:00:01","deviceInfo":{"type":"vhost-user","version":"1.1.0",` +
		`"vhost-user":{"mode":"server","path":"/var/run/kubevirt/sockets/target-node-b/lanekit-pod7e0055a6880.sock"}}}]}`
	s := NewServer("", fixedInfo(targetInfo, nil), nil)
	out, err := s.define(context.Background(), src, targetVMI("02:00:00:AA:00:01"))
	if err != nil {
		t.Fatal(err)
	}
	var p parsed
	if err := xml.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	var fast []int
	for n, i := range p.Interfaces {
		if i.Alias.Name == "ua-fast" {
			fast = append(fast, n)
		}
	}
	if len(p.Interfaces) != 2 || len(fast) != 1 {
		t.Fatalf("want the pod interface and one ua-fast, got:\n%s", out)
	}
	i := p.Interfaces[fast[0]]
	if i.Type != "vhostuser" || i.Source.Path != "/var/run/kubevirt/sockets/target-node-b/lanekit-pod7e0055a6880.sock" ||
		i.Source.Mode != "server" || i.Source.Reconnect != nil || i.MAC.Address != "02:00:00:aa:00:01" ||
		i.Driver == nil || i.Driver.Queues != "4" || i.Address == nil || i.Address.Bus != "0x02" {
		t.Fatalf("target interface wrong:\n%s", out)
	}
	if strings.Contains(string(out), "source-node-a") {
		t.Fatalf("the source pod's socket leaked into the target domain:\n%s", out)
	}
	// Defining again on the target (virt-launcher retries) changes nothing.
	again, err := s.define(context.Background(), out, targetVMI("02:00:00:aa:00:01"))
	if err != nil || string(again) != string(out) {
		t.Fatalf("second define differs (err %v):\n%s", err, again)
	}
}

// kubevirt#15634: the target pod has no device-info for the network. The
// hook fails naming the target pod, the network-info and the issue, rather
// than hand back a domain without the interface.
func TestMigrationTargetWithoutDeviceInfoFails(t *testing.T) {
	src, err := os.ReadFile("testdata/migration-source.xml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		info *InfoSource
		why  string
	}{
		{name: "no annotation", info: fixedInfo("", fs.ErrNotExist), why: "read network-info"},
		{name: "network missing", info: fixedInfo(`{"interfaces":[{"network":"default"}]}`, nil), why: `network "fast": not in network-info`},
		{name: "no device-info", info: fixedInfo(`{"interfaces":[{"network":"fast"}]}`, nil), why: "no deviceInfo"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := NewServer("", tc.info, nil).define(context.Background(), src, targetVMI("02:00:00:aa:00:01"))
			if out != nil {
				t.Fatalf("domain produced without device-info:\n%s", out)
			}
			for _, want := range []string{"migration target pod default/virt-launcher-vm1-bbbbb on node node-b", tc.why,
				"kubevirt.io/network-info", "network-status", "kubevirt#15634", "[fast]"} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want it to say %q", err, want)
				}
			}
		})
	}
	// The same gap on a first start is the plain error (no migration named).
	_, err = NewServer("", fixedInfo(`{"interfaces":[{"network":"fast"}]}`, nil), nil).define(context.Background(), src, vmiJSON("", lkIface))
	if err == nil || strings.Contains(err.Error(), "migration") || !strings.Contains(err.Error(), "no deviceInfo") {
		t.Fatalf("start without device-info: err = %v", err)
	}
}

// A target whose VM endpoint got another MAC than the running guest's is
// refused: the guest keeps its MAC across the migration.
func TestMigrationTargetRefusesAnotherMAC(t *testing.T) {
	src, err := os.ReadFile("testdata/migration-source.xml")
	if err != nil {
		t.Fatal(err)
	}
	const otherMAC = `{"interfaces":[{"network":"fast","mac":"02:00:00:bb:00:09","deviceInfo":{"type":"vhost-user","version":"1.1.0",` +
		`"vhost-user":{"mode":"client","path":"/var/run/kubevirt/sockets/lanekit-pod7e0055a6880.sock"}}}]}`
	out, err := NewServer("", fixedInfo(otherMAC, nil), nil).define(context.Background(), src, targetVMI("02:00:00:aa:00:01"))
	if out != nil || err == nil || !strings.Contains(err.Error(), "guest runs with MAC 02:00:00:aa:00:01") ||
		!strings.Contains(err.Error(), "02:00:00:bb:00:09") {
		t.Fatalf("mismatched MAC: out %q, err %v", out, err)
	}
}
