//go:build !linux

package privs

import "log/slog"

// Needs is what the tracer still does after attaching.
type Needs struct {
	Discovery bool
	Uprobes   bool
}

// DropAfterAttach does nothing: capabilities are a Linux feature.
func DropAfterAttach(*slog.Logger, Needs) {}
