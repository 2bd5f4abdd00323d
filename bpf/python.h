// CPython asyncio context at syscall time.
//
// A socket syscall in CPython runs with the GIL released, so no "current
// thread state" global can be trusted there (3.11 clears
// _PyRuntime.gilstate.tstate_current; 3.12+ keep it in a thread-local the
// kernel cannot find). Every thread's PyThreadState is still on the list
// _PyRuntime -> interpreters.head -> threads.head -> next, tagged with the
// thread's native id, and its `context` field is the contextvars.Context of
// the asyncio Task (or loop callback) that made the call: asyncio enters the
// task's Context around every step, and a syscall made by the step runs
// inside it. So the context identity is read from plain user memory, with the
// offsets userspace found for this interpreter (internal/python.Inspect).
//
// With the link probe attached (bpf/python_probes.h) every context also has
// a root: the handler context of the inbound request it works for, so an
// outbound call's record names its request directly (see gt_py_link).
//
// Cost (measured, docs/python-causality.md): 170-220 ns a call on a cache
// hit (3 map lookups, 3 user reads); the thread list is walked only on a
// thread's first call or after its thread state changed.
#pragma once

#include "common/python_contract.h"

// Per traced Python process: where its runtime lives and its layout.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); // tgid (initial PID namespace)
	__type(value, struct gt_py_params);
} gt_py_procs SEC(".maps");

// tid -> PyThreadState. LRU: exited threads age out without bookkeeping.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tid (initial PID namespace)
	__type(value, struct gt_py_thread);
} gt_py_threads SEC(".maps");

// PyContext address -> its birth: generation, creator and request root.
// Written by the copy probe, read at every syscall. Keyed by address, so a
// recycled Context updates its entry in place (no LRU churn); sized for the
// live contexts of all traced processes plus recently dead ones.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct gt_py_link);
} gt_py_links SEC(".maps");

// Spawner contexts: PyContext address -> its id, for the contexts from which
// a server may start a request's handler task: the protocol callback that
// read the request, and the step that finished the previous response on the
// same connection (see gt_py_mark_spawner). A context born directly from
// one of them is a request's handler task: the root of that request.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct gt_py_spawner);
} gt_py_spawners SEC(".maps");

// uvloop: buffer data address -> the context of the task that handed it to
// UVStream.write (bpf/python_uvloop.h). Only buffers of deferred writes wait
// here, from the task's step to the loop's check phase; taken at the syscall.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gt_py_wbuf_key);
	__type(value, struct gt_py_wbuf);
} gt_py_wbufs SEC(".maps");

// A deferred write leaves the loop within one iteration; a record is
// trusted for this long.
#define GT_PY_WBUF_MAX_AGE_NS (10ULL * 1000 * 1000 * 1000)

// Per-CPU room for the map keys and values built on the syscall path: the
// syscall programs' deepest call chain is close to the 512-byte stack limit.
struct gt_py_scratch {
	struct gt_py_wbuf_key wk;
	struct gt_py_spawner sp;
	struct gt_py_link nl; // gt_py_eager's new link
	__u64 ctx, root; // gt_py_context_w's outputs on the syscall path
	// ... and the request the context works for, from its own link (the
	// root's, inherited at birth: see gt_py_link), when cause_ok.
	__u64 cause_conn, cause_seq;
	__u8 cause_ok;
	struct gt_py_thread tv; // gt_py_tstate_th's new cache entry
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_py_scratch);
} gt_py_scratch SEC(".maps");

static __always_inline struct gt_py_scratch *gt_py_scr(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_py_scratch, &zero);
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GT_PY_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} gt_py_stats SEC(".maps");

// A thread the walk did not find is not walked again for this long: non-Python
// threads of a Python process (native pools) would otherwise walk every call.
#define GT_PY_MISS_RETRY_NS (100ULL * 1000 * 1000)

static __always_inline void gt_py_stat(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&gt_py_stats, &slot);
	if (v)
		*v += 1;
}

static __always_inline __u64 gt_py_read_u64(__u64 addr)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (const void *)addr))
		return 0;
	return v;
}

