package lab

// `lanekit lab vm migrate`: QEMU's own live migration of the lab's
// fast-lane guest between the VM netns of two nodes, with the agents moving
// its address (pkg/agent/vmmigrate.go). The lab plays the control plane's
// part: it creates the target's incoming endpoint and backend (KubeVirt: the
// target launcher pod), reports the migration state to the agents (KubeVirt:
// the VMI's migrationState) and hands every agent the nodes' claims of
// moved addresses (what each agent's ListVMs publishes), and removes the
// source's pod (backend, QEMU, endpoint, netns) after the switch. In a
// dual-stack lab (native routing) the guest's IPv6 address moves too: the
// incoming endpoint takes it, the claims carry it via the nodes' IPv6
// underlay addresses, and IPv6 pingers and a TCP connection run beside the
// IPv4 ones.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/guest"
)

// MigrateOptions configures MigrateVM.
type MigrateOptions struct {
	VM string // default "vm1"
	// To is the target node; 0: node 1, or node 2 when the VM is on node 1.
	To int
	// PingInterval is each pinger's interval (default 10 ms).
	PingInterval time.Duration
	Bins         Bins // where lanekit-vhost is
	Out          io.Writer
}

// MigrationReport is what a migration measured.
type MigrationReport struct {
	VM string `json:"vm"`
	// Path: "fast-lane" (lanekit-vhost; the address moves) or "bridge-tap"
	// (vm-std; the address stays in the source node's bridge subnet).
	Path     string `json:"path"`
	From     int    `json:"from_node"`
	To       int    `json:"to_node"`
	IP       string `json:"ip"`
	IP6      string `json:"ip6,omitempty"` // dual-stack lab: the guest's IPv6 address (moves too)
	MAC      string `json:"mac"`
	SourceID uint32 `json:"source_endpoint_id"`
	TargetID uint32 `json:"target_endpoint_id"`
	// Generation is the target's claim of the address.
	Generation  uint64 `json:"generation"`
	ActivatedBy string `json:"activated_by"`
	// Pings from a pod on every node at PingInterval.
	PingInterval time.Duration `json:"ping_interval_ns"`
	Pings        []PingStats   `json:"pings"`
	TCP          TCPStats      `json:"tcp"`
	// The same over IPv6 (a dual-stack lab's VM).
	Pings6 []PingStats `json:"pings6,omitempty"`
	TCP6   *TCPStats   `json:"tcp6,omitempty"`
	// SwitchOver: the source backend's last frame into the guest to the
	// target backend's first (both polled every FramePoll).
	SwitchOver time.Duration `json:"switch_over_ns"`
	FramePoll  time.Duration `json:"frame_poll_ns"`
	// QEMU's own numbers (query-migrate on the source): total time and the
	// downtime it measured (vCPUs stopped on the source to running on the
	// target).
	QEMUTotal    time.Duration `json:"qemu_total_ns"`
	QEMUDowntime time.Duration `json:"qemu_downtime_ns"`
	// Resumed to Activated: the target's QEMU resumed the guest (QMP
	// RESUME) until the agent activated the endpoint; Routed: until every
	// agent had the new claims.
	ResumedToActivated time.Duration `json:"resumed_to_activated_ns"`
	ResumedToRouted    time.Duration `json:"resumed_to_routed_ns"`
	Total              time.Duration `json:"total_ns"` // the whole command
}

// Lost is the pings lost by every pinger together.
func (r *MigrationReport) Lost() int {
	n := 0
	for _, p := range append(slices.Clip(r.Pings), r.Pings6...) {
		n += p.Lost
	}
	return n
}

