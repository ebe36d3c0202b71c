package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/rss"
	"github.com/lanekit/lanekit/pkg/xsk"
	"golang.org/x/sys/unix"
)

// The steering benchmark: Flows UDP flows from the wire into a VM endpoint
// with Queues queue pairs, through the whole fast lane:
//
//	generator -> lks1 -> lks0 (uplink, from_uplink: deliver_local picks the rx
//	queue) -> lkq1 (the VM's host end) -> lkq0 rx queue q (steer_vm) -> AF_XDP
//	socket q (the bench acts as the agent) -> lanekit-vhost pair q -> guest queue q
//
// The guest is rss_guest (vhost/examples): it counts frames per queue and per
// flow and reads each virtio header's hash. Two runs: "flow-hash" (the guest
// sets no RSS configuration: the kernel flow hash picks the queue, today's
// default) and "guest-rss" (the guest negotiates VIRTIO_NET_F_RSS and
// F_HASH_REPORT and sets a key, hash types and an indirection table; the
// datapath follows them). The guest's table puts the flows' hash buckets on
// the queues in turn, as a guest rebalancing its RSS table would (with a
// plain round-robin table the spread is as random as the flow hash's).

// SteerOptions bound a steering run.
type SteerOptions struct {
	VhostBin string // lanekit-vhost
	GuestBin string // rss_guest (cargo build --example rss_guest)
	Testpmd  string // generator; empty or missing: a Go AF_PACKET sender
	Duration time.Duration
	Flows    int // default 8
	Queues   int // default 4
	Size     int // frame bytes, default 64
	// Frames bounds the Go sender (frames per flow); 0: 2000.
	Frames   int
	Progress io.Writer
}

// SteerRun is one mode's result.
type SteerRun struct {
	Mode     string      `json:"mode"` // "flow-hash" | "guest-rss"
	Frames   uint64      `json:"frames"`
	Mpps     float64     `json:"mpps"` // frames/s into the guest over its receive window
	PerQueue []uint64    `json:"per_queue"`
	Balance  float64     `json:"balance"` // max/min frames per queue (-1: a queue got none)
	Split    int         `json:"flows_on_two_queues"`
	Flows    []SteerFlow `json:"flows"`
	// guest-rss: flows whose virtio hash equals the Toeplitz reference, and
	// flows on the queue the guest's table names.
	HashOK  int `json:"hash_ok"`
	QueueOK int `json:"queue_ok"`
}

// SteerFlow is one flow as the guest saw it.
type SteerFlow struct {
	Flow      string         `json:"flow"`
	Frames    uint64         `json:"frames"`
	Queues    map[int]uint64 `json:"queues"`
	Hashes    []string       `json:"hashes,omitempty"` // virtio hash_value seen
	Reports   []string       `json:"reports,omitempty"`
	WantHash  string         `json:"want_hash,omitempty"`
	WantQueue int            `json:"want_queue"`
}

// SteerReport is the steering benchmark's result.
type SteerReport struct {
	Setup  string     `json:"setup"`
	Flows  int        `json:"flows"`
	Queues int        `json:"queues"`
	Size   int        `json:"size"`
	Runs   []SteerRun `json:"runs"`
}

const (
	stUplink, stGen   = "lks0", "lks1"
	stVMDev, stVMHost = "lkq0", "lkq1"
	stVMID            = 1
	stVMName          = "vmsteer"
	stTypes           = rss.TypeIPv4 | rss.TypeTCPv4 | rss.TypeUDPv4
)

var (
	stVMIP   = netip.MustParseAddr("10.99.0.2")
	stUpMAC  = net.HardwareAddr{0x02, 0x6c, 0x6b, 0x00, 0x01, 0x01}
	stGenMAC = net.HardwareAddr{0x02, 0x6c, 0x6b, 0x00, 0x01, 0x02}
	stHostMA = net.HardwareAddr{0x02, 0x6c, 0x6b, 0x00, 0x01, 0x03}
)

