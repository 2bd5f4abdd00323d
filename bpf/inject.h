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

#include "common/preempt.h" // gt_sys_pin
#include "inject_state.h" // constants, records, maps
#include "inject_enter.h" // step 1: the decision at sys_enter
#include "inject_exit.h"  // step 3: the parser's side

#ifndef GT_NO_PROGRAMS
// gt_inject_enter, held whole where the kernel preempts syscall programs
// (common/preempt.h, gt_sys_pin): it uses the per-CPU scratch too.
static __always_inline int gt_inject_enter_pinned(int kind, __u64 a0, __u64 a1, __u64 a2, __u32 prog)
{
	gt_sys_pin_off();
	int r = gt_inject_enter(kind, a0, a1, a2, prog);
	gt_sys_pin_on();
	return r;
}

SEC("tracepoint/syscalls/sys_enter_write")
int gt_inject_enter_write(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter_pinned(GT_IO_PLAIN, ctx->args[0], ctx->args[1], ctx->args[2], GT_SYS_INJECT_WRITE);
}
GT_UNDERSTUDY(gt_usi_write, "sys_enter_write", GT_SYS_INJECT_WRITE)

SEC("tracepoint/syscalls/sys_enter_sendto")
int gt_inject_enter_sendto(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter_pinned(GT_IO_PLAIN, ctx->args[0], ctx->args[1], ctx->args[2], GT_SYS_INJECT_SENDTO);
}
GT_UNDERSTUDY(gt_usi_sendto, "sys_enter_sendto", GT_SYS_INJECT_SENDTO)

SEC("tracepoint/syscalls/sys_enter_writev")
int gt_inject_enter_writev(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter_pinned(GT_IO_IOV, ctx->args[0], ctx->args[1], ctx->args[2], GT_SYS_INJECT_WRITEV);
}
GT_UNDERSTUDY(gt_usi_writev, "sys_enter_writev", GT_SYS_INJECT_WRITEV)

SEC("tracepoint/syscalls/sys_enter_sendmsg")
int gt_inject_enter_sendmsg(struct trace_event_raw_sys_enter *ctx)
{
	return gt_inject_enter_pinned(GT_IO_MSG, ctx->args[0], ctx->args[1], ctx->args[2], GT_SYS_INJECT_SENDMSG);
}
GT_UNDERSTUDY(gt_usi_sendmsg, "sys_enter_sendmsg", GT_SYS_INJECT_SENDMSG)

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