func (r *MigrationReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "vm %s (%s) %s (%s) node %d -> node %d", r.VM, r.Path, r.IP, r.MAC, r.From, r.To)
	if r.TargetID != 0 {
		fmt.Fprintf(&b, ": endpoint %d -> %d, activated by %s", r.SourceID, r.TargetID, r.ActivatedBy)
	}
	b.WriteString("\n")
	r.writeTraffic(&b, "", r.Pings, r.TCP)
	if r.TCP6 != nil {
		r.writeTraffic(&b, " (IPv6 "+r.IP6+")", r.Pings6, *r.TCP6)
	}
	if r.Path == "fast-lane" {
		fmt.Fprintf(&b, "  switch-over (source's last to target's first frame into the guest): %s (polled every %s)\n",
			r.SwitchOver.Round(time.Millisecond), r.FramePoll)
	}
	fmt.Fprintf(&b, "  QEMU: total %s, downtime %s", r.QEMUTotal, r.QEMUDowntime)
	if r.TargetID != 0 {
		fmt.Fprintf(&b, "; resumed -> endpoint active %s, -> all nodes routed %s", r.ResumedToActivated.Round(time.Microsecond),
			r.ResumedToRouted.Round(time.Microsecond))
	} else {
		b.WriteString("; nothing moves the address: it stays routed to the source node's bridge")
	}
	fmt.Fprintf(&b, "; command %s\n", r.Total.Round(time.Millisecond))
	return b.String()
}

func (r *MigrationReport) writeTraffic(b *strings.Builder, fam string, pings []PingStats, t TCPStats) {
	for _, p := range pings {
		fmt.Fprintf(b, "  ping%s from %s every %s: %d sent, %d lost (%s), longest gap %s\n", fam, p.From, r.PingInterval,
			p.Sent, p.Lost, time.Duration(p.Lost)*r.PingInterval, p.MaxGap.Round(time.Millisecond))
	}
	tcp := "survived"
	switch {
	case t.Error != "":
		tcp = "BROKEN: " + t.Error
	case t.Local == "":
		tcp = "not started"
	}
	fmt.Fprintf(b, "  tcp%s from %s (%s): %s, %d exchanges, longest %s\n", fam, t.From, t.Local, tcp, t.Exchanges,
		t.MaxRTT.Round(time.Millisecond))
}

const (
	migrateTimeout = 3 * time.Minute
	framePoll      = 2 * time.Millisecond
)

