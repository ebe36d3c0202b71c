package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// DHCPOptions are what a VM endpoint's DHCP server (bpf/lib/dhcp.h) offers
// beside its lease, as KubeVirt's own DHCP (its bridge binding) gives a guest
// what the launcher pod has: DNS servers, search domains and the MTU.
type DHCPOptions struct {
	DNS    []netip.Addr // option 6: IPv4 name servers, in order
	Search []string     // option 119 (RFC 3397) and, its first, option 15 (domain name)
	MTU    int          // option 26; 0: none
}

// Option codes (RFC 2132, RFC 3397).
const (
	dhcpOptDNS        = 6
	dhcpOptDomainName = 15
	dhcpOptMTU        = 26
	dhcpOptSearch     = 119
)

// DHCPExtraMax is how many option bytes an endpoint's entry holds
// (LK_DHCP_EXTRA_MAX: the reply stays within 576 bytes).
const DHCPExtraMax = len(podDhcpExtra{}.Opts)

// Empty reports whether o offers nothing.
func (o DHCPOptions) Empty() bool { return len(o.DNS) == 0 && len(o.Search) == 0 && o.MTU == 0 }

// Render encodes o as DHCP options (code, length, value each), in the order
// MTU, DNS, domain name, search list. A bad address, name or MTU is an
// error; so is a set that does not fit DHCPExtraMax (Fit trims one).
func (o DHCPOptions) Render() ([]byte, error) {
	var out []byte
	if o.MTU != 0 {
		if o.MTU < 68 || o.MTU > 65535 {
			return nil, fmt.Errorf("dhcp: mtu %d outside 68-65535", o.MTU)
		}
		out = binary.BigEndian.AppendUint16(append(out, dhcpOptMTU, 2), uint16(o.MTU))
	}
	if len(o.DNS) > 0 {
		if len(o.DNS) > 63 {
			return nil, fmt.Errorf("dhcp: %d name servers", len(o.DNS))
		}
		out = append(out, dhcpOptDNS, byte(4*len(o.DNS)))
		for _, a := range o.DNS {
			if !a.Is4() || a.IsUnspecified() {
				return nil, fmt.Errorf("dhcp: name server %v is not an IPv4 address", a)
			}
			b := a.As4()
			out = append(out, b[:]...)
		}
	}
	if len(o.Search) > 0 {
		var list []byte
		for _, d := range o.Search {
			enc, err := dnsName(d)
			if err != nil {
				return nil, err
			}
			list = append(list, enc...)
		}
		first := strings.TrimSuffix(o.Search[0], ".")
		out = append(append(out, dhcpOptDomainName, byte(len(first))), first...)
		// An option holds 255 bytes; RFC 3396 would split a longer list,
		// which the entry has no room for anyway.
		if len(list) > 255 {
			return nil, fmt.Errorf("dhcp: search list of %d bytes: %w", len(list), errDHCPTooLong)
		}
		out = append(append(out, dhcpOptSearch, byte(len(list))), list...)
	}
	if len(out) > DHCPExtraMax {
		return nil, fmt.Errorf("dhcp: %d bytes of options, room for %d: %w", len(out), DHCPExtraMax, errDHCPTooLong)
	}
	return out, nil
}

// Fit renders o, dropping search domains from the end until it fits; it
// returns the options rendered and how many domains were dropped.
func (o DHCPOptions) Fit() ([]byte, int, error) {
	for dropped := 0; ; dropped++ {
		b, err := o.Render()
		if err == nil || len(o.Search) == 0 || !errors.Is(err, errDHCPTooLong) {
			return b, dropped, err
		}
		o.Search = o.Search[:len(o.Search)-1]
	}
}

var errDHCPTooLong = errors.New("too long")

// ValidDomain reports whether d can be offered as a search domain.
func ValidDomain(d string) bool {
	_, err := dnsName(d)
	return err == nil
}

// dnsName encodes a domain name in DNS wire format (RFC 1035 3.1, no
// compression): labels of 1-63 letters, digits and hyphens.
func dnsName(d string) ([]byte, error) {
	d = strings.TrimSuffix(d, ".")
	if d == "" || len(d) > 253 {
		return nil, fmt.Errorf("dhcp: domain %q: empty or longer than 253", d)
	}
	var out []byte
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 {
			return nil, fmt.Errorf("dhcp: domain %q: label %q empty or longer than 63", d, l)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return nil, fmt.Errorf("dhcp: domain %q: %q in a label", d, c)
			}
		}
		out = append(append(out, byte(len(l))), l...)
	}
	return append(out, 0), nil
}

// writeDHCPOptions writes a VM endpoint's options into lk_dhcp_opts, or
// removes its entry when it has none (and for a pod).
func (l *Loader) writeDHCPOptions(ep Endpoint) error {
	if !ep.VM || ep.DHCP.Empty() {
		return deleteIgnoreMissing(l.pod.LkDhcpOpts, ep.ID)
	}
	b, dropped, err := ep.DHCP.Fit()
	if err != nil {
		return err
	}
	if dropped > 0 {
		l.log.Warn("dhcp: search domains left out to fit the reply", "endpoint", ep.ID, "dropped", ep.DHCP.Search[len(ep.DHCP.Search)-dropped:])
	}
	v := podDhcpExtra{Len: uint16(len(b))}
	copy(v.Opts[:], b)
	if err := l.pod.LkDhcpOpts.Put(ep.ID, v); err != nil {
		return fmt.Errorf("dhcp options: %w", err)
	}
	return nil
}
