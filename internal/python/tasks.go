package python

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Task-only links (CPython 3.14+ under uvloop, x86-64). Of the context
// copies a Gym agent makes, only those that become an asyncio Task's
// context can ever carry a call: a handle's, a timer's or a done
// callback's context runs one callback and is gone. On the bench's stack
// half the copies are Tasks' (14 of 28 a rollout), so probing only
// Task.__init__'s copy halves the traps. The other copies then happen
// unseen, at addresses a dead, linked context may have left in gt_py_links,
// so the kernel trusts a link only for the running task's context
// on a thread that runs a loop (GT_PY_F_TASKS, bpf/python.h
// gt_py_trusted): CPython 3.14 keeps the running loop and task in the
// thread state and describes where, and where a Task keeps its context, in
// the _asyncio module's AsyncioDebug section (for `python -m asyncio ps`). docs/python-causality.md, "Task-only links".

// TaskLayout is where CPython keeps the running task and a Task's context.
type TaskLayout struct {
	RunningTask uint16 // _PyThreadStateImpl.asyncio_running_task
	RunningLoop uint16 // _PyThreadStateImpl.asyncio_running_loop
	TaskContext uint16 // TaskObj.task_context
	// Eager: the probe sits on Task.__init__'s register_task after
	// task_call_step_soon, which eager starts skip (FlagEager).
	Eager bool
	// EagerErr: why it could not (the probe stays on the copy).
	EagerErr error
}

// Apply sets params up for task-only links: FlagTasks (and FlagEager) and
// the layout.
func (l TaskLayout) Apply(params *Params) {
	params.Flags |= FlagTasks
	if l.Eager {
		params.Flags |= FlagEager
	}
	params.TstateRunningTask, params.TstateRunningLoop, params.TaskContext = l.RunningTask, l.RunningLoop, l.TaskContext
}

// asyncioDebugSection holds struct _Py_AsyncioModuleDebugOffsets (3.14):
// asyncio_task_object {size, task_name, task_awaited_by, task_is_task,
// task_awaited_by_is_set, task_coro, task_node}, asyncio_interpreter_state
// {size, asyncio_tasks_head}, asyncio_thread_state {size,
// asyncio_running_loop, asyncio_running_task, asyncio_tasks_head}.
const asyncioDebugSection = ".AsyncioDebug"

// ErrNoTaskLayout: the file has no AsyncioDebug section (CPython before
// 3.14, or a module other than _asyncio).
var ErrNoTaskLayout = errors.New("no AsyncioDebug section")