// MigrateVM live-migrates a lab VM to another node while pods on every node
// ping it and one holds a TCP connection to it. The fast lane's steps:
// the target's incoming endpoint, backend and QEMU (prepareTarget), the
// traffic, QEMU's migration until the guest resumes on the target
// (awaitResume), the target's claim of the address (activateTarget), and
// the source's removal (finishMigration).
func MigrateVM(ctx context.Context, opts MigrateOptions) (rep *MigrationReport, err error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	if opts.VM == "" {
		opts.VM = "vm1"
	}
	if opts.PingInterval == 0 {
		opts.PingInterval = 10 * time.Millisecond
	}
	st, err := LoadState()
	if err != nil {
		return nil, err
	}
	if st.K8s { // native or tunnel routing: the agents' claim writers follow the mode
		return nil, errors.New("lab vm migrate: needs the plain lab (`lab up --vm [--routing tunnel]`)")
	}
	idx := -1
	for i := range st.VMs {
		if st.VMs[i].Name == opts.VM {
			idx = i
		}
	}
	if idx < 0 {
		for i := range st.TapVMs {
			if st.TapVMs[i].Name == opts.VM {
				return migrateTapVM(ctx, st, i, opts, began)
			}
		}
		return nil, fmt.Errorf("lab vm migrate: no VM %q in the lab (lab up --vm)", opts.VM)
	}
	src := st.VMs[idx]
	to, err := migrationTarget(st, src, opts.To)
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { progress(opts.Out, format, args...) }
	rep = &MigrationReport{VM: src.Name, Path: "fast-lane", From: src.Node, To: to, IP: src.IP, IP6: src.IP6, MAC: src.MAC,
		PingInterval: opts.PingInterval, FramePoll: framePoll}

	dst, args, err := prepareTarget(ctx, src, to, rep, opts)
	if err != nil {
		return nil, err
	}
	// Until the switch-over, a failure removes the target's side and leaves
	// the guest running on the source.
	switched := false
	defer func() {
		if err != nil && !switched {
			cleanupMigrationSide(context.Background(), dst)
		}
	}()
	migSock := vmFile(to, src.Name, "migrate.sock")
	dq, sq, err := startIncoming(ctx, &dst, src, migSock, args)
	if err != nil {
		return nil, err
	}
	defer dq.Close()
	defer sq.Close()

	// Traffic: a pinger on every node, one held TCP connection.
	tr, err := startTraffic(st, KindLanekit, src.IP, opts.PingInterval)
	if err != nil {
		return rep, fmt.Errorf("lab vm migrate: %w", err)
	}
	defer tr.stop(rep)
	var tr6 *traffic
	if src.IP6 != "" {
		if tr6, err = startTraffic(st, KindLanekit, src.IP6, opts.PingInterval); err != nil {
			return rep, fmt.Errorf("lab vm migrate: IPv6: %w", err)
		}
		defer tr6.stop6(rep)
	}
	srcFrames := watchFrames(ctx, src.MetricsSocket, framePoll)
	dstFrames := watchFrames(ctx, dst.MetricsSocket, framePoll)
	defer srcFrames.stop()
	defer dstFrames.stop()
	time.Sleep(500 * time.Millisecond) // traffic before the migration

	say("lab: vm %s: migrating node %d -> node %d (QEMU over %s)", src.Name, src.Node, to, migSock)
	sw, err := awaitResume(ctx, dq, sq, migSock, vmFile(to, src.Name, "qemu.log"))
	if err != nil {
		return rep, err
	}
	switched = true
	say("lab: vm %s: resumed on node %d; reporting the migration state to its agent", src.Name, to)
	if err := activateTarget(ctx, st, src.Name, to, sw.resumedAt, rep); err != nil {
		return rep, err
	}
	say("lab: vm %s: endpoint active on node %d, claims published to every node", src.Name, to)
	info, err := sw.wait()
	if err != nil {
		return rep, err
	}
	rep.QEMUTotal, rep.QEMUDowntime = time.Duration(info.TotalTime)*time.Millisecond, time.Duration(info.Downtime)*time.Millisecond
	say("lab: vm %s runs on node %d (QEMU: total %s, downtime %s); removing the source side", src.Name, to, rep.QEMUTotal, rep.QEMUDowntime)

	// The source's pod goes: QEMU, backend, endpoint, netns.
	sq.call(ctx, "quit", nil)
	cleanupMigrationSide(ctx, src)
	st.VMs[idx] = dst
	if err := st.save(); err != nil {
		return rep, err
	}

	time.Sleep(time.Second) // traffic after the switch
	srcFrames.stop()
	dstFrames.stop()
	if !srcFrames.last.IsZero() && !dstFrames.first.IsZero() {
		rep.SwitchOver = dstFrames.first.Sub(srcFrames.last)
	}
	err = tr.stop(rep)
	if tr6 != nil {
		err = errors.Join(err, tr6.stop6(rep))
	}
	rep.Total = time.Since(began)
	select {
	case m := <-sw.shutdown:
		err = errors.Join(fmt.Errorf("the guest's QEMU on node %d ended after the switch: SHUTDOWN %s; its console's last lines: %s",
			to, m.Data, nsexec.LogTail(vmConsoleLog(dst), 25)), err)
	default:
		if !nsexec.Alive(dst.QEMUPID) {
			err = errors.Join(fmt.Errorf("the guest's QEMU on node %d is gone", to), err)
		}
	}
	if err != nil {
		return rep, fmt.Errorf("lab vm migrate: %w", err)
	}
	return rep, nil
}

// migrationTarget is the node a VM on src.Node migrates to: want, or (0)
// node 1, or node 2 when the VM is on node 1.
func migrationTarget(st *State, src LabVM, want int) (int, error) {
	to := want
	if to == 0 {
		to = 1
		if src.Node == 1 {
			to = 2
		}
	}
	if to == src.Node || to < 1 || to > len(st.Nodes) {
		return 0, fmt.Errorf("lab vm migrate: target node %d: want another of nodes 1-%d (the VM is on %d)", to, len(st.Nodes), src.Node)
	}
	return to, nil
}

