package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
	"github.com/lanekit/lanekit/pkg/store"
)

// The control plane: Kubernetes objects (from `lanekit service|policy apply`
// files or the API-server watchers) are kept in the store and translated into
// the datapath's service and policy maps.
//
// Every change goes through commit: the candidate object set is validated and
// translated in full (service model, policy compilation) before anything is
// stored or programmed, so an invalid batch changes nothing.

// ctlPlane is the agent's service and policy state, guarded by mu.
type ctlPlane struct {
	mu     sync.Mutex
	objs   map[string]k8sobj.Object // by Object.Key
	slices sliceIndex               // the EndpointSlices in objs by Service
	// policySizes are the policy maps' sizes, for their fill (capacity.go).
	policySizes datapath.PolicySizes
	svcOpts     service.Options
	model       *service.Model
	tables      *service.Tables
	// ids lives as long as the agent (and across restarts through the
	// Identities bucket): an endpoint's identity does not change while its
	// label set exists.
	ids       *policy.Identities
	idsStored map[policy.Identity]bool
	idsToSave map[policy.Identity]storedIdentity
	compiled  *policy.Compiled
	// locals is the policy view of this node's endpoints at the last
	// compilation, by endpoint ID.
	locals map[uint32]localEndpoint
	// Updates the datapath failed to apply, retried in order by the
	// maintenance loop before anything newer.
	svcRetry []*service.Update
	polRetry []*policy.Update
	gc       gcStats
	// refused are the objects ReplaceObjects refused, by Object.Key.
	refused map[string]Refusal
	// ignored are the addresses the translation left out on purpose, by
	// service (ignored.go).
	ignored map[service.ServiceID][]service.Ignored
	// egress are the egress limits the datapath holds, by endpoint ID
	// (bandwidth.go; nil until the first apply reads them); fqOn: the
	// uplink has its fq.
	egress map[uint32]uint64
	fqOn   bool
	log    *slog.Logger
}

type gcStats struct {
	runs, removed uint64
	lastErr       string
}

// storedIdentity is what an identity was allocated for (the Identities bucket).
type storedIdentity struct {
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Prefix    string            `json:"prefix,omitempty"` // CIDR identities
}

func newCtlPlane(opts service.Options) *ctlPlane {
	return &ctlPlane{
		objs: map[string]k8sobj.Object{}, slices: sliceIndex{}, svcOpts: opts, model: service.NewModel(opts), tables: service.NewTables(),
		ids: policy.NewIdentities(), idsStored: map[policy.Identity]bool{}, idsToSave: map[policy.Identity]storedIdentity{},
		compiled: &policy.Compiled{}, locals: map[uint32]localEndpoint{}, refused: map[string]Refusal{},
		log: slog.Default(),
	}
}

// kindOf returns the kind of the object o holds.
func kindOf(o k8sobj.Object) k8sobj.Kind {
	switch {
	case o.Service != nil:
		return k8sobj.KindService
	case o.EndpointSlice != nil:
		return k8sobj.KindEndpointSlice
	case o.NetworkPolicy != nil:
		return k8sobj.KindNetworkPolicy
	case o.NamespaceObj != nil:
		return k8sobj.KindNamespace
	case o.Pod != nil:
		return k8sobj.KindPod
	}
	return o.Kind
}

// checkObjects validates a batch: every object on its own (errors name the
// object and the field) and no object twice.
func checkObjects(objs []k8sobj.Object) ([]k8sobj.Object, error) {
	out := make([]k8sobj.Object, len(objs))
	seen := map[string]bool{}
	for i, o := range objs {
		if err := k8sobj.Check(o); err != nil {
			return nil, fmt.Errorf("object %d (%s): %w: %w", i, o, err, ErrInvalid)
		}
		o.Kind = kindOf(o)
		if seen[o.Key()] {
			return nil, fmt.Errorf("object %d (%s): given twice: %w", i, o, ErrInvalid)
		}
		seen[o.Key()] = true
		out[i] = o
	}
	return out, nil
}

