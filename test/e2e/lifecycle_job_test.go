//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// --- gym.job --------------------------------------------------------------------

// TestLifecycleJobDefault: gymtrace with discovery picks the collector up at
// the exec of its entry point; under `default` the run is one gym.job root
// holding every /run, and (at concurrency 1) the whole run is one trace.
func TestLifecycleJobDefault(t *testing.T) {
	st := lcStack(t)
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default", out) // discovery: no --pid
	jobsBefore := lcCounter(t, g, "gymtrace_spans_built_total", "job")
	const n = 4
	cmd, stdout, stderr := lcCollectDiscovered(t, st, g, n)
	sum := lcWait(t, cmd, stdout, stderr, n)
	lcAwait(t, g, "the collector's gym.job", lcBuilt("job", jobsBefore+1))
	g.shutdown(t)
	s := lcRead(t, out, append(st.pids(), sum.PID)...)
	lcCheckJob(t, s, st, sum.PID, n, false)
}

// lcCheckJob checks one collector run traced under a preset with job.
func lcCheckJob(t *testing.T, s *spanSet, st *stack, collector, n int, truncated bool) Span {
	t.Helper()
	jobs := lcNamed(s, "gym.job")
	if len(jobs) != 1 {
		t.Fatalf("%d gym.job spans from the collector (pid %d), want 1", len(jobs), collector)
	}
	job := jobs[0]
	if job.Parent != "" || job.Kind != "INTERNAL" || job.PID() != collector ||
		job.Res("service.name") != "nemo-gym/orchestrator" || job.Attr("nemo.gym.server.name") != "orchestrator" {
		t.Errorf("gym.job: %s, service %q, server name %q; want an INTERNAL root of nemo-gym/orchestrator in pid %d",
			job, job.Res("service.name"), job.Attr("nemo.gym.server.name"), collector)
	}
	if got := job.Attr("nemo.span.truncated") == "true"; got != truncated {
		t.Errorf("gym.job truncated=%v, want %v", got, truncated)
	}
	runs := s.filter(func(sp Span) bool { return sp.PID() == collector && sp.Kind == "CLIENT" && sp.Path() == "/run" })
	if !truncated && len(runs) != n {
		t.Errorf("%d /run client spans from the collector, want %d", len(runs), n)
	}
	for _, r := range runs {
		if r.Parent != job.SpanID || r.TraceID != job.TraceID {
			t.Errorf("%s is not a child of the gym.job %s", r, job.SpanID)
		}
		lcWithin(t, r, job)
	}
	agent := st.server("agent").PID
	for _, srv := range s.filter(func(sp Span) bool { return sp.PID() == agent && sp.Name == "POST /run" }) {
		p, ok := s.parent(srv)
		if !ok || p.PID() != collector || p.Parent != job.SpanID || srv.TraceID != job.TraceID {
			t.Errorf("agent %s is not under a collector /run of the job (parent %v, found %v)", srv, p, ok)
		}
	}
	if !truncated {
		traces := countBy(s.all, func(sp Span) string { return sp.TraceID })
		if len(traces) != 1 {
			t.Errorf("%d traces, want the job's one: %v", len(traces), traces)
		}
	}
	return job
}

// TestLifecycleJobPerRollout: under per_rollout (no job) there is no gym.job
// and each rollout is its own trace rooted at the collector's /run.
func TestLifecycleJobPerRollout(t *testing.T) {
	st := lcStack(t)
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "per_rollout", out)
	const n = 4
	cmd, stdout, stderr := lcCollectDiscovered(t, st, g, n)
	sum := lcWait(t, cmd, stdout, stderr, n)
	lcAwait(t, g, "every rollout's spans", lcBuilt("rollout", n))
	// The collector's last /run spans end with it; give its exit a moment.
	time.Sleep(500 * time.Millisecond)
	g.shutdown(t)
	s := lcRead(t, out, append(st.pids(), sum.PID)...)
	if jobs := lcNamed(s, "gym.job"); len(jobs) != 0 {
		t.Errorf("%d gym.job spans under per_rollout", len(jobs))
	}
	runs := s.filter(func(sp Span) bool { return sp.PID() == sum.PID && sp.Kind == "CLIENT" && sp.Path() == "/run" })
	if len(runs) != n {
		t.Fatalf("%d /run client spans from the collector (pid %d), want %d: is it traced?", len(runs), sum.PID, n)
	}
	rootOf := map[string]bool{}
	for _, r := range runs {
		if r.Parent != "" {
			t.Errorf("%s has a parent under per_rollout", r)
		}
		rootOf[r.TraceID] = true
	}
	traces := countBy(s.all, func(sp Span) string { return sp.TraceID })
	if len(traces) != n || len(rootOf) != n {
		t.Errorf("%d traces (%d rooted at a /run), want one per rollout (%d)", len(traces), len(rootOf), n)
	}
	for tid := range traces {
		if !rootOf[tid] {
			t.Errorf("trace %s has no collector /run root", tid)
		}
	}
}

