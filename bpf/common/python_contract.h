// The CPython part of the kernel <-> userspace contract: what userspace
// (internal/python) writes into gt_py_procs for each traced Python process and
// what the kernel leaves in the link map for userspace to read. Included from
// contract.h; the layout rules there apply (fixed sizes, explicit padding).
#pragma once

// Longest thread list walked to find a thread's PyThreadState. A server that
// runs more Python threads than this (thread pools) still works for the
// threads near the head of the list, which is where new threads are added.
#define GT_PY_MAX_THREADS 32
// Interpreters walked (the main one plus a few subinterpreters).
#define GT_PY_MAX_INTERPS 2

// A context identity as the kernel reports it (http_event.py_ctx, link
// fields): the PyContext address in the low 48 bits, its generation in the
// high 16. Context objects are recycled (free list), so the address alone
// would join unrelated tasks; the generation changes at every birth the link
// probe sees.
#define GT_PY_ADDR_MASK 0x0000ffffffffffffULL
#define GT_PY_GEN_SHIFT 48

// Per-process parameters: the gt_py_procs value, one per traced tgid,
// written by internal/python.Inspect. Offsets are in bytes; every read is a plain
// bpf_probe_read_user of the target's memory (no BTF exists for it).
struct gt_py_params {
	__u64 runtime;      // address of _PyRuntime in the target
	__u64 context_type; // address of PyContext_Type (validates context pointers)
	__u64 pidns_dev;    // target's PID namespace (nsfs dev, inode) when it is not
	__u64 pidns_ino;    // the initial one; 0 = thread ids are global ids
	// Types the uvloop write probe tells apart (bpf/python_uvloop.h), from
	// the interpreter's .dynsym; 0 when not found.
	__u64 bytes_type;      // PyBytes_Type
	__u64 bytearray_type;  // PyByteArray_Type
	__u64 memoryview_type; // PyMemoryView_Type
	__u64 list_type;       // PyList_Type
	__u64 tuple_type;      // PyTuple_Type
	__u64 long_type;       // PyLong_Type (GT_PY_F_EAGER: a Task's name counter)
	__u32 version;      // PY_VERSION_HEX, e.g. 0x030b02f0
	__u16 runtime_interp_head; // _PyRuntimeState.interpreters.head
	__u16 interp_next;         // PyInterpreterState.next
	__u16 interp_threads_head; // PyInterpreterState.threads.head
	__u16 tstate_next;         // PyThreadState.next
	__u16 tstate_native_tid;   // PyThreadState.native_thread_id
	__u16 tstate_context;      // PyThreadState.context
	__u16 ctx_prev;            // PyContext.ctx_prev (userspace diagnostics only)
	__u16 ob_type;             // PyObject.ob_type
	// PyThreadState.context_ver: bumped at every context enter and exit
	// (Context.run, a task step), so it tells whether a copy is made in the
	// first callback entered after a read (see gt_py_thread.pend_ver).
	__u16 tstate_context_ver;
	__u16 flags; // enum gt_py_flag
	// With GT_PY_F_TASKS: _PyThreadStateImpl.asyncio_running_task and
	// .asyncio_running_loop, TaskObj.task_context (CPython 3.14+, from
	// _asyncio's AsyncioDebug section): on a thread that runs a loop, a link
	// is trusted only for the running task's context.
	__u16 tstate_running_task;
	__u16 tstate_running_loop;
	__u16 task_context;
	__u16 _pad;
};

enum gt_py_flag {
	// uvloop with deferred writes: its UVStream write probes are attached,
	// and a write's context is the one they recorded for its buffer.
	GT_PY_F_UVWRITE = 1,
	// The link probe sees only the births of asyncio Tasks' contexts (the
	// copy in Task.__init__; uvloop's handles, timers and done callbacks go
	// unprobed, internal/python.AttachTaskProbes). Those run on the loop's
	// thread and may sit at the address of a dead, linked context, so there
	// a context's link counts only while it is the running task's context.
	GT_PY_F_TASKS = 2,
	// With GT_PY_F_TASKS: the link probe sees only the births of Tasks
	// started lazily (in Task.__init__, on its register_task after
	// task_call_step_soon, which an eager start does not reach) and records
	// each link's owner Task. An eager task's link is made in its eager
	// step, at its first context read, from its context's ctx_prev: the
	// creator's context, which _PyContext_Enter saved there (bpf/python.h,
	// gt_py_eager).
	GT_PY_F_EAGER = 4,
};

// Per-thread cache: global tid -> the thread's PyThreadState.
// It also holds the thread's last inbound request read, for event loops
// that read outside the protocol callback (uvloop: libuv reads, then enters
// the server's one shared context to call data_received, which creates the
// request's task): a context born while tstate->context_ver is exactly
// pend_ver + 1, from a context other than the read's, is born in the first
// callback entered after that read, so it is that request's handler.
struct gt_py_thread {
	__u64 tstate;   // 0: the walk found no Python thread state for this tid
	__u64 retry_ns; // with tstate == 0: do not walk again before this time
	__u32 tgid;     // guards against a tid reused by another process
	__s32 pend_fd;  // the connection of the last inbound request read
	__u64 pend_ver; // tstate->context_ver at that read; 0 = none
	__u64 pend_ctx; // the context current at that read (address)
	__u64 pend_conn; // gt_conn.conn_id of the connection
};

