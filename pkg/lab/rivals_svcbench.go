package lab

// lab bench --cni --services: the Service rows of a real-node lab, whatever
// its network: the services are real API objects (selectorless Services
// with their EndpointSlices, bench.SvcSet), programmed by the cluster's own
// proxy (kube-proxy's iptables or nftables rules, lanekit's agents), the
// client and backends are the bench pods (rivals_bench.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/pkg/bench"
)

// APIProgrammer programs a SvcSet through the API server and times what a
// user waits for: a new Service's first answer from a client pod.
type APIProgrammer struct {
	Client   kubernetes.Interface
	Self     string // lanekit, for `lab first-answer` in the client's netns
	ClientNS string
	// Workers write the untimed services concurrently.
	Workers int
	// Metrics, when set, is the proxy's own programming histograms, read
	// around the timed write (ProxyMetrics).
	Metrics *proxyScrape

	metrics     []bench.ProxyMetric
	metricsNote string
}

// ProxyMetrics is what the proxy's own histograms recorded of the last
// Program's timed write (bench.ProxyMetricsReader).
func (a *APIProgrammer) ProxyMetrics() ([]bench.ProxyMetric, string) {
	return a.metrics, a.metricsNote
}

// ProgramLabel says what Program times.
func (a *APIProgrammer) ProgramLabel() string {
	return "API create of the client's Service + EndpointSlice to its first answer in the client pod, the other services already programmed"
}

// ChangeLabel: changes are not timed (not observable from the client).
func (a *APIProgrammer) ChangeLabel() string { return "not timed (API rows)" }

// Change is not timed on API rows: the changed service's endpoints are not
// reachable, so no client can see when the change took effect.
func (a *APIProgrammer) Change(context.Context, *bench.SvcSet, *bench.SvcSet, int) (time.Duration, error) {
	return 0, bench.ErrChangeNotTimed
}

// Clear removes nothing: the rows share the lab's services (nested sets,
// ascending counts) and the lab goes down after them.
func (a *APIProgrammer) Clear(context.Context) error { return nil }

// Program writes every service of set but the client's (existing ones are
// kept), lets the datapath take them in (the client's service created and
// answered, then deleted until it no longer answers), and then times the
// client's service from its creation to its first answer.
func (a *APIProgrammer) Program(ctx context.Context, set *bench.SvcSet, limit time.Duration) (time.Duration, error) {
	used := set.Services[set.Used]
	if err := a.ensureNamespace(ctx, used.Namespace); err != nil {
		return 0, err
	}
	// Services an earlier (smaller, nested) set wrote are kept: the API
	// server refuses a second create of one by its cluster IP (Invalid,
	// "already allocated") before it checks the name.
	existing := map[string]bool{}
	list, err := a.Client.CoreV1().Services(used.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list services: %w", err)
	}
	for _, svc := range list.Items {
		existing[svc.Name] = true
	}
	var idx []int
	for i := range set.Services {
		if i != set.Used && !existing[set.Services[i].Name] {
			idx = append(idx, i)
		}
	}
	if err := a.createAll(ctx, set, idx); err != nil {
		return 0, err
	}
	// The probes go to the RR port, not to the one conn/s measures: while
	// the Service is gone, a probe's SYN leaves a conntrack entry without
	// NAT in a netfilter datapath (kube-proxy's iptables mode does not
	// reject a ClusterIP it has no rules for; its nftables mode does), and
	// conn/s, cycling through the client's ephemeral ports to that VIP and
	// port, would later send each SYN that reuses such a tuple to the VIP
	// untranslated: a one-second dial timeout each (measured: 4 per run,
	// kube-proxy-iptables at 806-925 conn/s). RR uses one connection.
	probe := used.Ports[len(used.Ports)-1]
	for _, p := range used.Ports {
		if p.Name == bench.SvcPortRR {
			probe = p
		}
	}
	vip := netip.AddrPortFrom(used.IP, uint16(probe.Port)).String()
	// Settle: everything programmed once (the client's service answers),
	// then the client's service gone from the datapath again.
	if err := a.deleteService(ctx, set, set.Used); err != nil {
		return 0, err
	}
	if _, err := a.timeCreate(ctx, set, vip, limit); err != nil {
		return 0, fmt.Errorf("settle: %w", err)
	}
	if err := a.deleteService(ctx, set, set.Used); err != nil {
		return 0, err
	}
	if err := a.waitNoAnswer(ctx, vip, limit); err != nil {
		return 0, err
	}
	a.metrics, a.metricsNote = nil, ""
	var before map[string]map[string]histTotal
	if a.Metrics != nil {
		if before, err = a.Metrics.read(ctx); err != nil {
			a.metricsNote = fmt.Sprintf("not read before the write: %v", err)
		}
	}
	d, err := a.timeCreate(ctx, set, vip, limit)
	if err == nil && before != nil {
		a.metrics, a.metricsNote = a.Metrics.since(ctx, before, 5*time.Second)
	}
	return d, err
}

