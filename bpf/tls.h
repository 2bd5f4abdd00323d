// HTTPS: the plaintext of OpenSSL connections, through uprobes on the TLS
// library, fed to the same HTTP/1.x state machine (gt_process) as socket
// bytes, under the same gate. internal/tls attaches these programs per
// process, and only while a group they can feed (http_client, server) is on.
//
// Probes (internal/tls picks the sites; the cookie tells the flavor):
//   gt_tls_rw_entry / gt_tls_rw_ret  on the read and the write function:
//       entry notes (SSL*, buffer, count pointer) per thread; the return
//       feeds the bytes actually moved. Both directions are handled at
//       return: a write that fails with WANT_WRITE is retried with the same
//       buffer, so its bytes must not be counted at entry.
//   gt_tls_handshake  SSL_do_handshake entry: marks the SSL* for linking
//       to the socket the thread writes next (bpf/tls_link.h).
//   gt_tls_free       SSL_free entry: ends what is in flight, drops state.
//
// State is keyed by (tgid, SSL*), not by fd: with memory BIOs (asyncio) the
// SSL object never touches the socket itself.
#pragma once

#include "syscalls.h"
#include "common/preempt.h"

// Attach cookie bits (internal/tls: Flavor, cookieWrite).
#define GT_TLS_FLAVOR_EX 1  // int f(SSL*, buf, size_t num, size_t *done): 1 and *done on success
#define GT_TLS_FLAVOR_INT 2 // int f(SSL*, buf, int num): the count on success
#define GT_TLS_WRITE 0x100

struct pt_regs___gttls {
#if defined(__TARGET_ARCH_x86)
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long cx;
	unsigned long ax;
#elif defined(__TARGET_ARCH_arm64)
	unsigned long regs[31];
#endif
} __attribute__((preserve_access_index));

#if defined(__TARGET_ARCH_x86)
#define GT_TLS_ARG1(r) ((r)->di)
#define GT_TLS_ARG2(r) ((r)->si)
#define GT_TLS_ARG4(r) ((r)->cx)
#define GT_TLS_RET(r) ((r)->ax)
#elif defined(__TARGET_ARCH_arm64)
#define GT_TLS_ARG1(r) ((r)->regs[0])
#define GT_TLS_ARG2(r) ((r)->regs[1])
#define GT_TLS_ARG4(r) ((r)->regs[3])
#define GT_TLS_RET(r) ((r)->regs[0])
#endif

struct gt_tls_call {
	__u64 ssl;
	__u64 buf;
	__u64 done; // size_t *, FLAVOR_EX
	__u64 cookie;
};

// Per thread: the SSL read or write in progress, from entry to return.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); // tid
	__type(value, struct gt_tls_call);
} gt_tls_calls SEC(".maps");

// A target process? Counts the probe runs that pass (GT_STAT_TLS_CALLS).
static __always_inline int gt_tls_target(__u64 id)
{
	if (!gt_is_target(id >> 32))
		return 0;
	gt_stat_add(GT_STAT_TLS_CALLS, 1);
	return 1;
}

// The gate, as in gt_on_io: some enabled group possible for the target's
// role in some direction. Fills io's gate fields. Reads no user memory.
static __always_inline int gt_tls_gate(struct gt_io *io, __u64 id)
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
	io->now = bpf_ktime_get_ns();
	io->tgid = tgid;
	io->tid = (__u32)id;
	io->fd = -1;
	io->role = role;
	io->cfg_flags = cfg->flags;
	io->cfg_gen = cfg->generation;
	io->mask = cfg->mask;
	io->server_possible = cfg->server_possible[role & 7];
	io->client_possible = cfg->client_possible;
	return 1;
}

// The TLS connection of (tgid, ssl), created when create is set.
static __always_inline struct gt_conn *gt_tls_conn(struct gt_io *io, __u64 ssl, int create)
{
	struct gt_tls_key key = {.tgid = io->tgid, .ssl = ssl};
	struct gt_conn *c = bpf_map_lookup_elem(&gt_tls_conns, &key);
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
	t->kind = GT_CONN_HTTP;
	t->tls = GT_TLS_UNLINKED;
	t->tls_fd = -1;
	t->cfg_gen = io->cfg_gen;
	t->conn_id = gt_new_conn_id();
	if (bpf_map_update_elem(&gt_tls_conns, &key, t, BPF_NOEXIST) &&
	    bpf_map_update_elem(&gt_tls_conns, &key, t, BPF_ANY)) {
		gt_stat_add(GT_STAT_CONN_FULL, 1);
		return 0;
	}
	return bpf_map_lookup_elem(&gt_tls_conns, &key);
}

// The next socket write of this thread that looks like TLS belongs to ssl.
static __always_inline void gt_tls_want_link(struct gt_io *io, struct gt_conn *c, __u64 ssl)
{
	if (!c || c->tls != GT_TLS_UNLINKED)
		return;
	struct gt_tls_pending p = {.ssl = ssl, .ts = io->now, .tgid = io->tgid};
	bpf_map_update_elem(&gt_tls_pending, &io->tid, &p, BPF_ANY);
}

SEC("uprobe")
int gt_tls_rw_entry(struct pt_regs___gttls *ctx)
{
	gt_own_stack(ctx);
	__u64 id = bpf_get_current_pid_tgid();
	struct gt_io io = {};
	if (!gt_tls_target(id) || !gt_tls_gate(&io, id))
		return 0;
	struct gt_tls_call call = {
		.ssl = GT_TLS_ARG1(ctx),
		.buf = GT_TLS_ARG2(ctx),
		.done = GT_TLS_ARG4(ctx),
		.cookie = bpf_get_attach_cookie(ctx),
	};
	if (!call.ssl)
		return 0;
	bpf_map_update_elem(&gt_tls_calls, &io.tid, &call, BPF_ANY);
	if (call.cookie & GT_TLS_WRITE)
		gt_tls_want_link(&io, gt_tls_conn(&io, call.ssl, 1), call.ssl);
	return 0;
}

