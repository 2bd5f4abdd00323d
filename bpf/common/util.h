// Small shared helpers: counters, target test, config, fd -> socket.
#pragma once

#include "maps.h"
#include "iter.h"

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define SOCK_STREAM 1
#define S_IFMT 00170000
#define S_IFSOCK 0140000

// x &= mask where the verifier sees it: the compiler drops a mask (or a
// bounds check) it proves redundant, as for x = min(a, b) with b bounded,
// and verifiers before 6.8 learn nothing from comparing two unknown
// registers, only from a constant.
#define gt_mask(x, mask) ({ asm volatile("%0 &= %1" : "+r"(x) : "i"(mask)); })

__u64 gt_next_conn_id;

#ifdef GT_K510
// 5.10 has no atomic fetch-and-add that returns the old value (5.12's
// BPF_FETCH): each CPU numbers its own connections, the CPU in the top
// bits, so ids stay unique (userspace only ever compares them for equality).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gt_k510_conn_ids SEC(".maps");

static __always_inline __u64 gt_new_conn_id(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&gt_k510_conn_ids, &zero);
	if (!n)
		return 0;
	*n += 1;
	return ((__u64)(bpf_get_smp_processor_id() + 1) << 40) | (*n & ((1ULL << 40) - 1));
}
#else
#define gt_new_conn_id() (__sync_fetch_and_add(&gt_next_conn_id, 1) + 1)
#endif

// Profiling switches for cost experiments (internal/loader's cost test);
// 0 in production.
volatile const __u32 gt_prof_skip = 0;

// Section timing for cost experiments (GYMTRACE_PROF_TIME=1; gymtrace logs
// the table at exit). 0 in production: the verifier then removes every
// timing branch, so the sections cost nothing.
volatile const __u32 gt_prof_time = 0;

struct gt_prof_slot {
	__u64 ns;
	__u64 n;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GT_PROF_MAX);
	__type(key, __u32);
	__type(value, struct gt_prof_slot);
} gt_prof SEC(".maps");

#ifdef GT_NO_PROF_TIME
// The bounded-loop build has no section timers: each start time lives across
// a call, in a stack slot of its own even when gt_prof_time is 0, and on 6.1
// (32-byte frames) those slots took the syscall programs' deepest chain from
// 448 bytes to 512, the verifier's limit. The loader says so when
// GYMTRACE_PROF_TIME asks for them.
#define gt_prof_begin() 0ULL
#define gt_prof_end(slot, t0) ((void)(slot), (void)(t0))
#else
static __always_inline __u64 gt_prof_begin(void)
{
	return gt_prof_time ? bpf_ktime_get_ns() : 0;
}

static __always_inline void gt_prof_end(__u32 slot, __u64 t0)
{
	if (!gt_prof_time)
		return;
	struct gt_prof_slot *v = bpf_map_lookup_elem(&gt_prof, &slot);
	if (v) {
		v->ns += bpf_ktime_get_ns() - t0;
		v->n++;
	}
}
#endif

// Ring-buffer bytes pending before a submit wakes the reader. Waking a
// sleeping reader costs the traced syscall several microseconds (measured:
// 8.3 us -> 1.0 us per traced message without it), so records are submitted
// without a wakeup and the reader polls (internal/loader.PollInterval); a
// filling buffer wakes it at once. The loader sets a quarter of the buffer.
volatile const __u64 gt_wakeup_bytes = 2 << 20;

// Ring-buffer bytes pending at and above which a response record is not
// written (gt_emit_response): the rest of a filling buffer is kept for
// request records. A lost request record loses its span, and the spans of
// the calls it caused lose their parent (a rollout split in two); a lost
// response record only ends its span with its request (truncated, the
// status unknown). Overload loses the cheaper of the two first. Measured
// (docs/architecture.md, "Loss"): a request record is about three times a
// response's head, so in a full buffer a response still fits where a
// request does not, and lost records were mostly requests. The loader sets
// seven eighths of the buffer (three quarters, measured beside it, did no
// better within the runs' noise and shed more responses: docs/architecture.md,
// "Loss").
volatile const __u64 gt_shed_bytes = 7 << 20;

static __always_inline int gt_ring_crowded(void)
{
	return bpf_ringbuf_query(&gt_events, BPF_RB_AVAIL_DATA) >= gt_shed_bytes;
}

static __always_inline void gt_submit(void *rec)
{
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(&gt_events, BPF_RB_AVAIL_DATA) >= gt_wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(rec, flags);
}

static __always_inline void gt_stat_add(__u32 slot, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&gt_stats, &slot);
	if (v)
		*v += n; // per-CPU slot: no atomic needed
}

static __always_inline int gt_is_target(__u32 tgid)
{
	__u32 word = tgid >> 6;
	__u64 *bits = bpf_map_lookup_elem(&gt_target_bits, &word);
	return bits && (*bits & (1ULL << (tgid & 63)));
}

static __always_inline struct gt_scratch *gt_get_scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_scratch, &zero);
}