// PyThreadState.native_thread_id holds the id in the process's own PID
// namespace; bpf_get_current_pid_tgid gives the initial namespace's.
static __always_inline __u64 gt_py_ns_tid(const struct gt_py_params *p, __u32 tid)
{
	if (!p->pidns_ino)
		return tid;
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(p->pidns_dev, p->pidns_ino, &ns, sizeof(ns)))
		return 0;
	return ns.pid;
}

// Bounded walk of the interpreters' thread lists for the thread whose native
// id is nstid. New threads are pushed at the head, so a long-lived server's
// event-loop thread is near the tail only when it started threads after it;
// GT_PY_MAX_THREADS bounds the verifier's work and the cost of a miss.
static __always_inline __u64 gt_py_walk(const struct gt_py_params *p, __u64 nstid)
{
	__u64 interp = gt_py_read_u64(p->runtime + p->runtime_interp_head);
	for (int i = 0; i < GT_PY_MAX_INTERPS && interp; i++) {
		__u64 ts = gt_py_read_u64(interp + p->interp_threads_head);
		for (int j = 0; j < GT_PY_MAX_THREADS && ts; j++) {
			__u64 ntid = 0;
			if (bpf_probe_read_user(&ntid, sizeof(ntid), (const void *)(ts + p->tstate_native_tid)))
				break;
			if (ntid == nstid)
				return ts;
			ts = gt_py_read_u64(ts + p->tstate_next);
		}
		interp = gt_py_read_u64(interp + p->interp_next);
	}
	return 0;
}

// The calling thread's PyThreadState, or 0, and its cache entry in *th (for
// the read rule's fields; 0 if the map had no room). Must run on that
// thread (syscall tracepoints and uprobes do).
static __always_inline __u64 gt_py_tstate_th(const struct gt_py_params *p, __u32 tgid, __u32 tid,
					     struct gt_py_thread **th)
{
	*th = 0;
	__u64 nstid = gt_py_ns_tid(p, tid);
	if (!nstid)
		return 0;
	struct gt_py_thread *c = bpf_map_lookup_elem(&gt_py_threads, &tid);
	if (c && c->tgid == tgid) {
		if (c->tstate) {
			// A thread state is freed when its thread ends and the memory
			// reused; re-checking the id keeps a stale entry from naming
			// another thread's context.
			if (gt_py_read_u64(c->tstate + p->tstate_native_tid) == nstid) {
				*th = c;
				return c->tstate;
			}
		} else if (bpf_ktime_get_ns() < c->retry_ns) {
			return 0;
		}
	}
	gt_py_stat(GT_PY_WALKED);
	struct gt_py_scratch *ps = gt_py_scr();
	if (!ps)
		return 0;
	struct gt_py_thread *v = &ps->tv;
	__builtin_memset(v, 0, sizeof(*v));
	v->tgid = tgid;
	v->tstate = gt_py_walk(p, nstid);
	if (!v->tstate)
		v->retry_ns = bpf_ktime_get_ns() + GT_PY_MISS_RETRY_NS;
	__u64 ts = v->tstate;
	bpf_map_update_elem(&gt_py_threads, &tid, v, BPF_ANY);
	if (ts)
		*th = bpf_map_lookup_elem(&gt_py_threads, &tid);
	return ts;
}

static __always_inline __u64 gt_py_tstate(const struct gt_py_params *p, __u32 tgid, __u32 tid)
{
	struct gt_py_thread *th;
	return gt_py_tstate_th(p, tgid, tid, &th);
}

// Is addr a live PyContext? Catches a wrong offset table and a stale pointer.
static __always_inline int gt_py_is_context(const struct gt_py_params *p, __u64 addr)
{
	return addr && gt_py_read_u64(addr + p->ob_type) == p->context_type;
}

// The id of context address addr and, when the probe saw it born, its link.
static __always_inline __u64 gt_py_ctx_id(__u64 addr, struct gt_py_link **link)
{
	*link = 0;
	if (!addr)
		return 0;
	addr &= GT_PY_ADDR_MASK;
	struct gt_py_link *l = bpf_map_lookup_elem(&gt_py_links, &addr);
	*link = l;
	return l ? addr | ((__u64)l->gen << GT_PY_GEN_SHIFT) : addr;
}

