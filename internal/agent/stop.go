//go:build linux

package agent

import (
	"context"
	"sync"
	"time"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// Stopping (SIGINT, SIGTERM). The reader has delivered what the ring held
// when the signal came (loader.Tracer.Read); then, in this order:
//
//  1. The probes start coming off, in the background: the kernel takes a
//     grace period per link, and nothing below needs them.
//  2. The loops that make spans and metrics (the expiry tick, the status
//     line) end.
//  3. The spans still open end, marked nemo.span.truncated; finished server
//     requests waiting for their client's record (late joins), and spans
//     held for their process's role, go out now. Gym's metrics measure
//     them.
//  4. The span exporter and Gym's metrics export their last, side by side.
//  5. Discovery and the attachers end, the probes are off; detach closes
//     the rest.
//
// Steps 3 and 4 once waited behind the TLS probes' detach (one link at a
// time, a second each under load): the last exchanges before the signal
// sat in a late join until then, the periodic metric exports meanwhile went
// out without them, and a gymtrace killed in that time (the e2e tests'
// 15 s, Kubernetes' 30 s grace) never exported them (issue 37).

// stopTimeout bounds the last span export and the last metric export each
// (they run at once): a collector that is down must not hold up exit.
const stopTimeout = 5 * time.Second

// finish runs steps 1 to 5 once the reader has returned and the run's
// context has ended.
func (t *agent) finish(feeders, others *sync.WaitGroup) {
	probesOff := make(chan struct{})
	go func() { defer close(probesOff); t.detachProbes() }()
	feeders.Wait()
	t.shutdown()
	others.Wait()
	<-probesOff
}

// detachProbes takes every uprobe off (the Python, uvloop and TLS ones, and
// exited targets' still queued), all at once; nothing is attached after.
func (t *agent) detachProbes() {
	var wg sync.WaitGroup
	for _, off := range []func(){
		func() {
			if t.py != nil {
				t.py.close()
			}
		},
		func() {
			if t.tls != nil {
				_ = t.tls.Close()
			}
		},
		func() {
			if t.detached != nil {
				t.detached.stop()
			}
		},
	} {
		wg.Add(1)
		go func() { defer wg.Done(); off() }()
	}
	wg.Wait()
}

// shutdown ends the spans still open now, marked truncated as Gym does, and
// exports the last spans and Gym's metrics.
func (t *agent) shutdown() {
	t.submit(t.spans.Flush())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := t.out.Shutdown(ctx); err != nil {
			t.log.Warn("exporter shutdown", "err", err)
		}
	}()
	t.closeGymMetrics()
	wg.Wait()
	st := t.out.Stats()
	if t.kern != nil {
		for _, r := range t.kern.ProfTable() {
			t.log.Info("bpf section", "name", r.Name, "runs", r.Count, "ns_per_run", int(r.NsPer))
		}
	}
	if t.kern != nil {
		if skipped := loader.SkippedRunsBy(loader.LoadedPrograms(t.kern.Programs())); len(skipped) > 0 {
			t.log.Warn("the kernel skipped runs of gymtrace's programs (recursion misses, gymtrace_kernel_events_total{reason=\"program_skipped\"}): a traced process's event in a skipped run is missing, unless the program is an understudy whose program ran",
				"runs_skipped", skipped)
		}
		if stood := loader.SkippedRunsBy(loader.LoadedPrograms(t.kern.Understudied())); len(stood) > 0 {
			t.log.Info("the kernel skipped runs of syscall programs that have understudies (each traced process's event among them the understudy made: gymtrace_kernel_events_total{reason=\"program_stood_in\"})",
				"runs_stood_in", stood)
		}
	}
	t.log.Info("gymtrace: detached", "spans_exported", st.Exported, "spans_failed", st.Failed, "spans_dropped", st.Dropped)
}

// detach undoes what attach and run set up, last first.
func (t *agent) detach() {
	for i := len(t.undo) - 1; i >= 0; i-- {
		t.undo[i]()
	}
	t.undo = nil
}
