package k8s

import (
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// objectStore is an ObjectSink that keeps what the agent would: objects by
// key, with the seam's semantics (replace = the full set of a kind, objects
// refused on their own).
type objectStore struct {
	mu       sync.Mutex
	objs     map[string]k8sobj.Object
	replaces map[k8sobj.Kind]int
	upserts  []string // keys upserted one by one (not by a replace)
	fail     error    // returned by every call while set
	// pending: returned by ReplaceObjects after taking the set, as the
	// agent returns agent.ErrDatapathPending.
	pending error
	// refuse: objects by key the store refuses (agent.ErrInvalid) as the
	// agent refuses a Service clashing with an older one.
	refuse map[string]bool
	// deleteCalls: the number of objects of each DeleteObjects call.
	deleteCalls []int
}

func newObjectStore() *objectStore {
	return &objectStore{objs: map[string]k8sobj.Object{}, replaces: map[k8sobj.Kind]int{}, refuse: map[string]bool{}}
}

func (s *objectStore) UpsertObjects(objs []k8sobj.Object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	for _, o := range objs {
		if err := s.refusal(o); err != nil {
			return err
		}
	}
	for _, o := range objs {
		s.objs[o.Key()] = o
	}
	for _, o := range objs {
		s.upserts = append(s.upserts, o.Key())
	}
	return nil
}

// refusal is why the store refuses o (nil: it takes it). Called with mu.
func (s *objectStore) refusal(o k8sobj.Object) error {
	if err := k8sobj.Validate(o); err != nil {
		return fmt.Errorf("%s: %w: %w", o, err, agent.ErrInvalid)
	}
	if s.refuse[o.Key()] {
		return fmt.Errorf("%s: refused by the test: %w", o, agent.ErrInvalid)
	}
	return nil
}

func (s *objectStore) setRefuse(key string, refuse bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse[key] = refuse
}

func (s *objectStore) DeleteObject(kind k8sobj.Kind, ns, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	delete(s.objs, k8sobj.ObjectKey(kind, ns, name))
	return nil
}

func (s *objectStore) DeleteObjects(refs []agent.ObjectRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	for _, r := range refs {
		delete(s.objs, k8sobj.ObjectKey(r.Kind, r.Namespace, r.Name))
	}
	s.deleteCalls = append(s.deleteCalls, len(refs))
	return nil
}

func (s *objectStore) ReplaceObjects(kind k8sobj.Kind, objs []k8sobj.Object) ([]agent.Refusal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	for _, o := range objs {
		if o.Kind != kind {
			return nil, fmt.Errorf("replace %s got %s", kind, o)
		}
	}
	for k, o := range s.objs {
		if o.Kind == kind {
			delete(s.objs, k)
		}
	}
	var refused []agent.Refusal
	for _, o := range objs {
		if err := s.refusal(o); err != nil {
			refused = append(refused, agent.Refusal{Object: o, Err: err})
			continue
		}
		s.objs[o.Key()] = o
	}
	s.replaces[kind]++
	return refused, s.pending
}

func (s *objectStore) has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.objs[key]
	return ok
}

func (s *objectStore) get(key string) (k8sobj.Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	return o, ok
}

func (s *objectStore) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.objs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// routeStore is a RouteSink that keeps the last set.
type routeStore struct {
	mu     sync.Mutex
	routes []Route
	syncs  int
}

func (r *routeStore) SyncRoutes(routes []Route) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routes = append([]Route(nil), routes...)
	r.syncs++
	return nil
}

func (r *routeStore) get() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Route(nil), r.routes...)
}

// vmStore is a VMSink: it keeps the resolver the source hands it.
type vmStore struct {
	mu       sync.Mutex
	resolver agent.VMIResolver
}

func (v *vmStore) SetVMIResolver(r agent.VMIResolver) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.resolver = r
}

func (v *vmStore) resolve(ns, name, uid string) (agent.VMIInfo, bool, error) {
	v.mu.Lock()
	r := v.resolver
	v.mu.Unlock()
	if r == nil {
		return agent.VMIInfo{}, false, fmt.Errorf("no resolver set")
	}
	return r(ns, name, uid)
}

// eventually polls cond for up to 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
	}
}

func testLog() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("LANEKIT_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}
