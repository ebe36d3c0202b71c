package k8s

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// The transform (slim.go) also interns the strings that repeat across
// objects — namespaces, label keys and values, annotation keys, node names,
// enum fields — so that each is held once however many objects carry it: a
// decoded object holds its own copy of every string. Names, UIDs, addresses
// and annotation values, which seldom repeat, are left alone, and so is a
// slice's Service name: one per Service but for the few Services with more
// than one slice, it would fill the table with an entry per Service.
//
// The table holds its strings strongly (unique.Make would hold them weakly:
// the objects keep a string's bytes, not the unique.Handle, so its entry
// went at the next GC and equal strings decoded on either side of one were
// held twice). It is bounded, for a tenant creating ever-new label values:
// two generations, each of at most half the bound; a string found in the
// old one moves to the new one, and when the new one is full the old one is
// forgotten — a string still in use is back in the table at its next
// lookup, one no object carries any more leaves it after two generations.
// The objects holding a forgotten string keep it; a later object carrying
// it gets a copy of its own, then the table's again.
type internTable struct {
	mu       sync.Mutex
	cur, old map[string]string
	max      int // strings in both generations together
	maxLen   int // longer strings are not kept (each holds its bytes)
}

// internMax bounds the table's strings, internMaxLen their length (a label
// value is at most 63 bytes, a qualified key 253 + 63): a full table holds
// at most a few MB.
const (
	internMax    = 1 << 16
	internMaxLen = 320
)

// strs is the transform's: one process, one set of caches.
var strs = newInternTable(internMax, internMaxLen)

func newInternTable(max, maxLen int) *internTable {
	return &internTable{cur: map[string]string{}, max: max, maxLen: maxLen}
}

func (t *internTable) intern(s string) string {
	if s == "" || len(s) > t.maxLen {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.cur[s]; ok {
		return c
	}
	c, ok := t.old[s]
	if ok {
		delete(t.old, s)
	} else {
		c = strings.Clone(s) // not s's backing array: s may be a part of a larger decoded buffer
	}
	if len(t.cur) >= t.max/2 {
		t.old, t.cur = t.cur, make(map[string]string, len(t.cur))
	}
	t.cur[c] = c
	return c
}

// len is the strings the table holds.
func (t *internTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.cur) + len(t.old)
}

func intern(s string) string { return strs.intern(s) }

// internMap returns m with its keys and values interned (a new map: the
// keys of a map cannot be replaced in place).
func internMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[intern(k)] = intern(v)
	}
	return out
}

// internKeys returns m with its keys interned.
func internKeys(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[intern(k)] = v
	}
	return out
}

// Label sets repeat too: a Deployment's pods carry one set, the objects of
// one chart another. labelSets hands out one map per set for the objects
// the transform keeps (the agent and the caches only read them: nothing
// changes an object it was given), bounded as every shareTable is: when
// full, an arbitrary set is forgotten (the objects holding it keep it; a
// later object carrying it gets a map of its own, then the set again), so
// objects with ever-new label sets cost it nothing but turnover.
type labelSets struct{ *shareTable[map[string]string] }

// labelSetMax bounds the shared sets (each a few hundred bytes).
const labelSetMax = 8192

// sharedLabels is the transform's: one process, one set of caches.
var sharedLabels = labelSets{newShareTable[map[string]string](labelSetMax)}

// labelSetKey is m's key among the sets: its pairs in key order, each
// string length-prefixed (unambiguous whatever the labels hold).
func labelSetKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		writeKey(&b, k)
		writeKey(&b, m[k])
	}
	return b.String()
}

// share returns the shared map equal to m (interned), m's own interned copy
// if m is large.
func (ls labelSets) share(m map[string]string) map[string]string {
	if len(m) == 0 || len(m) > 32 {
		return internMap(m)
	}
	return ls.shareTable.share(labelSetKey(m), func() map[string]string { return internMap(m) })
}

func internPtr(p *string) {
	if p != nil {
		*p = intern(*p)
	}
}

