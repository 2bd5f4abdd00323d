// Syscall tracepoints: the HTTP/1.x message state machine per connection.
//
// Only sys_exit_* of the data syscalls is hooked (plus sys_enter_close): the
// arguments are read back from the task's saved registers, so each traced
// syscall costs one program run, not two. Every program starts with the
// target-bitmap test, so an untargeted process pays one array load.
#pragma once

#include "http.h"
#include "python.h"

#define GT_EAGAIN 11
#define GT_EINTR 4
#define GT_EINPROGRESS 115

enum gt_io_kind {
	GT_IO_PLAIN = 0, // (fd, buf, len)
	GT_IO_IOV = 1,   // (fd, iov, iovcnt)
	GT_IO_MSG = 2,   // (fd, msghdr)
};

struct gt_io {
	__u64 now;
	__u32 tgid;
	__u32 tid;
	__s32 fd;
	__u8 dir; // 0: bytes read, 1: bytes written
	__u8 role;
	__u8 hdr_first; // gt_headers: the buffer starts with the start line
	// The gate, copied from gt_config: global functions take no map pointers.
	__u32 cfg_flags;
	__u32 cfg_gen;
	__u64 mask;
	__u64 server_possible; // for this process's role
	__u64 client_possible;
	// gt_inject_note: the header scan injection made for this write at its
	// sys_enter (struct gt_scratch reuse_*), 0 if none.
	__u64 scan_gen;
};

struct gt_iovec {
	__u64 base;
	__u64 len;
};

struct gt_msghdr {
	__u64 name;
	__u32 namelen;
	__u32 _pad;
	__u64 iov;
	__u64 iovlen;
};

#include "tls_link.h" // HTTPS: SSL* <-> socket link, TLS connection table

#ifdef GT_INJECT
// traceparent injection (bpf/inject.h, included after this file): told about
// every message start the parser accepts (from gt_py_note, which every start
// calls; a call in gt_start_request itself would grow gt_step's verification
// past the limit).
__noinline int gt_inject_note(struct gt_conn *c, struct gt_io *io);
__noinline int gt_inject_inbound(struct gt_conn *c, struct gt_io *io);
__noinline int gt_inject_root(struct gt_conn *c);
#define GT_PAIR_ADD 0
#define GT_PAIR_DEL 1
#define GT_PAIR_LOOKUP 2
__noinline int gt_inject_pair(struct gt_conn *c, int op);
static __always_inline int gt_inject_proc(__u32 tgid);
#endif

static __always_inline void gt_syscall_args(unsigned long *a0, unsigned long *a1, unsigned long *a2)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
#if defined(__TARGET_ARCH_x86)
	*a0 = BPF_CORE_READ(regs, di);
	*a1 = BPF_CORE_READ(regs, si);
	*a2 = BPF_CORE_READ(regs, dx);
#elif defined(__TARGET_ARCH_arm64)
	// x0 holds the return value by now; the first argument survives in orig_x0.
	*a0 = BPF_CORE_READ(regs, orig_x0);
	*a1 = BPF_CORE_READ(regs, regs[1]);
	*a2 = BPF_CORE_READ(regs, regs[2]);
#endif
}

static __always_inline void gt_emit_request(struct gt_conn *c, struct gt_dir *d, struct gt_io *io)
{
	if (gt_prof_skip & 2)
		return;
	if (c->skip_ring & (1ULL << (c->req.seq & 63)))
		return; // decided after the gate: not sampled upstream
	__u64 t0 = gt_prof_begin();
#ifdef GT_INJECT
	// Injection: the calls this request's handler makes must carry its
	// trace before userspace has seen the request (records wait for the
	// reader's poll). A request that carried traceparent was published when
	// its headers were parsed; for one that did not, in a process whose
	// calls can be injected, the kernel starts the trace itself, here, in
	// the syscall that completes the request (so before the handler runs),
	// and userspace adopts it. No reader wakeup is needed.
	int wake = 0;
	if (c->side == GT_SIDE_SERVER && !(c->req.flags & GT_F_TRACEPARENT) && gt_inject_proc(io->tgid)) {
		// A traced caller on this host whose call went without a header
		// (its connection predates gymtrace): userspace joins the request
		// to the caller's trace by the connection's tuple and publishes
		// that; wake it rather than publish a trace it will replace.
		if (gt_inject_pair(c, GT_PAIR_LOOKUP))
			wake = 1;
		else
			gt_inject_root(c);
	}
#endif
	struct http_event *e = bpf_ringbuf_reserve(&gt_events, sizeof(*e), 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		return;
	}
	__builtin_memcpy(e, &c->req, sizeof(*e));
	e->flags |= gt_tls_ev_flag(c);
	e->end_ns = io->now;
	e->body_len = d->body_len;
#ifdef GT_INJECT
	if (wake)
		bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	else
#endif
	gt_submit(e);
	c->emitted_ring |= 1ULL << (c->req.seq & 63);
	gt_prof_end(GT_PROF_EMIT, t0);
}

