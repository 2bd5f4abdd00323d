// Understudies: a second program on each syscall tracepoint that runs the
// first one's code for the events the kernel skipped it.
//
// Where the kernel runs syscall tracepoint programs preemptible (sid's 7.2:
// trace_call_bpf_faultable, only migration off; common/preempt.h) it keeps
// a recursion count per program and CPU, and skips a program's run while
// another run of the same program on that CPU is stopped. gt_sys_pin keeps
// the programs' bodies whole, but the kernel counts the run from before the
// program's first instruction to after its last, and bpf_preempt_enable is
// itself a point where a pending reschedule is taken: a timer tick during
// the body makes the task stop right there, still counted. Measured in a
// guest after gt_sys_pin: 20 to 30 runs skipped a collection, each a read
// or write no program saw (a span lost, never a wrong one).
//
// So each such program P gets an understudy U on the same tracepoint,
// attached after it (the kernel runs a tracepoint's programs in attach
// order). U is a different program, with its own recursion count, so the
// kernel skips it only when a run of U itself is stopped on that CPU. The
// two agree through gt_sys_ran, keyed by thread:
//
// - P, for a target, marks the thread "P ran" (its slot in enum gt_sys_prog);
// - U sees that mark and takes it away: nothing more to do;
// - U sees no mark of P (the kernel skipped P): it marks "U's run" and
//   tail-calls P (a tail call takes no recursion count), and P, seeing that
//   mark, takes it away and does its work.
//
// Keyed by thread, not CPU: a task stopped between P and U (migration off,
// so on the same CPU) keeps its mark while others run there. A mark left
// behind (U skipped after P ran) names P and this thread only; if the next
// event of the same program on that thread has P skipped too, U takes it
// for P's and that event is lost, as without understudies. U's own skipped
// runs are what program_skipped counts where understudies are on
// (internal/loader); GT_STAT_STOOD_IN counts the events U handled.
//
// The loader attaches understudies only where gt_sys_pin is set; elsewhere
// the marks are dead code the verifier drops.
#pragma once

#include "preempt.h" // gt_sys_pin
#include "util.h"    // gt_is_target, gt_stats

#define GT_SYS_RAN_BY_UNDERSTUDY 0x80000000u

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, GT_SYS_PROGS);
	__type(key, __u32);
	__type(value, __u32);
} gt_sys_tails SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	// Marks live from P to U of one event, so this is the threads in a
	// syscall at once, plus marks left by skipped understudies.
	__uint(max_entries, 4096);
	__type(key, __u32);   // thread id
	__type(value, __u32); // enum gt_sys_prog, | GT_SYS_RAN_BY_UNDERSTUDY for U's run
} gt_sys_ran SEC(".maps");

// P's side, for a target, before its work. Not inlined: its key and value
// stay off the caller's frame, which is on the programs' deepest call chain.
static __noinline int gt_sys_ran_mark_now(__u32 prog)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 *v = bpf_map_lookup_elem(&gt_sys_ran, &tid);
	if (v && *v == (prog | GT_SYS_RAN_BY_UNDERSTUDY)) {
		bpf_map_delete_elem(&gt_sys_ran, &tid); // this is U's run of P
		return 0;
	}
	bpf_map_update_elem(&gt_sys_ran, &tid, &prog, BPF_ANY);
	return 0;
}

// The test is here, in the caller, so that where gt_sys_pin is 0 (every
// kernel but those with understudies) the verifier drops the call itself,
// not only its body: nothing is added to the syscall programs there.
static __always_inline void gt_sys_ran_mark(__u32 prog)
{
	if (gt_sys_pin)
		gt_sys_ran_mark_now(prog);
}

// U's side. ctx is the tracepoint's, passed on to P unchanged.
static __always_inline int gt_understudy(void *ctx, __u32 prog)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!gt_is_target(id >> 32))
		return 0; // P returned at the same test, or would have
	__u32 tid = (__u32)id;
	__u32 *v = bpf_map_lookup_elem(&gt_sys_ran, &tid);
	if (v && *v == prog) {
		bpf_map_delete_elem(&gt_sys_ran, &tid); // P ran
		return 0;
	}
	__u32 mark = prog | GT_SYS_RAN_BY_UNDERSTUDY;
	if (bpf_map_update_elem(&gt_sys_ran, &tid, &mark, BPF_ANY))
		return 0;
	__u32 slot = GT_STAT_STOOD_IN;
	__u64 *n = bpf_map_lookup_elem(&gt_stats, &slot);
	if (n)
		__sync_fetch_and_add(n, 1); // U runs preemptible: no lost update
	bpf_tail_call(ctx, &gt_sys_tails, prog);
	// Only if P is not in its slot (the loader puts it there first).
	bpf_map_delete_elem(&gt_sys_ran, &tid);
	return 0;
}

// An understudy program for tracepoint syscalls/TP, standing in for the
// program in slot PROG.
#define GT_UNDERSTUDY(NAME, TP, PROG)                                   \
	SEC("tracepoint/syscalls/" TP)                                  \
	int NAME(void *ctx) { return gt_understudy(ctx, PROG); }
