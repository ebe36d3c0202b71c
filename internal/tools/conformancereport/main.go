// Command conformancereport turns ginkgo's JSON report of the upstream e2e
// tests (make conformance, scripts/conformance.sh) into docs/conformance.md:
// the run, the totals, every failure with its cause, the passed tests, and
// the tests the skip list left out, counted per entry with its reason.
//
//	go run ./internal/tools/conformancereport -focus RE -skip-file FILE [-procs N] [-slim OUT.json] REPORT.json > conformance.md
//
// With -slim it also writes the report docs/ keeps: the run's facts (suite,
// times, ginkgo's configuration) and only the specs in focus, each with its
// name, labels, location, state, times and failure or skip message — not
// the captured output, progress events and stack traces of ginkgo's full
// report (about 10 MB for the [sig-network] focus, most of it the 3,000
// specs outside it, which the slim report only counts).
//
// This is a development tool: no shipped binary links it.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// report is the part of ginkgo's types.Report the summary needs.
type report struct {
	SuiteDescription string       `json:"SuiteDescription"`
	StartTime        time.Time    `json:"StartTime"`
	EndTime          time.Time    `json:"EndTime"`
	SpecReports      []specReport `json:"SpecReports"`
	// OutOfFocus counts the specs a slim report (-slim) left out: those
	// outside the run's focus.
	OutOfFocus int `json:"LanekitSpecsOutOfFocus,omitempty"`
}

type specReport struct {
	ContainerHierarchyTexts []string `json:"ContainerHierarchyTexts"`
	LeafNodeText            string   `json:"LeafNodeText"`
	LeafNodeType            string   `json:"LeafNodeType"`
	State                   string   `json:"State"`
	RunTime                 int64    `json:"RunTime"` // nanoseconds
	Failure                 *struct {
		Message  string `json:"Message"`
		Location struct {
			FileName   string `json:"FileName"`
			LineNumber int    `json:"LineNumber"`
		} `json:"Location"`
	} `json:"Failure,omitempty"`
}

// fullText is what ginkgo's --focus and --skip match.
func (s specReport) fullText() string {
	return strings.TrimSpace(strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " "))
}

// suiteFailed reports whether s is a suite-level node (not an It) that
// failed: reported among the failures.
func (s specReport) suiteFailed() bool {
	return s.LeafNodeType != "It" && s.State != "passed" && s.State != "skipped" && s.Failure != nil
}

// outOfFocus reports whether s is a test the run's focus left out (only
// counted in the report).
func (s specReport) outOfFocus(focus *regexp.Regexp) bool {
	return s.LeafNodeType == "It" && (s.State == "skipped" || s.State == "pending") && !focus.MatchString(s.fullText())
}

// skipEntry is one line of the skip list.
type skipEntry struct {
	re     *regexp.Regexp
	expr   string
	reason string
	count  int
}

func parseSkipList(data string) ([]*skipEntry, error) {
	var out []*skipEntry
	for n, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		expr, reason, ok := strings.Cut(line, " # ")
		if !ok || strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("skip list line %d: want `REGEX # reason`: %q", n+1, line)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("skip list line %d: %w", n+1, err)
		}
		out = append(out, &skipEntry{re: re, expr: expr, reason: strings.TrimSpace(reason)})
	}
	return out, nil
}

// cause is the first lines of a failure message and where it failed.
func cause(s specReport) string {
	if s.Failure == nil {
		return s.State
	}
	msg := strings.TrimSpace(s.Failure.Message)
	lines := strings.Split(msg, "\n")
	if len(lines) > 4 {
		lines = append(lines[:4], "…")
	}
	msg = strings.Join(lines, " ")
	if len(msg) > 600 {
		msg = msg[:600] + "…"
	}
	loc := s.Failure.Location.FileName
	if i := strings.Index(loc, "test/e2e/"); i >= 0 {
		loc = loc[i:]
	}
	return fmt.Sprintf("%s (%s:%d)", strings.ReplaceAll(msg, "|", `\|`), loc, s.Failure.Location.LineNumber)
}

// runDesc describes the run in the report's head.
type runDesc struct {
	procs    int
	skipFile string // the skip list's path
	raw      string // the JSON report's path in the repository
	ipFamily string // the lab's --ip-family
	nodes    int    // the lab's --nodes
	zones    string // the lab's --zones
	cni      string // the lab's --cni: "" or lanekit, else a rival's network (kube-proxy + flannel, Cilium)
}

