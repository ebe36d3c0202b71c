package guest

import (
	"strings"
	"testing"
)

func TestFormatCmd(t *testing.T) {
	got, err := FormatCmd("7", "uname -r")
	if err != nil || got != "LKCMD 7 uname -r\n" {
		t.Fatalf("FormatCmd = %q, %v", got, err)
	}
	for _, bad := range [][2]string{{"", "x"}, {"a b", "x"}, {"1", "a\nb"}, {"1", "  "}, {"1", strings.Repeat("x", maxCmdLen)}} {
		if _, err := FormatCmd(bad[0], bad[1]); err == nil {
			t.Errorf("FormatCmd(%q, %.20q) accepted", bad[0], bad[1])
		}
	}
}

func TestCleanLine(t *testing.T) {
	in := "\x1bc\x1b[?7l\x1b[2JLK-READY net=none\r\n"
	if got := CleanLine(in); got != "LK-READY net=none" {
		t.Fatalf("CleanLine = %q", got)
	}
}

func TestParserSession(t *testing.T) {
	var p Parser
	feed := func(l string) (Event, Result) { return p.Feed(l + "\r\n") }
	for _, l := range []string{"SeaBIOS (version 1.16)", "Booting from ROM...", "LKOUT 1 0"} {
		if ev, _ := feed(l); ev != EvNone {
			t.Fatalf("noise %q gave event %v", l, ev)
		}
	}
	if ok, _, _ := p.Ready(); ok {
		t.Fatal("ready before the marker")
	}
	if ev, _ := feed("\x1bc\x1b[?7l\x1b[2JLK-READY net=up if=eth0 ip=10.244.2.50/32 queues=2"); ev != EvReady {
		t.Fatalf("ready line gave %v", ev)
	}
	ok, status, failed := p.Ready()
	if !ok || failed || status != "net=up if=eth0 ip=10.244.2.50/32 queues=2" {
		t.Fatalf("Ready() = %v %q %v", ok, status, failed)
	}
	if ReadyField(status, "queues") != "2" || ReadyField(status, "if") != "eth0" || ReadyField(status, "mtu") != "" {
		t.Fatalf("ReadyField on %q", status)
	}
	// Output lines, including ones that look like markers, belong to the command.
	lines := []string{"LKBEGIN 1", "6.1.0-56-cloud-amd64", "LK-READY fake", "LKOUT 2 0", "", "", "LKOUT 1 3"}
	var res Result
	var n int
	for _, l := range lines {
		ev, r := feed(l)
		if ev == EvResult {
			res, n = r, n+1
		}
	}
	if n != 1 || res.ID != "1" || res.Exit != 3 || res.Output != "6.1.0-56-cloud-amd64\nLK-READY fake\nLKOUT 2 0\n\n" {
		t.Fatalf("result %+v (%d results)", res, n)
	}
	// A command without output.
	feed("LKBEGIN 2")
	feed("")
	if ev, r := feed("LKOUT 2 0"); ev != EvResult || r.Output != "" || r.Exit != 0 {
		t.Fatalf("empty command: %v %+v", ev, r)
	}
	// Malformed exit codes are output, not the end of the command.
	feed("LKBEGIN 3")
	if ev, _ := feed("no newline at the endLKOUT 3 x"); ev != EvNone {
		t.Fatal("malformed LKOUT ended the command")
	}
	if ev, _ := feed("LKOUT 3 127"); ev != EvResult {
		t.Fatalf("LKOUT 3 127 gave %v", ev)
	}
	feed("LKBEGIN 4")
	feed("unterminated")
	if ev, r := feed("LKOUT 4 127"); ev != EvResult || r.Exit != 127 || r.Output != "unterminated" {
		t.Fatalf("after malformed: %v %+v", ev, r)
	}
}

// A command whose LKOUT never arrived is reported lost when the loop shows it
// went on (the next LKBEGIN or a ping's LKPONG), not left swallowing output.
func TestParserLostResult(t *testing.T) {
	var p Parser
	p.Feed("LK-READY net=none\n")
	p.Feed("LKBEGIN 8\n")
	p.Feed("partial\n")
	ev, r := p.Feed("LKPONG 8.1\n")
	if ev != EvResult || !r.Lost || r.ID != "8" || r.Output != "partial" {
		t.Fatalf("pong during command: %v %+v", ev, r)
	}
	if ev, r := p.Feed("LKPONG 8.2\n"); ev != EvPong || r.ID != "8.2" {
		t.Fatalf("pong between commands: %v %+v", ev, r)
	}
	p.Feed("LKBEGIN 9\n")
	ev, r = p.Feed("LKBEGIN 10\n")
	if ev != EvResult || !r.Lost || r.ID != "9" {
		t.Fatalf("begin during command: %v %+v", ev, r)
	}
	p.Feed("out\n")
	if ev, r := p.Feed("LKOUT 10 0\n"); ev != EvResult || r.Lost || r.ID != "10" || r.Output != "out" {
		t.Fatalf("command after a lost one: %v %+v", ev, r)
	}
	if _, err := FormatPing("a b"); err == nil {
		t.Fatal("FormatPing took a two-word id")
	}
}

func TestParserFail(t *testing.T) {
	var p Parser
	if ev, _ := p.Feed("LK-FAIL no nic (mac 52:54:00:4c:4b:01) after 10s\n"); ev != EvFail {
		t.Fatalf("fail line gave %v", ev)
	}
	ok, status, failed := p.Ready()
	if !ok || !failed || status != "no nic (mac 52:54:00:4c:4b:01) after 10s" {
		t.Fatalf("Ready() = %v %q %v", ok, status, failed)
	}
	if ev, _ := p.Feed("LK-READY net=none\n"); ev != EvNone {
		t.Fatal("second ready marker reported")
	}
}
