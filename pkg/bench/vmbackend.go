package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// The VM backend comparison (vhost/bench/compare.sh only wraps it): DPDK
// testpmd's virtio_user PMD plays the guest driver; the backends sit on
// veths in a namespace created here.
//
// guest→wire (frontend txonly, frames counted as they arrive on the veth peer):
//
//	own sockets:   virtio_user -> lanekit-vhost --ifname lkb0 -> lkb1
//	agent sockets: virtio_user -> lanekit-vhost --xsk-socket (steer_vm on lkv0) -> lkv1
//	testpmd:       virtio_user -> testpmd vhost PMD <-> af_xdp PMD (io forwarding) lkb0 -> lkb1
//
// wire→guest (a testpmd af_packet txonly generator on the peer; frames
// counted by the frontend, rxonly):
//
//	agent sockets: lkv1 -> lkv0 steer_vm -> lk_xsks -> lanekit-vhost --xsk-socket -> virtio_user
//	testpmd:       lkb1 -> lkb0 af_xdp PMD (its own XDP program) -> vhost PMD -> virtio_user
//
// For the agent sockets the bench acts as lanekitd (benchAgent): the
// datapath in a private pin dir, steer_vm on lkv0, sockets made with pkg/xsk
// and handed over the fd-passing socket. Same core budget for all: the
// frontend on CPU 0, the backend on CPU 1, the generator on CPU 0 with the
// frontend (the veth's XDP and AF_XDP copy run in the sender's softirq, so
// also on CPU 0). Backends alternate within every repetition (the first one
// rotates).

// BackendOptions bound a backend comparison.
type BackendOptions struct {
	VhostBin string        // lanekit-vhost
	Testpmd  string        // default "dpdk-testpmd"
	Duration time.Duration // counting window per measurement (min 1 s)
	Repeat   int
	Progress io.Writer
	// OwnOnly measures guest→wire with lanekit-vhost's own sockets only (no
	// agent path, no wire→guest).
	OwnOnly bool
	// GuestBin is rss_guest for the steering runs (default:
	// lanekit-rss-guest next to VhostBin, else examples/rss_guest there;
	// missing: no steering runs, an error in the report).
	GuestBin string
	// PacedGuestBin is paced_guest for the CPU-per-frame runs (default:
	// lanekit-paced-guest next to VhostBin, else examples/paced_guest there).
	PacedGuestBin string
}

// Backend comparison constants.
const (
	backendSetup = "frontend: dpdk-testpmd virtio_user (txonly guest→wire, rxonly wire→guest) on CPU 0; backend on CPU 1; " +
		"wire→guest generator: testpmd af_packet txonly on the veth peer, CPU 0; AF_XDP (copy mode) on veths in a throwaway netns; " +
		"own sockets: lanekit-vhost --ifname (no XDP program, so guest→wire only); " +
		"agent sockets: the bench acts as lanekitd (datapath in a private pin dir, steer_vm, lk_xsks, fd handover)"
	bfVeth, bfPeer   = "lkb0", "lkb1" // own sockets and testpmd
	bfVMDev, bfVMWir = "lkv0", "lkv1" // the VM device (steer_vm) and its wire side
	frameSize1500    = 1500
	backendReady     = 15 * time.Second // socket / "Press enter" wait
	backendSlack     = 30 * time.Second // beyond the window, per process
	dpdkRuntimeRoot  = "/var/run/dpdk"
	pressEnter       = "Press enter to exit"
	probeFrames      = 16
)

// benchVMMAC is the VM's MAC: lkv0's address, lanekit-vhost's --mac and the
// generator's destination.
var benchVMMAC = net.HardwareAddr{0x02, 0x6c, 0x6b, 0x00, 0x00, 0x01}

// Measurement kinds.
const (
	kindOwn       = "lanekit_vhost"
	kindTestpmd   = "testpmd"
	kindRealTX    = "lanekit_vhost_agent"
	kindRealRX    = "lanekit_vhost_agent_rx"
	kindTestpmdRX = "testpmd_rx"
)

