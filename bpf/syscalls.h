// Syscall tracepoints: the connection table and the programs on the data
// syscalls, which run the HTTP/1.x message state machine per connection
// (io.h, emit.h, headers.h, py_note.h, message.h).
//
// Only sys_exit_* of the data syscalls is hooked (plus sys_enter_close): the
// arguments are read back from the task's saved registers, so each traced
// syscall costs one program run, not two. Every program starts with the
// target-bitmap test, so an untargeted process pays one array load.
#pragma once

#include "http.h"
#include "http_reward.h" // the reward of /verify responses (message.h)
#include "python.h"
#include "io.h" // struct gt_io: one traced read or write
#include "startup.h" // listen(2) and the first answer of a process starting (the startup group)
#include "http_genai.h" // model names and token counts of model exchanges (message.h)
#include "common/preempt.h" // gt_sys_pin: syscall programs held whole where the kernel preempts them
#include "common/understudy.h" // and a second program for the runs the kernel skips there

#include "tls_link.h" // HTTPS: SSL* <-> socket link, TLS connection table

// gt_inject_pair's operations (bpf/inject_exit.h).
#define GT_PAIR_ADD 0
#define GT_PAIR_DEL 1
#define GT_PAIR_LOOKUP 2

#ifdef GT_INJECT
// traceparent injection (bpf/inject.h, included after this file): told about
// every message start the parser accepts (from gt_py_note, which every start
// calls; a call in gt_start_request itself would grow gt_step's verification
// past the limit).
GT_GLOBAL int gt_inject_note(struct gt_conn *c, struct gt_io *io);
GT_GLOBAL int gt_inject_inbound(struct gt_conn *c, struct gt_io *io);
GT_GLOBAL int gt_inject_root(struct gt_conn *c);
GT_GLOBAL int gt_inject_pair(struct gt_conn *c, int op);
GT_GLOBAL int gt_inject_pushed(struct gt_io *io);
static __always_inline int gt_inject_wanted(void);
#endif

// The state machine, by part; each needs what is above it.
#include "io_scratch.h" // struct gt_io in per-CPU map memory (gt_ios)
#include "k510_wrap.h" // the 5.10 build: scalar-argument global functions
#include "emit.h"    // records to the ring buffer
#include "headers.h" // the header block
#include "py_note.h" // asyncio context at message starts
#include "message.h" // message starts, bodies, one buffer

// The gate changed since the connection was last seen: whatever was
// mid-flight is resynchronised at its next message start.
static __always_inline void gt_conn_check_gen(struct gt_conn *c, __u32 gen)
{
	if (c->cfg_gen == gen)
		return;
	c->cfg_gen = gen;
	for (int i = 0; i < 2; i++) {
		if (c->dir[i].phase != GT_PH_IDLE) {
			c->dir[i].phase = GT_PH_SKIP;
			gt_framing_lost(c, &c->dir[i]);
		}
	}
}

// A new connection's entry: the socket's tuple (or "not TCP"), inserted
// into gt_conns. Returns 0 when the entry is there. A function of its own
// so that its frame is not on the stack under the parser's deep chain (the
// programs' combined stack is bounded at 512 bytes).
GT_GLOBAL int gt_conn_new(struct gt_io *io, long ret)
{
	if (!io)
		return -1;
	struct gt_conn_key key = {.tgid = io->tgid, .fd = io->fd};
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	struct gt_conn *t = &sc->conn;
	__builtin_memset(t, 0, sizeof(*t));
	t->cfg_gen = io->cfg_gen;
	struct sock *sk = 0;
	if (gt_fd_tcp_tuple(io->fd, &t->tuple, &sk)) {
		t->kind = GT_CONN_HTTP;
		t->sk = (__u64)sk;
		t->fresh = sk && gt_conn_fresh(sk, io->dir, ret);
		if (t->fresh)
			gt_stat_add(GT_STAT_FRESH, 1);
		t->conn_id = gt_new_conn_id();
	} else {
		t->kind = GT_CONN_IGNORE;
	}
	if (bpf_map_update_elem(&gt_conns, &key, t, BPF_NOEXIST) && bpf_map_update_elem(&gt_conns, &key, t, BPF_ANY)) {
		gt_stat_add(GT_STAT_CONN_FULL, 1);
		return -1;
	}
	return 0;
}
GT_K510_I(gt_conn_new, (long ret), 1, io, ret)
#ifdef GT_K510
#define gt_conn_new(io, ...) gt_conn_new_k510(__VA_ARGS__)
#endif

