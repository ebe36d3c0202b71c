package k8s

import (
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// maxBatch is the most queued changes applied together.
const maxBatch = 512

// moreQueued adds to batch the keys already waiting in the queue, up to
// maxBatch, without waiting for more. The worker is the queue's only
// reader, so a non-empty queue hands out a key at once.
func (s *Source) moreQueued(batch []objKey) []objKey {
	for len(batch) < maxBatch && s.queue.Len() > 0 {
		k, quit := s.queue.Get()
		if quit {
			break
		}
		batch = append(batch, k)
	}
	return batch
}

// applyBatch applies the keys of batch and returns each one's error. The
// deletes go to the agent in one call, then the upserts in one call — each
// one commit: one translation pass, one policy compilation, one store
// transaction (a thousand NetworkPolicies deleted one call each cost the agent
// seconds of CPU: each call compiles every policy left). Full sets and objects
// that do not convert go one by one (as apply does them). If a batched call
// fails, each of its keys is applied on its own, so one bad object refuses
// only itself.
func (s *Source) applyBatch(batch []objKey) []error {
	errs := make([]error, len(batch))
	if len(batch) == 1 {
		errs[0] = s.apply(batch[0])
		return errs
	}
	var upserts, deletes []int
	var objs []k8sobj.Object
	var refs []agent.ObjectRef
	for i, k := range batch {
		if s.deleteOf(k) {
			deletes = append(deletes, i)
			refs = append(refs, agent.ObjectRef{Kind: k.kind, Namespace: k.namespace, Name: k.name})
			continue
		}
		obj, ok := s.upsertOf(k)
		if !ok {
			errs[i] = s.apply(k)
			continue
		}
		upserts = append(upserts, i)
		objs = append(objs, obj)
	}
	// Deletes first: a Service deleted frees the frontends one upserted
	// in the same batch may claim (as when they came one by one, in order).
	if len(refs) > 1 {
		if err := s.cfg.Objects.DeleteObjects(refs); err != nil {
			for _, i := range deletes {
				errs[i] = s.apply(batch[i])
			}
		}
	} else if len(refs) == 1 {
		errs[deletes[0]] = s.apply(batch[deletes[0]])
	}
	if len(objs) == 0 {
		return errs
	}
	if err := s.cfg.Objects.UpsertObjects(objs); err != nil {
		for _, i := range upserts {
			errs[i] = s.apply(batch[i])
		}
	}
	return errs
}

// deleteOf reports whether applying key k deletes its object: one object's
// key (not a full set) that the informer's cache no longer holds.
func (s *Source) deleteOf(k objKey) bool {
	if k.all {
		return false
	}
	_, exists, err := s.cached(k)
	return err == nil && !exists
}

// upsertOf is the object key k upserts: present in the informer's cache
// and valid; ok is false for anything else (a full set, a delete, an
// invalid object), which apply handles.
func (s *Source) upsertOf(k objKey) (k8sobj.Object, bool) {
	if k.all {
		return k8sobj.Object{}, false
	}
	o, exists, err := s.cached(k)
	if err != nil || !exists {
		return k8sobj.Object{}, false
	}
	obj, err := s.object(k.kind, o)
	if err != nil {
		return k8sobj.Object{}, false
	}
	return obj, true
}
