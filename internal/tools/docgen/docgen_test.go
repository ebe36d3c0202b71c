package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigurationReferenceUpToDate regenerates docs/configuration.md from
// the code (the agent built from this tree, deploy/, pkg/cniplugin) and
// fails when the committed file differs: a flag, ConfigMap key or CNI field
// added, removed or re-described without `make docs`.
func TestConfigurationReferenceUpToDate(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	want, have, err := generate(root, "")
	if err != nil {
		t.Fatal(err)
	}
	for file := range want {
		if string(want[file]) != string(have[file]) {
			reportStale(t, file, want[file], have[file])
		}
	}
}

// reportStale names the first line where the committed file differs.
func reportStale(t *testing.T, file string, want, have []byte) {
	t.Helper()
	{
		wl, hl := strings.Split(string(want), "\n"), strings.Split(string(have), "\n")
		for i := 0; i < len(wl) || i < len(hl); i++ {
			var w, h string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(hl) {
				h = hl[i]
			}
			if w != h {
				t.Errorf("%s:%d\n committed: %s\n generated: %s", file, i+1, h, w)
				break
			}
		}
		t.Errorf("%s is stale: run make docs", file)
	}
}

func TestParseHelp(t *testing.T) {
	help := "Usage of x:\n" +
		"  -a string\n    \tthe a (default \"/x y\")\n" +
		"  -d duration\n    \thow often (default 30s)\n" +
		"  -n value\n    \tport (default 107, a user)\n" +
		"  -v\tdebug logging\n"
	got, err := parseHelp(help)
	if err != nil {
		t.Fatal(err)
	}
	want := []flagDoc{
		{Name: "a", Type: "string", Default: "/x y", Usage: "the a"},
		{Name: "d", Type: "duration", Default: "30s", Usage: "how often"},
		{Name: "n", Type: "value", Usage: "port (default 107, a user)"},
		{Name: "v", Type: "bool", Usage: "debug logging"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("flag %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := parseHelp("Usage of x:\n  something else\n"); err == nil {
		t.Error("unrecognised output accepted")
	}
}

func TestParseCobraFlags(t *testing.T) {
	help := "Usage:\n  x up [flags]\n\nFlags:\n" +
		"      --k8s                 run it\n" +
		"  -h, --help                help for up\n" +
		"      --nodes int           number of nodes (default 2)\n" +
		"      --routing string      native or tunnel (default: native, unless set)\n\n" +
		"Global Flags:\n      --x int   not these\n"
	got, err := parseCobraFlags(help)
	if err != nil {
		t.Fatal(err)
	}
	want := []flagDoc{
		{Name: "k8s", Type: "bool", Usage: "run it"},
		{Name: "nodes", Type: "int", Default: "2", Usage: "number of nodes"},
		{Name: "routing", Type: "string", Usage: "native or tunnel (default: native, unless set)"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("flag %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestCNIFieldsNeedDocs(t *testing.T) {
	src := filepath.Join(t.TempDir(), "c.go")
	code := "package p\ntype NetConf struct {\n\t// A is a.\n\tA int `json:\"a\"`\n\tB int `json:\"b\"`\n}\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cniFields(src); err == nil || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("an undocumented field: got %v", err)
	}
}
