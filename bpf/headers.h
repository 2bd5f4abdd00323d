// The header block of a message: the scan for the headers gymtrace reads
// (framing, Host, traceparent, ...) and the choice of body framing once it
// ends. Included by bpf/syscalls.h.
#pragma once

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

// Parses (part of) a header block from the user buffer, in three functions
// of their own (prepare, read, finish) around gt_scan_headers, called one
// after another by gt_headers. As one function its frame, under gt_step's and
// over gt_scan_headers', took the syscall programs' combined stack past the
// verifier's 512 bytes on kernels without BPF private stacks. What the parts
// share lives in the per-CPU scratch (struct gt_hdr_run).
//
// gt_headers_prep: the carried line, the first read's size, and whether
// the bytes are in the scratch already. 0 to go on, -1 to stop (return -1).
GT_GLOBAL int gt_headers_prep(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 avail)
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
	__u32 nr = max > GT_HDR_FIRST ? GT_HDR_FIRST : max;
	// The start's first window, read by gt_peek_start in this very run.
	int pre = first && !carry && sc->pre_id == gt_io_id(io) && sc->pre_ubuf == ubuf &&
		  sc->pre_n == nr;
	sc->pre_id = 0;
	// A client request injection looked at in this syscall's sys_enter: the
	// same read and scan of the same bytes (its whole head, which the check
	// required), unless anything else used the scratch since.
	int reuse = first && !carry && d->is_req && io->scan_gen && sc->reuse_gen == io->scan_gen &&
		    sc->reuse_id == gt_io_id(io) && sc->reuse_ubuf == ubuf &&
		    sc->reuse_max == max && sc->reuse_n && sc->reuse_n <= max && sc->scan.end >= 0;
	sc->reuse_id = 0;
	io->scan_gen = 0;
	sc->hr.carry = carry;
	sc->hr.max = max;
	sc->hr.nr = nr;
	sc->hr.n = 0;
	sc->hr.pre = pre;
	sc->hr.reuse = reuse;
	if (reuse) {
		nr = sc->reuse_n;
		if (nr > GT_SCRATCH - 128)
			return -1;
		sc->hr.nr = nr;
		sc->hr.n = nr;
		gt_stat_add(GT_STAT_SCAN_REUSED, 1);
	}
	return 0;
}
GT_K510_CI(gt_headers_prep, (__u64 ubuf, __u32 avail), -1, c, io, ubuf, avail)
#ifdef GT_K510
#define gt_headers_prep(c, io, ...) gt_headers_prep_k510(__VA_ARGS__)
#endif

// gt_headers_read: attempt 0 reads the first GT_HDR_FIRST bytes (or takes
// them from the scratch), attempt 1 the rest of the window when the block
// did not end in them. 1: scan sc->buf[0, sc->hr.n); 0: no scan (the block
// ended, or nothing more to read); -1: stop (return -1).
GT_GLOBAL int gt_headers_read(struct gt_conn *c, struct gt_io *io, __u64 ubuf, int attempt)
{
	struct gt_scratch *sc = gt_get_scratch();
	if (!c || !io || !sc)
		return -1;
	if (sc->hr.reuse)
		return 0;
	__u32 nr = sc->hr.nr, carry = sc->hr.carry;
	if (attempt == 1) {
		if (sc->scan.end >= 0 || nr >= sc->hr.max)
			return 0;
		nr = sc->hr.max;
		sc->hr.nr = nr;
	}
	if (nr == 0 || nr > GT_SCRATCH - 128)
		return -1;
#ifdef GT_K510
	// 5.10 learns the bound above on a copy of nr the compiler then
	// reloads from the stack without it ("R2 unbounded memory access"):
	// a mask (a no-op here) bounds the register the read takes.
	gt_mask(nr, GT_SCRATCH - 1);
#endif
	if (attempt == 0 && sc->hr.pre)
		gt_stat_add(GT_STAT_SCAN_PREREAD, 1); // buf holds these bytes already
	else if (bpf_probe_read_user(&sc->buf[carry & 127], nr, (void *)ubuf))
		return -1;
	sc->hr.n = carry + nr;
	// The start line is not a header (gt_start_request copied the path).
	struct gt_dir *d = &c->dir[io->dir & 1];
	gt_scan_begin(sc, io->hdr_first ? 1 : (carry ? 0 : d->mid_line));
	return 1;
}
GT_K510_CI(gt_headers_read, (__u64 ubuf, int attempt), -1, c, io, ubuf, attempt)
#ifdef GT_K510
#define gt_headers_read(c, io, ...) gt_headers_read_k510(__VA_ARGS__)
#endif

// gt_headers_finish: what the scan found, into the connection; the body's
// framing once the block ended. Returns what gt_headers returns.
GT_GLOBAL int gt_headers_finish(struct gt_conn *c, struct gt_io *io, __u32 avail)
{
	if (!c || !io)
		return -1;
	struct gt_dir *d = &c->dir[io->dir & 1];
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	__u32 carry = sc->hr.carry, nr = sc->hr.nr, n = sc->hr.n;
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
		// spans would be dropped, so nothing of the exchange is copied out
		// (unless Gym's metrics, which count every request, want it).
		// Framing is still followed so the connection stays in step.
		if (c->side == GT_SIDE_SERVER && c->req.traceparent[53] == '0' && c->req.traceparent[54] == '0' &&
		    c->req.traceparent[2] == '-' && (io->mask & GT_GROUP_SERVER) &&
		    !(io->cfg_flags & GT_CFG_KEEP_UNSAMPLED)) {
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
GT_K510_CI(gt_headers_finish, (__u32 avail), -1, c, io, avail)
#ifdef GT_K510
#define gt_headers_finish(c, io, ...) gt_headers_finish_k510(__VA_ARGS__)
#endif

// Global (non-static) functions are verified once, on their own, instead of
// once per call site and caller state: that keeps verification linear.
GT_GLOBAL int gt_headers(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 avail)
{
	if (!c || !io)
		return -1;
	__u64 t0 = gt_prof_begin();
	int r = gt_headers_prep(c, io, ubuf, avail);
#pragma unroll
	for (int attempt = 0; attempt < 2 && r == 0; attempt++) {
		int scan = gt_headers_read(c, io, ubuf, attempt);
		if (scan < 0)
			r = -1;
		if (scan <= 0)
			break;
		struct gt_scratch *sc = gt_get_scratch();
		if (!sc) {
			r = -1;
			break;
		}
		__u64 t1 = gt_prof_begin();
		gt_scan_headers(sc, sc->hr.n, c->dir[io->dir & 1].is_req);
		gt_prof_end(GT_PROF_SCAN, t1);
	}
	if (r == 0)
		r = gt_headers_finish(c, io, avail);
	gt_prof_end(GT_PROF_HEADERS, t0);
	return r;
}
GT_K510_CI(gt_headers, (__u64 ubuf, __u32 avail), -1, c, io, ubuf, avail)
#ifdef GT_K510
#define gt_headers(c, io, ...) gt_headers_k510(__VA_ARGS__)
#endif