static __always_inline struct gt_config *gt_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_config, &zero);
}

// Bit index of a power of two below 2^16 (a de Bruijn sequence: BPF has no
// count-trailing-zeros instruction).
static const __u8 gt_debruijn16[16] = {0, 1, 11, 2, 14, 12, 8, 3, 15, 10, 13, 7, 9, 6, 5, 4};

// Count an exchange per group: emitted for enabled bits, discarded for the
// rest. One step per set bit (an exchange has one to three groups), not per
// group.
static __always_inline void gt_count_groups(__u64 groups, __u64 mask)
{
	__u32 g = groups & ((1U << GT_GROUP_COUNT) - 1);
	int i;
	gt_for(i, 0, GT_GROUP_COUNT)
	{
		if (!g)
			break;
		__u32 bit = g & -g;
		g &= g - 1;
		__u32 b = gt_debruijn16[((bit * 0x0F65U) >> 12) & 15];
		gt_stat_add(((mask & bit) ? GT_STAT_EMITTED : GT_STAT_DISCARDED) + (b & 15), 1);
	}
}

static __always_inline void gt_mapped_v4(__u8 out[16], __be32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(&out[12], &addr, 4);
}

// Walk current->files to the socket behind fd. Returns 1 and fills the tuple
// (and *skp, when skp is not null) for a TCP socket of AF_INET/AF_INET6, 0
// for anything else. This runs once per connection (the answer is cached in
// gt_conns), including connections that existed before gymtrace attached.
// gt_fd_sk is the struct sock behind the current task's fd, or 0 when the
// fd is not a socket.
static __always_inline struct sock *gt_fd_sk(__s32 fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct files_struct *files = BPF_CORE_READ(task, files);
	if (!files)
		return 0;
	struct fdtable *fdt = BPF_CORE_READ(files, fdt);
	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return 0;
	unsigned short mode = BPF_CORE_READ(f, f_inode, i_mode);
	if ((mode & S_IFMT) != S_IFSOCK)
		return 0;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	return BPF_CORE_READ(sock, sk);
}

static __noinline int gt_fd_tcp_tuple(__s32 fd, struct gt_tuple *t, struct sock **skp)
{
	struct sock *sk = gt_fd_sk(fd);
	if (!sk)
		return 0;
	if (BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP || BPF_CORE_READ(sk, sk_type) != SOCK_STREAM)
		return 0;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	t->family = family;
	t->lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	t->rport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (family == AF_INET) {
		gt_mapped_v4(t->laddr, BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr));
		gt_mapped_v4(t->raddr, BPF_CORE_READ(sk, __sk_common.skc_daddr));
	} else if (family == AF_INET6) {
		BPF_CORE_READ_INTO(&t->laddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(&t->raddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	} else {
		return 0;
	}
	if (skp)
		*skp = sk;
	return 1;
}

// gt_conn_fresh reports whether the syscall that just moved n bytes in
// direction dir (0 read, 1 write) moved the first bytes of the stream in that
// direction: then gymtrace follows the connection from its first byte, and
// the requests both ends see on it are the same ones, in the same order.
// Read: the bytes the program has consumed in all (received in order, minus
// those still queued) are these n; the FIN, when it arrived, counts one in
// rcv_nxt. Write: acknowledged plus unacknowledged bytes are these n; an
// active opener's count may include its SYN's one.
static __always_inline int gt_conn_fresh(struct sock *sk, int dir, long n)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	__u64 total;
	if (dir == 0)
		total = BPF_CORE_READ(tp, bytes_received) - (__u32)(BPF_CORE_READ(tp, rcv_nxt) - BPF_CORE_READ(tp, copied_seq));
	else
		total = BPF_CORE_READ(tp, bytes_acked) + (__u32)(BPF_CORE_READ(tp, write_seq) - BPF_CORE_READ(tp, snd_una));
	return total + 1 >= (__u64)n && total <= (__u64)n + 1;
}

// gt_fin_received reports whether the peer's FIN has arrived: the socket is
// in a state only a received FIN leads to (CLOSE_WAIT, LAST_ACK, CLOSING,
// TIME_WAIT; CLOSE after those). A read that takes the FIN moves copied_seq
// one past the data it returns.
static __always_inline int gt_fin_received(struct sock *sk)
{
	__u8 st = BPF_CORE_READ(sk, __sk_common.skc_state);
	return st == 6 || st == 7 || st == 8 || st == 9 || st == 11;
}

// gt_stream_seq is the TCP sequence number just past the bytes the current
// syscall moved in direction dir (0 read: copied_seq; 1 write: write_seq),
// read at its sys_exit. Less the syscall's byte count plus an offset, it
// names the stream position of a byte the syscall moved: a position both
// ends of a loopback (or otherwise untranslated) connection agree on.
static __always_inline __u32 gt_stream_seq(struct sock *sk, int dir)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	if (dir == 0)
		return BPF_CORE_READ(tp, copied_seq);
	return BPF_CORE_READ(tp, write_seq);
}