// gt_py_task_ctx: the context of Task task and, in *name, its task_name
// object, the field right before task_context (internal/python's
// readTaskLayout checks it): one user read for both.
static __always_inline __u64 gt_py_task_ctx(const struct gt_py_params *p, __u64 task, __u64 *name)
{
	__u64 nc[2] = {};
	bpf_probe_read_user(nc, sizeof(nc), (const void *)(task + p->task_context - 8));
	*name = nc[0];
	return nc[1] & GT_PY_ADDR_MASK;
}

// gt_py_next_gen: the generation of a new birth at an address whose entry
// is cl (0: none). The next one for a (likely recycled) address; a fresh
// address starts at a random one so that an entry evicted and born again
// does not repeat an identity userspace may still hold.
static __always_inline __u16 gt_py_next_gen(const struct gt_py_link *cl)
{
	__u16 gen = cl ? cl->gen + 1 : (__u16)bpf_get_prandom_u32();
	return gen ? gen : 1;
}

// gt_py_trusted: may the link of addr, the current context of thread state
// ts, be used? Always, unless the process's link probe sees only Task births
// (GT_PY_F_TASKS). Then, on a thread that runs an event loop, only while
// addr is the running task's context: any other context there (a uvloop
// handle's, a done callback's) was born unseen and may sit at the address of
// a dead context whose link is still there; its calls go unattributed
// rather than to that dead context's request. CPython sets the running task
// for each step of a native Task and enters its context around it, eager
// starts included. A thread with no loop (asyncio.to_thread's workers) only
// enters contexts copy_context made, which the probe still sees.
// *task: the running task when that is why addr is trusted, else 0, and
// *name its task_name object.
static __always_inline int gt_py_trusted(const struct gt_py_params *p, __u64 ts, __u64 addr, __u64 *task,
					 __u64 *name)
{
	*task = 0;
	*name = 0;
	if (!(p->flags & GT_PY_F_TASKS))
		return 1;
	__u64 t = gt_py_read_u64(ts + p->tstate_running_task);
	if (t) {
		if (gt_py_task_ctx(p, t, name) == (addr & GT_PY_ADDR_MASK)) {
			*task = t & GT_PY_ADDR_MASK;
			return 1;
		}
		*name = 0;
	} else if (!gt_py_read_u64(ts + p->tstate_running_loop)) {
		return 1;
	}
	gt_py_stat(GT_PY_NOT_TASK);
	return 0;
}

// gt_py_task_serial: the serial of a 3.14 Task whose name object is name:
// the value of the int counter Task.__init__ gives an unnamed Task (it is
// formatted into "Task-N" only when someone asks for the name), 0 for any
// other name. Read as a PyLong's lv_tag and first 30-bit digit after the
// object's 16-byte header: unique among a module's Tasks up to 2^30 of them.
static __always_inline __u64 gt_py_task_serial(const struct gt_py_params *p, __u64 name)
{
	__u64 o[4] = {}; // ob_refcnt, ob_type, lv_tag, ob_digit[0..1]
	if (!name || !p->long_type || bpf_probe_read_user(o, sizeof(o), (const void *)name))
		return 0;
	if (o[1] != p->long_type)
		return 0;
	return (o[2] << 32) ^ (o[3] & 0x3fffffff) ^ (1ULL << 63);
}

