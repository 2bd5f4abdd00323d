// Package python finds what the kernel needs to read a CPython process's
// asyncio context at syscall time (bpf/python.h): the interpreter's ELF, the
// runtime addresses of _PyRuntime and PyContext_Type, the version and the
// structure offsets. It also attaches the context-link probe
// (bpf/python_probes.h) and reads the links it leaves.
//
// Nothing here needs debug symbols: the symbols come from .dynsym, which
// every CPython build exports (stripped Debian binaries included), and the
// layouts from a small table (3.11, 3.12) or from the interpreter's own
// _Py_DebugOffsets (3.13+).
package python

import "fmt"

// Params is the gt_py_procs map value, struct gt_py_params in
// bpf/common/python_contract.h. Field order and sizes must match it; a test
// checks them against the compiled object's BTF.
type Params struct {
	Runtime     uint64 // address of _PyRuntime in the target
	ContextType uint64 // address of PyContext_Type
	PidnsDev    uint64 // target PID namespace; 0 when it is the initial one
	PidnsIno    uint64
	// Types the uvloop write probe tells apart; 0 when not exported.
	BytesType         uint64 // PyBytes_Type
	ByteArrayType     uint64 // PyByteArray_Type
	MemoryViewType    uint64 // PyMemoryView_Type
	ListType          uint64 // PyList_Type
	TupleType         uint64 // PyTuple_Type
	LongType          uint64 // PyLong_Type (a Task's name counter, FlagEager)
	Version           uint32 // PY_VERSION_HEX
	RuntimeInterpHead uint16
	InterpNext        uint16
	InterpThreadsHead uint16
	TstateNext        uint16
	TstateNativeTid   uint16
	TstateContext     uint16
	CtxPrev           uint16
	ObType            uint16
	// PyThreadState.context_ver, which every context enter and exit bumps
	// (the read rule of the copy probe); 0 turns that rule off.
	TstateContextVer uint16
	Flags            uint16 // FlagUVWrite, FlagTasks, FlagEager
	// With FlagTasks: _PyThreadStateImpl.asyncio_running_task and
	// .asyncio_running_loop, TaskObj.task_context (TaskLayout).
	TstateRunningTask uint16
	TstateRunningLoop uint16
	TaskContext       uint16
	Pad               uint16
}

const (
	// FlagUVWrite (GT_PY_F_UVWRITE): uvloop's write probes are attached to
	// the process, so a write's context is the one they recorded for its
	// buffer.
	FlagUVWrite = 1
	// FlagTasks (GT_PY_F_TASKS): the link probe sees only Task births
	// (AttachTaskProbes), so the kernel trusts a context's link only while
	// it is the running task's context.
	FlagTasks = 2
	// FlagEager (GT_PY_F_EAGER): with FlagTasks, the probe sees only lazily
	// started Tasks' births and records each link's owner; an eager task's
	// link is made in its eager step (TaskLayout.Eager).
	FlagEager = 4
)

// Link is the gt_py_links map value (struct gt_py_link), keyed by context
// address: the birth of the context now at that address.
type Link struct {
	Parent CtxID  // the context current when it was copied (its creator)
	Root   CtxID  // the handler context of the request it works for; 0 unknown
	BornNs uint64 // bpf_ktime_get_ns() (CLOCK_MONOTONIC) of the copy
	Tid    uint32
	Gen    uint16
	Pad    uint16
	// The inbound request (conn_id, seq) the root was bound to in the
	// kernel; 0 when unknown (see bpf/common/python_contract.h).
	ReqConn uint64
	ReqSeq  uint64
	// With FlagEager: the Task whose context this is; 0 when the birth was
	// not seen as a Task's. OwnerSerial: its name counter, 0 if unknown.
	Owner       uint64
	OwnerSerial uint64
}

// CtxID is a context identity as the kernel reports it (http_event.py_ctx,
// gt_py_link fields): the PyContext address in the low 48 bits and a
// generation in the high 16, because Context objects are recycled.
type CtxID uint64

const (
	addrMask = 1<<48 - 1
	genShift = 48
)

// Addr is the PyContext object's address in the target process.
func (c CtxID) Addr() uint64 { return uint64(c) & addrMask }

// Gen is the generation the link probe gave the address at its last birth; 0
// when the probe never saw it born.
func (c CtxID) Gen() uint16 { return uint16(uint64(c) >> genShift) }

func (c CtxID) String() string {
	if c == 0 {
		return "ctx(none)"
	}
	return fmt.Sprintf("ctx(%#x/%d)", c.Addr(), c.Gen())
}

// Status is enum gt_py_status: the outcome of one gt_py_context call.
type Status int32

const (
	StatusOK         Status = 0
	StatusNotPython  Status = 1
	StatusNoThread   Status = 2
	StatusNoContext  Status = 3
	StatusBadContext Status = 4
	StatusReadError  Status = 5
	// Counter slots of gt_py_stats that are not call outcomes.
	StatWalked     Status = 6
	StatLinked     Status = 7
	StatRooted     Status = 8
	StatSpawners   Status = 9
	StatRootedRead Status = 10
	StatUVWrites   Status = 11
	StatUVTaken    Status = 12
	StatUVSkipped  Status = 13
	StatLinkedSite Status = 14
	StatNotTask    Status = 15
	StatEager      Status = 16
	StatStale      Status = 17
	StatHeadMore   Status = 18
	statMax        Status = 19 // checked against the C enum by TestStatusContract
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusNotPython:
		return "not_python"
	case StatusNoThread:
		return "no_thread"
	case StatusNoContext:
		return "no_context"
	case StatusBadContext:
		return "bad_context"
	case StatusReadError:
		return "read_error"
	case StatWalked:
		return "walked"
	case StatLinked:
		return "linked"
	case StatRooted:
		return "rooted"
	case StatSpawners:
		return "spawners"
	case StatRootedRead:
		return "rooted_read"
	case StatUVWrites:
		return "uv_writes"
	case StatUVTaken:
		return "uv_taken"
	case StatUVSkipped:
		return "uv_skipped"
	case StatLinkedSite:
		return "linked_site"
	case StatNotTask:
		return "not_task"
	case StatEager:
		return "eager"
	case StatStale:
		return "stale"
	case StatHeadMore:
		return "head_more"
	}
	return fmt.Sprintf("status(%d)", int32(s))
}