static __always_inline int gt_in_flight(struct gt_conn *c)
{
	return c->emitted_ring && (c->req_seq != c->resp_seq || c->dir[0].phase > GT_PH_IDLE ||
				   c->dir[1].phase > GT_PH_IDLE);
}

// The entry's socket is no longer the one behind its fd: the close went
// unseen (gt_enter_close skipped by a kernel that held bpf_prog_active, or
// a close gymtrace does not hook: dup2 over it, close_range), and the fd was
// given to a new socket. Left alone, the new connection would carry the old
// one's request counts, id and tuple, and be paired as the old one. Ended
// here as gt_enter_close ends it; the caller follows the new one afresh.
GT_GLOBAL int gt_conn_stale(struct gt_io *io, struct gt_conn *c)
{
	if (!io || !c || !c->sk)
		return 0;
	if (gt_fd_sk(io->fd) == (struct sock *)c->sk)
		return 0;
	gt_stat_add(GT_STAT_STALE_CONN, 1);
	if (c->kind == GT_CONN_HTTP && gt_in_flight(c))
		gt_emit_close(c, io, GT_F_CONN_ERROR);
#ifdef GT_INJECT
	if (c->kind == GT_CONN_HTTP && c->side == GT_SIDE_CLIENT)
		gt_inject_pair(c, GT_PAIR_DEL);
#endif
	struct gt_conn_key key = {.tgid = io->tgid, .fd = io->fd};
	bpf_map_delete_elem(&gt_conns, &key);
	return 1;
}
GT_K510_CI(gt_conn_stale, (void), 0, io, c)
#ifdef GT_K510
#define gt_conn_stale(io, c) gt_conn_stale_k510()
#endif

static __always_inline struct gt_conn *gt_conn_get(struct gt_io *io, int create, long ret)
{
	struct gt_conn_key key = {.tgid = io->tgid, .fd = io->fd};
	struct gt_conn *c = bpf_map_lookup_elem(&gt_conns, &key);
	if (c && !gt_conn_stale(io, c)) {
		gt_conn_check_gen(c, io->cfg_gen);
		return c;
	}
	if (!create || gt_conn_new(io, ret))
		return 0;
	return bpf_map_lookup_elem(&gt_conns, &key);
}


// A data syscall that moved nothing: the peer closed (a read of 0), or an
// error. Off the deep chain's stack, like gt_conn_new.
GT_GLOBAL int gt_on_io_end(struct gt_io *io, long ret)
{
	if (!io)
		return 0;
	struct gt_conn *c = gt_conn_get(io, 0, 0);
	if (!c || c->kind != GT_CONN_HTTP)
		return 0;
	if (ret == 0 && io->dir == 0) {
		// Peer closed. A body delimited by the connection ends here.
		struct gt_dir *d = &c->dir[0];
		if (d->phase == GT_PH_BODY_EOF) {
			gt_finish(c, d, io, GT_F_END_BY_CLOSE);
		} else if (gt_in_flight(c)) {
			gt_emit_close(c, io, 0);
			c->emitted_ring = 0;
		}
	} else if (ret < 0 && gt_in_flight(c)) {
		gt_emit_close(c, io, GT_F_CONN_ERROR);
		c->emitted_ring = 0;
		c->dir[0].phase = GT_PH_SKIP;
		c->dir[1].phase = GT_PH_SKIP;
	}
	return 0;
}
GT_K510_I(gt_on_io_end, (long ret), 0, io, ret)
#ifdef GT_K510
#define gt_on_io_end(io, ...) gt_on_io_end_k510(__VA_ARGS__)
#endif

