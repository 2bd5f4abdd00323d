// Kernel types the programs read, trimmed to the fields used. CO-RE
// (preserve_access_index) relocates every field against the running kernel's
// BTF, so these definitions need not match any one kernel's layout.
#pragma once

#include <linux/types.h>
#include <linux/bpf.h>
#include "k510.h" // GT_GLOBAL: the 5.10 build's static functions

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct trace_entry {
	unsigned short type;
	unsigned char flags;
	unsigned char preempt_count;
	int pid;
};

// syscalls:sys_enter_* / sys_exit_* tracepoint context.
struct trace_event_raw_sys_enter {
	struct trace_entry ent;
	long id;
	unsigned long args[6];
};

struct trace_event_raw_sys_exit {
	struct trace_entry ent;
	long id;
	long ret;
};

struct pt_regs {
#if defined(__TARGET_ARCH_x86)
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long r10;
#elif defined(__TARGET_ARCH_arm64)
	unsigned long regs[31];
	unsigned long orig_x0;
#endif
};

typedef struct {
	int counter;
} atomic_t;

struct in6_addr {
	union {
		__u8 u6_addr8[16];
		__u32 u6_addr32[4];
	} in6_u;
};

struct sock_common {
	union {
		struct {
			__be32 skc_daddr;
			__be32 skc_rcv_saddr;
		};
	};
	union {
		struct {
			__be16 skc_dport;
			__u16 skc_num;
		};
	};
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
};

struct sock {
	struct sock_common __sk_common;
	__u16 sk_type;
	__u16 sk_protocol;
};

// Stream positions of a TCP socket (gt_conn_fresh). CO-RE finds the fields
// inside the running kernel's struct tcp_sock; a struct sock * is cast to it.
struct tcp_sock {
	__u64 bytes_received; // data bytes received in order
	__u64 bytes_acked;    // data bytes the peer acknowledged
	__u32 rcv_nxt;
	__u32 copied_seq;
	__u32 snd_una;
	__u32 write_seq;
};

struct socket {
	short type;
	struct sock *sk;
};

struct inode {
	unsigned short i_mode;
};

struct file {
	struct inode *f_inode;
	void *private_data;
};

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
};

struct files_struct {
	struct fdtable *fdt;
};

struct mm_struct {
	unsigned long arg_start;
	unsigned long arg_end;
};

struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
	struct task_struct *real_parent;
	struct mm_struct *mm;
	int exit_code;
	char comm[16];
};

#pragma clang attribute pop
