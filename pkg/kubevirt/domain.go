package kubevirt

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// Attachment is what one VMI interface becomes in the domain: a vhost-user
// NIC on the socket lanekit provides.
type Attachment struct {
	Name      string // VMI interface/network name; the domain alias is ua-<Name>
	Socket    string // unix socket path as seen by QEMU
	Mode      string // libvirt source mode: client (lanekit-vhost listens) or server
	MAC       string
	Model     string // virtio-non-transitional, virtio-transitional
	Queues    uint32 // queue pairs; 1 leaves <driver> out
	PCI       string // optional dddd:bb:ss.f
	BootOrder *uint
	ACPIIndex int
}

// ReconnectSeconds is how often QEMU (as the vhost-user client) retries
// the backend's socket, at start and after lanekit-vhost restarts.
const ReconnectSeconds = 1

// Plan turns a VMI's lanekit-bound interfaces and their reported sockets
// into attachments.
func Plan(vmi *VMI, binding string, sockets map[string]VhostSocket) ([]Attachment, error) {
	ifaces := vmi.BoundInterfaces(binding)
	if len(ifaces) == 0 {
		return nil, fmt.Errorf("vmi %s/%s: no interface uses the %q binding", vmi.Metadata.Namespace, vmi.Metadata.Name, binding)
	}
	model := "virtio-non-transitional"
	if t := vmi.Spec.Domain.Devices.UseVirtioTransitional; t != nil && *t {
		model = "virtio-transitional"
	}
	var out []Attachment
	for _, i := range ifaces {
		if i.Model != "" && i.Model != "virtio" {
			return nil, fmt.Errorf("interface %q: model %q cannot be vhost-user (virtio only)", i.Name, i.Model)
		}
		sock, ok := sockets[i.Name]
		if !ok {
			return nil, fmt.Errorf("interface %q: no vhost-user socket reported", i.Name)
		}
		mac := i.MacAddress
		if mac == "" {
			mac = sock.MAC
		}
		if mac == "" {
			return nil, fmt.Errorf("interface %q: no MAC address (set macAddress in the VMI or have the CNI report it): lanekit's VM endpoint only forwards the MAC it was given", i.Name)
		}
		hw, err := net.ParseMAC(mac)
		if err != nil {
			return nil, fmt.Errorf("interface %q: mac %q: %w", i.Name, mac, err)
		}
		// A guest that already runs (a migration target is defined while
		// the guest runs on the source) keeps the MAC it has: a pod whose
		// VM endpoint was made for another MAC would drop its frames.
		if g := vmi.GuestMAC(i.Name); g != "" {
			if ghw, err := net.ParseMAC(g); err == nil && ghw.String() != hw.String() {
				return nil, fmt.Errorf("interface %q: the guest runs with MAC %s (VMI status) but this pod's VM endpoint has %s (device-info): lanekit's VM endpoint only forwards the MAC it was created with; set macAddress in the VMI", i.Name, g, mac)
			}
		}
		if i.PciAddress != "" && !pciRE.MatchString(i.PciAddress) {
			return nil, fmt.Errorf("interface %q: pciAddress %q is not dddd:bb:ss.f", i.Name, i.PciAddress)
		}
		out = append(out, Attachment{
			Name: i.Name, Socket: sock.Path, Mode: sock.Mode, MAC: strings.ToLower(mac), Model: model,
			Queues: vmi.Queues(), PCI: i.PciAddress, BootOrder: i.BootOrder, ACPIIndex: i.ACPIIndex,
		})
	}
	return out, nil
}

var pciRE = regexp.MustCompile(`^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$`)

// Rewrite returns doc with every attachment as a vhost-user <interface>
// (replacing the one with alias ua-<name>, or added after the last
// interface) and guest memory shared through memfd. Everything else is kept
// byte-for-byte; running it on its own output changes nothing.
func Rewrite(doc []byte, atts []Attachment) ([]byte, error) {
	root, err := parseSpans(doc)
	if err != nil {
		return nil, err
	}
	if root.name != "domain" {
		return nil, fmt.Errorf("domain xml: root element is <%s>, want <domain>", root.name)
	}
	devices := root.child("devices")
	if devices == nil {
		return nil, fmt.Errorf("domain xml: no <devices>")
	}
	l := newLayout(doc, root)
	var edits []splice

	ifaces := devices.all("interface")
	var added strings.Builder
	addInd := l.childIndent(devices)
	for _, a := range atts {
		if old := byAlias(ifaces, "ua-"+a.Name); old != nil {
			edits = append(edits, splice{old.start, old.end, l.iface(a, l.indentOf(old), old)})
			continue
		}
		added.WriteString(l.nl(addInd) + l.iface(a, addInd, nil))
	}
	if added.Len() > 0 {
		if len(ifaces) > 0 {
			last := ifaces[len(ifaces)-1]
			edits = append(edits, splice{last.end, last.end, added.String()})
		} else if len(devices.children) > 0 {
			first := devices.children[0]
			// before the first device, on its own line
			edits = append(edits, splice{first.start, first.start, strings.TrimPrefix(added.String(), l.nl(addInd)) + l.nl(addInd)})
		} else {
			edits = append(edits, l.appendChildren(devices, added.String()))
		}
	}

	mem, err := l.sharedMemory(root)
	if err != nil {
		return nil, err
	}
	edits = append(edits, mem...)
	return applySplices(doc, edits)
}