// Whether the parser saw every byte of the connection since the last syscall
// it followed on it: for each direction, the TCP stream position where the
// parser's view of it should stand now (write_seq or copied_seq read at this
// sys_exit, less what this syscall moved when it is this one's direction)
// against where it stood after the last one. Bytes move unseen when the kernel
// skips a program (a kernel that preempts can hold bpf_prog_active while
// another task runs: docs/architecture.md) or through a syscall gymtrace does
// not hook (sendfile, splice). The parser must not read on as if they were
// not there: counting the next response start as the one that went unseen
// gives each later request on the connection its neighbour's response, and a
// neighbour's span and parent.
// - Inside a Content-Length body that still has at least that many bytes to
//   come, the gap was body: skipped exactly. A body that ended exactly at the
//   gap's end is whole and ends here (GT_F_BODY_UNKNOWN: its end time is
//   only known to be before this syscall); a model exchange's walk is cut.
// - Otherwise that direction's parse state starts over at its next message
//   start. In the request direction the count of requests may now differ
//   from the peer's (GT_GAP_FRAMING: userspace pairs by stream position
//   only). In the response direction every request seen so far has its
//   response given up (resp_seq = req_seq): how many responses began in the
//   gap is unknown, so none is paired by count; userspace ends those requests
//   as lost (truncated, never an error of the server) when a later response
//   or the close comes (internal/http lostBefore).
// Both directions are checked at every syscall so that a gap is found before
// the next message in either direction is counted: a server that wrote an
// answer unseen is caught at the read of the next request, so only the
// unseen answer's request is given up and the next answer keeps its index.
// TLS plaintext has no stream position; those connections are not checked.
static __always_inline void gt_pos_dir(struct gt_conn *c, struct gt_io *io, int dir)
{
	__u8 bit = 1 << dir;
	struct gt_dir *d = &c->dir[dir & 1];
	__u32 now = gt_stream_seq((struct sock *)c->sk, dir);
	__u32 at = now;
	if (dir == io->dir) {
		at -= io->ret;
#ifdef GT_INJECT
		// A traceparent line the sk_msg program put into this write is
		// in the stream but not in what the syscall returned.
		if (dir == 1 && c->side == GT_SIDE_CLIENT)
			at -= gt_inject_pushed(io);
#endif
	}
	__u32 gap = at - d->next_pos;
	// The peer's FIN counts one in copied_seq, taken by the read that
	// returns its last data or by one that returns 0 (which is not followed).
	if (dir == 0 && gap == 1 && gt_fin_received((struct sock *)c->sk))
		gap = 0;
	int known = (c->pos_ok & bit) != 0;
	d->next_pos = now;
	c->pos_ok |= bit;
	if (!known || !gap)
		return;
	gt_stat_add(GT_STAT_STREAM_GAP, 1);
	if (d->phase == GT_PH_BODY_CL && gap <= d->remaining) {
		d->remaining -= gap;
		d->body_len += gap;
		gt_stat_add(GT_STAT_STREAM_GAP_BODY, 1);
		// A model exchange's walk cannot go on over a hole: a number
		// cut by it would read as a different one.
		if (d->scan_genai)
			gt_genai_cut(c->conn_id, dir);
		if (d->remaining)
			return;
		// The body's last bytes were the gap (uvicorn writes a response's
		// head and body in two syscalls, and a skipped program can miss
		// the second): the message is whole, and ended unseen before now.
		// Given up instead, its exchange would end at the next one's
		// answer.
		if (d->scan_genai)
			gt_genai_end(c, io, dir);
		gt_finish(c, d, io, GT_F_BODY_UNKNOWN);
		return;
	}
	if (c->partial_dir == dir)
		c->partial_len = 0;
	if (c->carry_dir == dir)
		c->carry_len = 0;
	d->phase = GT_PH_SKIP;
	if (d->is_req) {
		gt_framing_lost(c, d);
	} else if (c->side != GT_SIDE_UNKNOWN) {
		c->resp_seq = c->req_seq;
		c->resp_given_up = 1;
	}
}

GT_GLOBAL int gt_pos_check(struct gt_conn *c, struct gt_io *io)
{
	if (!c || !io || !c->sk || c->tls)
		return 0;
	gt_pos_dir(c, io, 0);
	gt_pos_dir(c, io, 1);
	return 0;
}
GT_K510_CI(gt_pos_check, (void), 0, c, io)
#ifdef GT_K510
#define gt_pos_check(c, io) gt_pos_check_k510()
#endif

