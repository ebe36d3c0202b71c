package agent

import (
	"slices"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// sliceIndex finds the EndpointSlices of a few Services without a pass over
// every object: the keys of each Service's slices in the committed object
// set (ctlPlane.objs). One change then costs what it touches, not what the
// agent holds (a pass over 20,000 objects per EndpointSlice event capped
// the agent at ~60 Services/s). A Service's keys are a sorted slice, not a
// set: nearly every Service has one or two slices, and a map per Service
// was most of the index.
type sliceIndex map[service.ServiceID][]string

// sliceOwner is the Service an EndpointSlice object belongs to.
func sliceOwner(o k8sobj.Object) (service.ServiceID, bool) {
	es := o.EndpointSlice
	if es == nil {
		return service.ServiceID{}, false
	}
	return service.ServiceID{Namespace: es.Namespace, Name: es.ServiceName}, true
}

// newSliceIndex indexes every slice in objs.
func newSliceIndex(objs map[string]k8sobj.Object) sliceIndex {
	x := sliceIndex{}
	for k, o := range objs {
		x.add(k, o)
	}
	return x
}

func (x sliceIndex) add(key string, o k8sobj.Object) {
	id, ok := sliceOwner(o)
	if !ok {
		return
	}
	keys := x[id]
	if i, found := slices.BinarySearch(keys, key); !found {
		x[id] = slices.Insert(keys, i, key)
	}
}

func (x sliceIndex) remove(key string, o k8sobj.Object) {
	id, ok := sliceOwner(o)
	if !ok {
		return
	}
	keys := x[id]
	i, found := slices.BinarySearch(keys, key)
	switch {
	case !found:
	case len(keys) == 1:
		delete(x, id)
	default:
		x[id] = slices.Delete(keys, i, i+1)
	}
}

// update moves the index over a committed change: prev holds the changed
// keys' earlier versions (absent: new), next the set after the change.
func (x sliceIndex) update(prev, next map[string]k8sobj.Object, changed map[string]bool) {
	for k := range changed {
		if o, ok := prev[k]; ok {
			x.remove(k, o)
		}
		if o, ok := next[k]; ok {
			x.add(k, o)
		}
	}
}

// slicesFor returns the EndpointSlices in objs of the given services, each
// service's in key order. objs is the indexed set changed at the keys of
// changed (nil: unchanged): their slices are looked at too, and every
// candidate is checked against objs.
func (x sliceIndex) slicesFor(objs map[string]k8sobj.Object, changed map[string]bool, ids []service.ServiceID) map[service.ServiceID][]*k8sobj.EndpointSlice {
	var moved map[service.ServiceID][]string
	if len(changed) > 0 {
		moved = map[service.ServiceID][]string{}
		for k := range changed {
			if id, ok := sliceOwner(objs[k]); ok {
				moved[id] = append(moved[id], k)
			}
		}
	}
	out := make(map[service.ServiceID][]*k8sobj.EndpointSlice, len(ids))
	var keys []string
	for _, id := range ids {
		keys = append(keys[:0], x[id]...)
		keys = append(keys, moved[id]...)
		slices.Sort(keys)
		keys = slices.Compact(keys)
		for _, k := range keys {
			o, ok := objs[k]
			if owner, isSlice := sliceOwner(o); ok && isSlice && owner == id {
				out[id] = append(out[id], o.EndpointSlice)
			}
		}
	}
	return out
}
