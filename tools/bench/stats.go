//go:build linux

package main

import (
	"encoding/json"
	"math"
	"slices"
	"sort"
)

// Interval is a point estimate with a 95 % confidence interval. N is the
// number of paired repetitions behind it; with N < 2 there is no interval and
// Lo == Hi == Mean.
type Interval struct {
	Mean float64 `json:"mean"`
	Lo   float64 `json:"lo"`
	Hi   float64 `json:"hi"`
	N    int     `json:"n"`
}

// MarshalJSON writes null for a missing value (JSON has no NaN).
func (iv Interval) MarshalJSON() ([]byte, error) {
	if !iv.Valid() {
		return []byte("null"), nil
	}
	type plain Interval
	return json.Marshal(plain(iv))
}

// Valid reports whether the interval has a value at all.
func (iv Interval) Valid() bool { return iv.N > 0 && !math.IsNaN(iv.Mean) }

// tQuantile975 is Student's t at 0.975 for df degrees of freedom: the
// two-sided 95 % interval. Rounds are few (2..20), so a table is exact enough
// and keeps the harness free of a stats dependency.
func tQuantile975(df int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	switch {
	case df < 1:
		return math.NaN()
	case df < len(table):
		return table[df]
	case df < 60:
		return 2.00
	default:
		return 1.96
	}
}

func meanSD(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(xs)-1))
}

// MeanCI is the mean of xs with a t-interval. NaNs are skipped.
func MeanCI(xs []float64) Interval {
	xs = finite(xs)
	if len(xs) == 0 {
		return Interval{Mean: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	m, sd := meanSD(xs)
	if len(xs) < 2 {
		return Interval{Mean: m, Lo: m, Hi: m, N: 1}
	}
	h := tQuantile975(len(xs)-1) * sd / math.Sqrt(float64(len(xs)))
	return Interval{Mean: m, Lo: m - h, Hi: m + h, N: len(xs)}
}

// RatioCI summarises paired ratios (traced/untraced, one per round) by their
// geometric mean with a t-interval on the logs: ratios multiply, so the log
// scale is where they are symmetric, and the interval never goes negative.
func RatioCI(ratios []float64) Interval {
	var logs []float64
	for _, r := range ratios {
		if r > 0 && !math.IsInf(r, 0) {
			logs = append(logs, math.Log(r))
		}
	}
	iv := MeanCI(logs)
	if iv.N == 0 {
		return iv
	}
	return Interval{Mean: math.Exp(iv.Mean), Lo: math.Exp(iv.Lo), Hi: math.Exp(iv.Hi), N: iv.N}
}

// Percentile is the p-th percentile (0..100) of xs by linear interpolation
// between closest ranks; NaN for no data.
func Percentile(xs []float64, p float64) float64 {
	xs = finite(xs)
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 1 {
		return s[0]
	}
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	frac := pos - float64(lo)
	return s[lo] + frac*(s[lo+1]-s[lo])
}

// Median of xs (NaN for none).
func Median(xs []float64) float64 { return Percentile(xs, 50) }

func finite(xs []float64) []float64 {
	out := xs[:0:0]
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			out = append(out, x)
		}
	}
	return out
}

// rotation returns the run order of round r over n configurations. Rounds
// go in pairs: round 2k runs the configurations from k (mod n) onwards, and
// round 2k+1 runs the same order backwards. Each pair puts every
// configuration as far before untraced as after it, so a drift of the
// machine that is linear across the two rounds cancels out of the paired
// ratios for any even number of rounds, and the starting point moves so
// that no configuration is always first after a restart.
func rotation(n, r int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = (i + r/2) % n
	}
	if r%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

func mean(xs []float64) float64 {
	xs = finite(xs)
	if len(xs) == 0 {
		return math.NaN()
	}
	m, _ := meanSD(xs)
	return m
}
