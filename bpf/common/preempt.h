// Programs that a preemptible kernel can interrupt halfway.
//
// Syscall tracepoints and kprobes run with preemption off. Uprobe programs
// run with only migration off: on a kernel that preempts (PREEMPT,
// PREEMPT_LAZY, PREEMPT_RT, or PREEMPT_DYNAMIC booted with preempt=full;
// Debian sid's 7.x is built PREEMPT_LAZY) another task can run gymtrace's
// programs on the same CPU while a uprobe program is stopped in the middle.
// Two things are per CPU and would then be shared by the two runs:
//
// - the per-CPU scratch maps (gt_py_scratch, gt_scratch): the second run
//   overwrites the keys and values the first one built, and the first goes
//   on with the second's (a link or root of another task: a wrong parent);
// - the private stack: since 6.13 a tracing program whose stack is 64 bytes
//   or more gets a per-CPU stack instead of the task's, so the second run
//   overwrites the first one's frames; measured in a QEMU guest on sid's
//   7.2.13, gt_py_copy_ret oopsed in 5 of 11 boots and the kernel killed the
//   traced server.
//
// gt_preempt_off/on close the first (bpf_preempt_disable, a kfunc of 6.10+;
// declared weak, so on an older kernel the calls are dropped at load and the
// loader says the kernel cannot keep these programs whole when it preempts).
// gt_own_stack closes the second: the verifier gives no private stack to a
// program that can tail-call, so each uprobe program holds a tail call the
// verifier proves is never taken (gt_never is 0 in read-only data).
#pragma once

extern void bpf_preempt_disable(void) __weak __ksym;
extern void bpf_preempt_enable(void) __weak __ksym;

// Never set: a constant the compiler cannot fold, so the tail call stays in
// the object (the verifier drops it, after it has marked the program).
volatile const __u32 gt_never = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gt_uprobe_tails SEC(".maps");

// Only uprobe (kprobe-type) programs may use gt_uprobe_tails: a program
// array belongs to the program type that first uses it.
#define gt_own_stack(ctx)                                   \
	do {                                                \
		if (gt_never)                               \
			bpf_tail_call(ctx, &gt_uprobe_tails, 0); \
	} while (0)

static __always_inline void gt_preempt_off(void)
{
	if (bpf_preempt_disable)
		bpf_preempt_disable();
}

static __always_inline void gt_preempt_on(void)
{
	if (bpf_preempt_enable)
		bpf_preempt_enable();
}

// Syscall tracepoint programs on a kernel that runs them preemptible: sid's
// 7.2 calls them through trace_call_bpf_faultable, with only migration off,
// and keeps a recursion count per program and CPU. A syscall program
// preempted halfway (seen in a guest: gt_exit_write stopped by the timer
// interrupt inside gt_conn_new) then makes the kernel skip every run of the
// same program on that CPU until it resumes (recursion_misses: the
// program_skipped that lost spans there), while the other syscall programs
// run and overwrite the per-CPU scratch it was using (gt_ios, gt_scratch).
// The loader sets gt_sys_pin where the kernel runs them so (the
// trace_call_bpf_faultable symbol) and its verifier allows global calls with
// preemption off (bpf/probe_pin.c); 0 elsewhere, where they run with
// preemption off already.
volatile const __u32 gt_sys_pin = 0;

static __always_inline void gt_sys_pin_off(void)
{
	if (gt_sys_pin)
		gt_preempt_off();
}

static __always_inline void gt_sys_pin_on(void)
{
	if (gt_sys_pin)
		gt_preempt_on();
}
