package main

import (
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// The DPU link's certificates: notAfter and days left, a warning under
// two weeks, expired said as such.
func TestPrintDPULink(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	var b strings.Builder
	printDPULink(&b, &apiv1.DPULinkStatus{Role: "host", PeerIdentity: "10.0.0.2", RefusedCalls: 0,
		Certificates: []*apiv1.LinkCertificate{
			{Which: "local", Subject: "CN=node1", NotAfterUnix: at(30*24*time.Hour + time.Hour), File: "/etc/lanekit/host.pem"},
			{Which: "ca", Subject: "CN=ca", NotAfterUnix: at(3*24*time.Hour + time.Hour)},
			{Which: "peer", Subject: "CN=10.0.0.2", NotAfterUnix: at(-time.Hour)},
		}}, now)
	for _, w := range []string{
		`DPU link:     host side, the DPU's certificate must name "10.0.0.2"`,
		"cert local  CN=node1, notAfter 2026-12-28T13:00:00Z, 30 days left (/etc/lanekit/host.pem)",
		"cert ca     CN=ca, notAfter 2026-12-01T13:00:00Z, WARNING: 3 days left, rotate it before the link breaks",
		"cert peer   CN=10.0.0.2, notAfter 2026-11-28T11:00:00Z, EXPIRED",
	} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("output\n%s\nlacks %q", b.String(), w)
		}
	}
	b.Reset()
	printDPULink(&b, nil, now)
	if b.Len() != 0 {
		t.Errorf("no link: printed %q", b.String())
	}
}
