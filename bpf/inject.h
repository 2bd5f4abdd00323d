// traceparent injection into outbound HTTP/1.x requests, without
// bpf_probe_write_user (refused under lockdown). docs/injection.md has the
// whole story; in short, three programs cooperate inside one write syscall:
//
//   1. sys_enter_{write,sendto,writev,sendmsg} (this file): on a target's
//      client connection at a message start whose header block is whole in
//      the first buffer and has no traceparent, decide the ids: the trace of
//      the inbound request whose handler makes the call (gt_py_cause, then
//      gt_trace_ctxs, published by userspace), a new span id, and the
//      sampled bit. The header line is formatted into a per-thread record.
//   2. sk_msg on gt_inject_socks (the sockhash sock_ops fills with targets'
//      client sockets): in the same syscall, on the same thread and socket,
//      re-checks the bytes and inserts the line after the request line with
//      bpf_msg_push_data.
//   3. sys_exit (bpf/syscalls.h -> gt_inject_note): the parser, at the
//      request start, copies the injected value into the record with
//      GT_F_INJECTED, so userspace gives the CLIENT span exactly that id.
//
// The user buffer is never changed: the parser's byte accounting stays on
// what the process wrote, and Content-Length is unaffected (headers only).
// Requires bpf_get_current_pid_tgid in sock_ops and sk_msg (Linux 6.10+).
#pragma once

#include "common/util.h"
#include "http.h"
#include "python.h"

#define GT_INJ_NAME_LEN 13 // "traceparent: "
#define GT_INJ_LINE (GT_INJ_NAME_LEN + GT_TRACEPARENT_LEN + 2) // 70: name, value, CRLF
#define GT_INJ_HEAD 8 // request bytes the sk_msg program re-checks

enum gt_inj_state {
	GT_INJ_NONE = 0,
	GT_INJ_PREPARED = 1, // decided at sys_enter; the sk_msg program may insert it
	GT_INJ_PUSHED = 2,   // inserted into the socket's copy of the data
	GT_INJ_TRIED = 3,    // the sk_msg program ran and did not insert
};

// One thread's decision for the write syscall it is in. Valid only between
// that syscall's enter and exit: every hooked write's enter resets it, and
// the sk_msg program also checks the socket's ports.
struct gt_inject_rec {
	__u32 tgid;
	__s32 fd;
	__u32 line_end; // offset just past the request line's CRLF
	__u16 lport;    // the socket, host byte order
	__u16 rport;
	__u8 state; // enum gt_inj_state
	__u8 py_ok; // py_* and cause_* hold the calling context (gt_py_context said OK)
	__u8 _pad[6];
	__u8 head[GT_INJ_HEAD];
	__u8 line[72]; // GT_INJ_LINE bytes: "traceparent: 00-<trace>-<span>-<flags>\r\n"
	// The asyncio context of the decision, handed to the parser at sys_exit
	// (gt_inject_note) so the same syscall does not read it twice.
	__u64 py_ctx;
	__u64 py_root;
	__u64 cause_conn;
	__u64 cause_seq;
	__u64 scan_gen; // gt_inject_check's scan in the scratch (struct gt_scratch)
};

// Per-CPU working memory of gt_inject_decide: the ids and the record being
// built (too large for the 512-byte stack next to the inlined context walk).
struct gt_inj_scan {
	__u8 ids[32];   // trace id, span id (and flags) being formatted or parsed
	struct gt_inject_rec rec;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_inject_config);
} gt_inject_config SEC(".maps");

// Published by userspace (internal/inject), LRU so an exchange whose end was
// never seen cannot leak an entry.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct gt_trace_key);
	__type(value, struct gt_trace_ctx);
} gt_trace_ctxs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tid
	__type(value, struct gt_inject_rec);
} gt_inject_recs SEC(".maps");

// Targets' client sockets, keyed by socket cookie. Only sockets in here pass
// through the sk_msg program; a socket leaves when it closes, and all of them
// when gymtrace exits (the map is not pinned).
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} gt_inject_socks SEC(".maps");

