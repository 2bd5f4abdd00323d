//go:build linux

package spans

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
)

const (
	pidCLI = 500 // a sandbox CLI, child of the resources server

	jobSpan    = "orchestrator:gym.job"
	cRun       = "orchestrator:HTTP POST ->agent/run"
	rSandbox   = "weather:POST /run_sandbox"
	sbStart    = "weather:gym.sandbox.start"
	sbExec     = "weather:gym.sandbox.exec"
	commCollec = "ng_collect_roll" // ng_collect_rollouts as comm shows it
)

// traceCollector makes the sim's collector a traced orchestrator, as
// `--pid PID=collector` or discovery by command line would.
func traceCollector(s *sim) {
	s.procs[pidCollector] = &discover.Process{PID: pidCollector, Role: loader.RoleOrchestrator, ServerName: "orchestrator"}
	s.traced[pidCollector] = true
}

// proc feeds one lifecycle record as the kernel would send it: sandbox
// records only with the sandbox group on (or the gate off).
func (s *sim) proc(kind uint8, pid, ppid uint32, opts ...func(*loader.ProcEvent)) *loader.ProcEvent {
	ev := &loader.ProcEvent{Kind: kind, Pid: pid, Ppid: ppid, TsNs: s.tick()}
	if kind == loader.EvSandboxStart || kind == loader.EvSandboxEnd {
		ev.Role = loader.RoleResources
	}
	for _, o := range opts {
		o(ev)
	}
	if (kind == loader.EvSandboxStart || kind == loader.EvSandboxEnd) && !s.noGate && !s.mask.Has(groups.Sandbox) {
		return ev
	}
	s.spans = append(s.spans, s.b.ProcEvent(ev)...)
	return ev
}

func cli(provider, verb uint8) func(*loader.ProcEvent) {
	return func(ev *loader.ProcEvent) { ev.Provider, ev.Verb = provider, verb }
}

func exitCode(code int32) func(*loader.ProcEvent) {
	return func(ev *loader.ProcEvent) { ev.ExitCode = code }
}

func withComm(c string) func(*loader.ProcEvent) {
	return func(ev *loader.ProcEvent) { copy(ev.Comm[:], c) }
}

// runCLI runs one sandbox CLI from resources: START at exec, END at exit.
func (s *sim) runCLI(pid uint32, provider, verb uint8, code int32) {
	st := s.proc(loader.EvSandboxStart, pid, pidResources, cli(provider, verb), func(ev *loader.ProcEvent) { ev.StartNs = ev.TsNs })
	s.proc(loader.EvSandboxEnd, pid, pidResources, cli(provider, verb), exitCode(code),
		func(ev *loader.ProcEvent) { ev.StartNs = st.StartNs })
}

func TestSandboxSpansUnderToolCall(t *testing.T) {
	s := newSim(t, "all")
	c := s.dial(pidAgent, pidResources, resAddr)
	call := c.request(loader.MethodPOST, "/ng-rollout/7-2/run_sandbox")
	s.runCLI(pidCLI, loader.SandboxDocker, loader.SandboxVerbStart, 0)
	s.runCLI(pidCLI+1, loader.SandboxDocker, loader.SandboxVerbExec, 3)
	s.runCLI(pidCLI+2, loader.SandboxDocker, loader.SandboxVerbOther, 0) // docker rm: no span
	call.respond(200)

	cPrefixed := "simple_agent:HTTP POST ->resources/ng-rollout/7-2/run_sandbox"
	diffEdges(t, edges(t, s.spans), []string{
		e(cPrefixed, ""), e(rSandbox, cPrefixed),
		e(sbStart, rSandbox), e(sbExec, rSandbox),
	})
	for _, sp := range s.spans {
		if !strings.HasPrefix(sp.Name, "gym.sandbox.") {
			continue
		}
		if sp.Group != "sandbox" || sp.Kind.String() != "internal" {
			t.Errorf("%s: group %q kind %v", desc(sp), sp.Group, sp.Kind)
		}
		mustAttr(t, sp, "nemo.gym.sandbox.provider", "docker")
		mustAttr(t, sp, "nemo.gym.server.name", "weather")
		mustAttr(t, sp, "nemo.gym.rollout.id", "7-2")
		noAttr(t, sp, "gymtrace.parent.unresolved")
		noAttr(t, sp, "nemo.span.truncated")
		if sp.Proc == nil || sp.Proc.PID != pidResources {
			t.Errorf("%s: resource process %+v, want the resources server", desc(sp), sp.Proc)
		}
		if sp.Status != codes.Unset {
			t.Errorf("%s: status %v", desc(sp), sp.Status)
		}
		if sp.Name == "gym.sandbox.exec" {
			mustAttr(t, sp, "nemo.gym.sandbox.return_code", 3)
		} else {
			noAttr(t, sp, "nemo.gym.sandbox.return_code")
		}
	}
	if st := s.b.Stats(); st.OpenSandboxes != 0 || st.Spans[groups.Sandbox] != 2 {
		t.Errorf("stats after the CLIs exited: open %d, sandbox spans %d", st.OpenSandboxes, st.Spans[groups.Sandbox])
	}
}