// gt_py_wbufs: the uvloop write probe's record of a buffer handed to
// UVStream.write, keyed by the data address the flush passes to write(2).
struct gt_py_wbuf_key {
	__u32 tgid;
	__u32 _pad;
	__u64 addr;
};

struct gt_py_wbuf {
	__u64 ctx;  // id of the writing task's context
	__u64 root; // its root (gt_py_link.root)
	__u64 ns;   // when it was written
};

// gt_py_links value, keyed by PyContext address. Written by the
// PyContext_CopyCurrent return probe at each context's birth: every asyncio
// Task (and every call_soon handle, done callback) gets a copy of the
// context current when it was created, so `parent` is its creator.
// `root` is the request this context works for: a context born directly
// from a spawner context (gt_py_mark_spawner: where a server starts request
// tasks) is a request's handler task and its own root; every context born
// from it or its descendants inherits its root at birth. Computing it at
// birth keeps the answer right after the parent dies and its address is
// reused.
struct gt_py_link {
	__u64 parent;  // id of the context current at the copy; 0 = none
	__u64 root;    // id of the request's handler context; 0 = unknown
	__u64 born_ns; // bpf_ktime_get_ns() of the copy
	__u32 tid;     // thread that made the copy (global id)
	__u16 gen;     // this context's generation (high bits of its id)
	__u16 _pad;
	// The inbound request this context works for, bound in the kernel when
	// the root is born: the conn_id and seq of the server request whose
	// reader (a spawner) created the handler task. Inherited by descendants.
	__u64 req_conn; // 0 = unknown
	__u64 req_seq;
	// With GT_PY_F_EAGER: the asyncio Task whose context this is (0 when
	// the birth was not a Task's). A link counts only while its owner is
	// the running task: an eager task's context is born unseen, usually at
	// the address of a dead Task's context whose link is still here.
	__u64 owner;
	// ... and that Task's serial: the value of its name while that is
	// still the int counter 3.14 gives an unnamed Task (0: another name).
	// Tells a new Task at a dead one's address apart.
	__u64 owner_serial;
};

// gt_py_spawners value: a spawner context and the server connection whose
// request it may start a handler task for.
struct gt_py_spawner {
	__u64 id;      // context id (address | generation)
	__u64 conn_id; // gt_conn.conn_id of the server connection
	__u32 tgid;
	__s32 fd;
};

// The register a call-site link probe reads the new context from: its
// attach cookie (internal/python maps internal/probesite's x86asm registers
// to these). x86-64 only; %rsp never holds it.
enum gt_py_reg {
	GT_PY_REG_AX = 0,
	GT_PY_REG_BX = 1,
	GT_PY_REG_CX = 2,
	GT_PY_REG_DX = 3,
	GT_PY_REG_SI = 4,
	GT_PY_REG_DI = 5,
	GT_PY_REG_BP = 6,
	GT_PY_REG_R8 = 7,
	GT_PY_REG_R9 = 8,
	GT_PY_REG_R10 = 9,
	GT_PY_REG_R11 = 10,
	GT_PY_REG_R12 = 11,
	GT_PY_REG_R13 = 12,
	GT_PY_REG_R14 = 13,
	GT_PY_REG_R15 = 14,
};

// Or'ed into a call-site probe's cookie: the register holds the Task
// Task.__init__ is starting, not a context; the context is at its
// task_context (GT_PY_F_EAGER).
enum gt_py_site_flag {
	GT_PY_SITE_TASK = 0x100,
};

// Outcome of gt_py_context, counted per CPU in gt_py_stats.
enum gt_py_status {
	GT_PY_OK = 0,
	GT_PY_NOT_PYTHON = 1,  // no gt_py_procs entry for the tgid
	GT_PY_NO_THREAD = 2,   // the thread has no PyThreadState (not a Python thread)
	GT_PY_NO_CONTEXT = 3,  // the thread state has no context yet
	GT_PY_BAD_CONTEXT = 4, // tstate->context is not a PyContext (offsets wrong?)
	GT_PY_READ_ERROR = 5,  // reading the target's memory failed
	GT_PY_WALKED = 6,      // (counter only) cache misses that walked the thread list
	GT_PY_LINKED = 7,      // (counter only) links written by the copy probe
	GT_PY_ROOTED = 8,      // (counter only) births that started a request (parent a spawner)
	GT_PY_SPAWNERS = 9,    // (counter only) spawners marked
	GT_PY_ROOTED_READ = 10, // (counter only) births rooted by the read rule (uvloop's data_received)
	GT_PY_UV_WRITES = 11,   // (counter only) uvloop writes recorded by the write probe
	GT_PY_UV_TAKEN = 12,    // (counter only) message starts whose context came from that record
	GT_PY_UV_SKIPPED = 13,  // (counter only) uvloop writes of a buffer type the probe does not read
	GT_PY_LINKED_SITE = 14, // (counter only) of GT_PY_LINKED, those written by a call-site probe
	GT_PY_NOT_TASK = 15,    // (counter only) with GT_PY_F_TASKS, links not trusted: the context was not the running task's
	GT_PY_EAGER = 16,       // (counter only) with GT_PY_F_EAGER, links made in an eager step
	GT_PY_STALE = 17,       // (counter only) with GT_PY_F_EAGER, links dropped: another Task owned them
	GT_PY_HEAD_MORE = 18,   // (counter only) read-rule marks set again at a later read of a request head
	GT_PY_STAT_MAX = 19,
};
