//go:build linux

package spans

import (
	"testing"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// A Gym-shaped start, as the kernel reports it: the orchestrator (pid 100,
// its exec seen) forks two launch shells; shell 600 runs a venv step (601)
// then forks the resources server (602), which forks a uvicorn worker (603);
// shell 700 execs the agent in place (bash's exec of the last command).
const (
	pidShellA, pidVenvA, pidSrvA, pidWorkerA = 600, 601, 602, 603
	pidShellB                                = 700
)

type startupSim struct {
	*sim
}

func newStartupSim(t *testing.T, spec string) startupSim {
	s := newSim(t, spec)
	traceCollector(s)
	s.procs[pidSrvA] = &discover.Process{PID: pidSrvA, Role: loader.RoleResources, ServerName: "weather"}
	s.procs[pidWorkerA] = &discover.Process{PID: pidWorkerA, Role: loader.RoleResources, ServerName: "weather", Worker: true}
	s.procs[pidShellB] = &discover.Process{PID: pidShellB, Role: loader.RoleAgent, ServerName: "simple_agent"}
	return startupSim{s}
}

// at feeds one record at a given kernel time.
func (s startupSim) at(ts uint64, kind uint8, pid, ppid uint32, opts ...func(*loader.ProcEvent)) {
	ev := &loader.ProcEvent{Kind: kind, Pid: pid, Ppid: ppid, TsNs: ts}
	for _, o := range opts {
		o(ev)
	}
	s.spans = append(s.spans, s.b.ProcEvent(ev)...)
}

// start runs the whole start; withExec: the orchestrator's exec was seen.
func (s startupSim) start(withExec bool) {
	if withExec {
		s.at(1_000, loader.EvProcExec, pidCollector, 0, withComm("gym"))
	}
	s.at(10_000, loader.EvProcFork, pidShellA, pidCollector)
	s.at(11_000, loader.EvProcExec, pidShellA, 0, withComm("bash"))
	s.at(12_000, loader.EvProcFork, pidShellB, pidCollector)
	s.at(13_000, loader.EvProcExec, pidShellB, 0, withComm("bash"))
	s.at(20_000, loader.EvProcFork, pidVenvA, pidShellA)
	s.at(21_000, loader.EvProcExec, pidVenvA, 0, withComm("uv"))
	s.at(30_000, loader.EvProcExit, pidVenvA, 0)
	s.at(31_000, loader.EvProcFork, pidSrvA, pidShellA)
	s.at(32_000, loader.EvProcExec, pidSrvA, 0, withComm("python3"))
	s.at(33_000, loader.EvProcExec, pidShellB, 0, withComm("python3"))
	s.at(50_000, loader.EvStartupListen, pidSrvA, pidShellA)
	s.at(51_000, loader.EvProcFork, pidWorkerA, pidSrvA)
	s.at(52_000, loader.EvProcExec, pidWorkerA, 0, withComm("python3"))
	s.at(53_000, loader.EvStartupListen, pidWorkerA, pidSrvA) // the worker listens on the inherited socket
	s.at(60_000, loader.EvStartupReady, pidWorkerA, pidSrvA)  // and answers first
	s.at(61_000, loader.EvStartupReady, pidSrvA, pidShellA)   // a later answer changes nothing
	s.at(70_000, loader.EvStartupListen, pidShellB, pidCollector)
	s.at(90_000, loader.EvStartupReady, pidShellB, pidCollector)
}

func TestStartupSpans(t *testing.T) {
	s := newStartupSim(t, "startup")
	s.start(true)
	diffEdges(t, edges(t, s.spans), []string{
		"orchestrator:gym.startup <- ROOT",
		"orchestrator:gym.startup.server <- orchestrator:gym.startup",
		"orchestrator:gym.startup.server <- orchestrator:gym.startup",
		"weather:gym.server.startup <- orchestrator:gym.startup.server",
		"weather:gym.server.startup.venv_setup <- weather:gym.server.startup",
		"weather:gym.server.startup.interpreter_to_listen <- weather:gym.server.startup",
		"weather:gym.server.startup.worker <- weather:gym.server.startup",
		"simple_agent:gym.server.startup <- orchestrator:gym.startup.server",
		"simple_agent:gym.server.startup.venv_setup <- simple_agent:gym.server.startup",
		"simple_agent:gym.server.startup.interpreter_to_listen <- simple_agent:gym.server.startup",
	})
	if traces(s.spans) != 1 {
		t.Errorf("%d traces, want gym.startup's one", traces(s.spans))
	}
	clock := s.b.opt.Clock
	want := map[string][2]uint64{
		"orchestrator:gym.startup":                              {1_000, 90_000},
		"weather:gym.server.startup":                            {10_000, 50_000},
		"weather:gym.server.startup.venv_setup":                 {10_000, 32_000},
		"weather:gym.server.startup.interpreter_to_listen":      {32_000, 50_000},
		"simple_agent:gym.server.startup":                       {12_000, 70_000},
		"simple_agent:gym.server.startup.venv_setup":            {12_000, 33_000},
		"simple_agent:gym.server.startup.interpreter_to_listen": {33_000, 70_000},
	}
	for _, sp := range s.spans {
		w, ok := want[desc(sp)]
		if sp.Name == "gym.startup.server" {
			name, _ := attr(sp, "nemo.gym.server.name")
			w, ok = map[string][2]uint64{"weather": {10_000, 60_000}, "simple_agent": {12_000, 90_000}}[name.AsString()], true
		}
		if !ok {
			continue
		}
		if !sp.Start.Equal(clock.Wall(w[0])) || !sp.End.Equal(clock.Wall(w[1])) {
			t.Errorf("%s: [%v, %v], want kernel times %v", desc(sp), sp.Start, sp.End, w)
		}
	}
	for _, sp := range findSpans(s.spans, "gym.server.startup.venv_setup") {
		if v, _ := attr(sp, "nemo.gym.startup.stage"); v.AsString() != StageVenvSetup {
			t.Errorf("%s: stage %q", desc(sp), v.AsString())
		}
		pid, _ := attr(sp, "process.pid")
		typ, _ := attr(sp, "nemo.gym.server.type")
		if int(pid.AsInt64()) != sp.Proc.PID || typ.AsString() != sp.Proc.ServerType() {
			t.Errorf("%s: process.pid %d, type %q; want the server's", desc(sp), pid.AsInt64(), typ.AsString())
		}
	}
}

// Without the startup group nothing is built (the kernel sends no listen or
// answer record then; forks and execs still come).
func TestStartupOff(t *testing.T) {
	s := newStartupSim(t, "all")
	s.b.SetMask(s.mask.Without(groups.Startup))
	s.start(true)
	if len(s.spans) != 0 {
		t.Errorf("startup off: %v", edges(t, s.spans))
	}
}

// An orchestrator whose exec gymtrace did not see (it ran before) has no
// gym.startup; its servers, spawned while gymtrace watched, are roots.
func TestStartupOrchestratorBeforeGymtrace(t *testing.T) {
	s := newStartupSim(t, "startup")
	s.start(false)
	for _, sp := range s.spans {
		if sp.Name == "gym.startup" {
			t.Errorf("a gym.startup for an orchestrator whose exec was not seen: %s", desc(sp))
		}
	}
	if n := len(findSpans(s.spans, "gym.startup.server")); n != 2 || traces(s.spans) != 2 {
		t.Errorf("%d gym.startup.server spans in %d traces, want 2 roots", n, traces(s.spans))
	}
}

// A server already running when gymtrace started (no fork seen) gets none:
// the kernel sends no listen record for it, and an answer alone is ignored.
func TestStartupServerBeforeGymtrace(t *testing.T) {
	s := newStartupSim(t, "startup")
	s.at(1_000, loader.EvStartupReady, pidSrvA, 1)
	s.at(2_000, loader.EvStartupListen, pidSrvA, 1)
	s.at(3_000, loader.EvStartupReady, pidSrvA, 1)
	if len(s.spans) != 0 {
		t.Errorf("spans for a server whose start was not seen: %v", edges(t, s.spans))
	}
}

// A launch shell that exits before anything under it answered makes no
// span; gym.startup ends at the last server that did answer.
func TestStartupShellDiesBeforeAnswer(t *testing.T) {
	s := newStartupSim(t, "startup")
	s.at(1_000, loader.EvProcExec, pidCollector, 0, withComm("gym"))
	s.at(10_000, loader.EvProcFork, pidShellA, pidCollector)
	s.at(11_000, loader.EvProcExec, pidShellA, 0, withComm("bash"))
	s.at(12_000, loader.EvProcFork, pidShellB, pidCollector)
	s.at(13_000, loader.EvProcExec, pidShellB, 0, withComm("bash"))
	s.at(33_000, loader.EvProcExec, pidShellB, 0, withComm("python3"))
	s.at(70_000, loader.EvStartupListen, pidShellB, pidCollector)
	s.at(90_000, loader.EvStartupReady, pidShellB, pidCollector)
	if len(findSpans(s.spans, "gym.startup")) != 0 {
		t.Fatal("gym.startup ended while a launch shell was still starting")
	}
	s.at(95_000, loader.EvProcExit, pidShellA, 0)
	got := findSpans(s.spans, "gym.startup")
	if len(got) != 1 || !got[0].End.Equal(s.b.opt.Clock.Wall(90_000)) {
		t.Fatalf("gym.startup: %v, want one ending at the agent's answer", got)
	}
	if n := len(findSpans(s.spans, "gym.startup.server")); n != 1 {
		t.Errorf("%d gym.startup.server spans, want the agent's only", n)
	}
}

// A uvicorn server with workers: uvicorn binds in the main process and each
// worker's loop listens, so the first listen is a worker's. The server is
// still the main process (the topmost Python under the shell): its exec ends
// venv_setup, the first worker's listen ends interpreter_to_listen, and each
// worker gets gym.server.startup.worker from its fork to its listen.
func TestStartupUvicornWorkers(t *testing.T) {
	s := newStartupSim(t, "startup")
	const pidWorker2 = 604
	s.procs[pidWorker2] = &discover.Process{PID: pidWorker2, Role: loader.RoleResources, ServerName: "weather", Worker: true}
	s.at(1_000, loader.EvProcExec, pidCollector, 0, withComm("gym"))
	s.at(10_000, loader.EvProcFork, pidShellA, pidCollector)
	s.at(11_000, loader.EvProcExec, pidShellA, 0, withComm("bash"))
	s.at(31_000, loader.EvProcFork, pidSrvA, pidShellA)
	s.at(32_000, loader.EvProcExec, pidSrvA, 0, withComm("python3"))
	s.at(40_000, loader.EvProcFork, pidWorkerA, pidSrvA)
	s.at(41_000, loader.EvProcExec, pidWorkerA, 0, withComm("python3"))
	s.at(42_000, loader.EvProcFork, pidWorker2, pidSrvA)
	s.at(43_000, loader.EvProcExec, pidWorker2, 0, withComm("python3"))
	s.at(53_000, loader.EvStartupListen, pidWorkerA, pidSrvA)
	s.at(55_000, loader.EvStartupListen, pidWorker2, pidSrvA)
	s.at(60_000, loader.EvStartupReady, pidWorker2, pidSrvA)
	clock := s.b.opt.Clock
	want := map[string][2]uint64{
		"gym.startup":                              {1_000, 60_000},
		"gym.startup.server":                       {10_000, 60_000},
		"gym.server.startup":                       {10_000, 53_000},
		"gym.server.startup.venv_setup":            {10_000, 32_000},
		"gym.server.startup.interpreter_to_listen": {32_000, 53_000},
	}
	for name, w := range want {
		got := findSpans(s.spans, name)
		if len(got) != 1 || !got[0].Start.Equal(clock.Wall(w[0])) || !got[0].End.Equal(clock.Wall(w[1])) {
			t.Errorf("%s: %v, want one at kernel times %v", name, got, w)
		}
	}
	if ss := findSpans(s.spans, "gym.server.startup"); len(ss) == 1 {
		if pid, _ := attr(ss[0], "process.pid"); pid.AsInt64() != pidSrvA {
			t.Errorf("gym.server.startup is pid %d's, want the main process %d", pid.AsInt64(), pidSrvA)
		}
	}
	workers := map[int64][2]uint64{pidWorkerA: {40_000, 53_000}, pidWorker2: {42_000, 55_000}}
	got := findSpans(s.spans, "gym.server.startup.worker")
	if len(got) != 2 {
		t.Fatalf("%d worker spans, want 2", len(got))
	}
	for _, sp := range got {
		pid, _ := attr(sp, "process.pid")
		w := workers[pid.AsInt64()]
		if !sp.Start.Equal(clock.Wall(w[0])) || !sp.End.Equal(clock.Wall(w[1])) || sp.Proc.PID != int(pid.AsInt64()) {
			t.Errorf("worker %d: [%v, %v] on pid %d, want kernel times %v", pid.AsInt64(), sp.Start, sp.End, sp.Proc.PID, w)
		}
	}
}

// Discovery reads /proc after a server's exec and may name it only after its
// first answer: until then it is known by its parent's identity (the
// orchestrator's), and its spans wait for StartupIdentified; gym.startup waits
// with them. A process under a shell that is never named a Gym server makes
// none.
func TestStartupNamedAfterAnswer(t *testing.T) {
	s := newStartupSim(t, "startup")
	orchestrator := s.procs[pidCollector]
	named := s.procs[pidShellB]
	s.procs[pidShellB] = &discover.Process{PID: pidShellB, Role: orchestrator.Role, ServerName: orchestrator.ServerName, Worker: true}
	s.at(1_000, loader.EvProcExec, pidCollector, 0, withComm("gym"))
	s.at(12_000, loader.EvProcFork, pidShellB, pidCollector)
	s.at(13_000, loader.EvProcExec, pidShellB, 0, withComm("bash"))
	s.at(33_000, loader.EvProcExec, pidShellB, 0, withComm("python3"))
	s.at(70_000, loader.EvStartupListen, pidShellB, pidCollector)
	s.at(90_000, loader.EvStartupReady, pidShellB, pidCollector)
	if len(s.spans) != 0 {
		t.Fatalf("spans before discovery named the server: %v", edges(t, s.spans))
	}
	s.procs[pidShellB] = named
	s.spans = append(s.spans, s.b.StartupIdentified(pidShellB)...)
	if n := len(s.spans); n != 5 {
		t.Fatalf("%d spans once named, want gym.startup and the agent's four: %v", n, edges(t, s.spans))
	}
	if got := findSpans(s.spans, "gym.startup.server"); len(got) != 1 || !got[0].End.Equal(s.b.opt.Clock.Wall(90_000)) {
		t.Errorf("gym.startup.server %v, want one ending at the answer's kernel time", got)
	}

	// Never named: no spans, and the orchestrator's wait ends at the shell's exit.
	s2 := newStartupSim(t, "startup")
	delete(s2.procs, pidShellB)
	s2.at(1_000, loader.EvProcExec, pidCollector, 0, withComm("gym"))
	s2.at(12_000, loader.EvProcFork, pidShellB, pidCollector)
	s2.at(13_000, loader.EvProcExec, pidShellB, 0, withComm("bash"))
	s2.at(33_000, loader.EvProcExec, pidShellB, 0, withComm("python3"))
	s2.at(70_000, loader.EvStartupListen, pidShellB, pidCollector)
	s2.at(90_000, loader.EvStartupReady, pidShellB, pidCollector)
	s2.at(95_000, loader.EvProcExit, pidShellB, 0)
	if len(s2.spans) != 0 || s2.b.Stats().StartupUnidentified != 1 {
		t.Errorf("an unnamed process: %v, %d unidentified", edges(t, s2.spans), s2.b.Stats().StartupUnidentified)
	}
}