// The return probe's struct gt_io and call record, in per-CPU map memory:
// on its stack, the chain below it (gt_process, gt_step, gt_headers,
// gt_scan_headers) passes the verifier's 512-byte limit for the combined
// stack (6.18).
struct gt_tls_ret_scratch {
	struct gt_io io;
	struct gt_tls_call call;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_tls_ret_scratch);
} gt_tls_io SEC(".maps");

static __always_inline void gt_tls_rw_ret_run(struct pt_regs___gttls *ctx);

// 1 where the verifier lets a program call global functions (the parser's
// steps) with preemption off; internal/loader asks the kernel first
// (bpf/probe_pin.c) and clears it where not. Then a kernel that preempts
// gets no TLS probes at all (loader.Preemption.TLSUnsafe).
volatile const __u32 gt_tls_pin = 1;

// Runs whole on its CPU where it can: the scratch above and gt_process's are
// per CPU (common/preempt.h).
SEC("uretprobe")
int gt_tls_rw_ret(struct pt_regs___gttls *ctx)
{
	gt_own_stack(ctx);
	if (gt_tls_pin)
		gt_preempt_off();
	gt_tls_rw_ret_run(ctx);
	if (gt_tls_pin)
		gt_preempt_on();
	return 0;
}

static __always_inline void gt_tls_rw_ret_run(struct pt_regs___gttls *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (!gt_tls_target(id))
		return;
	struct gt_tls_call *cp = bpf_map_lookup_elem(&gt_tls_calls, &tid);
	if (!cp)
		return;
	__u32 zero = 0;
	struct gt_tls_ret_scratch *scr = bpf_map_lookup_elem(&gt_tls_io, &zero);
	if (!scr)
		return;
	scr->call = *cp;
	struct gt_tls_call *call = &scr->call;
	bpf_map_delete_elem(&gt_tls_calls, &tid);
	int ret = (int)GT_TLS_RET(ctx);
	__u64 n = 0;
	if (ret <= 0)
		return; // WANT_READ/WANT_WRITE (retried later), or an error
	if (call->cookie & GT_TLS_FLAVOR_EX) {
		if (bpf_probe_read_user(&n, sizeof(n), (void *)call->done))
			return;
	} else {
		n = ret;
	}
	if (!n || n > 0x7fffffff)
		return;

	struct gt_io *io = &scr->io;
	__builtin_memset(io, 0, sizeof(*io));
	if (!gt_tls_gate(io, id))
		return;
	io->dir = (call->cookie & GT_TLS_WRITE) ? 1 : 0;
	struct gt_conn *c = gt_tls_conn(io, call->ssl, 1);
	if (!c || c->kind != GT_CONN_HTTP)
		return;
	if (c->side == GT_SIDE_SERVER && !(io->server_possible & io->mask) && !(io->cfg_flags & GT_CFG_NO_GATE))
		return;
	if (c->side == GT_SIDE_CLIENT && !(io->client_possible & io->mask) && !(io->cfg_flags & GT_CFG_NO_GATE))
		return;
	io->fd = c->tls_fd;
	gt_process(c, io, call->buf, (__u32)n);
}

SEC("uprobe")
int gt_tls_handshake(struct pt_regs___gttls *ctx)
{
	gt_own_stack(ctx);
	__u64 id = bpf_get_current_pid_tgid();
	struct gt_io io = {};
	if (!gt_tls_target(id) || !gt_tls_gate(&io, id))
		return 0;
	__u64 ssl = GT_TLS_ARG1(ctx);
	if (!ssl)
		return 0;
	gt_tls_want_link(&io, gt_tls_conn(&io, ssl, 1), ssl);
	return 0;
}

// SSL_free: the connection is over. A body delimited by the connection ends
// here; an exchange still open is reported closed. The SSL* address is
// reused by the allocator, so its state must not outlive it.
SEC("uprobe")
int gt_tls_free(struct pt_regs___gttls *ctx)
{
	gt_own_stack(ctx);
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!gt_tls_target(id))
		return 0;
	struct gt_tls_key key = {.tgid = tgid, .ssl = GT_TLS_ARG1(ctx)};
	struct gt_conn *c = bpf_map_lookup_elem(&gt_tls_conns, &key);
	if (!c)
		return 0;
	struct gt_config *cfg = gt_cfg();
	struct gt_target *tg = bpf_map_lookup_elem(&gt_targets, &tgid);
	if (c->kind == GT_CONN_HTTP && cfg) {
		struct gt_io io = {
			.now = bpf_ktime_get_ns(),
			.tgid = tgid,
			.tid = (__u32)id,
			.fd = c->tls_fd,
			.role = tg ? tg->role : GT_ROLE_UNKNOWN,
			.cfg_gen = cfg->generation,
		};
		struct gt_dir *d = &c->dir[1];
		if (d->phase == GT_PH_BODY_EOF) {
			io.dir = 1;
			gt_finish(c, d, &io, GT_F_END_BY_CLOSE);
		}
		d = &c->dir[0];
		if (d->phase == GT_PH_BODY_EOF) {
			io.dir = 0;
			gt_finish(c, d, &io, GT_F_END_BY_CLOSE);
		} else if (gt_in_flight(c)) {
			gt_emit_close(c, &io, 0);
		}
	}
	bpf_map_delete_elem(&gt_tls_conns, &key);
	return 0;
}
