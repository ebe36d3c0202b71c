package k8sobj

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Session affinity timeout bounds (Kubernetes: 0 < timeoutSeconds <= 86400,
// default 10800).
const (
	MaxAffinityTimeoutSeconds     = 86400
	DefaultAffinityTimeoutSeconds = 10800
)

// ServiceNameLabel links an EndpointSlice to its Service.
const ServiceNameLabel = discoveryv1.LabelServiceName

// Validate checks one object for what lanekit's translation relies on. It
// returns nil or an error listing every problem with its field path.
func Validate(o Object) error {
	var errs field.ErrorList
	switch {
	case o.Service != nil:
		errs = validateService(o.Service)
	case o.EndpointSlice != nil:
		errs = validateEndpointSlice(o.EndpointSlice)
	case o.NetworkPolicy != nil:
		errs = validateNetworkPolicy(o.NetworkPolicy)
	case o.NamespaceObj != nil:
		errs = validateNamespace(o.NamespaceObj)
	case o.Pod != nil:
		errs = validatePod(o.Pod)
	default:
		return fmt.Errorf("empty object")
	}
	return errs.ToAggregate()
}

func validateMeta(m *metav1.ObjectMeta, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if m.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(m.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), m.Name, msg))
		}
	}
	for _, msg := range validation.IsDNS1123Label(m.Namespace) {
		errs = append(errs, field.Invalid(p.Child("namespace"), m.Namespace, msg))
	}
	errs = append(errs, validateLabels(m.Labels, p.Child("labels"))...)
	return errs
}

func validateLabels(labels map[string]string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for k, v := range labels {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p.Key(k), k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(p.Key(k), v, msg))
		}
	}
	return errs
}

// validateProtocol accepts "" (TCP), TCP, UDP and SCTP. SCTP objects are
// kept, not refused: refusing a NetworkPolicy that lists an SCTP port would
// leave the pods it selects unisolated, and a Service's TCP and UDP ports are
// served beside an SCTP port the datapath does not load-balance (policy
// compiles an SCTP rule to protocol 132, which no TCP or UDP packet matches;
// service translation skips SCTP ports and says so once).
func validateProtocol(proto *corev1.Protocol, p *field.Path) field.ErrorList {
	if proto == nil {
		return nil
	}
	switch *proto {
	case "", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, *proto, []string{"TCP", "UDP", "SCTP"})}
}

func validatePortNumber(port int32, p *field.Path) field.ErrorList {
	if port < 1 || port > 65535 {
		return field.ErrorList{field.Invalid(p, port, "must be between 1 and 65535, inclusive")}
	}
	return nil
}