// Socket cookie -> tgid, from connect() (process context: the caller is
// known) to ACTIVE_ESTABLISHED (softirq: it is not), where only the sockhash
// may be written.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u32);
} gt_inject_pending SEC(".maps");

// Targets that have served a request since attach. A call of theirs that no
// inbound request can be named for gets no header: userspace may still find
// its parent by nesting, and an injected new trace would contradict it.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} gt_inject_serving SEC(".maps");

// Processes that own at least one socket injection can write to. Only
// their inbound requests need a trace published for their handlers' calls
// (gt_inject_root): a process whose outbound connections all predate
// gymtrace never gets a header.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} gt_inject_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GT_INJ_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} gt_inject_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_inj_scan);
} gt_inject_scan SEC(".maps");

static __always_inline void gt_inj_stat(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&gt_inject_stats, &slot);
	if (v)
		*v += 1;
}

static __always_inline struct gt_inject_config *gt_inj_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_inject_config, &zero);
}

// Injection is on and http_client is enabled (the calls it names are that
// group's spans). Otherwise every injection program leaves at once: no
// socket enters the sockhash, no write is looked at, nothing is inserted,
// so a selection without http_client pays two array lookups per hook.
static __always_inline int gt_inject_wanted(void)
{
	struct gt_inject_config *icfg = gt_inj_cfg();
	struct gt_config *cfg = gt_cfg();
	return icfg && cfg && (icfg->flags & GT_INJ_ON) && (cfg->mask & GT_GROUP_HTTP_CLIENT);
}

// Draws a new trace id into id[16] and returns its sampled bit: the rule
// OpenTelemetry's TraceIDRatioBased applies, (big-endian id[8:16] >> 1) <
// root_bound, so the kernel and userspace agree on every new trace.
static __always_inline __u8 gt_new_trace(__u8 *id, const struct gt_inject_config *cfg)
{
	__u32 w2 = bpf_get_prandom_u32(), w3 = bpf_get_prandom_u32() | 1;
	*(__u32 *)&id[0] = bpf_get_prandom_u32();
	*(__u32 *)&id[4] = bpf_get_prandom_u32();
	*(__u32 *)&id[8] = w2;
	*(__u32 *)&id[12] = w3;
	__u64 lo = (__u64)bpf_ntohl(w2) << 32 | bpf_ntohl(w3);
	return (lo >> 1) < cfg->root_bound;
}

static __always_inline __u8 gt_hex(__u8 n)
{
	// '0'..'9', then 'a'..'f' (39 = 'a' - '0' - 10), without a branch.
	return '0' + n + ((((int)9 - (int)n) >> 31) & 39);
}

static __always_inline struct gt_inj_scan *gt_inj_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_inject_scan, &zero);
}

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

static __always_inline int gt_inject_enter(int kind, __u64 a0, __u64 a1, __u64 a2)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!gt_is_target(id >> 32))
		return 0;
	__u64 t0 = gt_prof_begin();
	gt_inject_enter_target(id, kind, a0, a1, a2);
	gt_prof_end(GT_PROF_INJ_ENTER, t0);
	return 0;
}

