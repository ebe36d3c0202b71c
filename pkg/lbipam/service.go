package lbipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Ours reports whether lanekit serves svc's load balancer: type
// LoadBalancer with no class or lanekit's.
func Ours(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	c := svc.Spec.LoadBalancerClass
	return c == nil || *c == "" || *c == Class
}

// Assigned reports whether lanekit's IPAM wrote svc's ingress addresses
// (its condition is present).
func Assigned(svc *corev1.Service) bool {
	return meta.FindStatusCondition(svc.Status.Conditions, ConditionType) != nil
}

// IngressAddrs are the addresses in svc's status.loadBalancer.ingress.
func IngressAddrs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// wantOf is what svc asks of the allocator; a malformed request is an error.
func wantOf(svc *corev1.Service, nsLabels map[string]string) (Want, *Error) {
	w := Want{
		Key:      svc.Namespace + "/" + svc.Name,
		Created:  svc.CreationTimestamp.Time,
		Families: svc.Spec.IPFamilies,
		Subject:  Subject{Service: svc.Labels, Namespace: nsLabels},
	}
	if Assigned(svc) {
		w.Current = IngressAddrs(svc)
	}
	var req []string
	if v := strings.TrimSpace(svc.Annotations[AnnotationIPs]); v != "" {
		req = strings.Split(v, ",")
	} else if svc.Spec.LoadBalancerIP != "" {
		req = []string{svc.Spec.LoadBalancerIP}
	}
	for _, s := range req {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return w, &Error{ReasonInvalid, fmt.Sprintf("requested address %q (%s or spec.loadBalancerIP) is not an IP address", s, AnnotationIPs)}
		}
		if !slices.Contains(w.Requested, a) {
			w.Requested = append(w.Requested, a)
		}
	}
	return w, nil
}

// desiredStatus is svc's status with lanekit's assignment r: the ingress
// list (ipMode VIP) and the condition. ok false: nothing to change.
func desiredStatus(svc *corev1.Service, r Result) (corev1.ServiceStatus, bool) {
	st := *svc.Status.DeepCopy()
	vip := corev1.LoadBalancerIPModeVIP
	var ing []corev1.LoadBalancerIngress
	for _, a := range r.Addrs {
		ing = append(ing, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &vip})
	}
	st.LoadBalancer.Ingress = ing
	c := metav1.Condition{Type: ConditionType, Status: metav1.ConditionTrue, Reason: ReasonAssigned,
		Message: "assigned " + joinAddrs(r.Addrs), ObservedGeneration: svc.Generation}
	if r.Err != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, r.Err.Reason, r.Err.Msg
		if len(r.Addrs) > 0 {
			c.Message += " (assigned " + joinAddrs(r.Addrs) + ")"
		}
	}
	meta.SetStatusCondition(&st.Conditions, c)
	return st, !statusEqual(svc.Status, st)
}

// releasedStatus is the status of a Service lanekit no longer serves:
// lanekit's ingress addresses and condition removed.
func releasedStatus(svc *corev1.Service) corev1.ServiceStatus {
	st := *svc.Status.DeepCopy()
	st.LoadBalancer.Ingress = nil
	meta.RemoveStatusCondition(&st.Conditions, ConditionType)
	return st
}

func statusEqual(a, b corev1.ServiceStatus) bool {
	if len(a.LoadBalancer.Ingress) != len(b.LoadBalancer.Ingress) {
		return false
	}
	for i := range a.LoadBalancer.Ingress {
		x, y := a.LoadBalancer.Ingress[i], b.LoadBalancer.Ingress[i]
		if x.IP != y.IP || (x.IPMode == nil) != (y.IPMode == nil) || (x.IPMode != nil && *x.IPMode != *y.IPMode) || x.Hostname != y.Hostname {
			return false
		}
	}
	ca := meta.FindStatusCondition(a.Conditions, ConditionType)
	cb := meta.FindStatusCondition(b.Conditions, ConditionType)
	if (ca == nil) != (cb == nil) {
		return false
	}
	return ca == nil || (ca.Status == cb.Status && ca.Reason == cb.Reason && ca.Message == cb.Message && ca.ObservedGeneration == cb.ObservedGeneration)
}