// gt_py_eager (GT_PY_F_EAGER): the link of addr, the context of the running
// task, checked against its owner and, in an eager step, made there.
//
// An eager task's birth is not probed, so its context's entry, if any, is a
// dead Task's: 98.7 % of aiohttp's eager body writers take the context
// address of an earlier Task (docs/python-causality.md, "Eager tasks").
// Two things tell it apart:
// - the owner: a link counts only while the Task that owns it is the
//   running one: the same address and, while both names are still their
//   counters, the same serial (gt_py_task_serial). A dead Task's address
//   is reused far less often than its context's (0.7 % of eager births
//   took both), its serial never;
// - in the eager step, ctx_prev: _PyContext_Enter saved the creator's
//   context there, a context whose own link is owned by a Task that still
//   holds it (the creator, inside whose step this one runs). The link must
//   then name it as parent, or it is made again from it: the creator's root
//   and request, this task as owner, a new generation. In a later step
//   ctx_prev is the loop's base context, which no Task owns.
// What is left: an eager task that makes no traced call in its eager step
// and whose Task and context addresses both repeat those of a dead linked
// Task that was named (or whose own name is formatted by then): the owner
// check then cannot tell them apart.
static __always_inline struct gt_py_link *gt_py_eager(const struct gt_py_params *p, __u64 addr, __u64 task,
						      __u64 name, struct gt_py_link *l)
{
	__u64 serial = 0; // read once, where it is needed
	// A link with no owner was made by a probe that sees every copy: the
	// return probe before the call-site probes went on, or copy_context()'s.
	// Nothing proves it is this Task's context's (an eager Task quiet in its
	// eager step may sit at the address of such a context, long dead), so it
	// is stale too: a Task born before the call-site probes goes
	// unattributed, never under that dead context's request.
	int stale = l && l->owner != task;
	if (l && !stale && l->owner && l->owner_serial) {
		serial = gt_py_task_serial(p, name);
		// While its name is still the counter, another one is another Task.
		stale = serial && serial != l->owner_serial;
	}
	if (stale) {
		gt_py_stat(GT_PY_STALE);
		l = 0;
	}
	__u64 prev = gt_py_read_u64(addr + p->ctx_prev) & GT_PY_ADDR_MASK;
	if (!prev || prev == addr)
		return l;
	struct gt_py_link *pl = bpf_map_lookup_elem(&gt_py_links, &prev);
	if (!pl || !pl->owner || pl->owner == task)
		return l; // not entered from a Task's step: not an eager step
	// The creator's link, checked as the running task's is: its owner
	// still holds that context and, while its name is a counter, it is
	// that counter's Task.
	__u64 cname;
	if (gt_py_task_ctx(p, pl->owner, &cname) != prev)
		return l;
	if (pl->owner_serial) {
		__u64 cs = gt_py_task_serial(p, cname);
		if (cs && cs != pl->owner_serial)
			return l;
	}
	__u64 pid = prev | ((__u64)pl->gen << GT_PY_GEN_SHIFT);
	if (l && l->parent == pid)
		return l;
	struct gt_py_scratch *ps = gt_py_scr();
	if (!ps)
		return 0;
	struct gt_py_link *cl = bpf_map_lookup_elem(&gt_py_links, &addr);
	struct gt_py_link *nl = &ps->nl;
	nl->parent = pid;
	nl->root = pl->root;
	nl->born_ns = bpf_ktime_get_ns();
	nl->tid = (__u32)bpf_get_current_pid_tgid();
	nl->gen = gt_py_next_gen(cl);
	nl->_pad = 0;
	nl->req_conn = pl->req_conn;
	nl->req_seq = pl->req_seq;
	nl->owner = task;
	nl->owner_serial = serial ? serial : gt_py_task_serial(p, name);
	if (cl) {
		*cl = *nl;
	} else {
		bpf_map_update_elem(&gt_py_links, &addr, nl, BPF_ANY);
		cl = bpf_map_lookup_elem(&gt_py_links, &addr);
	}
	gt_py_stat(GT_PY_EAGER);
	return cl;
}

// gt_py_known_id is gt_py_ctx_id for addr, the current context of thread
// state ts, with its link only where gt_py_trusted says it may be used
// (otherwise *link is 0 and the id has no generation), and with
// GT_PY_F_EAGER only where gt_py_eager does.
static __always_inline __u64 gt_py_known_id(const struct gt_py_params *p, __u64 ts, __u64 addr,
					    struct gt_py_link **link)
{
	__u64 id = gt_py_ctx_id(addr, link);
	__u64 task, name;
	if (!(p->flags & GT_PY_F_EAGER)) {
		if (*link && !gt_py_trusted(p, ts, addr, &task, &name)) {
			*link = 0;
			return addr & GT_PY_ADDR_MASK;
		}
		return id;
	}
	addr &= GT_PY_ADDR_MASK;
	if (!gt_py_trusted(p, ts, addr, &task, &name)) {
		*link = 0;
		return addr;
	}
	if (task)
		*link = gt_py_eager(p, addr, task, name, *link);
	return *link ? addr | ((__u64)(*link)->gen << GT_PY_GEN_SHIFT) : addr;
}

