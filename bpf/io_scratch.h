// The syscall programs' per-CPU state for one traced read or write.
#pragma once

// The syscall programs' struct gt_io, in per-CPU map memory: on their stack,
// the deepest chain below them (gt_process, gt_step, gt_headers,
// gt_scan_headers) passed the 512 bytes the verifier allows a program's
// combined stack on kernels without BPF private stacks. Programs on one CPU
// do not nest (the kernel runs one tracing program at a time per CPU), and
// each run fills it before use.
// The vectored syscalls' iovec walk keeps its state there too.
struct gt_io_scratch {
	struct gt_io io;
	struct gt_iovec v;  // the segment being parsed
	__u64 iov, cnt;     // the syscall's iovec array
	__u64 ret;          // the bytes the syscall moved
#ifdef GT_K510
	// io's gt_conns key, kept here so the 5.10 build's wrappers
	// (bpf/k510_wrap.h) look the connection up without a key on their
	// stack: a stack slot less on the deepest chain.
	struct gt_conn_key k510_key;
#endif
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_io_scratch);
} gt_ios SEC(".maps");
