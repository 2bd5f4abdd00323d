// traceparent injection: its constants, per-thread records, maps and small
// helpers (bpf/inject.h). Included by bpf/inject.h.
#pragma once

#define GT_INJ_NAME_LEN 13 // "traceparent: "
#define GT_INJ_LINE (GT_INJ_NAME_LEN + GT_TRACEPARENT_LEN + 2) // 70: name, value, CRLF
#define GT_INJ_HEAD 8 // request bytes the sk_msg program re-checks

enum gt_inj_state {
	GT_INJ_NONE = 0,
	GT_INJ_PREPARED = 1, // decided at sys_enter; the sk_msg program may insert it
	GT_INJ_PUSHED = 2,   // inserted into the socket's copy of the data
	GT_INJ_TRIED = 3,    // the sk_msg program ran and did not insert
};

// One thread's decision for the write syscall it is in. Valid only between
// that syscall's enter and exit: every hooked write's enter resets it, and
// the sk_msg program also checks the socket's ports.
struct gt_inject_rec {
	__u32 tgid;
	__s32 fd;
	__u32 line_end; // offset just past the request line's CRLF
	__u16 lport;    // the socket, host byte order
	__u16 rport;
	__u8 state; // enum gt_inj_state
	__u8 py_ok; // py_* and cause_* hold the calling context (gt_py_context said OK)
	__u8 _pad[6];
	__u8 head[GT_INJ_HEAD];
	__u8 line[72]; // GT_INJ_LINE bytes: "traceparent: 00-<trace>-<span>-<flags>\r\n"
	// The asyncio context of the decision, handed to the parser at sys_exit
	// (gt_inject_note) so the same syscall does not read it twice.
	__u64 py_ctx;
	__u64 py_root;
	__u64 cause_conn;
	__u64 cause_seq;
	__u64 scan_gen; // gt_inject_check's scan in the scratch (struct gt_scratch)
};

// Per-CPU working memory of gt_inject_decide: the ids and the record being
// built (too large for the 512-byte stack next to the inlined context walk).
struct gt_inj_scan {
	__u8 ids[32];   // trace id, span id (and flags) being formatted or parsed
	struct gt_inject_rec rec;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_inject_config);
} gt_inject_config SEC(".maps");

// Published by userspace (internal/inject), LRU so an exchange whose end was
// never seen cannot leak an entry.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct gt_trace_key);
	__type(value, struct gt_trace_ctx);
} gt_trace_ctxs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tid
	__type(value, struct gt_inject_rec);
} gt_inject_recs SEC(".maps");

// Targets' client sockets, keyed by socket cookie. Only sockets in here pass
// through the sk_msg program; a socket leaves when it closes, and all of them
// when gymtrace exits (the map is not pinned).
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} gt_inject_socks SEC(".maps");

// Socket cookie -> tgid, from connect() (process context: the caller is
// known) to ACTIVE_ESTABLISHED (softirq: it is not), where only the sockhash
// may be written.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u32);
} gt_inject_pending SEC(".maps");

// Targets that have served a request since attach. A call of theirs that no
// inbound request can be named for gets no header: userspace may still find
// its parent by nesting, and an injected new trace would contradict it.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} gt_inject_serving SEC(".maps");

// Processes that own at least one socket injection can write to: the
// syscall-entry hooks (bpf/inject_enter.h) return at once for any other.
// (Every target's header-less inbound request gets a trace from the kernel,
// gt_inject_root, whether or not its process owns one yet: its handler may
// open the first.)
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} gt_inject_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GT_INJ_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} gt_inject_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_inj_scan);
} gt_inject_scan SEC(".maps");

static __always_inline void gt_inj_stat(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&gt_inject_stats, &slot);
	if (v)
		*v += 1;
}

static __always_inline struct gt_inject_config *gt_inj_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_inject_config, &zero);
}

// Injection is on and http_client is enabled (the calls it names are that
// group's spans). Otherwise every injection program leaves at once: no
// socket enters the sockhash, no write is looked at, nothing is inserted,
// so a selection without http_client pays two array lookups per hook.
static __always_inline int gt_inject_wanted(void)
{
	struct gt_inject_config *icfg = gt_inj_cfg();
	struct gt_config *cfg = gt_cfg();
	return icfg && cfg && (icfg->flags & GT_INJ_ON) && (cfg->mask & GT_GROUP_HTTP_CLIENT);
}

// Draws a new trace id into id[16] and returns its sampled bit: the rule
// OpenTelemetry's TraceIDRatioBased applies, (big-endian id[8:16] >> 1) <
// root_bound, so the kernel and userspace agree on every new trace.
static __always_inline __u8 gt_new_trace(__u8 *id, const struct gt_inject_config *cfg)
{
	__u32 w2 = bpf_get_prandom_u32(), w3 = bpf_get_prandom_u32() | 1;
	*(__u32 *)&id[0] = bpf_get_prandom_u32();
	*(__u32 *)&id[4] = bpf_get_prandom_u32();
	*(__u32 *)&id[8] = w2;
	*(__u32 *)&id[12] = w3;
	__u64 lo = (__u64)bpf_ntohl(w2) << 32 | bpf_ntohl(w3);
	return (lo >> 1) < cfg->root_bound;
}

static __always_inline __u8 gt_hex(__u8 n)
{
	// '0'..'9', then 'a'..'f' (39 = 'a' - '0' - 10), without a branch.
	return '0' + n + ((((int)9 - (int)n) >> 31) & 39);
}

static __always_inline struct gt_inj_scan *gt_inj_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&gt_inject_scan, &zero);
}
