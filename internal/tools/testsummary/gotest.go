package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output / build-fail events (Go >= 1.24)
	Test       string
	Elapsed    float64
	Output     string
}

const modulePrefix = "github.com/lanekit/lanekit/"

// goRun folds events into per-test outcomes, keeping each test's output for
// skip reasons and failures.
type goRun struct {
	output map[[2]string][]string // (package, test) -> output lines
	tests  []result
	broken []result
	counts map[string][3]int // package -> pass/fail/skip
}

func newGoRun() *goRun {
	return &goRun{output: map[[2]string][]string{}, counts: map[string][3]int{}}
}

// add takes one event; it returns a line to print for a package's end (and
// a failed test's output), "" otherwise.
func (g *goRun) add(e event) string {
	pkg := strings.TrimPrefix(e.Package, modulePrefix)
	if e.Package == "" && e.ImportPath != "" {
		pkg = strings.TrimPrefix(e.ImportPath, modulePrefix)
	}
	key := [2]string{pkg, e.Test}
	switch e.Action {
	case "output", "build-output":
		g.output[key] = append(g.output[key], e.Output)
		return ""
	case "build-fail":
		g.broken = append(g.broken, result{suite: "go", unit: pkg, name: "(build)", st: stFail, why: oneLine(strings.Join(g.output[key], ""), 600)})
		return "FAIL " + pkg + " [build failed]\n" + strings.Join(g.output[key], "")
	case "pass", "fail", "skip":
	default:
		return ""
	}
	if e.Test != "" {
		r := result{suite: "go", unit: pkg, name: e.Test}
		c := g.counts[pkg]
		switch e.Action {
		case "pass":
			r.st = stPass
		case "fail":
			r.st, r.why = stFail, oneLine(testText(g.output[key]), 600)
		case "skip":
			r.st, r.why = stSkip, oneLine(testText(g.output[key]), 300)
		}
		c[r.st]++
		g.counts[pkg] = c
		g.tests = append(g.tests, r)
		if r.st == stFail {
			return strings.Join(g.output[key], "")
		}
		delete(g.output, key)
		return ""
	}
	// The package's end.
	c := g.counts[pkg]
	switch {
	case e.Action == "skip":
		return fmt.Sprintf("?    %s [no test files]\n", pkg)
	case e.Action == "fail" && c[stFail] == 0:
		g.broken = append(g.broken, result{suite: "go", unit: pkg, name: "(package)", st: stFail, why: oneLine(tail(g.output[key], 8), 600)})
		return strings.Join(g.output[key], "") + fmt.Sprintf("FAIL %s %.1fs (failed outside any test)\n", pkg, e.Elapsed)
	case e.Action == "fail":
		return fmt.Sprintf("FAIL %s %.1fs (%d passed, %d failed, %d skipped)\n", pkg, e.Elapsed, c[stPass], c[stFail], c[stSkip])
	}
	return fmt.Sprintf("ok   %s %.1fs (%d passed, %d skipped)\n", pkg, e.Elapsed, c[stPass], c[stSkip])
}

// testText is what a test printed, without go test's own framing lines.
func testText(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		b.WriteString(t)
		b.WriteString(" ")
	}
	return b.String()
}

func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// streamGo copies go test's JSON to rec and prints a go test-like log to out.
// Lines that are not JSON (go vet, a crash of go itself) are printed as they are.
func streamGo(in io.Reader, rec io.Writer, out io.Writer) error {
	g := newGoRun()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(rec, line)
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
			fmt.Fprintln(out, line)
			continue
		}
		if s := g.add(e); s != "" {
			fmt.Fprint(out, s)
		}
	}
	return sc.Err()
}

// loadGo adds a recorded go test -json file to s.
func (s *summary) loadGo(path string) error {
	g := newGoRun()
	err := readLines(path, func(line string) error {
		var e event
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &e) == nil {
			g.add(e)
		}
		return nil
	})
	s.results = append(s.results, g.tests...)
	s.broken = append(s.broken, g.broken...)
	return err
}
