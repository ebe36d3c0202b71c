package kubevirt

import (
	"bytes"
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// vmiJSON builds a VMI like virt-controller hands to virt-launcher: a pod
// network with masquerade plus the given secondary interfaces.
func vmiJSON(extra string, ifaces ...string) []byte {
	nets := []string{`{"name":"default","pod":{}}`}
	all := []string{`{"name":"default","masquerade":{}}`}
	for _, i := range ifaces {
		all = append(all, i)
		name := strings.SplitN(strings.SplitN(i, `"name":"`, 2)[1], `"`, 2)[0]
		nets = append(nets, `{"name":"`+name+`","multus":{"networkName":"lanekit-vm"}}`)
	}
	return []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
"metadata":{"name":"vm1","namespace":"default","uid":"6a1b3d5e-0c3f-5b8e-9a77-2f4b7c1d9e01"},
"spec":{"domain":{"cpu":{"cores":4,"sockets":1,"threads":1},"resources":{"requests":{"memory":"1Gi"}},
"devices":{` + extra + `"interfaces":[` + strings.Join(all, ",") + `],"disks":[{"name":"containerdisk","disk":{"bus":"virtio"}}]}},
"networks":[` + strings.Join(nets, ",") + `]}}`)
}

const lkIface = `{"name":"fast","binding":{"name":"lanekit"},"macAddress":"02:00:00:AA:00:01"}`

func sockets(names ...string) map[string]VhostSocket {
	m := map[string]VhostSocket{}
	for _, n := range names {
		m[n] = VhostSocket{Path: "/var/run/kubevirt-hooks/lanekit/" + n + ".sock", Mode: "client"}
	}
	return m
}

// parsed is what the rewritten domain says, decoded independently of the
// span editor.
type parsed struct {
	Interfaces []struct {
		Type   string `xml:"type,attr"`
		Source struct {
			Type      string `xml:"type,attr"`
			Path      string `xml:"path,attr"`
			Mode      string `xml:"mode,attr"`
			Reconnect *struct {
				Enabled string `xml:"enabled,attr"`
			} `xml:"reconnect"`
		} `xml:"source"`
		Model struct {
			Type string `xml:"type,attr"`
		} `xml:"model"`
		MAC struct {
			Address string `xml:"address,attr"`
		} `xml:"mac"`
		Driver *struct {
			Queues string `xml:"queues,attr"`
		} `xml:"driver"`
		Address *struct {
			Bus  string `xml:"bus,attr"`
			Slot string `xml:"slot,attr"`
		} `xml:"address"`
		Alias struct {
			Name string `xml:"name,attr"`
		} `xml:"alias"`
	} `xml:"devices>interface"`
	MemoryBacking *struct {
		Source *struct {
			Type string `xml:"type,attr"`
		} `xml:"source"`
		Access *struct {
			Mode string `xml:"mode,attr"`
		} `xml:"access"`
		Hugepages *struct{} `xml:"hugepages"`
	} `xml:"memoryBacking"`
}

func TestRewrite(t *testing.T) {
	two := `{"name":"fast2","binding":{"name":"lanekit"},"macAddress":"02:00:00:aa:00:02"}`
	cases := []struct {
		name    string
		in      string // testdata file
		vmi     []byte
		socks   map[string]VhostSocket
		golden  string
		queues  string // expected <driver queues>, "" = no driver element
		nIfaces int
		wantErr string
	}{
		{name: "pod + one lanekit", in: "pod-and-secondary.xml", vmi: vmiJSON("", lkIface), socks: sockets("fast"),
			golden: "pod-and-secondary.out.xml", nIfaces: 2},
		{name: "multiqueue = vCPUs", in: "pod-and-secondary.xml", vmi: vmiJSON(`"networkInterfaceMultiqueue":true,`, lkIface),
			socks: sockets("fast"), golden: "multiqueue.out.xml", queues: "4", nIfaces: 2},
		{name: "two lanekit interfaces", in: "pod-and-secondary.xml", vmi: vmiJSON("", lkIface, two),
			socks: sockets("fast", "fast2"), golden: "two.out.xml", nIfaces: 3},
		{name: "hugepages keep their backing", in: "hugepages.xml", vmi: vmiJSON("", lkIface), socks: sockets("fast"),
			golden: "hugepages.out.xml", nIfaces: 2},
		{name: "no other interface", in: "no-interfaces.xml", vmi: vmiJSON("", lkIface), socks: sockets("fast"),
			golden: "no-interfaces.out.xml", nIfaces: 1},
		{name: "pci address and boot order", in: "pod-and-secondary.xml",
			vmi:   vmiJSON("", `{"name":"fast","binding":{"name":"lanekit"},"macAddress":"02:00:00:aa:00:01","pciAddress":"0000:02:05.0","bootOrder":2}`),
			socks: sockets("fast"), golden: "pci.out.xml", nIfaces: 2},
		{name: "mac from network-info", in: "pod-and-secondary.xml", vmi: vmiJSON("", `{"name":"fast","binding":{"name":"lanekit"}}`),
			socks:  map[string]VhostSocket{"fast": {Path: "/var/run/kubevirt-hooks/lanekit/fast.sock", Mode: "client", MAC: "02:00:00:AA:00:01"}},
			golden: "pod-and-secondary.out.xml", nIfaces: 2},
		{name: "socket missing", in: "pod-and-secondary.xml", vmi: vmiJSON("", lkIface), socks: sockets("other"),
			wantErr: `interface "fast": no vhost-user socket reported`},
		{name: "no lanekit interface", in: "pod-and-secondary.xml", vmi: vmiJSON(""), socks: sockets("fast"),
			wantErr: `no interface uses the "lanekit" binding`},
		{name: "no mac anywhere", in: "pod-and-secondary.xml", vmi: vmiJSON("", `{"name":"fast","binding":{"name":"lanekit"}}`),
			socks: sockets("fast"), wantErr: `interface "fast": no MAC address`},
		{name: "non-virtio model", in: "pod-and-secondary.xml", vmi: vmiJSON("", `{"name":"fast","binding":{"name":"lanekit"},"macAddress":"02:00:00:aa:00:01","model":"e1000"}`),
			socks: sockets("fast"), wantErr: `model "e1000" cannot be vhost-user`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", tc.in))
			if err != nil {
				t.Fatal(err)
			}
			vmi, err := ParseVMI(tc.vmi)
			if err != nil {
				t.Fatal(err)
			}
			atts, err := Plan(vmi, BindingName, tc.socks)
			var out []byte
			if err == nil {
				out, err = Rewrite(in, atts)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.golden, out)

			// Idempotent: the hook can run again on its own output.
			again, err := Rewrite(out, atts)
			if err != nil {
				t.Fatalf("second run: %v", err)
			}
			if !bytes.Equal(again, out) {
				t.Fatalf("second run changed the domain:\n%s", again)
			}

			var p parsed
			if err := xml.Unmarshal(out, &p); err != nil {
				t.Fatalf("output is not XML: %v", err)
			}
			if len(p.Interfaces) != tc.nIfaces {
				t.Fatalf("%d interfaces, want %d", len(p.Interfaces), tc.nIfaces)
			}
			for _, a := range atts {
				found := false
				for _, i := range p.Interfaces {
					if i.Alias.Name != "ua-"+a.Name {
						continue
					}
					found = true
					if i.Type != "vhostuser" || i.Source.Type != "unix" || i.Source.Path != tc.socks[a.Name].Path ||
						i.Source.Mode != "client" || i.Source.Reconnect == nil || i.Model.Type != "virtio-non-transitional" {
						t.Errorf("interface %s: %+v", a.Name, i)
					}
					if i.MAC.Address != strings.ToLower(a.MAC) {
						t.Errorf("interface %s: mac %q, want %q", a.Name, i.MAC.Address, a.MAC)
					}
					q := ""
					if i.Driver != nil {
						q = i.Driver.Queues
					}
					if q != tc.queues {
						t.Errorf("interface %s: queues %q, want %q", a.Name, q, tc.queues)
					}
				}
				if !found {
					t.Errorf("no interface with alias ua-%s", a.Name)
				}
			}
			if p.MemoryBacking == nil || p.MemoryBacking.Source == nil || p.MemoryBacking.Source.Type != "memfd" ||
				p.MemoryBacking.Access == nil || p.MemoryBacking.Access.Mode != "shared" {
				t.Errorf("memoryBacking: %+v", p.MemoryBacking)
			}
			if bytes.Contains(in, []byte("<hugepages>")) && p.MemoryBacking.Hugepages == nil {
				t.Error("hugepages dropped")
			}
			// Everything the hook does not own is kept byte for byte: the
			// input is the output minus the inserted runs.
			if !isSubsequenceOfLines(in, out) {
				t.Error("input lines are not preserved in order in the output")
			}
		})
	}
}

// isSubsequenceOfLines reports whether every line of in appears in out, in
// order (the rewrite only inserts lines, or replaces a whole lanekit
// interface).
func isSubsequenceOfLines(in, out []byte) bool {
	il, ol := strings.Split(string(in), "\n"), strings.Split(string(out), "\n")
	j := 0
	for _, l := range il {
		for j < len(ol) && ol[j] != l {
			j++
		}
		if j == len(ol) {
			return false
		}
		j++
	}
	return true
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s:\n%s", path, got)
	}
}

func TestRewriteReplacesExistingInterface(t *testing.T) {
	// An interface with the lanekit alias that is not vhost-user yet (say a
	// binding registered with domainAttachmentType: tap) is replaced, and
	// its libvirt-assigned PCI address kept.
	in := []byte("<domain type=\"kvm\">\n\t<memory unit=\"b\">1</memory>\n\t<devices>\n" +
		"\t\t<interface type=\"ethernet\">\n\t\t\t<target dev=\"podabc\" managed=\"no\"></target>\n" +
		"\t\t\t<address type=\"pci\" domain=\"0x0000\" bus=\"0x07\" slot=\"0x00\" function=\"0x0\"></address>\n" +
		"\t\t\t<alias name=\"ua-fast\"></alias>\n\t\t</interface>\n\t</devices>\n</domain>\n")
	atts := []Attachment{{Name: "fast", Socket: "/s.sock", Mode: "server", MAC: "02:00:00:aa:00:01", Model: "virtio-non-transitional", Queues: 2}}
	out, err := Rewrite(in, atts)
	if err != nil {
		t.Fatal(err)
	}
	var p parsed
	if err := xml.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Interfaces) != 1 {
		t.Fatalf("got %d interfaces:\n%s", len(p.Interfaces), out)
	}
	i := p.Interfaces[0]
	if i.Type != "vhostuser" || i.Source.Mode != "server" || i.Source.Reconnect != nil || i.Address == nil || i.Address.Bus != "0x07" ||
		i.Driver == nil || i.Driver.Queues != "2" || bytes.Contains(out, []byte("podabc")) {
		t.Fatalf("replaced interface wrong:\n%s", out)
	}
}

func TestRewriteErrors(t *testing.T) {
	atts := []Attachment{{Name: "fast", Socket: "/s", Mode: "client", MAC: "02:00:00:00:00:01", Model: "virtio-non-transitional"}}
	cases := []struct{ name, doc, want string }{
		{"malformed", "<domain><devices></domain>", "malformed domain xml"},
		{"not a domain", "<network><devices/></network>", "root element is <network>"},
		{"no devices", "<domain><memory>1</memory></domain>", "no <devices>"},
		{"private access", "<domain><memoryBacking><access mode=\"private\"/></memoryBacking><devices/></domain>", `access mode "private"`},
		{"anonymous source", "<domain><memoryBacking><source type=\"anonymous\"/></memoryBacking><devices/></domain>", `source type "anonymous"`},
		{"private numa cell", "<domain><cpu><numa><cell id=\"0\" memAccess=\"private\"/></numa></cpu><devices/></domain>", "numa cell 0 has memAccess=private"},
		{"empty", "", "no root element"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Rewrite([]byte(tc.doc), atts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRewriteCompactDocument(t *testing.T) {
	// A document without indentation gets no newlines either, and a
	// self-closing <devices/> and <memoryBacking/> are expanded.
	in := []byte(`<domain type="kvm"><memory unit="b">1</memory><memoryBacking/><devices/></domain>`)
	atts := []Attachment{{Name: "fast", Socket: "/s", Mode: "client", MAC: "02:00:00:00:00:01", Model: "virtio-non-transitional"}}
	out, err := Rewrite(in, atts)
	if err != nil {
		t.Fatal(err)
	}
	want := `<domain type="kvm"><memory unit="b">1</memory><memoryBacking><source type="memfd"/><access mode="shared"/></memoryBacking>` +
		`<devices><interface type="vhostuser"><source type="unix" path="/s" mode="client"><reconnect enabled="yes" timeout="1"/></source>` +
		`<model type="virtio-non-transitional"/><mac address="02:00:00:00:00:01"/><alias name="ua-fast"/></interface></devices></domain>`
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	again, err := Rewrite(out, atts)
	if err != nil || !bytes.Equal(again, out) {
		t.Fatalf("not idempotent (%v):\n%s", err, again)
	}
}

func TestQueues(t *testing.T) {
	cases := []struct {
		spec string
		want uint32
	}{
		{`{"domain":{"cpu":{"cores":4},"devices":{"networkInterfaceMultiqueue":true}}}`, 4},
		{`{"domain":{"cpu":{"cores":2,"sockets":2,"threads":2},"devices":{"networkInterfaceMultiqueue":true}}}`, 8},
		{`{"domain":{"cpu":{"cores":4},"devices":{"networkInterfaceMultiqueue":false}}}`, 1},
		{`{"domain":{"cpu":{"cores":4},"devices":{}}}`, 1},
		{`{"domain":{"resources":{"limits":{"cpu":"2500m"},"requests":{"cpu":"1"}},"devices":{"networkInterfaceMultiqueue":true}}}`, 3},
		{`{"domain":{"resources":{"requests":{"cpu":"2"}},"devices":{"networkInterfaceMultiqueue":true}}}`, 2},
		{`{"domain":{"devices":{"networkInterfaceMultiqueue":true}}}`, 1},
		{`{"domain":{"cpu":{"cores":64,"sockets":8},"devices":{"networkInterfaceMultiqueue":true}}}`, 256},
	}
	for _, tc := range cases {
		v, err := ParseVMI([]byte(`{"spec":` + tc.spec + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := v.Queues(); got != tc.want {
			t.Errorf("%s: queues %d, want %d", tc.spec, got, tc.want)
		}
	}
}
