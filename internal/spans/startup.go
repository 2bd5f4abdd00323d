//go:build linux

package spans

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Startup spans (the startup group; docs/startup.md), from process records
// alone: the fork of each launch shell, the server's exec, its first
// listen(2) and its first answer (bpf/startup.h).
//
//	gym.startup                          orchestrator: its exec -> the last of its servers to answer
//	  gym.startup.server                 launch shell's fork -> the server's first answer
//	    gym.server.startup               launch shell's fork -> the first listen(2) on its port
//	      gym.server.startup.venv_setup            fork -> the server's exec
//	      gym.server.startup.interpreter_to_listen exec -> listen(2)
//	      gym.server.startup.worker                a uvicorn worker's fork -> its listen(2)
//
// The server is the topmost Python process under the launch shell (bash's
// child or bash itself after `exec python`, uv run's child). A uvicorn server
// with workers never calls listen(2) itself (uvicorn binds, each worker's
// event loop listens): its first listen is its first worker's.
//
// Every boundary is a kernel timestamp of one of those events; a span whose
// boundary was not seen (a process older than gymtrace, a lost record) is not
// made.

// Stage names (nemo.gym.startup.stage). The second is not Gym's split: Gym
// marks interpreter_start, its own marks and uvicorn_startup from inside the
// process; from outside only the exec and the listen(2) are seen.
const (
	StageVenvSetup           = "venv_setup"
	StageInterpreterToListen = "interpreter_to_listen"
	StageWorkerStart         = "worker_start" // gym.server.startup.worker, Gym's stage name
)

// maxWorkers bounds the workers one server's startup keeps.
const maxWorkers = 256

// maxStartupHops bounds the walk from a server up to its launch shell
// (shell -> uv run -> python is three).
const maxStartupHops = 16

// forkRecord is a process the kernel saw being born under a target.
type forkRecord struct {
	ppid uint32
	ts   uint64
}

// launch is a launch shell: a shell a traced process forked and exec'd, not
// itself under another launch shell.
type launch struct {
	orch     uint32 // the process that forked it
	forkTS   uint64
	server   uint32 // the topmost Python under it, once something under it listened; 0 until then
	execTS   uint64 // the server's exec
	listenTS uint64 // the first listen(2) under it
	ready    bool
	readyTS  uint64   // the first answer under it
	unnamed  bool     // answered, its server not yet named by discovery (finishLaunch)
	top, ss  *node    // gym.startup.server and gym.server.startup, from the first listen
	workers  []worker // uvicorn workers that listened before the first answer
}

// worker is a uvicorn worker's start: its fork by the server to its listen.
type worker struct {
	pid              uint32
	forkTS, listenTS uint64
}

// orchStartup is one orchestrator's gym.startup: open while a launch shell of
// it has not answered yet.
type orchStartup struct {
	n         *node // nil when its exec was not seen: its servers' spans are roots
	start     uint64
	pending   map[uint32]struct{} // launch shells not answered yet
	answered  int
	lastReady uint64
	done      bool // emitted: later launches are roots
}

type startupState struct {
	forks   map[uint32]forkRecord
	shells  map[uint32]*launch
	orchs   map[uint32]*orchStartup
	unnamed map[uint32]uint32 // server pid -> its launch shell, answered before discovery named it
}

func (s *startupState) init() {
	if s.forks == nil {
		s.forks = make(map[uint32]forkRecord)
		s.shells = make(map[uint32]*launch)
		s.orchs = make(map[uint32]*orchStartup)
		s.unnamed = make(map[uint32]uint32)
	}
}

var shellComms = map[string]bool{"bash": true, "sh": true, "dash": true, "zsh": true}

// isPythonComm: a Python interpreter's comm (python3, python3.12, pypy3).
func isPythonComm(comm string) bool {
	return strings.HasPrefix(comm, "python") || strings.HasPrefix(comm, "pypy")
}

