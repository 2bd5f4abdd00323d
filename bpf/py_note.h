// asyncio causality at each message start (bpf/python.h): what the syscall
// path records of the thread's current Context. Included by bpf/syscalls.h.
#pragma once

// The asyncio part of gt_py_note, with its outputs and map keys in per-CPU
// map memory: it runs at the bottom of the syscall and TLS programs' call
// chains, whose combined stack this kernel's verifier bounds at 512 bytes.
// drop_only: the context was read at the write's sys_enter
// (injection); only the uvloop write probe's record of the buffer, if any,
// is dropped (see gt_py_context_w).
static __always_inline int gt_py_note_ctx(struct gt_conn *c, struct gt_io *io, int drop_only)
{
	struct gt_py_scratch *ps = gt_py_scr();
	if (!c || !io || !ps)
		return 0;
	if (drop_only) {
		ps->wk.tgid = io->tgid;
		ps->wk._pad = 0;
		ps->wk.addr = c->msg_ubuf;
		bpf_map_delete_elem(&gt_py_wbufs, &ps->wk);
		return 0;
	}
	int is_req = c->dir[io->dir & 1].is_req;
	int server_req = c->side == GT_SIDE_SERVER && is_req;
	if (gt_py_context_w(io->tgid, io->tid, io->dir ? c->msg_ubuf : 0, 1, io->fd, server_req ? c->conn_id : 0,
			    &ps->ctx, &ps->root) != GT_PY_OK)
		return 0;
	if (c->side == GT_SIDE_SERVER) {
		if (is_req) {
			gt_py_mark_spawner(ps->ctx, io->tgid, io->fd, c->conn_id, 1);
			gt_py_mark_spawner(c->last_resp_ctx, io->tgid, io->fd, c->conn_id, 0);
			c->req.py_ctx = ps->ctx;
			c->req.py_root = ps->root;
		} else {
			c->last_resp_ctx = ps->ctx;
		}
	} else if (is_req) {
		c->req.py_ctx = ps->ctx;
		c->req.py_root = ps->root;
		if (ps->cause_ok) {
			// The context's own link carries its root's request: one
			// lookup less than asking the root's link.
			c->req.cause_conn = ps->cause_conn;
			c->req.cause_seq = ps->cause_seq;
		} else {
			gt_py_cause(ps->root, &c->req.cause_conn, &c->req.cause_seq);
		}
	}
	return 0;
}

// asyncio causality at a message start (bpf/python.h). Server request: its
// reader context, and the context that started the connection's previous
// response, may create the request's handler task (spawners). Server
// response: remember its context for the next request. Client request: name
// the inbound request whose handler makes the call. One map lookup and out
// for processes that are not Python.
GT_GLOBAL int gt_py_note(struct gt_conn *c, struct gt_io *io)
{
	if (!c || !io)
		return 0;
	__u64 t0 = gt_prof_begin();
#ifdef GT_INJECT
	// A client request whose context injection's sys_enter program already
	// read (bpf/inject.h) needs nothing more.
	int is_req = c->dir[io->dir & 1].is_req;
	int done = gt_inject_note(c, io);
	gt_prof_end(GT_PROF_INJ_NOTE, t0);
	if (done && c->side == GT_SIDE_CLIENT && is_req) {
		if (c->msg_ubuf)
			gt_py_note_ctx(c, io, 1);
		gt_prof_end(GT_PROF_PY_NOTE, t0);
		return 0;
	}
#endif
	gt_py_note_ctx(c, io, 0);
	gt_prof_end(GT_PROF_PY_NOTE, t0);
	return 0;
}
GT_K510_CI(gt_py_note, (void), 0, c, io)

#ifndef GT_K510
// A server request's head that arrives in more than one read (a sender that
// writes it in pieces; injection's pushed traceparent line, which leaves as
// its own TCP segment): uvloop creates the handler task in the callback after
// the read that completes the head, two or more callbacks after the read of
// its first bytes, so the read rule's mark (struct gt_py_thread pend_*, set
// by gt_py_context_w at that first read) is set again at each later read of
// the head, for this connection: the read that completes it is the last to
// set it, and its callback is the one that creates the task. Another
// connection's read in between sets its own mark, and that connection's
// next read of this head sets this one's back. No thread walk: the first
// read cached the thread. (No Python probes on 5.10's build.)
GT_GLOBAL int gt_py_note_more(struct gt_conn *c, struct gt_io *io)
{
	if (!c || !io)
		return 0;
	__u32 tgid = io->tgid, tid = io->tid;
	const struct gt_py_params *p = bpf_map_lookup_elem(&gt_py_procs, &tgid);
	if (!p || !p->tstate_context_ver)
		return 0;
	struct gt_py_thread *th = bpf_map_lookup_elem(&gt_py_threads, &tid);
	if (!th || th->tgid != tgid || !th->tstate)
		return 0;
	__u64 nstid = gt_py_ns_tid(p, tid);
	if (!nstid || gt_py_read_u64(th->tstate + p->tstate_native_tid) != nstid)
		return 0;
	__u64 ver = gt_py_read_u64(th->tstate + p->tstate_context_ver);
	if (!ver)
		return 0;
	th->pend_ver = ver;
	th->pend_ctx = gt_py_read_u64(th->tstate + p->tstate_context) & GT_PY_ADDR_MASK;
	th->pend_conn = c->conn_id;
	th->pend_fd = io->fd;
	gt_py_stat(GT_PY_HEAD_MORE);
	return 0;
}
#endif
#ifdef GT_K510
#define gt_py_note(c, io) gt_py_note_k510()
#endif