static __always_inline void gt_emit_response(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u16 extra)
{
	if (gt_prof_skip & 2)
		return;
	__u64 t0 = gt_prof_begin();
	// Only the fixed head: a response has no path, host, traceparent or
	// rollout, and a third of the bytes is a third of the cache lines.
	struct http_event *e = bpf_ringbuf_reserve(&gt_events, GT_HTTP_EVENT_HEAD, 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		return;
	}
	__builtin_memset(e, 0, GT_HTTP_EVENT_HEAD);
	e->kind = GT_EV_RESPONSE;
	e->side = c->side;
	e->role = io->role;
	e->flags = c->resp_flags | extra | gt_tls_ev_flag(c);
	e->status = c->resp_status;
	e->pid = io->tgid;
	e->tid = io->tid;
	e->fd = io->fd;
	e->conn_id = c->conn_id;
	e->seq = c->resp_seq - 1;
	e->start_ns = d->start_ns;
	e->end_ns = io->now;
	e->body_len = d->body_len;
	e->tuple = c->tuple;
	gt_submit(e);
	gt_prof_end(GT_PROF_EMIT, t0);
}

static __always_inline void gt_emit_close(struct gt_conn *c, struct gt_io *io, __u16 flags)
{
	struct http_event *e = bpf_ringbuf_reserve(&gt_events, GT_HTTP_EVENT_HEAD, 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		return;
	}
	__builtin_memset(e, 0, GT_HTTP_EVENT_HEAD);
	e->kind = GT_EV_CLOSE;
	e->side = c->side;
	e->role = io->role;
	e->flags = flags | gt_tls_ev_flag(c);
	e->pid = io->tgid;
	e->tid = io->tid;
	e->fd = io->fd;
	e->conn_id = c->conn_id;
	e->seq = c->req_seq;
	e->start_ns = io->now;
	e->end_ns = io->now;
	e->tuple = c->tuple;
	gt_submit(e);
}

// The message in direction d has ended.
static __always_inline void gt_finish(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u16 extra)
{
	if (d->is_req)
		gt_emit_request(c, d, io);
	else
		gt_emit_response(c, d, io, extra);
	d->phase = GT_PH_IDLE;
}

// Headers of the message in direction d are complete: choose its body framing.
static __always_inline void gt_headers_done(struct gt_conn *c, struct gt_dir *d, struct gt_io *io)
{
	d->body_len = 0;
	if (d->is_req) {
		if (d->chunked) {
			c->req.flags |= GT_F_CHUNKED;
			d->phase = GT_PH_CHUNKED;
			d->chunk_phase = GT_CH_SIZE;
		} else if (d->cl > 0) {
			d->phase = GT_PH_BODY_CL;
			d->remaining = d->cl;
		} else {
			gt_finish(c, d, io, 0);
		}
		return;
	}
	__u16 st = c->resp_status;
	if (st >= 100 && st < 200 && st != 101) {
		// Interim (100 Continue): not the request's response; wait for
		// the final one.
		d->phase = GT_PH_IDLE;
		return;
	}
	__u64 ridx = c->resp_seq - 1;
	int head = (c->head_ring >> (ridx & 63)) & 1;
	if (st == 101) {
		gt_finish(c, d, io, GT_F_UPGRADE);
		c->kind = GT_CONN_UPGRADED;
	} else if (head || st == 204 || st == 304) {
		gt_finish(c, d, io, 0);
	} else if (d->chunked) {
		c->resp_flags |= GT_F_CHUNKED;
		d->phase = GT_PH_CHUNKED;
		d->chunk_phase = GT_CH_SIZE;
	} else if (d->cl >= 0) {
		if (d->cl == 0) {
			gt_finish(c, d, io, 0);
		} else {
			d->phase = GT_PH_BODY_CL;
			d->remaining = d->cl;
		}
	} else {
		d->phase = GT_PH_BODY_EOF;
	}
}

