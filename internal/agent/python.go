//go:build linux

package agent

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/probesite"
	"github.com/gymtrace/gymtrace/internal/python"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// pyTargets keeps, per traced Python process, its interpreter layout in the
// kernel (so the syscall programs read its asyncio context) and the context
// link probe, attached only while an enabled group needs in-process parents:
// with those groups off, no uprobe traps at all.
type pyTargets struct {
	t      *agent
	mu     sync.Mutex
	interp map[int]*python.Interpreter
	probes map[int]io.Closer
	// uvloop's write probes, for processes whose uvloop defers writes
	// (docs/python-causality.md); uvWatch: processes still being watched
	// for a late `import uvloop`.
	uvProbes map[int]io.Closer
	uvWatch  map[int]bool
	// tasks: processes whose link probe sees only Task births
	// (python.AttachTaskProbes), with the layout the kernel then checks
	// contexts against. Kept for the process's life: a link probe put
	// back later sees more births, and trusting less stays right.
	tasks map[int]python.TaskLayout
	// watching: each process's one use watcher, which also says whether
	// the process only serves and has its probes and layout off
	// (pureLocked).
	watching map[int]*pureWatch
	want     bool
	closed   bool           // close ran: nothing is attached again
	pending  sync.WaitGroup // adds still inspecting (wait)
}

// needsPy: client spans and sandbox spans take their parent from the
// asyncio context of the request that made them.
func needsPy(m groups.Mask) bool {
	return m.Has(groups.HTTPClient) || m.Has(groups.Sandbox)
}

// noPyProbes: GYMTRACE_PROF_NO_PYPROBES=1 never attaches the link probes
// (the layout still goes to the kernel). Cost experiments only: what the
// probes cost (docs/performance.md); client spans lose their parents.
var noPyProbes = os.Getenv("GYMTRACE_PROF_NO_PYPROBES") == "1"

// wantProbes: the groups need the link probes and no experiment forbids them.
func wantProbes(m groups.Mask) bool {
	return needsPy(m) && !noPyProbes
}

// pySafe: this kernel keeps the link probes whole (loader.Preemption): where
// it preempts them and cannot be told not to, a probe could build a link from
// another run's scratch, a wrong parent; without them calls stay unattributed.
// The kernel may also lack what the probes need (loader.FeatureAsyncioParents:
// attach cookies, 5.15+): then they are never attached.
func pySafe(t *agent) bool {
	return t == nil || t.kern == nil || pyOff(t) == ""
}

func pyOff(t *agent) string {
	if why := t.kern.FeatureOff(loader.FeatureAsyncioParents); why != "" {
		return why + ": client calls get a parent only where userspace proves it (one request in flight), else none"
	}
	return t.kern.Preemption().PythonUnsafe()
}

func newPyTargets(t *agent, m groups.Mask) *pyTargets {
	if !pySafe(t) && t.log != nil {
		t.log.Warn("asyncio parents are off on this kernel", "why", pyOff(t))
	}
	return &pyTargets{t: t, interp: map[int]*python.Interpreter{}, probes: map[int]io.Closer{},
		uvProbes: map[int]io.Closer{}, uvWatch: map[int]bool{}, watching: map[int]*pureWatch{},
		tasks: map[int]python.TaskLayout{}, want: wantProbes(m) && pySafe(t)}
}

// paramsLocked is pid's gt_py_procs value: its interpreter's layout, and
// what its probes need the kernel to know (uvloop's write records, task-only
// links). Under p.mu.
func (p *pyTargets) paramsLocked(pid int, in *python.Interpreter) python.Params {
	params := in.Params
	if _, ok := p.uvProbes[pid]; ok {
		params.Flags |= python.FlagUVWrite
	}
	if l, ok := p.tasks[pid]; ok {
		l.Apply(&params)
	}
	return params
}

