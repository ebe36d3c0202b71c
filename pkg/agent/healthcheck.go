package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// Service health checks, as kube-proxy serves them: a LoadBalancer Service
// with externalTrafficPolicy Local names a healthCheckNodePort, and every
// node answers HTTP on it (any path) with how many ready endpoints of the
// Service it has — 200 when some, 503 when none — so the load balancer sends
// traffic only to nodes that will not drop it (the datapath drops it there:
// no-local-backend). The body is kube-proxy's:
//
//	{"service":{"namespace":"ns","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}
//
// Listeners live in the node's network namespace on every address, opened
// when a Service asks for a port and closed when it no longer does.

// HealthCheck is one served healthCheckNodePort (Agent.HealthChecks).
type HealthCheck struct {
	Service        service.ServiceID
	Port           uint16
	LocalEndpoints int
	// Err is why the port is not served (it is taken), "" when it is.
	Err string
}

type healthChecks struct {
	mu     sync.Mutex
	log    *slog.Logger
	listen func(port uint16) (net.Listener, error)
	byID   map[service.ServiceID]*hcServer
}

type hcServer struct {
	id    service.ServiceID
	port  uint16
	local atomic.Int64
	srv   *http.Server
	err   string
}

// hcBody is kube-proxy's health check answer (pkg/proxy/healthcheck).
type hcBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *hcServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := int(s.local.Load())
	var b hcBody
	b.Service.Namespace, b.Service.Name = s.id.Namespace, s.id.Name
	b.LocalEndpoints, b.ServiceProxyHealthy = n, true
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(n))
	if n > 0 {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	json.NewEncoder(w).Encode(b) //nolint:errcheck // the client went away
}

// sync brings the servers of the Services ids in line with objs: a Service
// that needs a health check gets its port served with its local endpoint
// count; others have theirs closed.
func (h *healthChecks) sync(objs map[string]k8sobj.Object, idx sliceIndex, ids []service.ServiceID, opts service.Options) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var want []service.ServiceID
	for _, id := range ids {
		o, ok := objs[k8sobj.ObjectKey(k8sobj.KindService, id.Namespace, id.Name)]
		if ok && k8sobj.NeedsHealthCheck(o.Service) && o.Service.Spec.HealthCheckNodePort != 0 {
			want = append(want, id)
			continue
		}
		h.stop(id)
	}
	if len(want) == 0 {
		return
	}
	slicesOf := idx.slicesFor(objs, nil, want)
	for _, id := range want {
		svc := objs[k8sobj.ObjectKey(k8sobj.KindService, id.Namespace, id.Name)].Service
		port := uint16(svc.Spec.HealthCheckNodePort)
		n := service.LocalEndpoints(svc, slicesOf[id], opts)
		s := h.byID[id]
		if s != nil && s.port != port {
			h.stop(id)
			s = nil
		}
		if s == nil || s.err != "" {
			h.stop(id)
			s = h.start(id, port)
		}
		s.local.Store(int64(n))
	}
}

// start serves port for id (with h.mu).
func (h *healthChecks) start(id service.ServiceID, port uint16) *hcServer {
	s := &hcServer{id: id, port: port}
	h.byID[id] = s
	for other, o := range h.byID {
		if other != id && o.port == port && o.err == "" {
			s.err = fmt.Sprintf("port %d is served for %s", port, other)
			h.log.Error("health check node port not served", "service", id, "port", port, "err", s.err)
			return s
		}
	}
	ln, err := h.listen(port)
	if err != nil {
		s.err = err.Error()
		h.log.Error("health check node port not served", "service", id, "port", port, "err", err)
		return s
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("health check server", "service", id, "port", port, "err", err)
		}
	}()
	h.log.Info("serving health check node port", "service", id, "port", port)
	return s
}

// stop closes id's server, if any (with h.mu).
func (h *healthChecks) stop(id service.ServiceID) {
	s := h.byID[id]
	if s == nil {
		return
	}
	delete(h.byID, id)
	if s.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.srv.Shutdown(ctx) //nolint:errcheck // closing: the listener is closed either way
		cancel()
		h.log.Info("health check node port closed", "service", id, "port", s.port)
	}
}

// close stops every server.
func (h *healthChecks) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.byID {
		h.stop(id)
	}
}

func (h *healthChecks) list() []HealthCheck {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]HealthCheck, 0, len(h.byID))
	for _, s := range h.byID {
		out = append(out, HealthCheck{Service: s.id, Port: s.port, LocalEndpoints: int(s.local.Load()), Err: s.err})
	}
	slices.SortFunc(out, func(a, b HealthCheck) int { return int(a.Port) - int(b.Port) })
	return out
}

// HealthChecks returns the healthCheckNodePorts the agent serves, by port
// (nil when Config.ServiceHealthChecks is off).
func (a *Agent) HealthChecks() []HealthCheck {
	if a.health == nil {
		return nil
	}
	return a.health.list()
}

// newHealthChecks listens in the node's network namespace.
func (a *Agent) newHealthChecks() *healthChecks {
	return &healthChecks{log: a.log, byID: map[service.ServiceID]*hcServer{}, listen: func(port uint16) (net.Listener, error) {
		var ln net.Listener
		err := a.host.Do(func() error {
			var err error
			ln, err = net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port))))
			return err
		})
		return ln, err
	}}
}

// syncHealthChecks updates the health check servers of the Services ids
// (with a.ctl.mu).
func (a *Agent) syncHealthChecks(ids []service.ServiceID) {
	if a.health != nil {
		a.health.sync(a.ctl.objs, a.ctl.slices, ids, a.ctl.svcOpts)
	}
}