// gt_py_context fills the asyncio context identity of the calling thread:
// *ctx the current contextvars.Context (the running Task's, or the loop
// callback's) and *root the request it works for (the handler context of an
// inbound request, see gt_py_link; 0 when unknown or the probe is detached).
// Returns an enum gt_py_status. Call it from a program running on the thread
// that made the syscall, with tgid/tid from bpf_get_current_pid_tgid().
//
// Use: on a server connection, the record of a response names its request
// by root (the response is written by the handler task or a descendant);
// on a client connection, the record of a request (the write, not the
// response read: a pooled connection's reader belongs to whoever opened it)
// names the request that made the call by the same root.
//
// wbuf: for a write, the data address where the message starts (0 for a
// read). In a uvloop process with deferred writes the write(2) runs in the
// loop's check phase, in no task's context; the write probe recorded the
// writing task's context for that buffer (bpf/python_uvloop.h), and that
// record wins. take: the record is deleted (at the syscall's exit, where the
// message is parsed: the address is freed and reused after the flush).
//
// read_conn: this call is at the read of an inbound request's first bytes on
// server connection (read_fd, read_conn); the thread's cache entry then
// remembers it for the copy probe's read rule (struct gt_py_thread): that
// is how uvloop servers start request tasks. libuv's read runs outside any
// context, then Context.run(server context, data_received) creates the
// task. On the default loop the read runs inside the callback already and
// the spawner rule applies; the read rule never matches there (no context
// is entered between the read and the task's creation). Done here, with the
// thread state at hand, to keep the syscall path's stack small.
static __always_inline int gt_py_context_w(__u32 tgid, __u32 tid, __u64 wbuf, int take, __s32 read_fd,
					   __u64 read_conn, __u64 *ctx, __u64 *root)
{
	*ctx = 0;
	*root = 0;
	const struct gt_py_params *p = bpf_map_lookup_elem(&gt_py_procs, &tgid);
	if (!p)
		return GT_PY_NOT_PYTHON;

	int status = GT_PY_OK;
	struct gt_py_scratch *ps = gt_py_scr();
	if (ps)
		ps->cause_ok = 0;
	if (wbuf && (p->flags & GT_PY_F_UVWRITE) && ps) {
		ps->wk.tgid = tgid;
		ps->wk._pad = 0;
		ps->wk.addr = wbuf;
		struct gt_py_wbuf *w = bpf_map_lookup_elem(&gt_py_wbufs, &ps->wk);
		// A record older than that is from before the probes came off
		// and back on (pure servers): its buffer is long gone.
		if (w && bpf_ktime_get_ns() - w->ns < GT_PY_WBUF_MAX_AGE_NS) {
			*ctx = w->ctx;
			*root = w->root;
			if (take) {
				bpf_map_delete_elem(&gt_py_wbufs, &ps->wk);
				gt_py_stat(GT_PY_UV_TAKEN);
			}
			goto out;
		}
	}
	struct gt_py_thread *th;
	__u64 ts = gt_py_tstate_th(p, tgid, tid, &th);
	if (!ts) {
		status = GT_PY_NO_THREAD;
		goto out;
	}
	__u64 c = 0;
	if (bpf_probe_read_user(&c, sizeof(c), (const void *)(ts + p->tstate_context))) {
		status = GT_PY_READ_ERROR;
		goto out;
	}
	if (read_conn && th && p->tstate_context_ver) {
		th->pend_ver = gt_py_read_u64(ts + p->tstate_context_ver);
		th->pend_ctx = c & GT_PY_ADDR_MASK;
		th->pend_conn = read_conn;
		th->pend_fd = read_fd;
	}
	if (!c) {
		status = GT_PY_NO_CONTEXT;
		goto out;
	}
	struct gt_py_link *l;
	__u64 id = gt_py_known_id(p, ts, c, &l);
	// A context whose birth the copy probe saw is known to be one; only an
	// unknown or distrusted pointer costs the type check (a wrong offset
	// table, a stale pointer).
	if (!l && !gt_py_is_context(p, c)) {
		status = GT_PY_BAD_CONTEXT;
		goto out;
	}
	*ctx = id;
	if (l) {
		*root = l->root;
		if (ps) {
			ps->cause_conn = l->req_conn;
			ps->cause_seq = l->req_seq;
			ps->cause_ok = 1;
		}
	}
out:
	gt_py_stat(status);
	return status;
}