func TestSandboxInsideVerifyHangsUnderGymVerify(t *testing.T) {
	s := newSim(t, "default,sandbox,verify")
	c := s.dial(pidAgent, pidResources, resAddr)
	call := c.request(loader.MethodPOST, "/verify")
	s.runCLI(pidCLI, loader.SandboxApptainer, loader.SandboxVerbExec, 0)
	call.respond(200)
	diffEdges(t, edges(t, s.spans), []string{
		e(cVerify, ""), e(rVerify, cVerify), e(rGym, rVerify), e("weather:gym.sandbox.exec", rGym),
	})
	for _, sp := range findSpans(s.spans, "gym.sandbox.exec") {
		mustAttr(t, sp, "nemo.gym.sandbox.provider", "apptainer")
	}
}

func TestSandboxReturnCodesAndFailures(t *testing.T) {
	s := newSim(t, "server,sandbox")
	call := s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/run_sandbox")
	s.runCLI(pidCLI, loader.SandboxEnroot, loader.SandboxVerbExec, -9) // killed by SIGKILL
	s.runCLI(pidCLI+1, loader.SandboxEnroot, loader.SandboxVerbStart, 1)
	call.respond(200)
	ex := findSpans(s.spans, "gym.sandbox.exec")
	st := findSpans(s.spans, "gym.sandbox.start")
	if len(ex) != 1 || len(st) != 1 {
		t.Fatalf("got %d exec and %d start spans, want 1 and 1", len(ex), len(st))
	}
	mustAttr(t, ex[0], "nemo.gym.sandbox.return_code", -9)
	mustAttr(t, ex[0], "nemo.gym.sandbox.provider", "enroot")
	if ex[0].Status != codes.Unset {
		t.Errorf("exec with a nonzero return code is a result, not an error: status %v", ex[0].Status)
	}
	if st[0].Status != codes.Error || st[0].StatusMsg != "enroot exited with status 1" {
		t.Errorf("failed start: status %v %q, want Error \"enroot exited with status 1\"", st[0].Status, st[0].StatusMsg)
	}
	for _, sp := range append(ex, st...) {
		if p, _ := attr(sp, "nemo.gym.sandbox.provider"); p.AsString() != "enroot" {
			t.Errorf("%s: provider %v", desc(sp), p.v)
		}
		if !sp.End.After(sp.Start) {
			t.Errorf("%s: empty duration", desc(sp))
		}
	}
}

func TestSandboxDisabledMakesNoSpans(t *testing.T) {
	for _, noGate := range []bool{false, true} {
		s := newSim(t, "per_rollout")
		s.noGate = noGate
		call := s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/run_sandbox")
		s.runCLI(pidCLI, loader.SandboxDocker, loader.SandboxVerbStart, 0)
		s.runCLI(pidCLI+1, loader.SandboxDocker, loader.SandboxVerbExec, 0)
		call.respond(200)
		if got := append(findSpans(s.spans, "gym.sandbox.start"), findSpans(s.spans, "gym.sandbox.exec")...); len(got) != 0 {
			t.Errorf("noGate=%v: %d sandbox spans with sandbox disabled", noGate, len(got))
		}
		if st := s.b.Stats(); st.OpenSandboxes != 0 {
			t.Errorf("noGate=%v: %d sandboxes tracked with sandbox disabled", noGate, st.OpenSandboxes)
		}
	}
}

