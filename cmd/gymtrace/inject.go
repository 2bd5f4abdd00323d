//go:build linux

package main

import (
	"log/slog"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/preflight"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// startInjector attaches traceparent injection (--inject, on by default).
// Injection is an addition: when it cannot attach, gymtrace traces as
// before and says why. Returns nil when off.
func startInjector(kern *loader.Tracer, cfg *config.Config, log *slog.Logger) *inject.Injector {
	if !cfg.Inject {
		return nil
	}
	cg, err := preflight.CgroupV2Path()
	if err != nil {
		log.Warn("traceparent injection is off: no cgroup v2 mount to attach its socket program to; traces will not join across nodes",
			"err", err)
		return nil
	}
	inj, err := inject.Attach(inject.Programs(kern.InjectObjects()), inject.Options{
		CgroupPath:  cg,
		SampleRatio: cfg.SampleRatio,
		Log:         log,
	})
	if err != nil {
		log.Warn("traceparent injection is off; traces will not join across nodes (run with --inject=false to silence this)",
			"err", err)
		return nil
	}
	log.Info("traceparent injection on", "cgroup", cg)
	return inj
}

// builderInjector keeps a nil *inject.Injector out of the Builder's
// interface (a typed nil would look set).
func builderInjector(inj *inject.Injector) spans.Injector {
	if inj == nil {
		return nil
	}
	return inj
}

// injectCounters adds the injection counters to the kernel counter metric.
func injectCounters(inj *inject.Injector, out map[string]uint64) {
	if inj == nil {
		return
	}
	st, err := inj.Stats()
	if err != nil {
		return
	}
	for i, name := range inject.StatNames {
		out["inject_"+name] = st[i]
	}
}
