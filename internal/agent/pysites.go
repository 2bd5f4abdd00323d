//go:build linux

package agent

import (
	"io"
	"time"

	"github.com/gymtrace/gymtrace/internal/python"
)

// siteProbes are a process's call-site link probes (python.AttachSiteProbes),
// told apart from the return probe they replace.
type siteProbes struct{ io.Closer }

// How often a process with call-site probes is checked for a module loaded
// since that also copies contexts.
const sitesRecheck = 2 * time.Second

// sites moves pid's link probes from the return probe on
// PyContext_CopyCurrent to its call sites, one kernel entry a context copy
// instead of two (docs/python-causality.md, "Call-site probes"); under
// uvloop on CPython 3.14, to Task.__init__'s copy only, which halves the
// copies probed ("Task-only links"). It runs once the modules that copy
// contexts are loaded: when the process's loop is known (uvloop, imported
// last, when uvicorn sets its loop up; or the watch for it given up). Where
// the sites cannot all be covered the return probe stays, as it does on any
// machine but x86-64.
func (p *pyTargets) sites(pid int, in *python.Interpreter) {
	if !python.SiteProbesWanted() {
		return
	}
	p.mu.Lock()
	old, ok := p.probes[pid]
	_, already := old.(*siteProbes)
	p.mu.Unlock()
	if !ok || already {
		return
	}
	site, ret := p.t.kern.PyCopySiteProgram(), p.t.kern.PyCopyProgram()
	c, layout, key, err := in.AttachTaskProbes(site, ret)
	tasks := err == nil
	if !tasks {
		p.t.log.Debug("asyncio links on every context copy", "pid", pid, "why", err)
		c, key, err = in.AttachSiteProbes(site, ret)
	}
	if err != nil {
		p.t.log.Info("asyncio link probes stay on PyContext_CopyCurrent's return (two kernel entries a context copy, not one)",
			"pid", pid, "why", err)
		return
	}
	sp := &siteProbes{c}
	p.mu.Lock()
	if p.probes[pid] != old || p.interp[pid] != in || !p.want || p.pureLocked(pid) {
		p.mu.Unlock()
		_ = c.Close() // replaced or removed meanwhile
		return
	}
	if tasks {
		// The kernel must distrust unseen births before the probe that
		// sees them all comes off.
		p.tasks[pid] = layout
		if err := p.t.kern.SetPython(pid, p.paramsLocked(pid, in)); err != nil {
			delete(p.tasks, pid)
			p.mu.Unlock()
			_ = c.Close()
			p.t.log.Warn("asyncio link probes stay on PyContext_CopyCurrent's return", "pid", pid, "err", err)
			return
		}
	}
	p.probes[pid] = sp
	p.mu.Unlock()
	// Both sets were on for the time between: a copy then is linked twice,
	// the second time with a new generation before any syscall could see
	// the first.
	_ = old.Close()
	if tasks && layout.EagerErr != nil {
		p.t.log.Info("asyncio link probe on every Task birth, eager ones included (a trap each)", "pid", pid, "why", layout.EagerErr)
	}
	p.t.log.Debug("asyncio link probes on the call sites", "pid", pid, "tasks_only", tasks, "lazy_tasks_only", layout.Eager)
	go p.watchSites(pid, in, sp, key)
}

// watchSites puts the return probe back when pid maps a new module that
// copies contexts: its calls have no site probe. Copies it makes before the
// next check are not linked (their calls go unattributed, never wrong).
func (p *pyTargets) watchSites(pid int, in *python.Interpreter, sp *siteProbes, key string) {
	for {
		time.Sleep(sitesRecheck)
		p.mu.Lock()
		cur := p.probes[pid]
		p.mu.Unlock()
		if cur != sp {
			return // detached, replaced, or the process is gone
		}
		k, err := python.CopyModulesKey(pid)
		if err != nil || k == key {
			continue
		}
		c, err := in.AttachProbes(p.t.kern.PyCopyProgram())
		p.mu.Lock()
		if err != nil || p.probes[pid] != sp {
			p.mu.Unlock()
			if c != nil {
				_ = c.Close()
			}
			if err != nil {
				p.t.log.Warn("a module that copies contexts was loaded and the return probe could not be put back: its copies stay unlinked",
					"pid", pid, "err", err)
			}
			return
		}
		p.probes[pid] = c
		// The return probe links every copy, with no owner: the kernel
		// must not ask a running Task's link for one any more (FlagEager).
		// FlagTasks stays: distrusting unseen births is still right.
		if l, ok := p.tasks[pid]; ok && l.Eager {
			l.Eager = false
			p.tasks[pid] = l
			if err := p.t.kern.SetPython(pid, p.paramsLocked(pid, in)); err != nil {
				p.t.log.Warn("asyncio links of eager tasks stay off after the return probe went back", "pid", pid, "err", err)
			}
		}
		p.mu.Unlock()
		_ = sp.Close()
		p.t.log.Info("a module that copies asyncio contexts was loaded after the call-site probes went on: back to the return probe",
			"pid", pid)
		return
	}
}
