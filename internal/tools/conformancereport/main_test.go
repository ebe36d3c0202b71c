package main

import (
	"bytes"
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