// Parses (part of) a header block from the user buffer. first: the buffer
// starts with the message's start line. Returns bytes consumed, or -1 when the
// rest of the buffer belongs to this header block or is to be ignored.
static __always_inline int gt_headers_body(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 avail)
{
	if (!c || !io)
		return -1;
	struct gt_dir *d = &c->dir[io->dir & 1];
	int first = io->hdr_first;
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	// A header line cut by the previous syscall goes first, whole.
	__u32 carry = (!first && c->carry_len && c->carry_dir == io->dir) ? c->carry_len : 0;
	if (carry > GT_CARRY)
		carry = 0;
	c->carry_len = 0;
	if (carry)
		__builtin_memcpy(sc->buf, c->carry, GT_CARRY);
	// Most header blocks fit in 512 bytes: read that much first, and the rest of
	// the window only when the block goes on.
	__u32 max = avail > GT_SCRATCH - 128 ? GT_SCRATCH - 128 : avail;
	__u32 nr = max > 512 ? 512 : max;
	__u32 n = 0;
	// A client request injection looked at in this syscall's sys_enter: the
	// same read and scan of the same bytes (its whole head, which the check
	// required), unless anything else used the scratch since.
	int reuse = first && !carry && d->is_req && io->scan_gen && sc->reuse_gen == io->scan_gen &&
		    sc->reuse_id == ((__u64)io->tgid << 32 | io->tid) && sc->reuse_ubuf == ubuf &&
		    sc->reuse_max == max && sc->reuse_n && sc->reuse_n <= max && sc->scan.end >= 0;
	sc->reuse_id = 0;
	io->scan_gen = 0;
	if (reuse) {
		nr = sc->reuse_n;
		if (nr > GT_SCRATCH - 128)
			return -1;
		n = nr;
		gt_stat_add(GT_STAT_SCAN_REUSED, 1);
	}
#pragma unroll
	for (int attempt = 0; attempt < 2 && !reuse; attempt++) {
		if (attempt == 1) {
			if (sc->scan.end >= 0 || nr >= max)
				break;
			nr = max;
		}
		if (nr == 0 || nr > GT_SCRATCH - 128 || bpf_probe_read_user(&sc->buf[carry & 127], nr, (void *)ubuf))
			return -1;
		n = carry + nr;
		// The start line is not a header (gt_start_request copied the path).
		gt_scan_begin(sc, first ? 1 : (carry ? 0 : d->mid_line));
		__u64 t1 = gt_prof_begin();
		gt_scan_headers(sc, n, d->is_req);
		gt_prof_end(GT_PROF_SCAN, t1);
	}
	int end = sc->scan.end;
	if (end >= 0)
		end -= carry; // bytes of this buffer that belong to the block
	d->mid_line = 0;
	if (end < 0 && sc->scan.ls < n) {
		__u32 tail = n - sc->scan.ls;
		if (tail <= GT_CARRY && nr == avail) {
			__u32 tl = tail;
			// Keep the bound where the verifier sees it (the compiler
			// would drop a mask it proves redundant).
			asm volatile("%0 &= 127" : "+r"(tl));
			bpf_probe_read_kernel(c->carry, tl, &sc->buf[sc->scan.ls & GT_SCRATCH_MASK]);
			c->carry_len = tail;
			c->carry_dir = io->dir;
		} else {
			d->mid_line = 1;
		}
	}
	if (sc->scan.cl >= 0)
		d->cl = sc->scan.cl;
	if (sc->scan.chunked)
		d->chunked = 1;
	if (sc->scan.upgrade)
		d->upgrade = 1;
	if (d->is_req && sc->scan.tp_found) {
		bpf_probe_read_kernel(c->req.traceparent, GT_TRACEPARENT_LEN, &sc->buf[sc->scan.tp_at & GT_SCRATCH_MASK]);
		c->req.flags |= GT_F_TRACEPARENT;
		// An inbound request its caller did not sample (flags 00): its
		// spans would be dropped, so nothing of the exchange is copied out.
		// Framing is still followed so the connection stays in step.
		if (c->side == GT_SIDE_SERVER && c->req.traceparent[53] == '0' && c->req.traceparent[54] == '0' &&
		    c->req.traceparent[2] == '-' && (io->mask & GT_GROUP_SERVER)) {
			c->skip_ring |= 1ULL << (c->req.seq & 63);
			gt_stat_add(GT_STAT_UNSAMPLED, 1);
		}
#ifdef GT_INJECT
		gt_inject_inbound(c, io);
#endif
	}
	if (d->is_req && sc->scan.host_found) {
		// The value up to the line's end, which the scan knows: one copy,
		// and not a byte of the next header.
		__u32 hl = sc->scan.host_len;
		if (hl > GT_HOST_MAX - 1)
			hl = GT_HOST_MAX - 1;
		asm volatile("%0 &= 63" : "+r"(hl));
		if (hl)
			bpf_probe_read_kernel(c->req.host, hl, &sc->buf[sc->scan.host_at & GT_SCRATCH_MASK]);
		c->req.host_len = hl;
		c->req.flags |= GT_F_HOST;
	}
	n = nr;
	d->hdr_scanned += n;
	if (end >= 0) {
		gt_headers_done(c, d, io);
		return end;
	}
	if (nr < avail || d->hdr_scanned > GT_MAX_HDR_BYTES || sc->scan.nl_count >= GT_MAX_LINES) {
		// The block is larger than the kernel scans: report what we have,
		// with framing lost, and resynchronise at the next message start.
		gt_stat_add(GT_STAT_HDR_TRUNCATED, 1);
		if (d->is_req)
			c->req.flags |= GT_F_HDR_TRUNCATED | GT_F_BODY_UNKNOWN;
		gt_finish(c, d, io, GT_F_HDR_TRUNCATED | GT_F_BODY_UNKNOWN);
		d->phase = GT_PH_SKIP;
		return -1;
	}
	d->phase = GT_PH_HEADERS;
	return -1;
}

// Global (non-static) functions are verified once, on their own, instead of
// once per call site and caller state: that keeps verification linear.
__noinline int gt_headers(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 avail)
{
	__u64 t0 = gt_prof_begin();
	int r = gt_headers_body(c, io, ubuf, avail);
	gt_prof_end(GT_PROF_HEADERS, t0);
	return r;
}