static __always_inline int gt_on_io_target(__u64 id, long ret, __u8 dir, int kind)
{
	__u32 tgid = id >> 32;
	struct gt_config *cfg = gt_cfg();
	if (!cfg)
		return 0;
	struct gt_target *tg = bpf_map_lookup_elem(&gt_targets, &tgid);
	__u8 role = tg ? tg->role : GT_ROLE_UNKNOWN;
	// Before the HTTP gate: a server's first answer needs no HTTP group.
	if (dir == 1 && ret > 0 && (cfg->mask & GT_GROUP_STARTUP))
		gt_startup_write(tgid);
	__u64 possible = cfg->server_possible[role & 7] | cfg->client_possible;
	if (!(possible & cfg->mask) && !(cfg->flags & GT_CFG_NO_GATE))
		return 0;

	if (ret == -GT_EAGAIN || ret == -GT_EINTR || ret == -GT_EINPROGRESS)
		return 0; // nothing moved, nothing ended

	unsigned long a0, a1, a2;
	gt_syscall_args(&a0, &a1, &a2);
	__u32 zero = 0;
	struct gt_io_scratch *is = bpf_map_lookup_elem(&gt_ios, &zero);
	if (!is)
		return 0;
	struct gt_io *io = &is->io;
	__builtin_memset(io, 0, sizeof(*io));
	io->now = bpf_ktime_get_ns();
	io->tgid = tgid;
	io->tid = (__u32)id;
	io->fd = (__s32)a0;
#ifdef GT_K510
	is->k510_key.tgid = tgid;
	is->k510_key.fd = io->fd;
#endif
	io->dir = dir;
	io->role = role;
	io->cfg_flags = cfg->flags;
	io->cfg_gen = cfg->generation;
	io->mask = cfg->mask;
	io->server_possible = cfg->server_possible[role & 7];
	io->client_possible = cfg->client_possible;

	if (ret <= 0)
		return gt_on_io_end(io, ret);

	__u64 t0 = gt_prof_begin();
	struct gt_conn *c = gt_conn_get(io, 1, ret);
	gt_prof_end(GT_PROF_CONN, t0);
	if (!c || c->kind != GT_CONN_HTTP)
		return 0;
	// Ciphertext of an SSL* the TLS probes follow: linked, then ignored.
	if (dir == 1 && !c->started && gt_tls_link_write(io, c, kind, a1))
		return 0;
	if (c->side == GT_SIDE_SERVER && !(cfg->server_possible[role & 7] & cfg->mask) && !(cfg->flags & GT_CFG_NO_GATE))
		return 0;
	if (c->side == GT_SIDE_CLIENT && !(cfg->client_possible & cfg->mask) && !(cfg->flags & GT_CFG_NO_GATE))
		return 0;

	io->ret = (__u32)ret;
	gt_pos_check(c, io);
#ifndef GT_K510
	// More of a server request's head than its first read (bpf/py_note.h).
	// Here, not in gt_process: its frame is on the deepest call chain.
	if (dir == 0 && c->side == GT_SIDE_SERVER && c->dir[0].is_req && c->dir[0].phase == GT_PH_HEADERS)
		gt_py_note_more(c, io);
#endif
	if (kind == GT_IO_PLAIN) {
		t0 = gt_prof_begin();
		gt_process(c, io, a1, (__u32)ret);
		gt_prof_end(GT_PROF_PROCESS, t0);
		return 0;
	}
	is->iov = a1;
	is->cnt = a2;
	is->ret = ret;
	if (kind == GT_IO_MSG) {
		// Only msg_iov and msg_iovlen: half the struct.
		if (bpf_probe_read_user(&is->iov, 2 * sizeof(__u64), (void *)(a1 + GT_MSGHDR_IOV_OFF)))
			return 0;
	}
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	sc->loops.iov_left = ret;
	int i;
	gt_for(i, 0, GT_MAX_IOV_SEGS)
	{
		if (i >= is->cnt)
			break;
		if (bpf_probe_read_user(&is->v, sizeof(is->v), (void *)(is->iov + i * sizeof(is->v))))
			break;
		sc = gt_get_scratch();
		if (!sc || !sc->loops.iov_left)
			break;
		__u64 left = sc->loops.iov_left;
		__u64 seg = is->v.len < left ? is->v.len : left;
		sc->loops.iov_left = left - seg;
		io->seg_off = (__u32)(is->ret - left);
		gt_process(c, io, is->v.base, (__u32)seg);
	}
	sc = gt_get_scratch();
	if (sc && sc->loops.iov_left)
		gt_iov_rest(c, io, sc->loops.iov_left);
	return 0;
}