// prepareTarget makes the fast-lane VM src's side on node to (what
// KubeVirt's target launcher pod holds): a free VM netns, the incoming
// (inactive) endpoint from the agent, the backend on its sockets; it
// returns the target's LabVM and the target QEMU's command line. On an
// error nothing of the target's side is left. It fills rep's endpoint IDs
// and the claim's generation.
func prepareTarget(ctx context.Context, src LabVM, to int, rep *MigrationReport, opts MigrateOptions) (dst LabVM, args []string, err error) {
	srcVM, err := findAgentVM(ctx, AgentSocket(src.Node), src.Name)
	if err != nil {
		return dst, nil, fmt.Errorf("lab vm migrate: source: %w", err)
	}
	rep.SourceID = srcVM.GetEndpoint().GetId()
	var gwMAC string
	if ifs := srcVM.GetEndpoint().GetInterfaces(); len(ifs) > 0 {
		gwMAC = ifs[0].GetMac()
	}
	// The claim's generation: the migration's start (what the k8s path takes
	// from the VMI's migrationState).
	rep.Generation = uint64(time.Now().UnixNano())

	// The target's first free VM netns (the dual-stack lab has a VM on
	// each node).
	vmIdx := 1
	for netnsExists(VMNS(to, vmIdx)) && vmIdx < 16 {
		vmIdx++
	}
	dst = LabVM{Name: src.Name, Node: to, NS: VMNS(to, vmIdx), IP: src.IP, IP6: src.IP6, MAC: src.MAC, Queues: src.Queues, MTU: src.MTU,
		VhostSocket:   filepath.Join(vmBackendDir(to, src.Name), "vhost.sock"),
		MetricsSocket: filepath.Join(vmBackendDir(to, src.Name), "metrics.sock"), SerialSocket: vmFile(to, src.Name, "serial.sock")}
	if netnsExists(dst.NS) {
		return dst, nil, fmt.Errorf("lab vm migrate: netns %s exists (node %d has no free VM netns)", dst.NS, to)
	}
	if err := addNetns(ctx, dst.NS); err != nil {
		return dst, nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	defer func() {
		if err != nil {
			cleanupMigrationSide(context.Background(), dst)
		}
	}()
	owner := uint32(backendUser)
	resp, err := withAgent(ctx, AgentSocket(to), func(ctx context.Context, c apiv1.AgentClient) (*apiv1.AddVMResponse, error) {
		return c.AddVM(ctx, &apiv1.AddVMRequest{Name: src.Name, Netns: netnsPath(dst.NS), Queues: uint32(src.Queues),
			Mac: src.MAC, Mtu: uint32(src.MTU), Labels: srcVM.GetEndpoint().GetLabels(), SocketUid: &owner, SocketGid: &owner,
			Address: src.IP, Address6: src.IP6, Incoming: true, Generation: rep.Generation, GatewayMac: gwMAC})
	})
	if err != nil {
		return dst, nil, fmt.Errorf("lab vm migrate: incoming endpoint on node %d: %w", to, err)
	}
	dst.XSKSocket = resp.GetVm().GetSocket()
	rep.TargetID = resp.GetVm().GetEndpoint().GetId()
	progress(opts.Out, "lab: vm %s: incoming endpoint %d on node %d (%s, inactive)", src.Name, rep.TargetID, to, resp.GetVm().GetMigrationState())

	vhostBin := filepath.Join(opts.Bins.Dir, "lanekit-vhost")
	if !executable(vhostBin) {
		return dst, nil, fmt.Errorf("lab vm migrate: %s missing (make build)", vhostBin)
	}
	if dst.BackendPID, err = startVMBackend(dst, vhostBin); err != nil {
		return dst, nil, fmt.Errorf("lab vm migrate: target %w", err)
	}
	kernel, initrd, err := guest.EnsureImage(GuestCacheDir)
	if err != nil {
		return dst, nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	gc := guest.Config{Kernel: kernel, Initrd: initrd, MTU: src.MTU, IP: src.IP + "/32", Gateway: "169.254.1.1", MAC: src.MAC,
		Queues: src.Queues, VhostSocket: dst.VhostSocket, SerialSocket: dst.SerialSocket, SerialLog: vmConsoleLog(dst)}
	guestIPv6(&gc, dst) // vm6.go
	if args, err = guest.QEMUArgs(gc); err != nil {
		return dst, nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	return dst, args, nil
}

// switchOver is a migration whose guest runs on the target: when it
// resumed there, QEMU's own end of the migration (wait), and the target
// QEMU's SHUTDOWN event should the guest end after the switch.
type switchOver struct {
	resumedAt time.Time
	migrated  chan error
	info      *migrationInfo
	done      bool // migrated already read
	shutdown  chan qmpMsg
}

// awaitResume starts QEMU's migration of the source (sq) into the target
// (dq, listening on migSock) and returns once the guest resumed on the
// target.
func awaitResume(ctx context.Context, dq, sq *qmp, migSock, targetLog string) (*switchOver, error) {
	if _, err := sq.call(ctx, "migrate", map[string]any{"uri": "unix:" + migSock}); err != nil {
		return nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	sw := &switchOver{migrated: make(chan error, 1), info: &migrationInfo{}, shutdown: make(chan qmpMsg, 1)}
	resumed := make(chan error, 1)
	go func() {
		m, err := dq.waitEvent(ctx, "RESUME")
		sw.resumedAt = m.time()
		resumed <- err
	}()
	go func() {
		info, err := sq.waitMigrated(ctx)
		*sw.info = info
		sw.migrated <- err
	}()
	select {
	case err := <-resumed:
		if err != nil {
			return nil, fmt.Errorf("lab vm migrate: target qemu: %w; log: %s", err, logTail(targetLog))
		}
	case err := <-sw.migrated:
		sw.done = true
		if err != nil {
			return nil, fmt.Errorf("lab vm migrate: %w", err)
		}
		if err := <-resumed; err != nil {
			return nil, fmt.Errorf("lab vm migrate: target qemu: %w", err)
		}
	}
	// A target QEMU that ends after the switch (the guest reset or shut
	// down: -no-reboot) says why in its SHUTDOWN event.
	go func() {
		if m, err := dq.waitEvent(ctx, "SHUTDOWN"); err == nil {
			sw.shutdown <- m
		}
	}()
	return sw, nil
}

// wait returns QEMU's numbers once the source reports the migration done.
func (sw *switchOver) wait() (migrationInfo, error) {
	if !sw.done {
		sw.done = true
		if err := <-sw.migrated; err != nil {
			return migrationInfo{}, fmt.Errorf("lab vm migrate: %w", err)
		}
	}
	return *sw.info, nil
}

// activateTarget reports the migration's end to the target's agent (which
// then claims the VM's address) and publishes every node's claims to every
// agent, timing both from the guest's resume.
func activateTarget(ctx context.Context, st *State, vm string, to int, resumedAt time.Time, rep *MigrationReport) error {
	mresp, err := withAgent(ctx, AgentSocket(to), func(ctx context.Context, c apiv1.AgentClient) (*apiv1.VMMigrationChangedResponse, error) {
		return c.VMMigrationChanged(ctx, &apiv1.VMMigrationChangedRequest{Name: vm, Role: "target", Phase: "completed"})
	})
	if err != nil {
		return fmt.Errorf("lab vm migrate: activate on node %d: %w", to, err)
	}
	rep.ResumedToActivated = time.Since(resumedAt)
	rep.ActivatedBy = mresp.GetVm().GetActivatedBy()
	if _, err := PublishEndpointRoutes(ctx, st); err != nil {
		return fmt.Errorf("lab vm migrate: %w", err)
	}
	rep.ResumedToRouted = time.Since(resumedAt)
	return nil
}

// cleanupMigrationSide stops lv's QEMU and backend, removes its endpoint
// from its node's agent and its netns and files.
func cleanupMigrationSide(ctx context.Context, lv LabVM) {
	for _, what := range []string{"qemu", "vhost"} {
		base := vmFile(lv.Node, lv.Name, what)
		if pid := nsexec.ReadPIDFile(base + ".pid"); pid > 0 && inLabNetns(pid) {
			nsexec.Terminate(pid, 3*time.Second)
		}
		os.Remove(base + ".pid")
	}
	withAgent(ctx, AgentSocket(lv.Node), func(ctx context.Context, c apiv1.AgentClient) (*apiv1.DelVMResponse, error) {
		return c.DelVM(ctx, &apiv1.DelVMRequest{Name: lv.Name})
	})
	if netnsExists(lv.NS) {
		ip(ctx, "netns", "del", lv.NS)
	}
	os.RemoveAll(vmBackendDir(lv.Node, lv.Name))
	for _, f := range []string{"serial.sock", "qmp.sock", "migrate.sock"} {
		os.Remove(vmFile(lv.Node, lv.Name, f))
	}
}

// PublishEndpointRoutes collects every agent's claims of moved VM addresses
// (active VMs with a generation, from ListVMs) and hands the full set to
// every agent. It returns the VMs each node's agent superseded.
func PublishEndpointRoutes(ctx context.Context, st *State) (map[int][]string, error) {
	var routes []*apiv1.EndpointRoute
	for _, n := range st.Nodes {
		resp, err := withAgent(ctx, AgentSocket(n.Index), func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ListVMsResponse, error) {
			return c.ListVMs(ctx, &apiv1.ListVMsRequest{})
		})
		if err != nil {
			return nil, fmt.Errorf("claims of node %d: %w", n.Index, err)
		}
		for _, v := range resp.GetVms() {
			if v.GetMigrationState() != "active" || v.GetGeneration() == 0 {
				continue
			}
			p, err := netip.ParsePrefix(v.GetAddress())
			if err != nil {
				return nil, fmt.Errorf("claims of node %d: vm %s address %q: %w", n.Index, v.GetName(), v.GetAddress(), err)
			}
			routes = append(routes, &apiv1.EndpointRoute{Address: p.Addr().String(), Via: n.UnderlayIP,
				Generation: v.GetGeneration(), Vm: v.GetName(), Node: NodeNS(n.Index)})
			// A dual-stack VM's IPv6 address: the same claim via the
			// node's IPv6 underlay address.
			for _, ipc := range v.GetEndpoint().GetIps() {
				if p6, err := netip.ParsePrefix(ipc.GetAddress()); err == nil && p6.Addr().Is6() && n.UnderlayIP6 != "" {
					routes = append(routes, &apiv1.EndpointRoute{Address: p6.Addr().String(), Via: n.UnderlayIP6,
						Generation: v.GetGeneration(), Vm: v.GetName(), Node: NodeNS(n.Index)})
				}
			}
		}
	}
	out := map[int][]string{}
	var errs []error
	for _, n := range st.Nodes {
		resp, err := withAgent(ctx, AgentSocket(n.Index), func(ctx context.Context, c apiv1.AgentClient) (*apiv1.SyncEndpointRoutesResponse, error) {
			return c.SyncEndpointRoutes(ctx, &apiv1.SyncEndpointRoutesRequest{Routes: routes})
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoint routes on node %d: %w", n.Index, err))
			continue
		}
		out[n.Index] = resp.GetSuperseded()
	}
	return out, errors.Join(errs...)
}

// findAgentVM returns VM name from an agent's ListVMs.
func findAgentVM(ctx context.Context, sock, name string) (*apiv1.VM, error) {
	resp, err := withAgent(ctx, sock, func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ListVMsResponse, error) {
		return c.ListVMs(ctx, &apiv1.ListVMsRequest{})
	})
	if err != nil {
		return nil, err
	}
	for _, v := range resp.GetVms() {
		if v.GetName() == name {
			return v, nil
		}
	}
	return nil, fmt.Errorf("agent %s has no vm %s", sock, name)
}

// withAgent calls fn with a client of the agent at sock.
func withAgent[T any](ctx context.Context, sock string, fn func(context.Context, apiv1.AgentClient) (T, error)) (T, error) {
	var zero T
	c, closeFn, err := agentClient(sock)
	if err != nil {
		return zero, err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return fn(cctx, c)
}

// traffic is what runs across a migration: a pinger in the first pod of a
// kind on every node, and a TCP connection from the first of them.
type traffic struct {
	pingers []*pinger
	tcp     *tcpProbe
	tcpFrom string
	stopped bool
}

func startTraffic(st *State, kind, dst string, interval time.Duration) (_ *traffic, err error) {
	tr := &traffic{}
	defer func() {
		if err != nil {
			tr.stop(&MigrationReport{})
		}
	}()
	pods := st.PodsOf(kind)
	for _, n := range st.Nodes {
		for _, p := range pods {
			if !strings.HasPrefix(p.NS, fmt.Sprintf("lk-n%d-", n.Index)) {
				continue
			}
			id := uint16(0x4c00 + n.Index)
			if strings.Contains(dst, ":") {
				id += 0x60
			}
			pg, err := startPinger(p.NS, dst, interval, id)
			if err != nil {
				return tr, err
			}
			tr.pingers = append(tr.pingers, pg)
			if tr.tcpFrom == "" {
				tr.tcpFrom = p.NS
			}
			break
		}
	}
	if tr.tcpFrom == "" {
		return tr, fmt.Errorf("the lab has no %s pods to ping from (lab up --pods-per-node >= 1)", kind)
	}
	if tr.tcp, err = startTCPProbe(tr.tcpFrom, dst, 50*time.Millisecond); err != nil {
		return tr, err
	}
	return tr, nil
}

// stop ends the traffic once and puts what it saw in rep; an error says
// the TCP connection broke.
func (tr *traffic) stop(rep *MigrationReport) error {
	if tr.stopped {
		return nil
	}
	tr.stopped = true
	var errs []error
	if tr.tcp != nil {
		rep.TCP = tr.tcp.stop(tr.tcpFrom)
		if rep.TCP.Error != "" {
			errs = append(errs, fmt.Errorf("the TCP connection from %s broke: %s", tr.tcpFrom, rep.TCP.Error))
		}
	}
	for _, p := range tr.pingers {
		ps, err := p.stop()
		if err != nil {
			errs = append(errs, err)
		}
		rep.Pings = append(rep.Pings, ps)
	}
	return errors.Join(errs...)
}

// stop6 is stop for the IPv6 traffic: rep.Pings6 and rep.TCP6.
func (tr *traffic) stop6(rep *MigrationReport) error {
	if tr.stopped {
		return nil
	}
	var r MigrationReport
	err := tr.stop(&r)
	if tr.tcp != nil || len(tr.pingers) > 0 {
		rep.Pings6, rep.TCP6 = r.Pings, &r.TCP
	}
	return err
}

// migrateTapVM live-migrates vm-std (QEMU's virtio-net on a tap on the
// baseline bridge) to node opts.To's bridge: what KubeVirt's bridge binding
// would do if it allowed migration. Nothing moves its address: the guest
// keeps the source bridge's subnet and gateway, which do not exist on the
// target, so its pings and TCP connection end at the switch-over. The
// report says so; only a QEMU failure is an error.
func migrateTapVM(ctx context.Context, st *State, idx int, opts MigrateOptions, began time.Time) (*MigrationReport, error) {
	src := st.TapVMs[idx]
	to, err := migrationTarget(st, src, opts.To)
	if err != nil {
		return nil, err
	}
	rep := &MigrationReport{VM: src.Name, Path: "bridge-tap", From: src.Node, To: to, IP: src.IP, MAC: src.MAC,
		PingInterval: opts.PingInterval}
	gw, plen, err := bridgeAddr(ctx, NodeNS(src.Node), BaseBridge)
	if err != nil {
		return nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	kernel, initrd, err := guest.EnsureImage(GuestCacheDir)
	if err != nil {
		return nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	dst := LabVM{Name: src.Name, Node: to, NS: NodeNS(to), IP: src.IP, MAC: src.MAC, Queues: 1, MTU: src.MTU,
		SerialSocket: vmFile(to, src.Name, "serial.sock")}
	if err := addTapDev(ctx, dst.NS, strconv.Itoa(src.MTU)); err != nil {
		return nil, fmt.Errorf("lab vm migrate: node %d: %w", to, err)
	}
	switched := false
	defer func() {
		if !switched {
			removeTapSide(dst)
		}
	}()
	args, err := guest.QEMUArgs(guest.Config{Kernel: kernel, Initrd: initrd, IP: fmt.Sprintf("%s/%d", src.IP, plen),
		Gateway: gw, MAC: src.MAC, Tap: TapVMDev, SerialSocket: dst.SerialSocket, SerialLog: vmConsoleLog(dst), MTU: src.MTU})
	if err != nil {
		return nil, fmt.Errorf("lab vm migrate: %w", err)
	}
	migSock := vmFile(to, src.Name, "migrate.sock")
	dq, sq, err := startIncoming(ctx, &dst, src, migSock, args)
	if err != nil {
		return nil, err
	}
	defer dq.Close()
	defer sq.Close()
	tr, err := startTraffic(st, KindBaseline, src.IP, opts.PingInterval)
	if err != nil {
		return rep, fmt.Errorf("lab vm migrate: %w", err)
	}
	defer tr.stop(rep)
	time.Sleep(500 * time.Millisecond)
	progress(opts.Out, "lab: vm %s: migrating node %d -> node %d on the bridge+tap path (the address does not follow)", src.Name, src.Node, to)
	if _, err := sq.call(ctx, "migrate", map[string]any{"uri": "unix:" + migSock}); err != nil {
		return rep, fmt.Errorf("lab vm migrate: %w", err)
	}
	info, err := sq.waitMigrated(ctx)
	if err != nil {
		return rep, fmt.Errorf("lab vm migrate: %w", err)
	}
	if _, err := dq.waitEvent(ctx, "RESUME"); err != nil {
		return rep, fmt.Errorf("lab vm migrate: target qemu: %w", err)
	}
	switched = true
	rep.QEMUTotal, rep.QEMUDowntime = time.Duration(info.TotalTime)*time.Millisecond, time.Duration(info.Downtime)*time.Millisecond
	sq.call(ctx, "quit", nil)
	removeTapSide(src)
	st.TapVMs[idx] = dst
	if err := st.save(); err != nil {
		return rep, err
	}
	time.Sleep(time.Second)
	// The TCP connection is expected to break here: reported, not an error.
	tr.stop(rep)
	rep.Total = time.Since(began)
	return rep, nil
}

// removeTapSide stops lv's QEMU and removes its tap and files.
func removeTapSide(lv LabVM) {
	base := vmFile(lv.Node, lv.Name, "qemu")
	if pid := nsexec.ReadPIDFile(base + ".pid"); pid > 0 && inLabNetns(pid) {
		nsexec.Terminate(pid, 3*time.Second)
	}
	os.Remove(base + ".pid")
	ip(context.Background(), "-n", lv.NS, "link", "del", TapVMDev)
	for _, f := range []string{"serial.sock", "qmp.sock", "migrate.sock"} {
		os.Remove(vmFile(lv.Node, lv.Name, f))
	}
}

// startIncoming starts the target QEMU of a migration of src to dst's node,
// in dst's namespace (args: src's command line, its console no longer
// waiting for a client; QMP and -incoming migSock on the target's own
// sockets) and connects to both QEMUs' QMP. The caller closes both.
func startIncoming(ctx context.Context, dst *LabVM, src LabVM, migSock string, args []string) (dq, sq *qmp, err error) {
	to := dst.Node
	os.Remove(migSock)
	for i, a := range args { // nobody waits on the target's console before it runs
		args[i] = strings.Replace(a, ",server=on,wait=on", ",server=on,wait=off", 1)
	}
	args = append(args, "-qmp", "unix:"+vmQMPSocket(to, src.Name)+",server=on,wait=off", "-incoming", "unix:"+migSock)
	if dst.QEMUPID, err = startDaemon(dst.NS, vmFile(to, src.Name, "qemu"), args[0], args[1:]...); err != nil {
		return nil, nil, fmt.Errorf("lab vm migrate: target qemu: %w", err)
	}
	if dq, err = dialQMP(ctx, vmQMPSocket(to, src.Name)); err != nil {
		return nil, nil, fmt.Errorf("lab vm migrate: target qemu: %w; log: %s", err, logTail(vmFile(to, src.Name, "qemu.log")))
	}
	if sq, err = dialQMP(ctx, vmQMPSocket(src.Node, src.Name)); err != nil {
		dq.Close()
		return nil, nil, fmt.Errorf("lab vm migrate: source qemu (a lab from before `lab vm migrate` has no QMP socket: lab up again): %w", err)
	}
	return dq, sq, nil
}