static __always_inline void gt_reset_dir(struct gt_dir *d, __u64 now)
{
	d->chunk_phase = 0;
	d->mid_line = 0;
	d->hdr_scanned = 0;
	d->cl = -1;
	d->chunked = 0;
	d->upgrade = 0;
	d->scan_rollout = 0;
	d->remaining = 0;
	d->body_len = 0;
	d->start_ns = now;
}

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
			gt_py_mark_spawner(ps->ctx, io->tgid, io->fd, c->conn_id);
			gt_py_mark_spawner(c->last_resp_ctx, io->tgid, io->fd, c->conn_id);
			c->req.py_ctx = ps->ctx;
			c->req.py_root = ps->root;
		} else {
			c->last_resp_ctx = ps->ctx;
		}
	} else if (is_req) {
		c->req.py_ctx = ps->ctx;
		c->req.py_root = ps->root;
		gt_py_cause(ps->root, &c->req.cause_conn, &c->req.cause_seq);
	}
	return 0;
}

// asyncio causality at a message start (bpf/python.h). Server request: its
// reader context, and the context that started the connection's previous
// response, may create the request's handler task (spawners). Server
// response: remember its context for the next request. Client request: name
// the inbound request whose handler makes the call. One map lookup and out
// for processes that are not Python.
__noinline int gt_py_note(struct gt_conn *c, struct gt_io *io)
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

// A request line starts at ubuf. Decides the gate for the whole exchange.
static __always_inline int gt_start_request(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u64 ubuf,
					    __u32 avail, __u8 method, __u8 path_at)
{
	__u64 idx = c->req_seq++;
	__u64 bit = 1ULL << (idx & 63);
	c->skip_ring &= ~bit;
	c->emitted_ring &= ~bit;
	if (method == GT_M_HEAD)
		c->head_ring |= bit;
	else
		c->head_ring &= ~bit;

	gt_reset_dir(d, io->now);
	struct http_event *ev = &c->req;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->kind = GT_EV_REQUEST;
	ev->side = c->side;
	ev->method = method;
	ev->role = io->role;
	ev->pid = io->tgid;
	ev->tid = io->tid;
	ev->fd = io->fd;
	ev->conn_id = c->conn_id;
	ev->seq = idx;
	ev->start_ns = io->now;
	ev->tuple = c->tuple;
	ev->rollout.task = -1;
	ev->rollout.rollout = -1;
	ev->rollout.attempt = -1;
	if (!c->started)
		ev->flags |= GT_F_RESYNC;
	if (c->fresh)
		ev->flags |= GT_F_FRESH;
	c->msg_ubuf = ubuf;
	if (!(gt_prof_skip & 4))
		gt_py_note(c, io);
	__u64 t0 = gt_prof_begin();

	// The path is needed before the gate can decide (routes pick gym.* groups);
	// it is read into the per-CPU scratch, never into the ring buffer, so a
	// gated-off request copies nothing out.
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	// The same bytes as the injection scan of this very write read, when it
	// is ours: keep that scan; anyone else's is void once buf changes.
	if (sc->reuse_id != ((__u64)io->tgid << 32 | io->tid) || sc->reuse_ubuf != ubuf)
		sc->reuse_id = 0;
	__u32 n = avail > GT_PATH_MAX + 16 ? GT_PATH_MAX + 16 : avail;
	if (bpf_probe_read_user(sc->buf, n & 0xff, (void *)ubuf))
		return -1;
	gt_copy_path(sc->buf, path_at, n, ev);

	__u64 groups;
	__u64 mask = io->mask;
	if (c->side == GT_SIDE_SERVER) {
		groups = GT_GROUP_SERVER;
		__u64 t1 = gt_prof_begin();
		gt_route_key_from(&sc->route_key, ev, io->role);
		__u64 *rg = bpf_map_lookup_elem(&gt_routes, &sc->route_key);
		if (rg)
			groups |= *rg;
		gt_prof_end(GT_PROF_ROUTE, t1);
	} else {
		groups = GT_GROUP_HTTP_CLIENT;
	}
	ev->groups = groups;
	if (!(gt_prof_skip & 8))
		gt_count_groups(groups, mask);
	if (!(groups & mask) && !(io->cfg_flags & GT_CFG_NO_GATE)) {
		c->skip_ring |= bit;
		d->phase = GT_PH_SKIP;
		gt_stat_add(GT_STAT_SKIPPED_BYTES, avail);
		return -1;
	}
	d->scan_rollout = (groups & GT_GROUP_ROLLOUT) && (io->mask & GT_GROUP_ROLLOUT) &&
			  (io->cfg_flags & GT_CFG_ROLLOUT_IDS);
	io->hdr_first = 1;
	gt_prof_end(GT_PROF_START_REQ, t0);
	return gt_headers(c, io, ubuf, avail);
}

static __always_inline int gt_start_response(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u64 ubuf,
					     __u32 avail, __u16 status)
{
	gt_reset_dir(d, io->now);
	if (status >= 100 && status < 200 && status != 101) {
		// Interim (100 Continue): parse past its header block, keep waiting
		// for the final response of the same request.
		c->resp_status = status;
		io->hdr_first = 1;
		return gt_headers(c, io, ubuf, avail);
	}
	// Even for a gated-off exchange: the next request's handler task may be
	// born from this response's context (keep-alive), and must not inherit
	// this request's root.
	if (c->side == GT_SIDE_SERVER) {
		c->msg_ubuf = ubuf;
		gt_py_note(c, io);
	}
	__u64 idx = c->resp_seq++;
	__u64 bit = 1ULL << (idx & 63);
	if (idx >= c->req_seq || (c->skip_ring & bit) || !(c->emitted_ring & bit)) {
		// Gated off, or its request was never seen (attached mid-exchange).
		if (idx >= c->req_seq)
			c->resp_seq = c->req_seq;
		d->phase = GT_PH_SKIP;
		gt_stat_add(GT_STAT_SKIPPED_BYTES, avail);
		return -1;
	}
	c->resp_status = status;
	c->resp_flags = 0;
	io->hdr_first = 1;
	return gt_headers(c, io, ubuf, avail);
}

