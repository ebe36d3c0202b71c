package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

func resultOf(t *testing.T, out string) *current.Result {
	t.Helper()
	var res current.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.IPs) == 0 {
		t.Fatalf("decode result: %v\n%s", err, out)
	}
	return &res
}

// bindNetns makes target (a new file) another path of the namespace at src.
func bindNetns(t *testing.T, src, target string) string {
	t.Helper()
	if err := os.WriteFile(target, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s on %s: %v", src, target, err)
	}
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
	return target
}

// countersByIP returns the counters of the endpoint with address ip.
func (e *e2e) countersByIP(t *testing.T, ip string) *apiv1.EndpointCounters {
	t.Helper()
	for _, ep := range e.endpoints(t) {
		for _, a := range ep.GetIps() {
			if a.GetAddress() == ip+"/32" {
				return ep.GetCounters()
			}
		}
	}
	t.Fatalf("no endpoint with address %s", ip)
	return nil
}

// talkThrough opens a TCP connection from the namespace at srcNetns (the
// endpoint srcIP) to dstIP in dstNetns, echoes a message, and checks that
// the datapath carried it: srcIP's endpoint counted packets from it and
// dstIP's packets to it.
func (e *e2e) talkThrough(t *testing.T, srcNetns, srcIP, dstNetns, dstIP string) {
	t.Helper()
	from0, to0 := e.countersByIP(t, srcIP).GetFromPackets(), e.countersByIP(t, dstIP).GetToPackets()
	var lis net.Listener
	err := inNetns(dstNetns, func() error {
		var err error
		lis, err = net.Listen("tcp4", net.JoinHostPort(dstIP, "0"))
		return err
	})
	if err != nil {
		t.Fatalf("listen on %s: %v", dstIP, err)
	}
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.Copy(c, c)
	}()
	var conn net.Conn
	err = inNetns(srcNetns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp4", lis.Addr().String(), 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("connect %s -> %s: %v", srcIP, lis.Addr(), err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("lanekit e2e " + srcIP)
	if _, err := conn.Write(msg); err != nil {
		t.Fatalf("write %s -> %s: %v", srcIP, dstIP, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo %s -> %s: %q %v", srcIP, dstIP, got, err)
	}
	from1, to1 := e.countersByIP(t, srcIP).GetFromPackets(), e.countersByIP(t, dstIP).GetToPackets()
	// At least the SYN, the ACK and the data segment each way.
	if from1 < from0+3 || to1 < to0+3 {
		t.Fatalf("%s -> %s did not go through the datapath: from %d -> %d, to %d -> %d", srcIP, dstIP, from0, from1, to0, to1)
	}
}

// inNetns runs fn on a locked thread inside the namespace at path; sockets
// fn creates stay in that namespace.
func inNetns(path string, fn func() error) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return fn() })
}
