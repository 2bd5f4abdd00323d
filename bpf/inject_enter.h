// traceparent injection, step 1 (bpf/inject.h): at sys_enter of a client's
// write, check the request head and decide the ids. Included by bpf/inject.h.
#pragma once

// Is ubuf[0, len) a whole HTTP/1.x request head with no traceparent? Returns
// the offset just past the request line, or 0. Global, so it is verified
// once on its own.
__noinline int gt_inject_check(__u64 ubuf, __u32 len)
{
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	__u32 max = len > GT_SCRATCH - 128 ? GT_SCRATCH - 128 : len;
	// Most request heads fit in 512 bytes: read that much, and the rest of
	// the window only when the block goes on (a write often carries the
	// body too, which is never needed here).
	__u32 n = max > 512 ? 512 : max;
	sc->reuse_id = 0; // buf is overwritten (see struct gt_scratch)
	if (n < GT_PEEK || bpf_probe_read_user(sc->buf, n, (void *)ubuf))
		return 0;
	__u16 arg = 0;
	__u8 mlen = 0;
	if (gt_classify(sc->buf, n, &arg, &mlen) != GT_START_REQUEST)
		return 0;
#pragma unroll
	for (int attempt = 0; attempt < 2; attempt++) {
		if (attempt == 1) {
			if (sc->scan.end >= 0 || n >= max)
				break;
			n = max;
			if (n > GT_SCRATCH - 128 || bpf_probe_read_user(sc->buf, n, (void *)ubuf))
				return 0;
		}
		gt_scan_begin(sc, 1); // past the request line
		gt_scan_headers(sc, n, 1);
	}
	if (sc->scan.tp_any) {
		gt_inj_stat(GT_INJ_STAT_HAS_TP);
		return 0;
	}
	__u32 le = sc->scan.nl_count ? sc->nl[0] + 1 : 0;
	if (sc->scan.end < 0 || le < 16 || le > GT_SCRATCH) {
		gt_inj_stat(GT_INJ_STAT_SPLIT);
		return 0;
	}
	struct gt_inj_scan *st = gt_inj_state();
	if (!st)
		return 0;
	// HTTP/1.x and CRLF line ends only: "... HTTP/1.x\r\n".
	const __u8 *b = sc->buf;
	__u32 v = le - 10;
	if (b[v & GT_SCRATCH_MASK] != 'H' || b[(v + 1) & GT_SCRATCH_MASK] != 'T' ||
	    b[(v + 2) & GT_SCRATCH_MASK] != 'T' || b[(v + 3) & GT_SCRATCH_MASK] != 'P' ||
	    b[(v + 4) & GT_SCRATCH_MASK] != '/' || b[(v + 5) & GT_SCRATCH_MASK] != '1' ||
	    b[(v + 6) & GT_SCRATCH_MASK] != '.' || b[(v + 8) & GT_SCRATCH_MASK] != '\r')
		return 0;
	__builtin_memcpy(st->rec.head, sc->buf, GT_INJ_HEAD);
	// Leave the scan for this write's sys_exit (gt_headers_body). The
	// generation ties it to this syscall: the thread's record carries it.
	sc->reuse_id = bpf_get_current_pid_tgid();
	sc->reuse_ubuf = ubuf;
	sc->reuse_n = n;
	sc->reuse_max = max;
	sc->reuse_gen = bpf_ktime_get_ns();
	st->rec.scan_gen = sc->reuse_gen;
	return le;
}

// Decides the ids for a request gt_inject_check accepted and leaves the
// header line in the thread's record. Global for the same reason.
__noinline int gt_inject_decide(__u64 pid_tgid, __s32 fd, __u32 le, __u32 ports, __u64 ubuf)
{
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	// Which trace: the inbound request whose handler makes this call.
	__u64 ctx = 0, root = 0, cconn = 0, cseq = 0;
	// ubuf: in a uvloop process whose writes are deferred, the write
	// probe's record of this buffer names the writing task.
	int py = gt_py_context_w(tgid, tid, ubuf, 0, 0, 0, &ctx, &root);
	gt_py_cause(root, &cconn, &cseq);
	struct gt_trace_key k = {.conn = cconn, .seq = cseq};
	struct gt_trace_ctx *tc;
	if (cconn) {
		tc = bpf_map_lookup_elem(&gt_trace_ctxs, &k);
		if (!tc) {
			// Userspace has not published it (yet): nothing rather than
			// a wrong trace.
			gt_inj_stat(GT_INJ_STAT_MISS);
			return 0;
		}
	} else {
		k.seq = tgid; // the process's gym.job, if it has one
		tc = bpf_map_lookup_elem(&gt_trace_ctxs, &k);
		if (!tc && bpf_map_lookup_elem(&gt_inject_serving, &tgid)) {
			gt_inj_stat(GT_INJ_STAT_UNATTRIBUTED);
			return 0;
		}
	}
	struct gt_inj_scan *st = gt_inj_state();
	if (!st)
		return 0;
	struct gt_inject_rec *r = &st->rec;
	__u8 sampled;
	if (tc) {
		__builtin_memcpy(st->ids, tc->trace_id, 16);
		sampled = tc->flags & 1;
	} else {
		// A process that never served: its calls start traces.
		struct gt_inject_config *cfg = gt_inj_cfg();
		if (!cfg)
			return 0;
		sampled = gt_new_trace(st->ids, cfg);
		gt_inj_stat(GT_INJ_STAT_ROOT);
	}
	*(__u32 *)&st->ids[16] = bpf_get_prandom_u32();
	*(__u32 *)&st->ids[20] = bpf_get_prandom_u32() | 1;
	__builtin_memcpy(r->line, "traceparent: 00-", 16);
	r->line[48] = '-';
	// Hex digits: trace id at 16, span id at 49. A rolled loop: unrolled,
	// the digit arithmetic spills past the 512-byte stack.
#pragma clang loop unroll(disable)
	for (int i = 0; i < 24; i++) {
		__u8 byte = st->ids[i];
		__u32 at = i < 16 ? 16 + 2 * i : 49 + 2 * (i - 16);
		if (at > 63)
			break;
		r->line[at] = gt_hex(byte >> 4);
		r->line[at + 1] = gt_hex(byte & 15);
	}
	r->line[65] = '-';
	r->line[66] = '0';
	r->line[67] = sampled ? '1' : '0';
	r->line[68] = '\r';
	r->line[69] = '\n';
	r->line[70] = 0;
	r->line[71] = 0;
	r->tgid = tgid;
	r->fd = fd;
	r->line_end = le;
	r->lport = ports >> 16;
	r->rport = ports & 0xffff;
	r->state = GT_INJ_PREPARED;
	r->py_ok = py == GT_PY_OK;
	r->py_ctx = ctx;
	r->py_root = root;
	r->cause_conn = cconn;
	r->cause_seq = cseq;
	// In place when the thread has its record already: an update would
	// allocate a new element and free the old one.
	struct gt_inject_rec *dst = bpf_map_lookup_elem(&gt_inject_recs, &tid);
	if (dst)
		__builtin_memcpy(dst, r, sizeof(*r));
	else
		bpf_map_update_elem(&gt_inject_recs, &tid, r, BPF_ANY);
	gt_inj_stat(GT_INJ_STAT_PREPARED);
	return 0;
}