// Follows chunked framing from off. Returns the new offset, or -1 when
// framing was lost.
__noinline int gt_chunks(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 off, __u32 len)
{
	if (!c || !io)
		return -1;
	struct gt_dir *d = &c->dir[io->dir & 1];
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	sc->loops.chunk_off = off;
	sc->loops.chunk_err = 0;
	int k;
	gt_for(k, 0, GT_MAX_CHUNKS_PER_BUF)
	{
		__u32 o = sc->loops.chunk_off;
		if (o >= len || d->phase != GT_PH_CHUNKED)
			break;
		__u32 avail = len - o;
		if (d->chunk_phase != GT_CH_SIZE) {
			__u64 take = d->remaining < avail ? d->remaining : avail;
			d->remaining -= take;
			sc->loops.chunk_off = o + take;
			if (d->chunk_phase == GT_CH_DATA)
				d->body_len += take;
			if (d->remaining)
				continue;
			if (d->chunk_phase == GT_CH_LAST) {
				gt_finish(c, d, io, GT_F_CHUNKED);
				break;
			}
			d->body_len -= 2; // the CRLF after each chunk's data is framing
			d->chunk_phase = GT_CH_SIZE;
			continue;
		}
		// The chunk-size line, parsed with its state in map memory.
		__u32 n = avail < GT_PEEK ? avail : GT_PEEK;
		if (bpf_probe_read_user(sc->loops.line, n & 31, (void *)(ubuf + o)))
			return -1;
		sc->loops.csize = 0;
		sc->loops.cnl = -1;
		sc->loops.cdigits = 0;
		sc->loops.cext = 0;
		int j;
		gt_for(j, 0, GT_PEEK)
		{
			if (j >= n)
				break;
			__u8 ch = sc->loops.line[j & (GT_PEEK - 1)];
			if (ch == '\n') {
				sc->loops.cnl = j;
				break;
			}
			if (sc->loops.cext || ch == '\r')
				continue;
			if (ch == ';') {
				sc->loops.cext = 1;
				continue;
			}
			__u8 lc = ch | 0x20;
			__u8 v;
			if (ch >= '0' && ch <= '9')
				v = ch - '0';
			else if (lc >= 'a' && lc <= 'f')
				v = lc - 'a' + 10;
			else
				break;
			sc->loops.csize = (sc->loops.csize << 4) | v;
			sc->loops.cdigits++;
		}
		__s32 nl = sc->loops.cnl;
		__u64 size = sc->loops.csize;
		if (nl < 0 || !sc->loops.cdigits) {
			// A size line split across syscalls, or not chunked framing
			// after all: framing is lost here. The caller looks for a
			// message start at this offset.
			gt_stat_add(GT_STAT_PARSE_ERROR, 1);
			sc->loops.chunk_err = 1;
			return sc->loops.chunk_off;
		}
		sc->loops.chunk_off = o + nl + 1;
		if (size == 0) {
			d->chunk_phase = GT_CH_LAST;
			d->remaining = 2; // the final CRLF (trailers are not used by Gym's servers)
		} else {
			d->chunk_phase = GT_CH_DATA;
			d->remaining = size + 2;
		}
	}
	return sc->loops.chunk_off;
}

// Reads the first bytes of a buffer that should start a message into
// sc->peek, after any bytes kept from the previous syscall of the same
// direction. Returns their count, or 0 when the buffer was too short to tell
// and was kept (Go's net/http server reads a single byte ahead after each
// request, so a request's first byte can arrive alone).
__noinline int gt_peek_start(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 avail)
{
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc || !c || !io)
		return -1;
	__u32 pl = (c->partial_len && c->partial_dir == io->dir) ? c->partial_len : 0;
	c->partial_len = 0;
	if (pl > sizeof(c->partial))
		pl = sizeof(c->partial);
	__builtin_memcpy(sc->peek, c->partial, sizeof(c->partial));
	__u32 room = GT_PEEK - pl;
	__u32 got = avail < room ? avail : room;
	if (got == 0 || got > GT_PEEK)
		return -1;
	if (bpf_probe_read_user(&sc->peek[pl & 15], got, (void *)ubuf))
		return -1;
	__u32 n = pl + got;
	if (pl || avail >= 12)
		return n;
	// Fewer bytes than a start line needs: keep them if they could be its
	// head (upper-case letters, or a prefix of "HTTP/1."). A wrong guess
	// costs nothing: the next syscall completes a start or they are dropped.
	const char http[] = "HTTP/1.";
	sc->peek_flags = 0;
	int j;
	gt_for(j, 0, 11)
	{
		if (j >= n)
			break;
		__u8 ch = sc->peek[j & 31];
		if (ch < 'A' || ch > 'Z')
			sc->peek_flags |= 1;
		if (j < 7 && ch != (__u8)http[j & 7])
			sc->peek_flags |= 2;
	}
	if ((sc->peek_flags & 3) == 3)
		return n; // not a start: let the caller count it
	__builtin_memcpy(c->partial, sc->peek, sizeof(c->partial));
	c->partial_len = n;
	c->partial_dir = io->dir;
	return 0;
}