func byAlias(ifaces []*element, alias string) *element {
	for _, i := range ifaces {
		if a := i.child("alias"); a != nil {
			if n, _ := a.attr("name"); n == alias {
				return i
			}
		}
	}
	return nil
}

// iface renders the <interface> element at indent ind. An existing
// element's libvirt-assigned <address> is kept unless the VMI pins one.
func (l layout) iface(a Attachment, ind string, old *element) string {
	in := ind + l.unit
	var b strings.Builder
	b.WriteString(`<interface type="vhostuser">`)
	src := fmt.Sprintf(`<source type="unix" path="%s" mode="%s"`, attrEscape(a.Socket), attrEscape(a.Mode))
	if a.Mode == "client" {
		src += ">" + l.nl(in+l.unit) + fmt.Sprintf(`<reconnect enabled="yes" timeout="%d"/>`, ReconnectSeconds) + l.nl(in) + "</source>"
	} else {
		src += "/>"
	}
	b.WriteString(l.nl(in) + src)
	b.WriteString(l.nl(in) + fmt.Sprintf(`<model type="%s"/>`, attrEscape(a.Model)))
	b.WriteString(l.nl(in) + fmt.Sprintf(`<mac address="%s"/>`, attrEscape(a.MAC)))
	if a.Queues > 1 {
		b.WriteString(l.nl(in) + fmt.Sprintf(`<driver queues="%d"/>`, a.Queues))
	}
	if m := pciRE.FindStringSubmatch(a.PCI); m != nil {
		fn, _ := strconv.Atoi(m[4])
		b.WriteString(l.nl(in) + fmt.Sprintf(`<address type="pci" domain="0x%s" bus="0x%s" slot="0x%s" function="0x%d"/>`, m[1], m[2], m[3], fn))
	} else if old != nil {
		if addr := old.child("address"); addr != nil {
			b.WriteString(l.nl(in) + string(l.doc[addr.start:addr.end]))
		}
	}
	if a.BootOrder != nil {
		b.WriteString(l.nl(in) + fmt.Sprintf(`<boot order="%d"/>`, *a.BootOrder))
	}
	if a.ACPIIndex > 0 {
		b.WriteString(l.nl(in) + fmt.Sprintf(`<acpi index="%d"/>`, a.ACPIIndex))
	}
	b.WriteString(l.nl(in) + fmt.Sprintf(`<alias name="ua-%s"/>`, attrEscape(a.Name)))
	b.WriteString(l.nl(ind) + "</interface>")
	return b.String()
}

// sharedMemory makes guest RAM shareable with the vhost-user backend:
// <memoryBacking> with <source type="memfd"/> and <access mode="shared"/>.
// A conflicting setting (private access, anonymous source) is an error, not
// silently overridden.
func (l layout) sharedMemory(root *element) ([]splice, error) {
	if cpu := root.child("cpu"); cpu != nil {
		if numa := cpu.child("numa"); numa != nil {
			for _, c := range numa.all("cell") {
				if v, _ := c.attr("memAccess"); v == "private" {
					id, _ := c.attr("id")
					return nil, fmt.Errorf("domain xml: numa cell %s has memAccess=private; vhost-user needs shared guest memory", id)
				}
			}
		}
	}
	mb := root.child("memoryBacking")
	if mb == nil {
		ind := l.childIndent(root)
		in := ind + l.unit
		text := l.nl(ind) + "<memoryBacking>" + l.nl(in) + `<source type="memfd"/>` + l.nl(in) + `<access mode="shared"/>` + l.nl(ind) + "</memoryBacking>"
		after := root.child("currentMemory")
		if after == nil {
			after = root.child("memory")
		}
		if after == nil {
			return []splice{l.appendChildren(root, text)}, nil
		}
		return []splice{{after.end, after.end, text}}, nil
	}
	var add string
	in := l.childIndent(mb)
	if src := mb.child("source"); src == nil {
		add += l.nl(in) + `<source type="memfd"/>`
	} else if t, _ := src.attr("type"); t != "memfd" && t != "file" {
		return nil, fmt.Errorf("domain xml: memoryBacking source type %q cannot be shared with a vhost-user backend (want memfd or file)", t)
	}
	if acc := mb.child("access"); acc == nil {
		add += l.nl(in) + `<access mode="shared"/>`
	} else if m, _ := acc.attr("mode"); m != "shared" {
		return nil, fmt.Errorf("domain xml: memoryBacking access mode %q; vhost-user needs shared", m)
	}
	if add == "" {
		return nil, nil
	}
	return []splice{l.appendChildren(mb, add)}, nil
}