// add inspects a new target in the background: a process that has only just
// exec'd may not have initialised its runtime yet, so it is retried briefly.
func (p *pyTargets) add(pid int) {
	p.pending.Add(1)
	go func() {
		defer p.pending.Done()
		var in *python.Interpreter
		var err error
		// A server found at its exec is inspected within ~20 ms of its
		// runtime coming up, well before it has imported its web stack
		// and serves; a slow start backs off, up to about 8 s in all.
		start := time.Now()
		for delay := 20 * time.Millisecond; time.Since(start) < 8*time.Second; {
			in, err = python.InspectInterpreter(pid)
			if !errors.Is(err, python.ErrNotReady) {
				break
			}
			time.Sleep(delay)
			if time.Since(start) > 2*time.Second && delay < 500*time.Millisecond {
				delay *= 2
			}
		}
		if err != nil {
			if !errors.Is(err, python.ErrNotPython) {
				p.t.log.Warn("asyncio causality off for this process: its interpreter could not be read", "pid", pid, "err", err)
			}
			return
		}
		// The layout goes to the kernel first, under the lock only for
		// that: the probes (uprobe attaches, reading uvloop's module: half a
		// second on a loaded machine) are set up after, without it, so one
		// process's never holds up another's first requests' parents.
		p.mu.Lock()
		if p.closed || p.t.lookup(pid) == nil {
			p.mu.Unlock()
			return // gymtrace is stopping, or the process is gone meanwhile
		}
		if err := p.t.kern.SetPython(pid, p.paramsLocked(pid, in)); err != nil {
			p.mu.Unlock()
			p.t.log.Warn("asyncio causality off for this process", "pid", pid, "err", err)
			return
		}
		p.interp[pid] = in
		want := p.want
		p.mu.Unlock()
		p.t.log.Debug("python interpreter found", "pid", pid, "version", in.Version, "elf", in.ELFPath)
		if want {
			p.attach(pid, in)
		}
	}()
}

// attach attaches pid's context link probe, then looks for uvloop; the slow
// parts run without the lock.
func (p *pyTargets) attach(pid int, in *python.Interpreter) {
	p.mu.Lock()
	_, has := p.probes[pid]
	skip := has || p.pureLocked(pid) || !p.want
	p.mu.Unlock()
	if skip {
		return
	}
	c, err := in.AttachProbes(p.t.kern.PyCopyProgram())
	if err != nil {
		p.t.log.Warn("asyncio child-task links off for this process (calls from child tasks stay unattributed)", "pid", pid, "err", err)
		return
	}
	p.mu.Lock()
	if _, dup := p.probes[pid]; dup || p.interp[pid] != in || !p.want || p.pureLocked(pid) {
		p.mu.Unlock()
		_ = c.Close() // set up meanwhile, or no longer wanted
		return
	}
	p.probes[pid] = c
	w := &pureWatch{}
	p.watching[pid] = w
	p.mu.Unlock()
	go p.watchUse(pid, in, w)
	p.uvloop(pid, in)
}

