package main

// Starting without the API server. What the agent takes from its Node at
// start (pod CIDRs, zone, uplink) is kept in the state store. When a
// restarted agent cannot reach the API server within apiStartWait and the
// store holds them, it starts from them at once: it serves the CNI socket,
// re-adopts its endpoints and VMs (their backends are not left to die with
// a container the liveness probe kills), reports itself not ready with the
// reason, and keeps trying the API server in the background. Once the Node
// answers with the same pod CIDRs, the Kubernetes source starts as on a
// normal start. A Node whose pod CIDRs differ is said loudly and follows
// the store's policy for a pod CIDR change (ipam.ErrCIDRChanged): with no
// address allocated the agent exits so that its restart takes the Node's;
// with allocations it keeps serving them, not ready, rather than take its
// pods' and VMs' network down. A first start (nothing stored) waits for the
// Node: there is nothing to serve.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/k8s"
	"github.com/lanekit/lanekit/pkg/store"
)

const (
	// apiStartWait is how long a start with stored node facts waits for the
	// API server before starting from them.
	apiStartWait = 5 * time.Second
	// apiRetryWait bounds one background attempt to read the Node.
	apiRetryWait = 10 * time.Second
	// apiRetryPause is the pause between background attempts.
	apiRetryPause = 2 * time.Second
)

// nodeFacts is what the agent took from its Node (the store's Meta bucket,
// key nodeFactsKey).
type nodeFacts struct {
	Node     string `json:"node"`
	PodCIDR  string `json:"podCIDR,omitempty"`  // IPv4; empty on an IPv6-only node
	PodCIDR6 string `json:"podCIDR6,omitempty"` // empty on an IPv4-only node
	Zone     string `json:"zone,omitempty"`
	Uplink   string `json:"uplink,omitempty"` // from the Node's InternalIP; empty with --uplink
}

var nodeFactsKey = []byte("k8s-node")

// fromNode reads the node's facts from its Node, waiting for its pod CIDR;
// flag4 and flag6 (--pod-cidr) must agree with it. With lookupUplink (no
// --uplink), the uplink is the device with the Node's InternalIP.
func (f kubeFlags) fromNode(ctx context.Context, kc *kubeClients, flag4, flag6 string, lookupUplink bool, hostNetns string, log *slog.Logger) (nodeFacts, error) {
	nf := nodeFacts{Node: f.nodeName}
	cidr, err := k8s.WaitPodCIDR(ctx, kc.client, f.nodeName, log)
	if err != nil {
		return nf, fmt.Errorf("pod CIDR of node %s: %w", f.nodeName, err)
	}
	if nf.PodCIDR, nf.PodCIDR6, err = nodeFamilies(f.nodeName, cidr, flag4, flag6); err != nil { // podcidr.go
		return nf, err
	}
	if nf.PodCIDR != "" { // dual-stack: the IPv6 one is the Node's second spec.podCIDRs entry
		if nf.PodCIDR6, err = f.nodePodCIDR6(ctx, kc, nf.PodCIDR6); err != nil {
			return nf, err
		}
	}
	// Topology hints (trafficDistribution) name nodes and zones.
	if nf.Zone, err = k8s.NodeZone(ctx, kc.client, f.nodeName); err != nil {
		return nf, err
	}
	if lookupUplink {
		// The device with the Node's InternalIP carries pod traffic
		// between nodes (native routing).
		if nf.Uplink, err = k8s.NodeUplink(ctx, kc.client, f.nodeName, hostNetns); err != nil {
			return nf, fmt.Errorf("--uplink not given: %w", err)
		}
	}
	return nf, nil
}

// startFacts returns the node's facts for the agent's start: from the Node,
// stored for the next start; or, when the API server does not answer within
// apiStartWait and the store has usable facts of this node, the stored ones
// (offline true).
func (f kubeFlags) startFacts(ctx context.Context, kc *kubeClients, stateDir, flag4, flag6, uplink, hostNetns string, log *slog.Logger) (nf nodeFacts, offline bool, err error) {
	stored, ok, err := loadNodeFacts(stateDir, f.nodeName)
	if err != nil {
		log.Warn("stored node facts unreadable: waiting for the API server", "err", err)
		ok = false
	}
	switch {
	case !ok:
	case stored.Uplink == "" && uplink == "":
		ok = false // nothing says which device is the uplink
	case flag4 != "" && flag4 != stored.PodCIDR, flag6 != "" && flag6 != stored.PodCIDR6:
		log.Warn("--pod-cidr differs from the stored pod CIDRs: waiting for the API server", "stored", stored.PodCIDR, "stored6", stored.PodCIDR6)
		ok = false
	}
	wctx := ctx
	if ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, apiStartWait)
		defer cancel()
	}
	nf, err = f.fromNode(wctx, kc, flag4, flag6, uplink == "", hostNetns, log)
	if err == nil {
		log.Info("pod CIDR from the Node", "node", f.nodeName, "pod_cidr", nf.PodCIDR, "pod_cidr6", nf.PodCIDR6)
		if err := saveNodeFacts(stateDir, nf); err != nil {
			log.Warn("store node facts (a restart without the API server will wait for it)", "err", err)
		}
		return nf, false, nil
	}
	if !ok || ctx.Err() != nil {
		return nf, false, err
	}
	log.Warn("API server not reachable: starting from the stored pod CIDR; not ready until the Node answers",
		"node", f.nodeName, "pod_cidr", stored.PodCIDR, "pod_cidr6", stored.PodCIDR6, "err", err)
	return stored, true, nil
}

