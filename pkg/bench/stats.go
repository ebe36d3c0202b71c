// Package bench runs the side-by-side datapath benchmark: one harness for every
// row, where a row is a (client netns, server netns, server IP) triple, and the
// parsing, statistics, report and chart around it.
package bench

import (
	"math"
	"sort"
)

// Summary is the spread of one metric over the repetitions of a row.
type Summary struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

// Summarize returns min, median and max of xs; NaN values are ignored. An
// empty input gives a zero Summary.
func Summarize(xs []float64) Summary {
	vals := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			vals = append(vals, x)
		}
	}
	if len(vals) == 0 {
		return Summary{}
	}
	sort.Float64s(vals)
	return Summary{Min: vals[0], Median: median(vals), Max: vals[len(vals)-1]}
}

// median of an already sorted, non-empty slice.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// Ratio returns a/b, or NaN when b is zero.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