// startupEvent follows one process record for the startup spans. Called
// with b.mu held, before lifecycle.go's handling of the same record (which
// forgets an exited process's exec).
func (b *Builder) startupEvent(ev *loader.ProcEvent) {
	st := &b.lc.st
	st.init()
	switch ev.Kind {
	case loader.EvProcFork:
		if len(st.forks) >= maxLifecycle {
			b.dropOldestFork()
		}
		st.forks[ev.Pid] = forkRecord{ppid: ev.Ppid, ts: ev.TsNs}
		delete(st.shells, ev.Pid) // a reused pid: whatever it was is gone
	case loader.EvProcExec:
		b.startupExec(ev)
	case loader.EvStartupListen:
		b.startupListen(ev)
	case loader.EvStartupReady:
		b.startupReady(ev)
	case loader.EvProcExit:
		b.startupExit(ev.Pid)
		// Its children, if any live on, were handed to another parent; a
		// launch's chain runs through processes that wait for theirs.
		delete(st.forks, ev.Pid)
	}
}

func (b *Builder) dropOldestFork() {
	st := &b.lc.st
	var oldest uint32
	first := true
	var ts uint64
	for pid, f := range st.forks {
		if first || f.ts < ts {
			oldest, ts, first = pid, f.ts, false
		}
	}
	delete(st.forks, oldest)
}

// launchOf is the launch shell pid runs under (pid itself, or an ancestor
// seen being born), or 0.
func (b *Builder) launchOf(pid uint32) uint32 {
	st := &b.lc.st
	for range maxStartupHops {
		if _, ok := st.shells[pid]; ok {
			return pid
		}
		f, ok := st.forks[pid]
		if !ok {
			return 0
		}
		pid = f.ppid
	}
	return 0
}

// startupExec makes a launch of a shell exec'd by a process a traced one
// forked, unless it already runs under a launch (a subshell, bash -c in bash -c).
func (b *Builder) startupExec(ev *loader.ProcEvent) {
	st := &b.lc.st
	if !shellComms[commString(ev.Comm)] || !b.Mask().Has(groups.Startup) {
		return
	}
	f, ok := st.forks[ev.Pid]
	if !ok || b.launchOf(f.ppid) != 0 {
		return
	}
	if _, ok := st.shells[ev.Pid]; ok {
		return // the shell exec'd another shell: still the same launch
	}
	if len(st.shells) >= maxLifecycle {
		return // exits were lost; a launch left out makes no span, never a wrong one
	}
	st.shells[ev.Pid] = &launch{orch: f.ppid, forkTS: f.ts}
	o := st.orchs[f.ppid]
	if o == nil || o.done {
		o = &orchStartup{pending: make(map[uint32]struct{})}
		// gym.startup exists only when the orchestrator's own exec was
		// seen, and only for its first round of servers.
		if ex, ok := b.lc.execs[f.ppid]; ok && ex.ts <= f.ts && st.orchs[f.ppid] == nil {
			o.n, o.start = b.newNode(), ex.ts
			b.setRoot(o.n)
		}
		if len(st.orchs) >= maxLifecycle {
			return
		}
		st.orchs[f.ppid] = o
	}
	o.pending[ev.Pid] = struct{}{}
}

