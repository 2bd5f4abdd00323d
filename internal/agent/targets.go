//go:build linux

package agent

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// The agent's targets: what discovery found, added to and removed from the
// kernel's target set, the Python and TLS attachers, injection's sockhash and
// the span builder; and the lifecycle records that tell discovery of forks,
// execs and exits at once.

func (t *agent) lookup(pid int) *discover.Process {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.procs[pid]
}

func (t *agent) addTarget(p *discover.Process) {
	t.mu.Lock()
	t.procs[p.PID] = p
	t.mu.Unlock()
	if err := t.kern.AddTarget(p.PID, p.Role); err != nil {
		t.log.Warn("cannot trace process", "pid", p.PID, "err", err)
		return
	}
	if t.injWanted.Load() {
		t.adoptConnections(p.PID)
	}
	t.py.add(p.PID)
	if p.Role == loader.RoleOrchestrator && t.spans != nil {
		// Its calls carry its gym.job's trace from the first one on.
		t.spans.Builder().PrepareJob(p.PID)
	}
	if t.gym != nil {
		t.gym.Seen(p) // an orchestrator's gym.servers.active
	}
	t.log.Info("tracing", "pid", p.PID, "service", p.ServiceName(), "type", p.ServerType())
	if t.spans != nil {
		// A server that answered its first health probe before discovery
		// named it gets its startup spans now (internal/spans/startup.go).
		t.submit(t.spans.Builder().StartupIdentified(p.PID))
	}
	_ = t.tls.Add(p.PID) // failures are logged by the attacher; plain HTTP is traced regardless
}

// adoptConnections puts pid's pooled keep-alive connections from before now
// in the injection sockhash; otherwise they would never carry traceparent
// (sock_ops sees only new ones).
func (t *agent) adoptConnections(pid int) {
	if n, err := t.inj.AdoptConnections(pid); err != nil {
		t.log.Warn("cannot add the process's existing connections to traceparent injection; they get no header until replaced",
			"pid", pid, "adopted", n, "err", err)
	} else if n > 0 {
		t.log.Info("existing outbound connections adopted for traceparent injection", "pid", pid, "connections", n)
	}
}

// setInjectWanted follows a reload: without http_client the targets'
// sockets leave the injection sockhash (their writes take the plain TCP
// path again); with it back, their open connections are adopted again.
func (t *agent) setInjectWanted(on bool) {
	if t.inj == nil || t.injWanted.Swap(on) == on {
		return
	}
	if !on {
		if err := t.inj.ReleaseConnections(); err != nil {
			t.log.Warn("emptying the injection sockhash", "err", err)
		}
		return
	}
	t.mu.RLock()
	pids := slices.Collect(maps.Keys(t.procs))
	t.mu.RUnlock()
	for _, pid := range pids {
		t.adoptConnections(pid)
	}
}

func (t *agent) removeTarget(p *discover.Process) {
	// Its probes come off in the background (closer): the next target's
	// exec event must not wait for them.
	probes := t.tls.Take(p.PID)
	if err := t.kern.RemoveTarget(p.PID); err != nil {
		t.log.Warn("removing target", "pid", p.PID, "err", err)
	}
	t.detached.add(append(probes, t.py.take(p.PID)...))
	t.mu.Lock()
	delete(t.procs, p.PID)
	t.mu.Unlock()
	t.spans.Builder().ForgetProcess(p.PID)
	if t.gym != nil {
		t.gym.Gone(p.PID)
	}
	t.log.Info("process gone", "pid", p.PID, "service", p.ServiceName())
}

func (t *agent) targetCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.procs)
}

func (t *agent) describeTargets() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var parts []string
	for pid, p := range t.procs {
		parts = append(parts, fmt.Sprintf("%d=%s", pid, p.ServiceName()))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none yet (waiting for Gym servers)"
	}
	return strings.Join(parts, " ")
}

// procEvent handles a lifecycle record: discovery learns of forks, execs and
// exits at once instead of at its next rescan.
func (t *agent) procEvent(w *discover.Watcher, raw []byte) {
	if len(raw) < loader.ProcEventSize {
		return
	}
	var ev loader.ProcEvent
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), loader.ProcEventSize), raw)
	// The Builder first: an exit ends the process's gym.job, which must
	// happen before discovery's goroutine hears of the exit and has the
	// Builder forget the process (removeTarget).
	out := t.spans.Builder().ProcEvent(&ev)
	switch ev.Kind {
	case loader.EvProcFork:
		// The kernel already traces the child with its parent's role; until
		// discovery inspects it, it is known by its parent's identity (a
		// uvicorn worker serves as its parent's server).
		if parent := t.lookup(int(ev.Ppid)); parent != nil && t.lookup(int(ev.Pid)) == nil {
			child := *parent
			child.PID, child.NSPID, child.PPID, child.Worker = int(ev.Pid), 0, parent.PID, true
			t.mu.Lock()
			t.procs[child.PID] = &child
			t.mu.Unlock()
		}
		w.OnFork(int(ev.Pid))
	case loader.EvProcExec:
		w.OnExec(int(ev.Pid))
	case loader.EvProcExit:
		w.OnExit(int(ev.Pid))
		// A target the watcher found is removed, connection state
		// included, by its own goroutine (removeTarget); only processes it
		// does not own (workers, children) are forgotten here, so the map
		// walk runs once per exit and not on this reader for those.
		p := t.lookup(int(ev.Pid))
		if p == nil || p.Worker {
			t.kern.ProcessExited(int(ev.Pid))
		}
		if p != nil && p.Worker {
			t.mu.Lock()
			delete(t.procs, int(ev.Pid))
			t.mu.Unlock()
		}
	}
	t.submit(out)
}
