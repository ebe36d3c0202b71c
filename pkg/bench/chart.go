package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart geometry and colours.
const (
	chartW, chartH           = 960, 440
	plotL, plotR             = 60, 940
	plotT, plotB             = 50, 360
	barGap, groupGap         = 4, 28
	maxRatioAxisHeadroomFrac = 1.15
)

var (
	white   = color.RGBA{255, 255, 255, 255}
	black   = color.RGBA{0, 0, 0, 255}
	grey    = color.RGBA{200, 200, 200, 255}
	palette = []color.RGBA{
		{90, 90, 90, 255},   // host
		{230, 140, 40, 255}, // bridge-iptables
		{40, 120, 200, 255}, // lanekit-pod
		{60, 170, 90, 255},
		{170, 70, 160, 255},
		{200, 60, 60, 255},
	}
)

// chartGroups are the metrics on the x axis; latency ratios are "lower is better".
var chartGroups = []struct {
	label string
	value func(*Ratios) *float64
}{
	{"TCP Gbit/s (higher better)", func(r *Ratios) *float64 { return r.TCPGbps }},
	{"RR p50 (lower better)", func(r *Ratios) *float64 { return r.RRP50us }},
	{"RR p99 (lower better)", func(r *Ratios) *float64 { return r.RRP99us }},
	{"conn/s (higher better)", func(r *Ratios) *float64 { return r.CPS }},
}

// WriteChart draws a grouped bar chart of every row's ratio to host, one
// group per metric, with a reference line at 1.0, as PNG.
func (r *Report) WriteChart(w io.Writer) error {
	img := image.NewRGBA(image.Rect(0, 0, chartW, chartH))
	draw.Draw(img, img.Bounds(), &image.Uniform{white}, image.Point{}, draw.Src)

	top := 1.0
	for _, row := range r.Rows {
		if row.RatioToHost == nil {
			continue
		}
		for _, g := range chartGroups {
			if v := g.value(row.RatioToHost); v != nil && !math.IsNaN(*v) {
				top = math.Max(top, *v)
			}
		}
	}
	top = math.Ceil(top*maxRatioAxisHeadroomFrac*4) / 4
	yOf := func(v float64) int { return plotB - int(v/top*float64(plotB-plotT)) }

	text(img, plotL, 20, fmt.Sprintf("lanekit lab bench: ratio to host (%s, %d cores, %d x %gs)",
		r.Machine.Kernel, r.Machine.Cores, r.Repeat, r.DurationS), black)
	// Axis, grid every 0.25 and the 1.0 reference.
	for v := 0.0; v <= top+1e-9; v += 0.25 {
		y := yOf(v)
		c := grey
		if math.Abs(v-1) < 1e-9 {
			c = black
		}
		hline(img, plotL, plotR, y, c, v != 0 && math.Abs(v-1) >= 1e-9)
		text(img, 10, y+4, fmt.Sprintf("%.2f", v), black)
	}
	vline(img, plotL, plotT, plotB, black)

	n := len(r.Rows)
	groupW := (plotR - plotL - groupGap*(len(chartGroups)+1)) / len(chartGroups)
	barW := 1
	if n > 0 {
		barW = max(1, (groupW-barGap*(n-1))/n)
	}
	for gi, g := range chartGroups {
		gx := plotL + groupGap + gi*(groupW+groupGap)
		text(img, gx, plotB+18, g.label, black)
		for ri, row := range r.Rows {
			if row.RatioToHost == nil {
				continue
			}
			v := g.value(row.RatioToHost)
			if v == nil || math.IsNaN(*v) {
				continue
			}
			x0 := gx + ri*(barW+barGap)
			fill(img, image.Rect(x0, yOf(*v), x0+barW, plotB), palette[ri%len(palette)])
			text(img, x0+2, yOf(*v)-3, fmt.Sprintf("%.2f", *v), black)
		}
	}
	// Legend.
	lx := plotL
	note := ""
	for ri, row := range r.Rows {
		label := row.Path
		if row.Note != "" {
			label += " *"
			note = row.Note
		}
		fill(img, image.Rect(lx, plotB+40, lx+12, plotB+52), palette[ri%len(palette)])
		text(img, lx+16, plotB+51, label, black)
		lx += 16 + 7*len(label) + 24
	}
	if note != "" {
		text(img, plotL, plotB+72, "* "+note, black)
	}
	if err := png.Encode(w, img); err != nil {
		return fmt.Errorf("encode chart png: %w", err)
	}
	return nil
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13,
		Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA, dashed bool) {
	for x := x0; x <= x1; x++ {
		if !dashed || (x/4)%2 == 0 {
			img.SetRGBA(x, y, c)
		}
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}
