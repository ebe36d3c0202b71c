package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Group is a set of rows that live in an environment of their own (the
// lab in one routing mode), of which only one can exist at a time. RunGroups
// brings it up for each repetition and removes it again, so groups are
// interleaved like paths are within a repetition.
type Group struct {
	Name string
	// Up builds the environment and returns its paths (the same names
	// every time) and the rows it could not offer.
	Up func(ctx context.Context) ([]Path, []string, error)
	// Down removes the environment; it is called after every Up, also a
	// failed one.
	Down func(ctx context.Context) error
}

// CrossRef asks for a row of one group as a paired ratio to a row of
// another: repetition k of both were measured within the same repetition
// of the run (one group right after the other).
type CrossRef struct {
	Path, Group   string
	Ref, RefGroup string
}

// CrossRatio is a CrossRef's result.
type CrossRatio struct {
	Path     string       `json:"path"`
	Group    string       `json:"group"`
	Ref      string       `json:"ref"`
	RefGroup string       `json:"ref_group"`
	Ratios   PairedRatios `json:"ratios"`
}

// GroupResult is one group's report (its rows' paired ratios are to its
// own host-raw and host rows).
type GroupResult struct {
	Name   string  `json:"name"`
	Report *Report `json:"report"`
}

// GroupReport is the result of RunGroups.
type GroupReport struct {
	Machine   Machine `json:"machine"`
	Repeat    int     `json:"repeat"`
	DurationS float64 `json:"duration_s"`
	BusyCPUs  bool    `json:"busy_cpus"`
	// Order lists, per repetition, the groups in the order they ran.
	Order  [][]string    `json:"order"`
	Groups []GroupResult `json:"groups"`
	Cross  []CrossRatio  `json:"cross,omitempty"`
	// Errors: environments that failed to come up or go away.
	Errors []string `json:"errors,omitempty"`
}

// groupRun is RunGroups' state of one group.
type groupRun struct {
	g     Group
	paths []Path    // from the first Up that worked
	all   []samples // indexed like paths
}

// RunGroups measures every group's paths Repeat times. Repetition k brings
// each group up in turn (the order rotates by repetition, so no group is
// always first), measures one repetition of its paths (measureRep, as Run)
// and takes it down again. A group that fails to come up leaves gaps in
// that repetition. It fails only on a cancelled context or bad input.
func RunGroups(ctx context.Context, groups []Group, cross []CrossRef, o Options) (*GroupReport, error) {
	if len(groups) == 0 {
		return nil, fmt.Errorf("bench: no groups to measure")
	}
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if o.Duration < time.Second {
		o.Duration = time.Second
	}
	seen := map[string]bool{}
	for _, g := range groups {
		if g.Name == "" || seen[g.Name] || g.Up == nil || g.Down == nil {
			return nil, fmt.Errorf("bench: group %q: a unique name, Up and Down needed", g.Name)
		}
		seen[g.Name] = true
	}
	runs := make([]*groupRun, len(groups))
	for i, g := range groups {
		runs[i] = &groupRun{g: g}
	}
	out := &GroupReport{Machine: DescribeMachine(), Repeat: o.Repeat, DurationS: o.Duration.Seconds(), BusyCPUs: o.BusyCPUs}
	for rep := 0; rep < o.Repeat; rep++ {
		var order []string
		for k := range runs {
			r := runs[(k+rep)%len(runs)]
			order = append(order, r.g.Name)
			if err := r.measure(ctx, rep, o, out); err != nil {
				return nil, err
			}
		}
		out.Order = append(out.Order, order)
	}
	for _, r := range runs {
		rep := &Report{Machine: out.Machine, Repeat: o.Repeat, DurationS: out.DurationS, BusyCPUs: o.BusyCPUs}
		if len(r.paths) > 0 {
			rep = buildReport(r.paths, r.all, o)
		}
		out.Groups = append(out.Groups, GroupResult{Name: r.g.Name, Report: rep})
	}
	out.Cross = out.crossRatios(cross)
	return out, nil
}

// measure brings r's group up, measures repetition rep and takes it down.
func (r *groupRun) measure(ctx context.Context, rep int, o Options, out *GroupReport) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	o.progress("%s rep %d/%d: up", r.g.Name, rep+1, o.Repeat)
	paths, skipped, err := r.g.Up(ctx)
	defer func() {
		if derr := r.g.Down(context.WithoutCancel(ctx)); derr != nil {
			out.Errors = append(out.Errors, fmt.Sprintf("%s rep %d: down: %v", r.g.Name, rep+1, derr))
		}
	}()
	for _, s := range skipped {
		o.progress("%s: skipping %s", r.g.Name, s)
	}
	if err == nil && len(paths) == 0 {
		err = fmt.Errorf("no paths")
	}
	if err != nil {
		out.Errors = append(out.Errors, fmt.Sprintf("%s rep %d: up: %v", r.g.Name, rep+1, err))
		return ctx.Err()
	}
	if r.paths == nil {
		r.paths = paths
		r.all = make([]samples, len(paths))
		for i := range r.all {
			r.all[i] = newSamples(o.Repeat)
		}
	}
	// Rows by name: an environment brought up again offers the same rows.
	var now []Path
	var into []samples
	idx := map[string]int{}
	for i, p := range r.paths {
		idx[p.Name] = i
	}
	for _, p := range paths {
		i, ok := idx[p.Name]
		if !ok {
			out.Errors = append(out.Errors, fmt.Sprintf("%s rep %d: row %s was not there in the first repetition: not measured", r.g.Name, rep+1, p.Name))
			continue
		}
		now = append(now, p)
		into = append(into, r.all[i])
	}
	for _, p := range now {
		if p.Guest != nil {
			defer p.Guest.Close()
		}
	}
	err = measureRep(ctx, r.g.Name, now, into, rep, o)
	for k, p := range now {
		r.all[idx[p.Name]] = into[k]
	}
	return err
}