func TestSandboxParentAmbiguousOrAbsent(t *testing.T) {
	s := newSim(t, "server,sandbox")
	a := s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/run_sandbox")
	b := s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/run_sandbox")
	s.runCLI(pidCLI, loader.SandboxDocker, loader.SandboxVerbExec, 0)
	a.respond(200)
	b.respond(200)
	s.runCLI(pidCLI+1, loader.SandboxDocker, loader.SandboxVerbExec, 0) // nothing in flight
	ex := findSpans(s.spans, "gym.sandbox.exec")
	if len(ex) != 2 {
		t.Fatalf("%d exec spans, want 2", len(ex))
	}
	for i, want := range []string{"ambiguous", "no_request_in_flight"} {
		if ex[i].Parent.IsValid() {
			t.Errorf("exec %d: parented although %s", i, want)
		}
		mustAttr(t, ex[i], "gymtrace.parent.unresolved", want)
		mustAttr(t, ex[i], "nemo.gym.server.name", "weather")
	}
}

func TestSandboxContextBeatsNesting(t *testing.T) {
	// With the asyncio context (py_ctx) the concurrent case resolves.
	s := newSim(t, "server,sandbox")
	c1, c2 := s.dial(pidAgent, pidResources, resAddr), s.dial(pidAgent, pidResources, resAddr)
	a := c1.request(loader.MethodPOST, "/run_sandbox")
	b := c2.request(loader.MethodPOST, "/run_sandbox")
	if !s.b.BindContext(pidResources, 0xbeef, 0, c2.srvConn) {
		t.Fatal("BindContext failed")
	}
	s.proc(loader.EvSandboxStart, pidCLI, pidResources, cli(loader.SandboxDocker, loader.SandboxVerbExec),
		func(ev *loader.ProcEvent) { ev.StartNs, ev.PyCtx = ev.TsNs, 0xbeef })
	s.proc(loader.EvSandboxEnd, pidCLI, pidResources, cli(loader.SandboxDocker, loader.SandboxVerbExec))
	a.respond(200)
	b.respond(200)
	ex := findSpans(s.spans, "gym.sandbox.exec")
	var srv2 Span
	for _, sp := range findSpans(s.spans, "POST /run_sandbox") {
		if v, _ := attr(sp, "client.port"); uint16(v.AsInt64()) == c2.cli.Port() {
			srv2 = sp
		}
	}
	if len(ex) != 1 || ex[0].Parent != srv2.SpanID || ex[0].TraceID != srv2.TraceID {
		t.Fatalf("exec not under the request bound to its context: %v", edges(t, s.spans))
	}
}

func TestSandboxEndWithoutStart(t *testing.T) {
	// A START lost to a full ring buffer: the END record still makes the span.
	s := newSim(t, "server,sandbox")
	call := s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/run_sandbox")
	start := s.tick()
	s.proc(loader.EvSandboxEnd, pidCLI, pidResources, cli(loader.SandboxDocker, loader.SandboxVerbExec), exitCode(2),
		func(ev *loader.ProcEvent) { ev.StartNs = start })
	call.respond(200)
	diffEdges(t, edges(t, s.spans), []string{e(rSandbox, ""), e("weather:gym.sandbox.exec", rSandbox)})
	ex := findSpans(s.spans, "gym.sandbox.exec")
	if len(ex) != 1 {
		t.Fatalf("%d exec spans, want 1", len(ex))
	}
	sp := ex[0]
	mustAttr(t, sp, "nemo.gym.sandbox.return_code", 2)
	if got := sp.Start; !got.Equal(s.b.opt.Clock.Wall(start)) {
		t.Errorf("start %v, want the CLI's exec time %v", got, s.b.opt.Clock.Wall(start))
	}
}

func TestSandboxTruncatedAtFlush(t *testing.T) {
	s := newSim(t, "server,sandbox")
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/run_sandbox")
	s.proc(loader.EvSandboxStart, pidCLI, pidResources, cli(loader.SandboxDocker, loader.SandboxVerbStart),
		func(ev *loader.ProcEvent) { ev.StartNs = ev.TsNs })
	if len(s.spans) != 0 {
		t.Fatal("spans before anything ended")
	}
	out := s.p.Flush()
	diffEdges(t, edges(t, out), []string{e(rSandbox, ""), e(sbStart, rSandbox)})
	for _, sp := range out {
		mustAttr(t, sp, "nemo.span.truncated", true)
	}
	if st := s.b.Stats(); st.OpenSandboxes != 0 {
		t.Errorf("%d sandboxes open after Flush", st.OpenSandboxes)
	}
	// The END that arrives after shutdown must not make a second span.
	s.proc(loader.EvSandboxEnd, pidCLI, pidResources, cli(loader.SandboxDocker, loader.SandboxVerbOther))
	if n := len(findSpans(s.spans, "gym.sandbox.start")); n != 0 {
		t.Errorf("%d spans from an END after Flush", n)
	}
}

