package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// ErrLinkClosed is returned when the serial link to a guest closed.
var ErrLinkClosed = errors.New("guest serial link closed")

// ErrResultLost is returned when the guest finished a command but its result
// line never reached the host (it answered a later ping or began the next
// command first).
var ErrResultLost = errors.New("guest command's result line lost")

// Console is a client of a guest's serial control loop (see the package doc).
// A VM started with Start has one. A process that did not start the guest (a
// later `lanekit lab check`, say) dials QEMU's serial socket with
// DialConsole: QEMU's socket chardev takes a new client after the previous
// one left. Commands run one at a time.
type Console struct {
	conn     net.Conn
	exited   <-chan struct{} // closed when QEMU is gone; nil when unknown
	linkDown chan struct{}   // closed when the read loop ends

	readyCh chan struct{} // closed on LK-READY or LK-FAIL
	mu      sync.Mutex
	readyAt time.Time
	status  string
	failed  bool
	pending map[string]chan Result
	pings   map[string]string // ping id -> the command id it was sent for
	console []byte

	runMu     sync.Mutex
	nextID    int
	closeOnce sync.Once
}

func newConsole(conn net.Conn, exited <-chan struct{}, ready bool) *Console {
	c := &Console{conn: conn, exited: exited, linkDown: make(chan struct{}), readyCh: make(chan struct{}),
		pending: map[string]chan Result{}, pings: map[string]string{}}
	if ready {
		c.readyAt = time.Now()
		close(c.readyCh)
	}
	go c.readLoop()
	return c
}

// DialConsole connects to the serial socket of a guest that is already
// running and past its ready line (its LK-READY went to an earlier client).
func DialConsole(ctx context.Context, path string) (*Console, error) {
	conn, err := dialSerial(ctx, path, nil, nil)
	if err != nil {
		return nil, err
	}
	return newConsole(conn, nil, true), nil
}

// DialBootingConsole connects to the serial socket of a guest that is still
// booting: WaitReady then waits for its LK-READY line. (QEMU started by the
// caller with the serial server waiting for this first client.)
func DialBootingConsole(ctx context.Context, path string) (*Console, error) {
	conn, err := dialSerial(ctx, path, nil, nil)
	if err != nil {
		return nil, err
	}
	return newConsole(conn, nil, false), nil
}

// dialSerial connects to QEMU's serial socket, retrying until it appears.
// exited (may be nil) aborts the wait; why describes the exit for errors.
func dialSerial(ctx context.Context, path string, exited <-chan struct{}, why func() string) (net.Conn, error) {
	deadline := time.NewTimer(serialDialTimeout)
	defer deadline.Stop()
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect serial %s: %w", path, ctx.Err())
		case <-exited:
			return nil, fmt.Errorf("connect serial: %w: %s", ErrExited, why())
		case <-deadline.C:
			return nil, fmt.Errorf("connect serial %s: %w (after %s)", path, err, serialDialTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readLoop feeds console lines to the protocol parser until the link closes.
func (c *Console) readLoop() {
	defer close(c.linkDown)
	var p Parser
	r := bufio.NewReaderSize(c.conn, 64<<10)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			c.mu.Lock()
			c.console = append(c.console, line...)
			if len(c.console) > consoleKeep {
				c.console = append([]byte(nil), c.console[len(c.console)-consoleKeep:]...)
			}
			c.mu.Unlock()
		}
		if err != nil {
			return
		}
		switch ev, res := p.Feed(line); ev {
		case EvReady, EvFail:
			_, status, failed := p.Ready()
			c.mu.Lock()
			c.status, c.failed = status, failed
			alreadyReady := !c.readyAt.IsZero()
			if !alreadyReady {
				c.readyAt = time.Now()
			}
			c.mu.Unlock()
			if !alreadyReady {
				close(c.readyCh)
			}
		case EvResult:
			c.deliver(res)
		case EvPong:
			// The loop answered a ping sent after the command's line: the
			// command ended, and its result never came.
			c.mu.Lock()
			cmd, ok := c.pings[res.ID]
			delete(c.pings, res.ID)
			c.mu.Unlock()
			if ok {
				c.deliver(Result{ID: cmd, Exit: -1, Lost: true})
			}
		}
	}
}

// deliver hands a result to the Run waiting for it, if any.
func (c *Console) deliver(res Result) {
	c.mu.Lock()
	ch := c.pending[res.ID]
	delete(c.pending, res.ID)
	c.mu.Unlock()
	if ch != nil {
		ch <- res
	}
}

