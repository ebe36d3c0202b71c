package lab

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lanekit/lanekit/internal/testutil"
)

const histPage = `# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 7
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 8
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 1
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 8
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="0.25"} 2
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 2
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv6"} 0.1
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"} 2
`

// The scrape sums a histogram over its labels, reads a missing family as
// empty, and refuses an answer that is not the agent's metrics page (a
// 404 from outside the lab once read as "0 observations").
func TestScrapeHistograms(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, histPage)
	}))
	defer srv.Close()
	ctx := context.Background()
	hs, err := scrapeHistograms(ctx, srv.Client(), srv.URL+"/metrics",
		"kubeproxy_network_programming_duration_seconds", "lanekit_policy_programming_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	nw := hs["kubeproxy_network_programming_duration_seconds"]
	if nw[0.25] != 9 || nw[math.Inf(1)] != 10 {
		t.Errorf("network histogram %v; want 9 under 0.25 s, 10 in all (the +Inf bucket counted once)", nw)
	}
	if pol := hs["lanekit_policy_programming_duration_seconds"]; len(pol) != 0 {
		t.Errorf("missing family: %v; want empty", pol)
	}
	if _, err := scrapeHistograms(ctx, srv.Client(), srv.URL+"/other", "x"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a 404 answer: err %v; want an error naming it", err)
	}
}

// The scale lab's scrapes reach an address that exists only inside a
// node's netns: a listener on the loopback of a fresh namespace answers
// through netnsHTTPClient, and the host's own loopback (no listener on
// that port) does not stand in for it.
func TestNetnsHTTPClient(t *testing.T) {
	testutil.RequireRoot(t)
	lockLab()
	name := fmt.Sprintf("lkt-scrape-%d", os.Getpid())
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	// netns.NewNamed switches this thread into the new namespace: hold the
	// thread and switch back before anything else runs on it.
	h, err := func() (netns.NsHandle, error) {
		runtimeLock()
		defer runtimeUnlock()
		h, err := netns.NewNamed(name)
		if serr := netns.Set(orig); serr != nil {
			panic(serr)
		}
		return h, err
	}()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	var ln net.Listener
	if err := testutil.InNetns(h, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, histPage) }),
		ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/metrics"
	ctx := context.Background()
	hs, err := scrapeHistograms(ctx, netnsHTTPClient(netnsPath(name), 5*time.Second), url, "kubeproxy_network_programming_duration_seconds")
	if err != nil {
		t.Fatalf("scrape in the namespace: %v", err)
	}
	if n := hs["kubeproxy_network_programming_duration_seconds"][math.Inf(1)]; n != 10 {
		t.Errorf("scraped %d observations; want 10", n)
	}
	if _, err := scrapeHistograms(ctx, &http.Client{Timeout: 2 * time.Second}, url, "x"); err == nil {
		t.Errorf("the host's namespace reached %s: the test cannot tell the namespaces apart", url)
	}
}

func runtimeLock()   { runtime.LockOSThread() }
func runtimeUnlock() { runtime.UnlockOSThread() }
