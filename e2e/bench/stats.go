package main

import (
	"fmt"
	"math"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// sample is a set of measurements of one quantity.
type sample []float64

func (s sample) quantile(q float64) float64 { return measure.Quantile(s, q) }

func (s sample) min() float64 { return s.quantile(0) }
func (s sample) max() float64 { return s.quantile(1) }

// ms formats a duration in milliseconds with about three significant
// digits.
func ms(d float64) string {
	if math.IsNaN(d) {
		return "n/a"
	}
	return sig3(d / float64(time.Millisecond))
}

// sig3 formats x with about three significant digits, no exponent.
func sig3(x float64) string {
	a := math.Abs(x)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", x)
	case a >= 10:
		return fmt.Sprintf("%.1f", x)
	case a >= 1:
		return fmt.Sprintf("%.2f", x)
	case a >= 0.1:
		return fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("%.4f", x)
}

// latencyCell is "p50 / p99" in ms, the spread and the count.
func latencyCell(s sample) string {
	if len(s) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("**%s / %s** (min %s, max %s; n=%d)", ms(s.quantile(0.5)), ms(s.quantile(0.99)), ms(s.min()), ms(s.max()), len(s))
}

// bytesMB formats a size in MB (10^6 bytes) and MiB.
func bytesMB(n int64) string {
	return fmt.Sprintf("%s MB (%s MiB)", sig3(float64(n)/1e6), sig3(float64(n)/(1<<20)))
}

func thousands(n int) string {
	neg := n < 0
	if neg {
		n = -n
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// count formats a count: thousands separated from 1,000 on, else about
// three significant digits.
func count(x float64) string {
	if math.Abs(x) >= 1000 {
		return thousands(int(math.Round(x)))
	}
	return sig3(x)
}

// small is sig3, but "< 0.01" below 0.01: a cost per event that rounds
// to nothing.
func small(x float64) string {
	if math.Abs(x) < 0.01 {
		return "< 0.01"
	}
	return sig3(x)
}
