package agent

// Per-pod bandwidth limits (issue 42 item 2): the annotations kubelet's
// bandwidth plugin reads, kubernetes.io/egress-bandwidth and
// kubernetes.io/ingress-bandwidth (Kubernetes quantities in bits per second),
// taken from the pod's Pod object. Egress is enforced in BPF by Earliest
// Departure Time (bpf/lib/edt.h) with fq on the uplink pacing, as Cilium's
// bandwidth manager does; ingress is not (nor in Cilium): a pod that asks
// for it runs unlimited and the agent says so.

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev"
)

const (
	AnnotationEgressBandwidth  = "kubernetes.io/egress-bandwidth"
	AnnotationIngressBandwidth = "kubernetes.io/ingress-bandwidth"
)

// The rates kubelet's bandwidth shaping accepts (1 kbit/s to 1 Pbit/s).
var (
	minBandwidth = resource.MustParse("1k")
	maxBandwidth = resource.MustParse("1P")
)

// egressLimiter is a datapath that enforces egress rates (*datapath.Loader).
type egressLimiter interface {
	SetEgressRate(id uint32, bitsPerSec uint64) error
	EgressRates() (map[uint32]uint64, error)
}

// bandwidthOf reads a pod's bandwidth annotations: its egress limit in bits
// per second (0: none) and what the agent does not enforce, and why.
func bandwidthOf(pod *k8sobj.Pod, enabled bool) (egress uint64, note string) {
	var notes []string
	if v, ok := pod.Annotations[AnnotationEgressBandwidth]; ok {
		q, err := resource.ParseQuantity(v)
		switch {
		case !enabled:
			notes = append(notes, fmt.Sprintf("%s %q: not enforced (lanekitd --bandwidth-manager=false)", AnnotationEgressBandwidth, v))
		case err != nil:
			notes = append(notes, fmt.Sprintf("%s %q is not a quantity (%v): not limited", AnnotationEgressBandwidth, v, err))
		case q.Cmp(minBandwidth) < 0 || q.Cmp(maxBandwidth) > 0:
			notes = append(notes, fmt.Sprintf("%s %q is outside 1k..1P bit/s: not limited", AnnotationEgressBandwidth, v))
		default:
			egress = uint64(q.Value())
		}
	}
	if v, ok := pod.Annotations[AnnotationIngressBandwidth]; ok {
		notes = append(notes, fmt.Sprintf("%s %q: not enforced (lanekit limits egress only, as Cilium's bandwidth manager)", AnnotationIngressBandwidth, v))
	}
	return egress, strings.Join(notes, "; ")
}

// How the agent enforces egress limits (Status' routing part says which).
const (
	bandwidthOff = "off"
	bandwidthEDT = "edt" // BPF departure times, fq on the uplink paces
	bandwidthTBF = "tbf" // a tbf qdisc on the pod's device (no fq in this kernel)
)

// setupBandwidth chooses how egress limits are enforced: EDT in BPF with fq
// on the uplink, as Cilium does, where the kernel has fq; otherwise a tbf
// qdisc on each limited pod's own device (the CNI bandwidth plugin's way).
func (a *Agent) setupBandwidth() {
	switch {
	case !a.cfg.BandwidthManager:
		a.bandwidth, a.bandwidthWhy = bandwidthOff, "lanekitd --bandwidth-manager=false"
		return
	}
	if _, ok := a.dp.(egressLimiter); ok && a.cfg.Uplink != "" {
		fq := netdev.ProbeFQ()
		if fq.Supported {
			a.bandwidth, a.bandwidthWhy = bandwidthEDT, "EDT in BPF, fq on "+a.cfg.Uplink
			return
		}
		a.bandwidth, a.bandwidthWhy = bandwidthTBF, "tbf on the pod's device: the kernel has no "+fq.Detail
		return
	}
	a.bandwidth, a.bandwidthWhy = bandwidthTBF, "tbf on the pod's device"
}

// applyBandwidth brings the egress limits in place to those of locals:
// changed ones written, those of gone endpoints or lifted limits removed
// (EDT: fq installed on the uplink before the first limit). A new note is
// logged once. Called with ctl.mu.
func (a *Agent) applyBandwidth(old, locals map[uint32]localEndpoint) error {
	for id, l := range locals {
		if l.BandwidthNote != "" && old[id].BandwidthNote != l.BandwidthNote {
			a.log.Warn("pod bandwidth", "pod", l.Namespace+"/"+l.Name, "endpoint", id, "problem", l.BandwidthNote)
		}
	}
	if a.bandwidth == bandwidthOff || a.bandwidth == "" {
		return nil
	}
	c := a.ctl
	set, first := a.egressSetter(), c.egress == nil
	if first {
		c.egress = map[uint32]uint64{}
		if lim, ok := a.dp.(egressLimiter); ok && a.bandwidth == bandwidthEDT {
			cur, err := lim.EgressRates() // after a restart: what the pinned map holds
			if err != nil {
				return err
			}
			c.egress = cur
		}
	}
	var errs []error
	for id, l := range locals {
		cur, known := c.egress[id]
		// A restarted agent does not know what tbf a pod device has: it
		// writes every endpoint's state once.
		if cur == l.EgressBPS && (known || !first || a.bandwidth == bandwidthEDT) {
			continue
		}
		if err := set(id, l.EgressBPS); err != nil {
			errs = append(errs, err)
			continue
		}
		if l.EgressBPS != cur {
			a.log.Info("pod egress limit", "pod", l.Namespace+"/"+l.Name, "endpoint", id, "bits_per_sec", l.EgressBPS, "by", a.bandwidth)
		}
		c.egress[id] = l.EgressBPS
		if l.EgressBPS == 0 {
			delete(c.egress, id)
		}
	}
	for id := range c.egress {
		if _, ok := locals[id]; ok {
			continue
		}
		if err := set(id, 0); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(c.egress, id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("bandwidth: %v", errs)
	}
	return nil
}

// egressSetter returns how one endpoint's limit is set in the chosen mode
// (one apply's: the tbf setter reads the stored endpoints once).
func (a *Agent) egressSetter() func(id uint32, bps uint64) error {
	if a.bandwidth == bandwidthEDT {
		lim := a.dp.(egressLimiter)
		return func(id uint32, bps uint64) error {
			if bps > 0 {
				if err := a.ensureFQ(); err != nil {
					return err
				}
			}
			return lim.SetEgressRate(id, bps)
		}
	}
	var byID map[uint32]endpoint.Endpoint
	return func(id uint32, bps uint64) error {
		if byID == nil {
			eps, err := a.endpoints()
			if err != nil {
				return err
			}
			byID = make(map[uint32]endpoint.Endpoint, len(eps))
			for _, ep := range eps {
				byID[ep.ID] = ep
			}
		}
		ep, ok := byID[id]
		if !ok {
			return nil // gone: its device went with it
		}
		return netdev.SetPodEgressTBF(ep.Netns, ep.IfName, bps)
	}
}

// ensureFQ installs fq on the uplink (netdev.EnsureFQ) once.
func (a *Agent) ensureFQ() error {
	if a.ctl.fqOn {
		return nil
	}
	changed, err := a.host.EnsureFQ(a.cfg.Uplink)
	if err != nil {
		return err
	}
	if changed {
		a.log.Info("fq qdisc installed on the uplink: it paces pods' egress limits", "uplink", a.cfg.Uplink)
	}
	a.ctl.fqOn = true
	return nil
}
