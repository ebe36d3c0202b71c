package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/lanekit/lanekit/pkg/service"
)

// echoOn starts a TCP echo server on ip:8080 in ns that prefixes each line
// with the peer address it saw.
func (e *liveEnv) echoOn(t *testing.T, ns netns.NsHandle, ip string) {
	t.Helper()
	e.lineServer(t, ns, ip+":8080", func(c net.Conn, line string) { fmt.Fprintf(c, "%s %s", c.RemoteAddr(), line) })
}

// dialVia connects from ns to addr and returns the peer address the server
// saw and the remote address the client's socket has.
func (e *liveEnv) dialVia(t *testing.T, ns netns.NsHandle, addr string) (seen, remote string, err error) {
	t.Helper()
	return e.dialViaPayload(t, ns, addr, "ping")
}

// dialViaPayload is dialVia with a given word (no spaces) echoed back.
func (e *liveEnv) dialViaPayload(t *testing.T, ns netns.NsHandle, addr, payload string) (seen, remote string, err error) {
	t.Helper()
	var c net.Conn
	e.in(t, ns, func() {
		c, err = net.DialTimeout("tcp4", addr, 3*time.Second)
	})
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	go c.Write([]byte(payload + "\n"))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", "", fmt.Errorf("echo via %s: %w", addr, err)
	}
	who, word, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if word != payload {
		return "", "", fmt.Errorf("echo via %s: %d bytes back, want the %d sent", addr, len(word), len(payload))
	}
	return who, c.RemoteAddr().String(), nil
}