func (o SteerOptions) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// steerFlows are the generator's frames: UDP from 10.99.1.1 ports 10000.. to
// the VM's port 5201, addressed to the uplink's MAC, size bytes each.
func steerFlows(n, size int) [][]byte {
	fs := make([][]byte, n)
	src, dst := netip.MustParseAddr("10.99.1.1").As4(), stVMIP.As4()
	for i := range fs {
		f := make([]byte, max(size, 60))
		copy(f[0:6], stUpMAC)
		copy(f[6:12], stGenMAC)
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := f[14:34]
		ip[0], ip[8], ip[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
		copy(ip[12:16], src[:])
		copy(ip[16:20], dst[:])
		var sum uint32
		for j := 0; j < 20; j += 2 {
			sum += uint32(binary.BigEndian.Uint16(ip[j:]))
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
		udp := f[34:42]
		binary.BigEndian.PutUint16(udp[0:], uint16(10000+i))
		binary.BigEndian.PutUint16(udp[2:], 5201)
		binary.BigEndian.PutUint16(udp[4:], uint16(len(f)-34))
		fs[i] = f
	}
	return fs
}

// RunSteering measures both modes. Root only; everything it creates is
// removed on return.
func RunSteering(ctx context.Context, o SteerOptions) (*SteerReport, error) {
	if o.Flows <= 0 {
		o.Flows = 8
	}
	if o.Queues <= 0 {
		o.Queues = 4
	}
	if o.Size < 60 {
		o.Size = 60
	}
	if o.Duration < time.Second {
		o.Duration = time.Second
	}
	if o.Frames <= 0 {
		o.Frames = 2000
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: steering bench needs root", ErrBackendUnavailable)
	}
	for _, b := range []string{o.VhostBin, o.GuestBin} {
		if st, err := os.Stat(b); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%w: %q not executable (make build)", ErrBackendUnavailable, b)
		}
	}
	useTestpmd := o.Testpmd != ""
	if useTestpmd {
		if _, err := exec.LookPath(o.Testpmd); err != nil {
			useTestpmd = false
		}
	}
	s, err := newSteerBench(ctx, o)
	if err != nil {
		return nil, err
	}
	defer s.cleanup()
	gen := "Go AF_PACKET sender (" + strconv.Itoa(o.Frames) + " frames per flow)"
	if useTestpmd {
		gen = "testpmd pcap replay -> af_packet (infinite)"
	}
	rep := &SteerReport{Flows: o.Flows, Queues: o.Queues, Size: o.Size,
		Setup: fmt.Sprintf("%d UDP flows -> uplink (XDP_PASS, then from_uplink) -> VM host end -> %d-queue VM device (steer_vm) -> agent AF_XDP sockets -> lanekit-vhost (CPU 1) -> rss_guest (CPU 0); generator: %s",
			o.Flows, o.Queues, gen)}
	for _, guestRSS := range []bool{false, true} {
		run, err := s.run(ctx, guestRSS, useTestpmd)
		if err != nil {
			return rep, err
		}
		rep.Runs = append(rep.Runs, *run)
	}
	return rep, nil
}

type steerBench struct {
	o      SteerOptions
	ns     string
	dir    string
	agent  *benchAgent
	flows  [][]byte
	hasher *rss.Hasher
	linear link.Link // XDP_PASS on the uplink (see linearize)
}

func newSteerBench(ctx context.Context, o SteerOptions) (_ *steerBench, err error) {
	pid := os.Getpid()
	s := &steerBench{o: o, ns: fmt.Sprintf("lk-vhs-%d", pid), flows: steerFlows(o.Flows, o.Size)}
	for _, r := range reapDeadRuns(ctx, "lk-vhs-") {
		o.progress("steering bench: removed %s of a run that died", r)
	}
	defer func() {
		if err != nil {
			s.cleanup()
		}
	}()
	if s.dir, err = os.MkdirTemp("", fmt.Sprintf("lk-vhost-steer-%d-", pid)); err != nil {
		return nil, err
	}
	q := strconv.Itoa(o.Queues)
	steps := [][]string{
		{"netns", "add", s.ns},
		{"netns", "exec", s.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"},
		{"-n", s.ns, "link", "add", stUplink, "address", stUpMAC.String(), "type", "veth", "peer", "name", stGen, "address", stGenMAC.String()},
		{"-n", s.ns, "link", "add", stVMDev, "numtxqueues", q, "numrxqueues", q, "address", benchVMMAC.String(), "type", "veth",
			"peer", "name", stVMHost, "numtxqueues", q, "numrxqueues", q, "address", stHostMA.String()},
	}
	for _, d := range []string{stUplink, stGen, stVMDev, stVMHost} {
		steps = append(steps, []string{"-n", s.ns, "link", "set", d, "up"})
	}
	for _, st := range steps {
		if err := runIP(ctx, st...); err != nil {
			return nil, fmt.Errorf("steering bench: setup: %w", err)
		}
	}
	pinDir := filepath.Join("/sys/fs/bpf", "lk-vhs-"+strconv.Itoa(pid))
	if s.agent, err = newSteerAgent("/run/netns/"+s.ns, pinDir, filepath.Join(s.dir, "agent.sock"), o.Queues); err != nil {
		return nil, err
	}
	if s.hasher, err = rss.NewHasher(); err != nil {
		return nil, fmt.Errorf("steering bench: %w", err)
	}
	if s.linear, err = linearize("/run/netns/"+s.ns, stUplink); err != nil {
		return nil, fmt.Errorf("steering bench: %w", err)
	}
	return s, nil
}

// linearize attaches an XDP_PASS program to dev (native mode). testpmd's
// af_packet PMD transmits from a PACKET_TX_RING: the skbs it makes hold only
// the Ethernet header in their linear part and the rest in page fragments,
// and from_uplink, which reads headers by direct packet access, passes such
// frames to the stack. Native XDP on a veth hands the stack a linear copy, as
// a NIC driver would build it.
func linearize(nsPath, dev string) (link.Link, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		return nil, fmt.Errorf("xdp pass program: %w", err)
	}
	defer prog.Close()
	var l link.Link
	err = netdev.InNetns(nsPath, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachXDP(link.XDPOptions{Interface: ifc.Index, Program: prog, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach xdp pass to %s: %w", dev, err)
	}
	return l, nil
}

func (s *steerBench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.hasher != nil {
		s.hasher.Close()
	}
	if s.linear != nil {
		s.linear.Close()
	}
	if s.agent != nil {
		if err := s.agent.close(); err != nil {
			s.o.progress("steering bench: cleanup: %v", err)
		}
	}
	if _, err := os.Stat("/run/netns/" + s.ns); err == nil {
		if err := runIP(ctx, "netns", "del", s.ns); err != nil {
			s.o.progress("steering bench: cleanup: %v", err)
		}
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	os.RemoveAll(filepath.Join(dpdkRuntimeRoot, fmt.Sprintf("lksg%d", os.Getpid())))
}

// newSteerAgent plays lanekitd: the datapath with from_uplink on the uplink,
// the VM endpoint (Queues rx queues, delivered through its host end), steer_vm
// on the VM device, and the fd-passing server handing the sockets and the
// VM's RSS map.
func newSteerAgent(nsPath, pinDir, sock string, queues int) (_ *benchAgent, err error) {
	a := &benchAgent{nsPath: nsPath, pinDir: pinDir, sock: sock}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	err = netdev.InNetns(nsPath, func() error {
		var err error
		if a.loader, err = datapath.Open(datapath.Config{PinDir: pinDir, Uplink: stUplink}, quiet); err != nil {
			return err
		}
		host, err := net.InterfaceByName(stVMHost)
		if err != nil {
			return err
		}
		vmDev, err := net.InterfaceByName(stVMDev)
		if err != nil {
			return err
		}
		ep := datapath.Endpoint{ID: stVMID, Mode: datapath.ModeVeth, IfName: stVMHost, IfIndex: host.Index,
			IP: stVMIP, MAC: benchVMMAC, HostMAC: stHostMA, Queues: uint16(queues), VM: true}
		if err := a.loader.UpsertEndpoint(ep); err != nil {
			return err
		}
		a.vm = datapath.VM{ID: stVMID, IfIndex: vmDev.Index, MAC: benchVMMAC, Queues: queues}
		return a.loader.AttachVM(a.vm)
	})
	if err != nil {
		return nil, fmt.Errorf("steering agent: %w", err)
	}
	a.attached = true
	rssMap := func() (int, int, error) {
		m, err := a.loader.VMRSSMap(a.vm)
		if err != nil {
			return -1, 0, err
		}
		defer m.Close()
		fd, err := unix.Dup(m.FD()) // the server closes the fd it sends
		if err != nil {
			return -1, 0, err
		}
		return fd, int(m.ValueSize()), nil
	}
	if a.srv, err = xsk.ListenRSS(sock, stVMName, a.provide, rssMap, quiet); err != nil {
		return nil, fmt.Errorf("steering agent: %w", err)
	}
	return a, nil
}

// guestReport is rss_guest's output.
type guestReport struct {
	Acked      uint64   `json:"acked"`
	RSS        bool     `json:"rss"`
	HashReport bool     `json:"hash_report"`
	Frames     uint64   `json:"frames"`
	Other      uint64   `json:"other"`
	Window     float64  `json:"window_s"`
	Queues     []uint64 `json:"queues"`
	Flows      []struct {
		Flow    string            `json:"flow"`
		Frames  uint64            `json:"frames"`
		Queues  map[string]uint64 `json:"queues"`
		Hashes  map[string]uint64 `json:"hashes"`
		Reports map[string]uint64 `json:"reports"`
	} `json:"flows"`
}

// table spreads the flows' hash buckets over the queues in turn (largest
// groups first, onto the least loaded queue); other entries round robin.
func steerTable(hashes []uint32, queues, entries int) []uint16 {
	t := rss.RoundRobin(queues, entries)
	groups := map[int]int{}
	for _, h := range hashes {
		groups[int(h)&(entries-1)]++
	}
	idx := make([]int, 0, len(groups))
	for i := range groups {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(a, b int) bool {
		if groups[idx[a]] != groups[idx[b]] {
			return groups[idx[a]] > groups[idx[b]]
		}
		return idx[a] < idx[b]
	})
	load := make([]int, queues)
	for _, i := range idx {
		q := 0
		for j := range load {
			if load[j] < load[q] {
				q = j
			}
		}
		t[i] = uint16(q)
		load[q] += groups[i]
	}
	return t
}

func (s *steerBench) run(ctx context.Context, guestRSS, useTestpmd bool) (*SteerRun, error) {
	mode := map[bool]string{false: "flow-hash", true: "guest-rss"}[guestRSS]
	s.o.progress("steering bench: %s, %d flows into %d queues", mode, s.o.Flows, s.o.Queues)
	// The reference: the Toeplitz hash of each flow's frame (lanekit rss hash's code).
	hashes := make([]uint32, len(s.flows))
	for i, f := range s.flows {
		r, err := s.hasher.HashFrame(rss.DefaultKey, stTypes, f)
		if err != nil {
			return nil, fmt.Errorf("steering bench: reference hash: %w", err)
		}
		hashes[i] = r.Hash
	}
	table := steerTable(hashes, s.o.Queues, rss.TableSize)
	life := s.o.Duration + backendReady + backendSlack
	sock := filepath.Join(s.dir, "vhost.sock")
	os.Remove(sock)
	defer os.Remove(sock)
	be, err := startProc(ctx, life, "lanekit-vhost", "ip", "netns", "exec", s.ns, "taskset", "-c", "1", s.o.VhostBin,
		"--xsk-socket", s.agent.sock, "--vm", stVMName, "--mac", benchVMMAC.String(), "--queues", strconv.Itoa(s.o.Queues),
		"--socket", sock)
	if err != nil {
		return nil, err
	}
	defer be.term(2 * time.Second)
	if err := waitSocket(sock, backendReady, be); err != nil {
		return nil, err
	}
	// The guest stops on a line on stdin (after the generator), at the latest
	// when its process life ends.
	argv := []string{"taskset", "-c", "0", s.o.GuestBin, "--socket", sock, "--queues", strconv.Itoa(s.o.Queues),
		"--stdin-stop", "--duration", strconv.FormatFloat((life - backendSlack/2).Seconds(), 'f', 1, 64)}
	if guestRSS {
		ts := make([]string, len(table))
		for i, q := range table {
			ts[i] = strconv.Itoa(int(q))
		}
		argv = append(argv, "--rss", "--types", fmt.Sprintf("%#x", uint32(stTypes)), "--key", rss.DefaultKey.String(),
			"--table", strings.Join(ts, ","))
	}
	if !useTestpmd {
		argv = append(argv, "--frames", strconv.Itoa(s.o.Flows*s.o.Frames))
	}
	guest, err := startProc(ctx, life, "rss_guest", argv...)
	if err != nil {
		return nil, err
	}
	defer guest.term(2 * time.Second)
	if err := guest.waitLine("ready", backendReady); err != nil {
		return nil, err
	}
	if useTestpmd {
		if err := s.generateTestpmd(ctx, life); err != nil {
			return nil, err
		}
	} else if err := s.generateGo(); err != nil {
		return nil, err
	}
	// Frames still in flight: a moment, then stop the guest.
	time.Sleep(200 * time.Millisecond)
	_, _ = guest.stdin.Write([]byte("\n"))
	var out string
	for l := range guest.lines {
		if strings.HasPrefix(l, "{") {
			out = l
		}
	}
	<-guest.done
	if out == "" {
		return nil, fmt.Errorf("rss_guest printed no report (%v): %s", guest.err, guest.log.last())
	}
	var gr guestReport
	if err := json.Unmarshal([]byte(out), &gr); err != nil {
		return nil, fmt.Errorf("rss_guest report: %w", err)
	}
	if guestRSS && !(gr.RSS && gr.HashReport) {
		return nil, fmt.Errorf("rss_guest did not negotiate RSS and hash report (acked %#x)", gr.Acked)
	}
	run := &SteerRun{Mode: mode, Frames: gr.Frames, PerQueue: gr.Queues}
	if gr.Window > 0 {
		run.Mpps = float64(gr.Frames) / gr.Window / 1e6
	}
	run.Balance = balance(gr.Queues)
	want := map[string]int{}
	for i, f := range s.flows {
		want[flowName(f)] = i
	}
	for _, f := range gr.Flows {
		sf := SteerFlow{Flow: f.Flow, Frames: f.Frames, Queues: map[int]uint64{}, WantQueue: -1}
		for q, n := range f.Queues {
			qi, _ := strconv.Atoi(q)
			sf.Queues[qi] = n
		}
		if len(sf.Queues) > 1 {
			run.Split++
		}
		for h := range f.Hashes {
			sf.Hashes = append(sf.Hashes, h)
		}
		for r := range f.Reports {
			sf.Reports = append(sf.Reports, r)
		}
		sort.Strings(sf.Hashes)
		sort.Strings(sf.Reports)
		if i, ok := want[f.Flow]; ok && guestRSS {
			h := hashes[i]
			sf.WantHash = fmt.Sprintf("0x%08x", h)
			sf.WantQueue = int(table[int(h)&(rss.TableSize-1)])
			if len(sf.Hashes) == 1 && sf.Hashes[0] == sf.WantHash && len(sf.Reports) == 1 &&
				sf.Reports[0] == strconv.Itoa(int(rss.ReportUDPv4)) {
				run.HashOK++
			}
			if _, on := sf.Queues[sf.WantQueue]; on && len(sf.Queues) == 1 {
				run.QueueOK++
			}
		}
		run.Flows = append(run.Flows, sf)
	}
	sort.Slice(run.Flows, func(a, b int) bool { return run.Flows[a].Flow < run.Flows[b].Flow })
	return run, nil
}

// flowName is rss_guest's name of a frame's flow (after the datapath: same
// addresses and ports).
func flowName(f []byte) string {
	ip := f[14:]
	return fmt.Sprintf("udp %d.%d.%d.%d:%d %d.%d.%d.%d:%d", ip[12], ip[13], ip[14], ip[15],
		binary.BigEndian.Uint16(ip[20:]), ip[16], ip[17], ip[18], ip[19], binary.BigEndian.Uint16(ip[22:]))
}

// balance is max/min of per-queue counts; -1 when a queue got nothing.
func balance(per []uint64) float64 {
	if len(per) == 0 {
		return -1
	}
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, n := range per {
		lo, hi = min(lo, n), max(hi, n)
	}
	if lo == 0 {
		return -1
	}
	return float64(hi) / float64(lo)
}

// generateGo sends Frames frames of every flow, flows interleaved.
func (s *steerBench) generateGo() error {
	return netdev.InNetns("/run/netns/"+s.ns, func() error {
		ifc, err := net.InterfaceByName(stGen)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
		copy(sa.Addr[:], stUpMAC)
		for i := 0; i < s.o.Frames; i++ {
			for _, f := range s.flows {
				if err := unix.Sendto(fd, f, 0, sa); err != nil {
					return fmt.Errorf("send on %s: %w", stGen, err)
				}
			}
			if i%64 == 63 {
				time.Sleep(200 * time.Microsecond) // let the guest keep up: no drops for the checks
			}
		}
		return nil
	})
}

// generateTestpmd replays the flows (a pcap file, infinitely) onto the
// generator's veth for the window.
func (s *steerBench) generateTestpmd(ctx context.Context, life time.Duration) error {
	pcap := filepath.Join(s.dir, "flows.pcap")
	if err := writePcap(pcap, s.flows); err != nil {
		return err
	}
	prefix := fmt.Sprintf("lksg%d", os.Getpid())
	gen, err := startProc(ctx, life, "generator", "ip", "netns", "exec", s.ns, "stdbuf", "-oL", "-eL", s.o.Testpmd,
		"--lcores", "0@0,1@0", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", prefix,
		"--vdev", "net_pcap0,rx_pcap="+pcap+",tx_pcap=/dev/null,infinite_rx=1",
		"--vdev", "net_af_packet0,iface="+stGen+",qpairs=1,qdisc_bypass=1", "--",
		"--total-num-mbufs=16384", "--forward-mode=io", "--stats-period", "0")
	if err != nil {
		return err
	}
	defer gen.stop(2 * time.Second)
	if err := gen.waitLine(pressEnter, backendReady); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-gen.done:
		return fmt.Errorf("generator exited (%v): %s", gen.err, gen.log.last())
	case <-time.After(s.o.Duration):
	}
	return nil
}

// writePcap writes frames as a pcap file (Ethernet link type).
func writePcap(path string, frames [][]byte) error {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint32(b[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(b[4:], 2)
	binary.LittleEndian.PutUint16(b[6:], 4)
	binary.LittleEndian.PutUint32(b[16:], 65535)
	binary.LittleEndian.PutUint32(b[20:], 1)
	for _, f := range frames {
		h := make([]byte, 16)
		binary.LittleEndian.PutUint32(h[8:], uint32(len(f)))
		binary.LittleEndian.PutUint32(h[12:], uint32(len(f)))
		b = append(append(b, h...), f...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write pcap: %w", err)
	}
	return nil
}