static __always_inline int gt_py_context(__u32 tgid, __u32 tid, __u64 *ctx, __u64 *root)
{
	return gt_py_context_w(tgid, tid, 0, 0, 0, 0, ctx, root);
}

// gt_py_mark_spawner records ctx (a context id from gt_py_context) as a
// context from which a server may start a request's handler task. Call it on
// a server connection at the syscall that reads the first bytes of each
// inbound request (before Python sees them, so before the task is born), for
//   1. the context of that read (the connection's protocol callback: uvicorn,
//      aiohttp.web and asyncio streams start the task right there), and
//   2. the context that wrote the last bytes of the previous response on the
//      same connection, if any: when a request arrives while the previous
//      response is still being sent (keep-alive clients, BaseHTTPMiddleware's
//      streamed responses), uvicorn starts its task later, from the step that
//      finishes that response (on_response_complete).
// A context born from a spawner becomes a root even if it is not the
// handler (a timer handle, resume_reading's reader handle); such roots own no
// response, so calls under them stay unattributed, never misattributed.
//
// live: ctx may be a context that has died since it was seen (the previous
// response's writer, whose address CPython may have given to a new context):
// it is marked only while the copy probe's link at its address still has its
// generation. A dead context spawns nothing, and its mark would overwrite
// the entry of the live context at the same address, the spawner of another
// connection's next request. (That was the causality flake of issue 19: two
// kept-alive requests read in one loop iteration, the second connection's
// previous writer long dead at the address of the first one's live writer;
// the first request's handler then inherited its connection's previous
// root.)
static __always_inline void gt_py_mark_spawner(__u64 ctx, __u32 tgid, __s32 fd, __u64 conn_id, int live)
{
	if (!ctx)
		return;
	__u64 addr = ctx & GT_PY_ADDR_MASK;
	if (!live) {
		struct gt_py_link *l = bpf_map_lookup_elem(&gt_py_links, &addr);
		if (l && l->gen != (__u16)(ctx >> GT_PY_GEN_SHIFT))
			return; // died, and its address was reused
	}
	struct gt_py_spawner *cur = bpf_map_lookup_elem(&gt_py_spawners, &addr);
	if (cur && cur->id == ctx) {
		if (cur->conn_id == conn_id || !cur->conn_id)
			return; // keep-alive: the same reader for every request; or shared
		// One context reading more than one connection (uvloop 0.17 reads
		// every connection in one): a handler born from it could be any of
		// theirs, so it roots none (its calls go unattributed, counted),
		// never the one read last.
		cur->conn_id = 0;
		return;
	}
	struct gt_py_scratch *ps = gt_py_scr();
	if (!ps)
		return;
	ps->sp.id = ctx;
	ps->sp.conn_id = conn_id;
	ps->sp.tgid = tgid;
	ps->sp.fd = fd;
	bpf_map_update_elem(&gt_py_spawners, &addr, &ps->sp, BPF_ANY);
	gt_py_stat(GT_PY_SPAWNERS);
}

// The inbound request a context's root was bound to (see gt_py_link).
static __always_inline void gt_py_cause(__u64 root, __u64 *conn, __u64 *seq)
{
	*conn = 0;
	*seq = 0;
	if (!root)
		return;
	__u64 addr = root & GT_PY_ADDR_MASK;
	struct gt_py_link *l = bpf_map_lookup_elem(&gt_py_links, &addr);
	if (!l || (l->gen != (__u16)(root >> GT_PY_GEN_SHIFT)))
		return; // the root context died and its address was reused
	*conn = l->req_conn;
	*seq = l->req_seq;
}