// readTaskLayout reads the task layout from f, the ELF that holds the
// _asyncio module (its extension module, or the interpreter that has it
// built in).
func readTaskLayout(f *elf.File) (TaskLayout, error) {
	sec := f.Section(asyncioDebugSection)
	if sec == nil {
		return TaskLayout{}, ErrNoTaskLayout
	}
	b, err := sec.Data()
	if err != nil {
		return TaskLayout{}, fmt.Errorf("reading %s: %w", asyncioDebugSection, err)
	}
	if len(b) < 13*8 {
		return TaskLayout{}, fmt.Errorf("%s is %d bytes, want at least 104", asyncioDebugSection, len(b))
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	taskSize, taskName, taskCoro, taskNode := u(0), u(1), u(5), u(6)
	tsSize, runningLoop, runningTask := u(9), u(10), u(11)
	// TaskObj ends with task_fut_waiter, task_coro, task_name, task_context,
	// task_node (3.14's _asynciomodule.c): the context is the pointer right
	// before the node. The section does not name it, so the neighbours it
	// does name must be where that layout puts them.
	ctx := taskNode - 8
	if taskName+8 != ctx || taskCoro+16 != ctx || taskNode+16 > taskSize || ctx > 0xffff {
		return TaskLayout{}, fmt.Errorf("%s: TaskObj layout not recognised (coro %d, name %d, node %d, size %d)",
			asyncioDebugSection, taskCoro, taskName, taskNode, taskSize)
	}
	for _, off := range []uint64{runningTask, runningLoop} {
		if off == 0 || off+8 > tsSize || off > 0xffff {
			return TaskLayout{}, fmt.Errorf("%s: asyncio_running_task at %d, _loop at %d of a %d-byte thread state",
				asyncioDebugSection, runningTask, runningLoop, tsSize)
		}
	}
	return TaskLayout{RunningTask: uint16(runningTask), RunningLoop: uint16(runningLoop), TaskContext: uint16(ctx)}, nil
}

// taskSites keeps the sites of c where the copy's result is stored into a
// Task's context field: Task.__init__'s copy. _asyncio's other copy
// (Future.add_done_callback without a context) is left out.
func taskSites(c *probesite.Calls, l TaskLayout) *probesite.Calls {
	out := &probesite.Calls{Returns: c.Returns}
	for _, s := range c.Sites {
		if slices.Contains(s.Stores, int64(l.TaskContext)) {
			out.Sites = append(out.Sites, s)
		}
	}
	return out
}

// tasksOff: GYMTRACE_PY_TASKS=0 probes every copy at its call site instead
// (cost comparisons; a fallback should task-only links misbehave).
var tasksOff = os.Getenv("GYMTRACE_PY_TASKS") == "0"

// eagerOff: GYMTRACE_PY_EAGER=0 keeps the probe on Task.__init__'s copy,
// which eager starts reach too (cost comparisons; a fallback).
var eagerOff = os.Getenv("GYMTRACE_PY_EAGER") == "0"

// lazySite moves the Task probe from Task.__init__'s copy of the context
// (copy, in f, the _asyncio module) to the place only lazily started Tasks
// reach: the inlined register_task after task_call_step_soon, a call of
// _PyThreadState_GetCurrent followed by the stores into the Task's
// task_node, the field after task_context (3.14's _asynciomodule.c). An
// eager start registers the Task in task_eager_start instead, which GCC
// keeps out of Task.__init__'s function (sid's build: in its cold part).
// There must be exactly one such call in the copy's function, after the
// copy.
func lazySite(f *elf.File, copy probesite.CallSite, l TaskLayout) (probesite.CallSite, error) {
	sites, err := probesite.FindHolderCalls(f, "_PyThreadState_GetCurrent", copy.Call, int64(l.TaskContext)+8)
	if err != nil {
		return probesite.CallSite{}, err
	}
	if len(sites) != 1 {
		return probesite.CallSite{}, fmt.Errorf("%d registrations of a Task after the thread-state lookup in Task.__init__ (the copy at %#x), want 1",
			len(sites), copy.Call)
	}
	return sites[0], nil
}

// AttachTaskProbes attaches the link probe to Task.__init__'s copy of the
// context only, or where it can, past eager starts, to its register_task
// (lazySite, TaskLayout.Eager; plus the return probes of contextvars.copy_context and
// contextvars.Context(), whose results a Task may be given), filtered to
// the process, and returns the layout the kernel then needs (Params,
// FlagTasks) and the key of the modules covered (see AttachSiteProbes).
// It fails, attaching nothing, unless the process is CPython 3.14 on x86-64
// with uvloop, and every module that copies contexts is the interpreter,
// _asyncio or uvloop: another module's copies might be handed to a Task.
// The caller must set FlagTasks with the layout before it detaches the
// probes these replace.
func (in *Interpreter) AttachTaskProbes(site, ret *ebpf.Program) (io.Closer, TaskLayout, string, error) {
	var l TaskLayout
	fail := func(err error) (io.Closer, TaskLayout, string, error) {
		return nil, TaskLayout{}, "", fmt.Errorf("task-only links: %w", err)
	}
	switch {
	case tasksOff:
		return fail(errors.New("turned off (GYMTRACE_PY_TASKS=0)"))
	case !SiteProbesWanted():
		return fail(errors.New("call-site probes are off or not x86-64"))
	case in.Version.Major != 3 || in.Version.Minor != 14:
		return fail(fmt.Errorf("CPython %s: the running task's layout is read for 3.14 only", in.Version))
	case site == nil || ret == nil:
		return fail(errors.New("a program is missing"))
	}
	mods, key, err := copyModules(in.PID)
	if err != nil {
		return fail(err)
	}
	if !slices.ContainsFunc(mods, func(m copyModule) bool { return IsUVloopModule(m.path) }) {
		return fail(errors.New("the process does not run uvloop (the default loop keeps every copy)"))
	}
	var plan []planned
	found := false
	for _, m := range mods {
		if IsUVloopModule(m.path) {
			continue // handles, timers, transports: no Task's context
		}
		fc, err := readCalls(m.open, m.id)
		if err == nil {
			err = fc.err
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", m.path, err))
		}
		switch c := fc.calls; {
		case fc.layoutErr == nil:
			if found {
				return fail(fmt.Errorf("%s: a second module with %s", m.path, asyncioDebugSection))
			}
			found, l = true, fc.layout
			t := taskSites(c, l)
			if len(t.Sites) != 1 {
				return fail(fmt.Errorf("%s: %d of its %d copies are stored as a Task's context (offset %d), want 1",
					m.path, len(t.Sites), len(c.Sites), l.TaskContext))
			}
			if !eagerOff {
				if fc.lazyErr == nil {
					t.Sites[0], l.Eager = fc.lazy, true
				} else {
					l.EagerErr = fmt.Errorf("%s: %w", m.path, fc.lazyErr)
				}
			}
			plan = append(plan, planned{m, t})
		case !errors.Is(fc.layoutErr, ErrNoTaskLayout):
			return fail(fmt.Errorf("%s: %w", m.path, fc.layoutErr))
		case m.path == in.MappedPath && len(c.Sites) == 0:
			plan = append(plan, planned{m, c}) // copy_context's return probe
		default:
			return fail(fmt.Errorf("%s also copies contexts (%d call sites)", m.path, len(c.Sites)))
		}
	}
	if !found {
		return fail(errors.New("no _asyncio module with an AsyncioDebug section is loaded"))
	}
	p, err := in.attachPlan(plan, site, ret)
	if err != nil {
		return fail(err)
	}
	return p, l, key, nil
}
