package bench

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
)

// SvcSet is a kube-proxy-shaped cluster of ClusterIP services: the input
// the service rows program into kube-proxy's iptables mode, its nftables mode
// and lanekit alike, so that every row carries the same services and
// endpoints.
type SvcSet struct {
	// ClusterCIDR: sources outside it are masqueraded (kube-proxy's
	// --cluster-cidr local-traffic detector).
	ClusterCIDR netip.Prefix
	Services    []Svc
	// Used is the index of the service the bench client connects to.
	Used int
}

// Svc is one Service: a cluster IP, TCP ports, ready endpoints.
type Svc struct {
	Namespace, Name string
	IP              netip.Addr
	Ports           []SvcPort
	Endpoints       []netip.Addr
}

// SvcPort is one service port; TargetPort is the endpoints' port.
type SvcPort struct {
	Name             string
	Port, TargetPort uint16
}

// Service-set shape: where cluster IPs and the other services' endpoints
// come from.
var (
	// svcVIPBase: cluster IPs of the bench services (the upper half of the
	// lab's 10.96.0.0/16 service range; the lab's own rules use 10.96.0.x).
	svcVIPBase = netip.MustParseAddr("10.96.128.1")
	// svcFakeEPBase: endpoints of the services the client does not use: pod
	// addresses of nodes the lab does not have (10.244.16.0 and up), as
	// in a cluster larger than the lab.
	svcFakeEPBase = netip.MustParseAddr("10.244.16.1")
)

// SvcNamespace is the namespace of every bench Service.
const SvcNamespace = "bench"

// SvcClientName is the name of the service the bench client connects to.
const SvcClientName = "svc-client"

// SvcEndpointsPerService is how many endpoints every other service has.
const SvcEndpointsPerService = 4

// MaxSvcSetSize bounds NewSvcSet (cluster IPs come from a /17).
const MaxSvcSetSize = 30000

// NewSvcSet builds n services: service Used (the middle one, where kube-proxy's
// map-ordered KUBE-SERVICES chain puts a service on average) is SvcClientName
// at the first cluster IP with usedPorts and usedEPs (real pods); every other service has one port "http" 80 ->
// 8080 and SvcEndpointsPerService endpoints that need not exist.
func NewSvcSet(n int, usedPorts []SvcPort, usedEPs []netip.Addr, clusterCIDR netip.Prefix) (*SvcSet, error) {
	if n < 1 || n > MaxSvcSetSize {
		return nil, fmt.Errorf("service set: %d services: want 1..%d", n, MaxSvcSetSize)
	}
	if len(usedPorts) == 0 || len(usedEPs) == 0 {
		return nil, fmt.Errorf("service set: the client's service needs ports and endpoints")
	}
	s := &SvcSet{ClusterCIDR: clusterCIDR, Used: n / 2, Services: make([]Svc, n)}
	for i := range s.Services {
		svc := Svc{Namespace: SvcNamespace, Name: fmt.Sprintf("svc-%05d", i)}
		if i == s.Used {
			// The client's service is the same in every set (name, VIP,
			// endpoints): rows differ only in how many others there are.
			svc.Name, svc.IP = SvcClientName, svcVIPBase
			svc.Ports = append([]SvcPort(nil), usedPorts...)
			svc.Endpoints = append([]netip.Addr(nil), usedEPs...)
		} else {
			svc.IP = addrPlus(svcVIPBase, 1+i)
			svc.Ports = []SvcPort{{Name: "http", Port: 80, TargetPort: 8080}}
			for k := range SvcEndpointsPerService {
				svc.Endpoints = append(svc.Endpoints, fakeEndpoint(i*SvcEndpointsPerService+k))
			}
		}
		s.Services[i] = svc
	}
	return s, nil
}

// addrPlus is a + k (IPv4).
func addrPlus(a netip.Addr, k int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(k)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// fakeEndpoint is the j-th endpoint address of the services the client
// does not use: host addresses (.1 to .254) of consecutive /24s from
// svcFakeEPBase. Service i's endpoints depend only on i, so a smaller set's
// services are the same objects in a larger set (its rows only add).
func fakeEndpoint(j int) netip.Addr {
	return addrPlus(svcFakeEPBase, (j/254)*256+j%254)
}

// Endpoints counts the endpoints of all service ports (what kube-proxy's
// large-cluster threshold counts).
func (s *SvcSet) Endpoints() int {
	n := 0
	for _, svc := range s.Services {
		n += len(svc.Endpoints) * len(svc.Ports)
	}
	return n
}

// SvcChange is one endpoint removed from one service: the "one change" the
// rows time.
type SvcChange struct {
	Service  int // index into Services
	Endpoint int // index into that service's Endpoints
}

// Without returns a copy of s with the change applied (the endpoint removed).
func (s *SvcSet) Without(c SvcChange) (*SvcSet, error) {
	if c.Service < 0 || c.Service >= len(s.Services) {
		return nil, fmt.Errorf("service change: service %d of %d", c.Service, len(s.Services))
	}
	eps := s.Services[c.Service].Endpoints
	if c.Endpoint < 0 || c.Endpoint >= len(eps) || len(eps) < 2 {
		return nil, fmt.Errorf("service change: endpoint %d of %s/%s (%d endpoints; one must stay)",
			c.Endpoint, s.Services[c.Service].Namespace, s.Services[c.Service].Name, len(eps))
	}
	out := *s
	out.Services = append([]Svc(nil), s.Services...)
	svc := out.Services[c.Service]
	svc.Endpoints = append(append([]netip.Addr(nil), eps[:c.Endpoint]...), eps[c.Endpoint+1:]...)
	out.Services[c.Service] = svc
	return &out, nil
}

// DefaultChange is the change the rows time: the first endpoint of a
// service the client does not use (service 0, or 1 when 0 is the client's).
func (s *SvcSet) DefaultChange() SvcChange {
	if s.Used == 0 && len(s.Services) > 1 {
		return SvcChange{Service: 1}
	}
	return SvcChange{Service: 0}
}

// portName is kube-proxy's ServicePortName string: "ns/name:port" ("ns/name"
// for an unnamed port).
func (svc *Svc) portName(p SvcPort) string {
	if p.Name == "" {
		return svc.Namespace + "/" + svc.Name
	}
	return svc.Namespace + "/" + svc.Name + ":" + p.Name
}

// kubeHash is kube-proxy's chain-name hash: base32 of the SHA-256 of s,
// truncated to n characters.
func kubeHash(s string, n int) string {
	h := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(h[:])[:n]
}
