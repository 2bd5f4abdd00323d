//go:build linux

package preflight

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status of one feature.
type Status string

const (
	StatusOK      Status = "ok"
	StatusMounted Status = "mounted-by-gymtrace"
	StatusMissing Status = "missing"
)

// Need says what a missing feature costs.
type Need string

const (
	NeedRequired Need = "required" // gymtrace does not start without it
	NeedOptional Need = "optional" // a feature is off without it
	NeedUnused   Need = "unused"   // listed for completeness; gymtrace does not use it
)

// Result is one row of the table.
type Result struct {
	Feature string
	Status  Status
	Need    Need
	Detail  string // what was found
	Fix     string // what to do, when missing
}

// Blocking reports a required feature that is missing.
func (r Result) Blocking() bool { return r.Status == StatusMissing && r.Need == NeedRequired }

// Report is the outcome of Run, in check order.
type Report []Result

// OK is true when no required feature is missing.
func (r Report) OK() bool { return len(r.Blocking()) == 0 }

// Blocking lists the required features that are missing.
func (r Report) Blocking() []Result {
	var out []Result
	for _, x := range r {
		if x.Blocking() {
			out = append(out, x)
		}
	}
	return out
}

// Err is nil when r.OK(), else one error naming every missing required feature
// and what to do about it.
func (r Report) Err() error {
	b := r.Blocking()
	if len(b) == 0 {
		return nil
	}
	capMissing := false
	for _, x := range b {
		capMissing = capMissing || strings.HasPrefix(x.Feature, "CAP_")
	}
	var parts []string
	for _, x := range b {
		// Rows that fail only for want of a capability already named say nothing new.
		if capMissing && strings.HasPrefix(x.Fix, "needs CAP_") {
			continue
		}
		parts = append(parts, x.Feature+" ("+x.Fix+")")
	}
	return fmt.Errorf("gymtrace cannot trace on this machine: missing %s; run `gymtrace check` for the full table", strings.Join(parts, "; "))
}

// WriteTable prints the report as an aligned table and a closing verdict.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tSTATUS\tNEED\tDETAIL / WHAT TO DO")
	for _, x := range r {
		text := x.Detail
		if x.Status == StatusMissing && x.Fix != "" {
			text += " -> " + x.Fix
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.Feature, x.Status, x.Need, text)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var err error
	if b := r.Blocking(); len(b) > 0 {
		names := make([]string, len(b))
		for i, x := range b {
			names[i] = x.Feature
		}
		_, err = fmt.Fprintf(w, "\ngymtrace cannot run here: missing %s\n", strings.Join(names, ", "))
	} else {
		_, err = fmt.Fprintln(w, "\ngymtrace can run here: every required feature is present")
	}
	return err
}