// UpsertObjects adds or replaces objects (Service, EndpointSlice,
// NetworkPolicy, Namespace, Pod). All or nothing: if any object is invalid,
// or the resulting set does not translate (two services claiming one
// frontend, ...), the error names the object and field and nothing changes.
func (a *Agent) UpsertObjects(objs []k8sobj.Object) error {
	objs, err := checkObjects(objs)
	if err != nil {
		return fmt.Errorf("upsert objects: %w", err)
	}
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, changed := map[string]k8sobj.Object{}, map[string]bool{}
	for _, o := range objs {
		k := o.Key()
		if p, ok := c.objs[k]; ok && !changed[k] {
			prev[k] = p
		}
		changed[k] = true
	}
	for _, o := range objs {
		c.objs[o.Key()] = o // in place: commit puts prev back if it fails
	}
	if err := a.commit(c.objs, prev, changed, true, ""); err != nil {
		return fmt.Errorf("upsert objects: %w", err)
	}
	for key := range changed {
		delete(c.refused, key)
	}
	return nil
}

// DeleteObject removes one object; deleting what is not there is not an
// error. Cluster-scoped kinds (Namespace) take an empty namespace.
func (a *Agent) DeleteObject(kind k8sobj.Kind, namespace, name string) error {
	return a.DeleteObjects([]ObjectRef{{Kind: kind, Namespace: namespace, Name: name}})
}

// ObjectRef names an object to delete: a kind, its namespace (empty for
// cluster-scoped kinds, and for namespaced ones the default namespace) and
// its name.
type ObjectRef struct {
	Kind            k8sobj.Kind
	Namespace, Name string
}

// DeleteObjects removes objects in one commit (one policy compilation,
// one store transaction, however many there are: a thousand NetworkPolicies
// deleted one commit each cost seconds of CPU); deleting what is not there is
// not an error. All or nothing: an invalid reference, or a commit that fails,
// deletes none of them.
func (a *Agent) DeleteObjects(refs []ObjectRef) error {
	keys := make([]string, 0, len(refs))
	for _, r := range refs {
		k, err := k8sobj.ParseKind(string(r.Kind))
		if err != nil {
			return fmt.Errorf("delete object: %w: %w", err, ErrInvalid)
		}
		ns := r.Namespace
		if !k.Namespaced() {
			ns = ""
		} else if ns == "" {
			ns = k8sobj.DefaultNamespace
		}
		if r.Name == "" {
			return fmt.Errorf("delete %s: name is empty: %w", k, ErrInvalid)
		}
		keys = append(keys, k8sobj.ObjectKey(k, ns, r.Name))
	}
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, changed := map[string]k8sobj.Object{}, map[string]bool{}
	for _, key := range keys {
		delete(c.refused, key)
		if p, ok := c.objs[key]; ok {
			prev[key], changed[key] = p, true
		}
	}
	if len(changed) == 0 {
		return nil
	}
	for key := range changed {
		delete(c.objs, key) // in place: commit puts it back if it fails
	}
	if err := a.commit(c.objs, prev, changed, true, ""); err != nil {
		if len(keys) == 1 {
			return fmt.Errorf("delete %s: %w", keys[0], err)
		}
		return fmt.Errorf("delete %d objects: %w", len(keys), err)
	}
	return nil
}

// Refusal is an object the agent did not take, and why: Err names the object
// and wraps ErrInvalid.
type Refusal struct {
	Object k8sobj.Object
	Err    error
	// By are the keys (Object.Key) of the objects whose change may settle
	// the refusal besides the object's own: the older Services holding the
	// frontends it claims. Only its own change settles an invalid object
	// (By is its key); nil: unknown.
	By []string
}