// startupListen: the first listen(2) under a launch names its server (the
// topmost Python on the way up) and ends gym.server.startup; a later one by
// a worker of that server is the worker's start.
func (b *Builder) startupListen(ev *loader.ProcEvent) {
	st := &b.lc.st
	if !b.Mask().Has(groups.Startup) {
		return
	}
	sp := b.launchOf(ev.Pid)
	l := st.shells[sp]
	if l == nil {
		return
	}
	main := b.serverMain(ev.Pid, sp)
	if main == 0 {
		return // nothing under the shell exec'd Python: not a Gym server's start
	}
	if l.server == 0 {
		ex := b.lc.execs[main]
		if ex.ts < l.forkTS || ex.ts > ev.TsNs {
			return
		}
		l.server, l.execTS, l.listenTS = main, ex.ts, ev.TsNs
		o := st.orchs[l.orch]
		l.top, l.ss = b.newNode(), b.newNode()
		if o != nil && o.n != nil && !o.done {
			l.top.parent = o.n
		} else {
			b.setRoot(l.top)
		}
		l.ss.parent = l.top
	} else if main != l.server {
		return // another Python tree under the same shell: not this server's
	}
	if ev.Pid == main {
		return
	}
	f, ok := st.forks[ev.Pid]
	if !ok || f.ts < l.execTS || f.ts > ev.TsNs {
		return
	}
	w := worker{pid: ev.Pid, forkTS: f.ts, listenTS: ev.TsNs}
	if l.ready {
		b.emitWorker(l, b.process(l.server), w)
	} else if len(l.workers) < maxWorkers {
		l.workers = append(l.workers, w)
	}
}

// serverMain is the topmost process from pid up to the launch shell sp
// (both included) whose last exec was a Python interpreter, or 0.
func (b *Builder) serverMain(pid, sp uint32) uint32 {
	var main uint32
	for range maxStartupHops {
		if ex, ok := b.lc.execs[pid]; ok && ex.python {
			main = pid
		}
		if pid == sp {
			return main
		}
		f, ok := b.lc.st.forks[pid]
		if !ok {
			return 0
		}
		pid = f.ppid
	}
	return 0
}

// startupReady: the first answer under a launch whose server listened ends
// its spans, and gym.startup when it was the last of its orchestrator's.
func (b *Builder) startupReady(ev *loader.ProcEvent) {
	st := &b.lc.st
	if !b.Mask().Has(groups.Startup) {
		return
	}
	sp := b.launchOf(ev.Pid)
	l := st.shells[sp]
	if l == nil || l.server == 0 || l.ready || ev.TsNs < l.listenTS {
		return
	}
	l.ready, l.readyTS = true, ev.TsNs
	b.finishLaunch(sp, l)
}

// gymServer: discovery has named p one of Gym's servers. Until it has, a
// child is known by its parent's identity (the orchestrator's).
func gymServer(p *discover.Process) bool {
	return p.ServerName != "" && p.Role != discover.RoleOrchestrator
}

// finishLaunch emits an answered launch's spans once discovery has named its
// server; until then (discovery reads /proc after the exec, and may not be
// done by the first answer) the launch waits for StartupIdentified, still
// pending for its orchestrator's gym.startup.
func (b *Builder) finishLaunch(sp uint32, l *launch) {
	st := &b.lc.st
	srv := b.process(l.server)
	if !gymServer(srv) {
		if !l.unnamed && len(st.unnamed) < maxLifecycle {
			l.unnamed = true
			st.unnamed[l.server] = sp
		}
		return
	}
	if l.unnamed {
		l.unnamed = false
		delete(st.unnamed, l.server)
	}
	b.emitServerStartup(l, srv, l.readyTS)
	if o := st.orchs[l.orch]; o != nil {
		delete(o.pending, sp)
		o.answered++
		o.lastReady = max(o.lastReady, l.readyTS)
		b.maybeEndStartup(l.orch, o)
	}
}

// StartupIdentified tells the Builder that discovery named process pid (the
// agent calls it when it adds a target): a server that answered before that
// gets its startup spans now. It returns the spans finished.
func (b *Builder) StartupIdentified(pid int) []Span {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := &b.lc.st
	if sp, ok := st.unnamed[uint32(pid)]; ok {
		if l := st.shells[sp]; l != nil && l.unnamed {
			b.finishLaunch(sp, l)
		} else {
			delete(st.unnamed, uint32(pid))
		}
	}
	out := b.out
	b.out = nil
	return out
}