// Called by the parser (bpf/syscalls.h, gt_py_note) at every message start
// it accepts. Server side: the process serves. Client request: report an
// injected header. The decision was only made when the connection's request
// direction was idle at sys_enter, so the first request start the parser
// meets in that syscall is the one the header went into; the record is then
// spent, and a pipelined request after it in the same buffer gets nothing.
__noinline int gt_inject_note(struct gt_conn *c, struct gt_io *io)
{
	if (!c || !io)
		return 0;
	__u32 tgid = io->tgid;
	if (c->side == GT_SIDE_SERVER) {
		if (!c->served_noted) {
			c->served_noted = 1;
			if (!bpf_map_lookup_elem(&gt_inject_serving, &tgid)) {
				__u8 one = 1;
				bpf_map_update_elem(&gt_inject_serving, &tgid, &one, BPF_ANY);
			}
		}
		return 0;
	}
	if (c->side != GT_SIDE_CLIENT || io->dir != 1 || c->tls)
		return 0;
	__u32 tid = io->tid;
	struct gt_inject_rec *r = bpf_map_lookup_elem(&gt_inject_recs, &tid);
	if (!r || r->tgid != tgid || r->fd != io->fd)
		return 0;
	int have_py = r->state != GT_INJ_NONE && r->py_ok;
	if (r->state != GT_INJ_NONE)
		io->scan_gen = r->scan_gen;
	if (r->state == GT_INJ_PUSHED) {
		__builtin_memcpy(c->req.traceparent, &r->line[GT_INJ_NAME_LEN], GT_TRACEPARENT_LEN);
		c->req.flags |= GT_F_TRACEPARENT | GT_F_INJECTED;
		gt_inj_stat(GT_INJ_STAT_INJECTED);
	} else if (r->state == GT_INJ_PREPARED) {
		gt_inj_stat(GT_INJ_STAT_NOT_PUSHED);
	}
	if (have_py) {
		c->req.py_ctx = r->py_ctx;
		c->req.py_root = r->py_root;
		c->req.cause_conn = r->cause_conn;
		c->req.cause_seq = r->cause_seq;
	}
	r->state = GT_INJ_NONE;
	return have_py;
}

static __always_inline int gt_inject_proc(__u32 tgid)
{
	return gt_inject_wanted() && bpf_map_lookup_elem(&gt_inject_procs, &tgid);
}

static __always_inline int gt_unhex(__u8 c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

// Called by the parser (bpf/syscalls.h, gt_headers) when a request a target
// serves carries a traceparent. Its trace is then known here, so it is
// published at once for the calls its handler makes: userspace publishes the
// same trace when it sees the request, but a handler's first call can beat
// it. Only a well-formed version-00 value is used (userspace ignores others
// and would choose another trace), and only while the server group is on
// (with it off, Gym does not read the header either).
__noinline int gt_inject_inbound(struct gt_conn *c, struct gt_io *io)
{
	if (!c || !io || c->side != GT_SIDE_SERVER || !(io->mask & GT_GROUP_SERVER))
		return 0;
	if (!gt_inject_wanted())
		return 0;
	const __u8 *tp = c->req.traceparent;
	if (tp[0] != '0' || tp[1] != '0' || tp[2] != '-' || tp[35] != '-' || tp[52] != '-')
		return 0;
	struct gt_inj_scan *st = gt_inj_state();
	if (!st)
		return 0;
	// ids[0..16) trace id, ids[16..24) span id, ids[24] flags (hex pairs
	// at 3, 36 and 53).
	__u8 any_t = 0, any_s = 0, bad = 0;
#pragma clang loop unroll(disable)
	for (int i = 0; i < 25; i++) {
		int at = i < 16 ? 3 + 2 * i : (i < 24 ? 36 + 2 * (i - 16) : 53);
		if (at > 53)
			break;
		int hi = gt_unhex(tp[at]), lo = gt_unhex(tp[at + 1]);
		if (hi < 0 || lo < 0) {
			bad = 1;
			break;
		}
		__u8 v = hi << 4 | lo;
		st->ids[i & 31] = v;
		if (i < 16)
			any_t |= v;
		else if (i < 24)
			any_s |= v;
	}
	if (bad || !any_t || !any_s)
		return 0;
	struct gt_trace_key k = {.conn = c->conn_id, .seq = c->req.seq};
	struct gt_trace_ctx v = {};
	__builtin_memcpy(v.trace_id, st->ids, 16);
	__builtin_memcpy(v.span_id, &st->ids[16], 8);
	v.flags = st->ids[24] & 1;
	// Userspace's entry, if it came first, is the authority.
	bpf_map_update_elem(&gt_trace_ctxs, &k, &v, BPF_NOEXIST);
	return 0;
}

// Targets' client connections by their tuple, so a server request can tell
// that its caller is a target on this host (see gt_emit_request). The key is
// the pair of endpoints, client first, as both ends see it.
struct gt_pair_key {
	__u8 caddr[16];
	__u8 saddr[16];
	__u16 cport;
	__u16 sport;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gt_pair_key);
	__type(value, __u8);
} gt_inject_pairs SEC(".maps");

