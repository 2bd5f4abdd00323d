//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// End-to-end tests of the spans gymtrace builds from process lifecycle events:
// gym.sandbox.start / gym.sandbox.exec around the sandbox CLIs a resources
// server runs, and gym.job around a collector's run. Helpers here carry an lc
// prefix; the shared harness (processes, gymtrace, spans) is harness_test.go.

var lcProviders = []string{"docker", "apptainer", "enroot"}

var lcFakes struct {
	once sync.Once
	dir  string
	err  error
}

// lcFakeDir builds test/fakes/sandboxcli once and installs it as docker,
// apptainer and enroot in one directory, for the servers' PATH.
func lcFakeDir(t *testing.T) string {
	t.Helper()
	lcFakes.once.Do(func() {
		dir := filepath.Join(binDir, "lcfakes")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			lcFakes.err = err
			return
		}
		first := filepath.Join(dir, lcProviders[0])
		cmd := exec.Command(goTool(), "build", "-o", first, "./test/fakes/sandboxcli")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			lcFakes.err = fmt.Errorf("building the fake sandbox CLI: %v\n%s", err, out)
			return
		}
		for _, p := range lcProviders[1:] {
			if err := os.Link(first, filepath.Join(dir, p)); err != nil {
				lcFakes.err = fmt.Errorf("installing the fake %s: %w", p, err)
				return
			}
		}
		lcFakes.dir = dir
	})
	if lcFakes.err != nil {
		t.Fatal(lcFakes.err)
	}
	return lcFakes.dir
}

var lcShared struct {
	once sync.Once
	st   *stack
}

// lcStack is one stack, shared by this file's tests, whose servers find the
// fake sandbox CLIs first on PATH.
func lcStack(t *testing.T) *stack {
	t.Helper()
	needStack(t)
	dir := lcFakeDir(t)
	lcShared.once.Do(func() { lcShared.st = startStack(t, sharedOwner{}, "--path-prepend", dir) })
	if lcShared.st == nil {
		t.Fatal("the lifecycle stack failed to start (see the first test that used it)")
	}
	if lcShared.st.Exited() {
		t.Fatalf("the lifecycle stack died: %v; stderr:\n%s", lcShared.st.Err, tail(lcShared.st.Stderr.String(), 4096))
	}
	return lcShared.st
}

// lcGymtrace starts gymtrace exporting jsonl to out. With no pids it runs
// discovery (and traces every Gym process on the host: checks must filter by
// pid).
func lcGymtrace(t *testing.T, groups, out string, pids ...string) *gymtrace {
	t.Helper()
	g := &gymtrace{metricsAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	argv := []string{gymtraceBin, "--span-groups", groups, "--exporter", "jsonl", "--output", out, "--metrics-addr", g.metricsAddr}
	if len(pids) > 0 {
		argv = append(argv, "--pid", strings.Join(pids, ","))
	}
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "GYMTRACE_SPAN_GROUPS=",
		"GYMTRACE_PID=", "GYMTRACE_DISCOVER="}
	g.proc = startProc(t, t, "gymtrace", argv, procOpts{Env: env})
	g.WaitOutput(t, true, "gymtrace: attached", 60*time.Second)
	return g
}

func lcPids(st *stack) []string {
	var out []string
	for _, p := range st.pids() {
		out = append(out, strconv.Itoa(p))
	}
	return out
}

type lcSummary struct {
	Event    string `json:"event"`
	Rollouts int    `json:"rollouts"`
	OK       int    `json:"ok"`
	PID      int    `json:"pid"`
	Errors   []any  `json:"errors"`
}

// lcCollectCmd is the stack's collector command (exec'ing bin/ng_collect_rollouts,
// so the kernel sees Gym's entry point) with n rollouts at concurrency 1.
func lcCollectCmd(st *stack, n int, extra ...string) []string {
	argv := append(append([]string{}, st.ready.CollectorArgv...), "--rollouts", strconv.Itoa(n), "--concurrency", "1")
	return append(argv, extra...)
}

