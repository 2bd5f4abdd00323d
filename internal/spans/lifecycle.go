//go:build linux

package spans

import (
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Spans built from process lifecycle records (loader.ProcEvent) rather than
// HTTP: gym.job around a collector's run, gym.sandbox.* around a provider CLI,
// and the startup spans (startup.go).

// maxLifecycle bounds each lifecycle table. The kernel's sandbox table holds
// 4096 CLIs; an END record lost to a full ring buffer must not leak forever.
const maxLifecycle = 4096

// lifecycle is the Builder's process state, guarded by Builder.mu.
type lifecycle struct {
	jobs      map[uint32]*job
	execs     map[uint32]execRecord
	sandboxes map[uint32]*sandbox
	st        startupState // the startup group's processes (startup.go)
}

// job is a collector's gym.job span. Its id exists from the collector's
// first POST /run: every client span of the process is its child from then on,
// and the span itself is emitted at the process's exit.
type job struct {
	n     *node
	start uint64
	proc  *discover.Process
}

// execRecord is when a process image started, for a gym.job that should start
// at the collector's exec rather than at its first /run.
type execRecord struct {
	ts     uint64
	entry  bool // the exec'd file is one of Gym's collector entry points
	python bool // a Python interpreter (startup.go: a server's exec)
}

// sandbox is a provider CLI running now, its span decided at its start.
type sandbox struct {
	n          *node
	pid        uint32    // the CLI's (initial PID namespace)
	cause      [2]uint64 // the kernel's binding: inbound connection and request index
	provider   uint8
	verb       uint8
	start      uint64
	proc       *discover.Process // the server that spawned it
	rollout    string
	unresolved string
}

func (l *lifecycle) init() {
	if l.jobs == nil {
		l.jobs = make(map[uint32]*job)
		l.execs = make(map[uint32]execRecord)
		l.sandboxes = make(map[uint32]*sandbox)
	}
}

// The kernel reports comm, which Linux cuts to 15 bytes: ng_collect_rollouts
// arrives as "ng_collect_roll".
var entryPointComms = []string{"ng_collect_rollouts", "ng_e2e_collect_rollouts", "gym"}

func isEntryPointComm(comm string) bool {
	for _, ep := range entryPointComms {
		if comm == ep || len(comm) == 15 && strings.HasPrefix(ep, comm) {
			return true
		}
	}
	return false
}

func commString(c [16]uint8) string {
	n := 0
	for n < len(c) && c[n] != 0 {
		n++
	}
	return string(c[:n])
}

// ProcEvent consumes one process lifecycle record and returns the spans it
// finished (a gym.sandbox.* span at a CLI's exit, a gym.job at a collector's),
// together with any other finished span not yet taken; the caller owns them.
func (b *Builder) ProcEvent(ev *loader.ProcEvent) []Span {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lc.init()
	switch ev.Kind {
	case loader.EvProcFork:
		// A new process: whatever an older holder of this pid left is stale.
		b.endStaleJob(ev.Pid, ev.TsNs)
		delete(b.lc.execs, ev.Pid)
	case loader.EvProcExec:
		// The image that ran the job is gone; a new one starts now.
		b.endStaleJob(ev.Pid, ev.TsNs)
		if len(b.lc.execs) >= maxLifecycle {
			b.dropOldestExec()
		}
		comm := commString(ev.Comm)
		b.lc.execs[ev.Pid] = execRecord{ts: ev.TsNs, entry: isEntryPointComm(comm), python: isPythonComm(comm)}
	case loader.EvProcExit:
		delete(b.lc.execs, ev.Pid)
		if j := b.lc.jobs[ev.Pid]; j != nil {
			delete(b.lc.jobs, ev.Pid)
			b.finishJob(j, ev.TsNs, ev.ExitCode, false)
		}
	case loader.EvSandboxStart:
		b.startSandbox(ev)
	case loader.EvSandboxEnd:
		b.endSandbox(ev)
	}
	// After the exec is recorded: a server's listen reads its exec's time.
	b.startupEvent(ev)
	out := b.out
	b.out = nil
	return out
}

// jobParent returns the gym.job span a client request of process x.PID belongs
// under, or nil. The job begins at a collector's first POST /run (at its exec,
// when that was seen); with the job group off there is none and each /run
// stays the root of its own trace.
func (b *Builder) jobParent(x *http.Exchange, p *discover.Process, mask groups.Mask) *node {
	if !mask.Has(groups.Job) {
		return nil
	}
	b.lc.init()
	if j := b.lc.jobs[x.PID]; j != nil {
		return j.n
	}
	if x.Method != "POST" || x.Path != "/run" {
		return nil
	}
	ex, execSeen := b.lc.execs[x.PID]
	if b.role(p, x) != groups.RoleOrchestrator && !ex.entry {
		return nil
	}
	if len(b.lc.jobs) >= maxLifecycle {
		// Only collectors have jobs: this many means exits were lost.
		for pid, old := range b.lc.jobs {
			delete(b.lc.jobs, pid)
			b.finishJob(old, x.ReqStart, 0, true)
			break
		}
	}
	j := &job{n: b.newNode(), start: x.ReqStart}
	if execSeen && ex.ts <= x.ReqStart {
		j.start = ex.ts
	}
	b.setRoot(j.n)
	if fp := b.procs[x.PID]; fp == p && p.Role == loader.RoleUnknown {
		// Seen only by its exec: name it as Gym names the collector's resource.
		p.Role = loader.RoleOrchestrator
		p.ServerName = discover.TypeOrchestrator
	}
	// The job keeps the identity its process has now, an inferred role
	// included: discovery may see the exit first and the process be
	// forgotten (ForgetProcess) before the exit record that ends the job.
	j.proc = b.effProc(p, x.PID)
	b.lc.jobs[x.PID] = j
	return j.n
}

// endStaleJob ends the job of a process whose exit was never seen (its pid now
// names another process, or it exec'd another program).
func (b *Builder) endStaleJob(pid uint32, ts uint64) {
	if j := b.lc.jobs[pid]; j != nil {
		delete(b.lc.jobs, pid)
		b.finishJob(j, ts, 0, true)
	}
}

func (b *Builder) dropOldestExec() {
	var oldest uint32
	first := true
	var ts uint64
	for pid, r := range b.lc.execs {
		if first || r.ts < ts {
			oldest, ts, first = pid, r.ts, false
		}
	}
	delete(b.lc.execs, oldest)
}

func (b *Builder) finishJob(j *job, end uint64, exitCode int32, truncated bool) {
	name := j.proc.ServerName
	if name == "" {
		name = discover.TypeOrchestrator
	}
	attrs := []attribute.KeyValue{attribute.String("nemo.gym.server.name", name)}
	var status codes.Code
	var msg string
	if !truncated && exitCode != 0 {
		// Gym's span records the exception that ended the run; from outside,
		// a failed exit is what shows.
		status, msg = codes.Error, "collector "+exitText(exitCode)
	}
	b.emitSpan(j.n, "gym.job", trace.SpanKindInternal, groups.Job, j.start, end, truncated, attrs, status, msg, j.proc)
}

// exitText renders the kernel's exit status: 0..255, or -N for death by
// signal N (the convention of Python's subprocess returncode).
func exitText(code int32) string {
	if code < 0 {
		return "killed by signal " + strconv.Itoa(int(-code))
	}
	return "exited with status " + strconv.Itoa(int(code))
}

func providerName(p uint8) string {
	switch p {
	case loader.SandboxDocker:
		return "docker"
	case loader.SandboxApptainer:
		return "apptainer"
	case loader.SandboxEnroot:
		return "enroot"
	}
	return ""
}

func (b *Builder) startSandbox(ev *loader.ProcEvent) {
	// The kernel sends nothing with sandbox off, except in no-gate benchmark
	// mode: the Go-side filter keeps that mode's output identical.
	if ev.Verb == loader.SandboxVerbOther || providerName(ev.Provider) == "" || !b.Mask().Has(groups.Sandbox) {
		return
	}
	b.countsOf(ev.Ppid).Made++ // a call out: its parent needs the server's asyncio context
	start := ev.StartNs
	if start == 0 {
		start = ev.TsNs
	}
	if old := b.lc.sandboxes[ev.Pid]; old != nil {
		// Its END was lost and the pid is running another CLI.
		delete(b.lc.sandboxes, ev.Pid)
		b.finishSandbox(old, start, 0, true)
	}
	if len(b.lc.sandboxes) >= maxLifecycle {
		b.evictOldestSandbox(start)
	}
	b.lc.sandboxes[ev.Pid] = b.newSandbox(ev, start)
}

func (b *Builder) endSandbox(ev *loader.ProcEvent) {
	sb := b.lc.sandboxes[ev.Pid]
	if sb != nil {
		delete(b.lc.sandboxes, ev.Pid)
	} else {
		// The START record was lost (full ring buffer) or the groups changed
		// since: the END record carries all but the parent, which is looked
		// up as of the CLI's start.
		if ev.Verb == loader.SandboxVerbOther || providerName(ev.Provider) == "" || !b.Mask().Has(groups.Sandbox) {
			return
		}
		start := ev.StartNs
		if start == 0 || start > ev.TsNs {
			start = ev.TsNs
		}
		sb = b.newSandbox(ev, start)
	}
	b.finishSandbox(sb, ev.TsNs, ev.ExitCode, false)
}

// newSandbox decides the span's id and parent: the request whose handler
// spawned the CLI, found like the cause of an outbound request (asyncio
// context when the kernel gives one, else the innermost of one chain of the
// server's in-flight requests), its innermost enabled span being the parent.
func (b *Builder) newSandbox(ev *loader.ProcEvent, start uint64) *sandbox {
	sb := &sandbox{pid: ev.Pid, cause: [2]uint64{ev.CauseConn, ev.CauseSeq}, provider: ev.Provider, verb: ev.Verb,
		start: start, proc: b.process(ev.Ppid), n: b.newNode()}
	probe := http.Exchange{PID: ev.Ppid, ReqStart: start, PyCtx: ev.PyCtx, PyRoot: ev.PyRoot,
		CauseConn: ev.CauseConn, CauseSeq: ev.CauseSeq}
	in := b.cause(&probe, &sb.unresolved)
	switch {
	case in != nil && in.gym != nil:
		sb.n.parent = in.gym
	case in != nil && in.server != nil:
		sb.n.parent = in.server
	default:
		b.setRoot(sb.n)
	}
	if in != nil {
		sb.rollout = in.rollout
	} else if sb.unresolved == "" {
		// Started outside any request the server was answering (or one gymtrace
		// never saw): a root, flagged so it is not mistaken for a resolved one.
		sb.unresolved = "no_request_in_flight"
	}
	return sb
}

func (b *Builder) evictOldestSandbox(now uint64) {
	var oldest uint32
	var sb *sandbox
	for pid, s := range b.lc.sandboxes {
		if sb == nil || s.start < sb.start {
			oldest, sb = pid, s
		}
	}
	if sb != nil {
		delete(b.lc.sandboxes, oldest)
		b.finishSandbox(sb, now, 0, true)
	}
}

func (b *Builder) finishSandbox(sb *sandbox, end uint64, exitCode int32, truncated bool) {
	provider := providerName(sb.provider)
	name := "gym.sandbox.start"
	if sb.verb == loader.SandboxVerbExec {
		name = "gym.sandbox.exec"
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, attribute.String("nemo.gym.sandbox.provider", provider))
	if debugRecords {
		attrs = appendSandboxDebug(attrs, sb, end)
	}
	var status codes.Code
	var msg string
	if !truncated {
		if sb.verb == loader.SandboxVerbExec {
			// The command's status is the result of an exec, not a failure of it.
			attrs = append(attrs, attribute.Int("nemo.gym.sandbox.return_code", int(exitCode)))
		} else if exitCode != 0 {
			status, msg = codes.Error, provider+" "+exitText(exitCode)
		}
	}
	attrs = b.appendGym(attrs, sb.proc, sb.rollout)
	if sb.unresolved != "" {
		attrs = append(attrs, attribute.String("gymtrace.parent.unresolved", sb.unresolved))
	}
	b.emitSpan(sb.n, name, trace.SpanKindInternal, groups.Sandbox, sb.start, end, truncated, attrs, status, msg, sb.proc)
}

// flushLifecycle ends every open job and sandbox now, truncated. Called with
// b.mu held.
func (b *Builder) flushLifecycle(now uint64) {
	for pid, sb := range b.lc.sandboxes {
		delete(b.lc.sandboxes, pid)
		b.finishSandbox(sb, now, 0, true)
	}
	for pid, j := range b.lc.jobs {
		delete(b.lc.jobs, pid)
		b.finishJob(j, now, 0, true)
	}
	clear(b.lc.execs)
	b.flushStartup()
}
