// Uprobe programs for CPython context links. Included by bpf/gymtrace.c after
// bpf/python.h; attached per process by internal/python.AttachProbes only while
// an enabled span group needs in-process parents (http_client under a server).
//
// Why a return probe on PyContext_CopyCurrent: an asyncio Task's Context is a
// copy of its creator's, made by PyContext_CopyCurrent (exported in every
// CPython build, called by _asyncio's Task and Future code and by
// contextvars.copy_context, which loop.call_soon uses). On return the new
// Context is in the return register and the creator's is still the thread's
// current context, so one probe yields the whole link; no entry program runs.
// It also computes the child's request root (see gt_py_link) from the
// parent's, so a syscall needs one lookup to name its request.
// With the x86-64 uretprobe trampoline (Linux 6.11+) the return side is a
// syscall rather than a trap. The entry trap must hit an instruction the
// kernel emulates: internal/python places it after a leading endbr64 (CET
// builds such as Debian 13's), on the push that follows. Measured: about
// 1.3 µs a hit in all (docs/python-causality.md). On x86-64, once a
// process's modules are loaded, internal/python moves the link to the call
// sites (gt_py_copy_site below) and keeps this program for wrappers only a
// method table reaches.
#pragma once

#include "python.h"
#include "common/preempt.h"

// The registers a probe reads; CO-RE drops the ___gtpy suffix and relocates
// against the running kernel's struct pt_regs.
struct pt_regs___gtpy {
#if defined(__TARGET_ARCH_x86)
	unsigned long ax, bx, cx, dx, si, di, bp;
	unsigned long r8, r9, r10, r11, r12, r13, r14, r15;
#elif defined(__TARGET_ARCH_arm64)
	unsigned long regs[31];
#endif
} __attribute__((preserve_access_index));

static __always_inline __u64 gt_py_retval(void *ctx)
{
	struct pt_regs___gtpy *regs = ctx;
#if defined(__TARGET_ARCH_x86)
	return regs->ax;
#elif defined(__TARGET_ARCH_arm64)
	return regs->regs[0];
#else
	return 0;
#endif
}

// gt_py_site_reg: the register a call-site probe's cookie names (enum
// gt_py_reg), where internal/probesite found the new context after the call.
static __always_inline __u64 gt_py_site_reg(void *ctx)
{
#if defined(__TARGET_ARCH_x86)
	// All of them, then one picked by index: a switch of loads becomes one
	// load at ctx plus a chosen offset, which the verifier refuses (a
	// context pointer is only read at constant offsets).
	struct pt_regs___gtpy *regs = ctx;
	__u64 r[GT_PY_REG_R15 + 1] = {
		regs->ax, regs->bx, regs->cx, regs->dx, regs->si, regs->di, regs->bp, regs->r8,
		regs->r9, regs->r10, regs->r11, regs->r12, regs->r13, regs->r14, regs->r15,
	};
	__u64 i = bpf_get_attach_cookie(ctx) & ~(__u64)GT_PY_SITE_TASK;
	if (i <= GT_PY_REG_R15)
		return r[i];
#endif
	return 0; // call-site probes are x86-64 only
}

static __always_inline int gt_py_link_new(__u64 child, int site, __u64 task);

// Each uprobe program runs whole on its CPU (common/preempt.h).
SEC("uretprobe/PyContext_CopyCurrent")
int gt_py_copy_ret(void *ctx)
{
	gt_own_stack(ctx);
	gt_preempt_off();
	gt_py_link_new(gt_py_retval(ctx) & GT_PY_ADDR_MASK, 0, 0);
	gt_preempt_on();
	return 0;
}

// Why an entry probe after the call: a return probe costs a trap at the
// function's entry and a second kernel entry at its return; at a call site,
// on the first instruction after the call that the kernel emulates, one
// trap sees the new context in a register (internal/probesite.FindCalls).
// Measured on a host with PTI and no PCID: 5.3 us against 6.7 us with an
// empty program, and one kernel entry a copy instead of two.
//
// With GT_PY_SITE_TASK in the cookie the site is Task.__init__'s
// register_task after task_call_step_soon, on its call instruction, and the
// register holds the Task (GT_PY_F_EAGER): its context was copied or given
// by then, and an eager start never gets there.
SEC("uprobe/PyContext_CopyCurrent_site")
int gt_py_copy_site(void *ctx)
{
	gt_own_stack(ctx);
	__u64 v = gt_py_site_reg(ctx) & GT_PY_ADDR_MASK;
	int task = (bpf_get_attach_cookie(ctx) & GT_PY_SITE_TASK) != 0;
	gt_preempt_off();
	gt_py_link_new(task ? 0 : v, 1, task ? v : 0);
	gt_preempt_on();
	return 0;
}