// lcWait waits for a collector and requires every rollout to succeed.
func lcWait(t *testing.T, cmd *exec.Cmd, stdout, stderr *syncBuf, n int) lcSummary {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(120 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("collector did not finish within 120 s; stderr:\n%s", tail(stderr.String(), 4096))
	}
	var sum lcSummary
	for _, line := range strings.Split(stdout.String(), "\n") {
		if strings.Contains(line, `"summary"`) {
			if jerr := json.Unmarshal([]byte(line), &sum); jerr != nil {
				t.Fatalf("collector summary is not JSON: %v: %s", jerr, line)
			}
		}
	}
	if err != nil || sum.Event != "summary" || sum.OK != n {
		t.Fatalf("collector: %d of %d rollouts ok (%v), errors %v; stdout:\n%s\nstderr:\n%s",
			sum.OK, n, err, sum.Errors, stdout.String(), tail(stderr.String(), 4096))
	}
	return sum
}

func lcCommand(argv []string) (*exec.Cmd, *syncBuf, *syncBuf) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = repoRoot
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr syncBuf
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

// lcCollect runs one collection to the end and returns its summary.
func lcCollect(t *testing.T, st *stack, n int, extra ...string) lcSummary {
	t.Helper()
	cmd, stdout, stderr := lcCommand(lcCollectCmd(st, n, extra...))
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the collector: %v", err)
	}
	return lcWait(t, cmd, stdout, stderr, n)
}

// lcSiteCustomize holds a collector at interpreter start until the test
// creates $LC_GATE_DIR/go. A real collector spends seconds loading its dataset
// before its first /run; this one would send it within a few hundred ms of its
// exec, which on a loaded machine can beat discovery.
const lcSiteCustomize = `import os, time
_d = os.environ.get("LC_GATE_DIR")
if _d:
    _deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(_d, "go")) and time.monotonic() < _deadline:
        time.sleep(0.005)
`

