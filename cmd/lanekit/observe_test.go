package main

import (
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

func TestFormatFlow(t *testing.T) {
	ts := time.Date(2026, 1, 2, 12, 0, 1, 123e6, time.Local).UnixNano()
	for _, c := range []struct {
		ev   *apiv1.FlowEvent
		want string
	}{
		{&apiv1.FlowEvent{TimeUnixNano: ts, Verdict: apiv1.Verdict_VERDICT_DROPPED, DropReason: "spoofed-ip",
			Endpoint: &apiv1.FlowEndpoint{Id: 3, Name: "default/pod-a"}, SrcIp: "10.244.1.9", DstIp: "10.244.2.3",
			SrcPort: 1234, DstPort: 80, IpProtocol: 6, EtherType: 0x800, Length: 74},
			"12:00:01.123 DROPPED   spoofed-ip   default/pod-a (ep 3) 10.244.1.9:1234 -> 10.244.2.3:80 TCP 74B"},
		{&apiv1.FlowEvent{TimeUnixNano: ts, Verdict: apiv1.Verdict_VERDICT_FORWARDED,
			Endpoint: &apiv1.FlowEndpoint{Id: 3, Name: "default/pod-a"}, Peer: &apiv1.FlowEndpoint{Id: 4, Name: "vm1"},
			SrcIp: "10.244.1.9", DstIp: "10.244.1.3", IpProtocol: 1, EtherType: 0x800, Length: 98},
			"12:00:01.123 FORWARDED              default/pod-a (ep 3) 10.244.1.9 -> 10.244.1.3 ICMP 98B to vm1 (ep 4)"},
		{&apiv1.FlowEvent{TimeUnixNano: ts, Verdict: apiv1.Verdict_VERDICT_DROPPED, DropReason: "unsupported-l3",
			Endpoint: &apiv1.FlowEndpoint{Id: 5}, EtherType: 0x86dd, Length: 86},
			"12:00:01.123 DROPPED   unsupported-l3 (ep 5) ethertype 0x86dd 86B"},
	} {
		if got := formatFlow(c.ev); got != c.want {
			t.Errorf("\n got %q\nwant %q", got, c.want)
		}
	}
	if got := formatFlow(&apiv1.FlowEvent{Lost: 12, LostWhere: "subscriber"}); !strings.Contains(got, "LOST      12 events (this stream did not keep up)") {
		t.Errorf("lost line %q", got)
	}
}
