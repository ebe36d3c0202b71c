package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/service"
)

// ScaleFirstPacket is the probe Service's new connections with Services
// programmed: medians over the repetitions (Runs holds each).
type ScaleFirstPacket struct {
	Services     int               `json:"services"`
	ConnectP50Us float64           `json:"connect_p50_us"`
	ConnectP99Us float64           `json:"connect_p99_us"`
	CPS          float64           `json:"conns_per_s"`
	Runs         []bench.CPSResult `json:"runs"`
	// SettleS: how long the agents took to fall quiet before the runs
	// (settle); Load1: the machine's 1-minute load average then.
	SettleS float64 `json:"settle_s"`
	Load1   float64 `json:"load1"`
}

// describe is f's table cell, with its ratios to base (the first count).
func (f ScaleFirstPacket) describe(base ScaleFirstPacket) string {
	s := fmt.Sprintf("connect p50 %.0f µs, p99 %.0f µs, %.0f conn/s (one loop; medians of %d runs; load %.1f)", f.ConnectP50Us, f.ConnectP99Us, f.CPS, len(f.Runs), f.Load1)
	if f.Services != base.Services && base.ConnectP50Us > 0 && base.CPS > 0 {
		s += fmt.Sprintf("; %.2f × the p50 and %.2f × the conn/s at %d", f.ConnectP50Us/base.ConnectP50Us, f.CPS/base.CPS, base.Services)
	}
	return s
}

// scaleProbeName is the probe Service (labelled as the scale objects, so
// that a run's cleanup deletes it).
const scaleProbeName = "lk-scale-probe"

// scaleProbe is the probe Service and the lab pods it measures between.
type scaleProbe struct {
	vip  string
	port int
	path bench.SvcPath
}

// scaleProbePort is a run's probe port: one of its own, so that no run's
// connections meet the previous run's TIME_WAIT sockets on the backends
// through another VIP (bench.ConnectProbe).
func scaleProbePort() int { return scaleProbePortBase + rand.IntN(scaleProbePortSpan) }

// The probe ports: below the ephemeral range (32768), above the lab's
// fixed server ports.
const (
	scaleProbePortBase = 20000
	scaleProbePortSpan = 10000
)

