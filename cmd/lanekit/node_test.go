package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, v := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNodeCheckFakeRoot runs `lanekit node check` against a fake /proc+/sys:
// --json, --apply (state file), --revert, and bad flags.
func TestNodeCheckFakeRoot(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"proc/sys/net/core/somaxconn":     "128",
		"proc/sys/net/ipv4/tcp_rmem":      "4096 131072 6291456",
		"proc/cmdline":                    "quiet",
		"sys/class/net/up0/mtu":           "1500",
		"sys/class/net/up0/queues/rx-0/x": "",
	})
	state := filepath.Join(t.TempDir(), "tuning.json")
	reset := func() {
		nodeOpts.json, nodeOpts.apply, nodeOpts.revert, nodeOpts.only, nodeOpts.guestMemory = false, false, false, nil, ""
	}
	run := func(args ...string) (string, error) {
		reset()
		return runCLI(t, append([]string{"node", "check", "--root", root, "--state", state, "--uplink", "up0"}, args...)...)
	}
	out, err := run("--json", "--guest-memory", "1G")
	if err != nil {
		t.Fatalf("node check --json: %v\n%s", err, out)
	}
	var rep nodeReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	items := map[string]string{}
	for _, it := range rep.Items {
		items[it.Name] = string(it.Status) + " " + it.Current
	}
	for name, want := range map[string]string{
		"net.core.somaxconn": "warn 128", "net.ipv4.tcp_rmem": "warn 4096 131072 6291456",
		"net.core.rmem_max": "missing absent", "vhost_net": "missing no /dev/vhost-net, module not loaded",
		"uplink-mtu": "ok up0 1500, 0 lanekit devices",
	} {
		if items[name] != want {
			t.Errorf("%s = %q, want %q", name, items[name], want)
		}
	}
	if _, ok := items["tcx"]; !ok || rep.Worst != "missing" || len(rep.Choices) != 4 {
		t.Errorf("no feature rows, worst %q or choices %v", rep.Worst, rep.Choices)
	}

	out, err = run("--apply", "--only", "net.core.somaxconn,net.ipv4.tcp_rmem")
	if err != nil {
		t.Fatalf("--apply: %v\n%s", err, out)
	}
	if !strings.Contains(out, `applied: net.core.somaxconn "128" -> "4096"`) ||
		!strings.Contains(out, `applied: net.ipv4.tcp_rmem "4096 131072 6291456" -> "4096 131072 16777216"`) {
		t.Errorf("apply output:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "proc/sys/net/core/somaxconn")); strings.TrimSpace(string(b)) != "4096" {
		t.Errorf("somaxconn after apply = %q", b)
	}
	out, err = run("--revert", "--only", "net.core.somaxconn")
	if err != nil || !strings.Contains(out, `reverted: net.core.somaxconn "4096" -> "128"`) {
		t.Errorf("--revert: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "proc/sys/net/core/somaxconn")); strings.TrimSpace(string(b)) != "128" {
		t.Errorf("somaxconn after revert = %q", b)
	}
	for _, bad := range [][]string{{"--apply", "--revert"}, {"--guest-memory", "lots"}, {"--only", "no.such.item"}} {
		if out, err := run(bad...); err == nil {
			t.Errorf("%v: no error\n%s", bad, out)
		}
	}
}