// internMeta interns m's namespace, labels and annotation keys; with
// shareLabels its label set is shared (labelSets) too.
func internMeta(m metav1.Object, shareLabels bool) {
	m.SetNamespace(intern(m.GetNamespace()))
	if shareLabels {
		m.SetLabels(sharedLabels.share(m.GetLabels()))
	} else {
		m.SetLabels(internMap(m.GetLabels()))
	}
	m.SetAnnotations(internKeys(m.GetAnnotations()))
	if refs := m.GetOwnerReferences(); len(refs) > 0 {
		for i := range refs {
			refs[i].APIVersion, refs[i].Kind = intern(refs[i].APIVersion), intern(refs[i].Kind)
		}
	}
}

func internPod(p *k8sobj.Pod) {
	p.Spec.NodeName = intern(p.Spec.NodeName)
	p.Status.Phase = corev1.PodPhase(intern(string(p.Status.Phase)))
	p.Status.HostIP = intern(p.Status.HostIP)
	for i := range p.Status.HostIPs {
		p.Status.HostIPs[i].IP = intern(p.Status.HostIPs[i].IP)
	}
	for _, cs := range [][]k8sobj.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			cs[i].Name = intern(cs[i].Name)
			for j := range cs[i].Ports {
				pt := &cs[i].Ports[j]
				pt.Name, pt.Protocol = intern(pt.Name), corev1.Protocol(intern(string(pt.Protocol)))
			}
		}
	}
}

func internService(s *k8sobj.Service) {
	sp := &s.Spec
	sp.Type = corev1.ServiceType(intern(string(sp.Type)))
	sp.SessionAffinity = corev1.ServiceAffinity(intern(string(sp.SessionAffinity)))
	sp.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(intern(string(sp.ExternalTrafficPolicy)))
	if p := sp.InternalTrafficPolicy; p != nil {
		sp.InternalTrafficPolicy = sharedSpec.internalPolicy.share(string(*p), func() *corev1.ServiceInternalTrafficPolicy {
			v := corev1.ServiceInternalTrafficPolicy(intern(string(*p)))
			return &v
		})
	}
	if p := sp.IPFamilyPolicy; p != nil {
		sp.IPFamilyPolicy = sharedSpec.familyPolicy.share(string(*p), func() *corev1.IPFamilyPolicy {
			v := corev1.IPFamilyPolicy(intern(string(*p)))
			return &v
		})
	}
	if len(sp.IPFamilies) > 0 {
		var key strings.Builder
		for _, f := range sp.IPFamilies {
			writeKey(&key, string(f))
		}
		fams := sp.IPFamilies
		sp.IPFamilies = sharedSpec.families.share(key.String(), func() []corev1.IPFamily {
			out := make([]corev1.IPFamily, len(fams))
			for i, f := range fams {
				out[i] = corev1.IPFamily(intern(string(f)))
			}
			return out
		})
	}
	// The first of the ClusterIPs is the ClusterIP (the API server
	// keeps them so), decoded apart.
	if len(sp.ClusterIPs) > 0 && sp.ClusterIPs[0] == sp.ClusterIP {
		sp.ClusterIPs[0] = sp.ClusterIP
	}
	if len(sp.Ports) > 0 {
		ports := sp.Ports
		sp.Ports = sharedSpec.ports.share(portsKey(ports), func() []corev1.ServicePort {
			out := slices.Clone(ports)
			for i := range out {
				pt := &out[i]
				pt.Name, pt.Protocol = intern(pt.Name), corev1.Protocol(intern(string(pt.Protocol)))
				internPtr(pt.AppProtocol)
				if pt.TargetPort.StrVal != "" {
					pt.TargetPort.StrVal = intern(pt.TargetPort.StrVal)
				}
			}
			return out
		})
	}
}

