// Server startup (the startup group; docs/startup.md): two moments no other
// record gives.
//
// - GT_EV_STARTUP_LISTEN: a process the kernel saw being born under a target
//   (GT_TARGET_CHILD: an orchestrator's launch shell and what it runs) called
//   listen(2) for the first time. The port it listens on is kept.
// - GT_EV_STARTUP_READY: that process then wrote, for the first time, on a
//   TCP connection whose local port is that port: the first answer it gave
//   (the orchestrator's health probe: nothing else knows the port yet).
//
// Fork, exec and exit come from bpf/lifecycle.h as before; userspace joins
// them (internal/spans/startup.go). A process gymtrace did not see being
// born has no GT_TARGET_CHILD flag and gets neither record: no startup is
// made up for a process that started before gymtrace.
//
// Both records exist only with the startup group on: with it off, listen(2)
// costs one bitmap test (untargeted) or a config read, and a target's write
// one mask test more than before.
#pragma once

#include "common/util.h"
#include "common/understudy.h" // a second program for the runs a preempting kernel skips
#include "io.h"

// A process between its listen(2) and its first answer. Deleted at that
// answer or at its exit; a uvicorn parent whose workers answer for it keeps
// its entry until it exits (at most one per server).
struct gt_startup {
	__u64 listen_ns;
	__u16 port;
	__u8 _pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct gt_startup);
} gt_startups SEC(".maps");

static __always_inline void gt_startup_emit(__u8 kind, __u32 tgid, __u16 port, __u8 role)
{
	struct proc_event *e = bpf_ringbuf_reserve(&gt_events, sizeof(*e), 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = tgid;
	e->port = port;
	e->role = role;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	gt_stat_add(GT_STAT_PROC_EVENTS, 1);
	// Rare, and the span waits on it: wake the reader (as bpf/lifecycle.h).
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

// A write by a target that moved bytes, with the startup group on: is it the
// first answer of a process in gt_startups? Off the deep chain's stack (its
// own frame), called before the HTTP gate so that startup needs no other group.
__noinline int gt_startup_write(__u32 tgid)
{
	struct gt_startup *s = bpf_map_lookup_elem(&gt_startups, &tgid);
	if (!s)
		return 0;
	unsigned long a0, a1, a2;
	gt_syscall_args(&a0, &a1, &a2);
	struct sock *sk = gt_fd_sk((__s32)a0);
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	__u16 port = BPF_CORE_READ(sk, __sk_common.skc_num);
	if (port != s->port)
		return 0; // a call out (its local port is another), a pipe, a log file
	struct gt_target *t = bpf_map_lookup_elem(&gt_targets, &tgid);
	gt_startup_emit(GT_EV_STARTUP_READY, tgid, port, t ? t->role : GT_ROLE_UNKNOWN);
	bpf_map_delete_elem(&gt_startups, &tgid);
	return 0;
}

#ifndef GT_NO_PROGRAMS
SEC("tracepoint/syscalls/sys_exit_listen")
int gt_exit_listen(struct trace_event_raw_sys_exit *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!gt_is_target(tgid))
		return 0;
	gt_sys_ran_mark(GT_SYS_EXIT_LISTEN); // common/understudy.h
	if (ctx->ret != 0)
		return 0;
	struct gt_target *t = bpf_map_lookup_elem(&gt_targets, &tgid);
	if (!t || !(t->flags & GT_TARGET_CHILD))
		return 0; // not seen being born: its start is unknown
	struct gt_config *cfg = gt_cfg();
	if (!cfg)
		return 0;
	if (!(cfg->mask & GT_GROUP_STARTUP) && !(cfg->flags & GT_CFG_NO_GATE)) {
		gt_stat_add(GT_STAT_DISCARDED + __builtin_ctzll(GT_GROUP_STARTUP), 1);
		return 0;
	}
	if (bpf_map_lookup_elem(&gt_startups, &tgid))
		return 0; // only the first listen(2): uvicorn's workers listen again on the same socket
	unsigned long a0, a1, a2;
	gt_syscall_args(&a0, &a1, &a2);
	struct sock *sk = gt_fd_sk((__s32)a0);
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	struct gt_startup s = {.listen_ns = bpf_ktime_get_ns(), .port = BPF_CORE_READ(sk, __sk_common.skc_num)};
	bpf_map_update_elem(&gt_startups, &tgid, &s, BPF_NOEXIST);
	gt_stat_add(GT_STAT_EMITTED + __builtin_ctzll(GT_GROUP_STARTUP), 1);
	gt_startup_emit(GT_EV_STARTUP_LISTEN, tgid, s.port, t->role);
	return 0;
}

GT_UNDERSTUDY(gt_us_listen, "sys_exit_listen", GT_SYS_EXIT_LISTEN)
#endif
