package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lanekit/lanekit/internal/unixhttp"
)

// The wire→guest direction: a generator transmits on the wire side of the
// backend's veth; the frontend (virtio_user, rxonly) counts what the backend
// put into the guest's queue. testpmd prints its port statistics every
// second (--stats-period 1); each "RX-packets:" line is a sample of the
// cumulative count, timestamped as it arrives.

// rxSample is the frontend's cumulative received frames at a moment.
type rxSample struct {
	n uint64
	t time.Time
}

// driveRX runs the rxonly frontend on sock and the generator on wire, and
// returns the frames/s the frontend received over the window that starts
// once the generator runs, and the frames counted in the window.
func (b *backendBench) driveRX(ctx context.Context, sock, wire string, size int) (float64, uint64, error) {
	life := b.o.Duration + 2*backendReady + backendSlack
	fe, err := startProc(ctx, life, "frontend", "stdbuf", "-oL", "-eL", b.o.Testpmd,
		"--lcores", "0@0,1@0", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", b.prefixes[0],
		"--vdev", "net_virtio_user0,path="+sock+",queues=1", "--",
		"--total-num-mbufs=16384", "--forward-mode=rxonly", "--stats-period", "1")
	if err != nil {
		return 0, 0, err
	}
	// With a stats period testpmd ignores stdin until a signal.
	defer fe.term(2 * time.Second)
	samples := rxSamples(fe)
	if _, err := nextSample(samples, fe, backendReady, time.Time{}); err != nil {
		return 0, 0, err
	}
	gen, err := startProc(ctx, life, "generator", "ip", "netns", "exec", b.ns, "stdbuf", "-oL", "-eL", b.o.Testpmd,
		"--lcores", "0@0,1@0", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", b.prefixes[2],
		"--vdev", "net_af_packet0,iface="+wire+",qpairs=1,qdisc_bypass=1", "--",
		"--total-num-mbufs=16384", "--forward-mode=txonly", "--txpkts="+strconv.Itoa(size),
		"--eth-peer=0,"+benchVMMAC.String(), "--stats-period", "0")
	if err != nil {
		return 0, 0, err
	}
	defer gen.stop(2 * time.Second)
	if err := gen.waitLine(pressEnter, backendReady); err != nil {
		return 0, 0, err
	}
	started := time.Now()
	s0, err := nextSample(samples, fe, 5*time.Second, started)
	if err != nil {
		return 0, 0, err
	}
	s1, err := nextSample(samples, fe, b.o.Duration+5*time.Second, s0.t.Add(b.o.Duration))
	if err != nil {
		return 0, 0, err
	}
	select {
	case <-gen.done:
		return 0, 0, fmt.Errorf("generator exited during the window (%v): %s", gen.err, gen.log.last())
	default:
	}
	if s1.n <= s0.n {
		return 0, 0, fmt.Errorf("no frames reached the guest in %s", s1.t.Sub(s0.t).Round(time.Millisecond))
	}
	return float64(s1.n-s0.n) / s1.t.Sub(s0.t).Seconds(), s1.n - s0.n, nil
}

// rxSamples turns p's output into samples as the lines arrive.
func rxSamples(p *proc) <-chan rxSample {
	ch := make(chan rxSample, 1024)
	go func() {
		defer close(ch)
		for l := range p.lines {
			if n, ok := ParseTestpmdRxPackets(l); ok {
				select {
				case ch <- rxSample{n: n, t: time.Now()}:
				default: // nobody reads any more
				}
			}
		}
	}()
	return ch
}

// nextSample returns the first sample taken at or after notBefore.
func nextSample(ch <-chan rxSample, p *proc, timeout time.Duration, notBefore time.Time) (rxSample, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case s, ok := <-ch:
			if !ok {
				<-p.done
				return rxSample{}, fmt.Errorf("%s exited (%v): %s", p.name, p.err, p.log.last())
			}
			if !s.t.Before(notBefore) {
				return s, nil
			}
		case <-t.C:
			return rxSample{}, fmt.Errorf("%s: no port statistics after %s: %s", p.name, timeout, p.log.last())
		}
	}
}

// ParseTestpmdRxPackets reads the count of a testpmd port statistics line
// ("  RX-packets: 123  RX-missed: 0  RX-bytes: 7872").
func ParseTestpmdRxPackets(line string) (uint64, bool) {
	_, rest, ok := strings.Cut(line, "RX-packets:")
	if !ok {
		return 0, false
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return 0, false
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	return n, err == nil
}

// term ends a process with SIGTERM (testpmd exits cleanly on it), then
// SIGKILL after grace.
func (p *proc) term(grace time.Duration) {
	p.stdin.Close() // already closed when stop calls it: the error does not matter
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// BackendPackets scrapes a lanekit-vhost metrics socket (--metrics-listen
// PATH) and returns the packets it moved into the guest (rx: wire frames
// from its AF_XDP sockets, or whole GSO packets with --rx-gso kernel) and out
// of it (tx), summed over queue pairs.
func BackendPackets(ctx context.Context, sock string) (rx, tx uint64, err error) {
	text, err := scrapeBackend(ctx, sock)
	if err != nil {
		return 0, 0, err
	}
	return backendPackets(text)
}

// scrapeBackend reads a lanekit-vhost metrics socket (--metrics-listen PATH).
func scrapeBackend(ctx context.Context, sock string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := unixhttp.Get(ctx, sock, "/metrics")
	if err != nil {
		return "", fmt.Errorf("backend: %w", err)
	}
	return string(body), nil
}

// backendPackets sums lanekit_vhost_{rx,tx}_packets_total over their labels.
func backendPackets(text string) (uint64, uint64, error) {
	rx, nrx, err := sumCounter(text, "lanekit_vhost_rx_packets_total")
	if err != nil {
		return 0, 0, err
	}
	tx, ntx, err := sumCounter(text, "lanekit_vhost_tx_packets_total")
	if err != nil {
		return 0, 0, err
	}
	if nrx+ntx == 0 {
		return 0, 0, errors.New("backend metrics: no lanekit_vhost_{rx,tx}_packets_total")
	}
	return uint64(rx), uint64(tx), nil
}

// BackendRxBytes is what the backend on metrics socket sock delivered into
// its guest, in bytes (lanekit_vhost_rx_bytes_total over its queues): the
// same amount whether the guest got wire frames or GSO packets.
func BackendRxBytes(ctx context.Context, sock string) (uint64, error) {
	text, err := scrapeBackend(ctx, sock)
	if err != nil {
		return 0, err
	}
	v, n, err := sumCounter(text, "lanekit_vhost_rx_bytes_total")
	if err == nil && n == 0 {
		err = errors.New("backend metrics: no lanekit_vhost_rx_bytes_total")
	}
	return uint64(v), err
}

// sumCounter sums the samples of the labelled counter name in a metrics
// text (lanekit-vhost labels every sample: vm, queue) and says how many
// there were.
func sumCounter(text, name string) (sum float64, n int, err error) {
	for _, l := range strings.Split(text, "\n") {
		metric, rest, ok := strings.Cut(l, "{")
		if !ok || metric != name {
			continue
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			return 0, 0, fmt.Errorf("backend metrics: no value in %q", l)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("backend metrics: %q: %w", l, err)
		}
		sum += v
		n++
	}
	return sum, n, nil
}