// jobTree is one rollout under the default preset as seen with the collector
// traced: its /run client span is the child of the job.
func jobTree() []string {
	var out []string
	for _, edge := range rolloutTrees["default"] {
		if edge == e(aRun, "") {
			out = append(out, e(cRun, jobSpan), e(aRun, cRun))
			continue
		}
		out = append(out, edge)
	}
	return out
}

func TestJobWrapsEveryRolloutInOneTrace(t *testing.T) {
	s := newSim(t, "default")
	traceCollector(s)
	g := newGymStack(s, false)
	const rollouts = 4
	want := []string{e(jobSpan, "")}
	for i := 0; i < rollouts; i++ {
		g.rollout(i%len(g.collAgent), 3, int32(i))
		want = append(want, jobTree()...)
	}
	if n := len(findSpans(s.spans, "gym.job")); n != 0 {
		t.Fatalf("gym.job emitted before the collector exited")
	}
	if st := s.b.Stats(); st.OpenJobs != 1 {
		t.Errorf("OpenJobs = %d, want 1", st.OpenJobs)
	}
	exit := s.proc(loader.EvProcExit, pidCollector, 0)
	diffEdges(t, edges(t, s.spans), want)
	if n := traces(s.spans); n != 1 {
		t.Errorf("%d traces, want 1", n)
	}
	jobs := findSpans(s.spans, "gym.job")
	if len(jobs) != 1 {
		t.Fatalf("%d gym.job spans, want 1", len(jobs))
	}
	j := jobs[0]
	if j.Group != "job" || j.Kind.String() != "internal" || j.Status != codes.Unset {
		t.Errorf("gym.job: group %q kind %v status %v", j.Group, j.Kind, j.Status)
	}
	mustAttr(t, j, "nemo.gym.server.name", "orchestrator")
	noAttr(t, j, "nemo.span.truncated")
	if j.Proc == nil || j.Proc.ServiceName() != "nemo-gym/orchestrator" {
		t.Errorf("gym.job resource %+v, want service nemo-gym/orchestrator", j.Proc)
	}
	if !j.End.Equal(s.b.opt.Clock.Wall(exit.TsNs)) {
		t.Errorf("gym.job ends at %v, want the exit %v", j.End, s.b.opt.Clock.Wall(exit.TsNs))
	}
	first := findSpans(s.spans, "HTTP POST")
	for _, c := range first {
		if c.Proc.PID == pidCollector && c.Start.Before(j.Start) {
			t.Errorf("a /run starts before the job")
		}
	}
	if st := s.b.Stats(); st.OpenJobs != 0 {
		t.Errorf("OpenJobs = %d after exit", st.OpenJobs)
	}
}

func TestPerRolloutHasNoJob(t *testing.T) {
	s := newSim(t, "per_rollout")
	traceCollector(s)
	g := newGymStack(s, false)
	const rollouts = 3
	for i := 0; i < rollouts; i++ {
		g.rollout(i, 3, int32(i))
	}
	s.proc(loader.EvProcExit, pidCollector, 0)
	if n := len(findSpans(s.spans, "gym.job")); n != 0 {
		t.Errorf("%d gym.job spans under per_rollout", n)
	}
	if n := traces(s.spans); n != rollouts {
		t.Errorf("%d traces, want one per rollout (%d)", n, rollouts)
	}
	for _, sp := range s.spans {
		if sp.Proc.PID == pidCollector && sp.Parent.IsValid() {
			t.Errorf("collector span %s has a parent without job", desc(sp))
		}
	}
}

