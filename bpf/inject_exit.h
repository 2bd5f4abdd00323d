// traceparent injection, step 3 and its peers (bpf/inject.h): what the syscall
// parser tells injection at a message start (gt_inject_note), inbound
// requests' own traceparent, the same-node connection pairs, and traces the
// kernel starts. Included by bpf/inject.h.
#pragma once

// Called by the parser (bpf/syscalls.h, gt_py_note) at every message start
// it accepts. Server side: the process serves. Client request: report an
// injected header. The decision was only made when the connection's request
// direction was idle at sys_enter, so the first request start the parser
// meets in that syscall is the one the header went into; the record is then
// spent, and a pipelined request after it in the same buffer gets nothing.
GT_GLOBAL int gt_inject_note(struct gt_conn *c, struct gt_io *io)
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
	// With injection off (this kernel's self-test, or no http_client) the
	// sys_enter program writes no record: two array loads instead of an LRU
	// lookup on every client request.
	if (!gt_inject_wanted())
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

// The bytes the sk_msg program inserted into the write that io is the
// sys_exit of (0 when none): the stream moved that many more than the syscall
// returned (gt_pos_check).
GT_GLOBAL int gt_inject_pushed(struct gt_io *io)
{
	if (!io || !gt_inject_wanted())
		return 0;
	__u32 tid = io->tid;
	struct gt_inject_rec *r = bpf_map_lookup_elem(&gt_inject_recs, &tid);
	if (!r || r->tgid != io->tgid || r->fd != io->fd || r->state != GT_INJ_PUSHED)
		return 0;
	return GT_INJ_LINE;
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
GT_GLOBAL int gt_inject_inbound(struct gt_conn *c, struct gt_io *io)
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
GT_GLOBAL int gt_inject_pair(struct gt_conn *c, int op)
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
GT_GLOBAL int gt_inject_root(struct gt_conn *c)
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
