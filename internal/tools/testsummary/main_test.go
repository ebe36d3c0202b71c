package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReport reads the recorded runs in testdata: a go package with a pass, a
// skip and a failure, a package that failed outside any test, a package
// without tests, and two cargo runs where the second runs tests the first
// ignored (one printing between its name and its outcome) and one dies.
func TestReport(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"report", "testdata"}, nil, &out)
	if err == nil || !strings.Contains(err.Error(), "2 test(s) and 1 package(s) failed") {
		t.Fatalf("report: err %v, want the failures counted", err)
	}
	s := out.String()
	for _, want := range []string{
		"go              1        1        1",
		"cargo           4        1        1",
		"pkg/a TestRoot: a_test.go:9: skipping: needs root (network namespaces, BPF, netlink)",
		"tests/xsk_netns.rs xsk_other: #[ignore] without a reason",
		"pkg/a TestBad: a_test.go:12: want 2, got 3",
		"pkg/b (package): panic: boom in TestMain",
		"tests/qemu_guest.rs guest_crash: no outcome: the test binary died",
		"\nsummary: 5 passed, 3 failed, 2 skipped\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "xsk_roundtrip: needs root") || strings.Contains(s, "guest_traffic: needs root") {
		t.Errorf("a test the root run ran is listed as skipped:\n%s", s)
	}
}

// TestStreamGo records the JSON unchanged and prints a go test-like log.
func TestStreamGo(t *testing.T) {
	in, err := os.ReadFile("testdata/go.json")
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(t.TempDir(), "go.json")
	var out bytes.Buffer
	if err := run([]string{"go", rec}, bytes.NewReader(append([]byte("# vet output\n"), in...)), &out); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(rec)
	if !bytes.Equal(got, append([]byte("# vet output\n"), in...)) {
		t.Errorf("the record differs from the input")
	}
	for _, want := range []string{"# vet output\n", "want 2, got 3", "FAIL pkg/a 0.2s (1 passed, 1 failed, 1 skipped)", "FAIL pkg/b 0.1s (failed outside any test)", "?    pkg/c [no test files]"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}
	if err := run([]string{"report", t.TempDir()}, nil, &out); err == nil {
		t.Errorf("report of an empty directory: no error")
	}
	if err := run([]string{"bogus", "x"}, nil, &out); err == nil {
		t.Errorf("unknown mode: no error")
	}
}