// validatePortNumOrName checks an IntOrString port: a number 1-65535 or an
// IANA_SVC_NAME. allowZero accepts the zero value (meaning "unset").
func validatePortNumOrName(v intstr.IntOrString, p *field.Path, allowZero bool) field.ErrorList {
	if v.Type == intstr.Int {
		if v.IntVal == 0 && allowZero {
			return nil
		}
		return validatePortNumber(v.IntVal, p)
	}
	if v.StrVal == "" && allowZero {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range validation.IsValidPortName(v.StrVal) {
		errs = append(errs, field.Invalid(p, v.StrVal, msg))
	}
	return errs
}

func validateService(s *Service) field.ErrorList {
	errs := validateMeta(&metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: s.Labels}, field.NewPath("metadata"))
	// The API server's rule for Service names (ValidateServiceName): a
	// DNS-1035 label, stricter than validateMeta's subdomain.
	if s.Name != "" {
		for _, msg := range validation.IsDNS1035Label(s.Name) {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), s.Name, msg))
		}
	}
	spec := field.NewPath("spec")
	switch s.Spec.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	case corev1.ServiceTypeExternalName:
		// A DNS alias: valid, nothing to program (accepted and ignored).
		return append(errs, validateExternalName(s)...)
	default:
		errs = append(errs, field.NotSupported(spec.Child("type"), s.Spec.Type,
			[]string{"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"}))
	}
	headless := s.Spec.ClusterIP == corev1.ClusterIPNone
	if headless && (s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer) {
		errs = append(errs, field.Invalid(spec.Child("clusterIP"), s.Spec.ClusterIP,
			"may not be set to 'None' for LoadBalancer or NodePort services"))
	}
	errs = append(errs, validateExternalAccess(s)...)
	switch {
	case headless:
	case s.Spec.ClusterIP == "":
		errs = append(errs, field.Required(spec.Child("clusterIP"),
			"lanekit does not allocate cluster IPs; set one (or \"None\" for headless)"))
	default:
		ip, err := netip.ParseAddr(s.Spec.ClusterIP)
		if err != nil || ip.Is4In6() {
			errs = append(errs, field.Invalid(spec.Child("clusterIP"), s.Spec.ClusterIP, "must be an IPv4 or IPv6 address or \"None\""))
		}
	}
	// Dual-stack: a cluster IP of each family (lanekit programs both; it
	// does not allocate them), NodePorts and external addresses per family.
	for i, a := range s.Spec.ClusterIPs {
		p := spec.Child("clusterIPs").Index(i)
		ip, err := netip.ParseAddr(a)
		switch {
		case headless:
		case i == 0 && a != s.Spec.ClusterIP:
			errs = append(errs, field.Invalid(p, a, "must match spec.clusterIP"))
		case i > 1:
			errs = append(errs, field.TooMany(spec.Child("clusterIPs"), len(s.Spec.ClusterIPs), 2))
		case err != nil || ip.Is4In6():
			errs = append(errs, field.Invalid(p, a, "must be an IPv4 or IPv6 address"))
		case i == 1 && sameFamily(ip, s.Spec.ClusterIPs[0]):
			errs = append(errs, field.Invalid(p, a, "must be of the other family than clusterIPs[0]"))
		}
	}
	nodePortAllowed := s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer
	if len(s.Spec.Ports) == 0 && !headless {
		errs = append(errs, field.Required(spec.Child("ports"), ""))
	}
	names := map[string]bool{}
	type pp struct {
		port  int32
		proto corev1.Protocol
	}
	seen := map[pp]bool{}
	seenNode := map[pp]bool{}
	for i := range s.Spec.Ports {
		port := &s.Spec.Ports[i]
		pp0 := spec.Child("ports").Index(i)
		if len(s.Spec.Ports) > 1 && port.Name == "" {
			errs = append(errs, field.Required(pp0.Child("name"), "required when a service has more than one port"))
		}
		if port.Name != "" {
			for _, msg := range validation.IsDNS1123Label(port.Name) {
				errs = append(errs, field.Invalid(pp0.Child("name"), port.Name, msg))
			}
			if names[port.Name] {
				errs = append(errs, field.Duplicate(pp0.Child("name"), port.Name))
			}
			names[port.Name] = true
		}
		errs = append(errs, validatePortNumber(port.Port, pp0.Child("port"))...)
		errs = append(errs, validateProtocol(&port.Protocol, pp0.Child("protocol"))...)
		proto := port.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		if seen[pp{port.Port, proto}] {
			errs = append(errs, field.Duplicate(pp0, fmt.Sprintf("%d/%s", port.Port, proto)))
		}
		seen[pp{port.Port, proto}] = true
		errs = append(errs, validatePortNumOrName(port.TargetPort, pp0.Child("targetPort"), true)...)
		if port.NodePort != 0 {
			if !nodePortAllowed {
				errs = append(errs, field.Forbidden(pp0.Child("nodePort"), "only for type NodePort or LoadBalancer"))
			} else {
				errs = append(errs, validatePortNumber(port.NodePort, pp0.Child("nodePort"))...)
				if seenNode[pp{port.NodePort, proto}] {
					errs = append(errs, field.Duplicate(pp0.Child("nodePort"), port.NodePort))
				}
				seenNode[pp{port.NodePort, proto}] = true
			}
		} else if s.Spec.Type == corev1.ServiceTypeNodePort {
			errs = append(errs, field.Required(pp0.Child("nodePort"), "lanekit does not allocate node ports"))
		}
	}
	switch s.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		if s.Spec.SessionAffinityConfig != nil {
			errs = append(errs, field.Forbidden(spec.Child("sessionAffinityConfig"), "only with sessionAffinity ClientIP"))
		}
	case corev1.ServiceAffinityClientIP:
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t <= 0 || t > MaxAffinityTimeoutSeconds {
				errs = append(errs, field.Invalid(spec.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds"), t,
					fmt.Sprintf("must be greater than 0 and at most %d", MaxAffinityTimeoutSeconds)))
			}
		}
	default:
		errs = append(errs, field.NotSupported(spec.Child("sessionAffinity"), s.Spec.SessionAffinity, []string{"None", "ClientIP"}))
	}
	return errs
}

