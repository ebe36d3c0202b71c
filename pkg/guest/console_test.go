package guest

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// fakeLoop plays the guest's control loop on one end of a pipe. Commands
// named "drop" lose their LKOUT line, "silent" both LKBEGIN and LKOUT; "slow"
// finishes after a while.
func fakeLoop(conn net.Conn) {
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == markPing:
			conn.Write([]byte(markPong + " " + f[1] + "\r\n"))
		case len(f) >= 3 && f[0] == markCmd && f[2] == "silent":
			// Neither LKBEGIN nor LKOUT arrives.
		case len(f) >= 3 && f[0] == markCmd:
			conn.Write([]byte(markBegin + " " + f[1] + "\r\nout\r\n\r\n"))
			if f[2] == "slow" {
				time.Sleep(3 * pingEvery)
			}
			if f[2] != "drop" {
				conn.Write([]byte(markOut + " " + f[1] + " 0\r\n"))
			}
		}
	}
}

// TestConsoleLostResult: a result line that never comes is reported once the
// loop answers a ping, instead of hanging until the caller's deadline; a
// slow command that is pinged still returns its result, and the console
// keeps working after both.
func TestConsoleLostResult(t *testing.T) {
	old := pingEvery
	pingEvery = 50 * time.Millisecond
	defer func() { pingEvery = old }()
	host, guest := net.Pipe()
	defer host.Close()
	go fakeLoop(guest)
	c := newConsole(host, nil, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, cmd := range []string{"drop", "silent"} {
		start := time.Now()
		if _, _, err := c.Run(ctx, cmd); !errors.Is(err, ErrResultLost) {
			t.Fatalf("%s: %v", cmd, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: lost result took %v to report", cmd, d)
		}
	}
	for _, cmd := range []string{"slow", "fast"} {
		out, code, err := c.Run(ctx, cmd)
		if err != nil || code != 0 || out != "out\n" {
			t.Fatalf("%s after a lost result: %q %d %v", cmd, out, code, err)
		}
	}
}
