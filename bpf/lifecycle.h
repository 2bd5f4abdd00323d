// Process lifecycle: fork/exec/exit of targets and their children.
//
// - Children of a target (uvicorn workers) become targets with its role.
// - A child that execs a sandbox provider CLI (docker, apptainer, enroot)
//   becomes a sandbox: GT_EV_SANDBOX_START at exec, GT_EV_SANDBOX_END at exit,
//   and stops being an HTTP target (the docker CLI talks to its daemon).
//   The sandbox group bit is checked before any argv byte is read.
// - Execs of Gym's collector entry points are reported so discovery can pick
//   them up at once (gym.job starts at exec).
// These tracepoints fire on every fork/exec/exit of the host; each returns
// after one bitmap test unless a target is involved. Their records wake the
// reader (they are rare, and a new target should be set up at once; HTTP
// records wait for the reader's poll).
#pragma once

#include "common/util.h"
#include "python.h"

struct trace_event_raw_sched_process_exec {
	struct trace_entry ent;
	__u32 __data_loc_filename;
	int pid;
	int old_pid;
};

struct gt_cause {
	__u64 conn; // the inbound request whose handler forked (see http_event.cause_conn)
	__u64 seq;
};

// Fork-time cause of each child of a Python target, for its sandbox spans.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct gt_cause);
} gt_fork_causes SEC(".maps");

struct gt_sandbox {
	struct gt_cause cause;
	__u64 start_ns;
	__u32 ppid;
	__u8 provider;
	__u8 verb;
	__u8 role;
	__u8 _pad;
};

// Sandbox CLIs running now, by pid.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct gt_sandbox);
} gt_sandboxes SEC(".maps");

static __always_inline void gt_bit_set(__u32 tgid, int on)
{
	__u32 word = tgid >> 6;
	__u64 *bits = bpf_map_lookup_elem(&gt_target_bits, &word);
	if (!bits)
		return;
#ifdef GT_K510
	// 5.10 has atomic add only (atomic or/and came in 5.12): a bit is only
	// ever set or cleared for its own tgid, by one fork or exit at a time,
	// so adding it where it is clear (subtracting where set) is exact, and
	// the other tgids' bits of the word are never lost to a race.
	__u64 b = 1ULL << (tgid & 63);
	if (on && !(*bits & b))
		__sync_fetch_and_add(bits, b);
	else if (!on && (*bits & b))
		__sync_fetch_and_add(bits, -b);
#else
	if (on)
		__sync_fetch_and_or(bits, 1ULL << (tgid & 63));
	else
		__sync_fetch_and_and(bits, ~(1ULL << (tgid & 63)));
#endif
}