// op: GT_PAIR_ADD (c is a client connection), GT_PAIR_DEL (it closes),
// GT_PAIR_LOOKUP (c is a server connection: is its client a target's?).
__noinline int gt_inject_pair(struct gt_conn *c, int op)
{
	if (!c)
		return 0;
	struct gt_inject_config *icfg = gt_inj_cfg();
	if (!icfg || !(icfg->flags & GT_INJ_ON))
		return 0;
	// A server connection's client is its remote end; a client's, itself.
	int srv = op == GT_PAIR_LOOKUP;
	struct gt_pair_key k = {
		.cport = srv ? c->tuple.rport : c->tuple.lport,
		.sport = srv ? c->tuple.lport : c->tuple.rport,
	};
	__builtin_memcpy(k.caddr, srv ? c->tuple.raddr : c->tuple.laddr, 16);
	__builtin_memcpy(k.saddr, srv ? c->tuple.laddr : c->tuple.raddr, 16);
	if (srv)
		return bpf_map_lookup_elem(&gt_inject_pairs, &k) != 0;
	if (op == GT_PAIR_DEL) {
		bpf_map_delete_elem(&gt_inject_pairs, &k);
	} else {
		__u8 one = 1;
		bpf_map_update_elem(&gt_inject_pairs, &k, &one, BPF_ANY);
	}
	return 0;
}

// Starts a trace for server request c->req, which carried no traceparent,
// and publishes it for the calls its handler makes (gt_inject_decide finds
// it by the request's conn and seq). The record tells userspace, which gives
// the request's root span this trace (GT_F_KERNEL_TRACE); should it decide
// otherwise (a same-node caller it joins by connection), its own publication
// replaces this one. The sampled bit follows the rule userspace's sampler
// applies to a new trace (root_bound, see struct gt_inject_config).
__noinline int gt_inject_root(struct gt_conn *c)
{
	if (!c)
		return 0;
	struct gt_inject_config *cfg = gt_inj_cfg();
	if (!cfg || !(cfg->flags & GT_INJ_ON))
		return 0;
	struct gt_trace_ctx v = {};
	v.flags = gt_new_trace(v.trace_id, cfg);
	struct gt_trace_key k = {.conn = c->conn_id, .seq = c->req.seq};
	if (bpf_map_update_elem(&gt_trace_ctxs, &k, &v, BPF_NOEXIST))
		return 0; // already published: leave the record without a kernel trace
	__builtin_memcpy(c->req.traceparent, v.trace_id, 16);
	c->req.traceparent[16] = v.flags;
	c->req.flags |= GT_F_KERNEL_TRACE;
	return 0;
}