// One step of the state machine at offset off of a user buffer: consumes a
// message start, a header block, or body bytes. Returns bytes consumed, or -1
// when the rest of the buffer is to be ignored.
__noinline int gt_step(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 off, __u32 len)
{
	if (!c || !io || off >= len)
		return -1;
	struct gt_dir *d = &c->dir[io->dir & 1];
	__u32 avail = len - off;
	switch (d->phase) {
	case GT_PH_IDLE:
	case GT_PH_SKIP: {
		struct gt_scratch *sc = gt_get_scratch();
		if (!sc)
			return -1;
		__u32 pl = (c->partial_len && c->partial_dir == io->dir) ? c->partial_len : 0;
		__u64 t0 = gt_prof_begin();
		int n = gt_peek_start(c, io, ubuf + off, avail);
		if (n <= 0)
			return -1; // read error, or kept as a partial start
		__u16 arg = 0;
		__u8 mlen = 0;
		int kind = gt_classify(sc->peek, n, &arg, &mlen);
		gt_prof_end(GT_PROF_PEEK, t0);
		if (kind == GT_START_NONE) {
			if (d->phase == GT_PH_IDLE) {
				// Not at a message start: a connection picked up mid-body,
				// or not HTTP at all. Wait for the next start.
				gt_stat_add(c->started ? GT_STAT_PARSE_ERROR : GT_STAT_NOT_HTTP, 1);
				d->phase = GT_PH_SKIP;
			}
			return -1;
		}
		if (c->side == GT_SIDE_UNKNOWN) {
			int req = kind == GT_START_REQUEST;
			__u8 side = (req == (io->dir == 0)) ? GT_SIDE_SERVER : GT_SIDE_CLIENT;
			// The side decides which groups are possible at all.
			__u64 possible = side == GT_SIDE_SERVER ? io->server_possible
								: io->client_possible;
			if (!(possible & io->mask) && !(io->cfg_flags & GT_CFG_NO_GATE))
				return -1;
			c->side = side;
			c->dir[0].is_req = side == GT_SIDE_SERVER;
			c->dir[1].is_req = side == GT_SIDE_CLIENT;
			if (c->started)
				gt_stat_add(GT_STAT_RESYNC, 1);
#ifdef GT_INJECT
			if (side == GT_SIDE_CLIENT)
				gt_inject_pair(c, GT_PAIR_ADD);
#endif
		}
		if ((kind == GT_START_REQUEST) != d->is_req) {
			d->phase = GT_PH_SKIP;
			return -1;
		}
		int r;
		if (kind == GT_START_REQUEST) {
			// The request target, in this buffer (the method may have come
			// before, in the kept partial bytes).
			int at = (int)mlen + 1 - (int)pl;
			r = gt_start_request(c, d, io, ubuf + off, avail, arg, at < 0 ? 0 : at);
		}
		else
		{
			__u64 t1 = gt_prof_begin();
			r = gt_start_response(c, d, io, ubuf + off, avail, arg);
			gt_prof_end(GT_PROF_START_RESP, t1);
		}
		c->started = 1;
		return r;
	}
	case GT_PH_HEADERS:
		io->hdr_first = 0;
		return gt_headers(c, io, ubuf + off, avail);
	case GT_PH_BODY_CL: {
		__u64 take = d->remaining < avail ? d->remaining : avail;
		if (d->scan_rollout && d->is_req) {
			__u64 t0 = gt_prof_begin();
			gt_scan_rollout(&c->req, ubuf + off, take);
			gt_prof_end(GT_PROF_ROLLOUT, t0);
		}
		d->remaining -= take;
		d->body_len += take;
		if (!d->remaining)
			gt_finish(c, d, io, 0);
		return take;
	}
	case GT_PH_CHUNKED: {
		int o = gt_chunks(c, io, ubuf, off, len);
		struct gt_scratch *sc = gt_get_scratch();
		if (o < 0 || !sc) {
			gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
			d->phase = GT_PH_SKIP;
			return -1;
		}
		if (sc->loops.chunk_err) {
			gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
			d->phase = GT_PH_SKIP;
			// Zero consumed: the next step looks for a start right here.
			return (__u32)o > off ? o - off : 0;
		}
		return o - off;
	}
	case GT_PH_BODY_EOF:
		d->body_len += avail;
		return -1;
	}
	return -1;
}