type backendKind struct {
	name    string
	rx      bool // wire→guest
	agent   bool // lanekit-vhost with the bench agent's sockets
	testpmd bool
}

var allBackendKinds = []backendKind{
	{name: kindOwn}, {name: kindTestpmd, testpmd: true},
	{name: kindRealTX, agent: true},
	{name: kindRealRX, rx: true, agent: true}, {name: kindTestpmdRX, rx: true, testpmd: true},
}

// RunBackendCompare measures 64-byte packets/s and 1500-byte Gbit/s through
// the backends, Repeat times, interleaved. The namespace, pins, sockets and
// DPDK runtime files are removed on every return; a failed measurement (or
// a failed agent setup: its rows are then skipped) is recorded in Errors.
func RunBackendCompare(ctx context.Context, o BackendOptions) (*BackendReport, error) {
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if o.Duration < time.Second {
		o.Duration = time.Second
	}
	if o.Testpmd == "" {
		o.Testpmd = "dpdk-testpmd"
	}
	if err := backendPreflight(o); err != nil {
		return nil, err
	}
	b, err := newBackendBench(ctx, o)
	if err != nil {
		return nil, err
	}
	defer b.cleanup()

	rep := &BackendReport{Repeat: o.Repeat, Seconds: o.Duration.Seconds(), Setup: backendSetup}
	rep.LoadAvg[0] = LoadAvg1()
	defer func() { rep.LoadAvg[1] = LoadAvg1() }()
	kinds := allBackendKinds[:2]
	if !o.OwnOnly {
		if err := b.startAgent(); err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		} else {
			kinds = allBackendKinds
			if rep.PathCheck, err = b.probe(); err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			}
		}
	}
	vals := backendValues{}
	for r := 0; r < o.Repeat; r++ {
		for _, size := range []int{64, frameSize1500} {
			for k := range kinds {
				kind := kinds[(k+r)%len(kinds)]
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("vm backend bench: %w", err)
				}
				pps, err := b.measure(ctx, kind, size)
				msg := ""
				if err != nil {
					rep.Errors = append(rep.Errors, fmt.Sprintf("rep %d %s %dB: %v", r+1, kind.name, size, err))
					msg = "error: " + err.Error()
				} else {
					v := pps
					if size == frameSize1500 {
						v = ppsToGbps(pps, size)
						msg = fmt.Sprintf("%.2f Gbit/s", v)
					} else {
						msg = fmt.Sprintf("%.3f Mpps", pps/1e6)
					}
					vals.add(kind.name, size, v)
				}
				o.progress("vm backend rep %d/%d %-22s %4dB %s", r+1, o.Repeat, kind.name, size, msg)
			}
		}
	}
	rep.fill(vals, b.agent != nil)
	rep.TimeSplit = b.splits.summary()
	if !o.OwnOnly {
		b.runCPU(ctx, rep)
	}
	rep.Targets = backendTargets(rep)
	if b.agent != nil && rep.PathCheck != nil {
		b.finishCheck(rep.PathCheck)
	}
	if !o.OwnOnly {
		guest := o.GuestBin
		if guest == "" {
			// bin/ (make build), or cargo's target dir (compare.sh).
			guest = filepath.Join(filepath.Dir(o.VhostBin), "lanekit-rss-guest")
			if _, err := os.Stat(guest); err != nil {
				guest = filepath.Join(filepath.Dir(o.VhostBin), "examples", "rss_guest")
			}
		}
		if _, err := os.Stat(guest); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("steering: no rss_guest (%s): make build", guest))
		} else {
			st, err := RunSteering(ctx, SteerOptions{VhostBin: o.VhostBin, GuestBin: guest, Testpmd: o.Testpmd,
				Duration: o.Duration, Progress: o.Progress})
			if err != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("steering: %v", err))
			}
			rep.Steering = st
		}
	}
	return rep, nil
}

func (o BackendOptions) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// ppsToGbps converts frames/s of size bytes to Gbit/s (frame bytes, as the
// script counts).
func ppsToGbps(pps float64, size int) float64 { return pps * float64(size) * 8 / 1e9 }