// ReplaceObjects makes objs the full set of objects of kind (an informer's
// resync): objects of that kind not in objs are deleted. An object the agent
// cannot take is refused on its own and everything else applies atomically:
// an invalid object, one given twice, or a Service claiming a frontend
// (address, port, protocol) an older Service holds — the oldest by
// creationTimestamp, then namespace/name, keeps it, so a restart decides the
// same way. A refused object is not stored (an earlier version of it is
// deleted). The refusals are returned and kept until the next replace of the
// kind, an upsert or a delete of the object (Refused, ControlStats).
//
// The error is for what is not about one object, and then nothing changes:
// an object of another kind (ErrInvalid), the store, or a translation of the
// whole set that fails (the policy's ipBlock capacity). A datapath failure
// is an error too (ErrDatapathPending), but the set is stored, what the
// datapath took is programmed and the rest is retried in the background.
func (a *Agent) ReplaceObjects(kind k8sobj.Kind, objs []k8sobj.Object) ([]Refusal, error) {
	k, err := k8sobj.ParseKind(string(kind))
	if err != nil {
		return nil, fmt.Errorf("replace objects: %w: %w", err, ErrInvalid)
	}
	var refused []Refusal
	take := make([]k8sobj.Object, 0, len(objs))
	seen := map[string]bool{}
	for i, o := range objs {
		if ok := kindOf(o); ok != k {
			return nil, fmt.Errorf("replace %s objects: object %d (%s) is a %s: %w", k, i, o, ok, ErrInvalid)
		}
		if err := k8sobj.Check(o); err != nil {
			refused = append(refused, Refusal{Object: o, Err: fmt.Errorf("%s: %w: %w", o, err, ErrInvalid), By: []string{o.Key()}})
			continue
		}
		o.Kind = k
		if seen[o.Key()] {
			refused = append(refused, Refusal{Object: o, Err: fmt.Errorf("%s: given twice: %w", o, ErrInvalid), By: []string{o.Key()}})
			continue
		}
		seen[o.Key()] = true
		take = append(take, o)
	}
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	// In place, as UpsertObjects: a copy of every object for each full set
	// was the largest part of the initial sync's peak. commit puts prev back
	// if it fails.
	prev, changed := c.replaceInPlace(k, take)
	err = a.commit(c.objs, prev, changed, true, k)
	if errors.Is(err, ErrInvalid) && k == k8sobj.KindService {
		// Services that claim one frontend: the oldest keeps it.
		prev, changed = c.replaceInPlace(k, take)
		if clashes := c.refuseClashes(c.objs, changed, take); len(clashes) > 0 {
			for _, r := range clashes {
				delete(c.objs, r.Object.Key()) // stays in changed: an earlier version goes
			}
			refused = append(refused, clashes...)
			err = a.commit(c.objs, prev, changed, true, k)
		} else {
			c.revert(prev, changed)
		}
	}
	if errors.Is(err, ErrInvalid) {
		return nil, fmt.Errorf("replace %s objects: %w", k, err)
	}
	c.setRefused(k, refused)
	if err != nil {
		return refused, fmt.Errorf("replace %s objects: %w", k, err)
	}
	return refused, nil
}

// replaceInPlace makes objs the full set of kind k in c.objs: objects of
// that kind not in objs are deleted. It returns the earlier versions of the
// keys it changed (absent: new) and the keys (every key of kind k, old or
// new), for commit or revert.
func (c *ctlPlane) replaceInPlace(k k8sobj.Kind, objs []k8sobj.Object) (map[string]k8sobj.Object, map[string]bool) {
	prev := map[string]k8sobj.Object{}
	changed := map[string]bool{}
	for key, o := range c.objs {
		if o.Kind == k {
			prev[key] = o
			changed[key] = true // deleted unless given again
			delete(c.objs, key)
		}
	}
	for _, o := range objs {
		c.objs[o.Key()] = o
		changed[o.Key()] = true
	}
	return prev, changed
}

// refuseClashes decides which of svcs (every Service in next) keep their
// frontends: in age order (creationTimestamp, then namespace/name) each
// Service takes its frontends unless an older one holds one of them; such a
// Service is refused whole, as kube-proxy and Cilium keep the first.
func (c *ctlPlane) refuseClashes(next map[string]k8sobj.Object, changed map[string]bool, svcs []k8sobj.Object) []Refusal {
	order := slices.Clone(svcs)
	slices.SortFunc(order, olderFirst)
	ids := make([]service.ServiceID, len(order))
	for i, o := range order {
		ids[i] = service.ServiceID{Namespace: o.Service.Namespace, Name: o.Service.Name}
	}
	slicesOf := c.slices.slicesFor(next, changed, ids)
	m := service.NewModel(c.svcOpts)
	var out []Refusal
	for i, o := range order {
		if _, err := m.Set(o.Service, slicesOf[ids[i]]); err != nil {
			out = append(out, Refusal{Object: o, Err: fmt.Errorf("%w: %w", err, ErrInvalid), By: holders(m, o, slicesOf[ids[i]], c.svcOpts)})
		}
	}
	return out
}

