package bench

import (
	"fmt"
	"image/color"
	"io"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart geometry (pixels at 96 dpi).
const (
	chartDPI      = 96
	chartW        = 1500
	chartRowH     = 120 // per bar row of a panel row
	chartPanelMin = 300
	chartHeaderH  = 40
)

// Bar colours: medians, p50 and p99.
var (
	colourMedian = color.RGBA{40, 120, 200, 255}
	colourP50    = color.RGBA{60, 170, 90, 255}
	colourP99    = color.RGBA{230, 140, 40, 255}
)

// WriteChart draws the run as PNG: one panel per metric (TCP Gbit/s, RR
// p50/p99 µs, conn/s), each on its own scale, with horizontal bars (median,
// whiskers min–max) labelled with their values. Rows whose server is a
// (TCG) guest get their own row of panels, so their scale does not flatten
// the netns rows.
func (r *Report) WriteChart(w io.Writer) error {
	var groups [][]Row
	var titles []string
	var host, guest []Row
	for _, row := range r.Rows {
		if strings.HasPrefix(row.Server, "guest:") {
			guest = append(guest, row)
		} else {
			host = append(host, row)
		}
	}
	if len(host) > 0 {
		groups, titles = append(groups, host), append(titles, "netns rows")
	}
	if len(guest) > 0 {
		groups, titles = append(groups, guest), append(titles, "guest rows (TCG: the guest CPU bounds them)")
	}
	panelRows := len(groups)
	if r.Services != nil && len(r.Services.Rows) > 0 {
		panelRows++
	}
	if panelRows == 0 {
		return fmt.Errorf("chart: the report has no rows")
	}
	plots := make([][]*plot.Plot, 0, panelRows)
	heights := 0
	for gi, rows := range groups {
		ps, err := metricPanels(rows, titles[gi])
		if err != nil {
			return err
		}
		plots = append(plots, ps)
		heights = max(heights, max(chartPanelMin, chartRowH*len(rows)))
	}
	if panelRows > len(groups) {
		ps, err := r.Services.panels()
		if err != nil {
			return err
		}
		plots = append(plots, ps)
		heights = max(heights, max(chartPanelMin, chartRowH*len(r.Services.Rows)))
	}
	hpx := chartHeaderH + heights*panelRows
	img := vgimg.NewWith(vgimg.UseWH(px(chartW), px(hpx)), vgimg.UseDPI(chartDPI), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	header := plot.New().Title.TextStyle
	header.Font.Size = vg.Points(13)
	busy := "idle CPUs"
	if r.BusyCPUs {
		busy = "CPUs kept busy (SCHED_IDLE)"
	}
	dc.FillText(header, vg.Point{X: dc.Center().X, Y: dc.Max.Y - px(chartHeaderH)/2},
		fmt.Sprintf("lanekit lab bench: %s, %d cores, kernel %s; %d × %gs per metric; RR with %s; median, whiskers min–max",
			r.Machine.CPUModel, r.Machine.Cores, r.Machine.Kernel, max(r.Repeat, r.svcRepeat()), r.DurationS, busy))
	body := draw.Crop(dc, 0, 0, 0, -px(chartHeaderH))
	tiles := draw.Tiles{Rows: panelRows, Cols: 3, PadX: px(24), PadY: px(24),
		PadTop: px(6), PadBottom: px(10), PadLeft: px(10), PadRight: px(30)}
	canvases := plot.Align(plots, tiles, body)
	for i := range plots {
		for j, p := range plots[i] {
			p.Draw(canvases[i][j])
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("encode chart png: %w", err)
	}
	return nil
}

// px converts chart pixels to vg lengths at chartDPI.
func px(n int) vg.Length { return vg.Length(n) * vg.Inch / chartDPI }

// metricPanels builds the three panels of one group of rows; the first row
// is drawn on top.
func metricPanels(rows []Row, title string) ([]*plot.Plot, error) {
	n := len(rows)
	names := make([]string, n)
	for i, row := range rows {
		names[n-1-i] = row.Path
	}
	tcp, err := summaryPanel(rows, "TCP Gbit/s, "+title, "Gbit/s (higher is better)",
		func(r Row) Summary { return r.TCPGbps }, "%.2f")
	if err != nil {
		return nil, err
	}
	rr, err := latencyPanel(rows, "RR round trip, "+title)
	if err != nil {
		return nil, err
	}
	cps, err := summaryPanel(rows, "connections/s, "+title, "conn/s (higher is better)",
		func(r Row) Summary { return r.CPSRange }, "%.0f")
	if err != nil {
		return nil, err
	}
	for _, p := range []*plot.Plot{tcp, rr, cps} {
		p.NominalY(names...)
		p.X.Min = 0
		p.X.Padding, p.Y.Padding = 0, 0
		p.Y.Min, p.Y.Max = -0.6, float64(n-1)+0.6 // whole bars at both ends
		p.Add(plotter.NewGrid())
	}
	return []*plot.Plot{tcp, rr, cps}, nil
}

// summaryPanel: one bar per row at its median, whiskers from min to max,
// the median written at the whisker's end.
func summaryPanel(rows []Row, title, xlabel string, get func(Row) Summary, f string) (*plot.Plot, error) {
	n := len(rows)
	p := plot.New()
	p.Title.Text, p.X.Label.Text = title, xlabel
	vals := make(plotter.Values, n)
	errPts := errorPoints{}
	labels := plotter.XYLabels{}
	for i, row := range rows {
		s, y := get(row), float64(n-1-i)
		vals[n-1-i] = s.Median
		text := "failed"
		if s != (Summary{}) {
			errPts.xys = append(errPts.xys, plotter.XY{X: s.Median, Y: y})
			errPts.errs = append(errPts.errs, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
			text = fmt.Sprintf(f, s.Median)
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: s.Max, Y: y})
		labels.Labels = append(labels.Labels, "  "+text)
	}
	bars, err := plotter.NewBarChart(vals, px(28))
	if err != nil {
		return nil, fmt.Errorf("chart: %w", err)
	}
	bars.Horizontal, bars.Color, bars.LineStyle.Width = true, colourMedian, 0
	p.Add(bars)
	if len(errPts.xys) > 0 {
		eb, err := plotter.NewXErrorBars(errPts)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		p.Add(eb)
	}
	if err := addLabels(p, labels); err != nil {
		return nil, err
	}
	// Room on the right for the value labels.
	p.X.Max = maxX(labels.XYs) * 1.25
	return p, nil
}

// latencyPanel: p50 and p99 bars per row (medians over repetitions).
func latencyPanel(rows []Row, title string) (*plot.Plot, error) {
	n := len(rows)
	p := plot.New()
	p.Title.Text, p.X.Label.Text = title, "µs: p50 green, p99 orange (lower is better)"
	p50, p99 := make(plotter.Values, n), make(plotter.Values, n)
	labels := plotter.XYLabels{}
	for i, row := range rows {
		y := float64(n - 1 - i)
		p50[n-1-i], p99[n-1-i] = row.RRP50us, row.RRP99us
		text := "failed"
		if row.RRP99us > 0 {
			text = fmt.Sprintf("p50 %.1f / p99 %.1f", row.RRP50us, row.RRP99us)
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: row.RRP99us, Y: y})
		labels.Labels = append(labels.Labels, "  "+text)
	}
	w := px(20)
	for _, b := range []struct {
		vals   plotter.Values
		colour color.Color
		offset vg.Length
	}{{p50, colourP50, w / 2}, {p99, colourP99, -w / 2}} {
		bars, err := plotter.NewBarChart(b.vals, w)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		bars.Horizontal, bars.Color, bars.Offset, bars.LineStyle.Width = true, b.colour, b.offset, 0
		p.Add(bars)
	}
	if err := addLabels(p, labels); err != nil {
		return nil, err
	}
	p.X.Max = maxX(labels.XYs) * 1.6
	return p, nil
}

func addLabels(p *plot.Plot, l plotter.XYLabels) error {
	lab, err := plotter.NewLabels(l)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	for i := range lab.TextStyle {
		lab.TextStyle[i].YAlign = draw.YCenter
	}
	p.Add(lab)
	return nil
}

func maxX(xys plotter.XYs) float64 {
	m := 0.0
	for _, xy := range xys {
		m = max(m, xy.X)
	}
	if m == 0 {
		return 1
	}
	return m
}

// errorPoints are medians with their distances to min and max.
type errorPoints struct {
	xys  plotter.XYs
	errs plotter.Errors
}

func (e errorPoints) Len() int                        { return len(e.xys) }
func (e errorPoints) XY(i int) (float64, float64)     { return e.xys[i].X, e.xys[i].Y }
func (e errorPoints) XError(i int) (float64, float64) { return e.errs[i].Low, e.errs[i].High }