// ErrBackendUnavailable wraps the reasons the comparison cannot run here
// (not root, one CPU, no dpdk-testpmd, no lanekit-vhost).
var ErrBackendUnavailable = errors.New("vm backend bench unavailable")

func backendPreflight(o BackendOptions) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (netns, AF_XDP)", ErrBackendUnavailable)
	}
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("%w: needs 2 CPUs (frontend and backend pinned apart)", ErrBackendUnavailable)
	}
	for _, t := range []string{o.Testpmd, "taskset", "stdbuf", "chrt"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%w: %v (make deps installs dpdk)", ErrBackendUnavailable, err)
		}
	}
	if st, err := os.Stat(o.VhostBin); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%w: lanekit-vhost %q not executable (make build)", ErrBackendUnavailable, o.VhostBin)
	}
	return nil
}

// backendBench owns one comparison's namespace, directory and DPDK prefixes.
type backendBench struct {
	o        BackendOptions
	ns, dir  string
	prefixes []string    // DPDK file prefixes: frontend, backend, generator
	agent    *benchAgent // nil: no agent path
	agentRx  uint64      // frames lanekit-vhost took from the agent's sockets (wire→guest runs)
	splits   splitValues // guest→wire runs' backend user/kernel time
	guestRx  uint64      // frames the frontend counted in those runs' windows
}

func newBackendBench(ctx context.Context, o BackendOptions) (*backendBench, error) {
	pid := os.Getpid()
	b := &backendBench{o: o, ns: fmt.Sprintf("lk-vhb-%d", pid), splits: splitValues{},
		prefixes: []string{fmt.Sprintf("lkbf%d", pid), fmt.Sprintf("lkbb%d", pid), fmt.Sprintf("lkbg%d", pid)}}
	for _, r := range reapDeadRuns(ctx, "lk-vhb-") {
		o.progress("vm backend bench: removed %s of a run that died", r)
	}
	// The pid in the name tells this run's processes (their arguments name
	// the directory) from a concurrent run's.
	dir, err := os.MkdirTemp("", benchDirPrefix(os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("vm backend bench: %w", err)
	}
	b.dir = dir
	steps := [][]string{
		{"netns", "add", b.ns},
		{"netns", "exec", b.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"},
		{"-n", b.ns, "link", "add", bfVeth, "type", "veth", "peer", "name", bfPeer},
		{"-n", b.ns, "link", "set", bfVeth, "up"},
		{"-n", b.ns, "link", "set", bfPeer, "up"},
		{"-n", b.ns, "link", "add", bfVMDev, "address", benchVMMAC.String(), "type", "veth", "peer", "name", bfVMWir},
		{"-n", b.ns, "link", "set", bfVMDev, "up"},
		{"-n", b.ns, "link", "set", bfVMWir, "up"},
	}
	for _, s := range steps {
		if err := runIP(ctx, s...); err != nil {
			b.cleanup()
			return nil, fmt.Errorf("vm backend bench: setup: %w", err)
		}
	}
	return b, nil
}

// cleanup removes the namespace, the directory and DPDK's runtime files;
// processes are gone by then (each measurement kills its own).
func (b *backendBench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if b.agent != nil {
		if err := b.agent.close(); err != nil {
			b.o.progress("vm backend bench: cleanup: %v", err)
		}
		b.agent = nil
	}
	if _, err := os.Stat("/run/netns/" + b.ns); err == nil {
		if err := runIP(ctx, "netns", "del", b.ns); err != nil {
			b.o.progress("vm backend bench: cleanup: %v", err)
		}
	}
	os.RemoveAll(b.dir)
	for _, p := range b.prefixes {
		os.RemoveAll(filepath.Join(dpdkRuntimeRoot, p))
	}
}

func runIP(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// proc is a bounded helper process in its own group (killed with it), dying
// with this process too.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout+stderr lines; closed at EOF
	log   *tailLog
	eof   chan struct{} // closed once every line is in log
	done  chan struct{}
	err   error
}

// exitLog is the last lines of an exited process's output: read after its
// output has all been logged (the process can exit before the reader has
// taken its last lines — its error among them), waiting at most a second.
func (p *proc) exitLog() string {
	select {
	case <-p.eof:
	case <-time.After(time.Second):
	}
	return p.log.last()
}

func startProc(ctx context.Context, life time.Duration, name string, argv ...string) (*proc, error) {
	ctx, cancel := context.WithTimeout(ctx, life)
	p := &proc{name: name, lines: make(chan string, 256), log: &tailLog{}, eof: make(chan struct{}), done: make(chan struct{})}
	p.cmd = nsexec.GroupCommand(ctx, 2*time.Second, argv...)
	in, err := p.cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		cancel()
		return nil, err
	}
	p.stdin = in
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		cancel()
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	pw.Close()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.log.add(sc.Text())
			select {
			case p.lines <- sc.Text():
			default: // nobody waits for lines any more
			}
		}
		pr.Close()
		close(p.lines)
		close(p.eof)
	}()
	go func() {
		p.err = p.cmd.Wait()
		cancel()
		close(p.done)
	}()
	return p, nil
}

