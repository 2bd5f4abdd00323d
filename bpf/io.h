// One traced read or write as the programs see it: its kind, the gate and
// process facts copied from the maps, and its arguments read back from the
// saved registers (only sys_exit_* is hooked). Included by bpf/syscalls.h.
#pragma once

#define GT_EAGAIN 11
#define GT_EINTR 4
#define GT_EINPROGRESS 115

enum gt_io_kind {
	GT_IO_PLAIN = 0, // (fd, buf, len)
	GT_IO_IOV = 1,   // (fd, iov, iovcnt)
	GT_IO_MSG = 2,   // (fd, msghdr)
};

struct gt_io {
	__u64 now;
	__u32 tgid;
	__u32 tid;
	__s32 fd;
	__u8 dir; // 0: bytes read, 1: bytes written
	__u8 role;
	__u8 hdr_first; // gt_headers: the buffer starts with the start line
	// The gate, copied from gt_config: global functions take no map pointers.
	__u32 cfg_flags;
	__u32 cfg_gen;
	__u64 mask;
	__u64 server_possible; // for this process's role
	__u64 client_possible;
	// gt_inject_note: the header scan injection made for this write at its
	// sys_enter (struct gt_scratch reuse_*), 0 if none.
	__u64 scan_gen;
	// Socket syscalls: the bytes it moved, and where the buffer being
	// parsed starts among them (iovec segments): with the stream position
	// after the syscall they date a message start (gt_stream_seq).
	__u32 ret;
	__u32 seg_off;
	__u32 msg_off; // gt_step: the message start's offset among the syscall's bytes
	__u32 _pad_io;
};

struct gt_iovec {
	__u64 base;
	__u64 len;
};

struct gt_msghdr {
	__u64 name;
	__u32 namelen;
	__u32 _pad;
	__u64 iov;
	__u64 iovlen;
};

// Where msg_iov (then msg_iovlen) lies in struct user_msghdr.
#define GT_MSGHDR_IOV_OFF __builtin_offsetof(struct gt_msghdr, iov)

// The calling thread's pid_tgid, rebuilt from io: what the per-CPU scratch
// tags its kept reads with (struct gt_scratch reuse_id, pre_id).
static __always_inline __u64 gt_io_id(const struct gt_io *io)
{
	return (__u64)io->tgid << 32 | io->tid;
}

#ifdef GT_K510
// The kernel stack of a task, for task_pt_regs: THREAD_SIZE is 16 KiB on
// x86-64 and arm64 (without KASAN, as Debian builds them).
#define GT_K510_THREAD_SIZE 16384
struct task_struct___gtk {
	void *stack;
} __attribute__((preserve_access_index));

// Where the helper reads the registers to: map memory, not the syscall
// program's stack (its frame is on the deepest chain).
struct gt_k510_regs {
	unsigned long a[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_k510_regs);
} gt_k510_regs SEC(".maps");
#endif

static __always_inline void gt_syscall_args(unsigned long *a0, unsigned long *a1, unsigned long *a2)
{
#ifdef GT_K510
	// 5.10 has neither bpf_get_current_task_btf (5.11) nor bpf_task_pt_regs
	// (5.15): the registers lie at the top of the task's kernel stack
	// (x86-64's and arm64's task_pt_regs), read with a helper call each.
	struct gt_k510_regs *r = bpf_map_lookup_elem(&gt_k510_regs, (__u32 *)&gt_k510_zero);
	if (!r) {
		*a0 = -1; // no descriptor: nothing is traced
		*a1 = *a2 = 0;
		return;
	}
	struct task_struct___gtk *t = (void *)bpf_get_current_task();
	void *stack = BPF_CORE_READ(t, stack);
	struct pt_regs *regs = (struct pt_regs *)(stack + GT_K510_THREAD_SIZE - bpf_core_type_size(struct pt_regs));
#if defined(__TARGET_ARCH_x86)
	bpf_probe_read_kernel(&r->a[0], sizeof(r->a[0]), &regs->di);
	bpf_probe_read_kernel(&r->a[1], sizeof(r->a[1]), &regs->si);
	bpf_probe_read_kernel(&r->a[2], sizeof(r->a[2]), &regs->dx);
#elif defined(__TARGET_ARCH_arm64)
	bpf_probe_read_kernel(&r->a[0], sizeof(r->a[0]), &regs->orig_x0);
	bpf_probe_read_kernel(&r->a[1], sizeof(r->a[1]), &regs->regs[1]);
	bpf_probe_read_kernel(&r->a[2], sizeof(r->a[2]), &regs->regs[2]);
#endif
	*a0 = r->a[0];
	*a1 = r->a[1];
	*a2 = r->a[2];
	return;
#else
	// A trusted BTF pointer: plain (CO-RE relocated) loads, no helper call
	// per register (three bpf_probe_read_kernel calls before, on every
	// traced syscall).
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
#endif
#if defined(__TARGET_ARCH_x86)
	*a0 = regs->di;
	*a1 = regs->si;
	*a2 = regs->dx;
#elif defined(__TARGET_ARCH_arm64)
	// x0 holds the return value by now; the first argument survives in orig_x0.
	*a0 = regs->orig_x0;
	*a1 = regs->regs[1];
	*a2 = regs->regs[2];
#endif
}