func (a *APIProgrammer) ensureNamespace(ctx context.Context, ns string) error {
	_, err := a.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	return nil
}

// create writes service i and its EndpointSlice (an existing one is kept).
func (a *APIProgrammer) create(ctx context.Context, set *bench.SvcSet, i int) error {
	svc, slice := set.Objects(i)
	// The change's time, as the endpointslice controller stamps it on the
	// slices it writes: kube-proxy's (and lanekit's) network programming
	// latency is measured from it.
	if slice.Annotations == nil {
		slice.Annotations = map[string]string{}
	}
	slice.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	if _, err := a.Client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service %s: %w", svc.Name, err)
	}
	if _, err := a.Client.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("endpointslice %s: %w", slice.Name, err)
	}
	return nil
}

func (a *APIProgrammer) createAll(ctx context.Context, set *bench.SvcSet, idx []int) error {
	workers := max(a.Workers, 1)
	next := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := a.create(ctx, set, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, i := range idx {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d services not written, first: %w", len(errs), len(idx), errs[0])
	}
	return ctx.Err()
}

func (a *APIProgrammer) deleteService(ctx context.Context, set *bench.SvcSet, i int) error {
	svc, slice := set.Objects(i)
	if err := a.Client.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service %s: %w", svc.Name, err)
	}
	if err := a.Client.DiscoveryV1().EndpointSlices(slice.Namespace).Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete endpointslice %s: %w", slice.Name, err)
	}
	return nil
}

// timeCreate starts the first-answer probe in the client's netns, creates
// the client's service and returns the time from the API write to the
// probe's first answer.
func (a *APIProgrammer) timeCreate(ctx context.Context, set *bench.SvcSet, vip string, limit time.Duration) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a.ClientNS, a.Self, "lab", "first-answer", "--addr", vip, "--for", limit.String())
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := a.create(ctx, set, set.Used); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, err
	}
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("first answer from %s in %s: %w: %s", vip, a.ClientNS, err, strings.TrimSpace(errb.String()))
	}
	var res struct {
		UnixNano int64 `json:"unix_ns"`
	}
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
		return 0, fmt.Errorf("first-answer output %q: %w", out.String(), err)
	}
	d := time.Unix(0, res.UnixNano).Sub(start)
	if d < 0 {
		// Answered before the write: a stale datapath entry, not a measurement.
		return 0, fmt.Errorf("%s answered %s before its Service was written", vip, -d)
	}
	return d, nil
}

// waitNoAnswer waits until vip no longer answers from the client's netns.
func (a *APIProgrammer) waitNoAnswer(ctx context.Context, vip string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		err := exec.CommandContext(ctx, "ip", "netns", "exec", a.ClientNS, a.Self, "lab", "first-answer", "--addr", vip, "--for", "300ms").Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil // no answer any more
		}
		if err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s still answers %s after its Service was deleted", vip, limit)
}

// rivalServiceRows are the service rows of a real-node lab: one per count,
// the client pod to a service whose endpoints are the two server pods.
func rivalServiceRows(cni string, counts []int, pods map[string]corev1.Pod, prog *APIProgrammer, raw *bench.SvcRaw) ([]bench.SvcPath, error) {
	var backends []bench.SvcBackend
	for _, bp := range benchPods[1:] {
		a, err := netip.ParseAddr(pods[bp.Name].Status.PodIP)
		if err != nil {
			return nil, fmt.Errorf("bench pod %s: %w", bp.Name, err)
		}
		backends = append(backends, bench.SvcBackend{NS: bp.Netns, IP: a})
	}
	cidr := netip.MustParsePrefix(ClusterCIDR)
	inc := IncludesLanekitPod
	if r, ok, _ := rivalFor(cni, ""); ok {
		inc = r.svcPath()
	}
	var out []bench.SvcPath
	for _, n := range counts {
		out = append(out, bench.SvcPath{Mode: cni, Services: n, ClientNS: benchPods[0].Netns, Backends: backends,
			NodeNS: NodeNS(1), ClusterCIDR: cidr, Includes: inc, Prog: prog, Shared: true, Raw: raw})
	}
	return out, nil
}

// firstAnswerJSON is `lab first-answer`'s output.
func firstAnswerJSON(t time.Time) string {
	return `{"unix_ns":` + strconv.FormatInt(t.UnixNano(), 10) + "}"
}

// FirstAnswerJSON runs bench.FirstAnswer and renders its result (the hidden
// `lab first-answer` command).
func FirstAnswerJSON(ctx context.Context, addr string, limit time.Duration) (string, error) {
	t, err := bench.FirstAnswer(ctx, addr, limit)
	if err != nil {
		return "", err
	}
	return firstAnswerJSON(t), nil
}
