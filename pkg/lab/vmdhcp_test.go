package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
)

// vmDHCP: the guest leases its own address by DHCP from its link (the
// datapath's server, bpf/lib/dhcp.h; the lab runs no other, so any lease is
// its). Busybox udhcpc in the guest, with a script that only prints what it
// got (the NIC keeps the address the lab gave it), must be offered and
// acknowledged the VM's address as a /32 with the gateway as server and
// router and the classless routes gateway/32 on-link plus the default route.
func vmDHCP(t *testing.T, ctx context.Context, vm LabVM, con *guest.Console) {
	gw := datapath.DefaultGatewayIP.String()
	script := `printf '#!/bin/sh\n[ "$1" = bound ] && echo "LEASE ip=$ip subnet=$subnet router=$router serverid=$serverid lease=$lease routes=$staticroutes"\ntrue\n' >/tmp/lk-dhcp && chmod +x /tmp/lk-dhcp`
	if out, code, err := con.Run(ctx, script); err != nil || code != 0 {
		t.Fatalf("write the udhcpc script: %v (exit %d): %s", err, code, out)
	}
	cmd := fmt.Sprintf(`IF=$(ip -o -4 addr show | awk '$4 == "%s/32" {print $2}'); [ -n "$IF" ] && udhcpc -i "$IF" -f -q -n -t 4 -T 2 -s /tmp/lk-dhcp 2>&1`, vm.IP)
	out, code, err := con.Run(ctx, cmd)
	if err != nil || code != 0 {
		t.Fatalf("udhcpc in the guest: %v (exit %d):\n%s", err, code, out)
	}
	t.Logf("udhcpc: %s", strings.Join(strings.Fields(out), " "))
	want := fmt.Sprintf("LEASE ip=%s subnet=255.255.255.255 router=%s serverid=%s lease=4294967295 routes=%s/32 0.0.0.0 0.0.0.0/0 %s",
		vm.IP, gw, gw, gw, gw)
	if !strings.Contains(out, want) {
		t.Errorf("udhcpc's lease:\n%s\nwant the line %q", out, want)
	}
}