// validateExternalName checks an ExternalName Service as the API server does.
// sameFamily reports whether ip is of first's family; false if first is
// not an address (refused for itself).
func sameFamily(ip netip.Addr, first string) bool {
	f, err := netip.ParseAddr(first)
	return err == nil && ip.Is4() == f.Is4()
}

func validateExternalName(s *Service) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	name := strings.TrimSuffix(s.Spec.ExternalName, ".")
	if name == "" {
		errs = append(errs, field.Required(spec.Child("externalName"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(spec.Child("externalName"), s.Spec.ExternalName, msg))
		}
	}
	if s.Spec.ClusterIP != "" || len(s.Spec.ClusterIPs) > 0 {
		errs = append(errs, field.Forbidden(spec.Child("clusterIPs"), "may not be set for ExternalName services"))
	}
	for i := range s.Spec.Ports {
		pp := spec.Child("ports").Index(i)
		errs = append(errs, validatePortNumber(s.Spec.Ports[i].Port, pp.Child("port"))...)
		errs = append(errs, validateProtocol(&s.Spec.Ports[i].Protocol, pp.Child("protocol"))...)
		if s.Spec.Ports[i].NodePort != 0 {
			errs = append(errs, field.Forbidden(pp.Child("nodePort"), "only for type NodePort or LoadBalancer"))
		}
	}
	if s.Spec.ExternalTrafficPolicy != "" {
		errs = append(errs, field.Invalid(spec.Child("externalTrafficPolicy"), s.Spec.ExternalTrafficPolicy,
			"may only be set for externally-accessible services"))
	}
	return errs
}

// ExternallyAccessible says whether a Service is reached from outside the
// cluster (the API server's rule): NodePort, LoadBalancer, or external IPs.
func ExternallyAccessible(s *Service) bool {
	return s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer ||
		((s.Spec.Type == "" || s.Spec.Type == corev1.ServiceTypeClusterIP) && len(s.Spec.ExternalIPs) > 0)
}

