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
	// "test net::tests::rx ... ok" / "... FAILED" / "... ignored, needs root"
	cargoTest = regexp.MustCompile(`^test (.+?) \.\.\. (ok|FAILED|ignored)(?:, (.*))?$`)
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
// once, as run.
func (s *summary) loadCargo(paths []string) error {
	type key struct{ unit, name string }
	byKey := map[key]*result{}
	var order []key
	for _, p := range paths {
		unit := "?"
		err := readLines(p, func(line string) error {
			if m := cargoRunning.FindStringSubmatch(line); m != nil {
				unit = m[1]
				return nil
			}
			if m := cargoDoc.FindStringSubmatch(line); m != nil {
				unit = "doc-tests " + m[1]
				return nil
			}
			if cargoError.MatchString(line) && !strings.Contains(line, "test failed, to rerun") {
				s.broken = append(s.broken, result{suite: "cargo", unit: unit, name: "(build)", st: stFail, why: oneLine(line, 300)})
				return nil
			}
			m := cargoTest.FindStringSubmatch(line)
			if m == nil {
				return nil
			}
			k := key{unit, m[1]}
			r := result{suite: "cargo", unit: unit, name: m[1]}
			switch m[2] {
			case "ok":
				r.st = stPass
			case "FAILED":
				r.st = stFail
			case "ignored":
				r.st, r.why = stSkip, m[3]
				if r.why == "" {
					r.why = "#[ignore] without a reason"
				}
			}
			old, seen := byKey[k]
			if !seen {
				order = append(order, k)
				byKey[k] = &r
			} else if old.st == stSkip || r.st == stFail {
				*old = r // a run beats an ignore; a failure beats a pass
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, k := range order {
		s.results = append(s.results, *byKey[k])
	}
	return nil
}
