package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestLabKubeletProbeUnderDefaultDeny: a pod under a default-deny ingress +
// egress NetworkPolicy still answers a kubelet-style HTTP probe from its
// node: the real agent (lanekitd, started by `lab up`) puts every address of
// the node netns into the policy ipcache as the host identity, so the pod's
// SYN-ACK passes its egress. It also follows address changes: a probe from
// an address added to the node's loopback passes within seconds (the
// agent's netlink subscription; its periodic resync is 30 s), and a removed
// address leaves the ipcache. Without the agent's wiring the probe's
// SYN-ACK is dropped (policy-egress) and this test fails.
func TestLabKubeletProbeUnderDefaultDeny(t *testing.T) {
	lk, _ := upLabCLI(t)
	if !agentStatus(t, 1).GetControlPlane().GetPolicyDatapath() {
		t.Skip("the datapath has no network policy (PolicyDatapath)")
	}
	pods := addLabPods(t, lk, []labPodSpec{
		{name: "probed", ns: "locked", node: 1, labels: "app=web"},
		{name: "outsider", ns: "open", node: 1, labels: "app=client"},
	})
	probed := pods["probed"]
	const port = 8080
	srv := startHTTPServer(t, probed.NS, port)
	defer srv.Close()
	file := writeTemp(t, "deny.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: locked}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`)
	if _, err := lk(t, "lab", "apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("http://%s:%d/healthz", probed.PodAddr(), port)

	// The policy is in force: another pod gets nothing.
	if r := ask(netProbe{From: pods["outsider"].NS, Proto: "tcp", Addr: fmt.Sprintf("%s:%d", probed.PodAddr(), port)}, time.Second, 1); r.Err == nil {
		t.Fatalf("a pod of another namespace reached the default-deny pod (answer %q): the policy is not in force", r.Answer)
	}
	// kubelet's probe: from the node, the source address the stack picks.
	if err := httpProbe(NodeNS(1), netip.Addr{}, target, 5); err != nil {
		t.Fatalf("probe from the node: %v (the pod's answer to its node was dropped)", err)
	}
	ipc := hostIdentityAddrs(t, 1)
	for _, want := range []string{UnderlayIP(1), "127.0.0.1"} {
		if !slices.Contains(ipc, netip.MustParseAddr(want)) {
			t.Errorf("node 1's address %s is not in the ipcache as the host: %v", want, ipc)
		}
	}

	// A new address on another interface (loopback): covered within seconds.
	extra := netip.MustParseAddr("192.0.2.77")
	if err := ip(context.Background(), "-n", NodeNS(1), "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	if err := ip(context.Background(), "-n", NodeNS(1), "addr", "add", extra.String()+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ip(context.Background(), "-n", NodeNS(1), "addr", "del", extra.String()+"/32", "dev", "lo")
	})
	start := time.Now()
	if err := httpProbe(NodeNS(1), extra, target, 5); err != nil {
		t.Fatalf("probe from the added address %s: %v (ipcache hosts: %v)", extra, err, hostIdentityAddrs(t, 1))
	}
	t.Logf("probe from the added address %s passed after %s", extra, time.Since(start).Round(10*time.Millisecond))
	if err := ip(context.Background(), "-n", NodeNS(1), "addr", "del", extra.String()+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if !slices.Contains(hostIdentityAddrs(t, 1), extra) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removed address %s still in the ipcache as the host after 5s", extra)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startHTTPServer serves 200 "ok" on every path on port in netns ns.
func startHTTPServer(t *testing.T, ns string, port int) *http.Server {
	t.Helper()
	var ln net.Listener
	err := inNetns(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", ns, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return srv
}

// httpProbe does what kubelet's HTTP probe does: a GET on a new connection
// from the node netns (from src when valid), 1 s timeout; it tries up to
// attempts times, 1 s apart, and fails unless one attempt gets 200.
func httpProbe(ns string, src netip.Addr, url string, attempts int) error {
	d := &net.Dialer{Timeout: time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := inNetns(ns, func() error {
				var err error
				conn, err = d.DialContext(ctx, "tcp4", addr)
				return err
			})
			return conn, err
		}}}
	var errs []error
	for i := range attempts {
		if i > 0 {
			time.Sleep(time.Second)
		}
		resp, err := c.Get(url)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		errs = append(errs, fmt.Errorf("status %s", resp.Status))
	}
	return fmt.Errorf("%d attempts: %w", attempts, errors.Join(errs...))
}

// hostIdentityAddrs lists the addresses node i's pinned policy ipcache holds
// as the host identity (LK_IDENTITY_HOST, 1).
func hostIdentityAddrs(t *testing.T, node int) []netip.Addr {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(node), "lk_policy_ipcache"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("open the policy ipcache of node %d: %v", node, err)
	}
	defer m.Close()
	var (
		k   [4]byte
		id  uint32
		out []netip.Addr
	)
	it := m.Iterate()
	for it.Next(&k, &id) {
		if id == 1 {
			out = append(out, netip.AddrFrom4(k))
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate the policy ipcache of node %d: %v", node, err)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
