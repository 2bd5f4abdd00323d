//go:build linux

package main

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/python"
)

// pyTargets keeps, per traced Python process, its interpreter layout in the
// kernel (so the syscall programs read its asyncio context) and the context
// link probe, attached only while an enabled group needs in-process parents:
// with those groups off, no uprobe traps at all.
type pyTargets struct {
	t      *tracer
	mu     sync.Mutex
	interp map[int]*python.Interpreter
	probes map[int]io.Closer
	want   bool
}

// needsPy: client spans and sandbox spans take their parent from the
// asyncio context of the request that made them.
func needsPy(m groups.Mask) bool {
	return m.Has(groups.HTTPClient) || m.Has(groups.Sandbox)
}

func newPyTargets(t *tracer, m groups.Mask) *pyTargets {
	return &pyTargets{t: t, interp: map[int]*python.Interpreter{}, probes: map[int]io.Closer{}, want: needsPy(m)}
}

// add inspects a new target in the background: a process that has only just
// exec'd may not have initialised its runtime yet, so it is retried briefly.
func (p *pyTargets) add(pid int) {
	go func() {
		var in *python.Interpreter
		var err error
		for delay := 50 * time.Millisecond; delay < 5*time.Second; delay *= 2 {
			in, err = python.InspectInterpreter(pid)
			if !errors.Is(err, python.ErrNotReady) {
				break
			}
			time.Sleep(delay)
		}
		if err != nil {
			if !errors.Is(err, python.ErrNotPython) {
				p.t.log.Warn("asyncio causality off for this process: its interpreter could not be read", "pid", pid, "err", err)
			}
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.t.lookup(pid) == nil {
			return // gone meanwhile
		}
		if err := p.t.kern.SetPython(pid, in.Params); err != nil {
			p.t.log.Warn("asyncio causality off for this process", "pid", pid, "err", err)
			return
		}
		p.interp[pid] = in
		if p.want {
			p.attachLocked(pid, in)
		}
		p.t.log.Debug("python interpreter found", "pid", pid, "version", in.Version, "elf", in.ELFPath)
	}()
}

func (p *pyTargets) attachLocked(pid int, in *python.Interpreter) {
	if _, ok := p.probes[pid]; ok {
		return
	}
	c, err := in.AttachProbes(p.t.kern.PyCopyProgram())
	if err != nil {
		p.t.log.Warn("asyncio child-task links off for this process (calls from child tasks stay unattributed)", "pid", pid, "err", err)
		return
	}
	p.probes[pid] = c
}

func (p *pyTargets) remove(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.probes[pid]; ok {
		_ = c.Close()
		delete(p.probes, pid)
	}
	if _, ok := p.interp[pid]; ok {
		delete(p.interp, pid)
		_ = p.t.kern.SetPython(pid, nil)
	}
}

// setMask attaches or detaches the link probes as the groups change.
func (p *pyTargets) setMask(m groups.Mask) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want = needsPy(m)
	for pid, in := range p.interp {
		if p.want {
			p.attachLocked(pid, in)
		} else if c, ok := p.probes[pid]; ok {
			_ = c.Close()
			delete(p.probes, pid)
		}
	}
}

func (p *pyTargets) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pid, c := range p.probes {
		_ = c.Close()
		delete(p.probes, pid)
	}
}