// Runs the state machine over one contiguous user buffer; a buffer may hold
// the end of one message and the start of the next (pipelining, keep-alive).
__noinline int gt_process(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 len)
{
	if (!c || !io)
		return 0;
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	sc->loops.proc_off = 0;
	sc->loops.steps = 0;
	int m;
	gt_for(m, 0, GT_MAX_STEPS_PER_BUF)
	{
		__u32 off = sc->loops.proc_off;
		if (off >= len || c->kind != GT_CONN_HTTP)
			break;
		int r = gt_step(c, io, ubuf, off, len);
		if (r < 0)
			break;
		// gt_step may have used the scratch: look it up again.
		sc = gt_get_scratch();
		if (!sc)
			break;
		sc->loops.proc_off = off + r;
		sc->loops.steps = m + 1;
	}
	// Out of steps mid-body (hundreds of chunks in one buffer): the rest of
	// the buffer was not followed, so framing is lost rather than wrong.
	sc = gt_get_scratch();
	if (sc && sc->loops.steps >= GT_MAX_STEPS_PER_BUF && sc->loops.proc_off < len) {
		struct gt_dir *d = &c->dir[io->dir & 1];
		if (d->phase == GT_PH_CHUNKED || d->phase == GT_PH_HEADERS) {
			gt_stat_add(GT_STAT_PARSE_ERROR, 1);
			gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
			d->phase = GT_PH_SKIP;
		}
	}
	return 0;
}

// The gate changed since the connection was last seen: whatever was
// mid-flight is resynchronised at its next message start.
static __always_inline void gt_conn_check_gen(struct gt_conn *c, __u32 gen)
{
	if (c->cfg_gen == gen)
		return;
	c->cfg_gen = gen;
	if (c->dir[0].phase != GT_PH_IDLE)
		c->dir[0].phase = GT_PH_SKIP;
	if (c->dir[1].phase != GT_PH_IDLE)
		c->dir[1].phase = GT_PH_SKIP;
}

static __always_inline struct gt_conn *gt_conn_get(struct gt_io *io, int create, long ret)
{
	struct gt_conn_key key = {.tgid = io->tgid, .fd = io->fd};
	struct gt_conn *c = bpf_map_lookup_elem(&gt_conns, &key);
	if (c) {
		gt_conn_check_gen(c, io->cfg_gen);
		return c;
	}
	if (!create)
		return 0;
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	struct gt_conn *t = &sc->conn;
	__builtin_memset(t, 0, sizeof(*t));
	t->cfg_gen = io->cfg_gen;
	struct sock *sk = 0;
	if (gt_fd_tcp_tuple(io->fd, &t->tuple, &sk)) {
		t->kind = GT_CONN_HTTP;
		t->fresh = sk && gt_conn_fresh(sk, io->dir, ret);
		if (t->fresh)
			gt_stat_add(GT_STAT_FRESH, 1);
		t->conn_id = __sync_fetch_and_add(&gt_next_conn_id, 1) + 1;
	} else {
		t->kind = GT_CONN_IGNORE;
	}
	if (bpf_map_update_elem(&gt_conns, &key, t, BPF_NOEXIST) && bpf_map_update_elem(&gt_conns, &key, t, BPF_ANY)) {
		gt_stat_add(GT_STAT_CONN_FULL, 1);
		return 0;
	}
	return bpf_map_lookup_elem(&gt_conns, &key);
}

static __always_inline int gt_in_flight(struct gt_conn *c)
{
	return c->emitted_ring && (c->req_seq != c->resp_seq || c->dir[0].phase > GT_PH_IDLE ||
				   c->dir[1].phase > GT_PH_IDLE);
}