// waitLine waits for a line containing want, the process's end or timeout.
func (p *proc) waitLine(want string, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				<-p.done
				return fmt.Errorf("%s exited (%v) before %q: %s", p.name, p.err, want, p.exitLog())
			}
			if strings.Contains(l, want) {
				return nil
			}
		case <-t.C:
			return fmt.Errorf("%s: no %q after %s: %s", p.name, want, timeout, p.log.last())
		}
	}
}

// stop asks politely (Enter, then SIGTERM) and kills the group after grace.
func (p *proc) stop(grace time.Duration) {
	_, _ = p.stdin.Write([]byte("\n"))
	p.stdin.Close()
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.term(grace)
}

// tailLog keeps a process's last output lines for error messages.
type tailLog struct {
	mu    sync.Mutex
	lines []string
}

func (t *tailLog) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, l)
	if len(t.lines) > 64 {
		t.lines = t.lines[len(t.lines)-64:]
	}
}

// last is the last 8 lines, for error messages.
func (t *tailLog) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines[max(0, len(t.lines)-8):], " | ")
}

// find returns the last of the kept lines containing s ("" if none).
func (t *tailLog) find(s string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.lines) - 1; i >= 0; i-- {
		if strings.Contains(t.lines[i], s) {
			return t.lines[i]
		}
	}
	return ""
}

// startAgent makes the agent path: the bench acts as lanekitd for the VM
// device lkv0.
func (b *backendBench) startAgent() error {
	pinDir := filepath.Join("/sys/fs/bpf", "lk-vhb-"+strconv.Itoa(os.Getpid()))
	a, err := newBenchAgent("/run/netns/"+b.ns, bfVMDev, pinDir, filepath.Join(b.dir, "agent.sock"), benchVMMAC)
	if err != nil {
		return fmt.Errorf("agent path: %w", err)
	}
	b.agent = a
	return nil
}

// probe checks steer_vm of the VM endpoint sees what arrives from the wire:
// the program on lkv0 is steer_vm, and frames for a foreign MAC sent on lkv1
// show up in the endpoint's not-for-vm drop counter.
func (b *backendBench) probe() (*BackendPathCheck, error) {
	c := &BackendPathCheck{VMDevice: bfVMDev, ProbeSent: probeFrames}
	var err error
	if c.XDPProgram, err = b.agent.xdpProgram(bfVMDev); err != nil {
		return c, fmt.Errorf("agent path check: %w", err)
	}
	before, err := b.agent.steerDrops()
	if err != nil {
		return c, fmt.Errorf("agent path check: %w", err)
	}
	foreign := net.HardwareAddr{0x02, 0x6c, 0x6b, 0x00, 0x00, 0x99}
	if err := sendRaw("/run/netns/"+b.ns, bfVMWir, probeFrame(foreign, net.HardwareAddr{0x02, 0x6c, 0x6b, 0, 0, 2}), probeFrames); err != nil {
		return c, fmt.Errorf("agent path check: %w", err)
	}
	// The veth delivers from a NAPI poll: wait for the counter a moment.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		after, err := b.agent.steerDrops()
		if err != nil {
			return c, fmt.Errorf("agent path check: %w", err)
		}
		c.ProbeCounted = after[datapath.DropNotForVM] - before[datapath.DropNotForVM]
		if c.ProbeCounted >= probeFrames || time.Now().After(deadline) {
			break
		}
	}
	if c.ProbeCounted != probeFrames {
		return c, fmt.Errorf("agent path check: %d of %d not-for-vm probes counted by the vm endpoint", c.ProbeCounted, probeFrames)
	}
	return c, nil
}

