// Command testsummary records the test runs of `make test` and prints, at the
// end, what they proved: tests passed, failed and skipped per suite, and every
// skip with its reason (a skip is a result, not a pass).
//
//	go test -json ./... | testsummary go DIR/go.json     # prints a go test-like log, records the events
//	cargo test ... 2>&1 | testsummary cargo DIR/NAME.cargo  # passes the log through, records it
//	testsummary report DIR                                # the summary; exit 1 on any failure
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
}

func run(args []string, in io.Reader, out io.Writer) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: testsummary go FILE | cargo FILE | report DIR")
	}
	switch args[0] {
	case "go", "cargo":
		f, err := os.Create(args[1])
		if err != nil {
			return err
		}
		defer f.Close()
		if args[0] == "go" {
			return streamGo(in, f, out)
		}
		return streamCargo(in, f, out)
	case "report":
		sum, err := load(args[1])
		if err != nil {
			return err
		}
		sum.print(out)
		if sum.failed() {
			return fmt.Errorf("%d test(s) and %d package(s) failed", sum.count(stFail), len(sum.broken))
		}
		return nil
	}
	return fmt.Errorf("unknown mode %q: want go, cargo or report", args[0])
}

// status is a test's outcome.
type status int

const (
	stPass status = iota
	stFail
	stSkip
)

// result is one test's outcome; why is a skip's reason or a failure's output.
type result struct {
	suite, unit, name string
	st                status
	why               string
}

// summary is every recorded result, plus units (packages, test binaries)
// that failed outside any test (build errors, panics in TestMain, timeouts).
type summary struct {
	results []result
	broken  []result
}

func (s *summary) count(st status) int {
	n := 0
	for _, r := range s.results {
		if r.st == st {
			n++
		}
	}
	return n
}

func (s *summary) failed() bool { return s.count(stFail) > 0 || len(s.broken) > 0 }

// load reads every record in dir: *.json from go, *.cargo from cargo.
func load(dir string) (*summary, error) {
	s := &summary{}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var cargo []string
	for _, f := range files {
		switch filepath.Ext(f) {
		case ".json":
			if err := s.loadGo(f); err != nil {
				return nil, err
			}
		case ".cargo":
			cargo = append(cargo, f)
		}
	}
	if len(cargo) > 0 {
		if err := s.loadCargo(cargo); err != nil {
			return nil, err
		}
	}
	if len(s.results) == 0 && len(s.broken) == 0 {
		return nil, fmt.Errorf("no test results in %s", dir)
	}
	return s, nil
}

func (s *summary) print(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "== test summary ==")
	suites := map[string][3]int{}
	var order []string
	for _, r := range s.results {
		c, ok := suites[r.suite]
		if !ok {
			order = append(order, r.suite)
		}
		c[r.st]++
		suites[r.suite] = c
	}
	fmt.Fprintf(w, "%-8s %8s %8s %8s\n", "suite", "passed", "failed", "skipped")
	for _, name := range order {
		c := suites[name]
		fmt.Fprintf(w, "%-8s %8d %8d %8d\n", name, c[stPass], c[stFail], c[stSkip])
	}
	list := func(title string, rs []result) {
		if len(rs) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s (%d):\n", title, len(rs))
		for _, r := range rs {
			fmt.Fprintf(w, "  %-5s %s %s", r.suite, r.unit, r.name)
			if r.why != "" {
				fmt.Fprintf(w, ": %s", r.why)
			}
			fmt.Fprintln(w)
		}
	}
	var skipped, failed []result
	for _, r := range s.results {
		switch r.st {
		case stSkip:
			skipped = append(skipped, r)
		case stFail:
			failed = append(failed, r)
		}
	}
	list("skipped, with the reason each gave", skipped)
	list("failed", failed)
	list("failed outside any test (build, TestMain, timeout)", s.broken)
	fmt.Fprintln(w)
	// The plain closing line CI reads.
	fmt.Fprintf(w, "summary: %d passed, %d failed, %d skipped\n", s.count(stPass), s.count(stFail)+len(s.broken), s.count(stSkip))
}

// readLines calls f for every line of path.
func readLines(path string, f func(string) error) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if err := f(sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// oneLine folds a multi-line message into one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
