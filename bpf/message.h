// The HTTP/1.x message state machine proper: message starts, chunked bodies
// (chunked.h), one step over a user buffer, and a whole buffer. Included by
// bpf/syscalls.h.
#pragma once

// The parser could not follow some of this direction's bytes: a message start
// may have gone unseen, so this side's count of requests on the connection
// may no longer match the peer's (GT_GAP_FRAMING, for good). Userspace then
// pairs the two ends by stream position only (internal/spans join.go).
static __always_inline void gt_framing_lost(struct gt_conn *c, struct gt_dir *d)
{
	if (d->is_req)
		c->gap |= GT_GAP_FRAMING;
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
	d->scan_reward = 0;
	d->scan_genai = 0;
	d->size_part = 0;
	d->remaining = 0;
	d->body_len = 0;
	d->start_ns = now;
}

// A request line starts at ubuf. Decides the gate for the whole exchange.
static __always_inline int gt_start_request(struct gt_conn *c, struct gt_dir *d, struct gt_io *io, __u64 ubuf,
					    __u32 avail, __u8 method, __u8 path_at)
{
	__u64 idx = c->req_seq++;
	__u64 bit = 1ULL << (idx & 63);
	c->resp_given_up = 0;
	c->req_late = 0;
	c->skip_ring &= ~bit;
	c->emitted_ring &= ~bit;
	c->reward_ring &= ~bit;
	c->genai_ring &= ~bit;
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
	// Where the message starts in its TCP stream, for the exact pairing of
	// the two ends' records (struct http_event stream_seq). Modulo 2^32, so
	// a start whose first bytes were kept from the previous syscall
	// (msg_off "negative") is placed right too.
	if (c->sk && !c->tls && io->ret) {
		ev->stream_seq = gt_stream_seq((struct sock *)c->sk, io->dir) - io->ret + io->msg_off;
		ev->stream_ok = 1;
	}
	c->msg_ubuf = ubuf;
	if (!(gt_prof_skip & 4))
		gt_py_note(c, io);
	// A call whose cause's record is still waiting to be written late.
	if (c->side == GT_SIDE_CLIENT && ev->cause_conn)
		gt_late_for_call(ev->cause_conn, ev->cause_seq);
	__u64 t0 = gt_prof_begin();

	// The path is needed before the gate can decide (routes pick gym.* groups);
	// it is read into the per-CPU scratch, never into the ring buffer, so a
	// gated-off request copies nothing out.
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	// The same bytes as the injection scan of this very write read, when it
	// is ours: keep that scan; anyone else's is void once buf changes.
	if (sc->reuse_id != gt_io_id(io) || sc->reuse_ubuf != ubuf)
		sc->reuse_id = 0;
	__u32 n = avail > GT_PATH_MAX + 16 ? GT_PATH_MAX + 16 : avail;
	if (sc->pre_id != gt_io_id(io) || sc->pre_ubuf != ubuf || sc->pre_n < n) {
		sc->pre_id = 0;
		if (bpf_probe_read_user(sc->buf, n & 0xff, (void *)ubuf))
			return -1;
	}
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
	// A /verify this server answers: its response body is scanned for the
	// reward (groups come from the route table on the server side only).
	if ((groups & GT_GROUP_VERIFY) && (io->mask & GT_GROUP_VERIFY) && (io->cfg_flags & GT_CFG_REWARD))
		c->reward_ring |= bit;
	// A model call this server answers, or a model server's own call
	// upstream (a CLIENT request: gt_genai_begin decides): its bodies are walked for model names and token
	// counts (bpf/http_genai.h), for gym.model.* spans and the rollout's
	// totals, or for the upstream CLIENT span. The route ("/v1/" then
	// chat/completions, responses or messages) names the dialect.
	if ((groups & (GT_GROUP_MODEL_CALL | GT_GROUP_HTTP_CLIENT)) &&
	    (io->mask & (GT_GROUP_MODEL_CALL | GT_GROUP_ROLLOUT)) && (io->cfg_flags & GT_CFG_GENAI))
		gt_genai_begin(c, io, idx, groups);
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
	// Its request's record found no room when it ended: one more try, now,
	// before the response's (req still holds it unless a pipelined next
	// request has begun).
	if (c->req_late && c->req.seq == idx && idx < c->req_seq && !(c->skip_ring & bit))
		gt_emit_late_request(c);
	if (idx >= c->req_seq || (c->skip_ring & bit) || !(c->emitted_ring & bit)) {
		// Gated off, or its request was never seen: attached mid-exchange,
		// or its start went unseen. Then this side has counted one request
		// fewer than the peer, for good (GT_GAP_FRAMING).
		if (idx >= c->req_seq) {
			c->resp_seq = c->req_seq;
			// Unless it answers a request whose response was given up
			// at a gap in this direction (gt_pos_check).
			if (!c->resp_given_up)
				c->gap |= GT_GAP_FRAMING;
		}
		d->phase = GT_PH_SKIP;
		gt_stat_add(GT_STAT_SKIPPED_BYTES, avail);
		return -1;
	}
	c->resp_status = status;
	c->resp_flags = 0;
	// Only a success carries a reward; an error answer is not a miss.
	d->scan_reward = ((c->reward_ring >> (idx & 63)) & 1) && status >= 200 && status < 300;
	d->scan_genai = ((c->genai_ring >> (idx & 63)) & 1) && status >= 200 && status < 300;
	io->hdr_first = 1;
	return gt_headers(c, io, ubuf, avail);
}