// gone returns the error for a guest that went away, or nil.
func (c *Console) gone() error {
	select {
	case <-c.exited:
		return ErrExited
	default:
	}
	select {
	case <-c.linkDown:
		return ErrLinkClosed
	default:
	}
	return nil
}

// WaitReady waits for the guest's LK-READY line and returns its status text,
// e.g. "net=up if=eth0 ip=10.244.2.50/32 queues=1" or "net=none". An LK-FAIL
// line (network setup failed; the control loop still runs) is an error.
func (c *Console) WaitReady(ctx context.Context) (string, error) {
	select {
	case <-c.readyCh:
	case <-ctx.Done():
		return "", fmt.Errorf("wait for guest ready: %w: console: %s", ctx.Err(), tail(c.Text(), 5))
	case <-c.exited:
		return "", fmt.Errorf("wait for guest ready: %w", ErrExited)
	case <-c.linkDown:
		if err := c.gone(); errors.Is(err, ErrExited) {
			return "", fmt.Errorf("wait for guest ready: %w", err)
		}
		return "", fmt.Errorf("wait for guest ready: %w: console: %s", ErrLinkClosed, tail(c.Text(), 5))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed {
		return c.status, fmt.Errorf("guest network setup: %s", c.status)
	}
	return c.status, nil
}

// ReadyAt is when the ready line was seen (zero before).
func (c *Console) ReadyAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readyAt
}

// Run runs a shell command in the guest and returns its combined output and
// exit code. It waits for the control loop first. The guest bounds each
// command by lk.cmdtimeout; ctx bounds the wait.
func (c *Console) Run(ctx context.Context, cmd string) (string, int, error) {
	if err := c.gone(); err != nil {
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, err)
	}
	select {
	case <-c.readyCh:
	case <-ctx.Done():
		return "", -1, fmt.Errorf("run %q in guest: waiting for control loop: %w", cmd, ctx.Err())
	case <-c.exited:
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ErrExited)
	case <-c.linkDown:
		return "", -1, fmt.Errorf("run %q in guest: %w", cmd, c.gone())
	}
	c.runMu.Lock()
	defer c.runMu.Unlock()
	c.nextID++
	id := strconv.Itoa(c.nextID)
	line, err := FormatCmd(id, cmd)
	if err != nil {
		return "", -1, fmt.Errorf("run in guest: %w", err)
	}
	ch := make(chan Result, 1)
	c.mu.Lock()
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()
	c.conn.SetWriteDeadline(time.Now().Add(serialWriteTime))
	if _, err := c.conn.Write([]byte(line)); err != nil {
		if g := c.gone(); g != nil {
			return "", -1, fmt.Errorf("run %q in guest: %w", cmd, g)
		}
		return "", -1, fmt.Errorf("run %q in guest: write serial: %w", cmd, err)
	}
	// A quiet command is pinged now and then: the loop answers only after
	// the command, so a pong with no result means the result was lost, and
	// the guest's output to the tty is kicked in case it stalled.
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	defer func() {
		c.mu.Lock()
		for p, owner := range c.pings {
			if owner == id {
				delete(c.pings, p)
			}
		}
		c.mu.Unlock()
	}()
	for n := 1; ; n++ {
		select {
		case r := <-ch:
			if r.Lost {
				return r.Output, -1, fmt.Errorf("run %q in guest: %w", cmd, ErrResultLost)
			}
			return r.Output, r.Exit, nil
		case <-ping.C:
			pid := id + "." + strconv.Itoa(n)
			pl, _ := FormatPing(pid)
			c.mu.Lock()
			c.pings[pid] = id
			c.mu.Unlock()
			c.conn.SetWriteDeadline(time.Now().Add(serialWriteTime))
			c.conn.Write([]byte(pl)) // best effort: a failed link ends the wait below
		case <-ctx.Done():
			return "", -1, fmt.Errorf("run %q in guest: %w (console tail: %q)", cmd, ctx.Err(), tail(c.Text(), 3))
		case <-c.exited:
			return "", -1, fmt.Errorf("run %q in guest: %w", cmd, ErrExited)
		case <-c.linkDown:
			return "", -1, fmt.Errorf("run %q in guest: %w", cmd, c.gone())
		}
	}
}

// pingEvery is how long a command may stay quiet before the loop is pinged.
var pingEvery = 10 * time.Second // a var for tests

// Text returns the last console output (up to 256 KiB), raw.
func (c *Console) Text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.console)
}

// Close closes the link; the guest keeps running.
func (c *Console) Close() error {
	var err error
	c.closeOnce.Do(func() { err = c.conn.Close() })
	return err
}