// NeedsHealthCheck says whether the Service has a healthCheckNodePort to
// serve: type LoadBalancer with externalTrafficPolicy Local.
func NeedsHealthCheck(s *Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// validateExternalAccess checks the traffic policies, external IPs, the
// health check port and load-balancer status as the API server does, and
// refuses what lanekit does not implement with the reason.
func validateExternalAccess(s *Service) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	switch etp := s.Spec.ExternalTrafficPolicy; {
	case etp == "":
	case !ExternallyAccessible(s):
		errs = append(errs, field.Invalid(spec.Child("externalTrafficPolicy"), etp,
			"may only be set for externally-accessible services"))
	case etp != corev1.ServiceExternalTrafficPolicyCluster && etp != corev1.ServiceExternalTrafficPolicyLocal:
		errs = append(errs, field.NotSupported(spec.Child("externalTrafficPolicy"), etp, []string{"Cluster", "Local"}))
	}
	switch itp := s.Spec.InternalTrafficPolicy; {
	case itp == nil, *itp == corev1.ServiceInternalTrafficPolicyCluster, *itp == corev1.ServiceInternalTrafficPolicyLocal:
	default:
		errs = append(errs, field.NotSupported(spec.Child("internalTrafficPolicy"), *itp, []string{"Cluster", "Local"}))
	}
	if hc := s.Spec.HealthCheckNodePort; hc != 0 {
		if !NeedsHealthCheck(s) {
			errs = append(errs, field.Invalid(spec.Child("healthCheckNodePort"), hc,
				"may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"))
		} else {
			errs = append(errs, validatePortNumber(hc, spec.Child("healthCheckNodePort"))...)
		}
	}
	seen := map[netip.Addr]bool{}
	for i, a := range s.Spec.ExternalIPs {
		p := spec.Child("externalIPs").Index(i)
		ip, err := netip.ParseAddr(a)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(p, a, "must be a valid IP address"))
		case ip.IsUnspecified() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsMulticast():
			errs = append(errs, field.Invalid(p, a, "may not be unspecified, loopback, link-local or multicast"))
		case ip.Is4In6():
			errs = append(errs, field.Invalid(p, a, "must be an IPv4 or IPv6 address, not IPv4-mapped IPv6"))
		case seen[ip]:
			errs = append(errs, field.Duplicate(p, a))
		}
		seen[ip] = true
	}
	errs = append(errs, validateSourceRanges(s)...) // sourceranges.go
	// A headless Service programs nothing whatever its families (the API
	// server makes one without a selector RequireDualStack, IPv4 and IPv6).
	if s.Spec.ClusterIP != corev1.ClusterIPNone {
		if p := s.Spec.IPFamilyPolicy; p != nil && *p == corev1.IPFamilyPolicyRequireDualStack && len(s.Spec.ClusterIPs) < 2 {
			errs = append(errs, field.Invalid(spec.Child("ipFamilyPolicy"), *p, "RequireDualStack needs spec.clusterIPs of both families (lanekit does not allocate cluster IPs)"))
		}
		for i, f := range s.Spec.IPFamilies {
			if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
				errs = append(errs, field.NotSupported(spec.Child("ipFamilies").Index(i), f, []string{"IPv4", "IPv6"}))
			}
		}
	}
	ing := field.NewPath("status", "loadBalancer", "ingress")
	if len(s.Status.LoadBalancer.Ingress) > 0 && s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		errs = append(errs, field.Forbidden(ing, "may only be used when `spec.type` is 'LoadBalancer'"))
	}
	for i, in := range s.Status.LoadBalancer.Ingress {
		p := ing.Index(i)
		if in.IP == "" {
			if in.IPMode != nil {
				errs = append(errs, field.Required(p.Child("ip"), "must be specified when `ipMode` is set"))
			}
			continue // a hostname only: nothing to program (as kube-proxy)
		}
		ip, err := netip.ParseAddr(in.IP)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(p.Child("ip"), in.IP, "must be a valid IP address"))
		case ip.Is4In6():
			errs = append(errs, field.Invalid(p.Child("ip"), in.IP, "must be an IPv4 or IPv6 address, not IPv4-mapped IPv6"))
		}
		if m := in.IPMode; m != nil && *m != corev1.LoadBalancerIPModeVIP && *m != corev1.LoadBalancerIPModeProxy {
			errs = append(errs, field.NotSupported(p.Child("ipMode"), *m, []string{"VIP", "Proxy"}))
		}
	}
	return errs
}

func validateEndpointSlice(es *EndpointSlice) field.ErrorList {
	// es.InvalidLabels is nil unless a label is invalid (SlimEndpointSlice):
	// then validateMeta names it; else the service name is checked as a label.
	errs := validateMeta(&metav1.ObjectMeta{Name: es.Name, Namespace: es.Namespace, Labels: es.InvalidLabels}, field.NewPath("metadata"))
	svc := es.ServiceName
	if svc == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "labels").Key(ServiceNameLabel), "names the slice's Service"))
	} else if es.InvalidLabels == nil {
		errs = append(errs, validateLabels(map[string]string{ServiceNameLabel: svc}, field.NewPath("metadata", "labels"))...)
	}
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
	case "":
		errs = append(errs, field.Required(field.NewPath("addressType"), ""))
	default:
		errs = append(errs, field.NotSupported(field.NewPath("addressType"), es.AddressType, []string{"IPv4", "IPv6"}))
	}
	names := map[string]bool{}
	for i, port := range es.Ports {
		p := field.NewPath("ports").Index(i)
		name := ""
		if port.Name != nil {
			name = *port.Name
			if name != "" {
				for _, msg := range validation.IsDNS1123Label(name) {
					errs = append(errs, field.Invalid(p.Child("name"), name, msg))
				}
			}
		}
		if names[name] {
			errs = append(errs, field.Duplicate(p.Child("name"), name))
		}
		names[name] = true
		if port.Port == nil {
			errs = append(errs, field.Required(p.Child("port"), "lanekit needs a port number"))
		} else {
			errs = append(errs, validatePortNumber(*port.Port, p.Child("port"))...)
		}
		errs = append(errs, validateProtocol(port.Protocol, p.Child("protocol"))...)
	}
	for i, ep := range es.Endpoints {
		p := field.NewPath("endpoints").Index(i)
		if len(ep.Addresses) == 0 {
			errs = append(errs, field.Required(p.Child("addresses"), ""))
		}
		for j, a := range ep.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil || ip.Is4In6() || ip.Is4() != (es.AddressType == discoveryv1.AddressTypeIPv4) {
				errs = append(errs, field.Invalid(p.Child("addresses").Index(j), a, "must be an "+string(es.AddressType)+" address"))
			}
		}
	}
	return errs
}