func startupAttrs(srv *discover.Process, pid uint32) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("nemo.gym.server.name", srv.ServerName),
		attribute.String("nemo.gym.server.type", srv.ServerType()),
		attribute.Int("process.pid", int(pid)),
	}
}

func (b *Builder) emitServerStartup(l *launch, srv *discover.Process, ready uint64) {
	own := startupAttrs(srv, l.server)
	// The orchestrator's view: on its resource, named for the server.
	b.emitSpan(l.top, "gym.startup.server", trace.SpanKindInternal, groups.Startup, l.forkTS, ready, false, own[:2:2], 0, "", b.process(l.orch))
	b.emitSpan(l.ss, "gym.server.startup", trace.SpanKindInternal, groups.Startup, l.forkTS, l.listenTS, false, own, 0, "", srv)
	for _, stg := range []struct {
		name       string
		start, end uint64
	}{{StageVenvSetup, l.forkTS, l.execTS}, {StageInterpreterToListen, l.execTS, l.listenTS}} {
		n := b.newNode()
		n.parent = l.ss
		attrs := append(own[:3:3], attribute.String("nemo.gym.startup.stage", stg.name))
		b.emitSpan(n, "gym.server.startup."+stg.name, trace.SpanKindInternal, groups.Startup, stg.start, stg.end, false, attrs, 0, "", srv)
	}
	for _, w := range l.workers {
		b.emitWorker(l, srv, w)
	}
	l.workers = nil
}

// emitWorker: one uvicorn worker, from the server's fork of it (uvicorn
// handing off) to its listen(2) (its loop accepting connections).
func (b *Builder) emitWorker(l *launch, srv *discover.Process, w worker) {
	n := b.newNode()
	n.parent = l.ss
	attrs := append(startupAttrs(srv, w.pid), attribute.String("nemo.gym.startup.stage", StageWorkerStart))
	b.emitSpan(n, "gym.server.startup.worker", trace.SpanKindInternal, groups.Startup, w.forkTS, w.listenTS, false, attrs, 0, "", b.process(w.pid))
}

// maybeEndStartup emits gym.startup once no launch of the orchestrator is
// waiting and at least one answered.
func (b *Builder) maybeEndStartup(pid uint32, o *orchStartup) {
	if o.done || len(o.pending) > 0 || o.answered == 0 {
		return
	}
	o.done = true
	if o.n == nil {
		return
	}
	p := b.process(pid)
	name := p.ServerName
	if name == "" {
		name = discover.TypeOrchestrator
	}
	attrs := []attribute.KeyValue{attribute.String("nemo.gym.server.name", name),
		attribute.String("nemo.gym.server.type", discover.TypeOrchestrator), attribute.Int("process.pid", int(pid))}
	b.emitSpan(o.n, "gym.startup", trace.SpanKindInternal, groups.Startup, o.start, o.lastReady, false, attrs, 0, "", p)
}

// startupExit: a launch shell that exits before an answer under it leaves
// its orchestrator's wait (no span: its server never answered); an
// orchestrator that exits forgets its startup.
func (b *Builder) startupExit(pid uint32) {
	st := &b.lc.st
	if l := st.shells[pid]; l != nil {
		delete(st.shells, pid)
		if l.unnamed {
			// Answered, and never named a Gym server: not one of Gym's.
			delete(st.unnamed, l.server)
			b.st.StartupUnidentified++
		}
		if o := st.orchs[l.orch]; o != nil && (!l.ready || l.unnamed) {
			delete(o.pending, pid)
			b.maybeEndStartup(l.orch, o)
		}
	}
	if o := st.orchs[pid]; o != nil {
		delete(st.orchs, pid)
		b.maybeEndStartup(pid, o)
	}
}

// flushStartup forgets what is still starting at shutdown: a startup span
// gymtrace would have to end itself is not made (its end is the answer).
func (b *Builder) flushStartup() {
	st := &b.lc.st
	clear(st.shells)
	clear(st.orchs)
	clear(st.forks)
	clear(st.unnamed)
}