func TestJobStartsAtEntryPointExec(t *testing.T) {
	s := newSim(t, "job,http_client")
	// Not known to discovery yet: only the exec of an entry point says collector.
	s.traced[pidCollector] = true
	ex := s.proc(loader.EvProcExec, pidCollector, 0, withComm(commCollec))
	c := s.dial(pidCollector, pidAgent, agentAddr)
	c.request(loader.MethodGET, "/").respond(200) // not /run: before the job
	c.request(loader.MethodPOST, "/run").respond(200)
	c.request(loader.MethodPOST, "/aggregate_metrics").respond(200)
	s.proc(loader.EvProcExit, pidCollector, 0, exitCode(1))
	diffEdges(t, edges(t, s.spans), []string{
		"orchestrator:HTTP GET ->agent/" + rootEdge,
		e(jobSpan, ""), e(cRun, jobSpan), e("orchestrator:HTTP POST ->agent/aggregate_metrics", jobSpan),
	})
	jobs := findSpans(s.spans, "gym.job")
	if len(jobs) != 1 {
		t.Fatalf("%d gym.job spans, want 1", len(jobs))
	}
	j := jobs[0]
	if !j.Start.Equal(s.b.opt.Clock.Wall(ex.TsNs)) {
		t.Errorf("gym.job starts at %v, want the exec %v", j.Start, s.b.opt.Clock.Wall(ex.TsNs))
	}
	if j.Status != codes.Error || j.StatusMsg != "collector exited with status 1" {
		t.Errorf("gym.job of a failed collector: %v %q", j.Status, j.StatusMsg)
	}
	if j.Proc.ServiceName() != "nemo-gym/orchestrator" {
		t.Errorf("service %q", j.Proc.ServiceName())
	}
}

func TestNoJobForOtherProcesses(t *testing.T) {
	// A POST /run from a process whose role is known and is not the
	// collector's (config and Gym's env win over traffic): no job, even with
	// the job group on. (A process of unknown role that sends /run is the
	// collector: TestOrchestratorByBehaviour.)
	s := newSim(t, "default")
	s.procs[pidCollector] = &discover.Process{PID: pidCollector, Role: loader.RoleResources, ServerName: "weather"}
	s.traced[pidCollector] = true
	s.proc(loader.EvProcExec, pidCollector, 0, withComm("python3"))
	c := s.dial(pidCollector, pidAgent, agentAddr)
	c.request(loader.MethodPOST, "/run").respond(200)
	s.proc(loader.EvProcExit, pidCollector, 0)
	if n := len(findSpans(s.spans, "gym.job")); n != 0 {
		t.Errorf("%d gym.job spans for a non-collector", n)
	}
}

func TestJobTruncatedAtFlush(t *testing.T) {
	s := newSim(t, "default")
	traceCollector(s)
	g := newGymStack(s, false)
	g.rollout(0, 1, 0)
	g.collAgent[1].request(loader.MethodPOST, "/run", withRollout(1, 1, -1)) // still running
	out := s.p.Flush()
	jobs := findSpans(out, "gym.job")
	if len(jobs) != 1 {
		t.Fatalf("%d gym.job spans at Flush, want 1", len(jobs))
	}
	mustAttr(t, jobs[0], "nemo.span.truncated", true)
	all := append(s.spans, out...)
	if n := traces(all); n != 1 {
		t.Errorf("%d traces, want 1", n)
	}
	for _, sp := range findSpans(out, "HTTP POST") {
		if sp.Parent != jobs[0].SpanID {
			t.Errorf("open /run not under the job at Flush")
		}
	}
	if st := s.b.Stats(); st.OpenJobs != 0 {
		t.Errorf("OpenJobs = %d after Flush", st.OpenJobs)
	}
}

func TestJobOfReusedPIDEnds(t *testing.T) {
	// The collector's exit was lost; its pid is then forked anew.
	s := newSim(t, "default")
	traceCollector(s)
	s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/run").respond(200)
	s.proc(loader.EvProcFork, pidCollector, 1)
	jobs := findSpans(s.spans, "gym.job")
	if len(jobs) != 1 {
		t.Fatalf("%d gym.job spans, want the stale one ended", len(jobs))
	}
	mustAttr(t, jobs[0], "nemo.span.truncated", true)
}

func TestIsEntryPointComm(t *testing.T) {
	for comm, want := range map[string]bool{
		"ng_collect_roll": true, "ng_e2e_collect_": true, "gym": true,
		"ng_collect": false, "python3": false, "gymtrace": false, "": false,
	} {
		if got := isEntryPointComm(comm); got != want {
			t.Errorf("isEntryPointComm(%q) = %v, want %v", comm, got, want)
		}
	}
}
