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
	g.WaitAttached(t)
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

// lcHeldCollector starts argv stopped (SIGSTOP before its exec), so that
// gymtrace can be given its pid and attach before it runs; SIGCONT releases it.
func lcHeldCollector(t *testing.T, argv []string) (*exec.Cmd, *syncBuf, *syncBuf, int) {
	t.Helper()
	cmd, stdout, stderr := lcCommand(append([]string{"/bin/sh", "-c", `kill -STOP $$; exec "$@"`, "sh"}, argv...))
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the held collector: %v", err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	lcWaitStopped(t, pid)
	return cmd, stdout, stderr, pid
}
