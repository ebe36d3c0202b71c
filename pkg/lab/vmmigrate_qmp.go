package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a QEMU Machine Protocol connection: one JSON object per line;
// commands are answered in order, events arrive in between.
type qmp struct {
	conn    net.Conn
	mu      sync.Mutex // one command at a time
	replies chan qmpMsg
	events  chan qmpMsg
	done    chan struct{}
	err     error // set before done closes
}

type qmpMsg struct {
	Event     string          `json:"event"`
	Return    json.RawMessage `json:"return"`
	Error     *qmpError       `json:"error"`
	Data      json.RawMessage `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
	QMP json.RawMessage `json:"QMP"`
}

type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (m qmpMsg) time() time.Time {
	return time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
}

// dialQMP connects to path (retrying until it appears or ctx ends) and
// negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var conn net.Conn
	for {
		var err error
		var d net.Dialer
		if conn, err = d.DialContext(ctx, "unix", path); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w", path, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	q := &qmp{conn: conn, replies: make(chan qmpMsg, 4), events: make(chan qmpMsg, 64), done: make(chan struct{})}
	go q.read()
	select {
	case m := <-q.replies: // the greeting
		if m.QMP == nil {
			q.Close()
			return nil, fmt.Errorf("qmp %s: no greeting", path)
		}
	case <-q.done:
		return nil, fmt.Errorf("qmp %s: %w", path, q.err)
	case <-ctx.Done():
		q.Close()
		return nil, fmt.Errorf("qmp %s: %w", path, ctx.Err())
	}
	if _, err := q.call(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) read() {
	defer close(q.done)
	sc := bufio.NewScanner(q.conn)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var m qmpMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			q.err = fmt.Errorf("qmp: %q: %w", sc.Text(), err)
			return
		}
		if m.Event != "" {
			select {
			case q.events <- m:
			default: // nobody waits for it
			}
			continue
		}
		q.replies <- m
	}
	q.err = sc.Err()
	if q.err == nil {
		q.err = errors.New("qmp: connection closed")
	}
}

// call runs cmd and returns its "return" value.
func (q *qmp) call(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	msg := map[string]any{"execute": cmd}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case m := <-q.replies:
		if m.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, m.Error.Class, m.Error.Desc)
		}
		return m.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("qmp %s: %w", cmd, q.err)
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// waitEvent waits for the event name.
func (q *qmp) waitEvent(ctx context.Context, name string) (qmpMsg, error) {
	for {
		select {
		case m := <-q.events:
			if m.Event == name {
				return m, nil
			}
		case <-q.done:
			return qmpMsg{}, fmt.Errorf("qmp: waiting for %s: %w", name, q.err)
		case <-ctx.Done():
			return qmpMsg{}, fmt.Errorf("qmp: waiting for %s: %w", name, ctx.Err())
		}
	}
}

func (q *qmp) Close() error { return q.conn.Close() }

// migrationInfo is what QEMU's query-migrate reports.
type migrationInfo struct {
	Status    string `json:"status"`
	TotalTime int64  `json:"total-time"` // ms
	Downtime  int64  `json:"downtime"`   // ms
	ErrorDesc string `json:"error-desc"`
	RAM       struct {
		Transferred int64 `json:"transferred"`
	} `json:"ram"`
}

// waitMigrated polls the source's query-migrate until the migration ends.
func (q *qmp) waitMigrated(ctx context.Context) (migrationInfo, error) {
	for {
		raw, err := q.call(ctx, "query-migrate", nil)
		if err != nil {
			return migrationInfo{}, err
		}
		var mi migrationInfo
		if err := json.Unmarshal(raw, &mi); err != nil {
			return migrationInfo{}, fmt.Errorf("query-migrate: %w", err)
		}
		switch mi.Status {
		case "completed":
			return mi, nil
		case "failed", "cancelled":
			return mi, fmt.Errorf("migration %s: %s", mi.Status, mi.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return mi, fmt.Errorf("migration still %s: %w", mi.Status, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