// The first buffer of a write syscall: (buf, len), iov[0] or msg_iov[0].
static __always_inline int gt_inj_first_buf(int kind, __u64 a1, __u64 a2, __u64 *buf, __u64 *len)
{
	if (kind == GT_IO_PLAIN) {
		*buf = a1;
		*len = a2;
		return 1;
	}
	__u64 iov = a1, cnt = a2;
	if (kind == GT_IO_MSG) {
		struct gt_msghdr mh = {};
		if (bpf_probe_read_user(&mh, sizeof(mh), (void *)a1))
			return 0;
		iov = mh.iov;
		cnt = mh.iovlen;
	}
	if (!cnt)
		return 0;
	struct gt_iovec v = {};
	if (bpf_probe_read_user(&v, sizeof(v), (void *)iov))
		return 0;
	*buf = v.base;
	*len = v.len;
	return 1;
}

static __always_inline int gt_inject_enter_target(__u64 id, int kind, __u64 a0, __u64 a1, __u64 a2)
{
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!gt_inject_wanted())
		return 0;
	// Only a process owning a socket in gt_inject_socks can have a header
	// inserted (the sk_msg program runs for those sockets alone): for any
	// other target this is one lookup and out.
	if (!bpf_map_lookup_elem(&gt_inject_procs, &tgid))
		return 0;
	__s32 fd = (__s32)a0;
	struct gt_conn_key key = {.tgid = tgid, .fd = fd};
	struct gt_conn *c = bpf_map_lookup_elem(&gt_conns, &key);
	// Accepted sockets and non-TCP fds never pass the sk_msg program, so no
	// decision of this thread's can be used in this syscall: out.
	if (c && (c->kind != GT_CONN_HTTP || c->side == GT_SIDE_SERVER))
		return 0;
	// Whatever this thread decided for an earlier syscall is void now.
	struct gt_inject_rec *old = bpf_map_lookup_elem(&gt_inject_recs, &tid);
	if (old)
		old->state = GT_INJ_NONE;
	__u32 ports = 0;
	if (c) {
		// Only where the parser knows a message starts: an idle request
		// direction of a plain (not TLS) client connection.
		if (c->tls || c->dir[1].phase != GT_PH_IDLE)
			return 0;
		ports = (__u32)c->tuple.lport << 16 | c->tuple.rport;
	}
	__u64 buf = 0, len = 0;
	if (!gt_inj_first_buf(kind, a1, a2, &buf, &len) || len < GT_PEEK)
		return 0;
	if (!c) {
		// First bytes on this fd since attach: cheap test before the
		// socket walk, since most such writes are files and pipes.
		__u8 peek[GT_PEEK] = {};
		__u16 arg = 0;
		__u8 mlen = 0;
		if (bpf_probe_read_user(peek, GT_PEEK, (void *)buf) ||
		    gt_classify(peek, GT_PEEK, &arg, &mlen) != GT_START_REQUEST)
			return 0;
	}
	if (!ports) {
		struct gt_tuple t = {};
		if (!gt_fd_tcp_tuple(fd, &t, 0))
			return 0;
		ports = (__u32)t.lport << 16 | t.rport;
	}
	__u64 t0 = gt_prof_begin();
	int le = gt_inject_check(buf, (__u32)(len > GT_SCRATCH ? GT_SCRATCH : len));
	gt_prof_end(GT_PROF_INJ_CHECK, t0);
	if (le <= 0)
		return 0;
	t0 = gt_prof_begin();
	gt_inject_decide(id, fd, le, ports, buf);
	gt_prof_end(GT_PROF_INJ_DECIDE, t0);
	return 0;
}

static __always_inline int gt_inject_enter(int kind, __u64 a0, __u64 a1, __u64 a2, __u32 prog)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!gt_is_target(id >> 32))
		return 0;
	gt_sys_ran_mark(prog); // common/understudy.h
	__u64 t0 = gt_prof_begin();
	gt_inject_enter_target(id, kind, a0, a1, a2);
	gt_prof_end(GT_PROF_INJ_ENTER, t0);
	return 0;
}
