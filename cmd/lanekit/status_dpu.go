package main

import (
	"fmt"
	"io"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/dpu"
)

// printDPULink prints the host/DPU link's certificates with their notAfter
// and days left, warning under dpu.ExpiryWarning, and the DPU's refusals.
func printDPULink(out io.Writer, l *apiv1.DPULinkStatus, now time.Time) {
	if l == nil {
		return
	}
	peer := "the host's certificate must name"
	if l.GetRole() == "host" {
		peer = "the DPU's certificate must name"
	}
	fmt.Fprintf(out, "DPU link:     %s side, %s %q\n", l.GetRole(), peer, l.GetPeerIdentity())
	for _, c := range l.GetCertificates() {
		na := time.Unix(c.GetNotAfterUnix(), 0)
		left := na.Sub(now)
		days := int(left.Hours() / 24)
		state := fmt.Sprintf("%d days left", days)
		switch {
		case left <= 0:
			state = "EXPIRED: the link is refused"
		case left < dpu.ExpiryWarning:
			state = fmt.Sprintf("WARNING: %d days left, rotate it before the link breaks", days)
		}
		file := ""
		if c.GetFile() != "" {
			file = " (" + c.GetFile() + ")"
		}
		fmt.Fprintf(out, "  cert %-5s  %s, notAfter %s, %s%s\n", c.GetWhich(), c.GetSubject(), na.UTC().Format(time.RFC3339), state, file)
	}
	if n := l.GetRefusedCalls(); n > 0 {
		fmt.Fprintf(out, "  refused:    %d calls, last: %s\n", n, l.GetLastRefusal())
	}
	if e := l.GetReloadError(); e != "" {
		fmt.Fprintf(out, "  warning:    the certificate files do not load, the last good ones stay in use: %s\n", e)
	}
}