static __always_inline int gt_on_io_target(__u64 id, long ret, __u8 dir, int kind)
{
	__u32 tgid = id >> 32;
	struct gt_config *cfg = gt_cfg();
	if (!cfg)
		return 0;
	struct gt_target *tg = bpf_map_lookup_elem(&gt_targets, &tgid);
	__u8 role = tg ? tg->role : GT_ROLE_UNKNOWN;
	__u64 possible = cfg->server_possible[role & 7] | cfg->client_possible;
	if (!(possible & cfg->mask) && !(cfg->flags & GT_CFG_NO_GATE))
		return 0;

	unsigned long a0, a1, a2;
	gt_syscall_args(&a0, &a1, &a2);
	struct gt_io io = {
		.now = bpf_ktime_get_ns(),
		.tgid = tgid,
		.tid = (__u32)id,
		.fd = (__s32)a0,
		.dir = dir,
		.role = role,
		.cfg_flags = cfg->flags,
		.cfg_gen = cfg->generation,
		.mask = cfg->mask,
		.server_possible = cfg->server_possible[role & 7],
		.client_possible = cfg->client_possible,
	};

	if (ret <= 0) {
		if (ret == -GT_EAGAIN || ret == -GT_EINTR || ret == -GT_EINPROGRESS)
			return 0;
		struct gt_conn *c = gt_conn_get(&io, 0, 0);
		if (!c || c->kind != GT_CONN_HTTP)
			return 0;
		if (ret == 0 && dir == 0) {
			// Peer closed. A body delimited by the connection ends here.
			struct gt_dir *d = &c->dir[0];
			if (d->phase == GT_PH_BODY_EOF) {
				gt_finish(c, d, &io, GT_F_END_BY_CLOSE);
			} else if (gt_in_flight(c)) {
				gt_emit_close(c, &io, 0);
				c->emitted_ring = 0;
			}
		} else if (ret < 0 && gt_in_flight(c)) {
			gt_emit_close(c, &io, GT_F_CONN_ERROR);
			c->emitted_ring = 0;
			c->dir[0].phase = GT_PH_SKIP;
			c->dir[1].phase = GT_PH_SKIP;
		}
		return 0;
	}

	__u64 t0 = gt_prof_begin();
	struct gt_conn *c = gt_conn_get(&io, 1, ret);
	gt_prof_end(GT_PROF_CONN, t0);
	if (!c || c->kind != GT_CONN_HTTP)
		return 0;
	// Ciphertext of an SSL* the TLS probes follow: linked, then ignored.
	if (dir == 1 && !c->started && gt_tls_link_write(tgid, io.tid, io.fd, io.now, c, kind, a1))
		return 0;
	if (c->side == GT_SIDE_SERVER && !(cfg->server_possible[role & 7] & cfg->mask) && !(cfg->flags & GT_CFG_NO_GATE))
		return 0;
	if (c->side == GT_SIDE_CLIENT && !(cfg->client_possible & cfg->mask) && !(cfg->flags & GT_CFG_NO_GATE))
		return 0;

	if (kind == GT_IO_PLAIN) {
		t0 = gt_prof_begin();
		gt_process(c, &io, a1, (__u32)ret);
		gt_prof_end(GT_PROF_PROCESS, t0);
		return 0;
	}
	__u64 iov = a1, cnt = a2;
	if (kind == GT_IO_MSG) {
		struct gt_msghdr mh = {};
		if (bpf_probe_read_user(&mh, sizeof(mh), (void *)a1))
			return 0;
		iov = mh.iov;
		cnt = mh.iovlen;
	}
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	sc->loops.iov_left = ret;
	int i;
	gt_for(i, 0, 4)
	{
		if (i >= cnt)
			break;
		struct gt_iovec v = {};
		if (bpf_probe_read_user(&v, sizeof(v), (void *)(iov + i * sizeof(v))))
			break;
		sc = gt_get_scratch();
		if (!sc || !sc->loops.iov_left)
			break;
		__u64 left = sc->loops.iov_left;
		__u64 seg = v.len < left ? v.len : left;
		sc->loops.iov_left = left - seg;
		gt_process(c, &io, v.base, (__u32)seg);
	}
	return 0;
}

static __always_inline int gt_on_io(long ret, __u8 dir, int kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!gt_is_target(id >> 32))
		return 0;
	__u64 t0 = gt_prof_begin();
	gt_on_io_target(id, ret, dir, kind);
	gt_prof_end(GT_PROF_IO, t0);
	return 0;
}

#ifndef GT_NO_PROGRAMS // verifier tests include the helpers alone
SEC("tracepoint/syscalls/sys_exit_read")
int gt_exit_read(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_PLAIN); }

SEC("tracepoint/syscalls/sys_exit_recvfrom")
int gt_exit_recvfrom(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_PLAIN); }

SEC("tracepoint/syscalls/sys_exit_readv")
int gt_exit_readv(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_IOV); }

SEC("tracepoint/syscalls/sys_exit_recvmsg")
int gt_exit_recvmsg(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_MSG); }

SEC("tracepoint/syscalls/sys_exit_write")
int gt_exit_write(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_PLAIN); }

SEC("tracepoint/syscalls/sys_exit_sendto")
int gt_exit_sendto(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_PLAIN); }

SEC("tracepoint/syscalls/sys_exit_writev")
int gt_exit_writev(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_IOV); }

SEC("tracepoint/syscalls/sys_exit_sendmsg")
int gt_exit_sendmsg(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_MSG); }

SEC("tracepoint/syscalls/sys_enter_close")
int gt_enter_close(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!gt_is_target(tgid))
		return 0;
	struct gt_conn_key key = {.tgid = tgid, .fd = (__s32)ctx->args[0]};
	struct gt_conn *c = bpf_map_lookup_elem(&gt_conns, &key);
	if (!c)
		return 0;
	struct gt_config *cfg = gt_cfg();
	struct gt_target *tg = bpf_map_lookup_elem(&gt_targets, &tgid);
	if (c->kind == GT_CONN_HTTP && cfg) {
		struct gt_io io = {
			.now = bpf_ktime_get_ns(),
			.tgid = tgid,
			.tid = (__u32)id,
			.fd = key.fd,
			.role = tg ? tg->role : GT_ROLE_UNKNOWN,
			.cfg_gen = cfg->generation,
		};
		// Our own side closing ends a body delimited by the connection
		// (a server that writes a response without framing, then closes).
		struct gt_dir *d = &c->dir[1];
		if (d->phase == GT_PH_BODY_EOF) {
			io.dir = 1;
			gt_finish(c, d, &io, GT_F_END_BY_CLOSE);
		}
		d = &c->dir[0];
		if (d->phase == GT_PH_BODY_EOF) {
			gt_finish(c, d, &io, GT_F_END_BY_CLOSE);
		} else if (gt_in_flight(c)) {
			gt_emit_close(c, &io, 0);
		}
#ifdef GT_INJECT
		if (c->side == GT_SIDE_CLIENT)
			gt_inject_pair(c, GT_PAIR_DEL);
#endif
	}
	bpf_map_delete_elem(&gt_conns, &key);
	return 0;
}
#endif
