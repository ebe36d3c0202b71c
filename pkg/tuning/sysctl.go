package tuning

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// sysctl is one tunable: its recommended minimum (one or more fields,
// whitespace-separated) and whether it is per network namespace.
type sysctl struct {
	name   string // dotted name, net.core.rmem_max
	min    []int64
	perNet bool
	why    string
}

func (s sysctl) path() string { return "/proc/sys/" + strings.ReplaceAll(s.name, ".", "/") }

// The recommended minimums follow the KVM tuning checklist: socket buffers
// big enough for a 10-25 Gbit/s stream with some latency, and queues that do
// not drop bursts from many virtio queues.
var sysctls = []sysctl{
	{name: "net.core.rmem_max", min: []int64{16 << 20}, why: "caps SO_RCVBUF: vhost/AF_XDP backends and iperf-class flows need more than the default"},
	{name: "net.core.wmem_max", min: []int64{16 << 20}, why: "caps SO_SNDBUF for the same flows"},
	{name: "net.core.rmem_default", min: []int64{1 << 20}, why: "default receive buffer of sockets that do not set one (UDP, tap)"},
	{name: "net.core.wmem_default", min: []int64{1 << 20}, why: "default send buffer of sockets that do not set one"},
	{name: "net.ipv4.tcp_rmem", min: []int64{4096, 131072, 16 << 20}, perNet: true, why: "TCP receive autotuning range (min default max)"},
	{name: "net.ipv4.tcp_wmem", min: []int64{4096, 16384, 16 << 20}, perNet: true, why: "TCP send autotuning range (min default max)"},
	{name: "net.core.netdev_max_backlog", min: []int64{16384}, why: "per-CPU backlog of received packets: bursts from many queues are dropped above it"},
	{name: "net.core.somaxconn", min: []int64{4096}, perNet: true, why: "listen backlog cap for connection-heavy pods"},
}

func parseFields(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Fields(s) {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parse %q: %w", s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func joinFields(v []int64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(parts, " ")
}

// target is the value --apply writes: each field raised to the recommended
// minimum, never lowered.
func (s sysctl) target(cur []int64) []int64 {
	out := append([]int64(nil), cur...)
	for i := range out {
		if i < len(s.min) && out[i] < s.min[i] {
			out[i] = s.min[i]
		}
	}
	return out
}

func checkSysctls(o Options) []Item {
	var items []Item
	for i := range sysctls {
		s := &sysctls[i]
		it := Item{Name: s.name, Category: "sysctl", Scope: "global", Recommended: ">= " + joinFields(s.min), Why: s.why, sysctl: s}
		if s.perNet {
			it.Scope = "netns"
		}
		raw, err := o.read(s.path())
		if err != nil {
			it.Status, it.Current = StatusMissing, "absent"
			it.Why = fmt.Sprintf("%s (%v)", s.why, err)
			items = append(items, it)
			continue
		}
		it.Current = strings.Join(strings.Fields(raw), " ")
		cur, err := parseFields(raw)
		if err != nil || len(cur) != len(s.min) {
			it.Status = StatusWarn
			it.Why = fmt.Sprintf("%s (unexpected value %q)", s.why, raw)
			items = append(items, it)
			continue
		}
		it.Status, it.Applicable = StatusOK, true
		if joinFields(s.target(cur)) != joinFields(cur) {
			it.Status = StatusWarn
		}
		items = append(items, it)
	}
	return items
}

// Change is one sysctl write made by Apply or Revert.
type Change struct {
	Name string `json:"name"`
	From string `json:"from"`
	To   string `json:"to"`
}

// State is what Apply records for Revert.
type State struct {
	Version  int       `json:"version"`
	Applied  time.Time `json:"applied"`
	Root     string    `json:"root,omitempty"`
	Previous []Change  `json:"previous"` // From: the value before lanekit first changed it
}

// Apply raises every applicable sysctl below its recommendation and records
// the values it replaced in statePath (merged with an existing state file:
// the first recorded value of a sysctl is kept, so Revert restores the
// node's original). Only items as returned by Check with the same Options.
func Apply(o Options, items []Item, statePath string) ([]Change, error) {
	st, err := loadState(statePath)
	if err != nil {
		return nil, err
	}
	recorded := map[string]bool{}
	for _, c := range st.Previous {
		recorded[c.Name] = true
	}
	var changes []Change
	for _, it := range items {
		if !it.Applicable || it.Status == StatusOK || it.sysctl == nil {
			continue
		}
		s := it.sysctl
		raw, err := o.read(s.path())
		if err != nil {
			return changes, fmt.Errorf("apply %s: %w", s.name, err)
		}
		cur, err := parseFields(raw)
		if err != nil {
			return changes, fmt.Errorf("apply %s: %w", s.name, err)
		}
		from, to := joinFields(cur), joinFields(s.target(cur))
		if from == to {
			continue
		}
		if !recorded[s.name] {
			st.Previous = append(st.Previous, Change{Name: s.name, From: from, To: to})
			recorded[s.name] = true
			// Record before writing: a crash between the two leaves a
			// restorable state, never an unrecorded change.
			if err := saveState(statePath, st, o.Root); err != nil {
				return changes, err
			}
		}
		if err := os.WriteFile(o.path(s.path()), []byte(to+"\n"), 0o644); err != nil {
			return changes, fmt.Errorf("apply %s = %q: %w", s.name, to, err)
		}
		changes = append(changes, Change{Name: s.name, From: from, To: to})
	}
	return changes, nil
}

// Revert writes back the values recorded in statePath and removes it.
func Revert(o Options, statePath string) ([]Change, error) {
	st, err := loadState(statePath)
	if err != nil {
		return nil, err
	}
	if len(st.Previous) == 0 {
		return nil, fmt.Errorf("revert: nothing recorded in %s", statePath)
	}
	var changes []Change
	var errs []error
	for _, p := range st.Previous {
		path := o.path("/proc/sys/" + strings.ReplaceAll(p.Name, ".", "/"))
		cur := ""
		if b, err := os.ReadFile(path); err == nil {
			cur = strings.Join(strings.Fields(string(b)), " ")
		}
		if err := os.WriteFile(path, []byte(p.From+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("revert %s = %q: %w", p.Name, p.From, err))
			continue
		}
		changes = append(changes, Change{Name: p.Name, From: cur, To: p.From})
	}
	if err := errors.Join(errs...); err != nil {
		return changes, err
	}
	if err := os.Remove(statePath); err != nil {
		return changes, fmt.Errorf("revert: remove %s: %w", statePath, err)
	}
	return changes, nil
}

func loadState(path string) (State, error) {
	st := State{Version: 1}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read tuning state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("read tuning state %s: %w", path, err)
	}
	if st.Version != 1 {
		return st, fmt.Errorf("tuning state %s: version %d, want 1", path, st.Version)
	}
	return st, nil
}

func saveState(path string, st State, root string) error {
	st.Version, st.Applied, st.Root = 1, time.Now().UTC(), root
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("save tuning state: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("save tuning state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save tuning state: %w", err)
	}
	return nil
}
