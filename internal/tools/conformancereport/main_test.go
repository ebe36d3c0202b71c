package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestSkipListParses: the repository's skip list is well formed, every
// entry with its reason.
func TestSkipListParses(t *testing.T) {
	data, err := os.ReadFile("../../../test/conformance/skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	skips, err := parseSkipList(string(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(skips) == 0 {
		t.Fatal("empty skip list")
	}
	if _, err := parseSkipList("SCTP\n"); err == nil {
		t.Error("an entry without a reason was accepted")
	}
}

// TestWrite: passed, failed (with cause), skip-list and self-skipped (with
// the test's message) counts come out of a ginkgo JSON report; a skipped
// spec without a message did not run; specs outside the focus are only
// counted.
func TestWrite(t *testing.T) {
	reps := []report{{SuiteDescription: "Kubernetes e2e suite", SpecReports: []specReport{
		{ContainerHierarchyTexts: []string{"[sig-network] Services"}, LeafNodeText: "should serve a basic endpoint", LeafNodeType: "It", State: "passed"},
		{ContainerHierarchyTexts: []string{"[sig-network] Services"}, LeafNodeText: "should be sctp", LeafNodeType: "It", State: "skipped"},
		{ContainerHierarchyTexts: []string{"[sig-storage] CSI"}, LeafNodeText: "mounts", LeafNodeType: "It", State: "skipped"},
		{ContainerHierarchyTexts: []string{"[sig-network] DNS"}, LeafNodeText: "should resolve", LeafNodeType: "It", State: "failed"},
		{ContainerHierarchyTexts: []string{"[sig-network] Traffic Distribution"}, LeafNodeText: "should prefer the zone", LeafNodeType: "It", State: "skipped"},
		{ContainerHierarchyTexts: []string{"[sig-network] Services"}, LeafNodeText: "should come later", LeafNodeType: "It", State: "skipped"},
	}}}
	reps[0].SpecReports[4].Failure = &struct {
		Message  string `json:"Message"`
		Location struct {
			FileName   string `json:"FileName"`
			LineNumber int    `json:"LineNumber"`
		} `json:"Location"`
	}{Message: "Requires >= 3 zones"}
	reps[0].SpecReports[3].Failure = &struct {
		Message  string `json:"Message"`
		Location struct {
			FileName   string `json:"FileName"`
			LineNumber int    `json:"LineNumber"`
		} `json:"Location"`
	}{Message: "timed out waiting for the condition\nmore"}
	skips, err := parseSkipList("sctp # no sctp module\n")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := write(&b, reps, regexp.MustCompile(`\[sig-network\]`), skips, runDesc{procs: 4, skipFile: "test/conformance/skip.txt", raw: "docs/conformance.json"}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"| 1 | 1 | 1 | 1 | 1 | 1 |", "| [sig-network] Traffic Distribution should prefer the zone | Requires >= 3 zones |", "[sig-network] DNS should resolve | failed | timed out waiting for the condition more",
		"| `sctp` | 1 | no sctp module |", "- [sig-network] Services should serve a basic endpoint"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--cni") || !strings.Contains(out, "lanekit installed") {
		t.Errorf("lanekit's report names another network:\n%s", out)
	}
	// A rival's run, the reference for lanekit's: named as what ran.
	b.Reset()
	if err := write(&b, reps, regexp.MustCompile(`\[sig-network\]`), skips, runDesc{procs: 4, skipFile: "test/conformance/skip.txt",
		raw: "docs/conformance-cilium.json", cni: "cilium"}); err != nil {
		t.Fatal(err)
	}
	out = b.String()
	for _, want := range []string{"# Upstream Kubernetes e2e tests on cilium", "`lanekit lab up --k8s --kubelet --cni cilium`", "cilium installed", "no lanekit"} {
		if !strings.Contains(out, want) {
			t.Errorf("the rival's report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lanekit installed") {
		t.Errorf("the rival's report says lanekit was installed:\n%s", out)
	}
}

// TestSlim: the slim report keeps the run's facts and the specs in focus
// (passed, failed, skip-listed, self-skipped with its message), cut to
// their names, states, times and failures; it drops the specs outside the
// focus (counted) and every spec's captured output, events and stack
// traces; the Markdown report reads the same from either.
func TestSlim(t *testing.T) {
	full := `[{"SuiteDescription":"Kubernetes e2e suite","SuiteSucceeded":false,"StartTime":"2026-11-30T16:21:00Z","EndTime":"2026-11-30T16:45:00Z",
	 "SuiteConfig":{"FocusStrings":["\\[sig-network\\]"],"ParallelTotal":4},
	 "SpecReports":[
	  {"ContainerHierarchyTexts":["[sig-network] Services"],"LeafNodeText":"should serve","LeafNodeType":"It","State":"passed","RunTime":2000000000,
	   "CapturedGinkgoWriterOutput":"BIG OUTPUT","SpecEvents":[{"Message":"BIG EVENT"}],"LeafNodeLocation":{"FileName":"service.go","LineNumber":7}},
	  {"ContainerHierarchyTexts":["[sig-network] DNS"],"LeafNodeText":"should resolve","LeafNodeType":"It","State":"failed",
	   "Failure":{"Message":"timed out","Location":{"FileName":"dns.go","LineNumber":3,"FullStackTrace":"BIG TRACE"},"FailureNodeType":"It","TimelineLocation":{"Offset":1}}},
	  {"ContainerHierarchyTexts":["[sig-network] Services"],"LeafNodeText":"should be sctp","LeafNodeType":"It","State":"skipped"},
	  {"ContainerHierarchyTexts":["[sig-network] Topology"],"LeafNodeText":"zones","LeafNodeType":"It","State":"skipped","Failure":{"Message":"Requires >= 3 zones"}},
	  {"ContainerHierarchyTexts":["[sig-storage] CSI"],"LeafNodeText":"mounts","LeafNodeType":"It","State":"skipped"},
	  {"ContainerHierarchyTexts":["[sig-apps] Deployment"],"LeafNodeText":"rolls","LeafNodeType":"It","State":"skipped"},
	  {"LeafNodeType":"SynchronizedBeforeSuite","State":"passed","CapturedGinkgoWriterOutput":"BIG SETUP"}]}]`
	focus := regexp.MustCompile(`\[sig-network\]`)
	out, err := slim([]byte(full), focus)
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"BIG", "mounts", "rolls", "TimelineLocation", "SynchronizedBeforeSuite"} {
		if strings.Contains(string(out), gone) {
			t.Errorf("slim report keeps %q:\n%s", gone, out)
		}
	}
	for _, kept := range []string{"should serve", "should resolve", "timed out", "dns.go", "should be sctp", "Requires >= 3 zones", `"LanekitSpecsOutOfFocus": 2`, "ParallelTotal", `"LineNumber": 7`} {
		if !strings.Contains(string(out), kept) {
			t.Errorf("slim report lacks %q:\n%s", kept, out)
		}
	}
	md := func(data []byte) string {
		skips, err := parseSkipList("sctp # no sctp module\n") // counts per run
		if err != nil {
			t.Fatal(err)
		}
		var reps []report
		if err := json.Unmarshal(data, &reps); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := write(&b, reps, focus, skips, runDesc{procs: 4, skipFile: "skip.txt", raw: "r.json"}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if a, b := md([]byte(full)), md(out); a != b {
		t.Errorf("the Markdown differs:\nfrom the full report:\n%s\nfrom the slim one:\n%s", a, b)
	} else if !strings.Contains(a, "| 1 | 1 | 1 | 1 | 0 | 2 |") {
		t.Errorf("totals: want 1 passed, 1 failed, 1 skip-listed, 1 self-skipped, 2 out of focus:\n%s", a)
	}
}
