package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/guest"
)

// Helpers of the issue-12 end-to-end tests (services, policy truth table,
// invalid objects). Traffic runs inside this test process: a goroutine locks
// its OS thread, switches it into a pod's netns and creates the socket there
// (a socket stays in the netns it was created in), so hundreds of probes cost
// no process spawns.

// inNetns runs fn on an OS thread switched into the named netns. The thread
// is never switched back: the goroutine exits locked, so the runtime
// discards the thread.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", name, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// nameServer answers on TCP and UDP ports inside a netns with its name:
// a TCP connection first gets "NAME\n", then every line it sends comes back
// as "NAME LINE\n" (a long-lived connection can check it still talks to the
// same pod); a UDP datagram gets "NAME\n".
type nameServer struct {
	name   string
	closed chan struct{}
	wg     sync.WaitGroup
	lns    []net.Listener
	pcs    []net.PacketConn
}

// startNameServer listens on every port of tcp and udp in netns ns.
func startNameServer(t *testing.T, ns, name string, tcp, udp []int) *nameServer {
	t.Helper()
	s := &nameServer{name: name, closed: make(chan struct{})}
	err := inNetns(ns, func() error {
		for _, p := range tcp {
			ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p))
			if err != nil {
				return err
			}
			s.lns = append(s.lns, ln)
		}
		for _, p := range udp {
			pc, err := net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", p))
			if err != nil {
				return err
			}
			s.pcs = append(s.pcs, pc)
		}
		return nil
	})
	if err != nil {
		s.close()
		t.Fatalf("name server %s in %s: %v", name, ns, err)
	}
	for _, ln := range s.lns {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					s.serveConn(c)
				}()
			}
		}()
	}
	for _, pc := range s.pcs {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 512)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(s.name+"\n"), from)
			}
		}()
	}
	t.Cleanup(s.close)
	return s
}

func (s *nameServer) serveConn(c net.Conn) {
	defer c.Close()
	go func() {
		<-s.closed
		c.Close()
	}()
	if _, err := c.Write([]byte(s.name + "\n")); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Minute))
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(s.name + " " + line)); err != nil {
			return
		}
	}
}

func (s *nameServer) close() {
	select {
	case <-s.closed:
		return
	default:
	}
	close(s.closed)
	for _, ln := range s.lns {
		ln.Close()
	}
	for _, pc := range s.pcs {
		pc.Close()
	}
	s.wg.Wait()
}

// netProbe is one request from a netns to addr:port over proto ("tcp"/"udp").
type netProbe struct {
	From  string // netns
	Proto string
	Addr  string // ip:port
}

// probeResult is who answered ("" when nobody did) and the error if not.
type probeResult struct {
	Answer string
	Err    error
}

// ask runs one probe: a TCP connect (timeout) that reads the server's name
// line, or a UDP datagram answered by the server's name (tries attempts,
// each waiting timeout; a lost first datagram is not a denial).
func ask(p netProbe, timeout time.Duration, attempts int) probeResult {
	var conn net.Conn
	err := inNetns(p.From, func() error {
		d := net.Dialer{Timeout: timeout}
		c, err := d.Dial(p.Proto+"4", p.Addr)
		conn = c
		return err
	})
	if err != nil {
		return probeResult{Err: err}
	}
	defer conn.Close()
	buf := make([]byte, 128)
	if p.Proto == "tcp" {
		_ = conn.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return probeResult{Err: fmt.Errorf("read: %w", err)}
		}
		return probeResult{Answer: strings.TrimSuffix(line, "\n")}
	}
	for range attempts {
		if _, err := conn.Write([]byte("who\n")); err != nil {
			return probeResult{Err: err}
		}
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		n, err := conn.Read(buf)
		if err == nil {
			return probeResult{Answer: strings.TrimSuffix(string(buf[:n]), "\n")}
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return probeResult{Err: err}
		}
	}
	return probeResult{Err: fmt.Errorf("udp: no answer after %d tries", attempts)}
}

// askAll runs probes with at most parallel in flight.
func askAll(probes []netProbe, parallel int, timeout time.Duration, attempts int) []probeResult {
	out := make([]probeResult, len(probes))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = ask(p, timeout, attempts)
		}()
	}
	wg.Wait()
	return out
}

// heldConn is a long-lived TCP connection that knows which pod accepted it.
type heldConn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string
}

func dialHeld(from, addr string) (*heldConn, error) {
	var conn net.Conn
	err := inNetns(from, func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.Dial("tcp4", addr)
		conn = c
		return err
	})
	if err != nil {
		return nil, err
	}
	h := &heldConn{c: conn, r: bufio.NewReader(conn)}
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := h.r.ReadString('\n')
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("read name: %w", err)
	}
	h.backend = strings.TrimSuffix(line, "\n")
	return h, nil
}

