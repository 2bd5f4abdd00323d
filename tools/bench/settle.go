//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// settle puts load on a stack with a freshly attached gymtrace for o.Settle
// (unrecorded collections of a few rollouts each), so the measured window
// starts with gymtrace in its steady state, as a long-running deployment
// sees it. The first second after attach costs more (docs/performance.md).
func settle(ctx context.Context, o wlOptions, st *stack, dir string) error {
	if o.Settle <= 0 {
		return nil
	}
	n := max(2*o.Concurrency, 16)
	for start := time.Now(); time.Since(start) < o.Settle; {
		if _, _, err := st.collect(ctx, dir, n, o.Concurrency); err != nil {
			return fmt.Errorf("settling gymtrace: %w", err)
		}
	}
	// The servers flush their truth records every 200 ms: the settling
	// load's must not count in the measured window.
	time.Sleep(300 * time.Millisecond)
	return nil
}

// startPerf records the stack's servers with perf (cpu-clock samples, no
// call graphs) into dir/perf-<name>.data until the returned stop is called.
// dir "" does nothing. A perf that cannot start is logged, not fatal: the
// profile is an aid, the run's figures do not depend on it.
func startPerf(dir string, st *stack, name string, log *slog.Logger) (stop func()) {
	if dir == "" {
		return func() {}
	}
	var pids []string
	for _, p := range st.pids {
		pids = append(pids, fmt.Sprint(p))
	}
	out := filepath.Join(dir, "perf-"+name+".data")
	cmd := exec.Command("perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-p", strings.Join(pids, ","), "-o", out)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Warn("perf not started", "err", err)
		return func() {}
	}
	time.Sleep(200 * time.Millisecond) // perf attaches before the window opens
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	}
}
