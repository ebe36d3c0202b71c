package lab

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lanekit/lanekit/pkg/guest"
)

// probeFromVMs runs the group's probes inside each guest through its serial
// console: busybox ping, and busybox nc against the targets' echo servers.
func probeFromVMs(ctx context.Context, g checkGroup) map[[2]string]*probe {
	res := map[[2]string]*probe{}
	for _, s := range g.sources {
		v := g.vms[s.NS]
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		con, err := guest.DialConsole(cctx, v.SerialSocket)
		port := g.port
		if port == 0 {
			port = EchoPort
		}
		for _, t := range g.targets {
			if t.NS == s.NS {
				continue // itself
			}
			p := &probe{}
			res[[2]string{s.NS, t.NS}] = p
			if err != nil {
				p.icmp, p.tcp = err, err
				continue
			}
			p.icmp = guestRun(cctx, con, fmt.Sprintf("ping -c 1 -W 2 %s", t.IP), "")
			token := "lanekit-lab-check-" + strings.NewReplacer(".", "-", ":", "-").Replace(t.IP)
			p.tcp = guestRun(cctx, con, fmt.Sprintf("echo %s | nc -w 2 %s %d", token, t.IP, port), token)
		}
		if con != nil {
			con.Close()
		}
		cancel()
	}
	return res
}

// guestRun runs cmd in the guest; it must exit 0 and, if want is set, print it.
func guestRun(ctx context.Context, con *guest.Console, cmd, want string) error {
	out, code, err := con.Run(ctx, cmd)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%q exited %s: %s", cmd, strconv.Itoa(code), strings.TrimSpace(out))
	}
	if want != "" && !strings.Contains(out, want) {
		return fmt.Errorf("%q: no echo of %q in %q", cmd, want, strings.TrimSpace(out))
	}
	return nil
}