// crossRatios computes the asked cross-group ratios present in g.
func (g *GroupReport) crossRatios(refs []CrossRef) []CrossRatio {
	var out []CrossRatio
	for _, c := range refs {
		row, ref := g.row(c.Group, c.Path), g.row(c.RefGroup, c.Ref)
		if row == nil || ref == nil {
			continue
		}
		out = append(out, CrossRatio{Path: c.Path, Group: c.Group, Ref: c.Ref, RefGroup: c.RefGroup, Ratios: PairedRatios{
			TCPGbps: pairedRatio(row.Reps.TCPGbps, ref.Reps.TCPGbps),
			RRP50us: pairedRatio(row.Reps.RRP50us, ref.Reps.RRP50us),
			RRP99us: pairedRatio(row.Reps.RRP99us, ref.Reps.RRP99us),
			CPS:     pairedRatio(row.Reps.CPS, ref.Reps.CPS),
		}})
	}
	return out
}

func (g *GroupReport) row(group, path string) *Row {
	for _, r := range g.Groups {
		if r.Name == group && r.Report != nil {
			return r.Report.row(path)
		}
	}
	return nil
}

// Failed reports whether a group failed to come up or a measurement failed.
func (g *GroupReport) Failed() bool {
	if len(g.Errors) > 0 {
		return true
	}
	for _, r := range g.Groups {
		if r.Report == nil || r.Report.Failed() {
			return true
		}
	}
	return false
}

// WriteJSON writes g as one indented JSON document.
func (g *GroupReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(g); err != nil {
		return fmt.Errorf("encode bench report: %w", err)
	}
	return nil
}

// WriteTable prints each group's table, then the cross-group ratios.
func (g *GroupReport) WriteTable(w io.Writer) error {
	var order []string
	for _, o := range g.Order {
		order = append(order, strings.Join(o, ","))
	}
	fmt.Fprintf(w, "groups interleaved per repetition (order: %s)\n", strings.Join(order, " | "))
	for _, r := range g.Groups {
		fmt.Fprintf(w, "\n== %s ==\n", r.Name)
		if err := r.Report.WriteTable(w); err != nil {
			return err
		}
	}
	if len(g.Cross) > 0 {
		fmt.Fprintln(w, "\npaired across groups (same repetition), median (min–max):")
		for _, c := range g.Cross {
			fmt.Fprintf(w, "  %s (%s) / %s (%s): TCP %s, RR p50 %s, RR p99 %s, conn/s %s\n", c.Path, c.Group, c.Ref, c.RefGroup,
				ratioText(c.Ratios.TCPGbps), ratioText(c.Ratios.RRP50us), ratioText(c.Ratios.RRP99us), ratioText(c.Ratios.CPS))
		}
	}
	for _, e := range g.Errors {
		fmt.Fprintln(w, "error:", e)
	}
	return nil
}

func ratioText(s *Summary) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Median, s.Min, s.Max)
}