#include "chunked.h" // gt_chunks: chunked bodies

// Reads the first bytes of a buffer that should start a message into
// sc->peek, after any bytes kept from the previous syscall of the same
// direction. Returns their count, or 0 when the buffer was too short to tell
// and was kept (Go's net/http server reads a single byte ahead after each
// request, so a request's first byte can arrive alone).
GT_GLOBAL int gt_peek_start(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 avail)
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
	__u64 id = gt_io_id(io);
	// Not over injection's scan of this very write (sys_enter), which the
	// header parse reuses whole.
	if (!pl && c->dir[io->dir & 1].phase == GT_PH_IDLE && !(sc->reuse_id == id && sc->reuse_ubuf == ubuf)) {
		// Where a message is expected: one read of the header block's
		// first window serves the start line, the path and the header scan
		// (struct gt_scratch pre_*). A buffer in GT_PH_SKIP (a gated-off
		// body, mostly) keeps the small read.
		__u32 pn = avail < GT_HDR_FIRST ? avail : GT_HDR_FIRST;
		if (pn == 0 || pn > GT_HDR_FIRST || bpf_probe_read_user(sc->buf, pn, (void *)ubuf))
			return -1;
		__builtin_memcpy(sc->peek, sc->buf, GT_PEEK);
		sc->reuse_id = 0;
		sc->pre_id = id;
		sc->pre_ubuf = ubuf;
		sc->pre_n = pn;
	} else if (gt_mask(got, 31), bpf_probe_read_user(&sc->peek[pl & 15], got, (void *)ubuf)) {
		return -1;
	}
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
GT_K510_CI(gt_peek_start, (__u64 ubuf, __u32 avail), -1, c, io, ubuf, avail)
#ifdef GT_K510
#define gt_peek_start(c, io, ...) gt_peek_start_k510(__VA_ARGS__)
#endif

// One step of the state machine at offset off of a user buffer: consumes a
// message start, a header block, or body bytes. Returns bytes consumed, or -1
// when the rest of the buffer is to be ignored.
GT_GLOBAL int gt_step(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 off, __u32 len)
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
			// The message began pl bytes before this buffer when its first
			// bytes were kept from the previous syscall.
			io->msg_off = io->seg_off + off - pl;
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
		__u16 extra = 0;
		if (d->scan_rollout && d->is_req) {
			__u64 t0 = gt_prof_begin();
			gt_scan_rollout(&c->req, ubuf + off, take);
			gt_prof_end(GT_PROF_ROLLOUT, t0);
		} else if (d->scan_reward && take == d->remaining) {
			// The buffer that ends the body: the reward is near its end.
			__u64 t0 = gt_prof_begin();
			extra = gt_scan_reward(ubuf + off, take);
			gt_prof_end(GT_PROF_REWARD, t0);
		} else if (d->scan_genai) {
			gt_scan_genai(c->conn_id, io->dir, ubuf + off, take);
			if (take == d->remaining)
				gt_genai_end(c, io, io->dir); // before the record it belongs to
		}
		d->remaining -= take;
		d->body_len += take;
		if (!d->remaining)
			gt_finish(c, d, io, extra);
		return take;
	}
	case GT_PH_CHUNKED: {
		int o = gt_chunks(c, io, ubuf, off, len);
		struct gt_scratch *sc = gt_get_scratch();
		if (o >= 0 && sc && !sc->loops.chunk_err) {
			if (sc->loops.ga_len)
				gt_scan_genai(c->conn_id, io->dir, sc->loops.ga_ubuf, sc->loops.ga_len);
			return o - off;
		}
		// A chunk the parser cannot follow: the rest of the buffer is not
		// followed (-1), or, at a chunk error, zero consumed and the next
		// step looks for a start right here. One gt_finish for both: two
		// inlined copies, each with c and d live after it, took gt_step's
		// frame a slot past the stack budget (docs/kernels.md).
		int r = (o < 0 || !sc) ? -1 : (__u32)o > off ? o - off : 0;
		gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
		d->phase = GT_PH_SKIP;
		gt_framing_lost(c, d);
		return r;
	}
	case GT_PH_BODY_EOF:
		d->body_len += avail;
		return -1;
	}
	return -1;
}
GT_K510_CI(gt_step, (__u64 ubuf, __u32 off, __u32 len), -1, c, io, ubuf, off, len)
#ifdef GT_K510
#define gt_step(c, io, ...) gt_step_k510(__VA_ARGS__)
#endif