// loadNodeFacts reads node's stored facts. Without a record (an agent from
// before it was kept), the pod CIDRs the address pools recorded do, without
// zone or uplink. ok is false when nothing is stored for node.
func loadNodeFacts(stateDir, node string) (nf nodeFacts, ok bool, err error) {
	if _, err := os.Stat(filepath.Join(stateDir, store.FileName)); errors.Is(err, os.ErrNotExist) {
		return nf, false, nil
	}
	st, err := store.Open(stateDir)
	if err != nil {
		return nf, false, err
	}
	defer st.Close()
	err = st.View(func(tx *store.Tx) error {
		if ok, err = tx.Get(store.Meta, nodeFactsKey, &nf); err != nil || ok {
			return err
		}
		// The address pools' records.
		var found4, found6 bool
		if nf.PodCIDR, found4, err = ipam.RecordedPrefix(tx, false); err != nil {
			return err
		}
		nf.PodCIDR6, found6, err = ipam.RecordedPrefix(tx, true)
		nf.Node, ok = node, found4 || found6
		return err
	})
	if err != nil || !ok || nf.Node != node {
		return nodeFacts{}, false, err
	}
	return nf, true, nil
}

// saveNodeFacts stores nf for the next start.
func saveNodeFacts(stateDir string, nf nodeFacts) error {
	st, err := store.Open(stateDir)
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Update(func(tx *store.Tx) error { return tx.Put(store.Meta, nodeFactsKey, nf) })
}

// apiReady is the "api-server" readiness condition of an agent started
// from stored facts.
type apiReady struct {
	mu  sync.Mutex
	err error
}

func (r *apiReady) check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *apiReady) set(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// runWhenReachable is the background half of a start from stored facts
// (started): it reads the Node until the API server answers, then runs the
// Kubernetes source until ctx ends, or handles a pod CIDR change (see the
// top of the file). It returns an error only when the agent must exit.
func (f kubeFlags) runWhenReachable(ctx context.Context, kc *kubeClients, started nodeFacts, a *agent.Agent, hostNetns string, log *slog.Logger) error {
	ready := &apiReady{err: fmt.Errorf("API server not reachable (serving the stored pod CIDR %s)", describeCIDRs(started))}
	a.AddReadyCheck("api-server", ready.check)
	var nf nodeFacts
	for {
		c, cancel := context.WithTimeout(ctx, apiRetryWait)
		var err error
		nf, err = f.fromNode(c, kc, "", "", false, hostNetns, log)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		ready.set(fmt.Errorf("API server not reachable (serving the stored pod CIDR %s): %w", describeCIDRs(started), err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(apiRetryPause):
		}
	}
	if nf.PodCIDR != started.PodCIDR || nf.PodCIDR6 != started.PodCIDR6 {
		msg := fmt.Sprintf("node %s's pod CIDR is %s, the agent serves the stored %s", f.nodeName, describeCIDRs(nf), describeCIDRs(started))
		st, err := a.Status()
		if err == nil && st.IPsAllocated == 0 {
			log.Error("POD CIDR CHANGED: no address is allocated from the stored one; exiting to start with the Node's", "node", f.nodeName,
				"pod_cidr", nf.PodCIDR, "pod_cidr6", nf.PodCIDR6, "stored", started.PodCIDR, "stored6", started.PodCIDR6)
			return errors.New(msg + ": restarting to take the Node's")
		}
		// ipam.ErrCIDRChanged: the addresses pods and VMs hold stay theirs.
		log.Error("POD CIDR CHANGED: addresses of the stored pod CIDR are allocated; serving them, not ready, and not watching the API server "+
			"(drain the node, delete its pods and VMs, restart the agent)", "node", f.nodeName,
			"pod_cidr", nf.PodCIDR, "pod_cidr6", nf.PodCIDR6, "stored", started.PodCIDR, "stored6", started.PodCIDR6)
		ready.set(fmt.Errorf("%s: %w with addresses allocated", msg, ipam.ErrCIDRChanged))
		<-ctx.Done()
		return nil
	}
	log.Info("API server reachable: the Node's pod CIDR is the stored one; starting the Kubernetes source", "node", f.nodeName)
	src, err := startSource(kc, f.nodeName, a, hostNetns, nil, log)
	if err != nil {
		ready.set(fmt.Errorf("kubernetes source: %w", err))
		log.Error("kubernetes source", "err", err)
		<-ctx.Done()
		return nil
	}
	ready.set(nil)
	if err := src.Run(ctx); err != nil && ctx.Err() == nil {
		log.Error("k8s source stopped", "err", err)
	}
	return nil
}

func describeCIDRs(nf nodeFacts) string {
	switch {
	case nf.PodCIDR != "" && nf.PodCIDR6 != "":
		return nf.PodCIDR + "," + nf.PodCIDR6
	case nf.PodCIDR != "":
		return nf.PodCIDR
	}
	return nf.PodCIDR6
}