// finishCheck records the handovers and the endpoint's drops at the end.
func (b *backendBench) finishCheck(c *BackendPathCheck) {
	c.Handovers = b.agent.handovers.Load()
	c.BackendRxFrames, c.GuestRxFrames = b.agentRx, b.guestRx
	if d, err := b.agent.steerDrops(); err == nil && len(d) > 0 {
		c.SteerDrops = map[string]uint64{}
		for r, n := range d {
			c.SteerDrops[r.String()] = n
		}
	}
}

// measure starts one backend, drives size-byte frames through it for the
// window and returns the frames/s that reached the far side.
func (b *backendBench) measure(ctx context.Context, kind backendKind, size int) (float64, error) {
	life := b.o.Duration + backendReady + backendSlack
	sock := filepath.Join(b.dir, kind.name+".sock")
	metrics := filepath.Join(b.dir, "metrics.sock")
	os.Remove(sock)
	defer os.Remove(sock)
	wire := bfPeer
	var argv []string
	switch {
	case kind.testpmd:
		argv = []string{"ip", "netns", "exec", b.ns, "stdbuf", "-oL", "-eL", b.o.Testpmd,
			"--lcores", "0@1,1@1", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", b.prefixes[1],
			"--vdev", "net_vhost0,iface=" + sock + ",queues=1",
			"--vdev", "net_af_xdp0,iface=" + bfVeth + ",start_queue=0,queue_count=1", "--",
			"--total-num-mbufs=16384", "--forward-mode=io", "--stats-period", "0"}
	case kind.agent:
		if b.agent == nil {
			return 0, errors.New("no agent path")
		}
		wire = bfVMWir
		os.Remove(metrics)
		defer os.Remove(metrics)
		argv = []string{"ip", "netns", "exec", b.ns, "taskset", "-c", "1", b.o.VhostBin,
			"--xsk-socket", b.agent.sock, "--vm", benchVMName, "--mac", benchVMMAC.String(),
			"--socket", sock, "--metrics-listen", metrics}
	default:
		argv = []string{"ip", "netns", "exec", b.ns, "taskset", "-c", "1", b.o.VhostBin,
			"--ifname", bfVeth, "--socket", sock}
	}
	be, err := b.startBackend(ctx, life, kind.name, sock, argv)
	if err != nil {
		return 0, err
	}
	if kind.testpmd {
		defer be.stop(2 * time.Second)
	} else {
		defer be.term(2 * time.Second) // lanekit-vhost ignores stdin
	}
	if !kind.rx {
		pps, split, err := b.drive(ctx, sock, wire, size, be.cmd.Process.Pid)
		if err == nil && split.total() > 0 {
			b.splits.add(kind.name, size, split)
		}
		return pps, err
	}
	pps, frames, err := b.driveRX(ctx, sock, wire, size)
	if err == nil && kind.agent {
		// Read after the window: the backend has delivered at least what
		// the frontend counted.
		rx, _, err := BackendPackets(ctx, metrics)
		if err != nil {
			return 0, err
		}
		b.agentRx += rx
		b.guestRx += frames
	}
	return pps, err
}