// holders returns the keys of the Services in m that hold a frontend svc
// claims, and svc's own key.
func holders(m *service.Model, svc k8sobj.Object, eps []*k8sobj.EndpointSlice, opts service.Options) []string {
	by := []string{svc.Key()}
	fes, err := service.Translate(svc.Service, eps, opts)
	if err != nil {
		return by
	}
	for _, f := range fes {
		if h := m.Frontend(f.Key); h != nil {
			by = append(by, k8sobj.ObjectKey(k8sobj.KindService, h.Service.Namespace, h.Service.Name))
		}
	}
	slices.Sort(by)
	return slices.Compact(by)
}

// olderFirst orders objects by creationTimestamp, then namespace and name.
func olderFirst(x, y k8sobj.Object) int {
	return cmp.Or(creationTime(x).Compare(creationTime(y)), cmp.Compare(x.Namespace(), y.Namespace()), cmp.Compare(x.Name(), y.Name()))
}

func creationTime(o k8sobj.Object) time.Time {
	switch {
	case o.Service != nil:
		return o.Service.CreationTimestamp.Time
	case o.EndpointSlice != nil:
		return o.EndpointSlice.CreationTimestamp.Time
	case o.NetworkPolicy != nil:
		return o.NetworkPolicy.CreationTimestamp.Time
	case o.NamespaceObj != nil:
		return o.NamespaceObj.CreationTimestamp.Time
	case o.Pod != nil:
		return o.Pod.CreationTimestamp.Time
	}
	return time.Time{}
}

// setRefused makes rs the refusals of kind k. Called with c.mu.
func (c *ctlPlane) setRefused(k k8sobj.Kind, rs []Refusal) {
	for key, r := range c.refused {
		if r.Object.Kind == k {
			delete(c.refused, key)
		}
	}
	for _, r := range rs {
		c.refused[r.Object.Key()] = r
	}
}

// Refused returns the objects the last ReplaceObjects of their kind refused
// and no upsert or delete has settled since, sorted by key.
func (a *Agent) Refused() []Refusal {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Refusal, 0, len(c.refused))
	for _, key := range slices.Sorted(maps.Keys(c.refused)) {
		out = append(out, c.refused[key])
	}
	return out
}

