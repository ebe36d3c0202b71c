package k8sobj

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// LoadBalancerSourceRanges returns the source ranges a LoadBalancer Service
// admits on its ingress IPs: spec.loadBalancerSourceRanges, else the
// service.beta.kubernetes.io/load-balancer-source-ranges annotation (a
// comma-separated list), as the API server validates them and cloud
// providers read them (each entry trimmed of white space; host bits
// masked). None (nil): every source. An entry that is not a CIDR is an
// error naming the field, as validation reports it.
func LoadBalancerSourceRanges(s *Service) ([]netip.Prefix, field.ErrorList) {
	var (
		vals []string
		path func(i int) *field.Path
	)
	if len(s.Spec.LoadBalancerSourceRanges) > 0 {
		vals = s.Spec.LoadBalancerSourceRanges
		path = func(i int) *field.Path { return field.NewPath("spec", "loadBalancerSourceRanges").Index(i) }
	} else if a := strings.TrimSpace(s.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]); a != "" {
		vals = strings.Split(a, ",")
		path = func(int) *field.Path {
			return field.NewPath("metadata", "annotations").Key(corev1.AnnotationLoadBalancerSourceRangesKey)
		}
	}
	var (
		out  []netip.Prefix
		errs field.ErrorList
	)
	for i, v := range vals {
		v = strings.TrimSpace(v)
		p, err := netip.ParsePrefix(v)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path(i), v, "must be a valid CIDR value (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
		case p.Addr().Is4In6():
			errs = append(errs, field.Invalid(path(i), v, "must be an IPv4 or IPv6 CIDR, not IPv4-mapped IPv6"))
		case p.Addr().Zone() != "":
			errs = append(errs, field.Invalid(path(i), v, "must be a CIDR without a zone"))
		default:
			out = append(out, p.Masked())
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// validateSourceRanges checks loadBalancerSourceRanges (field or
// annotation) as the API server does: LoadBalancer Services only, CIDRs.
func validateSourceRanges(s *Service) field.ErrorList {
	var errs field.ErrorList
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		if len(s.Spec.LoadBalancerSourceRanges) > 0 {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "loadBalancerSourceRanges"),
				"may only be used when `type` is 'LoadBalancer'"))
		} else if _, set := s.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]; set {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(corev1.AnnotationLoadBalancerSourceRangesKey),
				"may only be used when `type` is 'LoadBalancer'"))
		}
	}
	_, perr := LoadBalancerSourceRanges(s)
	return append(errs, perr...)
}
