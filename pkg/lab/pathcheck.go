package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Path checks: which path a node's traffic took. The kernel counts every
// packet its IPv4 forwarding path handles (IpForwDatagrams in the node
// namespace's /proc/net/snmp); the BPF datapath counts what it forwards per
// endpoint. Together they say whether BPF or ip_forward carried a flow.

// IPForwDatagrams reads the kernel's IPv4 forwarded-datagram counter of ns.
func IPForwDatagrams(ctx context.Context, ns string) (uint64, error) {
	out, err := run(ctx, "nsenter", "--net="+netnsPath(ns), "cat", "/proc/net/snmp")
	if err != nil {
		return 0, fmt.Errorf("read snmp of %s: %w", ns, err)
	}
	return snmpValue(out, "Ip", "ForwDatagrams")
}

// snmpValue finds proto's field in /proc/net/snmp text: a header line of
// names followed by a line of values, both prefixed "proto:".
func snmpValue(snmp, proto, field string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(snmp))
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, n := range names {
			if n == field && i+1 < len(f) {
				v, err := strconv.ParseUint(f[i+1], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("snmp %s %s: %w", proto, field, err)
				}
				return v, nil
			}
		}
		break
	}
	return 0, fmt.Errorf("snmp has no %s %s", proto, field)
}

// LinkPackets returns the packets dev in ns has sent and received.
func LinkPackets(ctx context.Context, ns, dev string) (tx, rx uint64, err error) {
	out, err := run(ctx, "ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev)
	if err != nil {
		return 0, 0, fmt.Errorf("link stats of %s in %s: %w", dev, ns, err)
	}
	return parseLinkPackets(out)
}

func parseLinkPackets(js string) (tx, rx uint64, err error) {
	var links []struct {
		Stats struct {
			RX struct {
				Packets uint64 `json:"packets"`
			} `json:"rx"`
			TX struct {
				Packets uint64 `json:"packets"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(js), &links); err != nil {
		return 0, 0, fmt.Errorf("parse link stats: %w", err)
	}
	if len(links) != 1 {
		return 0, 0, fmt.Errorf("link stats: %d links in the answer, want 1", len(links))
	}
	return links[0].Stats.TX.Packets, links[0].Stats.RX.Packets, nil
}
