package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQMP serves one QMP client on a unix socket: the greeting, then for
// each command the scripted lines (events and a reply).
func fakeQMP(t *testing.T, script map[string][]string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}` + "\n"))
		sc := bufio.NewScanner(c)
		counts := map[string]int{}
		for sc.Scan() {
			var m struct {
				Execute string `json:"execute"`
			}
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				return
			}
			lines := script[m.Execute]
			if m.Execute == "query-migrate" { // one status per call
				n := counts[m.Execute]
				counts[m.Execute]++
				lines = lines[min(n, len(lines)-1) : min(n, len(lines)-1)+1]
			}
			if len(lines) == 0 {
				lines = []string{`{"return": {}}`}
			}
			c.Write([]byte(strings.Join(lines, "\n") + "\n"))
		}
	}()
	return path
}

func TestQMPClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path := fakeQMP(t, map[string][]string{
		"migrate": {`{"timestamp": {"seconds": 1700000000, "microseconds": 250000}, "event": "RESUME"}`, `{"return": {}}`},
		"bad":     {`{"error": {"class": "GenericError", "desc": "no such thing"}}`},
		"query-migrate": {`{"return": {"status": "active"}}`,
			`{"return": {"status": "completed", "total-time": 926, "downtime": 23, "ram": {"transferred": 1234}}}`},
	})
	q, err := dialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	// An event before the reply is not taken for the reply, and is kept.
	if _, err := q.call(ctx, "migrate", map[string]any{"uri": "unix:/x"}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	ev, err := q.waitEvent(ctx, "RESUME")
	if err != nil || !ev.time().Equal(time.Unix(1700000000, 250000000)) {
		t.Fatalf("RESUME event %+v at %v: %v", ev, ev.time(), err)
	}
	if _, err := q.call(ctx, "bad", nil); err == nil || !strings.Contains(err.Error(), "no such thing") {
		t.Errorf("error reply: %v", err)
	}
	mi, err := q.waitMigrated(ctx)
	if err != nil || mi.Status != "completed" || mi.TotalTime != 926 || mi.Downtime != 23 {
		t.Errorf("waitMigrated = %+v, %v", mi, err)
	}
}

func TestQMPMigrationFailed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path := fakeQMP(t, map[string][]string{
		"query-migrate": {`{"return": {"status": "failed", "error-desc": "vhost lacks VHOST_F_LOG_ALL"}}`},
	})
	q, err := dialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.waitMigrated(ctx); err == nil || !strings.Contains(err.Error(), "VHOST_F_LOG_ALL") {
		t.Errorf("failed migration: %v", err)
	}
}

func TestMigrationReportString(t *testing.T) {
	r := &MigrationReport{VM: "vm1", Path: "fast-lane", From: 2, To: 1, IP: "10.244.2.2", MAC: "aa:bb:cc:dd:ee:ff",
		SourceID: 2, TargetID: 3, ActivatedBy: "migration-state", PingInterval: 10 * time.Millisecond,
		Pings: []PingStats{{From: "lk-n1-p1", Sent: 300, Lost: 3}, {From: "lk-n2-p1", Sent: 400, Lost: 9}},
		TCP:   TCPStats{From: "lk-n1-p1", Local: "10.244.1.1:4000", Exchanges: 40}, SwitchOver: 33 * time.Millisecond}
	s := r.String()
	for _, want := range []string{"node 2 -> node 1", "endpoint 2 -> 3", "3 lost (30ms)", "9 lost (90ms)", "survived", "switch-over"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if r.Lost() != 12 {
		t.Errorf("lost = %d", r.Lost())
	}
	r.TCP.Error = "read: i/o timeout"
	r.Path, r.TargetID = "bridge-tap", 0
	s = r.String()
	if !strings.Contains(s, "BROKEN") || !strings.Contains(s, "nothing moves the address") || strings.Contains(s, "switch-over") {
		t.Errorf("bridge-tap report:\n%s", s)
	}
}