func write(w io.Writer, reps []report, focus *regexp.Regexp, skips []*skipEntry, d runDesc) error {
	if len(reps) == 0 {
		return errors.New("empty report")
	}
	r := reps[0]
	var passed, failed, selfSkipped []specReport
	outOfFocus, notRun := r.OutOfFocus, 0
	for _, s := range r.SpecReports {
		if s.LeafNodeType != "It" {
			if s.suiteFailed() {
				failed = append(failed, s)
			}
			continue
		}
		if s.outOfFocus(focus) {
			outOfFocus++
			continue
		}
		text := s.fullText()
		switch s.State {
		case "passed":
			passed = append(passed, s)
		case "skipped", "pending":
			listed := false
			for _, e := range skips {
				if e.re.MatchString(text) {
					e.count++
					listed = true
					break
				}
			}
			switch {
			case listed:
			case s.Failure != nil && strings.TrimSpace(s.Failure.Message) != "":
				// It ran and skipped itself (e2eskipper: "Requires >= 3
				// zones", a provider, more nodes): the reason is its message.
				selfSkipped = append(selfSkipped, s)
			default:
				notRun++ // the run ended (--timeout, interrupt) before it
			}
		default: // failed, panicked, timedout, interrupted, aborted
			failed = append(failed, s)
		}
	}
	skipped := 0
	for _, e := range skips {
		skipped += e.count
	}
	byText := func(l []specReport) {
		sort.Slice(l, func(i, j int) bool { return l[i].fullText() < l[j].fullText() })
	}
	byText(passed)
	byText(failed)
	byText(selfSkipped)
	p := func(f string, a ...any) { fmt.Fprintf(w, f+"\n", a...) }
	rival := d.cni != "" && d.cni != "lanekit"
	if rival {
		p("# Upstream Kubernetes e2e tests on %s, the reference for lanekit (`CONFORMANCE_CNI=%s make conformance`)", d.cni, d.cni)
	} else {
		p("# Upstream Kubernetes e2e tests on lanekit (`make conformance`)")
	}
	p("")
	up := "lanekit lab up --k8s --kubelet"
	if rival {
		up += " --cni " + d.cni
	}
	if d.ipFamily != "" && d.ipFamily != "ipv4" {
		up += " --ip-family " + d.ipFamily
	}
	nodes := "two nodes"
	if d.nodes > 0 && d.nodes != 2 {
		up += fmt.Sprintf(" --nodes %d", d.nodes)
		nodes = fmt.Sprintf("%d nodes", d.nodes)
	}
	if d.zones != "" {
		up += " --zones " + d.zones
		nodes += " in zones " + d.zones + " (round robin)"
	}
	if rival {
		p("The real-node lab (`%s`: %s, each kubelet + containerd, %s installed the way its users install it,", up, nodes, d.cni)
		p("no lanekit; [benchmarks.md](benchmarks.md) says how) against the upstream e2e binary, run by ginkgo, with lanekit's")
		p("skip list: a test it passes that lanekit's run skips or fails is a gap ([conformance.md](conformance.md)).")
	} else {
		p("The real-node lab (`%s`: %s, each kubelet + containerd, lanekit installed", up, nodes)
		p("with `kubectl apply -k deploy/`, **no kube-proxy**) against the upstream e2e binary, run by ginkgo.")
	}
	p("")
	p("- Suite: %s; run %s, %s, %d ginkgo processes", r.SuiteDescription, r.StartTime.UTC().Format("2006-01-02 15:04 MST"),
		r.EndTime.Sub(r.StartTime).Round(time.Second), d.procs)
	p("- Focus: `%s`; skip list: `%s`", focus.String(), d.skipFile)
	p("- Raw report: `%s` (ginkgo's JSON report, the specs in focus only)", d.raw)
	p("")
	p("| passed | failed | skipped (skip list) | skipped by the test | not run (run ended first) | not in focus |")
	p("|---:|---:|---:|---:|---:|---:|")
	p("| %d | %d | %d | %d | %d | %d |", len(passed), len(failed), skipped, len(selfSkipped), notRun, outOfFocus)
	p("")
	p("## Failed (%d)", len(failed))
	p("")
	if len(failed) > 0 {
		p("| test | state | cause |")
		p("|---|---|---|")
		for _, s := range failed {
			p("| %s | %s | %s |", strings.ReplaceAll(s.fullText(), "|", `\|`), s.State, cause(s))
		}
		p("")
	}
	p("## Skipped by the skip list (%d)", skipped)
	p("")
	p("| entry | tests | why |")
	p("|---|---:|---|")
	for _, e := range skips {
		p("| `%s` | %d | %s |", strings.ReplaceAll(e.expr, "|", `\|`), e.count, e.reason)
	}
	p("")
	p("## Skipped by the test itself (%d)", len(selfSkipped))
	p("")
	if len(selfSkipped) > 0 {
		p("| test | why (its skip message) |")
		p("|---|---|")
		for _, s := range selfSkipped {
			p("| %s | %s |", strings.ReplaceAll(s.fullText(), "|", `\|`), strings.ReplaceAll(strings.TrimSpace(s.Failure.Message), "|", `\|`))
		}
		p("")
	}
	p("## Passed (%d)", len(passed))
	p("")
	for _, s := range passed {
		p("- %s (%s)", s.fullText(), time.Duration(s.RunTime).Round(100*time.Millisecond))
	}
	return nil
}

