//go:build !linux

// Package preflight checks that this machine can run gymtrace; gymtrace is
// Linux-only, so elsewhere every check reports that.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
)

// Options tunes Run (see the Linux build).
type Options struct {
	NoMount     bool
	Traceparent bool
	StatusPath  string
}

// Report is the outcome of Run.
type Report []string

var errNotLinux = errors.New("gymtrace needs Linux (eBPF); run it on a Linux host, or in the Vagrant VM on " + runtime.GOOS)

// Run reports that gymtrace cannot run on this OS.
func Run(context.Context, Options) Report { return Report{errNotLinux.Error()} }

// OK is always false off Linux.
func (Report) OK() bool { return false }

// Err says why.
func (Report) Err() error { return errNotLinux }

// WriteTable prints the reason.
func (r Report) WriteTable(w io.Writer) error {
	_, err := fmt.Fprintln(w, r[0])
	return err
}

// Required fails off Linux.
func Required(context.Context) error { return errNotLinux }