// echo sends a line and returns the pod that echoed it.
func (h *heldConn) echo(token string) (string, error) {
	_ = h.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := h.c.Write([]byte(token + "\n")); err != nil {
		return "", err
	}
	line, err := h.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	name, got, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if got != token {
		return name, fmt.Errorf("echo %q, sent %q", got, token)
	}
	return name, nil
}

// callAgent runs call against the agent at sock with a 10 s deadline; an
// error fails t, naming what was asked.
func callAgent[T any](t *testing.T, sock, what string, call func(context.Context, apiv1.AgentClient) (T, error)) T {
	t.Helper()
	c, closeFn, err := agentClient(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := call(ctx, c)
	if err != nil {
		t.Fatalf("%s of %s: %v", what, sock, err)
	}
	return v
}

// agentStatusOf is the Status of the agent at sock.
func agentStatusOf(t *testing.T, sock string) *apiv1.StatusResponse {
	t.Helper()
	return callAgent(t, sock, "status", func(ctx context.Context, c apiv1.AgentClient) (*apiv1.StatusResponse, error) {
		return c.Status(ctx, &apiv1.StatusRequest{})
	})
}

// listEndpoints lists the endpoints of the agent at sock.
func listEndpoints(t *testing.T, sock string) []*apiv1.Endpoint {
	t.Helper()
	return callAgent(t, sock, "list endpoints", func(ctx context.Context, c apiv1.AgentClient) ([]*apiv1.Endpoint, error) {
		resp, err := c.ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
		return resp.GetEndpoints(), err
	})
}

// endpointCounters maps each endpoint IP on node i to its datapath counters.
func endpointCounters(t *testing.T, node int) map[string]*apiv1.EndpointCounters {
	t.Helper()
	return countersOf(t, AgentSocket(node))
}

// countersOf maps each endpoint IP of the agent at sock to its counters.
func countersOf(t *testing.T, sock string) map[string]*apiv1.EndpointCounters {
	t.Helper()
	out := map[string]*apiv1.EndpointCounters{}
	for _, ep := range listEndpoints(t, sock) {
		for _, ipc := range ep.GetIps() {
			ip, _, _ := strings.Cut(ipc.GetAddress(), "/")
			out[ip] = ep.GetCounters()
		}
	}
	return out
}

// mapEntries counts the entries of node i's pinned BPF map name.
func mapEntries(t *testing.T, node int, name string) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(node), name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("open pinned map %s of node %d: %v", name, node, err)
	}
	defer m.Close()
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	n := 0
	var cur any // nil: the first key
	for {
		if err := m.NextKey(cur, next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return n
			}
			t.Fatalf("iterate %s of node %d: %v", name, node, err)
		}
		n++
		copy(key, next)
		cur = key
		if n > 1<<20 {
			t.Fatalf("%s of node %d: runaway iteration", name, node)
		}
	}
}

// writeTemp writes data into a file under the test's temp dir.
func writeTemp(t *testing.T, name, data string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// addLabPods adds named pods with `lanekit lab pod add` and returns them by name.
func addLabPods(t *testing.T, lk func(t *testing.T, args ...string) (string, error), pods []labPodSpec) map[string]NamedPod {
	t.Helper()
	for _, p := range pods {
		args := []string{"lab", "pod", "add", p.name, "--node", fmt.Sprint(p.node), "--namespace", p.ns}
		if p.labels != "" {
			args = append(args, "--labels", p.labels)
		}
		if p.ports != "" {
			args = append(args, "--port", p.ports)
		}
		if _, err := lk(t, args...); err != nil {
			t.Fatal(err)
		}
	}
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]NamedPod{}
	for _, p := range st.NamedPods {
		out[p.Name] = p
	}
	return out
}

type labPodSpec struct {
	name, ns string
	node     int
	labels   string // k=v,...
	ports    string // name=PORT/PROTO,...
}

// requireGuestImage builds (first run on a machine: a kernel download and an
// initrd build, minutes) or reuses the lab's guest image before a test
// starts a lab with VMs under a command timeout sized for booting them.
func requireGuestImage(t *testing.T) {
	t.Helper()
	start := time.Now()
	if _, _, err := guest.EnsureImage(GuestCacheDir); err != nil {
		t.Fatalf("guest image: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("guest image built in %s", d.Round(time.Second))
	}
}

// upLab brings up the global lab as cfg says for the rest of t (lab down
// at its end, an error if that fails); the tests' log takes its progress.
func upLab(t *testing.T, ctx context.Context, cfg Config) *State {
	t.Helper()
	t.Cleanup(func() {
		if err := Down(context.Background(), DownOptions{Bins: cfg.Bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	cfg.Out = testLog{t}
	st, err := Up(ctx, cfg)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	return st
}