// Objects returns the stored objects of kind ("" for all), sorted by key.
func (a *Agent) Objects(kind k8sobj.Kind) []k8sobj.Object {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []k8sobj.Object
	for _, key := range slices.Sorted(maps.Keys(c.objs)) {
		if o := c.objs[key]; kind == "" || o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// affectedServices returns the services whose translation depends on the
// changed objects (old or new version).
func affectedServices(old, next map[string]k8sobj.Object, changed map[string]bool) []service.ServiceID {
	set := map[service.ServiceID]bool{}
	add := func(o k8sobj.Object, ok bool) {
		switch {
		case !ok:
		case o.Service != nil:
			set[service.ServiceID{Namespace: o.Service.Namespace, Name: o.Service.Name}] = true
		case o.EndpointSlice != nil:
			set[service.ServiceID{Namespace: o.EndpointSlice.Namespace, Name: o.EndpointSlice.ServiceName}] = true
		case o.Pod != nil && service.HasHostPorts(o.Pod):
			set[service.HostPortID(o.Pod)] = true
		}
	}
	for key := range changed {
		o, ok := old[key]
		add(o, ok)
		o, ok = next[key]
		add(o, ok)
	}
	return slices.SortedFunc(maps.Keys(set), func(x, y service.ServiceID) int {
		if x.Namespace != y.Namespace {
			return compareStr(x.Namespace, y.Namespace)
		}
		return compareStr(x.Name, y.Name)
	})
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// editServices moves the service model to next for the affected services,
// in place: Model.Batch costs what the affected services cost, whatever the
// model holds. It returns the changes and an undo for a later failing step.
// When the batch does not apply on the current model — for example two
// services swap a frontend within one batch — a full build decides, and its
// error is the definitive one.
func (c *ctlPlane) editServices(next map[string]k8sobj.Object, changed map[string]bool, affected []service.ServiceID) (service.Changes, func(), error) {
	if len(affected) == 0 {
		return service.Changes{}, func() {}, nil
	}
	slicesOf := c.slices.slicesFor(next, changed, affected)
	edits := make([]service.Edit, 0, len(affected))
	for _, id := range affected {
		e := service.Edit{ID: id}
		if id.IsHostPort() {
			if o, ok := next[k8sobj.ObjectKey(k8sobj.KindPod, id.Namespace, strings.TrimPrefix(id.Name, service.HostPortPrefix))]; ok {
				e.Pod = o.Pod
			}
		} else if o, ok := next[k8sobj.ObjectKey(k8sobj.KindService, id.Namespace, id.Name)]; ok {
			e.Service, e.Slices = o.Service, slicesOf[id]
		}
		edits = append(edits, e)
	}
	if ch, undo, err := c.model.Batch(edits); err == nil {
		c.logShadowed(c.model, edits)
		c.noteIgnored(edits, false)
		return ch, undo, nil
	}
	m, err := c.buildModel(next)
	if err != nil {
		return service.Changes{}, nil, err
	}
	old := c.model
	ch := service.Diff(old, m)
	c.model = m
	return ch, func() { c.model = old }, nil
}

// buildModel translates every Service in objs, then the hostPorts of this
// node's pods: a hostPort whose frontend a Service (or another pod) holds is
// left out and logged — Services win, as kube-proxy's NodePort rules would
// shadow the portmap plugin's.
func (c *ctlPlane) buildModel(objs map[string]k8sobj.Object) (*service.Model, error) {
	sorted := sortedObjects(objs)
	svcs, eps, _ := k8sobj.Split(sorted)
	m, err := service.Build(svcs, eps, c.svcOpts)
	if err != nil {
		return nil, err
	}
	var edits []service.Edit
	for _, o := range sorted {
		if o.Pod != nil && service.HasHostPorts(o.Pod) {
			edits = append(edits, service.Edit{ID: service.HostPortID(o.Pod), Pod: o.Pod})
		}
	}
	if _, _, err := m.Batch(edits); err != nil {
		return nil, err
	}
	c.logShadowed(m, edits)
	c.noteIgnored(allEdits(objs), true)
	return m, nil
}

// logShadowed warns about the hostPorts of the edited pods that a Service
// holds instead.
func (c *ctlPlane) logShadowed(m *service.Model, edits []service.Edit) {
	for _, e := range edits {
		if e.Pod == nil {
			continue
		}
		for _, k := range m.Shadowed(e.Pod) {
			c.log.Warn("hostPort not programmed: a Service holds the address and port", "pod", e.ID.Namespace+"/"+e.Pod.Name, "frontend", k.String())
		}
	}
}

func splitSlices(objs map[string]k8sobj.Object) map[service.ServiceID][]*k8sobj.EndpointSlice {
	out := map[service.ServiceID][]*k8sobj.EndpointSlice{}
	for _, key := range slices.Sorted(maps.Keys(objs)) {
		if es := objs[key].EndpointSlice; es != nil {
			id := service.ServiceID{Namespace: es.Namespace, Name: es.ServiceName}
			out[id] = append(out[id], es)
		}
	}
	return out
}

func sortedObjects(objs map[string]k8sobj.Object) []k8sobj.Object {
	out := make([]k8sobj.Object, 0, len(objs))
	for _, key := range slices.Sorted(maps.Keys(objs)) {
		out = append(out, objs[key])
	}
	return out
}

// policyKinds are the kinds policy compilation reads.
func policyRelevant(o k8sobj.Object) bool {
	return o.NetworkPolicy != nil || o.Pod != nil || o.NamespaceObj != nil
}

// commit moves the control plane to next: translate everything first (an
// error leaves the agent as it was), then store the changed objects and new
// identities in one transaction, then program the datapath. prev holds the
// changed keys' earlier versions (absent: new). With inPlace, next is c.objs
// already edited (no copy of every object per change): a failure before the
// store puts prev back. With full, changed is every key of that kind (a
// full set): a large one is stored through store.ReplaceKind. Called with
// c.mu.
func (a *Agent) commit(next, prev map[string]k8sobj.Object, changed map[string]bool, inPlace bool, full k8sobj.Kind) (err error) {
	c := a.ctl
	stored := false
	if inPlace {
		defer func() {
			if !stored {
				c.revert(prev, changed)
			}
		}()
	}
	affected := affectedServices(prev, next, changed)
	svcChanges, undoServices, err := c.editServices(next, changed, affected)
	if err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	recompile := false
	for key := range changed {
		if o, ok := prev[key]; ok && policyRelevant(o) {
			recompile = true
		}
		if o, ok := next[key]; ok && policyRelevant(o) {
			recompile = true
		}
	}
	compiled, locals := c.compiled, c.locals
	if recompile {
		if compiled, locals, err = a.compilePolicy(next); err != nil {
			undoServices()
			return err
		}
	}
	err = a.storeObjects(next, changed, full)
	if err != nil {
		undoServices()
		return fmt.Errorf("store objects: %w", err)
	}
	stored = true
	c.markIdentitiesSaved()
	c.slices.update(prev, next, changed)
	c.objs = next
	a.syncHealthChecks(affected)
	svcUpd := c.tables.Apply(svcChanges)
	var errs []error
	if err := a.applyServices(svcUpd); err != nil {
		errs = append(errs, err)
	}
	if recompile {
		polUpd := policy.Diff(c.compiled, compiled)
		old := c.locals
		c.compiled, c.locals = compiled, locals
		if err := a.applyPolicy(polUpd); err != nil {
			errs = append(errs, err)
		}
		if err := a.applyBandwidth(old, locals); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrDatapathPending, errors.Join(errs...))
	}
	return nil
}

// stageMin is the size of a full set from which commit stores it through
// store.ReplaceKind: in transactions of a bounded size swapped in at once,
// not one transaction holding every object's JSON and then a page for it
// until its commit (the largest part of the initial sync's peak).
const stageMin = 4096

// storeObjects stores the changed objects (absent from next: deleted) and
// the identities not saved yet, atomically. full: changed is kind full's
// whole set.
func (a *Agent) storeObjects(next map[string]k8sobj.Object, changed map[string]bool, full k8sobj.Kind) error {
	c := a.ctl
	if full != "" && len(changed) >= stageMin {
		keys := make([]string, 0, len(changed))
		for key := range changed {
			if _, ok := next[key]; ok {
				keys = append(keys, key)
			}
		}
		slices.Sort(keys) // bbolt writes sorted keys best
		return a.st.ReplaceKind(string(full), len(keys), func(i int) ([]byte, json.RawMessage, error) {
			raw, err := k8sobj.EncodeJSON(next[keys[i]])
			return []byte(keys[i]), raw, err
		}, c.saveIdentitiesTx)
	}
	return a.st.Update(func(tx *store.Tx) error {
		for key := range changed {
			o, ok := next[key]
			if !ok {
				if err := tx.Delete(store.Objects, []byte(key)); err != nil {
					return err
				}
				continue
			}
			raw, err := k8sobj.EncodeJSON(o)
			if err != nil {
				return err
			}
			if err := tx.PutRawIfChanged(store.Objects, []byte(key), raw); err != nil {
				return err
			}
		}
		return c.saveIdentitiesTx(tx)
	})
}

// revert puts the changed keys of c.objs back to prev (absent: deleted).
func (c *ctlPlane) revert(prev map[string]k8sobj.Object, changed map[string]bool) {
	for k := range changed {
		if o, ok := prev[k]; ok {
			c.objs[k] = o
		} else {
			delete(c.objs, k)
		}
	}
}

// ApplyObjects decodes a YAML or JSON file of objects with k8sobj (strict,
// validated; the same code the CLI and the watchers use) and upserts them all
// or none. It returns what was applied.
func (a *Agent) ApplyObjects(data []byte) ([]k8sobj.Object, error) {
	objs, err := k8sobj.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("apply objects: %w: %w", err, ErrInvalid)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("apply objects: no objects in the input: %w", ErrInvalid)
	}
	if err := a.UpsertObjects(objs); err != nil {
		return nil, err
	}
	return objs, nil
}

func wrapInvalid(err error) error { return fmt.Errorf("%w: %w", err, ErrInvalid) }

// hasObject reports whether the object is stored.
func (a *Agent) hasObject(kind k8sobj.Kind, ns, name string) bool {
	if !kind.Namespaced() {
		ns = ""
	} else if ns == "" {
		ns = k8sobj.DefaultNamespace
	}
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.objs[k8sobj.ObjectKey(kind, ns, name)]
	return ok
}