func validateSelector(sel *metav1.LabelSelector, p *field.Path) field.ErrorList {
	if sel == nil {
		return nil
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		return field.ErrorList{field.Invalid(p, sel.String(), err.Error())}
	}
	return nil
}

func validateNetworkPolicy(np *networkingv1.NetworkPolicy) field.ErrorList {
	errs := validateMeta(&np.ObjectMeta, field.NewPath("metadata"))
	spec := field.NewPath("spec")
	errs = append(errs, validateSelector(&np.Spec.PodSelector, spec.Child("podSelector"))...)
	seenTypes := map[networkingv1.PolicyType]bool{}
	for i, t := range np.Spec.PolicyTypes {
		p := spec.Child("policyTypes").Index(i)
		switch t {
		case networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress:
		default:
			errs = append(errs, field.NotSupported(p, t, []string{"Ingress", "Egress"}))
		}
		if seenTypes[t] {
			errs = append(errs, field.Duplicate(p, t))
		}
		seenTypes[t] = true
	}
	for i, r := range np.Spec.Ingress {
		p := spec.Child("ingress").Index(i)
		errs = append(errs, validatePolicyPorts(r.Ports, p.Child("ports"))...)
		for j := range r.From {
			errs = append(errs, validatePeer(&r.From[j], p.Child("from").Index(j))...)
		}
	}
	for i, r := range np.Spec.Egress {
		p := spec.Child("egress").Index(i)
		errs = append(errs, validatePolicyPorts(r.Ports, p.Child("ports"))...)
		for j := range r.To {
			errs = append(errs, validatePeer(&r.To[j], p.Child("to").Index(j))...)
		}
	}
	return errs
}

func validatePolicyPorts(ports []networkingv1.NetworkPolicyPort, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, port := range ports {
		pp := p.Index(i)
		errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
		if port.Port != nil {
			errs = append(errs, validatePortNumOrName(*port.Port, pp.Child("port"), false)...)
		}
		if port.EndPort != nil {
			switch {
			case port.Port == nil:
				errs = append(errs, field.Required(pp.Child("port"), "required when endPort is set"))
			case port.Port.Type != intstr.Int:
				errs = append(errs, field.Forbidden(pp.Child("endPort"), "may not be used with a named port"))
			case *port.EndPort < port.Port.IntVal:
				errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "must be greater than or equal to port"))
			case *port.EndPort > 65535:
				errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "must be between 1 and 65535, inclusive"))
			}
		}
	}
	return errs
}

func validatePeer(peer *networkingv1.NetworkPolicyPeer, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	n := 0
	if peer.PodSelector != nil || peer.NamespaceSelector != nil {
		n++
	}
	if peer.IPBlock != nil {
		n++
	}
	if n == 0 {
		return field.ErrorList{field.Required(p, "must specify a peer")}
	}
	if n > 1 {
		errs = append(errs, field.Forbidden(p, "ipBlock may not be combined with podSelector or namespaceSelector"))
	}
	errs = append(errs, validateSelector(peer.PodSelector, p.Child("podSelector"))...)
	errs = append(errs, validateSelector(peer.NamespaceSelector, p.Child("namespaceSelector"))...)
	if b := peer.IPBlock; b != nil {
		bp := p.Child("ipBlock")
		cidr, err := netip.ParsePrefix(b.CIDR)
		if err != nil || cidr.Addr().Is4In6() {
			errs = append(errs, field.Invalid(bp.Child("cidr"), b.CIDR, "must be an IPv4 or IPv6 CIDR"))
			return errs
		}
		cidr = cidr.Masked()
		for i, e := range b.Except {
			ex, err := netip.ParsePrefix(e)
			if err != nil || ex.Addr().Is4() != cidr.Addr().Is4() || ex.Addr().Is4In6() {
				errs = append(errs, field.Invalid(bp.Child("except").Index(i), e, "must be a CIDR of the family of "+b.CIDR))
				continue
			}
			if ex.Bits() <= cidr.Bits() || !cidr.Contains(ex.Addr()) {
				errs = append(errs, field.Invalid(bp.Child("except").Index(i), e, "must be strictly within "+b.CIDR))
			}
		}
	}
	return errs
}