// TestLifecycleJobExplicitCollectorPID: `--pid PID=collector` on a process
// that then execs the collector (held at a SIGSTOP until gymtrace attached):
// the job starts at that exec and ends at the collector's exit.
func TestLifecycleJobExplicitCollectorPID(t *testing.T) {
	st := lcStack(t)
	const n = 3
	cmd, stdout, stderr, pid := lcHeldCollector(t, lcCollectCmd(st, n))
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default", out, append(lcPids(st), strconv.Itoa(pid)+"=collector")...)
	released := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lcWait(t, cmd, stdout, stderr, n)
	exited := time.Now()
	lcAwait(t, g, "the collector's gym.job", lcBuilt("job", 1))
	g.shutdown(t)
	s := lcRead(t, out, append(st.pids(), pid)...)
	job := lcCheckJob(t, s, st, pid, n, false)
	// From the exec (just after SIGCONT) to the exit, not from the first /run.
	start, end := time.Unix(0, int64(job.Start)), time.Unix(0, int64(job.End))
	first := job.End
	for _, r := range s.filter(func(sp Span) bool { return sp.PID() == pid && sp.Path() == "/run" }) {
		first = min(first, r.Start)
	}
	if start.Before(released.Add(-time.Second)) || start.After(released.Add(time.Second)) || job.Start >= first {
		t.Errorf("gym.job starts at %v, want the exec right after SIGCONT at %v (and before the first /run)", start, released)
	}
	if end.After(exited.Add(time.Second)) || end.Before(exited.Add(-5*time.Second)) {
		t.Errorf("gym.job ends at %v, want the collector's exit at about %v", end, exited)
	}
}

// lcProcState is the state letter of /proc/PID/stat (R, S, T, Z...), 0 when gone.
func lcProcState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 {
		return b[i+2]
	}
	return 0
}

// lcWaitStopped waits until pid is in the stopped state.
func lcWaitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		switch lcProcState(pid) {
		case 'T':
			return
		case 0, 'Z':
			t.Fatalf("the held collector (pid %d) is gone", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d did not stop itself within 30 s", pid)
}

// TestLifecycleJobTruncatedAtShutdown: a run that outlives gymtrace ends its
// gym.job at shutdown with nemo.span.truncated=true, every /run seen inside it.
func TestLifecycleJobTruncatedAtShutdown(t *testing.T) {
	st := lcStack(t)
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default", out)
	const n = 400 // far more than fit in the traced window
	cmd, _, stderr := lcCollectDiscovered(t, st, g, n)
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		syscall.Kill(-pid, syscall.SIGKILL)
		cmd.Wait()
	})
	lcAwait(t, g, "some rollouts", lcBuilt("rollout", 3))
	// Running, sleeping, in a disk wait, ...: anything but gone. (Reading the
	// state twice, as this once did, can see 'D' then 'R'.)
	if st := lcProcState(pid); st == 0 || st == 'Z' || st == 'X' {
		t.Fatalf("the collector finished before gymtrace stopped (state %q); stderr:\n%s", st, tail(stderr.String(), 2048))
	}
	g.shutdown(t)
	stopped := time.Now()
	s := lcRead(t, out, append(st.pids(), pid)...)
	job := lcCheckJob(t, s, st, pid, n, true)
	if end := time.Unix(0, int64(job.End)); end.After(stopped) || end.Before(stopped.Add(-10*time.Second)) {
		t.Errorf("truncated gym.job ends at %v, want gymtrace's shutdown (about %v)", end, stopped)
	}
}
