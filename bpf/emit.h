// Records to the ring buffer: a message's request or response record, a
// close, and the end of a message. Included by bpf/syscalls.h.
#pragma once

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
	// its headers were parsed; for one that did not, the kernel starts the
	// trace itself, here, in the syscall that completes the request (so
	// before the handler runs), and userspace adopts it. No reader wakeup
	// is needed. Any target's: a process that owns no injectable socket yet
	// (a fresh agent's first /run) opens one in the handler, and a trace
	// userspace published after reading this record would race that call
	// (inject_miss: a rollout's whole first wave went without headers).
	int wake = 0;
	if (c->side == GT_SIDE_SERVER && !(c->req.flags & GT_F_TRACEPARENT) && gt_inject_wanted()) {
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
		// Kept whole in req, to be written later (gt_emit_late_request)
		// if the buffer has room by then; a server's is found again by
		// its handler's calls through gt_late_conns.
		c->req.flags |= gt_tls_ev_flag(c);
		c->req.gap = c->gap | GT_GAP_LATE;
		c->req.end_ns = io->now;
		c->req.body_len = d->body_len;
		c->req_late = 1;
		c->gap |= GT_GAP_LOST;
		struct gt_scratch *sc = (c->side == GT_SIDE_SERVER && !c->tls) ? gt_get_scratch() : 0;
		if (sc) {
			sc->late_id = c->conn_id;
			sc->late_key.tgid = io->tgid;
			sc->late_key.fd = io->fd;
			bpf_map_update_elem(&gt_late_conns, &sc->late_id, &sc->late_key, BPF_ANY);
		}
		return;
	}
	__builtin_memcpy(e, &c->req, sizeof(*e));
	e->flags |= gt_tls_ev_flag(c);
	e->gap = c->gap;
	c->gap &= ~GT_GAP_LOST;
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

// A request whose record found no room when it ended (c->req_late): the
// record, kept whole in req, gets another try at its handler's first calls
// (gt_late_for_call) and at its response's first bytes (gt_start_response).
// A lost request record loses its span and the parent of every call its
// handler made; written before the calls' records, it loses nothing; after
// some, only their parents (userspace leaves them unparented, never under
// another request). A handler that makes no calls (a model's, a resources
// server's) keeps everything, and so does a client: a call's record carries
// its cause. Its times and its data are the request's own; its gap says it
// is late (GT_GAP_LATE). Reports whether it was written.
static __always_inline int gt_emit_late_request(struct gt_conn *c)
{
	c->req_late = 0;
	struct http_event *e = bpf_ringbuf_reserve(&gt_events, sizeof(*e), 0);
	if (!e)
		return 0; // counted already, when the request ended
	__builtin_memcpy(e, &c->req, sizeof(*e));
	gt_submit(e);
	c->emitted_ring |= 1ULL << (c->req.seq & 63);
	gt_stat_add(GT_STAT_REQUEST_LATE, 1);
	struct gt_scratch *sc = c->side == GT_SIDE_SERVER ? gt_get_scratch() : 0;
	if (sc) {
		sc->late_id = c->conn_id; // the key from map memory (struct gt_scratch)
		bpf_map_delete_elem(&gt_late_conns, &sc->late_id);
	}
	return 1;
}

// A call's request starts (its first bytes; gt_start_request): if the
// request that caused it, (conn_id, seq) as the kernel bound it, found no
// room for its record when it ended, write that record now, before the
// call's own, so the call has its parent when its record is read. Scalar
// arguments: verified once, on every kernel (5.10's global functions take
// no pointers).
__noinline int gt_late_for_call(__u64 conn_id, __u64 seq)
{
	struct gt_conn_key *k = bpf_map_lookup_elem(&gt_late_conns, &conn_id);
	if (!k)
		return 0;
	struct gt_conn *pc = bpf_map_lookup_elem(&gt_conns, k);
	if (!pc || pc->conn_id != conn_id || !pc->req_late || pc->req.seq != seq)
		return 0;
	return gt_emit_late_request(pc);
}

static __always_inline void gt_emit_response(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u16 extra)
{
	if (gt_prof_skip & 2)
		return;
	__u64 t0 = gt_prof_begin();
	if (gt_ring_crowded()) {
		// The rest is for request records (gt_shed_bytes): this one is
		// lost as a failed reservation would be, and counted as one too
		// (a loss is a loss to every reader of that counter).
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		gt_stat_add(GT_STAT_RESPONSE_SHED, 1);
		c->gap |= GT_GAP_LOST;
		return;
	}
	// Only the fixed head: a response has no path, host, traceparent or
	// rollout, and a third of the bytes is a third of the cache lines. A
	// reward (gt_scan_reward, in the step that ended the body, so its text
	// is still in the scratch) adds its GT_REWARD_MAX bytes.
	struct gt_scratch *sc = (extra & GT_F_REWARD) ? gt_get_scratch() : 0;
	if (!sc)
		extra &= ~GT_F_REWARD;
	struct http_event *e;
	if (sc)
		e = bpf_ringbuf_reserve(&gt_events, GT_HTTP_EVENT_REWARD, 0);
	else
		e = bpf_ringbuf_reserve(&gt_events, GT_HTTP_EVENT_HEAD, 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		c->gap |= GT_GAP_LOST;
		return;
	}
	__builtin_memset(e, 0, GT_HTTP_EVENT_HEAD);
	if (sc)
		__builtin_memcpy(e->reward, sc->rw.text, GT_REWARD_MAX);
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
		c->gap |= GT_GAP_LOST;
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
	// The responses that ended here, [0, body_len): a request below that
	// whose response record never came had it lost, not cut off by the
	// close (userspace must not call that an error of the server). One
	// mid-message is cut off, unless the responses were given up at a gap
	// (gt_pos_check): those are lost.
	struct gt_dir *rd = c->dir[0].is_req ? &c->dir[1] : &c->dir[0];
	e->body_len = c->resp_seq - (rd->phase != GT_PH_IDLE && !c->resp_given_up && c->resp_seq);
	e->gap = c->gap;
	e->tuple = c->tuple;
	gt_submit(e);
}

// The message in direction d has ended.
static __always_inline void gt_finish(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u16 extra)
{
	if (d->is_req) {
		gt_emit_request(c, d, io);
	} else {
		if (d->scan_reward)
			gt_stat_add((extra & GT_F_REWARD) ? GT_STAT_REWARD_FOUND : GT_STAT_REWARD_MISSED, 1);
		gt_emit_response(c, d, io, extra);
	}
	d->phase = GT_PH_IDLE;
}