// lcCollectDiscovered starts a collection that gymtrace (running discovery)
// must pick up at the exec of its entry point: the collector is held until
// gymtrace logs that it traces it.
func lcCollectDiscovered(t *testing.T, st *stack, g *gymtrace, n int) (cmd *exec.Cmd, stdout, stderr *syncBuf) {
	t.Helper()
	gate := t.TempDir()
	if err := os.WriteFile(filepath.Join(gate, "sitecustomize.py"), []byte(lcSiteCustomize), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, stdout, stderr = lcCommand(lcCollectCmd(st, n))
	cmd.Env = append(os.Environ(), "LC_GATE_DIR="+gate, "PYTHONPATH="+gate)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the collector: %v", err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	started := time.Now()
	g.WaitOutput(t, true, fmt.Sprintf("msg=tracing pid=%d ", pid), 10*time.Second)
	t.Logf("discovery traced the collector (pid %d) %v after its start", pid, time.Since(started).Round(time.Millisecond))
	if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return cmd, stdout, stderr
}

// lcCounter reads one per-group counter.
func lcCounter(t *testing.T, g *gymtrace, family, group string) float64 {
	t.Helper()
	return groupCounters(g.metrics(t), family)[group]
}

// lcAwait polls gymtrace's metrics until cond holds (failing after 20 s), then
// gives the ring buffer a moment so nothing is still in flight at SIGTERM.
func lcAwait(t *testing.T, g *gymtrace, what string, cond func(m map[string]float64) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond(g.metrics(t)) {
		if time.Now().After(deadline) {
			t.Fatalf("gymtrace: %s did not happen within 20 s; stderr:\n%s", what, tail(g.Stderr.String(), 4096))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
}

func lcBuilt(group string, atLeast float64) func(m map[string]float64) bool {
	return func(m map[string]float64) bool {
		return groupCounters(m, "gymtrace_spans_built_total")[group] >= atLeast
	}
}

// lcRead reads the jsonl output, keeping the spans of the given processes.
func lcRead(t *testing.T, path string, pids ...int) *spanSet {
	t.Helper()
	keep := map[int]bool{}
	for _, p := range pids {
		keep[p] = true
	}
	var out []Span
	for _, sp := range readSpans(t, path) {
		if keep[sp.PID()] {
			out = append(out, sp)
		}
	}
	set := newSpanSet(out)
	t.Cleanup(func() {
		if t.Failed() {
			set.dump(t)
		}
	})
	return set
}

func lcNamed(s *spanSet, name string) []Span {
	return s.filter(func(sp Span) bool { return sp.Name == name })
}

func lcWithin(t *testing.T, child, parent Span) {
	t.Helper()
	if child.Start < parent.Start || child.End > parent.End {
		t.Errorf("%s [%d, %d] is not within its parent %s [%d, %d]", child.Name, child.Start, child.End,
			parent.Name, parent.Start, parent.End)
	}
}

// --- sandbox ------------------------------------------------------------------

// TestLifecycleSandboxSpans: a resources server's tool route runs each
// provider's CLI (start once per rollout, exec every turn, with return code
// 3), and /verify runs an enroot exec. Every CLI must give one span with the
// right name, provider, return code and parent, and nothing of its command
// line.
func TestLifecycleSandboxSpans(t *testing.T) {
	st := lcStack(t)
	res := st.server("resources")
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "all", out, lcPids(st)...)

	const n, turns = 2, 2
	for _, p := range lcProviders {
		lcCollect(t, st, n, "--sandbox", p, "--sandbox-rc", "3", "--verify-sandbox", "enroot", "--turns", strconv.Itoa(turns))
	}
	perProvider := n * (1 + turns)
	wantCLIs := len(lcProviders) * (perProvider + n) // + one verify exec per rollout
	lcAwait(t, g, "every sandbox span", lcBuilt("sandbox", float64(wantCLIs)))
	m := g.metrics(t)
	if got := groupCounters(m, "gymtrace_events_emitted_total")["sandbox"]; got != float64(wantCLIs) {
		t.Errorf("gymtrace_events_emitted_total{group=\"sandbox\"} = %v, want %d (one per CLI)", got, wantCLIs)
	}
	g.shutdown(t)
	s := lcRead(t, out, st.pids()...)

	starts, execs := lcNamed(s, "gym.sandbox.start"), lcNamed(s, "gym.sandbox.exec")
	if len(starts) != len(lcProviders)*n || len(execs) != len(lcProviders)*(turns*n+n) {
		t.Fatalf("%d gym.sandbox.start and %d gym.sandbox.exec spans, want %d and %d",
			len(starts), len(execs), len(lcProviders)*n, len(lcProviders)*(turns*n+n))
	}
	type key struct{ name, provider, via string }
	count := map[key]int{}
	for _, sp := range append(starts, execs...) {
		provider := sp.Attr("nemo.gym.sandbox.provider")
		if sp.Kind != "INTERNAL" || sp.PID() != res.PID || sp.Res("service.name") != "nemo-gym/"+res.Name ||
			sp.Attr("nemo.gym.server.name") != res.Name {
			t.Errorf("%s: kind %s, resource pid %d service %q, server name %q; want INTERNAL in %s (pid %d)",
				sp, sp.Kind, sp.PID(), sp.Res("service.name"), sp.Attr("nemo.gym.server.name"), res.Name, res.PID)
		}
		if sp.Status.Code != "UNSET" {
			t.Errorf("%s: status %v, want unset", sp, sp.Status)
		}
		if sp.Attr("nemo.span.truncated") != "" {
			t.Errorf("%s: truncated", sp)
		}
		for k, v := range sp.Attributes {
			if s := fmt.Sprint(v); strings.Contains(s, "exit ") || strings.Contains(s, "sh -c") ||
				strings.Contains(s, "gt-") || strings.Contains(s, "instance://") || strings.Contains(s, ".sif") {
				t.Errorf("%s: attribute %s=%q leaks the command line", sp, k, s)
			}
		}
		if sp.Duration() < 30*time.Millisecond {
			t.Errorf("%s lasts %v, less than the fake CLI's 30 ms sleep", sp, sp.Duration())
		}
		rc, hasRC := sp.Attributes["nemo.gym.sandbox.return_code"]
		if sp.Name == "gym.sandbox.start" && hasRC {
			t.Errorf("%s: a start has a return code", sp)
		}
		parent, ok := s.parent(sp)
		switch {
		case ok && parent.Name == "POST /run_sandbox" && parent.PID() == res.PID:
			lcWithin(t, sp, parent)
			if sp.TraceID != parent.TraceID || sp.Attr("nemo.gym.rollout.id") == "" ||
				sp.Attr("nemo.gym.rollout.id") != parent.Attr("nemo.gym.rollout.id") {
				t.Errorf("%s: trace/rollout %s/%q, parent's %s/%q", sp, sp.TraceID, sp.Attr("nemo.gym.rollout.id"),
					parent.TraceID, parent.Attr("nemo.gym.rollout.id"))
			}
			if sp.Name == "gym.sandbox.exec" && anyInt(rc) != 3 {
				t.Errorf("%s: return code %v, want 3 (the tool's `exit 3`)", sp, rc)
			}
			count[key{sp.Name, provider, "tool"}]++
		case ok && parent.Name == "gym.verify" && parent.PID() == res.PID:
			lcWithin(t, sp, parent)
			if sp.Name != "gym.sandbox.exec" || anyInt(rc) != 0 || !hasRC {
				t.Errorf("%s under gym.verify: want an exec with return code 0, got rc %v", sp, rc)
			}
			count[key{sp.Name, provider, "verify"}]++
		case !ok && sp.Parent == "" && sp.Attr("gymtrace.parent.unresolved") == "ambiguous":
			// /verify and /get_weather run concurrently (asyncio.gather): without
			// the asyncio context the spawning request is not guessed.
			count[key{sp.Name, provider, "verify"}]++
		default:
			t.Errorf("%s: parent %v (found %v), want its POST /run_sandbox, or gym.verify", sp, parent, ok)
		}
	}
	for _, p := range lcProviders {
		if got := count[key{"gym.sandbox.start", p, "tool"}]; got != n {
			t.Errorf("%s: %d starts from the tool route, want %d", p, got, n)
		}
		if got := count[key{"gym.sandbox.exec", p, "tool"}]; got != turns*n {
			t.Errorf("%s: %d execs from the tool route, want %d", p, got, turns*n)
		}
	}
	if got := count[key{"gym.sandbox.exec", "enroot", "verify"}]; got != len(lcProviders)*n {
		t.Errorf("%d enroot execs from /verify, want %d", got, len(lcProviders)*n)
	}
}

// TestLifecycleSandboxDisabled: with sandbox off the same CLIs give no span,
// and the kernel counts each as discarded (without reading its argv).
func TestLifecycleSandboxDisabled(t *testing.T) {
	st := lcStack(t)
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default,verify", out, lcPids(st)...)
	const n, turns = 3, 2
	lcCollect(t, st, n, "--sandbox", "docker", "--sandbox-rc", "3", "--verify-sandbox", "apptainer", "--turns", strconv.Itoa(turns))
	want := float64(n * (1 + turns + 1))
	lcAwait(t, g, "the sandbox discard count", func(m map[string]float64) bool {
		return groupCounters(m, "gymtrace_events_discarded_total")["sandbox"] >= want &&
			groupCounters(m, "gymtrace_spans_built_total")["verify"] >= n
	})
	m := g.metrics(t)
	if got := groupCounters(m, "gymtrace_events_discarded_total")["sandbox"]; got != want {
		t.Errorf("gymtrace_events_discarded_total{group=\"sandbox\"} = %v, want %v (one per CLI)", got, want)
	}
	if got := groupCounters(m, "gymtrace_events_emitted_total")["sandbox"]; got != 0 {
		t.Errorf("gymtrace_events_emitted_total{group=\"sandbox\"} = %v with sandbox off", got)
	}
	g.shutdown(t)
	s := lcRead(t, out, st.pids()...)
	if got := s.filter(func(sp Span) bool { return strings.HasPrefix(sp.Name, "gym.sandbox.") }); len(got) != 0 {
		t.Errorf("%d gym.sandbox.* spans with sandbox disabled", len(got))
	}
	if got := len(lcNamed(s, "POST /run_sandbox")); got != n*(1+turns) {
		t.Errorf("%d POST /run_sandbox spans, want %d (the traffic itself is traced)", got, n*(1+turns))
	}
}

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
	argv := append([]string{"/bin/sh", "-c", `kill -STOP $$; exec "$@"`, "sh"}, lcCollectCmd(st, n)...)
	cmd, stdout, stderr := lcCommand(argv)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the held collector: %v", err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	lcWaitStopped(t, pid)
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
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		switch lcProcState(pid) {
		case 'T':
			return
		case 0, 'Z':
			t.Fatalf("the held collector (pid %d) is gone", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d did not stop itself within 10 s", pid)
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
	if lcProcState(pid) != 'R' && lcProcState(pid) != 'S' {
		t.Fatalf("the collector finished before gymtrace stopped (state %q); stderr:\n%s", lcProcState(pid), tail(stderr.String(), 2048))
	}
	g.shutdown(t)
	stopped := time.Now()
	s := lcRead(t, out, append(st.pids(), pid)...)
	job := lcCheckJob(t, s, st, pid, n, true)
	if end := time.Unix(0, int64(job.End)); end.After(stopped) || end.Before(stopped.Add(-10*time.Second)) {
		t.Errorf("truncated gym.job ends at %v, want gymtrace's shutdown (about %v)", end, stopped)
	}
}

// TestLifecycleSandboxUnderDiscovery: the sandbox spans must not depend on how
// the server was found. Known to fail today (see the skip message), so it runs
// only with GYMTRACE_E2E_KNOWN_ISSUES=1.
func TestLifecycleSandboxUnderDiscovery(t *testing.T) {
	if os.Getenv("GYMTRACE_E2E_KNOWN_ISSUES") != "1" {
		t.Skip("known issue: with discovery on, the watcher inspects a server's forked child before it execs the " +
			"sandbox CLI, takes it for a uvicorn worker and calls AddTarget, which overwrites the kernel's " +
			"GT_TARGET_CHILD flag; gt_exec then does not see a sandbox and emits no GT_EV_SANDBOX_START " +
			"(2 of 18 and 8 of 45 CLIs lost in two runs here). Set GYMTRACE_E2E_KNOWN_ISSUES=1 to run it")
	}
	st := lcStack(t)
	res := st.server("resources")
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "all", out) // discovery
	const n, turns = 6, 2
	lcCollect(t, st, n, "--sandbox", "docker", "--turns", strconv.Itoa(turns))
	lcAwait(t, g, "the rollouts", lcBuilt("rollout", n))
	time.Sleep(500 * time.Millisecond)
	g.shutdown(t)
	s := lcRead(t, out, res.PID)
	tool := len(lcNamed(s, "POST /run_sandbox"))
	sb := len(s.filter(func(sp Span) bool { return strings.HasPrefix(sp.Name, "gym.sandbox.") }))
	if tool != n*(1+turns) || sb != tool {
		t.Errorf("%d POST /run_sandbox spans and %d gym.sandbox.* spans, want %d of each", tool, sb, n*(1+turns))
	}
}