static __always_inline struct proc_event *gt_proc_reserve(__u8 kind)
{
	struct proc_event *e = bpf_ringbuf_reserve(&gt_events, sizeof(*e), 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		return 0;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->ts_ns = bpf_ktime_get_ns();
	gt_stat_add(GT_STAT_PROC_EVENTS, 1);
	return e;
}

// Process records wake the reader (see the top of this file).
static __always_inline void gt_proc_submit(struct proc_event *e)
{
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

SEC("raw_tracepoint/sched_process_fork")
int gt_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	if (!gt_is_target(ptgid))
		return 0;
	__u32 cpid = BPF_CORE_READ(child, pid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	if (cpid != ctgid) // a new thread, not a new process
		return 0;
	struct gt_target *pt = bpf_map_lookup_elem(&gt_targets, &ptgid);
	struct gt_target t = {.role = pt ? pt->role : GT_ROLE_UNKNOWN, .flags = GT_TARGET_CHILD};
	bpf_map_update_elem(&gt_targets, &ctgid, &t, BPF_ANY);
	gt_bit_set(ctgid, 1);
	// The forking thread runs the spawning task (asyncio's subprocess
	// support forks inline): its request is the sandbox's parent.
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 pyctx = 0, root = 0;
	struct gt_cause cause = {};
	if (gt_py_context(ptgid, tid, &pyctx, &root) == GT_PY_OK) {
		gt_py_cause(root, &cause.conn, &cause.seq);
		if (cause.conn)
			bpf_map_update_elem(&gt_fork_causes, &ctgid, &cause, BPF_ANY);
	}
	struct proc_event *e = gt_proc_reserve(GT_EV_PROC_FORK);
	if (!e)
		return 0;
	e->role = t.role;
	e->pid = ctgid;
	e->ppid = ptgid;
	e->tid = tid;
	e->py_ctx = pyctx;
	e->py_root = root;
	e->cause_conn = cause.conn;
	e->cause_seq = cause.seq;
	BPF_CORE_READ_STR_INTO(&e->comm, parent, comm);
	gt_proc_submit(e);
	return 0;
}

// Basename of the exec'd file, compared against a name.
#define GT_NAME_IS(b, n, lit) (n == sizeof(lit) - 1 && !__builtin_memcmp(b, lit, sizeof(lit) - 1))

static __always_inline __u8 gt_provider(const char *b, int n)
{
	if (GT_NAME_IS(b, n, "docker"))
		return GT_SB_DOCKER;
	if (GT_NAME_IS(b, n, "apptainer") || GT_NAME_IS(b, n, "singularity"))
		return GT_SB_APPTAINER;
	if (GT_NAME_IS(b, n, "enroot"))
		return GT_SB_ENROOT;
	return GT_SB_NONE;
}

// Execs userspace discovery must see at once: Gym's entry points, and every
// Python interpreter (Gym starts each server as `bash -c "... python app.py"`:
// only /proc/PID/environ says whether it is one of Gym's). Without the
// event a server started after gymtrace waits for the periodic rescan and
// its first rollouts go untraced. An exec is rare next to a syscall; a
// non-Gym Python costs userspace one /proc read.
static __always_inline int gt_is_entry_point(const char *b, int n)
{
	if (n >= 6 && b[0] == 'p' && b[1] == 'y' && b[2] == 't' && b[3] == 'h' && b[4] == 'o' && b[5] == 'n')
		return 1;
	return GT_NAME_IS(b, n, "ng_collect_rollouts") || GT_NAME_IS(b, n, "ng_e2e_collect_rollouts") ||
	       GT_NAME_IS(b, n, "gym");
}

// The verb from argv: docker run|exec, apptainer instance start|exec,
// enroot create|start|exec. Options before the verb (docker --context x exec)
// are skipped; only these few argv words are ever looked at.
static __always_inline __u8 gt_sandbox_verb(__u8 provider)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 p = BPF_CORE_READ(task, mm, arg_start);
	__u64 end = BPF_CORE_READ(task, mm, arg_end);
	char w[16];
	__u8 verb = GT_SBV_OTHER;
	int skip_value = 0, instance = 0;
	// argv[0], then up to 5 words.
#pragma unroll
	for (int k = 0; k < 6; k++) {
		if (!p || p >= end)
			break;
		__builtin_memset(w, 0, sizeof(w));
		long n = bpf_probe_read_user_str(w, sizeof(w), (void *)p);
		if (n <= 0)
			break;
		if (n == sizeof(w)) {
			// A word longer than w: find its end to step over it.
			char big[128];
			n = bpf_probe_read_user_str(big, sizeof(big), (void *)p);
			if (n <= 0)
				break;
		}
		p += n;
		if (k == 0)
			continue;
		if (skip_value) {
			skip_value = 0;
			continue;
		}
		// A path: a script's interpreter runs it as argv[1] (#! rewrites
		// argv to interpreter, script, arguments). Verbs never start so.
		if (w[0] == '/' || w[0] == '.')
			continue;
		if (w[0] == '-') {
			// Global options that take a separate value.
			if (!__builtin_memcmp(w, "--context\0", 10) || !__builtin_memcmp(w, "-c\0", 3) ||
			    !__builtin_memcmp(w, "--host\0", 7) || !__builtin_memcmp(w, "-H\0", 3) ||
			    !__builtin_memcmp(w, "--config\0", 9) || !__builtin_memcmp(w, "--log-level\0", 12) ||
			    !__builtin_memcmp(w, "-l\0", 3))
				skip_value = 1;
			continue;
		}
		if (provider == GT_SB_DOCKER) {
			if (!__builtin_memcmp(w, "run\0", 4) || !__builtin_memcmp(w, "create\0", 7))
				verb = GT_SBV_START;
			else if (!__builtin_memcmp(w, "exec\0", 5))
				verb = GT_SBV_EXEC;
			break;
		}
		if (provider == GT_SB_APPTAINER) {
			if (instance) {
				if (!__builtin_memcmp(w, "start\0", 6))
					verb = GT_SBV_START;
				break;
			}
			if (!__builtin_memcmp(w, "instance\0", 9)) {
				instance = 1;
				continue;
			}
			if (!__builtin_memcmp(w, "exec\0", 5) || !__builtin_memcmp(w, "run\0", 4))
				verb = GT_SBV_EXEC;
			break;
		}
		if (provider == GT_SB_ENROOT) {
			if (!__builtin_memcmp(w, "create\0", 7) || !__builtin_memcmp(w, "start\0", 6))
				verb = GT_SBV_START;
			else if (!__builtin_memcmp(w, "exec\0", 5))
				verb = GT_SBV_EXEC;
			break;
		}
	}
	return verb;
}

SEC("tracepoint/sched/sched_process_exec")
int gt_exec(struct trace_event_raw_sched_process_exec *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	int target = gt_is_target(tgid);

	// Basename of the file being executed, from the tracepoint's own copy.
	char path[64] = {};
	__u32 loc = ctx->__data_loc_filename;
	bpf_probe_read_kernel_str(path, sizeof(path), (void *)ctx + (loc & 0xffff));
	int start = 0, len = 0;
#pragma unroll
	for (int j = 0; j < 63; j++) {
		if (!path[j])
			break;
		if (path[j] == '/')
			start = j + 1;
		len = j + 1;
	}
	const char *base = &path[start & 63];
	int n = len - start;
	if (n < 0 || n > 32)
		return 0;

	if (!target) {
		if (!gt_is_entry_point(base, n))
			return 0;
		struct proc_event *e = gt_proc_reserve(GT_EV_PROC_EXEC);
		if (!e)
			return 0;
		e->pid = tgid;
		bpf_get_current_comm(&e->comm, sizeof(e->comm));
		gt_proc_submit(e);
		return 0;
	}

	struct gt_target *t = bpf_map_lookup_elem(&gt_targets, &tgid);
	struct gt_config *cfg = gt_cfg();
	__u8 provider = gt_provider(base, n);
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task();
	__u32 parent_tgid = BPF_CORE_READ(cur, real_parent, tgid);
	if (provider != GT_SB_NONE && t && ((t->flags & GT_TARGET_CHILD) || gt_is_target(parent_tgid))) {
		// A sandbox CLI: traced for its lifecycle only, never for its HTTP.
		gt_bit_set(tgid, 0);
		__u32 ppid = 0;
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();
		ppid = BPF_CORE_READ(task, real_parent, tgid);
		if (cfg && ((cfg->mask & GT_GROUP_SANDBOX) || (cfg->flags & GT_CFG_NO_GATE))) {
			gt_stat_add(GT_STAT_EMITTED + 7, 1);
			// Only now, with the sandbox group on, is argv looked at.
			struct gt_sandbox sb = {
				.start_ns = bpf_ktime_get_ns(),
				.ppid = ppid,
				.provider = provider,
				.verb = gt_sandbox_verb(provider),
				.role = t->role,
			};
			struct gt_cause *fc = bpf_map_lookup_elem(&gt_fork_causes, &tgid);
			if (fc)
				sb.cause = *fc;
			bpf_map_update_elem(&gt_sandboxes, &tgid, &sb, BPF_ANY);
			struct proc_event *e = gt_proc_reserve(GT_EV_SANDBOX_START);
			if (e) {
				e->pid = tgid;
				e->ppid = ppid;
				e->role = sb.role;
				e->provider = provider;
				e->verb = sb.verb;
				e->start_ns = sb.start_ns;
				e->cause_conn = sb.cause.conn;
				e->cause_seq = sb.cause.seq;
				gt_proc_submit(e);
			}
		} else {
			gt_stat_add(GT_STAT_DISCARDED + 7, 1);
		}
		bpf_map_delete_elem(&gt_targets, &tgid);
		return 0;
	}
	struct proc_event *e = gt_proc_reserve(GT_EV_PROC_EXEC);
	if (!e)
		return 0;
	e->pid = tgid;
	e->role = t ? t->role : 0;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	gt_proc_submit(e);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int gt_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if ((__u32)id != tgid) // a thread, not the process
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	int code = BPF_CORE_READ(task, exit_code);
	__s32 status = (code & 0x7f) ? -(code & 0x7f) : ((code >> 8) & 0xff);

	struct gt_sandbox *sb = bpf_map_lookup_elem(&gt_sandboxes, &tgid);
	if (sb) {
		struct proc_event *e = gt_proc_reserve(GT_EV_SANDBOX_END);
		if (e) {
			e->pid = tgid;
			e->ppid = sb->ppid;
			e->role = sb->role;
			e->provider = sb->provider;
			e->verb = sb->verb;
			e->start_ns = sb->start_ns;
			e->exit_code = status;
			e->cause_conn = sb->cause.conn;
			e->cause_seq = sb->cause.seq;
			gt_proc_submit(e);
		}
		bpf_map_delete_elem(&gt_sandboxes, &tgid);
		bpf_map_delete_elem(&gt_fork_causes, &tgid);
		gt_bit_set(tgid, 0);
		bpf_map_delete_elem(&gt_targets, &tgid);
		return 0;
	}
	if (!gt_is_target(tgid))
		return 0;
	gt_bit_set(tgid, 0);
	bpf_map_delete_elem(&gt_targets, &tgid);
	bpf_map_delete_elem(&gt_startups, &tgid); // bpf/startup.h: it never answered
	struct proc_event *e = gt_proc_reserve(GT_EV_PROC_EXIT);
	if (!e)
		return 0;
	e->pid = tgid;
	e->exit_code = status;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	gt_proc_submit(e);
	return 0;
}