// Runs the state machine over one contiguous user buffer; a buffer may hold
// the end of one message and the start of the next (pipelining, keep-alive).
GT_GLOBAL int gt_process(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 len)
{
	if (!c || !io)
		return 0;
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	sc->loops.proc_off = 0;
	sc->loops.steps = 0;
	sc->pre_id = 0; // nothing read in an earlier run is trusted
	int m;
	gt_for(m, 0, GT_MAX_STEPS_PER_BUF)
	{
		__u32 off = sc->loops.proc_off;
		if (off >= len || c->kind != GT_CONN_HTTP)
			break;
		int r = gt_step(c, io, ubuf, off, len);
		if (r < 0) {
			// The rest of the buffer is not followed. That is the design
			// in a body delimited by the connection's end, and when a
			// message start's first bytes were kept for the next syscall;
			// anywhere else a start may hide in it.
			struct gt_dir *d = &c->dir[io->dir & 1];
			if (d->phase != GT_PH_BODY_EOF && !(c->partial_len && c->partial_dir == io->dir))
				gt_framing_lost(c, d);
			break;
		}
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
			if (d->scan_genai) {
				// Its walk ends unsure: counted as incomplete, not lost.
				gt_genai_cut(c->conn_id, io->dir);
				gt_genai_end(c, io, io->dir);
			}
			gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
			d->phase = GT_PH_SKIP;
		}
		// d again from c and io, which are on the stack anyway: kept
		// across gt_finish it took a slot of its own, and the bounded
		// build's frame past 6.1's 32 bytes (docs/kernels.md).
		asm volatile("" ::: "memory");
		gt_framing_lost(c, &c->dir[io->dir & 1]);
	}
	return 0;
}
GT_K510_CI(gt_process, (__u64 ubuf, __u32 len), 0, c, io, ubuf, len)
#ifdef GT_K510
#define gt_process(c, io, ...) gt_process_k510(__VA_ARGS__)
#endif

// Bytes a vectored syscall moved beyond the iovec segments the programs walk
// (GT_MAX_IOV_SEGS): a Content-Length body's bytes are counted without being
// read (large bodies written from many buffers); anything else there may
// hold a message start the parser cannot see, so framing is lost there.
GT_GLOBAL int gt_iov_rest(struct gt_conn *c, struct gt_io *io, __u64 left)
{
	if (!c || !io)
		return 0;
	struct gt_dir *d = &c->dir[io->dir & 1];
	if (d->scan_genai)
		gt_genai_cut(c->conn_id, io->dir); // bytes of its body not walked
	if (d->phase == GT_PH_BODY_EOF) {
		d->body_len += left;
		return 0;
	}
	if (d->phase == GT_PH_BODY_CL) {
		__u64 take = d->remaining < left ? d->remaining : left;
		d->remaining -= take;
		d->body_len += take;
		left -= take;
		if (!d->remaining)
			gt_finish(c, d, io, 0); // a reward in the unread bytes is not read
		if (!left)
			return 0;
	} else if (d->phase == GT_PH_HEADERS || d->phase == GT_PH_CHUNKED) {
		gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
	}
	gt_stat_add(GT_STAT_PARSE_ERROR, 1);
	d->phase = GT_PH_SKIP;
	gt_framing_lost(c, d);
	return 0;
}
GT_K510_CI(gt_iov_rest, (__u64 left), 0, c, io, left)
#ifdef GT_K510
#define gt_iov_rest(c, io, ...) gt_iov_rest_k510(__VA_ARGS__)
#endif
