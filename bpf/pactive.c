// SPDX-License-Identifier: GPL-2.0
// Who holds bpf_prog_active when a task is switched out: a diagnostic for
// the kernel's skipped tracing programs (recursion_misses) on a kernel that
// preempts (docs/architecture.md, "A kernel that preempts BPF programs").
// The kernel skips a kprobe or tracepoint program while its CPU's
// bpf_prog_active is held; a task preempted while holding it hides every
// such program run on that CPU until it runs again. A raw tracepoint
// program is not gated by bpf_prog_active (it keeps a count of its own), so
// this one sees the switch-out of such a holder: its pid, name and kernel
// stack.
#include "common/kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

// Set from /proc/kallsyms at load: a per-CPU variable's symbol is its offset
// in the per-CPU area, and __per_cpu_offset[cpu] that CPU's area (x86-64).
volatile const __u64 pa_prog_active = 0;
volatile const __u64 pa_per_cpu_offset = 0;
// The current task's per-CPU slot (current_task, or pcpu_hot whose first
// field it is): read the same way, it must equal bpf_get_current_task(),
// which proves the addresses right (pa_check: [0] equal, [1] not).
volatile const __u64 pa_current_task = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} pa_check SEC(".maps");

#define PA_STACK 24

struct pa_rec {
	__u32 pid;
	__u32 tgid;
	__u32 active;
	__u32 preempt; // switched out while runnable (preempted), not asleep
	__s64 stack_len;
	char comm[16];
	__u64 stack[PA_STACK];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} pa_out SEC(".maps");

// Keeps struct pa_rec in the BTF, for bpf2go -type.
const struct pa_rec *pa_rec_type __attribute__((unused));

SEC("raw_tp/sched_switch")
int pa_switch(__u64 *ctx)
{
	__u64 base = 0;
	__u32 cpu = bpf_get_smp_processor_id();
	if (bpf_probe_read_kernel(&base, sizeof(base), (const void *)(pa_per_cpu_offset + (__u64)(cpu & 4095) * 8)))
		return 0;
	__u64 cur = 0;
	if (pa_current_task && !bpf_probe_read_kernel(&cur, sizeof(cur), (const void *)(pa_current_task + base))) {
		__u32 k = cur == bpf_get_current_task() ? 0 : 1;
		__u64 *n = bpf_map_lookup_elem(&pa_check, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
	int active = 0;
	bpf_probe_read_kernel(&active, sizeof(active), (const void *)(pa_prog_active + base));
	// Every preemption too (a runnable task switched out): whether one
	// stops inside a BPF program, which holds a recursion count of its own
	// where the kernel keeps one per program.
	if (active <= 0 && !ctx[0])
		return 0;
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct pa_rec *r = bpf_ringbuf_reserve(&pa_out, sizeof(*r), 0);
	if (!r)
		return 0;
	r->pid = BPF_CORE_READ(prev, pid);
	r->tgid = BPF_CORE_READ(prev, tgid);
	r->active = active;
	r->preempt = (__u32)ctx[0];
	BPF_CORE_READ_STR_INTO(&r->comm, prev, comm);
	// The current task is still prev at this tracepoint: its stack is the
	// holder's.
	r->stack_len = bpf_get_stack(ctx, r->stack, sizeof(r->stack), 0);
	bpf_ringbuf_submit(r, 0);
	return 0;
}
