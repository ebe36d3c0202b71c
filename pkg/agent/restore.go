package agent

import (
	"fmt"
	"sync"
	"time"
)

// A restart at scale: the control plane (every stored Service, slice, pod and
// policy) is restored in the background while the API socket serves, so
// that `lanekit status` and the probes answer — not ready, saying the
// control plane is being restored — instead of timing out. What needs the
// control plane (CNI ADD and DEL: an endpoint's policy; object changes)
// waits for it: the restore holds the control plane's lock from before New
// returns until it is done.

// restoreState is the background restore's outcome.
type restoreState struct {
	done chan struct{} // closed when the restore finished
	err  error         // set before done closes
}

// startRestore creates the control plane and restores it in the
// background; Run returns the restore's error, Close waits for it.
func (a *Agent) startRestore() {
	c := a.newControlPlane()
	c.mu.Lock() // before New returns: nothing sees a control plane not yet restored
	r := &restoreState{done: make(chan struct{})}
	a.restore = r
	go func() {
		start := time.Now()
		err := a.restoreLocked()
		c.mu.Unlock()
		if err == nil {
			// The node's addresses for policy (kubelet probes of pods
			// under an egress default-deny); MaintainOnce retries.
			if herr := a.SyncHostAddrs(); herr != nil {
				a.log.Warn("node addresses for policy", "err", herr)
			}
			a.log.Info("control plane restore done", "took", time.Since(start).Round(time.Millisecond))
		} else {
			err = fmt.Errorf("restore control plane: %w", err)
		}
		r.err = err
		close(r.done)
	}()
}

// restoring says why the agent is not ready while the restore runs ("":
// done, or not started in the background).
func (a *Agent) restoring() string {
	if a.restore == nil {
		return ""
	}
	select {
	case <-a.restore.done:
		return ""
	default:
		return "control plane: restoring the stored Services and policies"
	}
}

// waitRestore waits for the background restore and returns its error.
func (a *Agent) waitRestore() error {
	if a.restore == nil {
		return nil
	}
	<-a.restore.done
	return a.restore.err
}

// DropStorePages takes the state store's pages out of the agent's
// resident set (store.DropMappedPages): a restore reads every stored
// object through the store's mapping, and the pages stay mapped in.
func (a *Agent) DropStorePages() error { return a.st.DropMappedPages() }

// statsWait bounds how long ControlStats waits for the control plane's
// lock before it answers with the last counts: a restore or a full set of
// 30,000 Services holds it for seconds, and Status must answer meanwhile.
const statsWait = 200 * time.Millisecond

// lockWithin takes mu if it is free within d.
func lockWithin(mu *sync.Mutex, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if mu.TryLock() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// errOrNil is the finished restore's error (nil r: none).
func (r *restoreState) errOrNil() error {
	if r == nil {
		return nil
	}
	return r.err
}