// Parts of a Service's spec repeat across Services as label sets do: most
// ClusterIP Services have one of a few port lists ("http" 80 to 8080), one
// IP family list and policy. sharedSpec hands out one of each for the
// objects the transform keeps, bounded as label sets are; the agent and the
// caches only read them.
var sharedSpec = struct {
	ports          *shareTable[[]corev1.ServicePort]
	families       *shareTable[[]corev1.IPFamily]
	familyPolicy   *shareTable[*corev1.IPFamilyPolicy]
	internalPolicy *shareTable[*corev1.ServiceInternalTrafficPolicy]
}{newShareTable[[]corev1.ServicePort](labelSetMax), newShareTable[[]corev1.IPFamily](64),
	newShareTable[*corev1.IPFamilyPolicy](64), newShareTable[*corev1.ServiceInternalTrafficPolicy](64)}

// shareTable holds one value per key, at most max of them: when full, an
// arbitrary one is forgotten (the objects holding it keep it).
type shareTable[T any] struct {
	mu  sync.Mutex
	m   map[string]T
	max int
}

func newShareTable[T any](max int) *shareTable[T] {
	return &shareTable[T]{m: map[string]T{}, max: max}
}

// len is the values the table holds.
func (t *shareTable[T]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// share returns the value held for key, made by mk if there is none.
func (t *shareTable[T]) share(key string, mk func() T) T {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.m[key]; ok {
		return v
	}
	v := mk()
	if len(t.m) >= t.max {
		for k := range t.m { // an arbitrary one
			delete(t.m, k)
			break
		}
	}
	t.m[key] = v
	return v
}

// writeKey writes s length-prefixed (a key unambiguous whatever s holds).
func writeKey(b *strings.Builder, s string) {
	b.WriteString(strconv.Itoa(len(s)))
	b.WriteByte(':')
	b.WriteString(s)
}

// portsKey is a port list's key among the shared ones: every field of
// every port, in order.
func portsKey(ports []corev1.ServicePort) string {
	var b strings.Builder
	for _, p := range ports {
		writeKey(&b, p.Name)
		writeKey(&b, string(p.Protocol))
		if p.AppProtocol == nil {
			b.WriteByte('-')
		} else {
			writeKey(&b, *p.AppProtocol)
		}
		for _, n := range []int64{int64(p.Port), int64(p.TargetPort.Type), int64(p.TargetPort.IntVal), int64(p.NodePort)} {
			b.WriteString(strconv.FormatInt(n, 10))
			b.WriteByte(',')
		}
		writeKey(&b, p.TargetPort.StrVal)
	}
	return b.String()
}

func internSlice(s *k8sobj.EndpointSlice) {
	s.Namespace = intern(s.Namespace)
	s.InvalidLabels = internMap(s.InvalidLabels) // nil unless a label is invalid
	s.AddressType = discoveryv1.AddressType(intern(string(s.AddressType)))
	for i := range s.Ports {
		internPtr(s.Ports[i].Name)
		if p := s.Ports[i].Protocol; p != nil {
			*p = corev1.Protocol(intern(string(*p)))
		}
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if r := e.TargetRef; r != nil {
			r.Namespace = intern(r.Namespace)
		}
	}
}

// InternObject interns an object the agent read back from its store at a
// restart (agent.Config.RestoreObject) as the transform interns the
// informers' objects: the restored objects are held beside the informers'
// caches until each kind's full set replaces them, and shared strings and
// label sets make that overlap — a restart's peak — smaller. Only interning:
// what the object says is unchanged (an object applied from a file keeps
// what the transform would drop).
func InternObject(o *k8sobj.Object) {
	switch {
	case o.Pod != nil:
		internMeta(o.Pod, true)
		internPod(o.Pod)
	case o.Service != nil:
		internMeta(o.Service, true)
		internService(o.Service)
	case o.EndpointSlice != nil:
		internSlice(o.EndpointSlice)
	case o.NetworkPolicy != nil:
		internMeta(o.NetworkPolicy, true)
	case o.NamespaceObj != nil:
		internMeta(o.NamespaceObj, true)
	}
}