func validateNamespace(ns *corev1.Namespace) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("metadata")
	if ns.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Label(ns.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), ns.Name, msg))
		}
	}
	if ns.Namespace != "" {
		errs = append(errs, field.Forbidden(p.Child("namespace"), "a Namespace is cluster-scoped"))
	}
	errs = append(errs, validateLabels(ns.Labels, p.Child("labels"))...)
	return errs
}

// PodIPv4 returns the pod's IPv4 address (status.podIPs, else status.podIP);
// ok is false when it has none yet.
func PodIPv4(pod *Pod) (netip.Addr, bool) {
	for _, pip := range pod.Status.PodIPs {
		if ip, err := netip.ParseAddr(pip.IP); err == nil && ip.Is4() {
			return ip, true
		}
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil && ip.Is4() {
		return ip, true
	}
	return netip.Addr{}, false
}

// PodIPv6 returns the pod's IPv6 address (status.podIPs, else status.podIP);
// ok is false when it has none.
func PodIPv6(pod *Pod) (netip.Addr, bool) {
	for _, pip := range pod.Status.PodIPs {
		if ip, err := netip.ParseAddr(pip.IP); err == nil && ip.Is6() && !ip.Is4In6() {
			return ip, true
		}
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil && ip.Is6() && !ip.Is4In6() {
		return ip, true
	}
	return netip.Addr{}, false
}

func validatePod(pod *Pod) field.ErrorList {
	errs := validateMeta(&metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels}, field.NewPath("metadata"))
	if pod.Namespace == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "namespace"), ""))
	}
	if n := pod.Spec.NodeName; n != "" {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, field.Invalid(field.NewPath("spec", "nodeName"), n, msg))
		}
	}
	st := field.NewPath("status")
	if pod.Status.PodIP != "" {
		if _, err := netip.ParseAddr(pod.Status.PodIP); err != nil {
			errs = append(errs, field.Invalid(st.Child("podIP"), pod.Status.PodIP, "must be an IP address"))
		}
	}
	for i, pip := range pod.Status.PodIPs {
		ip, err := netip.ParseAddr(pip.IP)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(st.Child("podIPs").Index(i).Child("ip"), pip.IP, "must be an IP address"))
		case i == 0 && pod.Status.PodIP != "" && ip.String() != pod.Status.PodIP:
			errs = append(errs, field.Invalid(st.Child("podIPs").Index(0).Child("ip"), pip.IP, "must match status.podIP"))
		}
	}
	names := map[string]bool{}
	check := func(p *field.Path, ports []corev1.ContainerPort) {
		for j, cp := range ports {
			pp := p.Index(j)
			errs = append(errs, validatePortNumber(cp.ContainerPort, pp.Child("containerPort"))...)
			if cp.HostPort != 0 {
				errs = append(errs, validatePortNumber(cp.HostPort, pp.Child("hostPort"))...)
			}
			if cp.HostIP != "" {
				if _, err := netip.ParseAddr(cp.HostIP); err != nil {
					errs = append(errs, field.Invalid(pp.Child("hostIP"), cp.HostIP, "must be an IP address"))
				}
			}
			proto := cp.Protocol
			errs = append(errs, validateProtocol(&proto, pp.Child("protocol"))...)
			if cp.Name == "" {
				continue
			}
			for _, msg := range validation.IsValidPortName(cp.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), cp.Name, msg))
			}
			if names[cp.Name] {
				errs = append(errs, field.Duplicate(pp.Child("name"), cp.Name))
			}
			names[cp.Name] = true
		}
	}
	for i := range pod.Spec.InitContainers {
		check(field.NewPath("spec", "initContainers").Index(i).Child("ports"), pod.Spec.InitContainers[i].Ports)
	}
	for i := range pod.Spec.Containers {
		check(field.NewPath("spec", "containers").Index(i).Child("ports"), pod.Spec.Containers[i].Ports)
	}
	return errs
}
