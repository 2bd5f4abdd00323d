package agent

import (
	"log/slog"
	"runtime/debug"
)

// The agent's collector settings once attached. Tracing the bench's Gym
// stack, the live heap is 2-3 MB but every record allocates, so with Go's
// default (GOGC=100, goal twice the live heap, 4 MB minimum) the agent
// collected twice a second and the collector was about a third of its CPU;
// on a machine the traced servers share, that CPU is theirs (an idle P runs
// a mark worker too). A goal five times the live heap cuts collections about
// fourfold; the soft limit keeps the whole Go runtime inside the memory
// budget (docs/performance.md: RSS <= 100 MB under load) when the live heap
// grows under a backlog. GOGC and GOMEMLIMIT, when set, win.
const (
	agentGCPercent   = 400
	agentMemoryLimit = 40 << 20
)

// tuneGC returns the loader's garbage (BTF, verifier logs: a peak of about
// 100 MB while loading) to the OS, then applies the agent's settings.
func tuneGC(log *slog.Logger, lookupEnv func(string) (string, bool)) {
	debug.FreeOSMemory()
	if v, ok := lookupEnv("GOGC"); ok {
		log.Debug("GOGC set: the agent's collector setting is not applied", "GOGC", v)
	} else {
		debug.SetGCPercent(agentGCPercent)
	}
	if v, ok := lookupEnv("GOMEMLIMIT"); ok {
		log.Debug("GOMEMLIMIT set: the agent's memory limit is not applied", "GOMEMLIMIT", v)
	} else {
		debug.SetMemoryLimit(agentMemoryLimit)
	}
}