#ifndef GT_NO_PROGRAMS
SEC("tracepoint/syscalls/sys_enter_write")
int gt_inject_enter_write(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter(GT_IO_PLAIN, ctx->args[0], ctx->args[1], ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_enter_sendto")
int gt_inject_enter_sendto(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter(GT_IO_PLAIN, ctx->args[0], ctx->args[1], ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_enter_writev")
int gt_inject_enter_writev(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter(GT_IO_IOV, ctx->args[0], ctx->args[1], ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_enter_sendmsg")
int gt_inject_enter_sendmsg(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter(GT_IO_MSG, ctx->args[0], ctx->args[1], ctx->args[2]);
}

// Attached to the cgroup v2 root (internal/inject): every TCP socket of the
// host passes here, and only targets' outbound ones are kept.
SEC("sockops")
int gt_inject_sockops(struct bpf_sock_ops *skops)
{
	__u64 cookie;
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB: {
		// connect() runs in the caller's context.
		__u32 tgid = bpf_get_current_pid_tgid() >> 32;
		if (!gt_is_target(tgid) || !gt_inject_wanted())
			return 1;
		cookie = bpf_get_socket_cookie(skops);
		bpf_map_update_elem(&gt_inject_pending, &cookie, &tgid, BPF_ANY);
		break;
	}
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB: {
		cookie = bpf_get_socket_cookie(skops);
		__u32 *owner = bpf_map_lookup_elem(&gt_inject_pending, &cookie);
		if (!owner)
			return 1;
		__u32 otgid = *owner;
		__u8 one = 1;
		bpf_map_update_elem(&gt_inject_procs, &otgid, &one, BPF_ANY);
		bpf_map_delete_elem(&gt_inject_pending, &cookie);
		// Fails with EBUSY when another gymtrace already holds the socket
		// (both trace the process): that one injects.
		if (bpf_sock_hash_update(skops, &gt_inject_socks, &cookie, BPF_NOEXIST))
			gt_inj_stat(GT_INJ_STAT_SOCK_FAIL);
		else
			gt_inj_stat(GT_INJ_STAT_SOCKS);
		break;
	}
	}
	return 1;
}

SEC("sk_msg")
int gt_inject_msg(struct sk_msg_md *msg)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	// Switched off (a reload without http_client): a decision left from
	// before must not be used; userspace empties the sockhash too.
	if (!gt_inject_wanted())
		return SK_PASS;
	struct gt_inject_rec *r = bpf_map_lookup_elem(&gt_inject_recs, &tid);
	if (!r || r->state != GT_INJ_PREPARED || r->tgid != (__u32)(id >> 32))
		return SK_PASS;
	// Only the socket the decision was made for.
	if (msg->local_port != r->lport || (bpf_ntohl(msg->remote_port) & 0xffff) != r->rport)
		return SK_PASS;
	// One attempt a syscall: a large write reaches here once per chunk, and
	// only the first starts with the request line.
	r->state = GT_INJ_TRIED;
	__u32 off = r->line_end;
	if (off < 16 || off > GT_SCRATCH || msg->size < off)
		goto fail;
	if (bpf_msg_pull_data(msg, 0, GT_INJ_HEAD, 0))
		goto fail;
	__u8 *d = msg->data, *e = msg->data_end;
	if (d + GT_INJ_HEAD > e)
		goto fail;
	__u8 diff = 0;
#pragma unroll
	for (int i = 0; i < GT_INJ_HEAD; i++)
		diff |= d[i] ^ r->head[i];
	if (diff)
		goto fail;
	if (bpf_msg_pull_data(msg, off - 2, off, 0))
		goto fail;
	d = msg->data;
	e = msg->data_end;
	if (d + 2 > e || d[0] != '\r' || d[1] != '\n')
		goto fail;
	if (bpf_msg_push_data(msg, off, GT_INJ_LINE, 0))
		goto fail;
	if (bpf_msg_pull_data(msg, off, off + GT_INJ_LINE, 0))
		goto undo;
	d = msg->data;
	e = msg->data_end;
	if (d + GT_INJ_LINE > e)
		goto undo;
	__builtin_memcpy(d, r->line, GT_INJ_LINE);
	r->state = GT_INJ_PUSHED;
	gt_inj_stat(GT_INJ_STAT_PUSHED);
	return SK_PASS;
undo:
	// The pushed bytes are uninitialised: never send them. Failing the write
	// is better than sending garbage, should even the undo fail.
	if (bpf_msg_pop_data(msg, off, GT_INJ_LINE, 0)) {
		gt_inj_stat(GT_INJ_STAT_PUSH_FAIL);
		return SK_DROP;
	}
fail:
	gt_inj_stat(GT_INJ_STAT_PUSH_FAIL);
	return SK_PASS;
}
#endif