// gt_py_link_new records the birth of child, a context the current one was
// copied into; or, given task, of the context of that Task (its owner).
// site: the value came from a call site's register, so it is checked to be
// a PyContext first (a return probe's is one by construction).
static __always_inline int gt_py_link_new(__u64 child, int site, __u64 task)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	const struct gt_py_params *p = bpf_map_lookup_elem(&gt_py_procs, &tgid);
	if (!p)
		return 0;
	__u64 tname = 0;
	if (task)
		child = gt_py_task_ctx(p, task, &tname);
	if (!child)
		return 0; // the copy failed (MemoryError)
	if (site && !gt_py_is_context(p, child))
		return 0;
	__u64 t0 = gt_prof_begin();

	// The GIL is held here, so the thread state and its context are stable.
	__u64 parent = 0;
	struct gt_py_thread *th;
	__u64 ts = gt_py_tstate_th(p, tgid, tid, &th);
	if (ts)
		parent = gt_py_read_u64(ts + p->tstate_context) & GT_PY_ADDR_MASK;
	// A distrusted parent passes nothing on; the read rule may still root
	// the child.
	struct gt_py_link *pl = 0;
	if (task && child == parent)
		return 0; // a Task given its creator's own context: no birth
	__u64 parent_id = ts ? gt_py_known_id(p, ts, parent, &pl) : 0;

	struct gt_py_link *cl = bpf_map_lookup_elem(&gt_py_links, &child);
	__u16 gen = gt_py_next_gen(cl);
	__u64 child_id = child | ((__u64)gen << GT_PY_GEN_SHIFT);

	__u64 root = pl ? pl->root : 0;
	__u64 req_conn = pl ? pl->req_conn : 0, req_seq = pl ? pl->req_seq : 0;
	struct gt_conn_key ck = {.tgid = tgid};
	__u64 bind_conn = 0;
	int rooted = 0;
	// The read rule (struct gt_py_thread): born in the first callback
	// entered after this thread read an inbound request's first bytes, from
	// a context other than the read's. Exact where it applies (uvloop), so
	// it goes first; on the default loop it never matches.
	if (th && th->pend_ver && parent && parent != th->pend_ctx && p->tstate_context_ver &&
	    gt_py_read_u64(ts + p->tstate_context_ver) == th->pend_ver + 1) {
		ck.fd = th->pend_fd;
		bind_conn = th->pend_conn;
		rooted = 1;
		gt_py_stat(GT_PY_ROOTED_READ);
	} else {
		struct gt_py_spawner *spawner = parent ? bpf_map_lookup_elem(&gt_py_spawners, &parent) : 0;
		if (spawner && spawner->id == parent_id && spawner->conn_id) {
			ck.tgid = spawner->tgid;
			ck.fd = spawner->fd;
			bind_conn = spawner->conn_id;
			rooted = 1;
			gt_py_stat(GT_PY_ROOTED);
		}
	}
	if (rooted) {
		root = child_id; // a request's handler task
		// Bind the handler to its request: the newest request started on
		// that connection (the task is created right after the read that
		// completed it, on this thread).
		struct gt_conn *c = bpf_map_lookup_elem(&gt_conns, &ck);
		req_conn = 0;
		req_seq = 0;
		if (c && c->conn_id == bind_conn && c->req_seq) {
			req_conn = c->conn_id;
			req_seq = c->req_seq - 1;
		}
	}

	struct gt_py_link l = {
		.parent = parent_id,
		.root = root,
		.born_ns = bpf_ktime_get_ns(),
		.tid = tid,
		.gen = gen,
		.req_conn = req_conn,
		.req_seq = req_seq,
		.owner = task,
		.owner_serial = gt_py_task_serial(p, tname),
	};
	if (cl)
		*cl = l; // in place: no LRU list work on the hot path
	else
		bpf_map_update_elem(&gt_py_links, &child, &l, BPF_ANY);
	gt_py_stat(GT_PY_LINKED);
	if (site)
		gt_py_stat(GT_PY_LINKED_SITE);
	gt_prof_end(GT_PROF_PY_COPY, t0);
	return 0;
}