// wait blocks until every add so far has set its process up (layout in the
// kernel, probes attached) or given up, or until d has passed: gymtrace says
// "attached" only once the targets it was given are traced whole, so their
// first requests already get parents.
func (p *pyTargets) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { p.pending.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// uvloop looks for uvloop in the process now; one not imported yet is
// watched for (uvicorn imports it when it sets its loop up, just before it
// serves), quickly at first.
func (p *pyTargets) uvloop(pid int, in *python.Interpreter) {
	p.mu.Lock()
	if _, ok := p.uvProbes[pid]; ok || p.uvWatch[pid] || p.closed {
		p.mu.Unlock()
		return
	}
	p.uvWatch[pid] = true
	p.mu.Unlock()
	if !p.tryUVloop(pid, in) {
		go p.watchUVloop(pid, in)
		return
	}
	p.mu.Lock()
	delete(p.uvWatch, pid)
	p.mu.Unlock()
	// uvloop was there at attach (gymtrace started beside a running
	// server): the call-site probes go on before gymtrace says "attached".
	// Until they do, births are linked by the return probe with no owner,
	// and under uvloop on 3.14 no eager Task a Task born then starts can be
	// linked: those calls would go unattributed.
	p.sites(pid, in)
}

func (p *pyTargets) watchUVloop(pid int, in *python.Interpreter) {
	defer func() {
		p.mu.Lock()
		delete(p.uvWatch, pid)
		p.mu.Unlock()
	}()
	start := time.Now()
	serving := false
	for time.Since(start) < 2*time.Minute {
		d := 50 * time.Millisecond
		if time.Since(start) > 5*time.Second {
			d = time.Second
		}
		time.Sleep(d)
		p.mu.Lock()
		stop := !p.uvWatch[pid] || p.interp[pid] != in || !p.want || p.pureLocked(pid)
		p.mu.Unlock()
		if stop {
			return
		}
		if p.tryUVloop(pid, in) {
			p.sites(pid, in)
			return
		}
		if !serving && p.t.spans.Builder().Counts(pid).Answered > 0 {
			// It answers requests without uvloop: its loop is the default
			// one (uvicorn imports uvloop as it sets the loop up, before
			// it serves), so the call-site probes go on now rather than
			// after the watch, which would leave two kernel entries a copy
			// for two minutes. The watch goes on for a late uvloop: its
			// write probes then go on, and its module sends the copies
			// back to the return probe (watchSites).
			serving = true
			p.sites(pid, in)
		}
	}
	if !serving {
		p.sites(pid, in) // the default loop: its modules are loaded by now
	}
}

// tryUVloop reports whether the process's loop question is settled: uvloop
// found (and its write probes attached where its writes are deferred), or a
// uvloop this package cannot probe (logged once). Reading the module and
// attaching run without the lock; the result is kept only if the process is
// still the one inspected.
func (p *pyTargets) tryUVloop(pid int, in *python.Interpreter) bool {
	m, err := python.FindUVloop(pid)
	if m == nil && err == nil {
		return false // not (yet) imported
	}
	if err != nil && m == nil {
		return false // the process is going away, or its maps are unreadable for now
	}
	if err != nil {
		p.t.log.Warn("uvloop build not recognised: calls made while its writes are deferred stay unattributed",
			"pid", pid, "uvloop", m.Version, "module", m.Path, "err", err)
		p.t.spans.Builder().SetNoContext(pid, "uvloop_unrecognized")
		return true
	}
	if !m.Deferred() {
		p.t.log.Debug("uvloop writes at once: no write probe needed", "pid", pid, "uvloop", m.Version)
		return true
	}
	c, err := m.AttachWriteProbes(pid, p.t.kern.PyUVWriteProgram())
	if err != nil {
		p.t.log.Warn("uvloop write probes not attached: calls made while its writes are deferred stay unattributed",
			"pid", pid, "uvloop", m.Version, "module", m.Path, "err", err)
		p.t.spans.Builder().SetNoContext(pid, "uvloop_unrecognized")
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.uvProbes[pid]; dup || p.interp[pid] != in || !p.want || p.pureLocked(pid) {
		_ = c.Close()
		return true
	}
	p.uvProbes[pid] = c
	if err := p.t.kern.SetPython(pid, p.paramsLocked(pid, in)); err != nil {
		delete(p.uvProbes, pid)
		_ = c.Close()
		p.t.log.Warn("uvloop write probes off for this process", "pid", pid, "err", err)
		return true
	}
	p.t.log.Debug("uvloop write probes attached", "pid", pid, "uvloop", m.Version, "sites", len(m.Sites))
	return true
}

// Pure servers need none of the Python machinery: only a process's outbound
// calls (and sandbox CLIs) take their parent from the asyncio context, and a
// resources server, or a model server with no upstream, makes none. Once a
// process has answered pureAnswered requests and made no call, for
// pureGrace, its probes come off and its layout leaves the kernel: no
// context-copy trap, no uvloop write trap and no context read at its
// message starts (measured: about a third of gymtrace's cost per request
// on the bench's stack, docs/performance.md). The first outbound call puts
// them back; that call and the few racing it are unattributed, never wrong.
//
// Answered, not served: an agent reads a burst of /run requests before its
// first calls are made (measured: a two-node run at c=64 lost every parent
// to a rule on requests read), but it answers none of them without calling
// out. The grace covers a server whose calls follow its answers.
const (
	pureAnswered = 32
	pureGrace    = time.Second
)

// pureWatch decides, from a process's request counts over time, when its
// probes come off and when they go back on.
type pureWatch struct {
	since time.Time // when the counts last started to say "pure"
	off   bool      // probes and layout are off
}

type pureStep int

const (
	pureKeep pureStep = iota
	pureDetach
	pureReattach
)

func (w *pureWatch) step(n spans.ReqCounts, now time.Time) pureStep {
	pure := n.Made == 0 && n.Answered >= pureAnswered
	if !pure {
		w.since = time.Time{}
	} else if w.since.IsZero() {
		w.since = now
	}
	switch {
	case !w.off && pure && now.Sub(w.since) >= pureGrace:
		w.off = true
		return pureDetach
	case w.off && n.Made > 0:
		w.off = false
		w.since = time.Time{}
		return pureReattach
	}
	return pureKeep
}

// pureLocked: pid only serves, its probes and layout are off. Under p.mu.
func (p *pyTargets) pureLocked(pid int) bool {
	w := p.watching[pid]
	return w != nil && w.off
}

// watchUse runs w over pid while it is traced with the probes wanted and w
// is its watcher.
func (p *pyTargets) watchUse(pid int, in *python.Interpreter, w *pureWatch) {
	for {
		time.Sleep(100 * time.Millisecond)
		n := p.t.spans.Builder().Counts(pid)
		p.mu.Lock()
		if p.interp[pid] != in || !p.want || p.watching[pid] != w {
			p.mu.Unlock()
			return
		}
		switch w.step(n, time.Now()) {
		case pureDetach:
			p.detachUVLocked(pid) // the watcher says pure now: no layout back
			if c, ok := p.probes[pid]; ok {
				_ = c.Close()
				delete(p.probes, pid)
			}
			_ = p.t.kern.SetPython(pid, nil)
			p.mu.Unlock()
			p.t.log.Info("python probes off: the process only serves", "pid", pid, "answered", n.Answered)
			continue
		case pureReattach:
			delete(p.watching, pid)
			err := p.t.kern.SetPython(pid, p.paramsLocked(pid, in))
			p.mu.Unlock()
			if err != nil {
				p.t.log.Warn("asyncio causality off for this process", "pid", pid, "err", err)
				return
			}
			p.t.log.Info("python probes back: the process calls out", "pid", pid, "made", n.Made)
			p.attach(pid, in) // starts a new watcher
			return
		}
		p.mu.Unlock()
	}
}

func (p *pyTargets) detachUVLocked(pid int) {
	delete(p.uvWatch, pid)
	if c, ok := p.uvProbes[pid]; ok {
		_ = c.Close()
		delete(p.uvProbes, pid)
		if in, ok := p.interp[pid]; ok && !p.pureLocked(pid) {
			_ = p.t.kern.SetPython(pid, p.paramsLocked(pid, in))
		}
	}
}

func (p *pyTargets) remove(pid int) {
	for _, c := range p.take(pid) {
		_ = c.Close()
	}
}

// take forgets pid and returns its probes, still attached, for the caller
// to close (tls.Attacher.Take says why).
func (p *pyTargets) take(pid int) []io.Closer {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []io.Closer
	delete(p.uvWatch, pid)
	delete(p.watching, pid)
	delete(p.tasks, pid)
	if c, ok := p.uvProbes[pid]; ok {
		out = append(out, c)
		delete(p.uvProbes, pid)
	}
	if c, ok := p.probes[pid]; ok {
		out = append(out, c)
		delete(p.probes, pid)
	}
	if _, ok := p.interp[pid]; ok {
		delete(p.interp, pid)
		_ = p.t.kern.SetPython(pid, nil)
	}
	return out
}

// setMask attaches or detaches the link probes as the groups change.
func (p *pyTargets) setMask(m groups.Mask) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.want = wantProbes(m) && pySafe(p.t)
	todo := map[int]*python.Interpreter{}
	for pid, in := range p.interp {
		if p.want {
			if !p.pureLocked(pid) {
				todo[pid] = in
			}
			continue
		}
		if p.pureLocked(pid) {
			// Back to the layout every process has without the probes.
			_ = p.t.kern.SetPython(pid, p.paramsLocked(pid, in))
		}
		delete(p.watching, pid)
		if c, ok := p.probes[pid]; ok {
			p.detachUVLocked(pid)
			_ = c.Close()
			delete(p.probes, pid)
		}
	}
	p.mu.Unlock()
	for pid, in := range todo {
		p.attach(pid, in) // skips a process that has its probe already
	}
}

// close detaches every process's probes, all at once (probesite.CloseAll),
// and stops attaching: a process still being set up, or a watcher that
// would put probes back, attaches nothing after. Calling it again is
// harmless.
func (p *pyTargets) close() {
	p.mu.Lock()
	p.closed, p.want = true, false
	var cs []io.Closer
	for pid, c := range p.uvProbes {
		cs = append(cs, c)
		delete(p.uvProbes, pid)
	}
	for pid, c := range p.probes {
		cs = append(cs, c)
		delete(p.probes, pid)
	}
	clear(p.uvWatch)
	clear(p.watching)
	p.mu.Unlock()
	if err := probesite.CloseAll(cs); err != nil {
		p.t.log.Debug("detaching Python probes", "err", err)
	}
}