// newScaleProbe creates the probe Service (no selector) and its
// EndpointSlice: node 1's first lanekit pod connects, the last node's
// lanekit pods serve.
func newScaleProbe(ctx context.Context, c kubernetes.Interface, st *State) (*scaleProbe, error) {
	n1, n2 := st.Nodes[0], st.Nodes[len(st.Nodes)-1]
	client, ok := firstPod(n1, KindLanekit)
	backends := svcBackends(n2, KindLanekit)
	if !ok || len(backends) == 0 || len(st.Nodes) < 2 {
		return nil, errors.New("lab scale: --first-packet-at needs lanekit pods on two nodes (lab up --k8s --nodes 2 --pods-per-node 1)")
	}
	port := int32(scaleProbePort())
	svc, err := c.CoreV1().Services(ScaleNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: scaleProbeName, Namespace: ScaleNamespace, Labels: scaleLabels},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "cps", Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("lab scale: probe Service: %w", err)
	}
	if _, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil {
		return nil, fmt.Errorf("lab scale: probe Service has no ClusterIP (%q)", svc.Spec.ClusterIP)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: scaleProbeName + "-x", Namespace: ScaleNamespace,
			Labels: map[string]string{ScaleLabel: "1", discoveryv1.LabelServiceName: scaleProbeName, discoveryv1.LabelManagedBy: "lanekit-lab-scale"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("cps"), Port: &port, Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, b := range backends {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{b.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ScaleNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("lab scale: probe EndpointSlice: %w", err)
	}
	return &scaleProbe{vip: svc.Spec.ClusterIP, port: int(port), path: bench.SvcPath{Mode: bench.SvcModeLanekit, ClientNS: client.NS,
		Backends: backends, NodeNS: n1.NS, Includes: IncludesSvcLanekit}}, nil
}

// Before a probe the agents must be quiet: a probe while they still
// program the fill would measure their CPU beside the datapath.
const (
	settleCPUPct = 10.0 // of one CPU, each agent, over settleWindow
	settleWindow = time.Second
	settleMax    = 2 * time.Minute
)

// settle waits until every agent of nodes used under settleCPUPct over a
// settleWindow (at most settleMax; then it goes on, and says so).
func settle(ctx context.Context, nodes []int, out io.Writer) time.Duration {
	start := time.Now()
	for {
		var before []procSample
		for _, i := range nodes {
			s, _ := sampleProc(readPID(AgentPIDFile(i)))
			before = append(before, s)
		}
		select {
		case <-ctx.Done():
			return time.Since(start)
		case <-time.After(settleWindow):
		}
		quiet := true
		for k, i := range nodes {
			s, err := sampleProc(readPID(AgentPIDFile(i)))
			if err != nil || cpuPercent(before[k], s) >= settleCPUPct {
				quiet = false
			}
		}
		if quiet {
			return time.Since(start)
		}
		if time.Since(start) > settleMax {
			progress(out, "lab scale: the agents did not fall under %.0f %% CPU in %v; probing anyway", settleCPUPct, settleMax)
			return time.Since(start)
		}
	}
}

// measure runs the probe cfg.FirstPacketRepeat times with n Services.
func (p *scaleProbe) measure(ctx context.Context, cfg ScaleConfig, n int) (ScaleFirstPacket, error) {
	self := cfg.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return ScaleFirstPacket{}, err
		}
	}
	o := bench.Options{Self: self, Duration: cfg.FirstPacketFor}
	f := ScaleFirstPacket{Services: n, Load1: bench.LoadAvg1()}
	var p50, p99, cps []float64
	for rep := range cfg.FirstPacketRepeat {
		res, err := bench.ConnectProbe(ctx, o, p.path, p.vip, p.port)
		if err != nil {
			return f, fmt.Errorf("lab scale: first packet at %d Services, run %d: %w", n, rep+1, err)
		}
		f.Runs = append(f.Runs, res)
		p50, p99, cps = append(p50, res.ConnectP50Us), append(p99, res.ConnectP99Us), append(cps, res.CPS)
	}
	f.ConnectP50Us, f.ConnectP99Us, f.CPS = bench.Summarize(p50).Median, bench.Summarize(p99).Median, bench.Summarize(cps).Median
	return f, nil
}

// fillServices creates the scale Services in stages: at each
// FirstPacketAt count (and at the end) it waits until every agent holds
// them, then probes. It returns the frontends every agent holds at the end.
func (r *ScaleReport) fillServices(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig, st *State, nodes []int, baseFronts int) (int, error) {
	var probe *scaleProbe
	if len(cfg.FirstPacketAt) > 0 {
		var err error
		if probe, err = newScaleProbe(ctx, c, st); err != nil {
			return 0, err
		}
		baseFronts++
	}
	stages := cfg.FirstPacketAt
	if len(stages) == 0 || stages[len(stages)-1] != cfg.Services {
		stages = append(slices.Clone(stages), cfg.Services)
	}
	from := 0
	for _, to := range stages {
		t := time.Now()
		if err := createServices(ctx, c, cfg, from, to); err != nil {
			return 0, err
		}
		r.CreateServicesS += time.Since(t).Seconds()
		want := baseFronts + to
		d, err := waitAgents(ctx, nodes, 10*time.Minute, "services programmed", func(s *apiv1.StatusResponse) bool {
			return statusMapEntries(s, service.MapFrontends) >= want
		})
		if err != nil {
			return 0, err
		}
		r.ServicesS = d.Seconds() // the last stage's
		if probe != nil && slices.Contains(cfg.FirstPacketAt, to) {
			quiet := settle(ctx, nodes, cfg.Out)
			progress(cfg.Out, "lab scale: first packet at %d Services (%d × %v; agents quiet after %.1f s)", to, cfg.FirstPacketRepeat, cfg.FirstPacketFor, quiet.Seconds())
			f, err := probe.measure(ctx, cfg, to)
			if err != nil {
				return 0, err
			}
			f.SettleS = quiet.Seconds()
			progress(cfg.Out, "lab scale: %s", f.describe(append(r.FirstPacket, f)[0]))
			r.FirstPacket = append(r.FirstPacket, f)
		}
		from = to
	}
	return baseFronts + cfg.Services, nil
}
