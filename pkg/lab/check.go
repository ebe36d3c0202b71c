package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lanekit/lanekit/pkg/bench"
)

// endpoint is a netns with the address others reach it on.
type endpoint struct {
	Name string // short label
	NS   string
	IP   string
}

// probe is one source→target result.
type probe struct {
	icmp, tcp error
}

// checkGroup is a set of sources that must reach a set of targets.
type checkGroup struct {
	title   string
	sources []endpoint
	targets []endpoint
	vms     map[string]LabVM // sources that are guests: probed through their console
	port    int              // echo port: 0 is EchoPort on 0.0.0.0; EchoPort6 on [::] (check6.go)
}

// vmNS is the pseudo netns name of a guest in check groups.
func vmNS(name string) string { return "vm:" + name }

// Check proves the connectivity matrix: every pod reaches every other pod of
// its kind and every node's underlay IP, by ICMP and by a TCP echo. It
// prints one matrix per kind and returns an error if any probe failed.
func Check(ctx context.Context, b Bins, w io.Writer) error {
	st, err := LoadState()
	if err != nil {
		return fmt.Errorf("lab check: %w", err)
	}
	var nodes []endpoint
	for _, n := range st.Nodes {
		nodes = append(nodes, endpoint{Name: n.NS, NS: n.NS, IP: n.UnderlayIP})
	}
	// Fast-lane guests pair with lanekit pods, standard-path guests (tap on
	// the baseline bridge) with baseline pods.
	vmsOf := map[string][]endpoint{}
	vmByNS := map[string]LabVM{}
	for kind, list := range map[string][]LabVM{KindLanekit: st.VMs, KindBaseline: st.TapVMs} {
		for _, v := range list {
			vmsOf[kind] = append(vmsOf[kind], endpoint{Name: v.Name, NS: vmNS(v.Name), IP: v.IP})
			vmByNS[vmNS(v.Name)] = v
		}
	}
	var groups []checkGroup
	podsOf := map[string][]endpoint{}
	for _, kind := range []string{KindLanekit, KindBaseline} {
		var pods []endpoint
		for _, p := range st.PodsOf(kind) {
			if p.IP != "" { // none: a lanekit pod of an IPv6-only lab (check6.go)
				pods = append(pods, endpoint{Name: p.NS, NS: p.NS, IP: p.IP})
			}
		}
		if len(pods) == 0 {
			continue
		}
		podsOf[kind] = pods
		targets := append(append([]endpoint{}, pods...), nodes...)
		title := fmt.Sprintf("%s pods: ICMP + TCP echo to every other %s pod and every node underlay IP", kind, kind)
		if vms := vmsOf[kind]; len(vms) > 0 {
			targets = append(targets, vms...)
			title += fmt.Sprintf(" and every %s VM", kind)
		}
		groups = append(groups, checkGroup{title: title, sources: pods, targets: targets})
	}
	if all := append(append([]endpoint{}, vmsOf[KindLanekit]...), vmsOf[KindBaseline]...); len(all) > 0 {
		groups = append(groups, checkGroup{title: "nodes: ICMP + TCP echo to every VM", sources: nodes, targets: all})
	}
	for _, kind := range []string{KindLanekit, KindBaseline} {
		if vms := vmsOf[kind]; len(vms) > 0 {
			title := fmt.Sprintf("%s VMs (commands through the guest console): ICMP + TCP echo to every %s pod and every node", kind, kind)
			targets := append(append([]endpoint{}, podsOf[kind]...), nodes...)
			if len(vms) > 1 { // lab up --vms 2: VM to VM across nodes
				title += " and every other VM"
				targets = append(targets, vms...)
			}
			groups = append(groups, checkGroup{title: title, sources: vms, targets: targets, vms: vmByNS})
		}
	}
	groups = append(groups, ipv6CheckGroups(st)...) // dual-stack labs (check6.go)
	if len(groups) == 0 {
		return fmt.Errorf("lab check: the lab has no pods")
	}

	// One echo server per target netns.
	servers := map[string]*exec.Cmd{}
	defer func() {
		for _, cmd := range servers {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}()
	for _, g := range groups {
		for _, t := range g.targets {
			key := fmt.Sprintf("%s:%d", t.NS, g.port)
			if servers[key] != nil || vmByNS[t.NS].Name != "" {
				continue // guests serve the echo port themselves
			}
			cmd, err := startEchoOn(ctx, b, t.NS, g.port)
			if err != nil {
				return fmt.Errorf("lab check: %w", err)
			}
			servers[key] = cmd
		}
	}
	pingArgv := pingCommand()
	failed := 0
	for _, g := range groups {
		var res map[[2]string]*probe
		if g.vms != nil {
			res = probeFromVMs(ctx, g)
		} else {
			res = probeGroup(ctx, b, g, pingArgv)
		}
		failed += writeMatrix(w, g, res)
	}
	if failed > 0 {
		return fmt.Errorf("lab check: %d probes failed", failed)
	}
	fmt.Fprintln(w, "lab check: all probes passed")
	return nil
}

// startEcho starts `lanekit lab tcp-echo` in ns and waits until it listens.
func startEcho(ctx context.Context, b Bins, ns string) (*exec.Cmd, error) {
	return startEchoOn(ctx, b, ns, 0)
}

// startEchoOn is startEcho on a group's port (0: EchoPort on 0.0.0.0,
// EchoPort6 on [::]).
func startEchoOn(ctx context.Context, b Bins, ns string, port int) (*exec.Cmd, error) {
	host := "0.0.0.0"
	if port == 0 {
		port = EchoPort
	} else if port == EchoPort6 {
		host = "::"
	}
	cmd := nsCommand(context.WithoutCancel(ctx), ns, b.Self, "lab", "tcp-echo",
		"--listen", net.JoinHostPort(host, strconv.Itoa(port)), "--for", "3m")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start tcp echo in %s: %w", ns, err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if bench.Listening(cmd.Process.Pid, port) {
			return cmd, nil
		}
		if !alive(cmd.Process.Pid) {
			break
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	return nil, fmt.Errorf("tcp echo in %s not listening: %s", ns, strings.TrimSpace(out.String()))
}

// pingCommand is ping, or busybox's when iputils is absent.
func pingCommand() []string {
	if _, err := exec.LookPath("ping"); err == nil {
		return []string{"ping"}
	}
	return []string{"busybox", "ping"}
}

// probeGroup runs every ICMP and TCP probe of a group, bounded.
func probeGroup(ctx context.Context, b Bins, g checkGroup, pingArgv []string) map[[2]string]*probe {
	res := map[[2]string]*probe{}
	var mu sync.Mutex
	set := func(src, dst string, f func(*probe)) {
		mu.Lock()
		defer mu.Unlock()
		k := [2]string{src, dst}
		if res[k] == nil {
			res[k] = &probe{}
		}
		f(res[k])
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, s := range g.sources {
		var addrs []string
		for _, t := range g.targets {
			if t.NS == s.NS {
				continue
			}
			port := g.port
			if port == 0 {
				port = EchoPort
			}
			addrs = append(addrs, net.JoinHostPort(t.IP, strconv.Itoa(port)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				ping := append(append([]string{}, pingArgv...), "-c", "1", "-W", "2", t.IP)
				_, err := inNS(ctx, s.NS, ping...)
				if err != nil {
					// One echo lost while the probes run in parallel
					// (seen once for pod -> own node over IPv6, not
					// root-caused) is asked again once; a broken path
					// fails both.
					_, err = inNS(ctx, s.NS, ping...)
				}
				set(s.NS, t.NS, func(p *probe) { p.icmp = err })
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			args := append([]string{b.Self, "lab", "tcp-dial", "--timeout", "3s"}, addrs...)
			out, err := inNS(ctx, s.NS, args...)
			var results []DialResult
			if err == nil {
				results, err = ParseDialResults([]byte(out))
			}
			for i, t := range otherTargets(g.targets, s.NS) {
				terr := err
				if terr == nil && (i >= len(results) || !results[i].OK) {
					terr = fmt.Errorf("tcp echo failed")
					if i < len(results) {
						terr = fmt.Errorf("%s", results[i].Error)
					}
				}
				set(s.NS, t.NS, func(p *probe) { p.tcp = terr })
			}
		}()
	}
	wg.Wait()
	return res
}

func otherTargets(ts []endpoint, self string) []endpoint {
	var out []endpoint
	for _, t := range ts {
		if t.NS != self {
			out = append(out, t)
		}
	}
	return out
}

// writeMatrix prints sources × targets: "ok", "-" (self) or what failed.
// It returns the number of failed probes and lists their errors.
func writeMatrix(w io.Writer, g checkGroup, res map[[2]string]*probe) int {
	fmt.Fprintf(w, "\n%s\n", g.title)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprint(tw, "from \\ to\t")
	for _, t := range g.targets {
		fmt.Fprintf(tw, "%s\t", t.Name)
	}
	fmt.Fprintln(tw)
	fmt.Fprint(tw, "\t")
	for _, t := range g.targets {
		fmt.Fprintf(tw, "%s\t", t.IP)
	}
	fmt.Fprintln(tw)
	failed := 0
	var details []string
	for _, s := range g.sources {
		fmt.Fprintf(tw, "%s (%s)\t", s.Name, s.IP)
		for _, t := range g.targets {
			p := res[[2]string{s.NS, t.NS}]
			switch {
			case t.NS == s.NS:
				fmt.Fprint(tw, "-\t")
			case p == nil:
				fmt.Fprint(tw, "FAIL\t")
				failed++
			case p.icmp == nil && p.tcp == nil:
				fmt.Fprint(tw, "ok\t")
			default:
				var bad []string
				if p.icmp != nil {
					bad = append(bad, "icmp")
					details = append(details, fmt.Sprintf("%s -> %s icmp: %v", s.Name, t.Name, p.icmp))
					failed++
				}
				if p.tcp != nil {
					bad = append(bad, "tcp")
					details = append(details, fmt.Sprintf("%s -> %s tcp: %v", s.Name, t.Name, p.tcp))
					failed++
				}
				fmt.Fprintf(tw, "FAIL(%s)\t", strings.Join(bad, "+"))
			}
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	for _, d := range details {
		fmt.Fprintln(w, "  "+d)
	}
	return failed
}