static __always_inline int gt_on_io(long ret, __u8 dir, int kind, __u32 prog)
{
	// From the first instruction: a run stopped anywhere keeps the others
	// of this program on its CPU out (common/preempt.h).
	gt_sys_pin_off();
	__u64 id = bpf_get_current_pid_tgid();
	if (gt_is_target(id >> 32)) {
		gt_sys_ran_mark(prog); // common/understudy.h
		__u64 t0 = gt_prof_begin();
		gt_on_io_target(id, ret, dir, kind);
		gt_prof_end(GT_PROF_IO, t0);
	}
	gt_sys_pin_on();
	return 0;
}

#ifndef GT_NO_PROGRAMS // verifier tests include the helpers alone
SEC("tracepoint/syscalls/sys_exit_read")
int gt_exit_read(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_PLAIN, GT_SYS_EXIT_READ); }

SEC("tracepoint/syscalls/sys_exit_recvfrom")
int gt_exit_recvfrom(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_PLAIN, GT_SYS_EXIT_RECVFROM); }

SEC("tracepoint/syscalls/sys_exit_readv")
int gt_exit_readv(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_IOV, GT_SYS_EXIT_READV); }

SEC("tracepoint/syscalls/sys_exit_recvmsg")
int gt_exit_recvmsg(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 0, GT_IO_MSG, GT_SYS_EXIT_RECVMSG); }

SEC("tracepoint/syscalls/sys_exit_write")
int gt_exit_write(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_PLAIN, GT_SYS_EXIT_WRITE); }

SEC("tracepoint/syscalls/sys_exit_sendto")
int gt_exit_sendto(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_PLAIN, GT_SYS_EXIT_SENDTO); }

SEC("tracepoint/syscalls/sys_exit_writev")
int gt_exit_writev(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_IOV, GT_SYS_EXIT_WRITEV); }

SEC("tracepoint/syscalls/sys_exit_sendmsg")
int gt_exit_sendmsg(struct trace_event_raw_sys_exit *ctx) { return gt_on_io(ctx->ret, 1, GT_IO_MSG, GT_SYS_EXIT_SENDMSG); }

static __always_inline int gt_enter_close_run(struct trace_event_raw_sys_enter *ctx);

SEC("tracepoint/syscalls/sys_enter_close")
int gt_enter_close(struct trace_event_raw_sys_enter *ctx)
{
	gt_sys_pin_off(); // common/preempt.h
	gt_enter_close_run(ctx);
	gt_sys_pin_on();
	return 0;
}

static __always_inline int gt_enter_close_run(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!gt_is_target(tgid))
		return 0;
	gt_sys_ran_mark(GT_SYS_ENTER_CLOSE); // common/understudy.h
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

// Understudies (common/understudy.h), attached only where the kernel runs
// these programs preemptible.
GT_UNDERSTUDY(gt_us_read, "sys_exit_read", GT_SYS_EXIT_READ)
GT_UNDERSTUDY(gt_us_recvfrom, "sys_exit_recvfrom", GT_SYS_EXIT_RECVFROM)
GT_UNDERSTUDY(gt_us_readv, "sys_exit_readv", GT_SYS_EXIT_READV)
GT_UNDERSTUDY(gt_us_recvmsg, "sys_exit_recvmsg", GT_SYS_EXIT_RECVMSG)
GT_UNDERSTUDY(gt_us_write, "sys_exit_write", GT_SYS_EXIT_WRITE)
GT_UNDERSTUDY(gt_us_sendto, "sys_exit_sendto", GT_SYS_EXIT_SENDTO)
GT_UNDERSTUDY(gt_us_writev, "sys_exit_writev", GT_SYS_EXIT_WRITEV)
GT_UNDERSTUDY(gt_us_sendmsg, "sys_exit_sendmsg", GT_SYS_EXIT_SENDMSG)
GT_UNDERSTUDY(gt_us_close, "sys_enter_close", GT_SYS_ENTER_CLOSE)
#endif