// startBackend starts a backend until it serves its socket. The previous
// measurement's AF_XDP socket on the veth queue is released asynchronously
// by the kernel: a bind that fails with EBUSY is retried for a while.
func (b *backendBench) startBackend(ctx context.Context, life time.Duration, kind, sock string, argv []string) (*proc, error) {
	deadline := time.Now().Add(backendReady)
	for {
		be, err := startProc(ctx, life, kind, argv...)
		if err != nil {
			return nil, err
		}
		err = waitSocket(sock, backendReady, be)
		if err == nil && kind == "testpmd" {
			err = be.waitLine(pressEnter, backendReady)
		}
		if err == nil {
			return be, nil
		}
		be.stop(time.Second)
		os.Remove(sock)
		busy := strings.Contains(strings.ToLower(be.exitLog()), "busy") // its bind of the device: EBUSY
		if !busy || time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// drive runs the txonly frontend and counts frames on the peer over the
// window that starts once forwarding runs.
func (b *backendBench) drive(ctx context.Context, sock, peer string, size, backendPid int) (float64, cpuSplit, error) {
	var split cpuSplit
	life := b.o.Duration + backendReady + backendSlack
	fe, err := startProc(ctx, life, "frontend", "stdbuf", "-oL", "-eL", b.o.Testpmd,
		"--lcores", "0@0,1@0", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", b.prefixes[0],
		"--vdev", "net_virtio_user0,path="+sock+",queues=1", "--",
		"--total-num-mbufs=16384", "--forward-mode=txonly", "--txpkts="+strconv.Itoa(size), "--stats-period", "0")
	if err != nil {
		return 0, split, err
	}
	defer fe.stop(2 * time.Second)
	if err := fe.waitLine(pressEnter, backendReady); err != nil {
		return 0, split, err
	}
	n0, t0, err := b.rxPackets(ctx, peer)
	if err != nil {
		return 0, split, err
	}
	c0, cerr := processTimes(backendPid)
	select {
	case <-ctx.Done():
		return 0, split, ctx.Err()
	case <-fe.done:
		return 0, split, fmt.Errorf("frontend exited during the window (%v): %s", fe.err, fe.log.last())
	case <-time.After(b.o.Duration):
	}
	n1, t1, err := b.rxPackets(ctx, peer)
	if err != nil {
		return 0, split, err
	}
	if c1, err := processTimes(backendPid); err == nil && cerr == nil {
		split = cpuSplit{user: c1.user - c0.user, sys: c1.sys - c0.sys, window: t1.Sub(t0)}
	}
	if n1 <= n0 {
		return 0, split, fmt.Errorf("no frames reached %s in %s", peer, t1.Sub(t0).Round(time.Millisecond))
	}
	return float64(n1-n0) / t1.Sub(t0).Seconds(), split, nil
}

// rxPackets reads the peer's rx packet counter and when it was read (the
// midpoint of the ip call).
func (b *backendBench) rxPackets(ctx context.Context, dev string) (uint64, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "ip", "-n", b.ns, "-s", "-j", "link", "show", "dev", dev).Output()
	end := time.Now()
	if err != nil {
		return 0, end, fmt.Errorf("read %s counters: %w", dev, err)
	}
	n, err := ParseIPLinkRxPackets(out)
	return n, start.Add(end.Sub(start) / 2), err
}

// ParseIPLinkRxPackets reads stats64.rx.packets of the first link in
// `ip -s -j link show` output.
func ParseIPLinkRxPackets(data []byte) (uint64, error) {
	var links []struct {
		Stats64 *struct {
			RX struct {
				Packets *uint64 `json:"packets"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(data, &links); err != nil {
		return 0, fmt.Errorf("parse ip link json: %w", err)
	}
	if len(links) == 0 || links[0].Stats64 == nil || links[0].Stats64.RX.Packets == nil {
		return 0, errors.New("parse ip link json: no stats64.rx.packets")
	}
	return *links[0].Stats64.RX.Packets, nil
}

// waitSocket waits for a unix socket file while p runs.
func waitSocket(path string, timeout time.Duration, p *proc) error {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before creating %s: %s", p.name, p.err, path, p.exitLog())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: no socket %s after %s: %s", p.name, path, timeout, p.log.last())
}

// benchDirPrefix is the temp-dir prefix of the backend comparison run by pid.
func benchDirPrefix(pid int) string { return fmt.Sprintf("lk-vhost-bench-%d-", pid) }