func main() {
	focus := flag.String("focus", `\[sig-network\]`, "the run's ginkgo --focus")
	skipFile := flag.String("skip-file", "test/conformance/skip.txt", "the run's skip list")
	procs := flag.Int("procs", 1, "the run's ginkgo processes")
	raw := flag.String("raw", "docs/conformance.json", "the JSON report's path in the repository (named in the report)")
	family := flag.String("ip-family", "ipv4", "the lab's --ip-family")
	nodes := flag.Int("nodes", 2, "the lab's --nodes")
	zones := flag.String("zones", "", "the lab's --zones")
	cni := flag.String("cni", "", "the lab's --cni (empty: lanekit)")
	slimOut := flag.String("slim", "", "also write the report docs/ keeps here: the run's facts and the specs in focus only")
	flag.Parse()
	if err := run(*focus, runDesc{procs: *procs, skipFile: *skipFile, raw: *raw, ipFamily: *family, nodes: *nodes, zones: *zones, cni: *cni}, *slimOut, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "conformancereport:", err)
		os.Exit(1)
	}
}

func run(focus string, d runDesc, slimOut string, args []string) error {
	if len(args) != 1 {
		return errors.New("want one argument: ginkgo's JSON report")
	}
	fre, err := regexp.Compile(focus)
	if err != nil {
		return fmt.Errorf("-focus: %w", err)
	}
	sl, err := os.ReadFile(d.skipFile)
	if err != nil {
		return err
	}
	skips, err := parseSkipList(string(sl))
	if err != nil {
		return err
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var reps []report
	if err := json.Unmarshal(data, &reps); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	if slimOut != "" {
		out, err := slim(data, fre)
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
		if err := os.WriteFile(slimOut, out, 0o644); err != nil {
			return err
		}
	}
	return write(os.Stdout, reps, fre, skips, d)
}

// Kept of each spec in focus (ginkgo's types.SpecReport field names), and
// of its failure; the rest (captured output, events, report entries, stack
// traces, timelines) is left out.
var (
	slimSpecKeys    = []string{"ContainerHierarchyTexts", "LeafNodeType", "LeafNodeLocation", "LeafNodeLabels", "LeafNodeText", "State", "StartTime", "EndTime", "RunTime", "ParallelProcess", "NumAttempts", "Failure"}
	slimFailureKeys = []string{"Message", "Location", "FailureNodeType"}
	slimLocation    = []string{"FileName", "LineNumber"}
)

// slim is ginkgo's JSON report data with only the specs in focus (and any
// suite-level node that failed), each cut to slimSpecKeys; the specs left
// out are counted in LanekitSpecsOutOfFocus.
func slim(data []byte, focus *regexp.Regexp) ([]byte, error) {
	var reps []map[string]json.RawMessage
	if err := json.Unmarshal(data, &reps); err != nil {
		return nil, err
	}
	for _, r := range reps {
		// The same array twice: as fields (what is kept is copied as it is)
		// and typed (what decides whether a spec is kept).
		var specs []map[string]json.RawMessage
		var typed []specReport
		if err := json.Unmarshal(r["SpecReports"], &specs); err != nil {
			return nil, fmt.Errorf("spec reports: %w", err)
		}
		if err := json.Unmarshal(r["SpecReports"], &typed); err != nil {
			return nil, fmt.Errorf("spec reports: %w", err)
		}
		kept, out := []map[string]json.RawMessage{}, 0
		for i, sp := range specs {
			if s := typed[i]; s.outOfFocus(focus) {
				out++
				continue
			} else if s.LeafNodeType != "It" && !s.suiteFailed() {
				continue
			}
			k := pick(sp, slimSpecKeys)
			if f, ok := k["Failure"]; ok {
				var fm map[string]json.RawMessage
				if err := json.Unmarshal(f, &fm); err != nil {
					return nil, fmt.Errorf("a spec's failure: %w", err)
				}
				fk := pick(fm, slimFailureKeys)
				if loc, ok := fk["Location"]; ok {
					var lm map[string]json.RawMessage
					if err := json.Unmarshal(loc, &lm); err != nil {
						return nil, fmt.Errorf("a failure's location: %w", err)
					}
					fk["Location"] = rawJSON(pick(lm, slimLocation), "")
				}
				k["Failure"] = rawJSON(fk, "")
			}
			kept = append(kept, k)
		}
		r["SpecReports"] = rawJSON(kept, "")
		r["LanekitSpecsOutOfFocus"] = rawJSON(out, "")
	}
	return rawJSON(reps, " "), nil
}

// rawJSON encodes v (maps of raw messages, numbers: it cannot fail) without
// escaping <, > and & as json.Marshal does: the failure messages stay
// readable ("Requires >= 3 zones").
func rawJSON(v any, indent string) json.RawMessage {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return json.RawMessage(strings.TrimSuffix(b.String(), "\n"))
}

// pick is m with only keys (those it has).
func pick(m map[string]json.RawMessage, keys []string) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for _, k := range keys {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}