// TestLiveServices: real TCP connections through service frontends on one
// node: a local backend, a backend on the remote node (reply rev-NATed on
// the uplink), hairpin, a NodePort from the remote node, and a service with
// no backend (connection refused by the datapath's reset). Paths are
// asserted with the LB counters.
func TestLiveServices(t *testing.T) {
	e := newLiveEnv(t)
	e.echoOn(t, e.pod2, "10.244.1.11")
	e.echoOn(t, e.remote, "10.244.2.1")
	e.echoOn(t, e.pod1, "10.244.1.10")
	m := service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1")}})
	tables := service.NewTables()
	applyYAML(t, e.dp, m, tables, svcYAML("local", "10.96.0.10", 80, "TCP", "", "10.244.1.11"))
	applyYAML(t, e.dp, m, tables, svcYAML("remote", "10.96.0.11", 80, "TCP", "", "10.244.2.1"))
	applyYAML(t, e.dp, m, tables, svcYAML("hairpin", "10.96.0.12", 80, "TCP", "", "10.244.1.10"))
	applyYAML(t, e.dp, m, tables, svcYAML("nodeport", "10.96.0.13", 80, "TCP", "nodePort=30080", "10.244.1.11"))
	applyYAML(t, e.dp, m, tables, svcYAML("empty", "10.96.0.14", 80, "TCP", ""))
	applyYAML(t, e.dp, m, tables, svcYAML("udpdead", "10.96.0.15", 53, "UDP", "", "10.244.1.11"))

	stats := func() ServiceStats {
		s, err := e.dp.ServiceStats()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name       string
		from       netns.NsHandle
		addr       string
		seenPrefix string // the client address the backend must see
		check      func(before, after ServiceStats) string
	}{
		{"pod to ClusterIP, local backend", e.pod1, "10.96.0.10:80", "10.244.1.10:", func(b, a ServiceStats) string {
			if a.NewFlows-b.NewFlows != 1 || a.RevNAT-b.RevNAT < 2 || a.ConntrackHits-b.ConntrackHits < 2 {
				return fmt.Sprintf("new %d revnat %d cthits %d", a.NewFlows-b.NewFlows, a.RevNAT-b.RevNAT, a.ConntrackHits-b.ConntrackHits)
			}
			return ""
		}},
		{"pod to ClusterIP, backend on the remote node (rev-NAT on the uplink)", e.pod1, "10.96.0.11:80", "10.244.1.10:", func(b, a ServiceStats) string {
			if a.NewFlows-b.NewFlows != 1 || a.RevNAT-b.RevNAT < 2 {
				return fmt.Sprintf("new %d revnat %d", a.NewFlows-b.NewFlows, a.RevNAT-b.RevNAT)
			}
			return ""
		}},
		{"pod to its own service (hairpin)", e.pod1, "10.96.0.12:80", "169.254.42.1:", func(b, a ServiceStats) string {
			if a.Hairpin-b.Hairpin != 1 || a.RevNAT-b.RevNAT < 2 {
				return fmt.Sprintf("hairpin %d revnat %d", a.Hairpin-b.Hairpin, a.RevNAT-b.RevNAT)
			}
			return ""
		}},
		{"remote node to NodePort, local backend", e.remote, "10.77.0.1:30080", "10.77.0.2:", func(b, a ServiceStats) string {
			if a.NodePortLocal-b.NodePortLocal != 1 || a.RevNAT-b.RevNAT < 2 {
				return fmt.Sprintf("nodeport-local %d revnat %d", a.NodePortLocal-b.NodePortLocal, a.RevNAT-b.RevNAT)
			}
			return ""
		}},
	}
	for _, c := range cases {
		before := stats()
		seen, remote, err := e.dialVia(t, c.from, c.addr)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if remote != c.addr {
			t.Errorf("%s: client socket's peer is %s, want the frontend %s", c.name, remote, c.addr)
		}
		if len(seen) < len(c.seenPrefix) || seen[:len(c.seenPrefix)] != c.seenPrefix {
			t.Errorf("%s: backend saw the client as %s, want %s*", c.name, seen, c.seenPrefix)
		}
		if msg := c.check(before, stats()); msg != "" {
			t.Errorf("%s: counters: %s", c.name, msg)
		}
	}

	// Bulk data both ways (TSO/GRO-sized segments, partial checksums)
	// through DNAT and rev-NAT, local and remote backend.
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	for _, vip := range []string{"10.96.0.10:80", "10.96.0.11:80"} {
		if _, _, err := e.dialViaPayload(t, e.pod1, vip, big); err != nil {
			t.Errorf("1 MiB each way via %s: %v", vip, err)
		}
	}

	before := stats()
	_, _, err := e.dialVia(t, e.pod1, "10.96.0.14:80")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("service without backends: %v, want connection refused", err)
	}
	if a := stats(); a.NoBackend-before.NoBackend != 1 {
		t.Errorf("no-backend counter grew by %d, want 1", a.NoBackend-before.NoBackend)
	}
	if c, _ := e.dp.Counters(1); c.Drops[DropNoBackend] != 1 {
		t.Errorf("pod 1 no-backend drops %d, want 1", c.Drops[DropNoBackend])
	}

	// UDP to a backend with nothing listening: its ICMP port unreachable,
	// translated back to the frontend, reaches the client's socket.
	before = stats()
	var uc net.Conn
	e.in(t, e.pod1, func() { uc, err = net.Dial("udp4", "10.96.0.15:53") })
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	uc.SetDeadline(time.Now().Add(2 * time.Second))
	uc.Write([]byte("q"))
	if _, err := uc.Read(make([]byte, 16)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to a backend without a listener: %v, want connection refused (ICMP translated back)", err)
	}
	if a := stats(); a.RevNAT-before.RevNAT != 1 {
		t.Errorf("rev-NAT counter grew by %d for the ICMP error, want 1", a.RevNAT-before.RevNAT)
	}

	// Agent restart: services and established flows stay in the pinned
	// maps. A connection opened before the restart keeps working through it
	// (and after it, its conntrack entry keeps its backend).
	var held net.Conn
	e.in(t, e.pod1, func() { held, err = net.DialTimeout("tcp4", "10.96.0.10:80", 3*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	e.dp.Close()
	e.dp = nil
	e.in(t, e.node, func() { e.open(t) })
	ctBefore := stats().ConntrackHits
	held.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := held.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(held).ReadString('\n'); err != nil || !strings.HasSuffix(line, " held\n") {
		t.Errorf("connection across the agent restart: %q, %v", line, err)
	}
	if stats().ConntrackHits == ctBefore {
		t.Error("the held connection did not take its conntrack entry after the restart")
	}
	got, err := e.dp.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Services) != len(tables.Snapshot().Services) {
		t.Errorf("after restart the maps hold %d frontends, want %d", len(got.Services), len(tables.Snapshot().Services))
	}
	if _, _, err := e.dialVia(t, e.pod1, "10.96.0.10:80"); err != nil {
		t.Errorf("after restart: %v", err)
	}
}
