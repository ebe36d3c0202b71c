package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
)

var (
	// "     Running tests/xsk_netns.rs (target/release/deps/xsk_netns-…)"
	cargoRunning = regexp.MustCompile(`^\s+Running (\S+(?: \S+)?) \(`)
	// "   Doc-tests lanekit_vhost"
	cargoDoc = regexp.MustCompile(`^\s+Doc-tests (\S+)`)
	// "test net::tests::rx ... ok" / "... FAILED" / "... ignored, needs root";
	// what a test or its children print to stderr can come between the
	// name and the outcome, which then starts a line of its own.
	cargoTest    = regexp.MustCompile(`^test (.+?) \.\.\. (.*)$`)
	cargoOutcome = regexp.MustCompile(`^(ok|FAILED|ignored)(?:, (.*))?$`)
	// "error: test failed, to rerun pass `--test foo`" and build errors
	cargoError = regexp.MustCompile(`^error(\[E\d+\])?: `)
)

// streamCargo passes cargo's output through and records it.
func streamCargo(in io.Reader, rec io.Writer, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		fmt.Fprintln(rec, sc.Text())
		fmt.Fprintln(out, sc.Text())
	}
	return sc.Err()
}

// loadCargo reads recorded cargo test logs. The runs of one make test (all
// tests, then the root-only #[ignore]d ones with --ignored) are merged per
// test binary and name: a test ignored by one run and run by another counts
// once, as run. A test whose outcome never came (its binary died) failed.
func (s *summary) loadCargo(paths []string) error {
	type key struct{ unit, name string }
	byKey := map[key]*result{}
	var order []key
	record := func(r result) {
		k := key{r.unit, r.name}
		old, seen := byKey[k]
		if !seen {
			order = append(order, k)
			byKey[k] = &r
		} else if old.st == stSkip || r.st == stFail {
			*old = r // a run beats an ignore; a failure beats a pass
		}
	}
	for _, p := range paths {
		unit, pending := "?", ""
		flush := func() {
			if pending != "" {
				record(result{suite: "cargo", unit: unit, name: pending, st: stFail, why: "no outcome: the test binary died"})
				pending = ""
			}
		}
		err := readLines(p, func(line string) error {
			if m := cargoRunning.FindStringSubmatch(line); m != nil {
				flush()
				unit = m[1]
				return nil
			}
			if m := cargoDoc.FindStringSubmatch(line); m != nil {
				flush()
				unit = "doc-tests " + m[1]
				return nil
			}
			if cargoError.MatchString(line) && !strings.Contains(line, "test failed, to rerun") {
				s.broken = append(s.broken, result{suite: "cargo", unit: unit, name: "(build)", st: stFail, why: oneLine(line, 300)})
				return nil
			}
			name, outcome := pending, line
			if m := cargoTest.FindStringSubmatch(line); m != nil {
				flush()
				name, outcome = m[1], m[2]
			}
			if name == "" {
				return nil
			}
			o := cargoOutcome.FindStringSubmatch(outcome)
			if o == nil {
				pending = name // the outcome comes on a later line
				return nil
			}
			pending = ""
			r := result{suite: "cargo", unit: unit, name: name}
			switch o[1] {
			case "ok":
				r.st = stPass
			case "FAILED":
				r.st = stFail
			case "ignored":
				r.st, r.why = stSkip, o[2]
				if r.why == "" {
					r.why = "#[ignore] without a reason"
				}
			}
			record(r)
			return nil
		})
		if err != nil {
			return err
		}
		flush()
	}
	for _, k := range order {
		s.results = append(s.results, *byKey[k])
	}
	return nil
}
