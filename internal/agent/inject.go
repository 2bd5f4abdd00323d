//go:build linux

package agent

import (
	"log/slog"
	"sync"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/preflight"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// startInjector attaches traceparent injection (--inject, on by default).
// Injection is an addition: when it cannot attach, gymtrace traces as
// before and says why. Returns nil when off.
func startInjector(kern *loader.Tracer, cfg *config.Config, log *slog.Logger, state *injectState) *inject.Injector {
	if !cfg.Inject {
		state.set(false, "flag")
		return nil
	}
	if why := kern.InjectUnavailable(); why != "" {
		log.Warn("traceparent injection is off: " + why + "; traces will not join across nodes (run with --inject=false to silence this)")
		state.set(false, "kernel_unsupported")
		return nil
	}
	// A tracer must not change what the traced program sees: on a kernel
	// where sockets in a sockhash misreport their state, no socket goes in
	// one unless the user said so.
	st, err := inject.SelfTest()
	switch {
	case err != nil:
		log.Warn("traceparent injection is off: its start-up self-test could not run, so it cannot tell whether "+
			"injection would change what the traced programs see; traces will not join across nodes", "err", err)
		state.set(false, "selftest_failed")
		return nil
	case !st.Safe() && !cfg.InjectForce:
		log.Warn("traceparent injection is off: "+st.String()+"; with injection the traced programs would see that. "+
			"Traces will not join across nodes. Use a kernel with the fix, or --inject-force to inject anyway", "reason", st.Reason())
		state.set(false, st.Reason())
		return nil
	case !st.Safe():
		log.Warn("traceparent injection forced on (--inject-force): " + st.String() + "; the traced programs see that")
	default:
		log.Debug("injection self-test passed", "result", st.String())
	}
	cg, err := preflight.CgroupV2Path()
	if err != nil {
		log.Warn("traceparent injection is off: no cgroup v2 mount to attach its socket program to; traces will not join across nodes",
			"err", err)
		state.set(false, "no_cgroup_v2")
		return nil
	}
	inj, err := inject.Attach(inject.Programs(kern.InjectObjects()), inject.Options{
		CgroupPath:  cg,
		SampleRatio: cfg.SampleRatio,
		Log:         log,
		MapDo:       kern.MapDo,
	})
	if err != nil {
		log.Warn("traceparent injection is off; traces will not join across nodes (run with --inject=false to silence this)",
			"err", err)
		state.set(false, "attach_failed")
		return nil
	}
	log.Info("traceparent injection on", "cgroup", cg)
	if st.Safe() {
		state.set(true, "")
	} else {
		state.set(true, "forced_"+st.Reason())
	}
	return inj
}

// injectState is the injection decision, for the metric.
type injectState struct {
	mu     sync.Mutex
	on     bool
	reason string
}

func (s *injectState) set(on bool, reason string) {
	s.mu.Lock()
	s.on, s.reason = on, reason
	s.mu.Unlock()
}

func (s *injectState) get() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.on, s.reason
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
