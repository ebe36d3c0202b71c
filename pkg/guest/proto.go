package guest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Markers of the serial control protocol (see the package doc).
const (
	markReady = "LK-READY"
	markFail  = "LK-FAIL"
	markCmd   = "LKCMD"
	markBegin = "LKBEGIN"
	markOut   = "LKOUT"
	markPing  = "LKPING"
	markPong  = "LKPONG"
)

// maxCmdLen keeps a command line well under the guest tty's 4095-byte
// canonical line limit.
const maxCmdLen = 3000

// FormatCmd returns the line the host sends to run cmd as request id.
func FormatCmd(id, cmd string) (string, error) {
	if err := checkID("format command", id); err != nil {
		return "", err
	}
	if strings.ContainsAny(cmd, "\r\n") {
		return "", fmt.Errorf("format command %q: must be a single line", cmd)
	}
	if strings.TrimSpace(cmd) == "" {
		return "", fmt.Errorf("format command: empty")
	}
	line := markCmd + " " + id + " " + cmd + "\n"
	if len(line) > maxCmdLen {
		return "", fmt.Errorf("format command: %d bytes: longer than %d", len(line), maxCmdLen)
	}
	return line, nil
}

// ansiRE matches the terminal escapes firmware writes to the serial console
// (SeaBIOS clears the screen: ESC c, ESC [ ... letter).
var ansiRE = regexp.MustCompile(`\x1b(\[[0-9;?]*[A-Za-z]|[A-Za-z])`)

// CleanLine strips the carriage return and terminal escapes from a console line.
func CleanLine(s string) string {
	s = strings.TrimRight(s, "\r\n")
	s = strings.ReplaceAll(s, "\r", "")
	return ansiRE.ReplaceAllString(s, "")
}

// FormatPing returns the line the host sends to ask the control loop for
// "LKPONG <id>". The loop answers between commands, so a pong that arrives
// while a command's result is still awaited means that result was lost.
func FormatPing(id string) (string, error) {
	if err := checkID("format ping", id); err != nil {
		return "", err
	}
	return markPing + " " + id + "\n", nil
}

// checkID refuses a request id that is not one word.
func checkID(what, id string) error {
	if id == "" || strings.ContainsAny(id, " \t\r\n") {
		return fmt.Errorf("%s: id %q: must be one word", what, id)
	}
	return nil
}

// Result is one finished control command.
type Result struct {
	ID     string
	Output string // stdout and stderr as written, with "\r\n" turned into "\n"
	Exit   int
	// Lost: the command ended but its LKOUT line never came (the guest went
	// on to another command or answered a ping); Output is what arrived.
	Lost bool
}

// Parser turns console lines into protocol events. It is not safe for
// concurrent use; the VM feeds it from one reader goroutine.
type Parser struct {
	cur    string // id between LKBEGIN and LKOUT, "" outside a command
	out    strings.Builder
	ready  bool
	status string // text after LK-READY, or the LK-FAIL reason
	failed bool
}

// Event is what one console line meant.
type Event int

// Events reported by Parser.Feed.
const (
	EvNone   Event = iota // console noise or command output
	EvReady               // LK-READY seen: the control loop runs, network up or not requested
	EvFail                // LK-FAIL seen: the control loop runs, network setup failed
	EvResult              // a command finished, see the returned Result
	EvPong                // the control loop answered the ping Result.ID
)

// Feed consumes one console line.
func (p *Parser) Feed(raw string) (Event, Result) {
	line := CleanLine(raw)
	if p.cur != "" {
		if id, code, ok := parseOut(line); ok && id == p.cur {
			// The guest writes one "\n" before LKOUT so unterminated output
			// still ends the line; drop it to return the output as written.
			out := strings.TrimSuffix(p.out.String(), "\n")
			r := Result{ID: id, Output: out, Exit: code}
			p.cur = ""
			p.out.Reset()
			return EvResult, r
		}
		// The loop only begins a command or answers a ping after LKOUT: the
		// current command's LKOUT was lost. Report it, don't swallow the rest.
		next, isBegin := oneWord(line, markBegin)
		_, isPong := oneWord(line, markPong)
		if isBegin || isPong {
			r := Result{ID: p.cur, Output: strings.TrimSuffix(p.out.String(), "\n"), Exit: -1, Lost: true}
			p.cur = next // "" after a pong
			p.out.Reset()
			return EvResult, r
		}
		p.out.WriteString(line)
		p.out.WriteByte('\n')
		return EvNone, Result{}
	}
	if id, ok := oneWord(line, markBegin); ok {
		p.cur = id
		return EvNone, Result{}
	}
	if id, ok := oneWord(line, markPong); ok {
		return EvPong, Result{ID: id}
	}
	if p.ready {
		return EvNone, Result{}
	}
	// Firmware output may share the line with the marker: search, don't prefix-match.
	if i := strings.Index(line, markReady); i >= 0 {
		rest := line[i+len(markReady):]
		if rest == "" || rest[0] == ' ' {
			p.ready, p.status = true, strings.TrimSpace(rest)
			return EvReady, Result{}
		}
	}
	if i := strings.Index(line, markFail+" "); i >= 0 {
		p.ready, p.failed, p.status = true, true, strings.TrimSpace(line[i+len(markFail):])
		return EvFail, Result{}
	}
	return EvNone, Result{}
}

// Ready reports whether the control loop announced itself, its status text
// (e.g. "net=up if=eth0 ip=10.244.2.50/32 queues=1", or the failure reason)
// and whether network setup failed.
func (p *Parser) Ready() (ready bool, status string, failed bool) {
	return p.ready, p.status, p.failed
}

// oneWord returns the id of a "<marker> <id>" line.
func oneWord(line, marker string) (string, bool) {
	rest, ok := strings.CutPrefix(line, marker+" ")
	if !ok {
		return "", false
	}
	id := strings.TrimSpace(rest)
	if id == "" || strings.Contains(id, " ") {
		return "", false
	}
	return id, true
}

func parseOut(line string) (id string, code int, ok bool) {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != markOut {
		return "", 0, false
	}
	code, err := strconv.Atoi(f[2])
	if err != nil {
		return "", 0, false
	}
	return f[1], code, true
}

// ReadyField returns the value of key in a ready status such as
// "net=up if=eth0 queues=2", or "".
func ReadyField(status, key string) string {
	for _, f := range strings.Fields(status) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}
